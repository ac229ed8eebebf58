#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

#include "kv/kv_cache.h"

namespace ft {

int64_t StepPlan::n_tokens() const {
  int64_t n = int64_t(decode.size());
  for (int32_t d : decode_draft) n += d;
  for (const auto& c : prefill) n += c.n_tokens;
  return n;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int32_t blocks(int64_t positions, int32_t block_size) { return KVCache::blocks_for(positions, block_size); }

// The policy's order among prefills: priority, earliest deadline first (a late request's as
// order_deadline_ms puts it), shortest remaining.
struct OrderKey {
  int32_t priority;
  double order_deadline_ms;
  double deadline_ms;
  int64_t pending;
  double arrival_ms;
  bool operator<(const OrderKey& o) const {
    if (priority != o.priority) return priority < o.priority;
    if (order_deadline_ms != o.order_deadline_ms) return order_deadline_ms < o.order_deadline_ms;
    if (deadline_ms != o.deadline_ms) return deadline_ms < o.deadline_ms;
    if (pending != o.pending) return pending < o.pending;
    return arrival_ms < o.arrival_ms;
  }
};

}  // namespace

double attn_pairs(int64_t n_computed, int64_t chunk) {
  return double(chunk) * double(n_computed) + double(chunk) * double(chunk + 1) / 2;
}

double draft_attn_pairs(int64_t n_computed, int32_t g) {
  return double(g) * double(n_computed + 1) + double(g) * double(g + 1) / 2;
}

double predict_prefill_ms(const CostModel& c, int64_t n_computed, int64_t pending) {
  return pending <= 0 ? 0 : c.predict(pending, attn_pairs(n_computed, pending));
}

double default_ttft_slo_ms(const SchedulerConfig& cfg, const CostModel& c, int64_t n_prompt) {
  return cfg.ttft_slo_base_ms + cfg.ttft_slo_stretch * predict_prefill_ms(c, 0, n_prompt);
}

double order_deadline_ms(double deadline_ms, double prefill_left_ms, double now_ms, const SchedulerConfig& cfg) {
  return deadline_ms - now_ms < prefill_left_ms ? std::max(deadline_ms, now_ms + cfg.late_order_ms) : deadline_ms;
}

double predict_ttft_ms(const std::vector<QueuedPrefill>& queue, const QueuedPrefill& r) {
  auto key = [](const QueuedPrefill& q) { return OrderKey{q.priority, q.deadline_ms, q.deadline_ms, 0, 0}; };
  const OrderKey mine = key(r);
  double t = r.remaining_ms;
  for (const QueuedPrefill& q : queue)
    if (!(mine < key(q))) t += q.remaining_ms;  // ordered before r, or tied with it
  return t;
}

// Predicted time to finish r's prefill in chunks of `chunk` tokens, each step beside n_decode
// decodes whose attention is decode_attn pairs.
double prefill_in_chunks_ms(const CostModel& c, const SchedRequest& r, int64_t chunk, int64_t n_decode, double decode_attn) {
  if (chunk <= 0) return kInf;  // (never finishes: min_chunk 0 and a target no token fits)
  double t = 0;
  for (int64_t done = r.n_computed, left = r.pending(); left > 0;) {
    const int64_t n = std::min(chunk, left);
    t += c.predict(n_decode + n, decode_attn + attn_pairs(done, n));
    done += n, left -= n;
  }
  return t;
}

double deadline_step_ms(const SchedulerInput& in, const SchedRequest& r, int64_t n_decode, double decode_attn,
                        int64_t max_chunk) {
  const SchedulerConfig& cfg = in.cfg;
  const double target = cfg.step_latency_target_ms, left_ms = r.deadline_ms - in.now_ms;
  auto step_ms = [&](int64_t chunk) { return in.cost.predict(n_decode + chunk, decode_attn + attn_pairs(r.n_computed, chunk)); };
  auto in_time = [&](int64_t chunk) { return prefill_in_chunks_ms(in.cost, r, chunk, n_decode, decode_attn) <= left_ms; };
  // The chunk the target allows (at least min_chunk, as the budget gives), then the smallest
  // larger one that finishes in time (binary search: fewer steps finish sooner).
  const int64_t most = std::min(max_chunk, r.pending());
  int64_t lo = 0, hi = most;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (step_ms(mid) <= target) lo = mid; else hi = mid - 1;
  }
  lo = std::max(lo, std::min(cfg.min_chunk, r.pending()));
  hi = most;
  if (lo >= hi || !std::isfinite(left_ms) || in_time(lo) || !in_time(hi)) return target;
  while (hi - lo > 1) {  // (in_time(hi), not in_time(lo))
    const int64_t mid = (lo + hi) / 2;
    (in_time(mid) ? hi : lo) = mid;
  }
  return std::max(target, step_ms(hi));
}

StepPlan plan_step(const SchedulerInput& in) {
  const SchedulerConfig& cfg = in.cfg;
  StepPlan plan;
  std::vector<const SchedRequest*> running, waiting;
  for (const auto& r : in.requests) (r.admitted ? running : waiting).push_back(&r);

  // 1-2. Decodes, preempting the most recently admitted requests while the cache is short.
  std::sort(running.begin(), running.end(),
            [](const SchedRequest* a, const SchedRequest* b) { return a->admit_order < b->admit_order; });
  int64_t free_blocks = in.free_blocks;
  auto decode_need = [&](const SchedRequest& r) {
    return std::max(0, blocks(r.n_computed + 1, cfg.block_size) - r.blocks_held);
  };
  for (;;) {
    int64_t need = 0;
    for (const auto* r : running)
      if (r->decoding()) need += decode_need(*r);
    if (need <= free_blocks || running.empty()) break;
    const SchedRequest* victim = running.back();  // most recently admitted
    running.pop_back();
    plan.preempt.push_back(victim->id);
    free_blocks += victim->blocks_held - victim->blocks_shared;
  }
  double attn = 0;
  for (const auto* r : running) {
    if (!r->decoding()) continue;
    if (int64_t(plan.decode.size()) >= cfg.max_batch_tokens) break;
    plan.decode.push_back(r->id);
    free_blocks -= decode_need(*r);
    attn += double(r->n_computed + 1);
  }
  const int64_t n_decode = int64_t(plan.decode.size());

  // 3. Prefill candidates: running requests with pending prefill, then waiting ones.
  std::vector<const SchedRequest*> cands;
  for (const auto* r : running)
    if (!r->decoding() && r->pending() > 0) cands.push_back(r);
  for (const auto* r : waiting) cands.push_back(r);
  // Preempted requests go back to waiting this very step: they must not be re-admitted now.
  std::erase_if(cands, [&](const SchedRequest* r) {
    return std::find(plan.preempt.begin(), plan.preempt.end(), r->id) != plan.preempt.end();
  });
  std::vector<std::pair<OrderKey, const SchedRequest*>> keyed;
  for (const auto* r : cands) {
    // A preempted request recomputing after its first token keeps its (long past) deadline: its
    // stream has begun, so it goes first, as it did before it was preempted.
    const double order_ms =
        r->n_generated > 0 ? r->deadline_ms
                           : order_deadline_ms(r->deadline_ms, predict_prefill_ms(in.cost, r->n_computed, r->pending()),
                                               in.now_ms, cfg);
    keyed.push_back({OrderKey{r->priority, order_ms, r->deadline_ms, r->pending(), r->arrival_ms}, r});
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) cands[i] = keyed[i].second;
  // The request longest past its deadline, by more than aging_ms, is guaranteed half of every
  // step's budget (when its priority, or being late (order_deadline_ms), puts it behind others).
  const SchedRequest* aged = nullptr;
  for (const auto* r : cands)
    if (in.now_ms - r->deadline_ms > cfg.aging_ms && (!aged || r->deadline_ms < aged->deadline_ms)) aged = r;

  // The prefill budget.
  const int64_t cap = std::max<int64_t>(0, cfg.max_batch_tokens - n_decode);
  int64_t budget;
  bool time_limited = false;  // auto mode under contention: each chunk is sized by predicted time
  if (cfg.chunk_size == 0) {
    budget = cap;
  } else if (cfg.chunk_size > 0) {
    budget = std::min(cfg.chunk_size, cap);
  } else {
    // The step's time cap (scheduler.h), then the largest budget within it, assuming the chunk
    // goes to the first candidate (its context determines the attention cost).
    // What an arrival may wait for: the step running when it comes, or its block when steps yield.
    const bool yields = in.step_blocks > 0;
    double wait_ms = kInf;
    if (n_decode == 0 && !cands.empty()) {
      // No longer than the quiet has lasted (the newest waiting request's wait). Requests that
      // stay waiting behind lose nothing by a longer step.
      double newest = cands.front()->arrival_ms;
      for (const auto* r : cands) newest = std::max(newest, r->arrival_ms);
      wait_ms = std::max(in.now_ms - newest, yields ? cfg.block_wait_ms : cfg.step_latency_target_ms);
    }
    // Expected arrivals: the step (when steps yield, the block) within which one arrives with
    // probability at most arrival_risk, but no shorter than a share of the smallest TTFT budget
    // (when steps yield, than the block wait).
    const double observed_ms = std::min(cfg.arrival_window_ms, in.now_ms - in.observed_since_ms) - in.unobserved_ms;
    const auto n_past = std::count_if(in.past_arrivals_ms.begin(), in.past_arrivals_ms.end(),
                                      [&](double a) { return in.now_ms - a <= cfg.arrival_window_ms; });
    if (n_past > 0 && observed_ms > 0)
      wait_ms = std::min(wait_ms, std::max(cfg.arrival_risk * observed_ms / double(n_past),
                                           yields ? cfg.block_wait_ms : cfg.slack_share * cfg.ttft_slo_base_ms));
    // Decodes hold a step to their inter-token target, unless the first prefill in order would
    // then miss its deadline: the smallest step that meets it (deadline_step_ms).
    const double decode_cap_ms =
        n_decode > 0 && !cands.empty() ? deadline_step_ms(in, *cands.front(), n_decode, attn, std::min(cfg.max_auto_chunk, cap))
                                       : kInf;
    double cap_ms = std::min(decode_cap_ms, yields ? wait_ms * double(in.step_blocks) : wait_ms);
    // A step that can finish a request's prefill (its first token ends the step) takes what that
    // needs; others' chunks fill it only up to a share of its time to its deadline, at most the
    // target: a short prompt arriving during a long one's prefill gets a short step, and a long
    // prompt's last chunk is not padded with the next one's. Never less than the step needs to
    // finish the first of them, up to the target (a late request is not split further).
    double finish_cap = kInf, floor_ms = 0;
    int64_t ahead = 0;
    double ahead_attn = attn;
    for (const auto* r : cands) {
      ahead += r->pending();
      if (ahead > std::min(cfg.max_auto_chunk, cap)) break;
      ahead_attn += attn_pairs(r->n_computed, r->pending());
      const double need_ms = in.cost.predict(n_decode + ahead, ahead_attn);
      if (floor_ms == 0) floor_ms = std::min(need_ms, cfg.step_latency_target_ms);
      const double share_ms = std::min(cfg.slack_share * (r->deadline_ms - in.now_ms), cfg.step_latency_target_ms);
      finish_cap = std::min(finish_cap, std::max(need_ms, share_ms));
    }
    cap_ms = std::max(std::min(cap_ms, finish_cap), floor_ms);
    plan.step_cap_ms = cap_ms;
    const int64_t ctx = cands.empty() ? 0 : cands.front()->n_computed;
    int64_t lo = 0, hi = std::min(cfg.max_auto_chunk, cap);
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      const double t = in.cost.predict(n_decode + mid, attn + attn_pairs(ctx, mid));
      if (t <= cap_ms) lo = mid; else hi = mid - 1;
    }
    budget = std::max(lo, std::min(cfg.min_chunk, cap));
    time_limited = true;
  }
  plan.prefill_budget = budget;

  // Fill the budget in the policy's order. A request's pending forks count as running (their slots
  // are kept while they wait for its first token).
  int64_t n_running = 0;
  for (const auto* r : running) n_running += 1 + r->n_forks;
  // LoRA adapters of the running requests (scheduler.h step 3): admission keeps them within the
  // cap; once a request waits for a slot, no adapter request after it is admitted.
  std::vector<uint64_t> adapters;
  for (const auto* r : running)
    if (r->adapter != 0 && std::find(adapters.begin(), adapters.end(), r->adapter) == adapters.end())
      adapters.push_back(r->adapter);
  bool adapter_waits = false;
  auto adapter_admits = [&](const SchedRequest* r) {
    if (r->adapter == 0) return true;
    if (adapter_waits) return false;
    if (std::find(adapters.begin(), adapters.end(), r->adapter) != adapters.end()) return true;
    if (int64_t(adapters.size()) < cfg.max_active_adapters) return true;
    adapter_waits = true;
    return false;
  };
  int64_t planned = n_decode;
  // Largest chunk of r that keeps the step's predicted time within target_ms (at least
  // min_chunk when `progress`, so the step's first prefill always moves).
  auto time_cap = [&](const SchedRequest* r, int64_t want, double target_ms, bool progress) {
    int64_t lo = 0, hi = want;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      const double t = in.cost.predict(planned + mid, attn + attn_pairs(r->n_computed, mid));
      if (t <= target_ms) lo = mid; else hi = mid - 1;
    }
    if (progress) lo = std::max(lo, std::min(want, cfg.min_chunk));
    return lo;
  };
  // Once the aged request waits for KV blocks, no request after it is admitted: the blocks that
  // running requests free go to it, not to a stream of smaller arrivals (which starved it).
  bool aged_waits_for_blocks = false;
  auto schedule = [&](const SchedRequest* r, int64_t allowance, double target_ms, bool progress) -> int64_t {
    int64_t chunk = std::min(allowance, r->pending());
    if (time_limited) chunk = time_cap(r, chunk, target_ms, progress);
    // (The batch's size is a hard bound: min_chunk's progress never passes it. A plan of more
    // tokens made the forward refuse its batch, failing every request in it.)
    chunk = std::min(chunk, cfg.max_batch_tokens - planned);
    if (chunk <= 0) return 0;
    if (!r->admitted) {
      if (aged_waits_for_blocks || n_running >= cfg.max_num_seqs || !adapter_admits(r)) return 0;
      // Admission attaches the cached prefix and reserves the rest of the sequence plus the first
      // generated token. A preemption this step may have made hit blocks idle: count them all.
      const int64_t need = blocks(r->n_tokens + r->first_tokens, cfg.block_size) - r->hit_blocks +
                           (plan.preempt.empty() ? r->hit_idle_blocks : r->hit_blocks);
      if (need > free_blocks) {
        aged_waits_for_blocks = r == aged;
        return 0;
      }
      free_blocks -= need + std::min<int64_t>(r->n_forks, free_blocks - need);  // its forks' blocks, when free
      if (r->adapter != 0 && std::find(adapters.begin(), adapters.end(), r->adapter) == adapters.end())
        adapters.push_back(r->adapter);
      plan.admit.push_back(r->id);
      n_running += 1 + r->n_forks;
    } else {
      const int64_t need = std::max(0, blocks(r->n_computed + chunk, cfg.block_size) - r->blocks_held);
      if (need > free_blocks) return 0;
      free_blocks -= need;
      if (chunk == r->pending()) free_blocks -= std::min<int64_t>(r->n_forks, free_blocks);  // they fork after it
    }
    plan.prefill.push_back({r->id, chunk});
    attn += attn_pairs(r->n_computed, chunk);
    planned += chunk;
    return chunk;
  };
  // An aged request that would not come first anyway takes half the budget (in auto mode half
  // the step's time) before the others; the shortest one still progresses by min_chunk, so
  // aging cannot turn into starving the short requests behind a long one.
  const bool aged_competes = aged && cands.front() != aged;
  const double target = plan.step_cap_ms;
  int64_t left = budget;
  if (aged_competes) left -= schedule(aged, std::max<int64_t>(1, budget / 2), target / 2, true);
  bool first = true;
  for (const SchedRequest* r : cands) {
    if (left <= 0 && !(time_limited && first)) break;
    if (aged_competes && r == aged) continue;
    left -= schedule(r, std::max<int64_t>(left, first && time_limited ? cfg.min_chunk : 0), target,
                     plan.prefill.empty() || first);
    first = false;
  }

  // 4. Speculative drafts from what is left (scheduler.h).
  plan.decode_draft.assign(plan.decode.size(), 0);
  bool any_draft = false;
  for (const auto* r : running) any_draft |= r->decoding() && r->n_draft > 0;
  // A step that holds a prefill chunk, or runs while one waits, stays within kSpecPrefillSlack
  // of its time without drafts (none at all from a draft model, whose forwards the prediction
  // does not count): a first token never waits for speculation. A decode-only step stays within
  // kSpecStretch x its time without drafts (a request arriving during it waits for its end).
  const bool prefill = !plan.prefill.empty() || !cands.empty();
  if (any_draft && !(prefill && in.drafts_from_model)) {
    double draft_cap_ms = kInf;
    if (prefill)
      draft_cap_ms = std::min((1 + kSpecPrefillSlack) * in.cost.predict(planned, attn),
                              time_limited ? plan.step_cap_ms : kInf);
    else if (time_limited)
      draft_cap_ms = kSpecStretch * in.cost.predict(planned, attn);
    for (size_t i = 0; i < plan.decode.size(); ++i) {
      const SchedRequest* r = *std::find_if(running.begin(), running.end(), [&](const SchedRequest* x) { return x->id == plan.decode[i]; });
      int32_t g = int32_t(std::min<int64_t>(r->n_draft, cfg.max_batch_tokens - planned));
      // KV: the decode already holds blocks for n_computed + 1 positions.
      const int32_t held = std::max(r->blocks_held, blocks(r->n_computed + 1, cfg.block_size));
      while (g > 0 && blocks(r->n_computed + 1 + g, cfg.block_size) - held > free_blocks) --g;
      auto pairs = [&](int32_t g) { return draft_attn_pairs(r->n_computed, g); };
      while (g > 0 && in.cost.predict(planned + g, attn + pairs(g)) > draft_cap_ms) --g;
      if (g <= 0) continue;
      free_blocks -= blocks(r->n_computed + 1 + g, cfg.block_size) - held;
      plan.decode_draft[i] = g;
      planned += g;
      attn += pairs(g);
    }
  }
  plan.attn_pairs = attn;
  plan.predicted_ms = plan.empty() ? 0 : in.cost.predict(plan.n_tokens(), attn);
  return plan;
}

}  // namespace ft
