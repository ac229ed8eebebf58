// The serving engine's single-threaded core: request states, the KV cache, and one step at a
// time (plan -> KV bookkeeping -> one forward over the flattened batch -> sampling -> events), or
// under pipeline parallelism up to one per stage in flight (step()).
// Deterministic given its inputs, so it is tested by simulation with a fake executor and a
// virtual clock; Engine (engine.h) runs it on its own thread with the real model.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"

namespace ft {

enum class FinishReason {
  Stop /* end-of-generation token */, Length /* max_tokens or context */, Cancelled,
  Error /* this request failed (EngineEvent::error says why); the others go on */
};
const char* finish_reason_name(FinishReason r);

inline constexpr int32_t kMaxLogprobs = 20;  // top alternatives a request may ask for
// Prompt positions of one request scored per step (EngineRequest::prompt_logprobs): its prefill
// chunks are cut to this many, which bounds the step's logits rows (n_vocab floats each).
inline constexpr int64_t kPromptLogprobsRows = 64;

// Shapes one request's logits before its sampler sees them (logit_bias, min_tokens, a grammar's
// mask), on the engine thread. apply: the row logits[0, n_vocab) that picks generated token number
// n_generated (0-based); accept: the token sampled from it. What either throws fails its request
// alone.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  virtual void apply(float* logits, int32_t n_vocab, int64_t n_generated) = 0;
  virtual void accept(int32_t token) = 0;
};

// An embedding request's pooling (EngineRequest::pooling): what one vector of the prompt's
// final-norm hidden states (dim floats each) it gets. None: a generation.
enum class Pooling : uint8_t { None, Mean /* of every position */, Cls /* the first position's */, Last /* the last's */ };
const char* pooling_name(Pooling p);

struct EngineEvent;
// Called on the engine thread; must not block.
using EventCallback = std::function<void(const EngineEvent&)>;

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 128;
  bool ignore_eos = false;
  double tokenize_ms = 0;  // measured by the caller, reported in the timings
  double arrival_ms = -1;  // on the engine clock; < 0: when the core receives it
  int32_t logprobs = -1;   // >= 0: report each sampled token's logprob and this many top ones (<= kMaxLogprobs)
  // >= 0: also the prompt's own tokens (positions 1..: what the model predicted for each from the
  // tokens before it) with this many top ones, on the first Token event. Its prefill skips the
  // prefix cache (a cached position has no logits) and computes logits for every prompt position,
  // at most kPromptLogprobsRows per step.
  int32_t prompt_logprobs = -1;
  int64_t trace_arrival_ns = 0;  // profiler clock (profile::now_ns) at arrival; 0 = when the core receives it
  double ttft_slo_ms = 0;  // TTFT budget from arrival; <= 0: default_ttft_slo_ms() of the prompt
  int32_t priority = 0;    // lower is scheduled first
  std::shared_ptr<LogitsProcessor> logits_processor;  // null: the raw logits
  // The LoRA adapter it runs under (model/lora.h; null: the base). Held until it finishes.
  std::shared_ptr<const LoraAdapter> adapter;
  // vLLM's cache_salt, hashed (0: none): the prefix cache shares blocks only between requests of
  // the same salt (and adapter), so one tenant cannot learn another's prompts from hit timings.
  uint64_t cache_salt = 0;
  // More choices of the same prompt (the server's `n`), sharing its one prefill: fork k is the
  // request with id (this one's) + 1 + k. When the prefill ends, each fork takes the prompt's KV
  // (KVCache::fork: full blocks shared, the last partial one copied) and samples its first token
  // from the same logits (through its own processor, with its own seed), then runs as a request
  // of its own (same limits, adapter, priority; no prompt_logprobs). Until then a fork cancelled
  // finishes alone, and the request finishing first (cancelled, failed) finishes its forks alike.
  // A fork that finds no room (max_num_seqs, or no block for the copy) waits and recomputes the
  // prompt, as a preempted request does.
  struct Fork {
    uint64_t seed = 0;
    std::shared_ptr<LogitsProcessor> logits_processor;
    EventCallback cb;
  };
  std::vector<Fork> forks;
  // An embedding instead of a generation: the prompt is prefilled and the request finishes
  // (Stop) with EngineEvent::embedding, the pooled final-norm hidden states (unnormalized);
  // nothing is sampled (no forks, logprobs or processor; max_tokens is not used). Mean and Cls
  // skip the prefix cache (their positions need hidden states); Last may take it.
  Pooling pooling = Pooling::None;
};

// Per-request timing breakdown (ms; times are on the engine clock, relative to its start).
struct RequestTimings {
  double arrival_ms = 0;
  double tokenize_ms = 0;
  double first_scheduled_ms = -1;  // start of the first step that computed any of its tokens
  double first_token_ms = -1;
  double finish_ms = -1;
  int32_t prefill_steps = 0;       // steps that carried a chunk of its prompt
  int64_t cached_tokens = 0;       // prompt tokens served by the prefix cache
  int32_t preemptions = 0;
  SpecStats spec;                  // speculative decoding: verifications, draft and accepted tokens
  std::vector<double> token_ms;    // time each generated token was sampled
  double queue_ms() const { return first_scheduled_ms < 0 ? 0 : first_scheduled_ms - arrival_ms; }
  double ttft_ms() const { return first_token_ms < 0 ? 0 : first_token_ms - arrival_ms; }
  double prefill_ms() const { return first_token_ms < 0 ? 0 : first_token_ms - first_scheduled_ms; }
  double decode_ms() const { return finish_ms < 0 || first_token_ms < 0 ? 0 : finish_ms - first_token_ms; }
  double total_ms() const { return finish_ms < 0 ? 0 : finish_ms - arrival_ms + tokenize_ms; }  // tokenizing included
};

struct EngineEvent {
  enum class Kind { Token, Finished };
  Kind kind = Kind::Token;
  uint64_t id = 0;
  int32_t token = -1;                        // Token
  float logprob = 0;                         // Token, when requested: log p(token)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // Token, when requested: best first
  // The first Token, with EngineRequest::prompt_logprobs: prompt tokens 1.. (token, logprob, top).
  std::vector<TokenLogprobs> prompt_logprobs;
  FinishReason reason = FinishReason::Stop;  // Finished
  std::string error;                         // Finished(Error): why
  bool request_error = false;                // Finished(Error): the request's own input (a RequestError)
  int64_t n_prompt = 0;                      // Finished
  int64_t n_generated = 0;                   // Finished
  std::vector<float> embedding;              // Finished(Stop) of an embedding (EngineRequest::pooling)
  const RequestTimings* timings = nullptr;   // valid during the callback
};

struct StepRecord {
  double start_ms = 0;
  double forward_ms = 0;
  double predicted_ms = 0;
  double step_cap_ms = 0;  // the policy's time cap for the step (infinity: none)
  int32_t n_decode = 0;
  std::vector<int64_t> chunks;  // prefill chunk sizes, batch order
  int64_t prefill_budget = 0;
  int32_t n_running = 0;
  int32_t n_waiting = 0;
  int32_t kv_used_blocks = 0;
  int32_t n_preempted = 0;
  bool between = false;  // ran between the blocks of another step (EngineCore::between_blocks)
  double cold = 0;       // warm_up_coldness at its start (the cost model's feature)
};

// Runs one forward over a batch; the real one wraps Forward, the simulation a fake model.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // logits: one row of n_vocab() per batch entry that wants them (kOutLogits), in batch order;
  // hidden: one row of n_embd() per kOutHidden entry (its final-norm hidden state), in batch order.
  virtual void forward(const Batch& batch, KVCache& kv, float* logits, float* hidden) = 0;
  virtual int32_t n_vocab() const = 0;
  // Ids a prompt may hold and sampling may pick: [0, n_tokens()), a prefix of the row (the rest
  // is vocabulary padding with no token).
  virtual int32_t n_tokens() const { return n_vocab(); }
  // The width of a hidden row (embeddings, EngineRequest::pooling); 0: none computed here.
  virtual int32_t n_embd() const { return 0; }
  // Steps that may be in flight at once (pipeline parallelism: one per stage), 1: none overlap.
  // forward() in two halves: begin runs a step up to the wait for its output rows (batch and kv
  // as in forward), finish waits for the oldest begun step's and writes its rows; finishes come
  // in begin order, with at most max_in_flight() begun steps unfinished. The engine core never
  // puts a sequence in two steps in flight (its next token is sampled from the first one's rows).
  virtual int32_t max_in_flight() const { return 1; }
  virtual void begin(const Batch& batch, KVCache& kv, float* logits, float* hidden) { forward(batch, kv, logits, hidden); }
  virtual void finish(float* /*logits*/, float* /*hidden*/) {}
  // Steps inside a step: an executor that yields calls EngineCore::between_blocks between the
  // blocks of the steps it begins (one process: no pipeline). step_blocks: how many blocks a
  // step is cut into, as equal parts of its time (SchedulerInput::step_blocks; 0: it does not
  // yield); between_max_batch: the most tokens a step run from there may hold.
  virtual int32_t step_blocks() const { return 0; }
  virtual int64_t between_max_batch() const { return 0; }
  // A whole step run from between two blocks of a begun one, on activations of its own (its
  // rows written before it returns); its sequences are none of the begun step's.
  virtual void forward_between(const Batch& /*batch*/, KVCache& /*kv*/, float* /*logits*/, float* /*hidden*/) {
    fail("engine: this executor does not run steps between blocks");
  }
};

// Where a speculating engine's time goes (ms on the engine thread, summed over steps; `bench
// model --spec` prints it). Draft forwards are split by what they held: round 0 of a propose()
// that also caught a sequence up with its prompt (more than the 2 tokens a verification leaves:
// the last draft and the target's own), and the others (1 or 2 positions per sequence).
struct SpecTimes {
  double catch_up_ms = 0;         // draft forwards that held prompt catch-up (and a first position)
  int64_t catch_up_forwards = 0;
  int64_t catch_up_tokens = 0;    // prompt tokens caught up (beyond one position per sequence)
  double draft_forward_ms = 0;    // the other draft forwards
  int64_t draft_forwards = 0;
  double draft_other_ms = 0;      // propose() outside its forwards: batch building, drafts' sampling
  double verify_forward_ms = 0;   // target forwards of steps that scored drafts
  int64_t verify_steps = 0;
  double plain_forward_ms = 0;    // target forwards of the other steps
  int64_t plain_steps = 0;
  double schedule_ms = 0;         // step start to the target forward, less propose()
  double sample_ms = 0;           // sampling and verification of every row, rollback included
  double emit_ms = 0;             // events, finishes, publishing
};

// A draft model for speculative decoding (SpecMethod::Draft; engine.h's DraftModelRunner), run on
// the engine thread. It keeps its own KV cache per sequence and follows each sequence's tokens
// itself (what it computed that the sequence no longer holds, rejected drafts, it rolls back).
class Drafter {
 public:
  struct Job {
    int32_t seq = 0;
    std::span<const int32_t> tokens;  // prompt + generated; the last one not yet in the target's cache
    int32_t k = 0;                    // draft tokens wanted
    int64_t remaining = 0;            // tokens the sequence may still emit (max_tokens, context)
    const SamplingParams* sampling = nullptr;
    std::vector<int32_t>* draft = nullptr;  // out: up to k tokens
    uint64_t position = 0;                  // the request sampler's position() at the first draft
  };
  virtual ~Drafter() = default;
  // Proposes drafts for every job in one batched pass per draft position. A job may get fewer
  // than k tokens, or none (its cache still catching up with its prompt, or full). catch_up_ms:
  // about how long catching sequences up with their prompts may take this step. Adds its forwards'
  // times to `times`.
  virtual void propose(std::span<Job> jobs, double catch_up_ms, SpecTimes& times) = 0;
  virtual void release(int32_t seq) = 0;  // the sequence finished or was preempted
};

struct EngineCounters {
  uint64_t prompt_tokens = 0;     // prompt tokens of finished requests (once for a request's n choices)
  uint64_t prefill_tokens = 0;    // positions computed by prefill chunks (recomputes included)
  uint64_t forks = 0;             // choices started by forking a prefilled request (EngineRequest::forks)
  uint64_t generated_tokens = 0;
  // Speculative decoding (vLLM's spec_decode_* counters): verifications that scored drafts, draft
  // tokens scored, accepted ones, and accepted ones per draft position (0-based).
  uint64_t spec_drafts = 0;
  uint64_t spec_draft_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  std::array<uint64_t, kMaxSpecTokens> spec_accepted_per_pos{};
  SpecTimes spec_times;
  uint64_t finished = 0;
  uint64_t cancelled = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t between_steps = 0;  // of those, run between the blocks of another (between_blocks)
  uint64_t max_steps_in_flight = 0;  // the most steps begun and not finished at once (overlap: > 1)
};

class EngineCore {
 public:
  // now(): the engine clock in ms. n_ctx: positions per sequence.
  EngineCore(KVCache& kv, StepExecutor& exec, const SchedulerConfig& cfg, const CostModel& cost,
             int64_t n_ctx, std::function<bool(int32_t)> is_eog, std::function<double()> now);

  // Throws ft::Error when the request is invalid or can never fit (context or whole cache).
  void validate(const EngineRequest& r) const;
  // Validates first; ids id .. id + r.forks.size() must all be free.
  void add(uint64_t id, EngineRequest r, EventCallback cb);
  void cancel(uint64_t id);  // emits Finished(Cancelled) and frees its KV (a pending fork's too); unknown id: no-op
  void cancel_all();
  // After a step threw: the requests it may have touched (admitted, admitted by its plan, or
  // with rows in flight) finish with Error; the waiting ones stay queued, holding nothing.
  void fail_running(const std::string& why);
  bool idle() const { return reqs_.empty() && in_flight_.empty(); }
  // One turn: begins a step (plan -> KV bookkeeping -> the forward's first half) when fewer than
  // exec.max_in_flight() are in flight and anything can run, then, unless that left room for
  // another, finishes the oldest (its logits -> sampling -> events); false if it did neither. With
  // one step in flight at most, each turn is one whole step. Steps in flight hold disjoint
  // requests: while a request's logits rows are in flight it is left out of the next plans, and
  // the decoding requests are split into max_in_flight() groups (ceil(decoding / max_in_flight())
  // each), one per step, so consecutive steps overlap across pipeline stages.
  bool step();
  // Finishes every step in flight (before the engine stops: their rows must be taken).
  void finish_in_flight();
  // Called by the executor between two blocks of the step it runs (StepExecutor::step_blocks;
  // done: the share of its blocks done, from which its time left is estimated):
  // when requests not in that step wait with at most between_max_batch() tokens pending, a step
  // of theirs runs now, planned as any (prefill only; it must finish one's prefill, or it does
  // not run), so a short prompt arriving during a long step gets its first token after the
  // block running then, not after the step. One level: not from inside such a step. Once the
  // steps run inside one step took step_latency_target_ms, no more start there (a flood of
  // short prompts could otherwise hold a step, and its decodes, for one step per block). Nor
  // when that step was planned with such prompts left waiting: a step between blocks is for
  // what arrives during the step, not for the queue it was planned over (under overload that
  // doubled every decode step: README "Overload").
  void between_blocks(double done);
  int32_t steps_in_flight() const { return int32_t(in_flight_.size()); }

  int32_t n_running() const;
  int32_t n_waiting() const;
  const EngineCounters& counters() const { return counters_; }
  const std::deque<StepRecord>& steps() const { return steps_; }
  // Replaces the cost model's prior (and what it learned).
  void set_cost_model(const CostModel& c) { cost_ = OnlineCostModel(c); }
  const CostModel& cost_model() const { return cost_.model(); }
  const PredictionErrorHistogram& prediction_errors() const { return errors_; }
  const SchedulerConfig& config() const { return cfg_; }
  // Every request with prefill left, for admission by prediction (predict_ttft_ms).
  std::vector<QueuedPrefill> queued_prefills() const;
  // Turns speculative decoding on for requests added from now on (drafter: the draft model, for
  // SpecMethod::Draft; unused otherwise). Requests with a LogitsProcessor never speculate.
  void set_speculation(const SpecConfig& spec, Drafter* drafter);
  const SpecConfig& speculation() const { return spec_; }

 private:
  struct Req {
    uint64_t id = 0;
    int32_t seq = 0;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t n_prompt = 0;
    int64_t n_computed = 0;
    int64_t n_generated = 0;
    int64_t max_tokens = 0;
    bool ignore_eos = false;
    int32_t logprobs = -1;
    int32_t prompt_logprobs = -1;
    std::vector<TokenLogprobs> prompt_lp;  // scored so far: prompt_lp[k] is prompt token k + 1
    Pooling pooling = Pooling::None;
    std::vector<double> pool;  // an embedding's sum of the hidden rows it pools so far (empty: none yet)
    int64_t pooled = 0;        // ... and their count
    bool admitted = false;
    bool in_flight = false;  // its output rows (logits, hidden) are in a step in flight
    uint64_t admit_order = 0;
    double deadline_ms = 0;
    int32_t priority = 0;
    std::unique_ptr<Sampler> sampler;
    std::shared_ptr<LogitsProcessor> processor;
    std::shared_ptr<const LoraAdapter> adapter;
    struct PendingFork {
      uint64_t id;
      EngineRequest::Fork f;
    };
    std::vector<PendingFork> forks;  // EngineRequest::forks, until its first token
    uint64_t salt = 0;  // its prefix-cache key space (KVCache: prefix_salt of the adapter)
    mutable KVCache::PrefixMemo prefix_memo;  // while waiting: its prefix hit so far (a cache)
    bool speculate = false;
    bool forked = false;  // a fork of another request (not an arrival of its own)
    bool follow_up = false;  // arrived within cfg.follow_up_ms of the engine going idle
    std::vector<int32_t> draft;  // this step's draft tokens (after its pending token)
    int32_t steps_without_draft = 0;  // auto k: a request whose drafts did not pay probes again
    EventCallback cb;
    RequestTimings t;
    int64_t trace_arrival_ns = 0, trace_scheduled_ns = 0, trace_first_token_ns = 0;  // while profiling
  };
  void finish(Req& r, FinishReason why, const std::string& error = {}, bool request_error = false);
  // A pending fork that never started: its Finished event (timings: its parent's so far).
  void finish_fork(Req::PendingFork& f, const Req& parent, FinishReason why, const std::string& error = {});
  // At r's first token: its forks as requests of their own, in id order (their KV forked from r's
  // when there is room), before r samples from `row` (raw logits); returns them.
  std::vector<Req*> spawn_forks(Req& r);
  // Runs a request's callback; what it throws is logged, never propagated (it runs mid-step).
  void emit(Req& r, const EngineEvent& ev);
  void preempt(Req& r);
  void group_decodes_by_adapter(StepPlan& plan) const;
  // Draft tokens this request would verify at its next decode (0 = none), by the auto policy.
  int32_t spec_k(Req& r) const;
  // Whether its prompt is still being scored (prompt_logprobs, before its first token): no prefix
  // cache, logits at every prompt position.
  static bool scoring_prompt(const Req& r) { return r.prompt_logprobs >= 0 && r.n_generated == 0; }
  // Whether every prompt position must be computed here (no prefix cache): a prompt being scored,
  // or an embedding pooled over its positions.
  static bool computes_whole_prompt(const Req& r) {
    return scoring_prompt(r) || r.pooling == Pooling::Mean || r.pooling == Pooling::Cls;
  }
  // Positions admission reserves past the prompt (SchedRequest::first_tokens).
  static int32_t first_tokens(const Req& r) { return r.pooling == Pooling::None ? 1 : 0; }
  // Whether an embedding pools the hidden state of prompt position pos.
  static bool pools(const Req& r, int64_t pos) {
    return r.pooling == Pooling::Mean || (r.pooling == Pooling::Cls && pos == 0) ||
           (r.pooling == Pooling::Last && pos == r.n_prompt - 1);
  }
  // Whether it is decoding: one token pending after its first (SchedRequest::decoding).
  static bool decoding(const Req& r) {
    return r.admitted && r.n_generated > 0 && int64_t(r.tokens.size()) - r.n_computed == 1;
  }
  // Whether a step between blocks (at most cap tokens) could carry it: a prompt of its pending
  // tokens, before any prefix-cache hit.
  static bool between_sized(const Req& r, int64_t cap) {
    return !decoding(r) && int64_t(r.tokens.size()) - r.n_computed <= cap;
  }

  KVCache& kv_;
  StepExecutor& exec_;
  SchedulerConfig cfg_;
  OnlineCostModel cost_;           // refitted after every step
  PredictionErrorHistogram errors_;
  double started_ms_ = 0;              // engine clock at construction (arrivals observed since)
  std::deque<double> past_arrivals_;  // arrival times of finished requests, within the arrival window
  // When the engine last went idle (no request unfinished; < 0: busy, or never was), the arrival
  // the request finishing then put in past_arrivals_ (< 0: none), and the follow-up windows
  // since (when each began, its length): SchedulerInput::unobserved_ms.
  double idle_since_ = -1, idle_by_arrival_ = -1;
  std::deque<std::pair<double, double>> follow_ups_;
  int64_t n_ctx_;
  std::function<bool(int32_t)> is_eog_;
  std::function<double()> now_;
  std::map<uint64_t, Req> reqs_;  // ordered by id = arrival order
  uint64_t admit_counter_ = 0;
  std::vector<uint64_t> step_admits_;  // the last plan's admissions: a step that throws may stop one halfway
  EngineCounters counters_;
  std::deque<StepRecord> steps_;  // the most recent steps
  Batch batch_;
  // Logits rows of a step: per request, its first row and how many it owns (a decode with g
  // draft tokens owns g + 1, batch order). r: null once the request finished (cancelled) while
  // its step was in flight.
  struct RowGroup {
    Req* r;
    size_t first;
    int32_t n;
  };
  // Rows of consecutive prompt positions: being scored (prompt_logprobs; first: a logits row) or
  // pooled (an embedding's; first: a hidden row). The request, its first row, the position of
  // that row, how many.
  struct PromptRows {
    Req* r;
    size_t first;
    int64_t pos, n;
  };
  // A step begun and not finished: what finishing it needs.
  struct Flight {
    StepRecord rec;
    std::vector<float> logits;  // (rows, n_vocab)
    std::vector<float> hidden;  // (hidden rows, n_embd): embeddings' positions
    std::vector<RowGroup> groups;
    std::vector<PromptRows> prompt_rows;
    std::vector<PromptRows> hidden_rows;  // embeddings' rows: first indexes hidden
    size_t n_rows = 0;
    int64_t tokens = 0, draft_rows = 0;
    double draft_pairs = 0, attn_pairs = 0;
    double begin_ms = 0;        // the forward's first half
    int64_t p_forward = 0;      // profiler clock at its start
    bool between = false;       // run by forward_between (its logits are there when it returns)
  };
  // Plans and begins a step; false when nothing can run now. between: a step between the
  // blocks of the one running (between_blocks).
  bool begin_step(double t0, int64_t p0, bool between = false);
  // Finishes the oldest step in flight. p_step: the turn's profiler start (0: not profiling);
  // merged: the step was begun in this turn (one forward span, as before the split).
  void finish_step(int64_t p_step, bool merged);
  std::deque<Flight> in_flight_;  // oldest first
  std::vector<Flight> spare_flights_;  // finished ones, their buffers kept
  std::vector<float> fork_logits_;  // this step's forks' rows (copies of their parent's raw row)
  // between_blocks: a step's forward is running (steps may run between its blocks), one of those
  // is, and their time so far (taken out of the running step's forward time); when the running
  // step's forward began, the share of its blocks done and its first tokens.
  bool running_ = false, between_ = false;
  double between_ms_ = 0, running_start_ms_ = 0, running_done_ = 0;
  // The busy period the engine is in (warm_up_coldness): its start, and the last forward's end.
  double busy_since_ms_ = 0, last_forward_end_ms_ = -1e300;
  int64_t running_firsts_ = 0;
  // The running step's plan left out a request a step between its blocks could take
  // (between_sized, not in flight, no adapter waiting for a slot): see between_blocks.
  bool running_left_waiting_ = false;
  Batch between_batch_;  // (batch_ is the running step's)
  SpecConfig spec_;
  Drafter* drafter_ = nullptr;
};

}  // namespace ft
