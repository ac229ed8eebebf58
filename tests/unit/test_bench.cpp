// Load-generator workloads and statistics (pure functions).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "core/error.h"

namespace ft::bench {
namespace {

TEST(Summary, PercentilesInterpolateLikeNumpy) {
  const Summary s = summarize({5, 1, 4, 2, 3});  // sorted: 1 2 3 4 5
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p90, 4.6);   // numpy.percentile([1..5], 90)
  EXPECT_DOUBLE_EQ(s.p99, 4.96);
  EXPECT_DOUBLE_EQ(s.max, 5);
  const Summary one = summarize({7.5});
  EXPECT_DOUBLE_EQ(one.p99, 7.5);
  EXPECT_EQ(summarize({}).n, 0u);
}

TEST(Workload, MixedMatchesTheHeadlineWorkload) {
  const auto w = builtin_workload("mixed");
  ASSERT_TRUE(w);
  Workload m = *w;
  m.duration_s = 200;
  const auto plan = plan_arrivals(m, 1);
  int longs = 0, shorts = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i) {
      EXPECT_LE(plan[i - 1].at_s, plan[i].at_s);
    }
    EXPECT_LT(plan[i].at_s, 200.0);
    const auto& c = m.classes[size_t(plan[i].class_index)];
    EXPECT_GE(plan[i].prompt_tokens, c.prompt_tokens.mean - c.prompt_tokens.spread);
    EXPECT_LE(plan[i].prompt_tokens, c.prompt_tokens.mean + c.prompt_tokens.spread);
    EXPECT_EQ(plan[i].output_tokens, 16);
    (c.name == "long" ? longs : shorts)++;
  }
  EXPECT_EQ(longs, 10);               // one every 20 s
  EXPECT_NEAR(shorts, 200, 3 * std::sqrt(200.0));  // Poisson 1/s: within 3 sigma
  EXPECT_FALSE(builtin_workload("nope"));
}

TEST(Workload, SameSeedSamePlanAndGammaBurstiness) {
  Workload w;
  w.duration_s = 500;
  w.classes = {{"a", {Arrivals::Kind::Gamma, 2.0, 0.25, 0}, {100, 10}, {8, 0}, 0}};
  const auto a = plan_arrivals(w, 7), b = plan_arrivals(w, 7), c = plan_arrivals(w, 8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].at_s, b[i].at_s);
  EXPECT_NE(a.size() == c.size() && a[0].at_s == c[0].at_s, true);
  // Mean rate holds; burstiness 0.25 gives a coefficient of variation of gaps near 2 (1/sqrt(k)).
  EXPECT_NEAR(double(a.size()) / 500, 2.0, 0.3);
  std::vector<double> gaps;
  for (size_t i = 1; i < a.size(); ++i) gaps.push_back(a[i].at_s - a[i - 1].at_s);
  const Summary s = summarize(gaps);
  double var = 0;
  for (double g : gaps) var += (g - s.mean) * (g - s.mean);
  const double cv = std::sqrt(var / double(gaps.size())) / s.mean;
  EXPECT_GT(cv, 1.5);
}

TEST(Workload, FromJsonAndItsErrors) {
  const auto j = nlohmann::json::parse(R"({"name": "x", "duration_s": 10, "classes": [
      {"name": "q", "arrival": {"type": "periodic", "rate": 2}, "prompt_tokens": {"mean": 30, "spread": 5},
       "output_tokens": 4, "shared_prefix_tokens": 10}]})");
  const Workload w = workload_from_json(j);
  ASSERT_EQ(w.classes.size(), 1u);
  EXPECT_EQ(w.classes[0].prompt_tokens.spread, 5);
  EXPECT_EQ(plan_arrivals(w, 1).size(), 20u);  // every 0.5 s for 10 s
  auto bad = [](const char* text, const char* needle) {
    try {
      workload_from_json(nlohmann::json::parse(text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad(R"({"classes": []})", "classes");
  bad(R"({"clases": []})", "unknown key 'clases'");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 0, "output_tokens": 1}]})", "prompt_tokens");
  bad(R"({"classes": [{"arrival": {"type": "burst", "rate": 1}, "prompt_tokens": 5, "output_tokens": 1}]})", "burst");
  bad(R"({"classes": [{"arrival": {"rate": -1}, "prompt_tokens": 5, "output_tokens": 1}]})", "rate");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 5, "output_tokens": 1, "shared_prefix_tokens": 9}]})",
      "shared_prefix_tokens");
}

}  // namespace
}  // namespace ft::bench
