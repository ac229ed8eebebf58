// The scheduling policy (plan_step) and the engine core, by discrete-event simulation: a fake
// model whose next token is a hash of the sequence so far (read back through the real paged KV
// cache), a virtual clock advanced by a synthetic cost model. No real model needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <numeric>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/scheduler.h"

namespace ft {
namespace {

// ---- plan_step -------------------------------------------------------------------------------

SchedRequest waiting(uint64_t id, int64_t prompt, double arrival = 0) {
  SchedRequest r;
  r.id = id;
  r.n_tokens = prompt;
  r.arrival_ms = arrival;
  return r;
}

SchedRequest decoding(uint64_t id, int64_t n_tokens, int32_t blocks_held, uint64_t order) {
  SchedRequest r;
  r.id = id;
  r.n_tokens = n_tokens;
  r.n_computed = n_tokens - 1;
  r.n_generated = 1;
  r.admitted = true;
  r.blocks_held = blocks_held;
  r.admit_order = order;
  return r;
}

SchedulerInput input(std::vector<SchedRequest> reqs, int32_t free_blocks, int64_t chunk = -1) {
  SchedulerInput in;
  in.requests = std::move(reqs);
  in.free_blocks = free_blocks;
  in.cfg.chunk_size = chunk;
  in.cfg.block_size = 16;
  in.cfg.step_latency_target_ms = 50;
  in.cost = {5.0, 0.1, 0.0};  // 5 ms + 0.1 ms/token: 450 tokens fit in 50 ms
  return in;
}

TEST(PlanStep, DecodesFirstThenShortestPrefillFirst) {
  auto in = input({decoding(1, 20, 2, 1), waiting(2, 300), waiting(3, 40), waiting(4, 100)}, 100);
  const StepPlan p = plan_step(in);
  EXPECT_EQ(p.decode, (std::vector<uint64_t>{1}));
  ASSERT_GE(p.prefill.size(), 2u);
  EXPECT_EQ(p.prefill[0].id, 3u);  // 40 tokens
  EXPECT_EQ(p.prefill[1].id, 4u);  // 100 tokens
  // Auto budget: the step stays within the 50 ms target.
  EXPECT_LE(p.predicted_ms, 50.0 + 1e-9);
  EXPECT_GE(p.n_tokens(), 400);
}

TEST(PlanStep, AutoChunkIsAsLargeAsTheTargetAllows) {
  // Alone: the largest chunk within the 50 ms target (a request may arrive mid-step).
  const StepPlan p = plan_step(input({waiting(1, 5000)}, 1000));
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_LE(p.predicted_ms, 50.0 + 1e-9);
  EXPECT_GE(p.prefill[0].n_tokens, 300);
  EXPECT_LT(p.prefill[0].n_tokens, 1024);
  // A fast machine (cheap steps): max_auto_chunk.
  auto fast = input({waiting(1, 5000)}, 1000);
  fast.cost.per_token_ms /= 100;
  fast.cost.per_attn_ms /= 100;
  EXPECT_EQ(plan_step(fast).prefill[0].n_tokens, 1024);
  const StepPlan q = plan_step(input({waiting(1, 5000), waiting(2, 10)}, 1000));
  EXPECT_LE(q.predicted_ms, 50.0 + 1e-9);
  EXPECT_EQ(q.prefill[0].id, 2u);
}

// In auto mode a long prompt that has aged keeps half the step's time, and a short one that
// arrived behind it still progresses every step (aging must not starve the short ones).
TEST(PlanStep, AgedLongPromptDoesNotStarveShortOnes) {
  auto in = input({waiting(1, 5000, 0.0), waiting(2, 45, 2990)}, 1000);
  in.cost.per_token_ms *= 20;  // slow machine: the target holds few tokens
  in.now_ms = 3000;
  const StepPlan p = plan_step(in);
  std::map<uint64_t, int64_t> got;
  for (const auto& c : p.prefill) got[c.id] = c.n_tokens;
  EXPECT_GE(got[1], 1);
  EXPECT_GE(got[2], 16);  // min_chunk at least
  EXPECT_LE(p.predicted_ms, 50.0 * 1.5);
}

TEST(PlanStep, FixedAndUnchunked) {
  const StepPlan fixed = plan_step(input({waiting(1, 5000)}, 1000, 256));
  EXPECT_EQ(fixed.prefill[0].n_tokens, 256);
  auto in = input({waiting(1, 1900)}, 1000, 0);
  const StepPlan whole = plan_step(in);
  EXPECT_EQ(whole.prefill[0].n_tokens, 1900);
}

TEST(PlanStep, AdmitsOnlyWhatTheCacheHolds) {
  // 3 free blocks of 16: a 40-token prompt (+1) needs 3, a 60-token one 4.
  const StepPlan p = plan_step(input({waiting(1, 60), waiting(2, 40)}, 3));
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{2}));
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(p.prefill[0].id, 2u);
}

TEST(PlanStep, PreemptsTheMostRecentlyAdmittedWhenDecodesDoNotFit) {
  // Both decodes cross into a new block; only one block is free.
  const StepPlan p = plan_step(input({decoding(1, 33, 2, 1), decoding(2, 33, 2, 2)}, 1));
  EXPECT_EQ(p.preempt, (std::vector<uint64_t>{2}));
  EXPECT_EQ(p.decode, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(p.admit.empty());  // the victim is not re-admitted in the same step
}

// The plan sees the real pool's prefix hits: a 100-token prompt (+1: 7 blocks) whose first 80
// tokens (5 blocks) are cached in blocks other sequences hold needs only 2 free blocks, and its
// chunk is what is left after the hit; hit blocks that sit idle in the pool are taken from it.
TEST(PlanStep, AdmissionCountsPrefixHits) {
  SchedRequest hit = waiting(1, 100);
  hit.n_computed = 80;
  hit.hit_blocks = 5;
  StepPlan p = plan_step(input({hit}, 3));
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{1}));
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(p.prefill[0].n_tokens, 20);
  hit.hit_idle_blocks = 5;
  EXPECT_TRUE(plan_step(input({hit}, 3)).admit.empty());
  EXPECT_EQ(plan_step(input({hit}, 7)).admit, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(plan_step(input({waiting(1, 100)}, 3)).admit.empty());  // no hit: 7 blocks
}

// Preempting a request frees only the blocks no other sequence holds.
TEST(PlanStep, PreemptionCountsOnlyUnsharedBlocks) {
  SchedRequest shared = decoding(2, 33, 2, 2);
  shared.blocks_shared = 2;
  const StepPlan p = plan_step(input({decoding(1, 33, 2, 1), shared}, 1));
  EXPECT_EQ(p.preempt, (std::vector<uint64_t>{2}));
  EXPECT_EQ(p.decode, (std::vector<uint64_t>{1}));  // 1 free block still covers request 1
  const StepPlan q = plan_step(input({decoding(1, 33, 2, 1), shared}, 0));
  EXPECT_EQ(q.preempt, (std::vector<uint64_t>{2, 1}));  // freeing request 2 gained nothing
  EXPECT_TRUE(q.decode.empty());
}

TEST(PlanStep, AgedRequestGetsHalfTheBudget) {
  auto in = input({waiting(1, 5000, 0.0), waiting(2, 30, 2900), waiting(3, 30, 2950)}, 1000, 512);
  in.now_ms = 3000;  // request 1 has waited 3 s > aging_ms (2 s)
  const StepPlan p = plan_step(in);
  std::map<uint64_t, int64_t> got;
  for (const auto& c : p.prefill) got[c.id] = c.n_tokens;
  EXPECT_EQ(got[2], 30);
  EXPECT_EQ(got[3], 30);
  EXPECT_EQ(got[1], 256);  // its half; the short ones take what they need
  EXPECT_EQ(p.prefill[0].id, 1u);
}

// ---- simulation ------------------------------------------------------------------------------

constexpr int32_t kVocab = 97;

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

// The fake model: stores each token in the cache (kv_dim 1), and the next token after position
// p is a hash of the tokens at 0..p read back through the block table. Advances the virtual
// clock by the synthetic cost of the step.
class FakeExecutor : public StepExecutor {
 public:
  FakeExecutor(double* clock, CostModel cost) : clock_(clock), cost_(cost) {}
  void forward(const Batch& b, KVCache& kv, float* logits) override {
    double pairs = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      const float t = float(b.tokens[size_t(i)]);
      kv.write(0, b.seq[size_t(i)], b.pos[size_t(i)], &t, &t);
      pairs += b.pos[size_t(i)] + 1;
    }
    size_t row = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      if (!b.want_logits[size_t(i)]) continue;
      uint64_t h = 1;
      for (int32_t p = 0; p <= b.pos[size_t(i)]; ++p) {
        float t;
        kv.read(0, b.seq[size_t(i)], p, &t, nullptr);
        h = mix(h, uint64_t(t));
      }
      float* l = logits + row++ * kVocab;
      for (int32_t t = 0; t < kVocab; ++t) l[t] = 0;
      l[h % kVocab] = 1;
    }
    *clock_ += cost_.predict(b.size(), pairs);
    ++forwards;
  }
  int32_t n_vocab() const override { return kVocab; }
  int forwards = 0;

 private:
  double* clock_;
  CostModel cost_;
};

// What the fake model generates for a prompt, computed directly.
std::vector<int32_t> expected_output(std::vector<int32_t> seq, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k < n; ++k) {
    uint64_t h = 1;
    for (int32_t t : seq) h = mix(h, uint64_t(t));
    const int32_t next = int32_t(h % kVocab);
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

struct SimRequest {
  double arrival_ms;
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

struct SimResult {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  std::map<uint64_t, RequestTimings> timings;
  std::map<uint64_t, FinishReason> reasons;
  std::vector<StepRecord> steps;
  EngineCounters counters;
  int32_t kv_total = 0;
  int32_t kv_used_after = 0;
};

std::vector<int32_t> make_prompt(int64_t n, int seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t((i * 31 + seed * 17 + 3) % kVocab);
  return p;
}

SimResult simulate(const std::vector<SimRequest>& reqs, SchedulerConfig cfg, int32_t kv_blocks,
                   bool prefix_caching = true, const CostModel& cost = {5.0, 0.1, 1e-5}) {
  double clock = 0;
  FakeExecutor exec(&clock, cost);
  KVCacheConfig kc;
  kc.n_layers = 1;
  kc.kv_dim = 1;
  kc.block_size = 16;
  kc.n_blocks = kv_blocks;
  kc.prefix_caching = prefix_caching;
  KVCache kv(kc);
  EngineCore core(kv, exec, cfg, cost, 1 << 20, {}, [&] { return clock; });
  SimResult res;
  res.kv_total = kv.total_blocks();
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return reqs[a].arrival_ms < reqs[b].arrival_ms; });
  size_t next = 0;
  for (int guard = 0; guard < 1000000; ++guard) {
    while (next < order.size() && reqs[order[next]].arrival_ms <= clock) {
      const uint64_t id = order[next] + 1;
      EngineRequest r;
      r.prompt = reqs[order[next]].prompt;
      r.max_tokens = reqs[order[next]].max_tokens;
      r.arrival_ms = reqs[order[next]].arrival_ms;
      r.sampling.temperature = 0;
      core.add(id, std::move(r), [&res](const EngineEvent& ev) {
        if (ev.kind == EngineEvent::Kind::Token) {
          res.outputs[ev.id].push_back(ev.token);
        } else {
          res.timings[ev.id] = *ev.timings;
          res.reasons[ev.id] = ev.reason;
        }
      });
      ++next;
    }
    if (core.idle()) {
      if (next == order.size()) break;
      clock = reqs[order[next]].arrival_ms;
      continue;
    }
    EXPECT_TRUE(core.step());
    EXPECT_LE(kv.used_blocks(), kv.total_blocks());
  }
  res.steps.assign(core.steps().begin(), core.steps().end());
  res.counters = core.counters();
  res.kv_used_after = kv.used_blocks();
  return res;
}

void expect_complete_and_correct(const std::vector<SimRequest>& reqs, const SimResult& res) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t id = i + 1;
    ASSERT_TRUE(res.reasons.count(id)) << "request " << id << " never finished";
    EXPECT_EQ(res.reasons.at(id), FinishReason::Length);
    EXPECT_EQ(res.outputs.at(id), expected_output(reqs[i].prompt, reqs[i].max_tokens)) << "request " << id;
  }
  EXPECT_EQ(res.kv_used_after, 0);
}

TEST(Simulation, ShortPromptsDoNotWaitBehindALongOne) {
  // A 6000-token prompt at t=0 (alone it takes ~0.6 s of prefill), 50-token prompts every 150 ms.
  std::vector<SimRequest> reqs = {{0.0, make_prompt(6000, 1), 16}};
  for (int k = 1; k <= 20; ++k) reqs.push_back({150.0 * k, make_prompt(50, k + 1), 16});
  SchedulerConfig cfg;
  cfg.step_latency_target_ms = 50;
  const SimResult res = simulate(reqs, cfg, 2000);
  expect_complete_and_correct(reqs, res);
  double max_step = 0;
  for (const auto& s : res.steps) max_step = std::max(max_step, s.forward_ms);
  if (std::getenv("FT_SIM_TRACE"))
    for (const auto& s : res.steps)
      std::printf("t=%8.1f fwd=%6.1f dec=%d chunks=%zu first=%lld budget=%lld\n", s.start_ms, s.forward_ms, s.n_decode,
                  s.chunks.size(), s.chunks.empty() ? 0LL : (long long)s.chunks[0], (long long)s.prefill_budget);
  // Every step but the long prompt's lone first chunks keeps to the target (plus one decode
  // batch of slack); a short prompt starts within about one step.
  for (size_t i = 1; i < reqs.size(); ++i) {
    const RequestTimings& t = res.timings.at(i + 1);
    EXPECT_LE(t.queue_ms(), max_step + 1e-9) << "short request " << i;
    EXPECT_LE(t.ttft_ms(), 2 * max_step + 1e-9) << "short request " << i;
  }
  // The long prompt is never starved: it finishes within 1.5x its isolated TTFT.
  const SimResult alone = simulate({reqs[0]}, cfg, 2000);
  EXPECT_LE(res.timings.at(1).ttft_ms(), 1.5 * alone.timings.at(1).ttft_ms());
  // With no chunking the same workload makes short prompts wait behind the whole long prefill.
  SchedulerConfig none = cfg;
  none.chunk_size = 0;
  none.max_batch_tokens = 8192;
  const SimResult hol = simulate(reqs, none, 2000);
  expect_complete_and_correct(reqs, hol);
  EXPECT_GT(hol.timings.at(2).queue_ms(), 3 * max_step);
}

TEST(Simulation, LongPromptIsNotStarvedByAFloodOfShortOnes) {
  std::vector<SimRequest> reqs = {{0.0, make_prompt(3000, 1), 4}};
  for (int k = 1; k <= 400; ++k) reqs.push_back({10.0 * k, make_prompt(40, k + 1), 4});  // 100/s
  SchedulerConfig cfg;
  cfg.step_latency_target_ms = 30;
  cfg.aging_ms = 500;
  const SimResult res = simulate(reqs, cfg, 4000);
  expect_complete_and_correct(reqs, res);
  EXPECT_LT(res.timings.at(1).ttft_ms(), 500 + 3000 * 2 * 0.1 + 1000);
}

TEST(Simulation, EveryChunkSettingGivesTheSameOutputs) {
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 16; ++k) reqs.push_back({5.0 * k, make_prompt(1 + (k * 37) % 500, k), 8 + k});
  for (int64_t chunk : {-1, 0, 1, 7, 64, 256}) {
    SchedulerConfig cfg;
    cfg.chunk_size = chunk;
    cfg.max_batch_tokens = chunk == 0 ? 8192 : 2048;
    SCOPED_TRACE(chunk);
    expect_complete_and_correct(reqs, simulate(reqs, cfg, 1000));
  }
}

TEST(Simulation, PreemptionKeepsEveryOutputComplete) {
  // 8 requests of 30 + 100 tokens need 9 blocks each; the cache has 30.
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 8; ++k) reqs.push_back({0.0, make_prompt(30, k), 100});
  const SimResult res = simulate(reqs, SchedulerConfig{}, 30);
  expect_complete_and_correct(reqs, res);
  EXPECT_GT(res.counters.preemptions, 0u);
  for (const auto& s : res.steps) EXPECT_LE(s.kv_used_blocks, res.kv_total);
}

TEST(Simulation, PrefixCacheHitsGiveTheSameOutput) {
  const std::vector<int32_t> system = make_prompt(100, 42);
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 4; ++k) {
    std::vector<int32_t> p = system;
    const auto tail = make_prompt(10 + k, k);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back({100.0 * k, p, 12});
  }
  const SimResult cached = simulate(reqs, SchedulerConfig{}, 200, true);
  const SimResult plain = simulate(reqs, SchedulerConfig{}, 200, false);
  expect_complete_and_correct(reqs, cached);
  expect_complete_and_correct(reqs, plain);
  EXPECT_EQ(cached.timings.at(1).cached_tokens, 0);
  for (uint64_t id = 2; id <= 4; ++id) EXPECT_EQ(cached.timings.at(id).cached_tokens, 96) << id;  // 6 full blocks
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(plain.timings.at(id).cached_tokens, 0);
}

// Shared prefixes on a cache too small for everyone: admissions attach hits, preemptions release
// shared blocks, evictions recycle idle ones; every step's plan is applied exactly (a plan that
// does not fit the pool throws from step()) and every output is complete.
TEST(Simulation, SharedPrefixesUnderKvPressureApplyEveryPlanExactly) {
  const std::vector<int32_t> system = make_prompt(64, 7);
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 24; ++k) {
    std::vector<int32_t> p = k % 3 == 2 ? make_prompt(40, 100 + k) : system;
    const auto tail = make_prompt(5 + 7 * (k % 5), k);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back({7.0 * k, p, 30 + 5 * (k % 4)});
  }
  for (const int64_t chunk : {int64_t(-1), int64_t(16), int64_t(0)}) {
    SchedulerConfig cfg;
    cfg.chunk_size = chunk;
    const SimResult res = simulate(reqs, cfg, 24);
    expect_complete_and_correct(reqs, res);
    EXPECT_GT(res.counters.preemptions, 0u) << chunk;
    int64_t cached = 0;
    for (const auto& [id, t] : res.timings) cached += t.cached_tokens;
    EXPECT_GT(cached, 0) << chunk;
  }
}

TEST(EngineCore, CancelFreesBlocksAndRejectsWhatCanNeverFit) {
  double clock = 0;
  CostModel cost;
  FakeExecutor exec(&clock, cost);
  KVCache kv({1, 1, 16, 10, true});
  EngineCore core(kv, exec, SchedulerConfig{}, cost, 1000, {}, [&] { return clock; });
  FinishReason why = FinishReason::Stop;
  EngineRequest r;
  r.prompt = make_prompt(40, 1);
  r.max_tokens = 50;
  core.add(7, r, [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Finished) why = ev.reason;
  });
  ASSERT_TRUE(core.step());
  EXPECT_GT(kv.used_blocks(), 0);
  core.cancel(7);
  EXPECT_EQ(why, FinishReason::Cancelled);
  EXPECT_EQ(kv.used_blocks(), 0);
  EXPECT_TRUE(core.idle());
  r.max_tokens = 200;  // 240 tokens need 15 blocks > 10
  EXPECT_THROW(core.add(8, r, {}), Error);
  r.max_tokens = 961;  // beyond the 1000-token context
  EXPECT_THROW(core.add(9, r, {}), Error);
  r.prompt.clear();
  EXPECT_THROW(core.add(10, r, {}), Error);
}

TEST(EngineCore, ReportsLogprobsOfTheModelDistribution) {
  double clock = 0;
  CostModel cost;
  FakeExecutor exec(&clock, cost);
  KVCache kv({1, 1, 16, 64, true});
  EngineCore core(kv, exec, SchedulerConfig{}, cost, 1000, {}, [&] { return clock; });
  EngineRequest r;
  r.prompt = make_prompt(20, 3);
  r.max_tokens = 5;
  r.logprobs = 3;
  r.sampling.temperature = 0;
  std::vector<EngineEvent> events;
  core.add(1, r, [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Token) events.push_back(ev);
  });
  while (core.step()) {
  }
  ASSERT_EQ(events.size(), 5u);
  // The fake model's logits are 1 for its token and 0 for the other 96.
  const double want = 1.0 - std::log(std::exp(1.0) + (kVocab - 1));
  for (const auto& ev : events) {
    EXPECT_NEAR(ev.logprob, want, 1e-5);
    ASSERT_EQ(ev.top_logprobs.size(), 3u);
    EXPECT_EQ(ev.top_logprobs[0].first, ev.token);
    EXPECT_NEAR(ev.top_logprobs[0].second, want, 1e-5);
    EXPECT_NEAR(ev.top_logprobs[1].second, want - 1.0, 1e-5);
    EXPECT_LT(ev.top_logprobs[1].first, ev.top_logprobs[2].first);  // ties: lowest id first
  }
  r.logprobs = 21;
  EXPECT_THROW(core.add(2, r, {}), Error);
}

// A model with a padded vocabulary: rows of 12 logits, of which only ids [0, 8) are tokens. The
// padding rows get the highest logits; a sequence whose first prompt token is 0 gets NaN
// everywhere (a broken row).
class PaddedExecutor : public StepExecutor {
 public:
  static constexpr int32_t kRow = 12, kTokens = 8;
  void forward(const Batch& b, KVCache& kv, float* logits) override {
    size_t row = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      const size_t e = size_t(i);
      const float t = float(b.tokens[e]);
      kv.write(0, b.seq[e], b.pos[e], &t, &t);
      if (!b.want_logits[e]) continue;
      float first;
      kv.read(0, b.seq[e], 0, &first, nullptr);
      const bool broken = first == 0;
      float* l = logits + row++ * kRow;
      for (int32_t t = 0; t < kRow; ++t)
        l[t] = broken ? std::nanf("") : t < kTokens ? float(t % 3) : 50.0f;
    }
  }
  int32_t n_vocab() const override { return kRow; }
  int32_t n_tokens() const override { return kTokens; }
};

TEST(EngineCore, PaddedVocabularyIdsAreNeverSampledOrAccepted) {
  PaddedExecutor exec;
  KVCache kv({1, 1, 16, 64, true});
  EngineCore core(kv, exec, SchedulerConfig{}, CostModel{}, 1000, {}, [] { return 0.0; });
  std::vector<int32_t> tokens;
  FinishReason why = FinishReason::Cancelled;
  for (const float temp : {0.0f, 1.0f, 5.0f}) {
    EngineRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 40;
    r.logprobs = 5;
    r.sampling.temperature = temp;
    core.add(uint64_t(1 + tokens.size()), r, [&](const EngineEvent& ev) {
      if (ev.kind == EngineEvent::Kind::Finished) why = ev.reason;
      if (ev.kind != EngineEvent::Kind::Token) return;
      tokens.push_back(ev.token);
      for (const auto& [id, lp] : ev.top_logprobs) EXPECT_LT(id, PaddedExecutor::kTokens) << "top logprob";
    });
    while (core.step()) {
    }
    EXPECT_EQ(why, FinishReason::Length) << temp;
  }
  ASSERT_EQ(tokens.size(), 120u);
  for (const int32_t t : tokens) EXPECT_LT(t, PaddedExecutor::kTokens);
  // Prompt ids are checked against the token list, not the row.
  EngineRequest pad;
  pad.prompt = {1, PaddedExecutor::kTokens};
  EXPECT_THROW(core.add(100, pad, {}), Error);
}

TEST(EngineCore, ASamplingFailureFailsOnlyItsRequest) {
  PaddedExecutor exec;
  KVCache kv({1, 1, 16, 64, true});
  EngineCore core(kv, exec, SchedulerConfig{}, CostModel{}, 1000, {}, [] { return 0.0; });
  std::map<uint64_t, EngineEvent> finished;
  std::map<uint64_t, int> n_tokens;
  auto cb = [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Finished) finished[ev.id] = ev;
    else ++n_tokens[ev.id];
  };
  EngineRequest good, broken;
  good.prompt = {1, 2, 3};
  good.max_tokens = 6;
  broken.prompt = {0, 2, 3};  // NaN logits
  broken.max_tokens = 6;
  core.add(1, good, cb);
  core.add(2, broken, cb);
  // A callback that throws is contained: its request still finishes, the step completes.
  core.add(3, good, [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Finished) finished[ev.id] = ev;
    throw std::runtime_error("client callback failed");
  });
  while (core.step()) {
  }
  ASSERT_EQ(finished.size(), 3u);
  EXPECT_EQ(finished[1].reason, FinishReason::Length);
  EXPECT_EQ(n_tokens[1], 6);
  EXPECT_EQ(finished[2].reason, FinishReason::Error);
  EXPECT_NE(finished[2].error.find("no finite logits"), std::string::npos) << finished[2].error;
  EXPECT_EQ(n_tokens[2], 0);
  EXPECT_EQ(finished[3].reason, FinishReason::Length);
  EXPECT_EQ(kv.used_blocks(), 0);
  EXPECT_TRUE(core.idle());
}

}  // namespace
}  // namespace ft
