// The serving engine on real models: concurrent requests give exactly what each gives alone,
// whatever the chunking; cancel frees KV; prefix-cache hits change nothing; running out of KV
// preempts and still finishes everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <sys/resource.h>
#include <unistd.h>

#include "core/error.h"
#include "engine/engine.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace ft {
namespace {

struct Job {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::Stop;
  RequestTimings timings;
};

EngineConfig config(int64_t chunk, bool prefix_caching = true, uint64_t kv_bytes = 0,
                    GGMLType kv_type = RuntimeConfig{}.kv_type) {
  EngineConfig c;
  c.runtime.threads = 2;
  c.runtime.kv_type = kv_type;
  c.scheduler.chunk_size = chunk;
  c.scheduler.step_latency_target_ms = 5;  // small, so auto mode really chunks on these models
  c.prefix_caching = prefix_caching;
  c.kv_memory_bytes = kv_bytes;
  c.calibrate = chunk < 0;
  return c;
}

// Submits every job at once (concurrent: gap apart) or one after another (alone), greedy.
std::vector<Outcome> run_jobs(Engine& engine, const std::vector<Job>& jobs, bool concurrent,
                              std::chrono::microseconds gap = {}) {
  std::vector<Outcome> out(jobs.size());
  std::vector<EventStream> streams(jobs.size());
  auto submit = [&](size_t i) {
    EngineRequest r;
    r.prompt = jobs[i].prompt;
    r.max_tokens = jobs[i].max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r), streams[i].callback());
  };
  auto drain = [&](size_t i) {
    EngineEvent ev;
    while (streams[i].next(ev, &out[i].timings)) {
      if (ev.kind == EngineEvent::Kind::Token) out[i].tokens.push_back(ev.token);
      else out[i].reason = ev.reason;
    }
  };
  if (concurrent) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      submit(i);
      if (gap.count() > 0) std::this_thread::sleep_for(gap);
    }
    for (size_t i = 0; i < jobs.size(); ++i) drain(i);
  } else {
    for (size_t i = 0; i < jobs.size(); ++i) {
      submit(i);
      drain(i);
    }
  }
  return out;
}

std::vector<Job> mixed_jobs(int32_t n_vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Job> jobs;
  for (int k = 0; k < n; ++k) {
    const int64_t len = k == 0 ? 1 : k == 1 ? 500 : 1 + int64_t(rng() % 500);
    Job j;
    j.prompt.push_back(1);  // BOS
    for (int64_t i = 1; i < len; ++i) j.prompt.push_back(int32_t(3 + rng() % uint32_t(n_vocab - 3)));
    j.max_tokens = 4 + int64_t(rng() % 12);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// Metrics once the engine has refreshed its snapshot after the last finish (events are delivered
// during a step, the snapshot is taken after it).
EngineMetrics settled_metrics(const Engine& engine, uint64_t finished) {
  EngineMetrics m = engine.metrics();
  for (int i = 0; i < 400 && (m.counters.finished < finished || m.running + m.waiting > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = engine.metrics();
  }
  return m;
}

void expect_same_tokens(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].reason, FinishReason::Length) << "request " << i;
  }
}

class ConcurrentEqualsAlone : public ::testing::TestWithParam<int64_t> {};

TEST_P(ConcurrentEqualsAlone, Stories260K) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const auto jobs = mixed_jobs(model->hparams().n_vocab, 16, 7);
  Engine alone_engine(*model, config(256), {});
  const auto alone = run_jobs(alone_engine, jobs, false);
  Engine engine(*model, config(GetParam()), {});
  expect_same_tokens(run_jobs(engine, jobs, true), alone);
  const EngineMetrics m = settled_metrics(engine, jobs.size());
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_EQ(m.counters.finished, jobs.size());
}

// A synthetic Q8_0 model of opt (type and file set here): n_jobs mixed requests, concurrent at
// chunk size `chunk`, get the tokens each gets alone.
void expect_synthetic_concurrent_equals_alone(SyntheticOptions opt, int n_jobs, int64_t chunk) {
  SCOPED_TRACE(opt.arch);
  const std::string path = testing::TempDir() + "ft_engine_" + opt.arch + "_" + std::to_string(getpid()) + ".gguf";
  opt.type = GGMLType::Q8_0;
  write_synthetic_model(opt, path);
  const auto model = Model::load(path);
  const auto jobs = mixed_jobs(model->hparams().n_vocab, n_jobs, 9);
  Engine alone_engine(*model, config(256), {});
  const auto alone = run_jobs(alone_engine, jobs, false);
  Engine engine(*model, config(chunk), {});
  expect_same_tokens(run_jobs(engine, jobs, true), alone);
  std::filesystem::remove(path);
}

TEST_P(ConcurrentEqualsAlone, SyntheticQwen2Q8) {
  SyntheticOptions opt;
  opt.arch = "qwen2";
  opt.seed = 11;
  expect_synthetic_concurrent_equals_alone(opt, 16, GetParam());
}

// The newer architectures through the scheduler: a mixture of experts (8 experts, 2 a token:
// rows of other requests in a batch must not change a row's experts or their sum) and Gemma 3's
// window pattern (window 8, 7 layers: layer 5 global) with chunked, concurrent prefill.
TEST_P(ConcurrentEqualsAlone, SyntheticQwen3MoeAndGemma3) {
  SyntheticOptions moe;
  moe.arch = "qwen3moe";
  moe.seed = 13;
  moe.n_experts = 8;
  expect_synthetic_concurrent_equals_alone(moe, 12, GetParam());
  SyntheticOptions gemma3;
  gemma3.arch = "gemma3";
  gemma3.seed = 13;
  gemma3.n_layers = 7;
  gemma3.sliding_window = 8;
  expect_synthetic_concurrent_equals_alone(gemma3, 12, GetParam());
}

INSTANTIATE_TEST_SUITE_P(ChunkSizes, ConcurrentEqualsAlone, ::testing::Values(-1, 0, 7, 64, 256),
                         [](const auto& info) {
                           return info.param < 0 ? std::string("auto") : "chunk" + std::to_string(info.param);
                         });

TEST(Engine, CancelFreesAllBlocks) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  Engine engine(*model, config(64), {});
  EventStream s;
  EngineRequest r;
  r.prompt = mixed_jobs(model->hparams().n_vocab, 2, 3)[1].prompt;  // 500 tokens
  r.max_tokens = 1000;
  r.ignore_eos = true;
  const uint64_t id = engine.submit(r, s.callback());
  EngineEvent ev;
  int tokens = 0;
  while (s.next(ev)) {
    if (ev.kind == EngineEvent::Kind::Token && ++tokens == 3) {
      EXPECT_GT(engine.metrics().kv_used_blocks, 0);
      engine.cancel(id);
    }
    if (ev.kind == EngineEvent::Kind::Finished) {
      EXPECT_EQ(ev.reason, FinishReason::Cancelled);
    }
  }
  EXPECT_GE(tokens, 3);
  EXPECT_LT(tokens, 1000);
  const EngineMetrics m = settled_metrics(engine, 1);
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_EQ(m.counters.cancelled, 1u);
}

// Short prompts submitted while a long prompt's step runs go between the blocks of that step
// (the engine takes them in there: EngineCore::between_blocks, on a Forward of their own), and
// every request still gets exactly what it gets alone.
TEST(Engine, ShortPromptsRunBetweenTheBlocksOfALongStep) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const int32_t V = model->hparams().n_vocab;
  std::vector<Job> jobs = {mixed_jobs(V, 2, 5)[1]};  // 500 tokens
  jobs[0].max_tokens = 16;
  std::mt19937 rng(3);
  for (int k = 0; k < 40; ++k) {
    Job j{{1}, 3};
    for (int i = 0; i < 4; ++i) j.prompt.push_back(int32_t(3 + rng() % uint32_t(V - 3)));
    jobs.push_back(std::move(j));
  }
  Engine alone_engine(*model, config(256), {});
  const auto alone = run_jobs(alone_engine, jobs, false);
  // A loaded machine may run the long step before the shorts arrive: up to 5 rounds, each on an
  // engine of its own (unchunked: the long prompt in one step; not from the prefix cache).
  EngineMetrics m;
  for (int round = 0; round < 5 && m.counters.between_steps == 0; ++round) {
    Engine engine(*model, config(0), {});
    expect_same_tokens(run_jobs(engine, jobs, true, std::chrono::microseconds(100)), alone);
    m = settled_metrics(engine, jobs.size());
    EXPECT_EQ(m.kv_used_blocks, 0);
  }
  EXPECT_GT(m.counters.between_steps, 0u);
}

// Prefix caching, preemption and chunked prefill, per KV cache type.
class KvTypes : public ::testing::TestWithParam<GGMLType> {};

TEST_P(KvTypes, ChunkedConcurrentEqualsAlone) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const auto jobs = mixed_jobs(model->hparams().n_vocab, 8, 17);
  Engine alone_engine(*model, config(256, true, 0, GetParam()), {});
  const auto alone = run_jobs(alone_engine, jobs, false);
  Engine engine(*model, config(7, true, 0, GetParam()), {});
  expect_same_tokens(run_jobs(engine, jobs, true), alone);
}

TEST_P(KvTypes, PrefixCacheHitGivesTheSameOutput) {
  const GGMLType kv_type = GetParam();
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const auto base = mixed_jobs(model->hparams().n_vocab, 2, 5)[1].prompt;  // 500 tokens
  std::vector<Job> jobs;
  for (int k = 0; k < 3; ++k) {
    Job j{std::vector<int32_t>(base.begin(), base.begin() + 300), 12};
    j.prompt.insert(j.prompt.end(), base.begin() + 300 + 20 * k, base.begin() + 320 + 20 * k);
    jobs.push_back(j);
  }
  Engine cached(*model, config(64, true, 0, kv_type), {});
  Engine plain(*model, config(64, false, 0, kv_type), {});
  const auto a = run_jobs(cached, jobs, false);
  const auto b = run_jobs(plain, jobs, false);
  expect_same_tokens(a, b);
  EXPECT_EQ(a[0].timings.cached_tokens, 0);
  EXPECT_EQ(a[1].timings.cached_tokens, 288);  // 18 full blocks of the shared 300 tokens
  EXPECT_EQ(a[2].timings.cached_tokens, 288);
  EXPECT_EQ(b[1].timings.cached_tokens, 0);
  EXPECT_GT(cached.metrics().kv.prefix_hit_tokens, 0u);
}

TEST_P(KvTypes, RunningOutOfKVPreemptsAndFinishesEverything) {
  const GGMLType kv_type = GetParam();
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  std::vector<Job> jobs = mixed_jobs(model->hparams().n_vocab, 8, 13);
  for (auto& j : jobs) {
    j.prompt.resize(std::min<size_t>(j.prompt.size(), 60));
    j.max_tokens = 80;
  }
  const EngineConfig big_cfg = config(64, true, 0, kv_type);
  const uint64_t block = KVCache::block_bytes(kv_cache_config(big_cfg.runtime, model->hparams(), 0, true));
  Engine big(*model, big_cfg, {});
  const auto alone = run_jobs(big, jobs, false);
  Engine small(*model, config(64, true, 24 * block, kv_type), {});  // 8 requests x up to 9 blocks > 24
  EXPECT_EQ(small.metrics().kv_total_blocks, 24);
  expect_same_tokens(run_jobs(small, jobs, true), alone);
  const EngineMetrics m = settled_metrics(small, jobs.size());
  EXPECT_GT(m.counters.preemptions, 0u);
  EXPECT_EQ(m.kv_used_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Engine, KvTypes,
                         ::testing::Values(GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0, GGMLType::F32),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

// Capacity users can see: the same memory holds 2x the tokens in f16 or bf16 as in f32, and in
// q8_0 32/12 x on this model (heads of 8: one f32 scale per 8 int8 values, 12 bytes per head row
// instead of 32; 3.56x on heads of 64).
// Sliding-window models (../shared/models/extra) through the engine: the reference's greedy
// continuation (past the window) from concurrent, 7-token-chunked prefills, and prefix-cache hits
// on prompts much longer than the window change nothing.
class WindowedModels : public ::testing::TestWithParam<const char*> {};

TEST_P(WindowedModels, GoldenGreedyChunkedAndPrefixCache) {
  const std::string name = GetParam();
  FT_REQUIRE_SHARED(golden_path, "models/extra/" + name + ".golden.json");
  FT_REQUIRE_SHARED(path, "models/extra/" + name + ".gguf");
  const auto model = Model::load(path);
  ASSERT_GT(model->hparams().sliding_window, 0);
  const auto doc = nlohmann::json::parse(test::read_file(golden_path));
  std::vector<Job> golden;
  for (const auto& c : doc["cases"])
    golden.push_back({c["prompt_tokens"].get<std::vector<int32_t>>(), int64_t(c["greedy_tokens"].size())});
  Engine chunked(*model, config(7), {});
  const auto got = run_jobs(chunked, golden, true);
  for (size_t i = 0; i < golden.size(); ++i)
    EXPECT_EQ(got[i].tokens, doc["cases"][i]["greedy_tokens"].get<std::vector<int32_t>>()) << "case " << i;

  const auto base = mixed_jobs(model->hparams().n_vocab, 2, 5)[1].prompt;  // 500 tokens
  std::vector<Job> jobs;
  for (int k = 0; k < 3; ++k) {
    Job j{std::vector<int32_t>(base.begin(), base.begin() + 100), 12};
    j.prompt.insert(j.prompt.end(), base.begin() + 100 + 20 * k, base.begin() + 120 + 20 * k);
    jobs.push_back(j);
  }
  Engine cached(*model, config(16, true), {});
  Engine plain(*model, config(16, false), {});
  const auto a = run_jobs(cached, jobs, false);
  expect_same_tokens(a, run_jobs(plain, jobs, false));
  EXPECT_GT(a[1].timings.cached_tokens, 2 * model->hparams().sliding_window);
}

INSTANTIATE_TEST_SUITE_P(Extra, WindowedModels, ::testing::Values("synth-gemma2-f32", "synth-phi3-f16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

TEST(Engine, KvCapacityPerType) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  auto capacity = [&](GGMLType t) {
    Engine e(*model, config(64, true, 8u << 20, t), {});
    const EngineMetrics m = e.metrics();
    EXPECT_LE(m.kv_bytes, 8u << 20);
    EXPECT_EQ(m.kv_capacity_tokens, int64_t(m.kv_total_blocks) * 16);
    EXPECT_NE(e.kv_summary().find(cat(m.kv_capacity_tokens, " tokens (", m.kv_bytes >> 20, " MiB, ", kv_type_name(t),
                                      ", 16-token blocks)")),
              std::string::npos)
        << e.kv_summary();
    return double(m.kv_capacity_tokens);
  };
  const double f32 = capacity(GGMLType::F32);
  EXPECT_NEAR(capacity(GGMLType::F16) / f32, 2.0, 0.01);
  EXPECT_NEAR(capacity(GGMLType::BF16) / f32, 2.0, 0.01);
  EXPECT_NEAR(capacity(GGMLType::Q8_0) / f32, 32.0 / 12.0, 0.01);
}

// VmLck of this process (KiB), from /proc/self/status; -1 where there is none.
int64_t locked_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// --mlock: the weights the forward pass reads are pinned (VmLck grows by at least their bytes:
// packed copies hold as many bytes as the file's matrices), or, where the OS refuses, the engine
// runs and says why. Off by default.
TEST(Engine, MlockPinsTheWeightsOrSaysWhy) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  EngineConfig c = config(64, true, 8u << 20, GGMLType::F16);
  EXPECT_EQ(Engine(*model, c, {}).weights_summary(), "");
  c.runtime.mlock = true;
  const int64_t before = locked_kib();
  if (before < 0) GTEST_SKIP() << "no VmLck in /proc/self/status";
  {
    Engine e(*model, c, {});
    const std::string& s = e.weights_summary();
    if (s.rfind("weights locked in RAM (mlock): ", 0) == 0) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // (their mlock interceptors do nothing)
      EXPECT_GE((locked_kib() - before) * 1024, int64_t(model->weight_bytes())) << s;
#endif
    } else {
      EXPECT_NE(s.find("RLIMIT_MEMLOCK"), std::string::npos) << s;
    }
    const auto out = run_jobs(e, {Job{{1, 2, 3}, 4}}, false);
    EXPECT_EQ(out[0].tokens.size(), 4u);
  }
  if (geteuid() != 0) {  // (root has CAP_IPC_LOCK: no limit applies to it)
    struct rlimit old {}, zero {0, 0};
    ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &old), 0);
    zero.rlim_max = old.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &zero), 0);
    Engine e(*model, c, {});
    setrlimit(RLIMIT_MEMLOCK, &old);
    EXPECT_NE(e.weights_summary().find("RLIMIT_MEMLOCK"), std::string::npos) << e.weights_summary();
  }
}

TEST(Engine, RejectsWhatCanNeverFit) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  EngineConfig c = config(64);
  c.runtime.n_ctx = 256;
  Engine engine(*model, c, {});
  EngineRequest r;
  r.prompt = std::vector<int32_t>(200, 5);
  r.max_tokens = 100;
  EXPECT_THROW(engine.submit(r, {}), Error);
  r.max_tokens = 10;
  r.prompt[3] = 100000;
  EXPECT_THROW(engine.submit(r, {}), Error);
  r.prompt[3] = 5;
  r.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(r, {}), Error);
}

// Prompt logprobs (the completions API's echo with logprobs) are the model's own scoring: each
// prompt token's logprob and top alternatives equal a direct forward over the whole prompt
// (log-softmax of the row before it), however the engine chunks it (cut to kPromptLogprobsRows per
// step), and a prompt whose blocks are cached is still scored whole (no prefix cache for it).
TEST(Engine, PromptLogprobsMatchADirectForward) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const HParams& hp = model->hparams();
  std::vector<int32_t> prompt = mixed_jobs(hp.n_vocab, 2, 21)[1].prompt;
  prompt.resize(size_t(2 * kPromptLogprobsRows + 22));  // three scored chunks at least
  const int64_t P = int64_t(prompt.size());
  constexpr int32_t kTop = 3;

  // The direct forward: one batch, logits at every position.
  const EngineConfig base = config(256);
  auto be = make_backend(base.runtime.backend, 2);
  Forward fwd(*model, *be, P);
  KVCache kv(kv_cache_config(base.runtime, hp, KVCache::blocks_for(P, base.runtime.kv_block_size), false));
  ASSERT_TRUE(kv.reserve(0, P));
  Batch b;
  for (int64_t i = 0; i < P; ++i) b.add(prompt[size_t(i)], int32_t(i), 0, true);
  std::vector<float> logits(size_t(P) * size_t(hp.n_vocab));
  fwd.run(b, kv, logits.data());
  std::vector<std::vector<float>> want(static_cast<size_t>(P));  // log-softmax of each row
  for (int64_t i = 0; i < P; ++i) {
    const float* row = logits.data() + i * hp.n_vocab;
    const float mx = *std::max_element(row, row + hp.n_tokens);
    double sum = 0;
    for (int32_t v = 0; v < hp.n_tokens; ++v) sum += std::exp(double(row[v] - mx));
    for (int32_t v = 0; v < hp.n_tokens; ++v) want[size_t(i)].push_back(row[v] - mx - float(std::log(sum)));
  }

  for (const int64_t chunk : {int64_t(256), int64_t(7)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    Engine engine(*model, config(chunk), {});
    auto run = [&](int32_t prompt_logprobs, RequestTimings* t) {
      EngineRequest r;
      r.prompt = prompt;
      r.max_tokens = 2;
      r.sampling.temperature = 0;
      r.prompt_logprobs = prompt_logprobs;
      EventStream s;
      engine.submit(std::move(r), s.callback());
      EngineEvent ev;
      std::vector<TokenLogprobs> got;
      int tokens = 0;
      while (s.next(ev, t))
        if (ev.kind == EngineEvent::Kind::Token) {
          if (tokens++ == 0) got = ev.prompt_logprobs;
          else EXPECT_TRUE(ev.prompt_logprobs.empty());  // the first token's alone
        }
      return got;
    };
    RequestTimings t;
    EXPECT_TRUE(run(-1, &t).empty());  // not asked: none (and the prompt's blocks are cached now)
    const std::vector<TokenLogprobs> got = run(kTop, &t);
    EXPECT_EQ(t.cached_tokens, 0);
    ASSERT_EQ(int64_t(got.size()), P - 1);
    for (int64_t k = 0; k + 1 < P; ++k) {
      const std::vector<float>& w = want[size_t(k)];  // row k predicts token k + 1
      const TokenLogprobs& g = got[size_t(k)];
      ASSERT_EQ(g.token, prompt[size_t(k + 1)]) << k;
      EXPECT_NEAR(g.logprob, w[size_t(g.token)], 2e-3) << "position " << k + 1;
      std::vector<float> best = w;
      std::partial_sort(best.begin(), best.begin() + kTop, best.end(), std::greater<float>());
      ASSERT_EQ(g.top.size(), size_t(kTop)) << k;
      for (int32_t j = 0; j < kTop; ++j) {
        EXPECT_NEAR(g.top[size_t(j)].second, best[size_t(j)], 2e-3) << "position " << k + 1 << " top " << j;
        EXPECT_NEAR(w[size_t(g.top[size_t(j)].first)], g.top[size_t(j)].second, 2e-3) << k;
      }
    }
    const EngineMetrics m = settled_metrics(engine, 2);
    EXPECT_EQ(m.kv_used_blocks, 0);
  }
}

// One rule for every front end: a step holds a whole fixed chunk (unchunked: a whole context) and
// a decode token per sequence; `run`'s single-request engine asks for no more than that, with KV
// for exactly one context (at least the engine's minimum of blocks).
// Embeddings (EngineRequest::pooling) are the model's final-norm hidden states: a direct forward
// whose batch mixes logits, hidden and no-output rows gives each row what an all-logits or
// all-hidden batch gives it (the rows are gathered right), and the engine's pooled vector under any
// chunking, next to generations, equals the pooling of the direct forward's hidden rows.
TEST(Engine, EmbeddingsPoolTheHiddenStatesOfADirectForward) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const HParams& hp = model->hparams();
  const int64_t D = hp.dim, V = hp.n_vocab;
  std::vector<int32_t> prompt = mixed_jobs(hp.n_vocab, 2, 33)[1].prompt;
  prompt.resize(150);
  const int64_t P = int64_t(prompt.size());

  const EngineConfig base = config(256);
  auto be = make_backend(base.runtime.backend, 2);
  Forward fwd(*model, *be, P);
  // out[i]: what row i asks for (a fixed mix), then every row hidden, then every row logits.
  auto direct = [&](auto out_of, std::vector<float>& logits, std::vector<float>& hidden) {
    KVCache kv(kv_cache_config(base.runtime, hp, KVCache::blocks_for(P, base.runtime.kv_block_size), false));
    EXPECT_TRUE(kv.reserve(0, P));
    Batch b;
    int64_t nl = 0, nh = 0;
    for (int64_t i = 0; i < P; ++i) {
      const uint8_t o = out_of(i);
      b.add(prompt[size_t(i)], int32_t(i), 0, o);
      nl += o == kOutLogits;
      nh += o == kOutHidden;
    }
    logits.assign(size_t(nl * V), 0.0f);
    hidden.assign(size_t(nh * D), 0.0f);
    fwd.run(b, kv, logits.data(), hidden.data());
  };
  std::vector<float> all_logits, all_hidden, mixed_logits, mixed_hidden, unused;
  direct([](int64_t) { return kOutHidden; }, unused, all_hidden);
  direct([](int64_t) { return kOutLogits; }, all_logits, unused);
  auto mix = [](int64_t i) { return uint8_t(i % 5 == 0 ? kOutNone : i % 3 == 0 ? kOutLogits : kOutHidden); };
  direct(mix, mixed_logits, mixed_hidden);
  int64_t nl = 0, nh = 0;
  for (int64_t i = 0; i < P; ++i) {
    const uint8_t o = mix(i);
    for (int64_t d = 0; o == kOutHidden && d < D; ++d)
      ASSERT_NEAR(mixed_hidden[size_t(nh * D + d)], all_hidden[size_t(i * D + d)], 1e-4f) << "row " << i;
    for (int64_t v = 0; o == kOutLogits && v < V; ++v)
      ASSERT_NEAR(mixed_logits[size_t(nl * V + v)], all_logits[size_t(i * V + v)], 1e-4f) << "row " << i;
    nl += o == kOutLogits;
    nh += o == kOutHidden;
  }
  auto pooled = [&](Pooling p) {
    std::vector<double> sum(size_t(D), 0.0);
    const int64_t from = p == Pooling::Last ? P - 1 : 0, to = p == Pooling::Cls ? 1 : P;
    for (int64_t i = from; i < to; ++i)
      for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += all_hidden[size_t(i * D + d)];
    std::vector<float> v(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) v[size_t(d)] = float(sum[size_t(d)] / double(to - from));
    return v;
  };

  for (const int64_t chunk : {int64_t(256), int64_t(7)}) {
    Engine engine(*model, config(chunk), {});
    for (Pooling p : {Pooling::Mean, Pooling::Cls, Pooling::Last}) {
      SCOPED_TRACE(cat("chunk ", chunk, " pooling ", pooling_name(p)));
      EngineRequest g;  // a generation alongside
      g.prompt = std::vector<int32_t>(prompt.begin(), prompt.begin() + 40);
      g.max_tokens = 20;
      g.sampling.temperature = 0;
      EventStream gs;
      engine.submit(g, gs.callback());
      EngineRequest r;
      r.prompt = prompt;
      r.pooling = p;
      EventStream s;
      engine.submit(r, s.callback());
      EngineEvent ev;
      std::vector<float> got;
      bool token = false;
      while (s.next(ev)) {
        token |= ev.kind == EngineEvent::Kind::Token;
        if (ev.kind == EngineEvent::Kind::Finished) {
          EXPECT_EQ(ev.reason, FinishReason::Stop) << ev.error;
          got = ev.embedding;
        }
      }
      EXPECT_FALSE(token);
      int gen_tokens = 0;
      while (gs.next(ev)) gen_tokens += ev.kind == EngineEvent::Kind::Token;
      EXPECT_EQ(gen_tokens, 20);
      const std::vector<float> want = pooled(p);
      ASSERT_EQ(got.size(), want.size());
      for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(got[size_t(d)], want[size_t(d)], 1e-4f) << "dimension " << d;
    }
    EXPECT_EQ(settled_metrics(engine, 6).kv_used_blocks, 0);
  }
}

TEST(Engine, StepCapacityHoldsAChunkAndADecodePerSequence) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  EngineConfig c = config(600);
  c.runtime.n_ctx = 1024;
  c.scheduler.max_batch_tokens = 512;
  c.scheduler.max_num_seqs = 4;
  EXPECT_EQ(Engine(*model, c, {}).scheduler_config().max_batch_tokens, 604);
  c.scheduler.chunk_size = 0;
  EXPECT_EQ(Engine(*model, c, {}).scheduler_config().max_batch_tokens, 1028);
  c.scheduler.chunk_size = 8;
  EXPECT_EQ(Engine(*model, c, {}).scheduler_config().max_batch_tokens, 512);  // room enough: kept

  const EngineConfig one = single_request_config(*model, 256, 64, 2);
  EXPECT_EQ(Engine(*model, one, {}).scheduler_config().max_batch_tokens, 65);
  const uint64_t block = KVCache::block_bytes(kv_cache_config(one.runtime, model->hparams(), 0, false));
  EXPECT_EQ(one.kv_memory_bytes, 256 / 16 * block);
  EXPECT_EQ(single_request_config(*model, 4, 64, 2).kv_memory_bytes, 2 * one.kv_memory_bytes / 16);
  // A KV cache smaller than the context: the context served is what it holds (a request of the
  // rest of a larger one would never fit), and the warning says so.
  c = config(64, true, 8 * block);
  c.runtime.n_ctx = 1024;
  {
    Engine small(*model, c, {});
    EXPECT_EQ(small.n_ctx(), 8 * 16);
    EXPECT_NE(small.context_warning().find("fewer than the context of 1024"), std::string::npos) << small.context_warning();
  }
  c.scheduler.chunk_size = 0;  // unchunked: a step holds a whole context, the one served (not 1024)
  c.scheduler.max_batch_tokens = c.scheduler.max_num_seqs + 1;
  EXPECT_EQ(Engine(*model, c, {}).scheduler_config().max_batch_tokens, 8 * 16 + c.scheduler.max_num_seqs);
  c.scheduler = config(64).scheduler;
  c.runtime.n_ctx = 64;
  EXPECT_EQ(Engine(*model, c, {}).n_ctx(), 64);
  EXPECT_EQ(Engine(*model, c, {}).context_warning(), "");
  // A context the metadata may claim (2^24 positions: ~20 GiB of this model's KV) is capped like
  // serve's default, not allocated.
  const uint64_t capped = single_request_config(*model, int64_t(1) << 24, 64, 2).kv_memory_bytes;
  EXPECT_LE(capped, kDefaultMaxKvBytes);
  EXPECT_GT(capped, kDefaultMaxKvBytes - block);
}

// Sizes that overflowed are errors: positions past INT32_MAX KV blocks (int32 narrowing), a
// prompt chunk near INT64_MAX plus the sequences (signed overflow: a misleading message), a
// forward batch whose activations wrap 64 bits (a failure inside std::vector).
TEST(Engine, HugeSizesAreErrorsNotOverflows) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  EXPECT_EQ(KVCache::blocks_for(33, 16), 3);
  EXPECT_EQ(KVCache::blocks_for(int64_t(std::numeric_limits<int32_t>::max()) * 16, 16), std::numeric_limits<int32_t>::max());
  EXPECT_THROW(KVCache::blocks_for(int64_t(std::numeric_limits<int32_t>::max()) * 16 + 1, 16), Error);
  EXPECT_THROW(KVCache::blocks_for(std::numeric_limits<int64_t>::max(), 16), Error);
  auto be = make_backend(RuntimeConfig{}.backend, 1);
  EXPECT_THROW(Forward(*model, *be, int64_t(1) << 62), Error);
  try {
    Engine(*model, single_request_config(*model, 64, std::numeric_limits<int64_t>::max(), 1), {});
    ADD_FAILURE() << "an engine with a step of 2^63 tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward: a batch of 9223372036854775807 tokens"), std::string::npos) << e.what();
  }
}

// ---- speculative decoding -------------------------------------------------------------------

// Greedy output with speculation is the output without it, token for token, alone and batched
// (concurrent requests' decodes, drafts and prefill chunks in one forward), auto chunking.
void expect_speculation_exact(const Model& model, const SpecConfig& spec, const Model* draft, uint32_t seed) {
  auto jobs = mixed_jobs(model.hparams().n_tokens, 8, seed);
  for (Job& j : jobs) j.max_tokens = 40;
  Job rep;  // a repetitive prompt: prompt lookup has something to find at once
  for (int i = 0; i < 60; ++i) rep.prompt.push_back(int32_t(3 + (i % 7) * 5));
  rep.max_tokens = 40;
  jobs.push_back(rep);
  Engine plain(model, config(256), {});
  const auto want = run_jobs(plain, jobs, false);
  EngineConfig c = config(-1);
  c.spec = spec;
  c.draft_model = draft;
  Engine engine(model, c, {});
  expect_same_tokens(run_jobs(engine, jobs, false), want);
  expect_same_tokens(run_jobs(engine, jobs, true), want);
  const EngineMetrics m = settled_metrics(engine, 2 * jobs.size());
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_GT(m.counters.spec_draft_tokens, 0u);
  EXPECT_LE(m.counters.spec_accepted_tokens, m.counters.spec_draft_tokens);
  std::printf("[spec %s] %llu verifications, %llu of %llu draft tokens accepted\n", spec_method_name(spec.method),
              (unsigned long long)m.counters.spec_drafts, (unsigned long long)m.counters.spec_accepted_tokens,
              (unsigned long long)m.counters.spec_draft_tokens);
}

SpecConfig ngram(int32_t k, bool k_auto = false) {
  SpecConfig s;
  s.method = SpecMethod::Ngram;
  s.k = k;
  s.k_auto = k_auto;
  return s;
}

TEST(Speculation, NgramGreedyIsExactOnStories260K) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  expect_speculation_exact(*model, ngram(4), nullptr, 3);
  expect_speculation_exact(*model, ngram(8, true), nullptr, 4);
}

TEST(Speculation, NgramGreedyIsExactOnSyntheticModels) {
  FT_REQUIRE_SHARED(path, "models/synth-llama-q4_k_m.gguf");
  expect_speculation_exact(*Model::load(path), ngram(5), nullptr, 5);
  const std::string qpath = testing::TempDir() + "ft_spec_qwen2_q8_" + std::to_string(getpid()) + ".gguf";
  SyntheticOptions opt;
  opt.arch = "qwen2";
  opt.type = GGMLType::Q8_0;
  opt.seed = 11;
  write_synthetic_model(opt, qpath);
  expect_speculation_exact(*Model::load(qpath), ngram(3), nullptr, 6);
  std::filesystem::remove(qpath);
}

// A draft model: the same weights at Q8_0 (make-model --draft-out), its own KV cache.
// A synthetic F32 target and the same weights at Q8_0 as its draft (files removed at the end).
struct TargetAndDraft {
  std::string tpath, dpath;
  std::unique_ptr<Model> target, draft;
  explicit TargetAndDraft(uint64_t seed, const std::string& name)
      : tpath(testing::TempDir() + "ft_spec_" + name + "_target_" + std::to_string(getpid()) + ".gguf"),
        dpath(testing::TempDir() + "ft_spec_" + name + "_draft_" + std::to_string(getpid()) + ".gguf") {
    SyntheticOptions opt;
    opt.seed = seed;
    write_synthetic_model(opt, tpath);
    opt.type = GGMLType::Q8_0;
    write_synthetic_model(opt, dpath);
    target = Model::load(tpath);
    draft = load_draft_model(dpath, *target);
  }
  ~TargetAndDraft() {
    std::filesystem::remove(tpath);
    std::filesystem::remove(dpath);
  }
  SpecConfig spec() const {
    SpecConfig s;
    s.method = SpecMethod::Draft;
    s.draft_model = dpath;
    return s;
  }
};

TEST(Speculation, DraftModelGreedyIsExact) {
  const TargetAndDraft td(21, "greedy");
  const auto& target = td.target;
  const auto& draft = td.draft;
  SpecConfig s = td.spec();
  s.k = 4;
  expect_speculation_exact(*target, s, draft.get(), 8);
  s.k_auto = true;
  expect_speculation_exact(*target, s, draft.get(), 9);
  // Catching a 400-token prompt up for a 16-token answer would not pay (400 > 8 x 15): that
  // request never drafts; with a 64-token answer it does (its catch-up spread over the first
  // decode steps), and both stay exact.
  Job shortans;
  for (int i = 0; i < 400; ++i) shortans.prompt.push_back(int32_t(3 + (i * 37) % 200));
  shortans.max_tokens = 16;
  Job longans = shortans;
  longans.max_tokens = 64;
  s.k_auto = false;
  EngineConfig c = config(-1);
  c.spec = s;
  c.draft_model = draft.get();
  Engine plain(*target, config(256), {});
  Engine spec(*target, c, {});
  const auto want = run_jobs(plain, {shortans, longans}, false);
  const auto got = run_jobs(spec, {shortans, longans}, false);
  expect_same_tokens(got, want);
  EXPECT_EQ(got[0].timings.spec.draft_tokens, 0);
  EXPECT_GT(got[1].timings.spec.draft_tokens, 0);
  EXPECT_GT(got[1].timings.spec.accepted_tokens, 0);
  // Where the time went (SpecTimes): the 400-token prompt's catch-up (plus the target's tokens
  // sampled meanwhile) in more than one forward (at most 256 tokens each), drafts, verifications.
  const SpecTimes t = settled_metrics(spec, 2).counters.spec_times;
  EXPECT_GE(t.catch_up_tokens, 400);
  EXPECT_LE(t.catch_up_tokens, 400 + 64);
  EXPECT_GE(t.catch_up_forwards, 2);
  EXPECT_GT(t.catch_up_ms, 0);
  EXPECT_GT(t.draft_forwards, 0);
  EXPECT_GT(t.draft_forward_ms, 0);
  EXPECT_EQ(t.verify_steps, int64_t(got[1].timings.spec.drafts));
  EXPECT_GT(t.verify_forward_ms, 0);
  EXPECT_GT(t.plain_steps, 0);
}

// Seeded sampled requests (temperature 0.8): job i seeded seeds[i], with n_choices - 1 forks
// (seeded seed + 1, ...), beside `load` (greedy requests submitted first, all at once) or each
// alone. Returns every choice's tokens, job by job.
std::vector<std::vector<int32_t>> run_seeded(Engine& engine, const std::vector<Job>& jobs, const std::vector<uint64_t>& seeds,
                                             int n_choices, bool concurrent, const std::vector<Job>& load = {}) {
  std::vector<std::vector<int32_t>> out(jobs.size() * size_t(n_choices));
  std::vector<EventStream> streams(out.size()), load_streams(load.size());
  auto drain = [](EventStream& s, std::vector<int32_t>* tokens) {
    EngineEvent ev;
    while (s.next(ev))
      if (tokens && ev.kind == EngineEvent::Kind::Token) tokens->push_back(ev.token);
  };
  for (size_t i = 0; i < load.size(); ++i) {
    EngineRequest r;
    r.prompt = load[i].prompt;
    r.max_tokens = load[i].max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.submit(std::move(r), load_streams[i].callback());
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    EngineRequest r;
    r.prompt = jobs[i].prompt;
    r.max_tokens = jobs[i].max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = seeds[i];
    const size_t first = i * size_t(n_choices);
    for (int c = 1; c < n_choices; ++c) r.forks.push_back({seeds[i] + uint64_t(c), nullptr, streams[first + size_t(c)].callback()});
    engine.submit(std::move(r), streams[first].callback());
    if (!concurrent)
      for (int c = 0; c < n_choices; ++c) drain(streams[first + size_t(c)], &out[first + size_t(c)]);
  }
  if (concurrent)
    for (size_t i = 0; i < out.size(); ++i) drain(streams[i], &out[i]);
  for (EventStream& s : load_streams) drain(s, nullptr);
  return out;
}

// A sampled request's tokens are a function of its seed alone (README: same seed, same output;
// choice i of n is the n: 1 answer seeded seed + i): with speculation on they are the tokens of a
// run without it, whatever the drafts verified per step (k 1, 4, 8 auto; the draft allowance
// also shrinks with the other requests' load) and whoever shares the batch. Each position's
// random number is a function of (seed, position), and verification samples the target's token
// with it and compares (Sampler::verify): drafts no longer draw numbers of their own.
void expect_seeded_sampling_exact(const Model& target, SpecConfig spec, const Model* draft, std::vector<Job> jobs) {
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < jobs.size(); ++i) seeds.push_back(100 * i + 3);
  std::vector<uint64_t> all_seeds;  // every choice's seed, as an n: 1 request
  std::vector<Job> all_jobs;
  for (size_t i = 0; i < jobs.size(); ++i)
    for (uint64_t c = 0; c < 3; ++c) {
      all_seeds.push_back(seeds[i] + c);
      all_jobs.push_back(jobs[i]);
    }
  Engine plain(target, config(256), {});
  const auto want = run_seeded(plain, all_jobs, all_seeds, 1, false);
  ASSERT_NE(want[0], want[1]);  // (sampled: the seeds differ)
  const auto load = mixed_jobs(target.hparams().n_tokens, 4, 31);
  uint64_t accepted = 0;
  for (const auto& [k, k_auto] : {std::pair{1, false}, {4, false}, {8, true}}) {
    spec.k = k;
    spec.k_auto = k_auto;
    EngineConfig c = config(-1);
    c.spec = spec;
    c.draft_model = draft;
    Engine engine(target, c, {});
    EXPECT_EQ(run_seeded(engine, all_jobs, all_seeds, 1, false), want) << "k " << k << ", alone";
    EXPECT_EQ(run_seeded(engine, jobs, seeds, 3, true, load), want) << "k " << k << ", n 3 beside others";
    accepted += settled_metrics(engine, all_jobs.size() + 3 * jobs.size() + load.size()).counters.spec_accepted_tokens;
  }
  EXPECT_GT(accepted, 0u);  // (drafts were verified and accepted: the test tests something)
  std::printf("[spec %s, sampled] %llu draft tokens accepted\n", spec_method_name(spec.method), (unsigned long long)accepted);
}

TEST(Speculation, SeededSamplingIsTheSameWithAndWithoutDrafts) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  Job rep;  // repetitive: prompt lookup drafts at once, and the model often follows
  for (int i = 0; i < 60; ++i) rep.prompt.push_back(int32_t(3 + (i % 7) * 5));
  rep.max_tokens = 40;
  Job other = mixed_jobs(model->hparams().n_tokens, 3, 41)[2];
  other.max_tokens = 24;
  expect_seeded_sampling_exact(*model, ngram(4), nullptr, {rep, other});
}

TEST(Speculation, SeededSamplingWithADraftModelIsTheSameWithAndWithoutDrafts) {
  const TargetAndDraft td(23, "seed");
  Job a;
  for (int i = 0; i < 40; ++i) a.prompt.push_back(int32_t(3 + (i * 37) % 200));
  a.max_tokens = 32;
  expect_seeded_sampling_exact(*td.target, td.spec(), td.draft.get(), {a});
}

TEST(Speculation, DraftModelMustShareTheVocabulary) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const std::string dpath = testing::TempDir() + "ft_spec_bytes_" + std::to_string(getpid()) + ".gguf";
  write_synthetic_model(SyntheticOptions{}, dpath);  // the built-in byte-level vocabulary
  const auto target = Model::load(path);
  try {
    load_draft_model(dpath, *target);
    ADD_FAILURE() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not share a tokenizer"), std::string::npos) << e.what();
  }
  // And the engine refuses the pair too (a caller that skipped load_draft_model).
  const auto draft = Model::load(dpath);
  EngineConfig c = config(64);
  c.spec.method = SpecMethod::Draft;
  c.spec.draft_model = dpath;
  c.draft_model = draft.get();
  EXPECT_THROW(Engine(*target, c, {}), Error);
  std::filesystem::remove(dpath);
}

}  // namespace
}  // namespace ft
