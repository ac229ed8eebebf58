// Generator: stops for the right reason, respects the context, chunked prefill == one batch.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/generator.h"
#include "test_util.h"

namespace ft {
namespace {

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, RuntimeConfig cfg,
                            int64_t n, FinishReason* why = nullptr, std::function<bool(int32_t)> eog = {}) {
  Generator g(m, cfg, std::move(eog));
  GenerateOptions opt;
  opt.max_tokens = n;
  opt.sampling.temperature = 0;
  std::vector<int32_t> streamed;
  const GenerateResult r = g.generate(prompt, opt, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  EXPECT_EQ(streamed, r.tokens);
  EXPECT_GT(r.ttft_ms, 0);
  if (why) *why = r.finish;
  return r.tokens;
}

TEST(Generator, PrefillChunkSizeDoesNotChangeOutput) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto m = Model::load(path);
  const std::vector<int32_t> prompt = {1, 317, 269, 274, 287, 263, 377, 267, 265, 282, 295, 433};
  RuntimeConfig one;
  one.threads = 2;
  const auto ref = greedy(*m, prompt, one, 24);
  ASSERT_EQ(ref.size(), 24u);
  for (int64_t chunk : {1, 3, 7}) {
    RuntimeConfig c = one;
    c.max_batch = chunk;
    EXPECT_EQ(greedy(*m, prompt, c, 24), ref) << "chunk " << chunk;
  }
}

TEST(Generator, StopsAtEndOfGenerationAndAtContext) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto m = Model::load(path);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  RuntimeConfig cfg;
  cfg.threads = 2;
  FinishReason why;
  const auto all = greedy(*m, prompt, cfg, 10, &why);
  EXPECT_EQ(why, FinishReason::Length);
  // Declare the 4th greedy token end-of-generation: generation stops right after it.
  const int32_t stop_tok = all[3];
  const auto stopped = greedy(*m, prompt, cfg, 10, &why, [&](int32_t t) { return t == stop_tok; });
  EXPECT_EQ(why, FinishReason::Stop);
  EXPECT_EQ(stopped, std::vector<int32_t>(all.begin(), all.begin() + 4));
  // A context of 8 positions: 5 prompt tokens leave room for 3 more written + 1 sampled.
  cfg.n_ctx = 8;
  const auto capped = greedy(*m, prompt, cfg, 100, &why);
  EXPECT_EQ(why, FinishReason::Length);
  EXPECT_EQ(capped, std::vector<int32_t>(all.begin(), all.begin() + 4));
}

TEST(Generator, RejectsBadPrompts) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto m = Model::load(path);
  RuntimeConfig cfg;
  cfg.n_ctx = 4;
  Generator g(*m, cfg);
  GenerateOptions opt;
  auto sink = [](int32_t) { return true; };
  EXPECT_THROW(g.generate({}, opt, sink), Error);
  EXPECT_THROW(g.generate({1, 2, 3, 4}, opt, sink), Error);  // no room to generate
  EXPECT_THROW(g.generate({1, 9999}, opt, sink), Error);     // id out of range
  EXPECT_NO_THROW(g.generate({1, 2}, opt, sink));            // still usable after errors
}

}  // namespace
}  // namespace ft
