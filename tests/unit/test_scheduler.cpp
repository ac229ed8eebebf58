// The scheduling policy (plan_step) and the engine core, by discrete-event simulation: a fake
// model whose next token is a hash of the sequence so far (read back through the real paged KV
// cache), a virtual clock advanced by a synthetic cost model. No real model needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <stdexcept>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

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
  for (auto& r : in.requests)  // the engine gives every request a deadline
    if (std::isinf(r.deadline_ms)) r.deadline_ms = r.arrival_ms + default_ttft_slo_ms(in.cfg, in.cost, r.n_tokens);
  return in;
}

TEST(PlanStep, DecodesFirstThenShortestPrefillFirst) {
  auto in = input({decoding(1, 20, 2, 1), waiting(2, 300), waiting(3, 40), waiting(4, 100)}, 100);
  const StepPlan p = plan_step(in);
  EXPECT_EQ(p.decode, (std::vector<uint64_t>{1}));
  ASSERT_GE(p.prefill.size(), 2u);
  EXPECT_EQ(p.prefill[0].id, 3u);  // 40 tokens
  EXPECT_EQ(p.prefill[1].id, 4u);  // 100 tokens
  // Auto budget: the step finishes request 3's prefill, so it keeps to a quarter of its time to
  // its deadline (~30 ms), below the 50 ms target; the rest is filled with request 4 and 2.
  const double share = in.cfg.slack_share * in.requests[2].deadline_ms;
  EXPECT_LT(share, 50.0);
  EXPECT_NEAR(p.step_cap_ms, share, 1e-9);
  EXPECT_LE(p.predicted_ms, share + 1e-9);
  EXPECT_GE(p.n_tokens(), 200);
  // With no prompt that one step can finish, the step fills the 50 ms target.
  for (size_t i = 1; i < 4; ++i) in.requests[i].n_tokens = 3000;
  in.free_blocks = 1000;
  const StepPlan full = plan_step(in);
  EXPECT_NEAR(full.step_cap_ms, 50.0, 1e-9);
  EXPECT_GE(full.n_tokens(), 400);
}

// LoRA: at most max_active_adapters distinct adapters among the running requests; a request of
// another waits, and so do adapter requests ordered after it (the base's pass), until a slot frees.
TEST(PlanStep, AdapterCapAdmitsNoFifthAndStarvesNone) {
  std::vector<SchedRequest> reqs;
  for (uint64_t k = 1; k <= 4; ++k) {
    reqs.push_back(decoding(k, 20, 2, k));
    reqs.back().adapter = 100 + k;
  }
  SchedRequest fifth = waiting(5, 30, 1), same = waiting(6, 30, 2), base = waiting(7, 30, 3);
  fifth.adapter = 105;
  same.adapter = 101;  // an adapter already running, arriving after the fifth
  reqs.insert(reqs.end(), {fifth, same, base});
  auto in = input(reqs, 100, 64);
  in.cfg.max_active_adapters = 4;
  StepPlan p = plan_step(in);
  EXPECT_EQ(p.decode.size(), 4u);
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{7}));  // the base request only
  // Without a waiting fifth, a request of a running adapter is admitted.
  in.requests.erase(in.requests.begin() + 4);
  p = plan_step(in);
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{6, 7}));
  // A slot frees (adapter 104's request finished): the fifth goes, then the others.
  in = input(reqs, 100, 64);
  in.cfg.max_active_adapters = 4;
  in.requests.erase(in.requests.begin() + 3);
  p = plan_step(in);
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{5, 6, 7}));
  // A cap of 1: one adapter at a time.
  in.cfg.max_active_adapters = 1;
  p = plan_step(in);
  EXPECT_EQ(p.admit, (std::vector<uint64_t>{7}));
}

TEST(PlanStep, AutoChunkIsAsLargeAsTheTargetAllows) {
  // Alone, nothing expected: the largest efficient chunk (max_auto_chunk), the step no longer
  // than the prompt has waited.
  auto quiet = input({waiting(1, 5000)}, 1000);
  quiet.now_ms = 400;
  const StepPlan alone = plan_step(quiet);
  ASSERT_EQ(alone.prefill.size(), 1u);
  EXPECT_EQ(alone.prefill[0].n_tokens, 1024);
  EXPECT_NEAR(alone.step_cap_ms, 400, 1e-9);
  // ...no longer than it has waited: just arrived, the target; after 80 ms, 80 ms.
  quiet.now_ms = 0;
  EXPECT_NEAR(plan_step(quiet).step_cap_ms, 50, 1e-9);
  quiet.now_ms = 80;
  EXPECT_NEAR(plan_step(quiet).step_cap_ms, 80, 1e-9);
  EXPECT_EQ(plan_step(quiet).prefill[0].n_tokens, 750);
  // Arrivals expected (one every 100 ms of the last second): within the 50 ms target.
  auto busy = input({waiting(1, 5000)}, 1000);
  busy.now_ms = 1000;
  for (int k = 0; k < 10; ++k) busy.past_arrivals_ms.push_back(100.0 * k);
  const StepPlan p = plan_step(busy);
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_LE(p.predicted_ms, 50.0 + 1e-9);
  EXPECT_GE(p.prefill[0].n_tokens, 300);
  EXPECT_LT(p.prefill[0].n_tokens, 1024);
  // Rarer arrivals: the rate is the count over the time observed (the window, 10 s), not over the
  // time since the oldest: one arrival 1.6 s ago is 0.1/s, a step may take arrival_risk / rate =
  // 500 ms; ...while the engine has run only 1.6 s, the same arrival is 1 per 1.6 s: 80 ms;
  // ...and if 0.8 s of that were follow-up windows (unobserved), 1 per 0.8 s: 40 ms.
  busy.past_arrivals_ms = {1000 - 1600.0};
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 0.05 * 10000, 1e-9);
  busy.observed_since_ms = 1000 - 1600.0;
  EXPECT_EQ(plan_step(busy).prefill[0].n_tokens, 750);
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 0.05 * 1600, 1e-9);
  busy.unobserved_ms = 800;
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 0.05 * 800, 1e-9);
  busy.unobserved_ms = 0;
  busy.observed_since_ms = -std::numeric_limits<double>::infinity();
  // ...and arrivals older than the window count for nothing.
  busy.past_arrivals_ms = {1000 - 10001.0};
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 1000, 1e-9);
  // A running decode: the target (its inter-token latency).
  auto dec = input({waiting(1, 5000), decoding(2, 20, 2, 1)}, 1000);
  EXPECT_LE(plan_step(dec).predicted_ms, 50.0 + 1e-9);
  // A short prompt waiting with a long one: it goes first and the step keeps to the target.
  const StepPlan q = plan_step(input({waiting(1, 5000), waiting(2, 10)}, 1000));
  EXPECT_LE(q.predicted_ms, 50.0 + 1e-9);
  EXPECT_EQ(q.prefill[0].id, 2u);
}

// Steps that yield between their blocks (SchedulerInput::step_blocks): an arrival waits for a
// block, so the arrival rules bound a block: a step holds step_blocks of them (while arrivals are
// expected, each within arrival_risk / rate but not below block_wait_ms; the quiet's wait from
// block_wait_ms), and decodes keep the target.
TEST(PlanStep, StepsThatYieldBoundABlockNotTheStep) {
  auto busy = input({waiting(1, 5000)}, 1000);
  busy.now_ms = 1000;
  for (int k = 0; k < 10; ++k) busy.past_arrivals_ms.push_back(100.0 * k);
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 50, 1e-9);  // an arrival waits for the step: arrival_risk's
  busy.step_blocks = 2;
  const StepPlan p = plan_step(busy);
  EXPECT_NEAR(p.step_cap_ms, 2 * 50, 1e-9);  // ...or for a block of that
  EXPECT_EQ(p.prefill[0].n_tokens, int64_t((2 * 50 - 5) / 0.1 + 1e-6));
  // Arrivals ten times as frequent: blocks of block_wait_ms (the floor), not arrival_risk's 5 ms.
  for (int k = 0; k < 90; ++k) busy.past_arrivals_ms.push_back(100.0 * k / 9);
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 2 * busy.cfg.block_wait_ms, 1e-9);
  // One arrival in the window (the other of two long prompts sent together, now finished): blocks
  // of arrival_risk / rate = 500 ms, not block_wait_ms; the step is the largest efficient chunk.
  busy.past_arrivals_ms = {900};
  busy.step_blocks = 12;
  EXPECT_NEAR(plan_step(busy).step_cap_ms, 12 * 500, 1e-9);
  EXPECT_EQ(plan_step(busy).prefill[0].n_tokens, 1024);
  // The quiet: just arrived, a block of block_wait_ms; after 80 ms, blocks of 80 ms (the largest
  // efficient chunk then).
  auto quiet = input({waiting(1, 5000)}, 1000);
  quiet.step_blocks = 12;
  EXPECT_NEAR(plan_step(quiet).step_cap_ms, 12 * quiet.cfg.block_wait_ms, 1e-9);
  quiet.now_ms = 80;
  EXPECT_NEAR(plan_step(quiet).step_cap_ms, 12 * 80, 1e-9);
  EXPECT_EQ(plan_step(quiet).prefill[0].n_tokens, 1024);
  // A running decode: the target still.
  auto dec = input({waiting(1, 5000), decoding(2, 20, 2, 1)}, 1000);
  dec.step_blocks = 12;
  EXPECT_NEAR(plan_step(dec).step_cap_ms, 50, 1e-9);
}

// The step is sized from the deadlines of the prompts it can finish: two long prompts get steps
// far longer than the target whatever their deadlines (neither's first token ends the step, and
// a shorter step would not let the second start sooner); a prompt the step finishes keeps it
// within a share of its time to its deadline.
TEST(PlanStep, StepIsSizedFromTheTightestDeadline) {
  // Both arrived at 0; now 1000 ms (the quiet allows a 1 s step); deadlines are absolute.
  auto in = input({waiting(1, 3000), waiting(2, 3000)}, 1000);
  in.now_ms = 1000;
  in.requests[0].deadline_ms = 20000;
  in.requests[1].deadline_ms = 30000;
  const StepPlan roomy = plan_step(in);
  EXPECT_EQ(roomy.prefill[0].id, 1u);  // earliest deadline first
  EXPECT_EQ(roomy.n_tokens(), 1024);
  EXPECT_GT(roomy.predicted_ms, 100);
  in.requests[1].deadline_ms = 1700;  // request 2 can wait ~700 - 310 ms: it goes first now
  const StepPlan tight = plan_step(in);
  EXPECT_EQ(tight.prefill[0].id, 2u);
  EXPECT_EQ(tight.n_tokens(), 1024);  // request 1 behind it gains nothing from a shorter step
  in.requests[1].deadline_ms = 30000;
  in.requests[0].deadline_ms = 150;  // request 1 cannot make it: ordered as if due now + late_order_ms,
                                     // still before request 2, due far later
  const StepPlan own = plan_step(in);
  EXPECT_EQ(own.prefill[0].id, 1u);
  EXPECT_EQ(own.n_tokens(), 1024);  // small steps would help neither request
  // 1000 tokens left (within one step): its first token ends the step, which takes what it needs
  // (105 ms), not padded with request 2's chunk up to a quarter of its time to its deadline.
  in.requests[0].n_tokens = 1000;
  in.requests[0].deadline_ms = 1000 + 200;
  const StepPlan first = plan_step(in);
  EXPECT_EQ(first.prefill[0].id, 1u);
  const double need = in.cost.predict(1000, attn_pairs(0, 1000));
  EXPECT_NEAR(first.step_cap_ms, need, 1e-9);
  EXPECT_EQ(first.prefill.size(), 1u);
  in.requests[0].deadline_ms = 1000 + 8000;
  EXPECT_NEAR(plan_step(in).step_cap_ms, need, 1e-9);
  // 100 tokens left (15 ms): request 2 fills the step up to a quarter of the time to the
  // deadline, at most the target.
  in.requests[0].n_tokens = 100;
  in.requests[0].deadline_ms = 1000 + 120;
  EXPECT_NEAR(plan_step(in).step_cap_ms, 0.25 * 120, 1e-9);
  in.requests[0].deadline_ms = 1000 + 8000;
  EXPECT_NEAR(plan_step(in).step_cap_ms, 50, 1e-9);
  in.requests[0].n_tokens = 1000;
  // The quiet: both arrived just now, the step keeps to the target.
  in.requests[0].arrival_ms = in.requests[1].arrival_ms = 990;
  EXPECT_NEAR(plan_step(in).step_cap_ms, 50, 1e-9);
}

// Beside a decode, a long prompt whose deadline chunks of the 50 ms target would miss (7 steps
// of 449 tokens: 335.7 ms) gets the smallest larger step that meets it (4 steps of 750 tokens:
// 320.4 ms, 80.1 ms a step); a deadline that it meets anyway, or that no chunk up to 1024
// meets (3 steps: 315.3 ms), leaves the step at the target.
TEST(PlanStep, DeadlineOutweighsTheDecodesTarget) {
  auto in = input({decoding(1, 20, 2, 1), waiting(2, 3000)}, 1000);
  const SchedRequest& r = in.requests[1];
  EXPECT_NEAR(prefill_in_chunks_ms(in.cost, r, 449, 1, 20), 335.7, 1e-6);
  EXPECT_NEAR(prefill_in_chunks_ms(in.cost, r, 750, 1, 20), 320.4, 1e-6);
  EXPECT_GT(prefill_in_chunks_ms(in.cost, r, 749, 1, 20), 325.0);
  EXPECT_NEAR(prefill_in_chunks_ms(in.cost, r, 1024, 1, 20), 315.3, 1e-6);
  for (const auto& [deadline, cap, chunk] :
       {std::tuple{325.0, 80.1, int64_t(750)}, {1000.0, 50.0, int64_t(449)}, {300.0, 50.0, int64_t(449)}}) {
    in.requests[1].deadline_ms = deadline;
    const StepPlan p = plan_step(in);
    EXPECT_NEAR(p.step_cap_ms, cap, 1e-6) << deadline;
    ASSERT_EQ(p.prefill.size(), 1u) << deadline;
    EXPECT_EQ(p.prefill[0].n_tokens, chunk) << deadline;
    EXPECT_LE(p.predicted_ms, cap + 1e-9) << deadline;
  }
}

TEST(PlanStep, PriorityThenDeadlineThenShortestRemaining) {
  std::vector<SchedRequest> rs = {waiting(1, 40), waiting(2, 40), waiting(3, 20), waiting(4, 30)};
  for (auto& r : rs) r.deadline_ms = 1000;
  rs[1].priority = -1;        // vLLM: lower first
  rs[3].deadline_ms = 900;    // earlier deadline
  const StepPlan p = plan_step(input(rs, 1000));
  std::vector<uint64_t> order;
  for (const auto& c : p.prefill) order.push_back(c.id);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 4, 3, 1}));  // ties on deadline: shortest remaining
}

TEST(PlanStep, DefaultDeadlineAndPredictedTtft) {
  SchedulerConfig cfg;
  const CostModel c{5.0, 0.1, 0.0};
  EXPECT_NEAR(default_ttft_slo_ms(cfg, c, 100), cfg.ttft_slo_base_ms + cfg.ttft_slo_stretch * 15, 1e-9);
  // Queue: a long prompt due late, a short one due soon. A new short one due between them waits
  // only for the earlier short; a new long one due last waits for both.
  const std::vector<QueuedPrefill> q = {{0, 10000, 3000}, {0, 200, 50}};
  EXPECT_NEAR(predict_ttft_ms(q, {0, 300, 40}), 90, 1e-9);
  EXPECT_NEAR(predict_ttft_ms(q, {0, 20000, 1000}), 4050, 1e-9);
  EXPECT_NEAR(predict_ttft_ms(q, {-1, 20000, 1000}), 1000, 1e-9);  // higher priority
  // A prefill that can no longer make its deadline is ordered as if due late_order_ms from now:
  // after one that can and is due sooner, before one due later.
  EXPECT_EQ(order_deadline_ms(100, 500, 0, cfg), cfg.late_order_ms);
  EXPECT_EQ(order_deadline_ms(100, 100, 0, cfg), 100);  // just in time
  EXPECT_EQ(order_deadline_ms(-5000, 10, 0, cfg), cfg.late_order_ms);
  EXPECT_EQ(order_deadline_ms(900, 1000, 0, cfg), 900);  // late, but due after now + late_order_ms
}

// A prompt that can no longer make its deadline goes behind one that can and is due within
// late_order_ms, before one due later; one recomputing after its first token keeps its own.
TEST(PlanStep, LatePromptGoesBehindThoseStillOnTime) {
  auto in = input({waiting(1, 100, 0), waiting(2, 100, 990), waiting(3, 100, 990)}, 1000, 100);
  in.now_ms = 1000;
  in.requests[0].deadline_ms = 500;  // 100 tokens take 15 ms: late
  in.requests[1].deadline_ms = 1120;
  in.requests[2].deadline_ms = 6000;
  auto first = [&] { return plan_step(in).prefill.at(0).id; };
  EXPECT_EQ(first(), 2u);  // pure earliest deadline first: 1
  in.requests[1].deadline_ms = 1000 + in.cfg.late_order_ms + 1;
  EXPECT_EQ(first(), 1u);  // due after it
  in.requests[1].deadline_ms = 1120;
  in.requests[1].priority = 1;
  EXPECT_EQ(first(), 1u);  // priority first
  in.requests[1].priority = 0;
  in.requests[0].n_tokens = 101;  // preempted after its first token: its stream has begun
  in.requests[0].n_generated = 1;
  EXPECT_EQ(first(), 1u);
}

// In auto mode a long prompt that has aged keeps half the step's time, and a short one that
// arrived behind it still progresses every step (aging must not starve the short ones).
TEST(PlanStep, AgedLongPromptDoesNotStarveShortOnes) {
  SchedRequest low = waiting(1, 5000, 0.0);
  low.priority = 1;
  low.deadline_ms = 500;
  auto in = input({low, waiting(2, 45, 2990)}, 1000);
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

// A plan never holds more than max_batch_tokens, whatever min_chunk's progress rule and aging
// ask: with 8 a step (4 sequences), a 40-token prompt alone; with 70 (64 sequences), 60 decodes
// beside a waiting prompt, and an aged one among them.
TEST(PlanStep, NeverMoreThanTheBatchHolds) {
  {
    auto in = input({waiting(1, 40)}, 100);
    in.cfg.max_batch_tokens = 8;
    in.cfg.max_num_seqs = 4;
    const StepPlan p = plan_step(in);
    EXPECT_EQ(p.n_tokens(), 8);
  }
  for (const bool aged : {false, true}) {
    std::vector<SchedRequest> reqs;
    for (uint64_t i = 0; i < 60; ++i) reqs.push_back(decoding(i + 1, 20, 2, i + 1));
    reqs.push_back(waiting(100, 200));
    reqs.push_back(waiting(101, 30, aged ? -1e6 : 0));
    auto in = input(std::move(reqs), 1000);
    in.cfg.max_batch_tokens = 70;
    in.cfg.max_num_seqs = 64;
    const StepPlan p = plan_step(in);
    EXPECT_EQ(p.decode.size(), 60u);
    EXPECT_LE(p.n_tokens(), 70) << "aged " << aged;
    EXPECT_FALSE(p.prefill.empty()) << "aged " << aged;
  }
}

// An aged request that waits for KV blocks holds admission: no request after it is admitted
// in its stead (a stream of short prompts took every block that freed, and it waited until the
// stream stopped). Not aged, the short one is admitted beside it.
TEST(PlanStep, AnAgedRequestWaitingForBlocksHoldsAdmission) {
  for (const bool aged : {false, true}) {
    auto in = input({waiting(1, 500, aged ? -1e6 : 0), waiting(2, 40)}, 10);  // (32 blocks and 3)
    const StepPlan p = plan_step(in);
    if (aged) EXPECT_TRUE(p.admit.empty());
    else EXPECT_EQ(p.admit, (std::vector<uint64_t>{2}));
  }
}

TEST(PlanStep, AgedRequestGetsHalfTheBudget) {
  SchedRequest low = waiting(1, 5000, 0.0);
  low.priority = 1;
  low.deadline_ms = 500;
  auto in = input({low, waiting(2, 30, 2900), waiting(3, 30, 2950)}, 1000, 512);
  in.now_ms = 3000;  // request 1 is 2.5 s past its deadline > aging_ms (2 s); its priority is lower
  const StepPlan p = plan_step(in);
  std::map<uint64_t, int64_t> got;
  for (const auto& c : p.prefill) got[c.id] = c.n_tokens;
  EXPECT_EQ(got[2], 30);
  EXPECT_EQ(got[3], 30);
  EXPECT_EQ(got[1], 256);  // its half; the short ones take what they need
  EXPECT_EQ(p.prefill[0].id, 1u);
}

// ---- the learned cost model -----------------------------------------------------------------

// Uniform numbers in [0, 1) from a seed (a 64-bit LCG): the synthetic traces' noise.
struct Uniform {
  uint64_t h;
  double operator()() {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    return double(h >> 11) * 0x1.0p-53;
  }
};

// Synthetic step traces: decode-like and prefill-like steps at random contexts, the measured time
// the true model's x (1 + 5% noise), 2% of steps 4x slower (another process); the true costs
// change mid-run (per token 1.8x, attention 2x, base 1.5x: a frequency drop, a neighbour).
TEST(CostModelLearning, ConvergesFromABadPriorAndFollowsAChangeMidRun) {
  const CostModel before{4.0, 0.08, 2e-5}, after{6.0, 0.144, 4e-5};
  OnlineCostModel m(CostModel{12.0, 0.02, 0.0});  // a calibration taken at a bad moment
  Uniform uniform{11};
  double err_before = 0, err_after = 0;
  int n_before = 0, n_after = 0;
  for (int i = 0; i < 4000; ++i) {
    const CostModel& truth = i < 2000 ? before : after;
    const bool prefill = uniform() < 0.4;
    const int64_t tokens = prefill ? 16 + int64_t(uniform() * 1000) : 1 + int64_t(uniform() * 32);
    const double ctx = uniform() * 3000;
    const double pairs = prefill ? double(tokens) * ctx + double(tokens) * double(tokens + 1) / 2 : double(tokens) * ctx;
    const double clean = truth.predict(tokens, pairs);
    double measured = clean * (1 + 0.1 * (uniform() - 0.5) * 2 * 0.5);
    if (uniform() < 0.02) measured *= 4;
    const double err = std::abs(m.model().predict(tokens, pairs) - clean) / clean;
    if (i >= 1500 && i < 2000) err_before += err, ++n_before;
    if (i >= 3500) err_after += err, ++n_after;
    m.observe(tokens, pairs, measured);
  }
  EXPECT_LT(err_before / n_before, 0.05);
  EXPECT_LT(err_after / n_after, 0.05);
  EXPECT_NEAR(m.model().per_token_ms, after.per_token_ms, 0.15 * after.per_token_ms);
  EXPECT_NEAR(m.model().per_attn_ms, after.per_attn_ms, 0.15 * after.per_attn_ms);
}

// One stream decoding for a long time: every step has 1 token, so base and per token are one
// direction that the steps never split. The fit must stay there: each term of a step's
// prediction within what a step measures, the error at the noise. (From a calibration that
// clamped the base to 0, the previous fit ran away within 1,600 steps: 68 ms a token in `serve`,
// 1.7e15 after 1,400 in simulation; here its mean errors ended at 3e6 to 8e33 for all three
// priors.) Each request's first step begins cold; 2% of steps are 2x slower.
TEST(CostModelLearning, DecodeOnlyTrafficStaysBounded) {
  for (const CostModel& prior : {CostModel{0.0, 1.6, 1e-5}, CostModel{1.0, 0.1, 1e-5}, CostModel{0.0, 0.05, 1e-4}}) {
    OnlineCostModel m(prior);
    Uniform uniform{3};
    double err = 0, worst_term = 0;
    int n = 0;
    for (int req = 0; req < 100; ++req) {
      for (int i = 0; i < 200; ++i) {
        const double pairs = 17.0 + i;
        double measured = (1.5 + 3e-4 * pairs) * (1 + 0.1 * (uniform() - 0.5));
        if (uniform() < 0.02) measured *= 2;
        const double cold = i == 0 ? 1.0 : warm_up_coldness(1.6 * i);
        if (req >= 90) {
          CostModel c = m.model();
          c.cold = cold;
          err += std::abs(c.predict(1, pairs) - measured) / measured, ++n;
          worst_term = std::max({worst_term, c.base_ms, c.per_token_ms, c.per_attn_ms * pairs, c.warm_up_ms});
        }
        m.observe(1, pairs, measured, cold);
      }
    }
    EXPECT_LT(err / n, 0.06) << prior.base_ms << " + " << prior.per_token_ms << " ms a token";
    EXPECT_LT(worst_term, 3.0) << prior.base_ms << " + " << prior.per_token_ms << " ms a token";
  }
}

TEST(CostModelLearning, OneOutlierBarelyMovesIt) {
  const CostModel truth{5.0, 0.1, 1e-5};
  OnlineCostModel m(truth);
  for (int i = 0; i < 300; ++i) {
    const int64_t t = 1 + (i * 37) % 600;
    m.observe(t, double(t) * 500, truth.predict(t, double(t) * 500));
  }
  const double p0 = m.model().predict(200, 200.0 * 500);
  m.observe(200, 200.0 * 500, 20 * p0);  // a step 20x slower (the process was descheduled)
  EXPECT_LT(std::abs(m.model().predict(200, 200.0 * 500) - p0) / p0, 0.1);
  // Zero or negative times carry nothing.
  m.observe(10, 0, 0);
  m.observe(10, 0, -1);
  EXPECT_EQ(m.observations(), 301u);
}

// A machine that warms up after idle (decode steps 1.6x slower right after a second idle on a
// shared Xeon): the warm-up is learned as its own feature, so the cold steps' error falls to the
// noise, where a model without it misses them by a third.
TEST(CostModelLearning, LearnsTheWarmUpOfACoolMachine) {
  const CostModel truth{2.5, 0.25, 2e-4, 4.0};
  OnlineCostModel with(CostModel{2.5, 0.25, 2e-4}), without(CostModel{2.5, 0.25, 2e-4});
  Uniform uniform{5};
  double err_with = 0, err_without = 0;
  int n = 0;
  for (int k = 0; k < 150; ++k) {  // busy periods: a short prompt, then its decodes
    double busy = 0;
    for (int i = 0; i < 17; ++i) {
      const int64_t tokens = i == 0 ? 30 + int64_t(uniform() * 30) : 1;
      const double pairs = i == 0 ? double(tokens * (tokens + 1) / 2) : 60.0 + i;
      CostModel at = truth;
      at.cold = warm_up_coldness(busy);
      const double measured = at.predict(tokens, pairs) * (1 + 0.05 * (uniform() - 0.5));
      if (k >= 100 && at.cold > 0.1) {
        CostModel w = with.model(), wo = without.model();
        w.cold = at.cold;
        err_with += std::abs(w.predict(tokens, pairs) - measured) / measured;
        err_without += std::abs(wo.predict(tokens, pairs) - measured) / measured;
        ++n;
      }
      with.observe(tokens, pairs, measured, at.cold);
      without.observe(tokens, pairs, measured);
      busy += measured;
    }
  }
  ASSERT_GT(n, 100);
  EXPECT_LT(err_with / n, 0.04);
  EXPECT_GT(err_without / n, 0.1);  // (the test can fail)
  EXPECT_NEAR(with.model().warm_up_ms, truth.warm_up_ms, 0.2 * truth.warm_up_ms);
  EXPECT_EQ(with.model().cold, 0);  // the model learned carries no step's coldness
}

TEST(CostModelLearning, PredictionErrorHistogramBuckets) {
  PredictionErrorHistogram h;
  h.observe(0.005);
  h.observe(0.1);   // on a bound: that bucket (le)
  h.observe(100);   // above every bound
  EXPECT_EQ(h.counts[0], 1u);
  EXPECT_EQ(h.counts[3], 1u);
  EXPECT_EQ(h.counts.back(), 1u);
  EXPECT_EQ(h.count, 3u);
  EXPECT_NEAR(h.mean(), (0.005 + 0.1 + 100) / 3, 1e-12);
}

// ---- simulation ------------------------------------------------------------------------------

constexpr int32_t kVocab = 97;

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

// The fake models' hidden state at a position (embeddings): kEmbd values from the hash of the
// tokens up to it.
constexpr int32_t kEmbd = 6;
void fake_hidden(uint64_t h, float* out) {
  for (int32_t d = 0; d < kEmbd; ++d) out[d] = float((h >> (8 * d)) & 0xff) - 127.5f;
}

// The fake model: stores each token in the cache (kv_dim 1), and the next token after position
// p is a hash of the tokens at 0..p (window > 0: at p-window+1..p) read back through the block
// table. Advances the virtual clock by the synthetic cost of the step. A small window makes the
// output cycle (prompt-lookup drafts then hold); the whole prefix makes them mostly wrong, and
// any stale K/V (a rejected draft left in the cache) changes every later token.
class FakeExecutor : public StepExecutor {
 public:
  FakeExecutor(double* clock, CostModel cost, int window = 0) : clock_(clock), cost_(cost), window_(window) {}
  // Steps that yield: `blocks` equal parts of a step's time, between_() called between them.
  void yield_between(int32_t blocks, int64_t max_batch, std::function<void(double)> between) {
    blocks_ = blocks;
    between_max_ = max_batch;
    between_ = std::move(between);
  }
  int32_t step_blocks() const override { return blocks_; }
  int64_t between_max_batch() const override { return between_max_; }
  void forward_between(const Batch& b, KVCache& kv, float* logits, float* hidden) override {
    EXPECT_TRUE(inside_) << "a step between blocks outside a step";
    EXPECT_LE(b.size(), between_max_);
    for (int64_t i = 0; i < b.size(); ++i)  // none of the running step's sequences
      for (int32_t q : running_seqs_) EXPECT_NE(b.seq[size_t(i)], q);
    const bool was = inside_;
    inside_ = false;
    nested_ = true;
    forward(b, kv, logits, hidden);
    nested_ = false;
    inside_ = was;
    ++between_forwards;
  }
  void forward(const Batch& b, KVCache& kv, float* logits, float* hidden) override {
    const bool yields = blocks_ > 0 && between_ && !inside_;
    double pairs = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      const float t = float(b.tokens[size_t(i)]);
      kv.write(0, b.seq[size_t(i)], b.pos[size_t(i)], &t, &t);
      pairs += b.pos[size_t(i)] + 1;
    }
    size_t row = 0, hidden_row = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      if (!b.want_logits[size_t(i)]) continue;
      uint64_t h = 1;
      for (int32_t p = window_ > 0 ? std::max(0, b.pos[size_t(i)] - window_ + 1) : 0; p <= b.pos[size_t(i)]; ++p) {
        float t;
        kv.read(0, b.seq[size_t(i)], p, &t, nullptr);
        h = mix(h, uint64_t(t));
      }
      if (b.want_logits[size_t(i)] == kOutHidden) {
        fake_hidden(h, hidden + hidden_row++ * kEmbd);
        continue;
      }
      float* l = logits + row++ * kVocab;
      for (int32_t t = 0; t < kVocab; ++t) l[t] = 0;
      l[h % kVocab] = 1;
    }
    double ms = cost_.predict(b.size(), pairs);
    if (!nested_ && *clock_ - last_end_ >= kWarmUpIdleMs) busy_since_ = *clock_;
    ms += warm_up_ms_ * warm_up_coldness(*clock_ - busy_since_);
    if (yields) {
      inside_ = true;
      running_seqs_.assign(b.seq.begin(), b.seq.end());
      for (int32_t k = 0; k < blocks_; ++k) {
        *clock_ += ms / blocks_;
        if (k + 1 < blocks_) between_(double(k + 1) / blocks_);
      }
      inside_ = false;
      running_seqs_.clear();
    } else {
      *clock_ += ms;
    }
    if (!nested_) last_end_ = *clock_;
    ++forwards;
  }
  int32_t n_vocab() const override { return kVocab; }
  int32_t n_embd() const override { return kEmbd; }
  // A machine that warms up: a step begun `busy` ms after an idle gap of kWarmUpIdleMs or more
  // takes ms x warm_up_coldness(busy) longer.
  void warm_up(double ms) { warm_up_ms_ = ms; }
  int forwards = 0, between_forwards = 0;

 private:
  double* clock_;
  CostModel cost_;
  int window_;
  int32_t blocks_ = 0;
  int64_t between_max_ = 0;
  std::function<void(double)> between_;
  bool inside_ = false, nested_ = false;
  std::vector<int32_t> running_seqs_;
  double warm_up_ms_ = 0, busy_since_ = 0, last_end_ = -1e300;
};

// What the fake model generates for a prompt, computed directly.
std::vector<int32_t> expected_output(std::vector<int32_t> seq, int64_t n, int window = 0) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k < n; ++k) {
    uint64_t h = 1;
    const size_t from = window > 0 && seq.size() > size_t(window) ? seq.size() - size_t(window) : 0;
    for (size_t i = from; i < seq.size(); ++i) h = mix(h, uint64_t(seq[i]));
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
  CostModel learned;
  PredictionErrorHistogram errors;
  int32_t kv_total = 0;
  int32_t kv_used_after = 0;
};

std::vector<int32_t> make_prompt(int64_t n, int seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t((i * 31 + seed * 17 + 3) % kVocab);
  return p;
}

// cost: the fake model's true costs; prior: the engine's cost model before it learns (= cost).
// closed_gap_ms >= 0: one client in a closed loop, each request (in arrival order, the first at
// its arrival_ms) sent that long after the last one finished. step_blocks > 0: steps yield
// between that many blocks (arrivals added there, then EngineCore::between_blocks), steps
// between blocks of up to 256 tokens. warm_up_ms: the fake machine warms up (FakeExecutor::warm_up).
SimResult simulate(const std::vector<SimRequest>& reqs, SchedulerConfig cfg, int32_t kv_blocks,
                   bool prefix_caching = true, const CostModel& cost = {5.0, 0.1, 1e-5},
                   const std::optional<CostModel>& prior = std::nullopt, const SpecConfig& spec = {},
                   int window = 0, double closed_gap_ms = -1, int32_t step_blocks = 0, double warm_up_ms = 0) {
  double clock = 0;
  FakeExecutor exec(&clock, cost, window);
  exec.warm_up(warm_up_ms);
  KVCacheConfig kc;
  kc.n_layers = 1;
  kc.kv_dim = 1;
  kc.block_size = 16;
  kc.n_blocks = kv_blocks;
  kc.prefix_caching = prefix_caching;
  KVCache kv(kc);
  EngineCore core(kv, exec, cfg, prior.value_or(cost), 1 << 20, {}, [&] { return clock; });
  core.set_speculation(spec, nullptr);
  SimResult res;
  res.kv_total = kv.total_blocks();
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return reqs[a].arrival_ms < reqs[b].arrival_ms; });
  size_t next = 0;
  auto arrivals = [&] {
    while (next < order.size()) {
      double arrival = reqs[order[next]].arrival_ms;
      if (closed_gap_ms >= 0) {
        if (!core.idle()) break;
        if (next > 0) arrival = clock + closed_gap_ms;
        clock = std::max(clock, arrival);
      } else if (arrival > clock) {
        break;
      }
      const uint64_t id = order[next] + 1;
      EngineRequest r;
      r.prompt = reqs[order[next]].prompt;
      r.max_tokens = reqs[order[next]].max_tokens;
      r.arrival_ms = arrival;
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
  };
  if (step_blocks > 0)
    exec.yield_between(step_blocks, 256, [&](double done) {
      if (closed_gap_ms < 0) arrivals();
      core.between_blocks(done);
    });
  for (int guard = 0; guard < 1000000; ++guard) {
    arrivals();
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
  res.learned = core.cost_model();
  res.errors = core.prediction_errors();
  res.kv_used_after = kv.used_blocks();
  return res;
}

void expect_complete_and_correct(const std::vector<SimRequest>& reqs, const SimResult& res, int window = 0) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t id = i + 1;
    ASSERT_TRUE(res.reasons.count(id)) << "request " << id << " never finished";
    EXPECT_EQ(res.reasons.at(id), FinishReason::Length);
    EXPECT_EQ(res.outputs.at(id), expected_output(reqs[i].prompt, reqs[i].max_tokens, window)) << "request " << id;
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

// Traffic shapes of `bench serve` (110m-like costs: 5 ms a step, 0.1 ms a token, attention 1e-5 ms
// a pair): TTFT of each request under the policy, against each request's deadline and the same
// request alone.
std::vector<SimRequest> long_every(double period_ms, double until_ms, int64_t n, int per_period) {
  std::vector<SimRequest> reqs;
  int k = 0;
  for (double t = 0; t < until_ms; t += period_ms)
    for (int j = 0; j < per_period; ++j) reqs.push_back({t, make_prompt(n + j, 1000 + k++), 16});
  return reqs;
}

// Short prompts (40-50 tokens, 16 out) with exponential gaps of mean_gap_ms until until_ms.
std::vector<SimRequest> poisson_shorts(uint64_t seed, double mean_gap_ms, double until_ms) {
  std::vector<SimRequest> reqs;
  uint64_t h = seed;
  double t = 0;
  for (int k = 0;; ++k) {
    h = mix(h, uint64_t(k));
    t += -std::log(1.0 - double(h >> 11) * 0x1.0p-53) * mean_gap_ms;
    if (t >= until_ms) return reqs;
    reqs.push_back({t, make_prompt(40 + int64_t(h % 11), 2000 + k), 16});
  }
}

double ttft_alone(const SimRequest& r, const SchedulerConfig& cfg, const CostModel& cost = {5.0, 0.1, 1e-5}) {
  SimRequest a = r;
  a.arrival_ms = 0;
  return simulate({a}, cfg, 4000, true, cost).timings.at(1).ttft_ms();
}

// Long-only: an isolated prompt prefills in the largest efficient chunks: within 5% of its
// unchunked TTFT, where a chunk sized to the step target alone costs more than that.
TEST(Simulation, IsolatedLongPromptCostsWhatItCostsUnchunked) {
  const auto reqs = long_every(20000, 60000, 2700, 1);
  SchedulerConfig cfg, none;
  none.chunk_size = 0;
  none.max_batch_tokens = 8192;
  SchedulerConfig small = cfg;
  small.chunk_size = 64;
  const SimResult a = simulate(reqs, cfg, 4000), u = simulate(reqs, none, 4000), s = simulate(reqs, small, 4000);
  expect_complete_and_correct(reqs, a);
  for (uint64_t id = 1; id <= reqs.size(); ++id) {
    EXPECT_LE(a.timings.at(id).ttft_ms(), 1.05 * u.timings.at(id).ttft_ms()) << id;
    EXPECT_GT(s.timings.at(id).ttft_ms(), 1.05 * u.timings.at(id).ttft_ms()) << id;  // the test can fail
  }
}

// One client sending its next prompt only once the last one finished (a user, a script; 5 ms
// later; the 1.1B model's cost: 20 ms a step, 2.5 ms a token): its arrivals are follow-ups, not
// traffic, nor is its first one once the second follows it, so every prompt prefills as it would
// alone. Counted as traffic (follow_up_ms = 0), one arrival per ~3 s read as a stream cut each
// prompt into short steps: 1.07-1.15x alone here, 1.38x on the real machine, whose small chunks
// also run its GEMMs less efficiently.
TEST(Simulation, OneClientAtATimeCostsWhatAloneCosts) {
  const CostModel cost{20.0, 2.5, 1e-5};
  const auto reqs = long_every(1, 10, 960, 1);
  SchedulerConfig cfg, counted;
  counted.follow_up_ms = 0;
  const SimResult res = simulate(reqs, cfg, 4000, true, cost, std::nullopt, {}, 0, 5.0),
                  old = simulate(reqs, counted, 4000, true, cost, std::nullopt, {}, 0, 5.0);
  expect_complete_and_correct(reqs, res);
  for (uint64_t id = 2; id <= reqs.size(); ++id) {
    EXPECT_NEAR(res.timings.at(id).arrival_ms, res.timings.at(id - 1).finish_ms + 5.0, 1e-9) << "closed loop";
    const double alone = ttft_alone(reqs[id - 1], cfg, cost);
    EXPECT_LE(res.timings.at(id).ttft_ms(), 1.03 * alone) << id;
    EXPECT_EQ(res.timings.at(id).prefill_steps, res.timings.at(1).prefill_steps) << id;
    if (id >= 3) {
      EXPECT_GT(old.timings.at(id).ttft_ms(), 1.05 * alone) << id;  // the test can fail
    }
  }
}

// Burst: two long prompts together every 30 s: earliest deadline first runs them one after the
// other in large chunks, so the first one is barely slowed and the second one's TTFT stays near
// twice its isolated TTFT (exactly twice is the best any order can do; the first one's decode
// steps, which keep to the step target unless the second one's deadline needs larger ones,
// cost the rest). Small chunks cost far more.
TEST(Simulation, BurstOfLongPromptsStaysNearTwiceIsolated) {
  const auto reqs = long_every(30000, 60000, 2700, 2);
  SchedulerConfig cfg, small;
  small.chunk_size = 32;
  // The fast machine of the other tests (the second prompt's prefill, ~0.3 s, fits in the first
  // one's 16 decode steps) and a slow one (0.75 ms a token: ~2 s, as the 110m model on 2 vCPUs):
  // there the second prompt prefills mostly alone after the first one finishes, and the first
  // one's arrival must not count as busy traffic (steps of 50-150 ms instead of large chunks).
  // Both with steps that run to their end and with steps that yield between 12 blocks (there the
  // first one's arrival must not cut the second's steps to 12 x block_wait_ms either).
  for (const CostModel& cost : {CostModel{5.0, 0.1, 1e-5}, CostModel{5.0, 0.75, 1e-5}}) {
    for (const int32_t blocks : {0, 12}) {
      const SimResult res = simulate(reqs, cfg, 4000, true, cost, std::nullopt, {}, 0, -1, blocks),
                      s = simulate(reqs, small, 4000, true, cost, std::nullopt, {}, 0, -1, blocks);
      expect_complete_and_correct(reqs, res);
      for (uint64_t id = 1; id <= reqs.size(); ++id) {
        const double alone = ttft_alone(reqs[id - 1], cfg, cost);
        std::printf("%.2f ms/token, %d blocks, burst request %d: TTFT %.3fx alone (chunks of 32: %.3fx)\n",
                    cost.per_token_ms, int(blocks), int(id), res.timings.at(id).ttft_ms() / alone,
                    s.timings.at(id).ttft_ms() / alone);
        EXPECT_LE(res.timings.at(id).ttft_ms(), (id % 2 == 1 ? 1.2 : 2.1) * alone) << id;
        // Every one within its deadline: on the slow machine the second one's steps beside the
        // first one's decodes grow past the target to make it (at the target: 1.0014-1.0132x it).
        const int64_t n = int64_t(reqs[id - 1].prompt.size());
        EXPECT_LE(res.timings.at(id).ttft_ms(), default_ttft_slo_ms(cfg, cost, n)) << id;
        if (id % 2 == 0) {
          EXPECT_GT(s.timings.at(id).ttft_ms(), 2.1 * alone) << id;
        }
      }
    }
  }
}

// Mixed: long prompts every 20 s among short ones (Poisson 4/s): every short prompt meets its
// deadline (it waits at most about one step), and the long ones are not starved.
TEST(Simulation, MixedTrafficMeetsShortDeadlines) {
  std::vector<SimRequest> reqs = long_every(20000, 60000, 2700, 1);
  for (auto& r : reqs) r.arrival_ms += 1000;
  for (const SimRequest& r : poisson_shorts(7, 250, 60000)) reqs.push_back(r);
  SchedulerConfig cfg;
  const SimResult res = simulate(reqs, cfg, 4000);
  expect_complete_and_correct(reqs, res);
  const CostModel cost{5.0, 0.1, 1e-5};  // simulate()'s
  size_t shorts = 0, late = 0;
  for (uint64_t id = 1; id <= reqs.size(); ++id) {
    const RequestTimings& tm = res.timings.at(id);
    const int64_t n = int64_t(reqs[id - 1].prompt.size());
    if (n >= 1000) {
      EXPECT_LE(tm.ttft_ms(), 1.5 * ttft_alone(reqs[id - 1], cfg)) << id;
      continue;
    }
    ++shorts;
    late += tm.ttft_ms() > default_ttft_slo_ms(cfg, cost, n);
    EXPECT_LE(tm.queue_ms(), 1.5 * cfg.step_latency_target_ms) << id;
  }
  EXPECT_GT(shorts, 200u);
  EXPECT_EQ(late, 0u);
  // Fixed 1024-token chunks (the seed's idle rule everywhere) make short prompts miss.
  SchedulerConfig big = cfg;
  big.chunk_size = 1024;
  const SimResult b = simulate(reqs, big, 4000);
  size_t big_late = 0;
  for (uint64_t id = 1; id <= reqs.size(); ++id) {
    const int64_t n = int64_t(reqs[id - 1].prompt.size());
    if (n < 1000) big_late += b.timings.at(id).ttft_ms() > default_ttft_slo_ms(cfg, cost, n);
  }
  EXPECT_GT(big_late, 0u);
}

// `bench serve --workload mixed` on a 110m-like machine (3 ms a step, 0.5 ms a token, attention
// 1e-4 ms a pair: a ~2,700-token prompt takes ~1.8 s alone): short prompts (45 tokens, Poisson
// 1/s, 16 tokens out) keep their P99 TTFT near that of the same short prompts alone (issue 19's
// target on the server: 1.5x), while the long ones are not starved.
TEST(Simulation, MixedShortP99StaysNearIsolated) {
  const CostModel cost{3.0, 0.5, 1e-4};
  std::vector<SimRequest> longs = long_every(20000, 120000, 2700, 1);
  const std::vector<SimRequest> shorts = poisson_shorts(11, 1000, 120000);
  for (auto& r : longs) r.arrival_ms += 1000;
  std::vector<SimRequest> reqs = shorts;
  reqs.insert(reqs.end(), longs.begin(), longs.end());
  auto p99 = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[size_t(std::ceil(0.99 * double(v.size()))) - 1];
  };
  for (const auto& [chunk, blocks] : {std::pair<int64_t, int32_t>{-1, 0}, {256, 0}, {-1, 12}}) {
    SchedulerConfig cfg;
    cfg.chunk_size = chunk;
    const SimResult mixed = simulate(reqs, cfg, 4000, true, cost, std::nullopt, {}, 0, -1, blocks),
                    alone = simulate(shorts, cfg, 4000, true, cost, std::nullopt, {}, 0, -1, blocks);
    expect_complete_and_correct(reqs, mixed);
    std::vector<double> m, a;
    for (uint64_t id = 1; id <= shorts.size(); ++id) {
      m.push_back(mixed.timings.at(id).ttft_ms());
      a.push_back(alone.timings.at(id).ttft_ms());
    }
    double long_worst = 0;
    for (uint64_t id = shorts.size() + 1; id <= reqs.size(); ++id)
      long_worst = std::max(long_worst, mixed.timings.at(id).ttft_ms() / ttft_alone(reqs[id - 1], cfg, cost));
    std::printf("chunk %lld, %d blocks: short TTFT p99 %.1f ms mixed, %.1f alone (%.2fx); long TTFT <= %.2fx alone\n",
                (long long)chunk, blocks, p99(m), p99(a), p99(m) / p99(a), long_worst);
    // Here a short prompt's TTFT is its steps alone (no HTTP, no tokenizing), so the ratio is
    // harsher than the server's; 1.5x on this trace (the step of a short prompt's prefill was
    // capped at the target only: 1.72x).
    if (chunk < 0 && blocks > 0) {
      // Steps that yield between their blocks: a short prompt arriving mid-step runs between
      // two of them (1.32x without on this trace).
      EXPECT_LE(p99(m), 1.1 * p99(a));
      EXPECT_LE(long_worst, 1.5);
      EXPECT_GT(mixed.steps.size(), alone.steps.size());
      size_t between = 0;
      for (const StepRecord& st : mixed.steps) between += st.between;
      EXPECT_GT(between, 0u);
    } else if (chunk < 0) {
      EXPECT_LE(p99(m), 1.55 * p99(a));
      EXPECT_LE(long_worst, 1.5);
    } else {
      EXPECT_GT(p99(m), 1.55 * p99(a));  // the test can fail: fixed chunks make shorts wait
    }
  }
}

// Overload (docs/bench/overload.json on a 110m-like machine: ~55 short prompts a second and a
// ~2,700-token one every 5 s, more than it serves): pure earliest deadline first serves every
// request late, the oldest first, and steps between blocks, run for the queue, stretched every
// decode step (the server measured TPOT p50 117 ms against the 50 ms target, and 0.3-2.6
// requests a second within `--slo ttft:500,tpot:100`). Late prefills ordered as if due
// late_order_ms from now serve those that can still be on time; a step planned over a backlog
// runs none between its blocks.
TEST(Simulation, OverloadServesWhatCanStillBeOnTime) {
  const CostModel cost{3.0, 0.5, 1e-4};
  std::vector<SimRequest> reqs = long_every(5000, 30000, 2700, 1);
  for (const SimRequest& r : poisson_shorts(5, 18, 30000)) reqs.push_back(r);
  struct Outcome {
    size_t good = 0;
    double tpot_p90 = 0;
    uint64_t between_steps = 0;
  };
  auto run = [&](double late_order_ms) {
    SchedulerConfig cfg;
    cfg.late_order_ms = late_order_ms;
    const SimResult res = simulate(reqs, cfg, 1024, true, cost, std::nullopt, {}, 0, -1, 12);
    expect_complete_and_correct(reqs, res);
    Outcome o;
    std::vector<double> tpot;
    for (uint64_t id = 1; id <= reqs.size(); ++id) {
      const RequestTimings& tm = res.timings.at(id);
      tpot.push_back(tm.decode_ms() / double(reqs[id - 1].max_tokens - 1));
      o.good += tm.ttft_ms() <= 500 && tpot.back() <= 100;
    }
    std::sort(tpot.begin(), tpot.end());
    o.tpot_p90 = tpot[tpot.size() * 9 / 10];
    o.between_steps = res.counters.between_steps;
    std::printf("late_order_ms %g: %zu of %zu requests within TTFT 500 ms and TPOT 100 ms; TPOT p90 %.1f ms; %llu steps between blocks\n",
                late_order_ms, o.good, reqs.size(), o.tpot_p90, (unsigned long long)o.between_steps);
    return o;
  };
  const SchedulerConfig defaults;
  const Outcome now = run(defaults.late_order_ms), edf = run(-std::numeric_limits<double>::infinity());
  EXPECT_GT(now.good, reqs.size() / 2);  // measured 1288 of 1622 (the machine serves ~80%)
  EXPECT_LT(edf.good, reqs.size() / 10);  // pure EDF: 17-26 (the test can fail)
  // The decodes keep near their step target: no step between blocks over a backlog (a few run
  // in the first second, before one builds up; without the rule 74 ms and 89 ms).
  EXPECT_LE(now.tpot_p90, 1.25 * defaults.step_latency_target_ms);
  EXPECT_LE(edf.tpot_p90, 1.25 * defaults.step_latency_target_ms);
  EXPECT_LT(now.between_steps, reqs.size() / 20);
}

// Steps between blocks do not starve the step they run inside: short prompts arriving every
// 30 ms, each a 23 ms step (77% of the machine), while a step carries decodes and a long prompt's
// middle chunk (no first token an inner step would delay): each short runs between two blocks as
// it arrives, and the running step would end only once arrivals left a gap. The steps inside one
// step start only until they took the step target, so the decodes' inter-token time stays bounded.
TEST(Simulation, StepsBetweenBlocksDoNotStarveTheStepTheyRunIn) {
  const CostModel cost{3.0, 0.5, 1e-4};
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 4; ++k) reqs.push_back({0.0, make_prompt(20 + k, 5000 + k), 300});
  reqs.push_back({5.0, make_prompt(6000, 5100), 4});
  for (int k = 0; k < 100; ++k) reqs.push_back({100.0 + 30 * k, make_prompt(40 + k % 3, 5200 + k), 1});
  SchedulerConfig cfg;
  const SimResult res = simulate(reqs, cfg, 4000, true, cost, std::nullopt, {}, 0, -1, 12);
  expect_complete_and_correct(reqs, res);
  size_t between = 0;
  double longest_between = 0;
  for (const StepRecord& st : res.steps) {
    between += st.between;
    if (st.between) longest_between = std::max(longest_between, st.forward_ms);
  }
  EXPECT_GT(between, 10u);
  double worst = 0;
  for (uint64_t id = 1; id <= 4; ++id) {
    const std::vector<double>& t = res.timings.at(id).token_ms;
    for (size_t i = 1; i < t.size(); ++i) worst = std::max(worst, t[i] - t[i - 1]);
  }
  if (std::getenv("FT_SIM_TRACE"))
    for (const auto& s : res.steps)
      std::printf("t=%8.1f fwd=%6.1f dec=%d chunks=%zu first=%lld between=%d\n", s.start_ms, s.forward_ms, s.n_decode,
                  s.chunks.size(), s.chunks.empty() ? 0LL : (long long)s.chunks[0], s.between);
  std::printf("decodes' longest inter-token time %.1f ms (target %.0f ms), %zu steps between blocks\n", worst,
              cfg.step_latency_target_ms, between);
  // A decode step (<= the target) plus steps inside it that started before they took the
  // target (215 ms here when they may start at every block).
  EXPECT_LE(worst, 2 * cfg.step_latency_target_ms + longest_between + 1e-6);
}

// The engine tells each step how cold the machine is (the busy time since its last idle gap),
// so on a machine that warms up the cold steps are predicted as well as the warm ones.
TEST(Simulation, CostModelLearnsHowTheMachineWarmsUp) {
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 120; ++k) reqs.push_back({500.0 * k, make_prompt(30 + k % 17, 6000 + k), 16});
  const CostModel cost{3.0, 0.5, 1e-4};
  const SimResult res = simulate(reqs, SchedulerConfig{}, 4000, true, cost, std::nullopt, {}, 0, -1, 0, 6.0);
  expect_complete_and_correct(reqs, res);
  double err = 0, cold_err = 0;
  int n = 0, n_cold = 0;
  for (size_t i = res.steps.size() / 2; i < res.steps.size(); ++i) {
    const StepRecord& s = res.steps[i];
    const double e = std::abs(s.predicted_ms - s.forward_ms) / s.forward_ms;
    err += e, ++n;
    if (s.cold > 0.5) cold_err += e, ++n_cold;
  }
  ASSERT_GE(n_cold, 50);  // each prompt's step is begun cold
  EXPECT_LT(cold_err / n_cold, 0.02);
  EXPECT_LT(err / n, 0.02);
  EXPECT_NEAR(res.learned.warm_up_ms, 6.0, 0.6);
}

// The learned cost model: a prior 3x off (a noisy start-up) is corrected within the run, so the
// predicted step times end within a few percent of the measured ones.
TEST(Simulation, CostModelLearnsFromMeasuredSteps) {
  std::vector<SimRequest> reqs = long_every(3000, 30000, 1500, 1);
  for (int k = 0; k < 100; ++k) reqs.push_back({300.0 * k + 50, make_prompt(30 + k % 20, 3000 + k), 16});
  const CostModel truth{5.0, 0.1, 1e-5};
  const SimResult res = simulate(reqs, SchedulerConfig{}, 4000, true, truth, CostModel{1.0, 0.3, 3e-5});
  expect_complete_and_correct(reqs, res);
  const auto& steps = res.steps;
  ASSERT_GT(steps.size(), 400u);
  double first = 0, last = 0;
  const size_t n = 100;
  for (size_t i = 0; i < n; ++i) {
    first += std::abs(steps[i].predicted_ms - steps[i].forward_ms) / steps[i].forward_ms / double(n);
    const StepRecord& s = steps[steps.size() - 1 - i];
    last += std::abs(s.predicted_ms - s.forward_ms) / s.forward_ms / double(n);
  }
  EXPECT_GT(first, 0.15);
  EXPECT_LT(last, 0.02);
  EXPECT_NEAR(res.learned.per_token_ms, truth.per_token_ms, 0.01);
  EXPECT_EQ(res.errors.count, res.counters.steps);
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

// ---- speculative decoding -------------------------------------------------------------------

SpecConfig ngram_spec(int32_t k, bool k_auto = false) {
  SpecConfig s;
  s.method = SpecMethod::Ngram;
  s.k = k;
  s.k_auto = k_auto;
  return s;
}

// Greedy outputs with prompt-lookup speculation are the fake model's, token for token: drafts
// mostly right (window 1: the output soon cycles) or mostly wrong (the whole prefix: rejected drafts'
// K/V, left in the cache, would change every later token), every chunk setting, batched.
TEST(Speculation, GreedyOutputIsExactAndDraftsPay) {
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 12; ++k) reqs.push_back({3.0 * k, make_prompt(1 + (k * 37) % 200, k), 20 + 7 * k});
  for (int window : {1, 0}) {
    for (int64_t chunk : {int64_t(-1), int64_t(0), int64_t(16)}) {
      for (bool k_auto : {false, true}) {
        SCOPED_TRACE(testing::Message() << "window " << window << " chunk " << chunk << " auto " << k_auto);
        SchedulerConfig cfg;
        cfg.chunk_size = chunk;
        cfg.max_batch_tokens = chunk == 0 ? 8192 : 2048;
        const SimResult plain = simulate(reqs, cfg, 1000, true, {5.0, 0.1, 1e-5}, std::nullopt, {}, window);
        const SimResult spec = simulate(reqs, cfg, 1000, true, {5.0, 0.1, 1e-5}, std::nullopt, ngram_spec(4, k_auto), window);
        expect_complete_and_correct(reqs, plain, window);
        expect_complete_and_correct(reqs, spec, window);
        EXPECT_EQ(spec.counters.generated_tokens, plain.counters.generated_tokens);
        EXPECT_GT(spec.counters.spec_drafts, 0u);
        EXPECT_LE(spec.counters.spec_accepted_tokens, spec.counters.spec_draft_tokens);
        uint64_t per_pos = 0;
        for (uint64_t n : spec.counters.spec_accepted_per_pos) per_pos += n;
        EXPECT_EQ(per_pos, spec.counters.spec_accepted_tokens);
        int64_t req_drafts = 0, req_accepted = 0;
        for (const auto& [id, t] : spec.timings) {
          req_drafts += t.spec.draft_tokens;
          req_accepted += t.spec.accepted_tokens;
        }
        EXPECT_EQ(uint64_t(req_drafts), spec.counters.spec_draft_tokens);
        EXPECT_EQ(uint64_t(req_accepted), spec.counters.spec_accepted_tokens);
        // Every step's forward is a verification (it scored drafts) or a plain one.
        const SpecTimes& st = spec.counters.spec_times;
        EXPECT_EQ(uint64_t(st.verify_steps + st.plain_steps), spec.counters.steps);
        EXPECT_GT(st.verify_steps, 0);
        EXPECT_LE(uint64_t(st.verify_steps), spec.counters.spec_drafts);
        EXPECT_EQ(st.draft_forwards + st.catch_up_forwards, 0);  // (prompt lookup: no draft model)
        if (window == 1) {  // cycles: most drafts stand, and steps are saved
          EXPECT_GT(spec.counters.spec_accepted_tokens * 2, spec.counters.spec_draft_tokens);
          EXPECT_LT(spec.counters.steps, plain.counters.steps);
        }
      }
    }
  }
}

// Rollback under KV pressure and prefix sharing: preemptions, evictions and truncations mixed;
// every plan fits the pool and every output is exact (a block published with a rejected token in
// it would hand later requests a wrong prefix).
TEST(Speculation, KvPressureAndSharedPrefixesStayExact) {
  const std::vector<int32_t> system = make_prompt(64, 7);
  std::vector<SimRequest> reqs;
  for (int k = 0; k < 24; ++k) {
    std::vector<int32_t> p = k % 3 == 2 ? make_prompt(40, 100 + k) : system;
    const auto tail = make_prompt(5 + 7 * (k % 5), k);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back({7.0 * k, p, 30 + 5 * (k % 4)});
  }
  for (int window : {3, 0}) {
    SchedulerConfig cfg;
    const SimResult res = simulate(reqs, cfg, 24, true, {5.0, 0.1, 1e-5}, std::nullopt, ngram_spec(6), window);
    expect_complete_and_correct(reqs, res, window);
    EXPECT_GT(res.counters.preemptions, 0u) << window;
    EXPECT_GT(res.counters.spec_draft_tokens, 0u) << window;
    for (const auto& s : res.steps) EXPECT_LE(s.kv_used_blocks, res.kv_total);
  }
}

// The scheduler grants drafts from what is left: never a prefill's share in auto mode, within
// the KV blocks and the batch's tokens.
TEST(Speculation, DraftsAreBudgetedAfterPrefill) {
  SchedulerInput in;
  in.cost = {5.0, 0.1, 0.0};
  in.cfg.step_latency_target_ms = 6.0;  // decode (5.1) + prefill fill it
  in.free_blocks = 100;
  SchedRequest d;
  d.id = 1;
  d.n_tokens = 20;
  d.n_computed = 19;
  d.n_generated = 3;
  d.admitted = true;
  d.blocks_held = 2;
  d.n_draft = 4;
  in.requests.push_back(d);
  SchedRequest p;
  p.id = 2;
  p.n_tokens = 100;
  p.deadline_ms = 1000;
  in.requests.push_back(p);
  StepPlan plan = plan_step(in);
  ASSERT_EQ(plan.decode.size(), 1u);
  ASSERT_EQ(plan.decode_draft.size(), 1u);
  EXPECT_EQ(plan.decode_draft[0], 0);  // the prefill took the step's time
  ASSERT_EQ(plan.prefill.size(), 1u);
  // A short prompt leaves most of the step's cap: drafts still add at most kSpecPrefillSlack to
  // the step that computes its first token (5 + 0.1 x (1 + 10) = 6.1 ms: 0.305 ms, 3 drafts),
  // in fixed mode too, and a draft model (forwards outside the prediction) gets none.
  in.cfg.step_latency_target_ms = 50;
  in.requests[1].n_tokens = 10;
  in.requests[0].n_draft = 8;
  plan = plan_step(in);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].n_tokens, 10);
  EXPECT_EQ(plan.decode_draft[0], 3);
  EXPECT_LE(plan.predicted_ms, (1 + kSpecPrefillSlack) * 6.1 + 1e-9);
  in.cfg.chunk_size = 16;
  EXPECT_EQ(plan_step(in).decode_draft[0], 3);
  in.drafts_from_model = true;
  EXPECT_EQ(plan_step(in).decode_draft[0], 0);
  in.cfg.chunk_size = -1;
  in.requests[1].n_tokens = 4000;  // waiting and not admitted (no KV blocks): it still waits
  in.free_blocks = 2;
  plan = plan_step(in);
  EXPECT_TRUE(plan.prefill.empty());
  EXPECT_EQ(plan.decode_draft[0], 0);
  in.drafts_from_model = false;
  EXPECT_EQ(plan_step(in).decode_draft[0], 2);  // 5% of the 5.1 ms decode: 2 drafts of 0.1 ms
  in.free_blocks = 100;
  in.cfg.step_latency_target_ms = 6.0;
  in.requests[0].n_draft = 4;
  in.requests.pop_back();  // nothing else waits: drafts within kSpecStretch x the plain step
  plan = plan_step(in);
  EXPECT_EQ(plan.decode_draft[0], 4);
  EXPECT_EQ(plan.n_tokens(), 5);
  in.requests[0].blocks_held = 2;
  in.free_blocks = 0;  // 19 + 1 + 4 positions fit the 2 blocks held (32 positions)
  EXPECT_EQ(plan_step(in).decode_draft[0], 4);
  in.requests[0].n_computed = 30;
  in.requests[0].n_tokens = 31;  // 31 + 4 positions need a third block: no draft fits
  EXPECT_EQ(plan_step(in).decode_draft[0], 1);
  in.free_blocks = 100;
  in.cfg.chunk_size = 16;
  in.cfg.max_batch_tokens = 3;  // fixed mode: bounded by the batch's tokens
  EXPECT_EQ(plan_step(in).decode_draft[0], 2);
  in.cfg.chunk_size = -1;
  in.cfg.max_batch_tokens = 2048;
  in.cfg.step_latency_target_ms = 50;
  in.cost = {1.0, 0.5, 0.0};  // a decode-only step of 1.5 ms: drafts within 3 ms, whatever the target
  in.requests[0].n_draft = 16;
  EXPECT_EQ(plan_step(in).decode_draft[0], 3);
}

// A fake model with a soft distribution: a Markov chain over a small vocabulary, the logits of
// the next token a function of the token at the current position (read back from the cache).
class MarkovExecutor : public StepExecutor {
 public:
  static constexpr int32_t V = 4;
  static float logit(int32_t from, int32_t to) { return float((from * 3 + to * 5) % 7) * 0.35f - float(to == from) * 0.5f; }
  void forward(const Batch& b, KVCache& kv, float* logits, float*) override {
    for (int64_t i = 0; i < b.size(); ++i) {
      const float t = float(b.tokens[size_t(i)]);
      kv.write(0, b.seq[size_t(i)], b.pos[size_t(i)], &t, &t);
    }
    size_t row = 0;
    for (int64_t i = 0; i < b.size(); ++i) {
      if (!b.want_logits[size_t(i)]) continue;
      float t;
      kv.read(0, b.seq[size_t(i)], b.pos[size_t(i)], &t, nullptr);
      for (int32_t to = 0; to < V; ++to) logits[row * V + size_t(to)] = logit(int32_t(t), to);
      ++row;
    }
  }
  int32_t n_vocab() const override { return V; }
};

// Sampled output with speculation follows the target's distribution exactly: the joint law of
// tokens 2-4 (drafted and verified; token 1 comes from the prefill) over many seeds, batched,
// against the chain's exact law (chi-square at 0.1%); the same counts fail against a slightly
// different temperature (the test can fail).
TEST(Speculation, SampledOutputFollowsTheTargetDistribution) {
  constexpr int32_t V = MarkovExecutor::V;
  const std::vector<int32_t> prompt = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 3, 2, 1, 0};
  auto trans = [](int32_t from, float temp) {
    std::vector<double> p(V);
    double s = 0;
    for (int32_t to = 0; to < V; ++to) s += p[size_t(to)] = std::exp(double(MarkovExecutor::logit(from, to)) / temp);
    for (double& x : p) x /= s;
    return p;
  };
  auto joint = [&](float temp) {  // P(x2, x3, x4) = sum over x1 of P(x1 | last) P(x2 | x1) ...
    std::vector<double> j(size_t(V * V * V), 0.0);
    const auto p1 = trans(prompt.back(), temp);
    for (int32_t a = 0; a < V; ++a)
      for (int32_t b = 0; b < V; ++b)
        for (int32_t c = 0; c < V; ++c)
          for (int32_t d = 0; d < V; ++d)
            j[size_t((b * V + c) * V + d)] += p1[size_t(a)] * trans(a, temp)[size_t(b)] * trans(b, temp)[size_t(c)] *
                                              trans(c, temp)[size_t(d)];
    return j;
  };
  MarkovExecutor exec;
  KVCacheConfig kc;
  kc.n_layers = 1;
  kc.kv_dim = 1;
  kc.block_size = 16;
  kc.n_blocks = 512;
  KVCache kv(kc);
  double clock = 0;
  SchedulerConfig cfg;
  cfg.chunk_size = 0;
  EngineCore core(kv, exec, cfg, CostModel{}, 1 << 20, {}, [&] { return clock; });
  core.set_speculation(ngram_spec(3), nullptr);
  const int64_t N = 24000;
  std::vector<int64_t> counts(size_t(V * V * V), 0);
  std::map<uint64_t, std::vector<int32_t>> out;
  for (int64_t base = 0; base < N; base += 64) {
    for (int64_t i = base; i < std::min(N, base + 64); ++i) {
      EngineRequest r;
      r.prompt = prompt;
      r.max_tokens = 4;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = uint64_t(i) * 1000003 + 17;
      core.add(uint64_t(i + 1), std::move(r), [&out](const EngineEvent& ev) {
        if (ev.kind == EngineEvent::Kind::Token) out[ev.id].push_back(ev.token);
      });
    }
    while (!core.idle()) core.step();
  }
  ASSERT_EQ(out.size(), size_t(N));
  for (const auto& [id, t] : out) {
    ASSERT_EQ(t.size(), 4u);
    ++counts[size_t((t[1] * V + t[2]) * V + t[3])];
  }
  const EngineCounters& c = core.counters();
  EXPECT_GT(c.spec_accepted_tokens, 0u);
  EXPECT_LT(c.spec_accepted_tokens, c.spec_draft_tokens);  // rejections and residual draws happen
  auto chi2 = [&](const std::vector<double>& p, int* df) {
    double x = 0;
    *df = -1;
    for (size_t i = 0; i < p.size(); ++i) {
      const double e = p[i] * double(N);
      x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
      ++*df;
    }
    return x;
  };
  auto critical = [](int df) {  // chi-square 99.9% quantile (Wilson-Hilferty)
    const double a = 2.0 / (9.0 * df);
    return df * std::pow(1 - a + 3.090232 * std::sqrt(a), 3);
  };
  int df = 0;
  const double x = chi2(joint(1.0f), &df);
  EXPECT_LT(x, critical(df)) << "chi-square " << x << " with " << df << " degrees of freedom";
  const double y = chi2(joint(1.2f), &df);
  EXPECT_GT(y, critical(df)) << "the test has no power: " << y;
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

// Pipeline parallelism's overlapped steps (StepExecutor::max_in_flight > 1), as a fake: begin
// runs the step (KV writes, FakeExecutor's logits, computed then, as a first stage fixes a
// step's input) and finish hands the oldest step's rows back. It checks the core's promises: at
// most depth steps in flight, no sequence in two of them.
class PipelinedExecutor : public StepExecutor {
 public:
  explicit PipelinedExecutor(int32_t depth) : depth_(depth) {}
  void forward(const Batch& b, KVCache& kv, float* logits, float* hidden) override {
    begin(b, kv, logits, hidden);
    finish(logits, hidden);
  }
  int32_t max_in_flight() const override { return depth_; }
  void begin(const Batch& b, KVCache& kv, float*, float*) override {
    EXPECT_LT(int32_t(flights_.size()), depth_);
    Flight f;
    for (int64_t i = 0; i < b.size(); ++i) {
      const float t = float(b.tokens[size_t(i)]);
      kv.write(0, b.seq[size_t(i)], b.pos[size_t(i)], &t, &t);
    }
    for (int64_t i = 0; i < b.size(); ++i) {
      if (!b.want_logits[size_t(i)]) continue;
      const int32_t seq = b.seq[size_t(i)];
      f.seqs.insert(seq);
      for (const Flight& o : flights_) EXPECT_FALSE(o.seqs.count(seq)) << "sequence " << seq << " in two steps in flight";
      uint64_t h = 1;
      for (int32_t p = 0; p <= b.pos[size_t(i)]; ++p) {
        float t;
        kv.read(0, seq, p, &t, nullptr);
        h = mix(h, uint64_t(t));
      }
      if (b.want_logits[size_t(i)] == kOutHidden) {
        f.hidden.resize(f.hidden.size() + kEmbd);
        fake_hidden(h, f.hidden.data() + f.hidden.size() - kEmbd);
        continue;
      }
      f.logits.resize(f.logits.size() + kVocab, 0.0f);
      f.logits[f.logits.size() - kVocab + h % kVocab] = 1;
    }
    flights_.push_back(std::move(f));
    max_seen = std::max(max_seen, int32_t(flights_.size()));
  }
  void finish(float* logits, float* hidden) override {
    ASSERT_FALSE(flights_.empty());
    std::copy(flights_.front().logits.begin(), flights_.front().logits.end(), logits);
    std::copy(flights_.front().hidden.begin(), flights_.front().hidden.end(), hidden);
    flights_.pop_front();
  }
  int32_t n_vocab() const override { return kVocab; }
  int32_t n_embd() const override { return kEmbd; }
  int32_t max_seen = 0;

 private:
  struct Flight {
    std::set<int32_t> seqs;
    std::vector<float> logits, hidden;
  };
  int32_t depth_;
  std::deque<Flight> flights_;
};

// Several concurrent greedy requests (staggered prompts, chunked prefill, decodes) give the same
// tokens with 1, 2 and 3 steps in flight; overlapped, the decodes run in groups (no step carries
// them all) and the steps in flight reach the depth. A request cancelled while its step is in
// flight finishes alone (its rows are dropped) and every block comes back.
TEST(EngineCore, OverlappedStepsGiveTheSameTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 6; ++k) prompts.push_back(make_prompt(5 + 23 * k, k));
  for (int32_t depth : {1, 2, 3}) {
    SCOPED_TRACE(depth);
    double clock = 0;
    PipelinedExecutor exec(depth);
    KVCache kv({1, 1, 16, 200, true});
    SchedulerConfig cfg;
    cfg.chunk_size = 32;
    EngineCore core(kv, exec, cfg, CostModel{}, 1 << 16, {}, [&] { return clock; });
    std::map<uint64_t, std::vector<int32_t>> out;
    std::map<uint64_t, FinishReason> why;
    auto cb = [&](const EngineEvent& ev) {
      if (ev.kind == EngineEvent::Kind::Token) out[ev.id].push_back(ev.token);
      else why[ev.id] = ev.reason;
    };
    for (size_t k = 0; k < prompts.size(); ++k) {
      EngineRequest r;
      r.prompt = prompts[k];
      r.max_tokens = 20 + int64_t(k);
      r.sampling.temperature = 0;
      core.add(k + 1, r, cb);
    }
    EngineRequest c;  // cancelled once it decodes, with its step in flight
    c.prompt = make_prompt(9, 50);
    c.max_tokens = 100;
    core.add(100, c, cb);
    int32_t max_decode = 0, turns_since_third = -1;
    for (int guard = 0; guard < 10000 && !core.idle(); ++guard) {
      ASSERT_TRUE(core.step());
      clock += 1;
      // The turn after its third token began the step with its fourth (overlapped: in flight).
      if (turns_since_third < 0 && out[100].size() == 3) turns_since_third = 0;
      else if (turns_since_third >= 0 && ++turns_since_third == 1) core.cancel(100);
      if (!core.steps().empty()) max_decode = std::max(max_decode, core.steps().back().n_decode);
    }
    ASSERT_TRUE(core.idle());
    for (size_t k = 0; k < prompts.size(); ++k) {
      EXPECT_EQ(why[k + 1], FinishReason::Length);
      EXPECT_EQ(out[k + 1], expected_output(prompts[k], 20 + int64_t(k))) << "request " << k + 1;
    }
    EXPECT_EQ(why[100], FinishReason::Cancelled);
    EXPECT_EQ(kv.used_blocks(), 0);
    EXPECT_EQ(core.counters().max_steps_in_flight, uint64_t(depth));
    EXPECT_EQ(exec.max_seen, depth);
    // 7 decoding at most: one step carries all of them, or a group of ceil(7 / depth).
    EXPECT_LE(max_decode, (7 + depth - 1) / depth);
  }
}

// The fake models' embedding of a prompt, computed directly: its pooled hidden states.
std::vector<float> expected_embedding(const std::vector<int32_t>& prompt, Pooling pooling) {
  std::vector<double> sum(kEmbd, 0.0);
  int64_t n = 0;
  uint64_t h = 1;
  float row[kEmbd];
  for (size_t p = 0; p < prompt.size(); ++p) {
    h = mix(h, uint64_t(prompt[p]));
    if (pooling == Pooling::Cls ? p != 0 : pooling == Pooling::Last && p + 1 != prompt.size()) continue;
    fake_hidden(h, row);
    for (int32_t d = 0; d < kEmbd; ++d) sum[size_t(d)] += double(row[d]);
    ++n;
  }
  std::vector<float> out(kEmbd);
  for (int32_t d = 0; d < kEmbd; ++d) out[size_t(d)] = float(sum[size_t(d)] / double(n));
  return out;
}

// Embeddings among generations: every chunk size, one or two steps in flight, preemptions on a
// small cache and prompts sharing a prefix: each embedding is its prompt's pooled hidden states
// exactly, nothing is sampled for it, and the generations' tokens are what they are alone.
TEST(EngineCoreEmbeddings, PoolEveryChunkingPreemptionAndOverlapExactly) {
  const std::vector<int32_t> shared = make_prompt(40, 9);
  int64_t embedding_preemptions = 0;
  for (Pooling pooling : {Pooling::Mean, Pooling::Cls, Pooling::Last})
    for (int32_t depth : {1, 2})
      for (int64_t chunk : {int64_t(5), int64_t(64)}) {
        SCOPED_TRACE(cat(pooling_name(pooling), " depth ", depth, " chunk ", chunk));
        double clock = 0;
        PipelinedExecutor exec(depth);
        KVCache kv({1, 1, 16, 24, true});  // 384 positions: fewer than everyone's at once
        SchedulerConfig cfg;
        cfg.chunk_size = chunk;
        EngineCore core(kv, exec, cfg, CostModel{}, 1 << 16, {}, [&] { return clock; });
        std::map<uint64_t, std::vector<int32_t>> out;
        std::map<uint64_t, EngineEvent> fin;
        std::map<uint64_t, std::vector<int32_t>> prompts;
        std::map<uint64_t, RequestTimings> timings;
        auto cb = [&](const EngineEvent& ev) {
          if (ev.kind == EngineEvent::Kind::Token) return out[ev.id].push_back(ev.token);
          fin[ev.id] = ev;
          timings[ev.id] = *ev.timings;
        };
        for (uint64_t k = 0; k < 12; ++k) {
          EngineRequest r;
          r.prompt = k % 3 == 0 ? shared : std::vector<int32_t>{};
          const auto tail = make_prompt(20 + 17 * int64_t(k), int(k));
          r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
          prompts[k + 1] = r.prompt;
          if (k % 2 == 1) {
            r.pooling = pooling;
          } else {
            r.max_tokens = 60;
            r.sampling.temperature = 0;
          }
          core.add(k + 1, r, cb);
          if (k == 5) {  // the rest arrive later (the first ones' blocks are in the prefix cache then)
            for (int t = 0; t < 30 && !core.idle(); ++t) ASSERT_TRUE(core.step());
          }
        }
        for (int guard = 0; guard < 100000 && !core.idle(); ++guard) {
          ASSERT_TRUE(core.step());
          clock += 1;
        }
        ASSERT_TRUE(core.idle());
        for (uint64_t id = 1; id <= 12; ++id) {
          ASSERT_TRUE(fin.count(id)) << id;
          if (id % 2 == 0) {  // an embedding
            EXPECT_EQ(fin[id].reason, FinishReason::Stop) << id;
            EXPECT_EQ(fin[id].n_generated, 0) << id;
            EXPECT_FALSE(out.count(id)) << "request " << id << " sampled a token";
            EXPECT_EQ(fin[id].embedding, expected_embedding(prompts[id], pooling)) << id;
            if (pooling != Pooling::Last) {
              EXPECT_EQ(timings[id].cached_tokens, 0) << id;
            }
            embedding_preemptions += timings[id].preemptions;
          } else {
            EXPECT_EQ(fin[id].reason, FinishReason::Length) << id;
            EXPECT_TRUE(fin[id].embedding.empty());
            EXPECT_EQ(out[id], expected_output(prompts[id], 60)) << id;
          }
        }
        EXPECT_EQ(kv.used_blocks(), 0);
      }
  EXPECT_GT(embedding_preemptions, 0) << "no embedding was preempted: the test does not cover recomputing one";
}

// Last pooling takes the prefix cache (one position is computed); Mean and Cls never do. Either
// way the same prompt gives the same embedding.
TEST(EngineCoreEmbeddings, OnlyLastPoolingTakesThePrefixCache) {
  for (Pooling pooling : {Pooling::Mean, Pooling::Cls, Pooling::Last}) {
    SCOPED_TRACE(pooling_name(pooling));
    double clock = 0;
    FakeExecutor exec(&clock, CostModel{});
    KVCache kv({1, 1, 16, 40, true});
    EngineCore core(kv, exec, SchedulerConfig{}, CostModel{}, 1000, {}, [&] { return clock; });
    std::vector<std::vector<float>> got;
    std::vector<int64_t> cached;
    EngineRequest r;
    r.prompt = make_prompt(100, 3);
    r.pooling = pooling;
    for (uint64_t id = 1; id <= 2; ++id) {
      core.add(id, r, [&](const EngineEvent& ev) {
        ASSERT_EQ(ev.kind, EngineEvent::Kind::Finished);
        got.push_back(ev.embedding);
        cached.push_back(ev.timings->cached_tokens);
      });
      while (!core.idle()) ASSERT_TRUE(core.step());
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0], expected_embedding(r.prompt, pooling));
    EXPECT_EQ(got[1], got[0]);
    EXPECT_EQ(cached[0], 0);
    EXPECT_EQ(cached[1], pooling == Pooling::Last ? 96 : 0);
  }
}

TEST(EngineCoreEmbeddings, RefusesWhatSamplesAndTakesAWholeContext) {
  double clock = 0;
  FakeExecutor exec(&clock, CostModel{});
  KVCache kv({1, 1, 16, 4, true});  // exactly the context
  EngineCore core(kv, exec, SchedulerConfig{}, CostModel{}, 64, {}, [&] { return clock; });
  EngineRequest r;
  r.prompt = make_prompt(64, 1);  // the whole context and cache: nothing is generated after it
  r.pooling = Pooling::Mean;
  r.max_tokens = 0;
  EXPECT_NO_THROW(core.validate(r));
  std::vector<float> got;
  core.add(1, r, [&](const EngineEvent& ev) { got = ev.embedding; });
  for (int guard = 0; guard < 100 && !core.idle(); ++guard) ASSERT_TRUE(core.step());
  ASSERT_TRUE(core.idle()) << "a whole-context embedding was never admitted";
  EXPECT_EQ(got, expected_embedding(r.prompt, Pooling::Mean));
  for (int what = 0; what < 3; ++what) {
    EngineRequest b = r;
    if (what == 0) b.logprobs = 1;
    if (what == 1) b.prompt_logprobs = 0;
    if (what == 2) b.forks.push_back({});
    EXPECT_THROW(core.validate(b), Error) << what;
  }
  r.prompt = make_prompt(65, 1);
  EXPECT_THROW(core.validate(r), Error);
  MarkovExecutor markov;  // computes no hidden rows
  EngineCore other(kv, markov, SchedulerConfig{}, CostModel{}, 64, {}, [&] { return clock; });
  r.prompt = {1, 2, 3};
  try {
    other.validate(r);
    ADD_FAILURE() << "an embedding on an executor without hidden rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no embeddings"), std::string::npos) << e.what();
  }
  r.pooling = Pooling::None;
  r.max_tokens = 1;
  EXPECT_NO_THROW(other.validate(r));
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
  // A NaN logit is no candidate (as for the sampler): the others' logprobs stay finite, without
  // it in the normalization (it made every logprob NaN).
  struct NanBesideTheTop : LogitsProcessor {
    void apply(float* logits, int32_t n_vocab, int64_t) override {
      const int32_t top = int32_t(std::max_element(logits, logits + n_vocab) - logits);
      logits[(top + 1) % n_vocab] = std::nanf("");
    }
    void accept(int32_t) override {}
  };
  r.logprobs = 3;
  r.logits_processor = std::make_shared<NanBesideTheTop>();
  events.clear();
  core.add(3, r, [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Token) events.push_back(ev);
  });
  while (core.step()) {
  }
  ASSERT_EQ(events.size(), 5u);
  const double want_nan = 1.0 - std::log(std::exp(1.0) + (kVocab - 2));
  for (const auto& ev : events) {
    EXPECT_NEAR(ev.logprob, want_nan, 1e-5);
    ASSERT_EQ(ev.top_logprobs.size(), 3u);
    EXPECT_NEAR(ev.top_logprobs[0].second, want_nan, 1e-5);
  }
}

// A model with a padded vocabulary: rows of 12 logits, of which only ids [0, 8) are tokens. The
// padding rows get the highest logits; a sequence whose first prompt token is 0 gets NaN
// everywhere (a broken row).
class PaddedExecutor : public StepExecutor {
 public:
  static constexpr int32_t kRow = 12, kTokens = 8;
  void forward(const Batch& b, KVCache& kv, float* logits, float*) override {
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

// A step whose forward throws (a kernel's failure, out of memory) fails the requests it ran,
// through fail_running as the engine thread calls it; a request still waiting for a slot is not
// failed with them and completes when the forward works again.
TEST(EngineCore, AFailedStepFailsOnlyTheRequestsItRan) {
  struct Throwing : PaddedExecutor {
    bool fail = true;
    void forward(const Batch& b, KVCache& kv, float* logits, float* hidden) override {
      if (fail) throw std::runtime_error("kernel failure");
      PaddedExecutor::forward(b, kv, logits, hidden);
    }
  } exec;
  KVCache kv({1, 1, 16, 64, true});
  SchedulerConfig cfg;
  cfg.max_num_seqs = 1;
  EngineCore core(kv, exec, cfg, CostModel{}, 1000, {}, [] { return 0.0; });
  std::map<uint64_t, EngineEvent> finished;
  auto cb = [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Finished) finished[ev.id] = ev;
  };
  EngineRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 4;
  core.add(1, r, cb);
  core.add(2, r, cb);
  try {
    core.step();
    ADD_FAILURE() << "the step did not throw";
  } catch (const std::runtime_error&) {
    core.fail_running("generation failed: kernel failure");
  }
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[1].reason, FinishReason::Error);
  EXPECT_EQ(kv.used_blocks(), 0);
  exec.fail = false;
  while (core.step()) {
  }
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(finished[2].reason, FinishReason::Length);
  EXPECT_EQ(finished[2].n_generated, 4);
  EXPECT_TRUE(core.idle());
}

// ---- n > 1 choices: forks of one prefill (EngineRequest::forks) -------------------------------

// Forces one token: every row's logits -inf but `token`'s.
class ForceToken : public LogitsProcessor {
 public:
  explicit ForceToken(int32_t token) : token_(token) {}
  void apply(float* logits, int32_t n_vocab, int64_t) override {
    for (int32_t t = 0; t < n_vocab; ++t) logits[t] = t == token_ ? 0.0f : -INFINITY;
  }
  void accept(int32_t) override {}

 private:
  int32_t token_;
};

struct ChoicesRun {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  std::map<uint64_t, FinishReason> reasons;
  EngineCounters counters;
  int32_t kv_used_after = 0;
};

struct ChoicesSetup {
  bool forked = true;           // one request with n - 1 forks; false: n separate requests
  bool prefix_caching = false;
  double temperature = 0;
  int32_t kv_blocks = 64;
  SchedulerConfig cfg;
  SpecConfig spec;
  int window = 0;
  int32_t forced_choice = -1;   // this choice's tokens are forced (its own LogitsProcessor)
  int64_t max_tokens = 20;
};

// n choices of one prompt, choice i seeded 7 + i (ids 1..n); runs until idle.
ChoicesRun run_choices(const std::vector<int32_t>& prompt, int32_t n, const ChoicesSetup& su) {
  double clock = 0;
  const CostModel cost{5.0, 0.1, 1e-5};
  FakeExecutor exec(&clock, cost, su.window);
  KVCache kv({1, 1, 16, su.kv_blocks, su.prefix_caching});
  EngineCore core(kv, exec, su.cfg, cost, 1 << 20, {}, [&] { return clock; });
  core.set_speculation(su.spec, nullptr);
  ChoicesRun res;
  auto cb = [&res](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Token) res.outputs[ev.id].push_back(ev.token);
    else res.reasons[ev.id] = ev.reason;
  };
  auto processor = [&](int32_t i) -> std::shared_ptr<LogitsProcessor> {
    return i == su.forced_choice ? std::make_shared<ForceToken>(3) : nullptr;
  };
  EngineRequest r;
  r.prompt = prompt;
  r.max_tokens = su.max_tokens;
  r.sampling.temperature = float(su.temperature);
  r.sampling.seed = 7;
  r.logits_processor = processor(0);
  if (su.forked) {
    for (int32_t i = 1; i < n; ++i) r.forks.push_back({7 + uint64_t(i), processor(i), cb});
    core.add(1, r, cb);
  } else {
    for (int32_t i = 0; i < n; ++i) {
      EngineRequest q = r;
      q.sampling.seed = 7 + uint64_t(i);
      q.logits_processor = processor(i);
      core.add(1 + uint64_t(i), q, cb);
    }
  }
  for (int guard = 0; guard < 100000 && core.step(); ++guard) EXPECT_LE(kv.used_blocks(), kv.total_blocks());
  EXPECT_TRUE(core.idle());
  res.counters = core.counters();
  res.kv_used_after = kv.used_blocks();
  return res;
}

// The prompt is computed once (prefill_tokens = its length), with or without the prefix cache,
// whatever its last block holds (partial: copied; full: nothing to copy); every greedy choice
// is the single answer, read through its own block table; a choice's own processor applies to
// it alone.
TEST(EngineCoreForks, OnePrefillAndEveryGreedyChoiceIsTheSingleAnswer) {
  for (const bool prefix : {false, true}) {
    for (const int64_t P : {40, 48, 5}) {
      SCOPED_TRACE(testing::Message() << "prefix caching " << prefix << ", prompt " << P);
      const auto prompt = make_prompt(P, int(P));
      ChoicesSetup su;
      su.prefix_caching = prefix;
      su.forced_choice = 2;
      const ChoicesRun res = run_choices(prompt, 4, su);
      EXPECT_EQ(res.counters.prefill_tokens, uint64_t(P));
      EXPECT_EQ(res.counters.prompt_tokens, uint64_t(P));  // (one request's prompt, as its usage says)
      EXPECT_EQ(res.counters.forks, 3u);
      ASSERT_EQ(res.outputs.size(), 4u);
      for (uint64_t id : {1, 2, 4}) {
        EXPECT_EQ(res.outputs.at(id), expected_output(prompt, 20)) << "choice " << id - 1;
        EXPECT_EQ(res.reasons.at(id), FinishReason::Length);
      }
      EXPECT_EQ(res.outputs.at(3), std::vector<int32_t>(20, 3));
      EXPECT_EQ(res.kv_used_after, 0);
      su.forked = false;  // the same choices as separate requests: a prefill each (no prefix cache)
      const ChoicesRun sep = run_choices(prompt, 4, su);
      EXPECT_EQ(sep.outputs, res.outputs);
      EXPECT_EQ(sep.counters.prompt_tokens, 4 * uint64_t(P));
      if (!prefix) {
        EXPECT_EQ(sep.counters.prefill_tokens, 4 * uint64_t(P));
      }
    }
  }
}

// Choice i samples its first token from the shared prompt logits with seed 7 + i, then decodes
// on its own: exactly the single request seeded 7 + i.
TEST(EngineCoreForks, SampledChoicesAreTheSingleRequestsWithSeedPlusI) {
  const auto prompt = make_prompt(37, 3);
  ChoicesSetup su;
  su.temperature = 1;
  const ChoicesRun forked = run_choices(prompt, 5, su);
  su.forked = false;
  const ChoicesRun sep = run_choices(prompt, 5, su);
  EXPECT_EQ(forked.outputs, sep.outputs);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, out] : forked.outputs) distinct.insert(out);
  EXPECT_GE(distinct.size(), 4u);
  EXPECT_EQ(forked.counters.prefill_tokens, 37u);
}

// No room at the first token (max_num_seqs, or no free block for the copy): a fork waits and
// recomputes, like a preempted request; KV pressure preempts forks sharing blocks. Outputs stay
// exact, nothing leaks. Prompt-lookup speculation on forks: drafts rolled back, outputs exact.
TEST(EngineCoreForks, NoRoomRecomputesAndSpeculationStaysExact) {
  const auto prompt = make_prompt(40, 5);
  const auto want = expected_output(prompt, 20);
  auto expect_exact = [&](const ChoicesRun& res, int32_t n) {
    ASSERT_EQ(res.outputs.size(), size_t(n));
    for (const auto& [id, out] : res.outputs) EXPECT_EQ(out, want) << "choice " << id - 1;
    EXPECT_EQ(res.kv_used_after, 0);
  };
  ChoicesSetup seqs;
  seqs.cfg.max_num_seqs = 2;
  const ChoicesRun capped = run_choices(prompt, 4, seqs);
  expect_exact(capped, 4);
  EXPECT_GT(capped.counters.prefill_tokens, 40u);  // two forks recomputed
  for (const bool prefix : {false, true}) {
    ChoicesSetup tight;
    tight.prefix_caching = prefix;
    tight.kv_blocks = 8;  // 4 choices of 60 positions need 10 blocks even sharing the 2 full ones
    const ChoicesRun res = run_choices(prompt, 4, tight);
    expect_exact(res, 4);
    EXPECT_GT(res.counters.preemptions, 0u);
  }
  ChoicesSetup spec;
  spec.spec = ngram_spec(3);
  spec.window = 1;  // the output cycles: drafts hold, and some are rejected
  spec.max_tokens = 40;
  const ChoicesRun sp = run_choices(prompt, 3, spec);
  ASSERT_EQ(sp.outputs.size(), 3u);
  for (const auto& [id, out] : sp.outputs) EXPECT_EQ(out, expected_output(prompt, 40, 1)) << id;
  EXPECT_GT(sp.counters.spec_accepted_tokens, 0u);
  EXPECT_EQ(sp.counters.prefill_tokens, 40u);
  EXPECT_EQ(sp.kv_used_after, 0);
}

// Before the first token: a fork cancelled finishes alone; the request cancelled finishes its
// forks too; a fork's id is taken.
TEST(EngineCoreForks, PendingForksCancelAloneOrWithTheirRequest) {
  double clock = 0;
  const CostModel cost{5.0, 0.1, 1e-5};
  FakeExecutor exec(&clock, cost);
  KVCache kv({1, 1, 16, 64, false});
  SchedulerConfig cfg;
  cfg.chunk_size = 16;  // a 40-token prompt takes 3 steps
  EngineCore core(kv, exec, cfg, cost, 1 << 20, {}, [&] { return clock; });
  std::map<uint64_t, FinishReason> reasons;
  std::map<uint64_t, int> tokens;
  auto cb = [&](const EngineEvent& ev) {
    if (ev.kind == EngineEvent::Kind::Token) ++tokens[ev.id];
    else reasons[ev.id] = ev.reason;
  };
  EngineRequest r;
  r.prompt = make_prompt(40, 1);
  r.max_tokens = 5;
  r.forks = {{1, nullptr, cb}, {2, nullptr, cb}};
  core.add(10, r, cb);
  EXPECT_THROW(core.add(12, r, cb), Error);  // 12 is a fork's
  ASSERT_TRUE(core.step());
  core.cancel(12);
  EXPECT_EQ(reasons.at(12), FinishReason::Cancelled);
  while (core.step()) {
  }
  EXPECT_EQ(reasons.at(10), FinishReason::Length);
  EXPECT_EQ(reasons.at(11), FinishReason::Length);
  EXPECT_EQ(tokens[11], 5);
  EXPECT_EQ(tokens.count(12), 0u);
  EXPECT_EQ(core.counters().forks, 1u);
  reasons.clear();
  core.add(20, r, cb);
  ASSERT_TRUE(core.step());
  core.cancel(20);
  EXPECT_EQ(reasons.size(), 3u);
  for (uint64_t id : {20, 21, 22}) EXPECT_EQ(reasons.at(id), FinishReason::Cancelled);
  EXPECT_TRUE(core.idle());
  EXPECT_EQ(kv.used_blocks(), 0);
}

}  // namespace
}  // namespace ft
