// The scheduling policy: a pure function from the engine's state to the next step's plan.
//
// Every request is a token sequence (prompt, then generated tokens) of which the first
// n_computed have K/V in the cache; the rest are pending. A request with exactly one pending
// token after generating is decoding; anything else pending is prefill (a new prompt, the rest of
// a chunked prompt, or a preempted request's recompute).
//
// One step = one forward pass over a flattened batch:
//  1. every running decode gets its next token (decode first: running requests never stall);
//  2. if the KV cache cannot hold that, the most recently admitted requests are preempted
//     (their blocks freed; they recompute later) until it can;
//  3. prefill chunks fill the step's prefill budget, shortest remaining prefill first, so short
//     prompts jump ahead of long ones between chunks; but the oldest request that has waited
//     longer than aging_ms since arrival is guaranteed half of every step's budget (auto mode:
//     half the step's time), so a long prompt is never starved, while the shortest one still
//     progresses by at least min_chunk. A new request is admitted only when the cache can hold
//     its whole pending sequence (plus the first generated token).
// The prefill budget: fixed chunk_size; unlimited when chunk_size == 0 (no chunking); in auto
// mode, the largest budget (at most max_auto_chunk) whose predicted step time (CostModel) stays
// within step_latency_target_ms, alone or not: a request arriving mid-step waits for the whole
// step, so no step may be longer than the target. Chunks are therefore large when the machine
// is fast and the context short, small on a slow CPU; a newly arrived short prompt starts within
// about one step.
#pragma once
#include <cstdint>
#include <vector>

namespace ft {

// Predicted forward time of one step: base + per_token * tokens + per_attn * Σ context of the
// step's tokens (the quadratic part of prefill). Calibrated at start-up by the engine.
struct CostModel {
  double base_ms = 1.0;
  double per_token_ms = 0.1;
  double per_attn_ms = 0.0;  // per (query token x context position)
  double predict(int64_t tokens, double attn_pairs) const {
    return base_ms + per_token_ms * double(tokens) + per_attn_ms * attn_pairs;
  }
};

struct SchedulerConfig {
  int64_t chunk_size = -1;          // -1 = auto, 0 = no chunking, N > 0 = fixed
  double step_latency_target_ms = 50;
  int64_t max_auto_chunk = 1024;    // auto mode's chunk when nothing competes
  int64_t min_chunk = 16;           // auto mode never plans a smaller chunk (progress)
  // Hard cap on tokens in one step (the forward's capacity). The engine raises it to hold a whole
  // fixed chunk (unchunked: a whole context) plus a decode token per sequence.
  int64_t max_batch_tokens = 2048;
  int32_t max_num_seqs = 64;        // running requests at most
  double aging_ms = 2000;           // a request waiting longer goes first
  int32_t block_size = 16;
};

struct SchedRequest {
  uint64_t id = 0;
  int64_t n_tokens = 0;     // prompt + generated so far
  int64_t n_computed = 0;   // of those, with K/V in the cache
  int64_t n_generated = 0;
  bool admitted = false;    // holds KV blocks
  int32_t blocks_held = 0;
  int32_t blocks_shared = 0;  // of those, blocks another sequence also holds (preempting frees the rest)
  // Waiting: its prefix in the cache now (n_computed counts those tokens): blocks admission
  // attaches, and of those, the idle ones it takes out of the free pool.
  int32_t hit_blocks = 0, hit_idle_blocks = 0;
  double arrival_ms = 0;
  uint64_t admit_order = 0; // larger = admitted more recently
  int64_t pending() const { return n_tokens - n_computed; }
  bool decoding() const { return admitted && n_generated > 0 && pending() == 1; }
};

// A read-only view of the real KV block pool (the engine fills it from KVCache each step), so a
// plan fits the pool exactly and the engine applies it without fallbacks.
struct SchedulerInput {
  double now_ms = 0;
  std::vector<SchedRequest> requests;  // every unfinished request, admitted or waiting
  int32_t free_blocks = 0;             // KVCache::free_blocks()
  CostModel cost;
  SchedulerConfig cfg;
};

struct PrefillChunk {
  uint64_t id;
  int64_t n_tokens;
};

struct StepPlan {
  std::vector<uint64_t> preempt;       // release these first (back to waiting, recompute later)
  std::vector<uint64_t> admit;         // then admit these (reserve their pending sequence)
  std::vector<uint64_t> decode;        // one token each, batch order
  std::vector<PrefillChunk> prefill;   // after the decodes, batch order
  int64_t prefill_budget = 0;          // the budget the chunks were planned against
  double predicted_ms = 0;
  bool empty() const { return decode.empty() && prefill.empty(); }
  int64_t n_tokens() const;
};

StepPlan plan_step(const SchedulerInput& in);

}  // namespace ft
