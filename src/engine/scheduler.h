// The scheduling policy: a pure function from the engine's state to the next step's plan.
//
// Every request is a token sequence (prompt, then generated tokens) of which the first
// n_computed have K/V in the cache; the rest are pending. A request with exactly one pending
// token after generating is decoding; anything else pending is prefill (a new prompt, the rest of
// a chunked prompt, or a preempted request's recompute).
//
// Every request carries a TTFT deadline (arrival + its ttft_slo_ms, by default
// default_ttft_slo_ms(): ttft_slo_base_ms + ttft_slo_stretch x its predicted prefill alone) and a
// priority (lower first, as vLLM's). Its slack = deadline - now - predicted prefill left, alone.
//
// One step = one forward pass over a flattened batch:
//  1. every running decode gets its next token (decode first: running requests never stall);
//  2. if the KV cache cannot hold that, the most recently admitted requests are preempted
//     (their blocks freed; they recompute later) until it can;
//  3. prefill chunks fill the step's prefill budget in order of priority, then earliest deadline
//     first, shortest remaining prefill as the tie-break. A prompt that can no longer make its
//     deadline (slack < 0) is ordered as if due late_order_ms from now (order_deadline_ms):
//     behind those that can still be on time and are due sooner, before those due later, so a
//     short prompt made late by a long step still goes before a long prompt due seconds later,
//     while under overload (more prompts than the machine serves) those that can still be on time
//     go first (pure earliest deadline first served every request late, the oldest first). A
//     request recomputing after a preemption that came after its first token keeps its own
//     deadline (first). No request starves: the request longest past its deadline by more than
//     aging_ms is guaranteed half of every step's budget (auto mode: half the step's time),
//     whatever its priority or lateness, while the first in order still progresses by at least
//     min_chunk. A new request is admitted only when the cache can hold its whole pending
//     sequence (plus the first generated token); while that aged request waits for blocks, none
//     after it is admitted.
//     No step holds more than max_batch_tokens tokens.
// The prefill budget: fixed chunk_size; unlimited when chunk_size == 0 (no chunking); in auto
// mode, the largest budget (at most max_auto_chunk) whose predicted
// step time (CostModel) stays within the step's time cap (StepPlan::step_cap_ms):
//  - decodes run: step_latency_target_ms (their inter-token latency), unless chunks of the
//    size it allows would finish the first prefill in order after its deadline where larger ones
//    would not: then the step of the smallest chunk that finishes in time (deadline_step_ms;
//    the other of two long prompts sent together, beside the first one's decodes);
//  - otherwise no longer than the quiet has lasted (the newest waiting request's wait: steps grow
//    from the target while it lasts, so a request arriving early waits little), up to
//    max_auto_chunk, the largest efficient chunk, so a prompt alone costs about what it costs
//    unchunked; never below the target;
//  - for expected arrivals (a Poisson rate lambda, SchedulerInput::past_arrivals_ms) the step
//    within which one arrives with probability at most arrival_risk (arrival_risk / lambda),
//    since an arrival waits for the whole step, but not below slack_share x ttft_slo_base_ms;
//  - when steps yield between their blocks (SchedulerInput::step_blocks > 0: a short prompt
//    arriving mid-step runs in a step of its own between two blocks, EngineCore::between_blocks,
//    unless the step's plan left such prompts waiting),
//    an arrival waits for a block, not the step: the two rules above bound a block instead, the
//    quiet's from block_wait_ms rather than the target, and expected arrivals' not below
//    block_wait_ms rather than the share of the TTFT budget, so a step holds step_blocks of those
//    (a long prompt's chunks grow without making arrivals wait: the decodes' target still holds;
//    and a rare arrival, such as the other of two long prompts sent together, does not cut the
//    step to step_blocks x block_wait_ms);
//  - for each request whose prefill the step can finish (its first token ends the step), a share
//    (slack_share) of its time to its deadline, with decodes running or not: a short prompt
//    arriving during a long one's prefill gets a short step of its own, not a chunk of the long
//    one filling the target. Never below what the step needs to finish the first of them (up to
//    the target). Requests that stay waiting behind the step's chunks are not a reason for a
//    shorter step: under earliest deadline first a shorter step does not let them start sooner,
//    it only adds steps (the burst of two long prompts).
// Chunks are therefore large when the machine is fast, the context short or nothing competes,
// small on a slow CPU under contention; a newly arrived short prompt starts within about one step.
//     LoRA: the requests admitted (running) use at most max_active_adapters distinct adapters
//     (the base is not one), so no step holds more. A waiting request of another adapter, when
//     all those slots are taken, waits; and so does every adapter request the policy orders after
//     it (the base's pass), so the adapters running drain, a slot frees and it goes next: no
//     adapter starves behind a steady stream of another's requests.
//  4. speculative drafts (SchedRequest::n_draft) are granted last, in decode order, from what is
//     left: they are budgeted like prompt tokens (batch tokens, KV blocks, predicted time) and
//     never take a prefill's share. A step that holds a prefill chunk or runs while one waits (in
//     every mode) is predicted to take at most kSpecPrefillSlack longer for them than without,
//     and gets none from a draft model (SchedulerInput::drafts_from_model): a first token never
//     waits for speculation. In auto mode a decode-only step stays within kSpecStretch x the step
//     without drafts (scoring a few more positions costs little on a memory-bound decode, and each
//     accepted one saves a step; a request arriving meanwhile waits at most that). Fixed and
//     unchunked modes bound decode-only steps' drafts by tokens only.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/cost_model.h"

namespace ft {

// How much longer than the same step without drafts a decode-only step may be predicted to take
// for its speculative drafts (scheduler step 4).
inline constexpr double kSpecStretch = 2.0;
// How much longer a step holding or delaying a prefill may be predicted to take for its drafts.
inline constexpr double kSpecPrefillSlack = 0.05;

struct SchedulerConfig {
  int64_t chunk_size = -1;          // -1 = auto, 0 = no chunking, N > 0 = fixed
  double step_latency_target_ms = 50;
  int64_t max_auto_chunk = 1024;    // auto mode's largest chunk (the largest efficient one)
  int64_t min_chunk = 16;           // auto mode never plans a smaller chunk (progress)
  // Hard cap on tokens in one step (the forward's capacity). The engine raises it to hold a whole
  // fixed chunk (unchunked: a whole context) plus a decode token per sequence.
  int64_t max_batch_tokens = 2048;
  int32_t max_num_seqs = 64;        // running requests at most
  double aging_ms = 2000;           // a request this far past its deadline gets half of every step
  // A prefill that can no longer make its deadline is ordered as if due this long from now
  // (order_deadline_ms): at least a short prompt's default TTFT budget (ttft_slo_base_ms plus
  // ttft_slo_stretch x its prefill), so one that arrived just now goes before it.
  double late_order_ms = 200;
  int32_t block_size = 16;
  // The default TTFT deadline of a request: base + stretch x its predicted prefill alone.
  double ttft_slo_base_ms = 100;
  double ttft_slo_stretch = 2;
  // Expected arrivals: a Poisson rate estimated from the arrivals of the last window; a step lasts
  // no longer than one within which an arrival stays this unlikely (the budget's rules above).
  double arrival_window_ms = 10000;
  double arrival_risk = 0.05;
  // An arrival this soon after the engine went idle (no request unfinished) is taken for the
  // same client's next request (a closed loop: a user, a script) and not counted as traffic, nor
  // is that time observed (SchedulerInput::unobserved_ms); nor is the request it followed, when
  // that was the only arrival in the window.
  double follow_up_ms = 250;
  // A step that finishes a request's prefill may take at most this share of its time to its
  // deadline (the rest is for arrivals that go before it).
  double slack_share = 0.25;
  // Steps that yield between their blocks: an arrival waits at most about this for the block
  // running when it comes (the budget's rules above).
  double block_wait_ms = 10;
  // Admission (0 = off): refuse a request whose predicted TTFT under the current queue exceeds
  // this factor x its TTFT budget (deadline - arrival).
  double reject_late_factor = 0;
  // LoRA: distinct adapters among the running requests (and so in one step), at most.
  int32_t max_active_adapters = 4;
  // LoRA adapters loaded at once (Engine::load_adapter refuses one more: each holds its packed
  // weights, and the load route is open to any client unless --api-key is set).
  int32_t max_loaded_adapters = 16;
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
  double deadline_ms = std::numeric_limits<double>::infinity();  // first token due (engine clock)
  int32_t priority = 0;     // lower goes first
  uint64_t admit_order = 0; // larger = admitted more recently
  int32_t n_draft = 0;      // decoding: speculative draft tokens it could verify this step (speculative.h)
  uint64_t adapter = 0;     // its LoRA adapter (LoraAdapter::uid), 0 = the base
  // Forks waiting for its first token (EngineRequest::forks): each becomes a running sequence
  // then, holding a block of its own (the copy of the prompt's partial block, or its first
  // decode's). Admission and the step that ends its prefill keep those slots and blocks free when
  // they can (never a reason to wait: a fork without room recomputes instead).
  int32_t n_forks = 0;
  // Positions admission reserves past the prompt: a first generated token's (0: an embedding,
  // which generates none).
  int32_t first_tokens = 1;
  int64_t pending() const { return n_tokens - n_computed; }
  bool decoding() const { return admitted && n_generated > 0 && pending() == 1; }
};

// A read-only view of the real KV block pool (the engine fills it from KVCache each step), so a
// plan fits the pool exactly and the engine applies it without fallbacks.
struct SchedulerInput {
  double now_ms = 0;
  std::vector<SchedRequest> requests;  // every unfinished request, admitted or waiting
  int32_t free_blocks = 0;             // KVCache::free_blocks()
  // Arrival times, within cfg.arrival_window_ms of now, of requests no longer in `requests`
  // (finished): the expected arrivals' rate is their count over the time observed, the window or,
  // while the engine is younger than that, its age (the Poisson rate's maximum-likelihood estimate;
  // the time since the oldest arrival would overstate it: one arrival 2 s ago is not 1 every 2 s).
  std::vector<double> past_arrivals_ms;
  double observed_since_ms = -std::numeric_limits<double>::infinity();  // when arrivals began to be seen
  // Of the time observed, the follow-up windows (cfg.follow_up_ms after each time the engine went
  // idle, less if a request came sooner): past_arrivals_ms leaves out the arrivals in them. For
  // open (Poisson) traffic the rate is unchanged (the arrivals and the time of those windows are
  // both left out); a client that sends its next request only once the last one finished shows
  // none (its first request leaves the window at its second), and its long prompts get the
  // chunks they get alone, not the short steps of a stream (1.38x TTFT on a 1.1B model, README:
  // "AMX tiles").
  double unobserved_ms = 0;
  CostModel cost;
  SchedulerConfig cfg;
  // Drafts come from a draft model: k forwards of its own before the step, outside `cost`.
  bool drafts_from_model = false;
  // The step yields between its blocks (StepExecutor::step_blocks): their number, as equal parts
  // of its time for an arrival's wait; 0: an arrival waits for the whole step.
  int32_t step_blocks = 0;
};

struct PrefillChunk {
  uint64_t id;
  int64_t n_tokens;
};

struct StepPlan {
  std::vector<uint64_t> preempt;       // release these first (back to waiting, recompute later)
  std::vector<uint64_t> admit;         // then admit these (reserve their pending sequence)
  std::vector<uint64_t> decode;        // one token each, batch order
  std::vector<int32_t> decode_draft;   // per decode: draft tokens granted (scored after its token)
  std::vector<PrefillChunk> prefill;   // after the decodes, batch order
  int64_t prefill_budget = 0;          // the budget the chunks were planned against
  double step_cap_ms = 0;              // auto mode: the step's time cap (infinity: none)
  double attn_pairs = 0;               // the step's attention pairs (the cost model's feature)
  double predicted_ms = 0;
  bool empty() const { return decode.empty() && prefill.empty(); }
  int64_t n_tokens() const;
};

StepPlan plan_step(const SchedulerInput& in);

// Attention pairs of a chunk of `chunk` tokens after n_computed: query i (0-based in the chunk)
// sees n_computed + i + 1 positions.
double attn_pairs(int64_t n_computed, int64_t chunk);
// Attention pairs of g drafts after a decode at n_computed: draft j (1-based) sits at position
// n_computed + j and attends to n_computed + j + 1 positions.
double draft_attn_pairs(int64_t n_computed, int32_t g);
// Predicted time to prefill `pending` tokens after n_computed in one step, alone.
double predict_prefill_ms(const CostModel& c, int64_t n_computed, int64_t pending);
// A request's TTFT budget when it names none.
double default_ttft_slo_ms(const SchedulerConfig& cfg, const CostModel& c, int64_t n_prompt);
// Predicted time to finish r's prefill in chunks of `chunk` tokens, each in a step beside
// n_decode decodes whose attention is decode_attn pairs.
double prefill_in_chunks_ms(const CostModel& c, const SchedRequest& r, int64_t chunk, int64_t n_decode,
                            double decode_attn);
// The time cap of a step beside n_decode decodes whose first prefill in order is r: the
// inter-token target (step_latency_target_ms), or, where chunks of the size it allows would
// finish r's prefill after its deadline and chunks of at most max_chunk would not, the step of
// the smallest chunk that finishes in time (a first token due outweighs the decodes' target;
// a deadline no chunk can meet does not).
double deadline_step_ms(const SchedulerInput& in, const SchedRequest& r, int64_t n_decode, double decode_attn,
                        int64_t max_chunk);

// Admission by prediction: a queued prefill, as the engine last saw it.
struct QueuedPrefill {
  int32_t priority = 0;
  double deadline_ms = 0;
  double remaining_ms = 0;  // predicted prefill left, alone
};
// The predicted TTFT of `r` (arriving now): the prefill left of every queued request due before
// it (by priority, then deadline), then its own. Late ones count, though the policy puts r before
// them (order_deadline_ms): aging gives them half of every step, and admitting whatever jumps a
// backlog let the queue fill with requests that end late (--reject-late's goodput under overload
// 14-16 -> 10.7 requests/s). Deliberately simple (no decode time, no chunk overheads):
// reject_late_factor is the margin.
double predict_ttft_ms(const std::vector<QueuedPrefill>& queue, const QueuedPrefill& r);
// The deadline a prefill is ordered by at now_ms: its own, or, when its prefill left (alone)
// cannot end by then, the later of that and now + cfg.late_order_ms.
double order_deadline_ms(double deadline_ms, double prefill_left_ms, double now_ms, const SchedulerConfig& cfg);

}  // namespace ft
