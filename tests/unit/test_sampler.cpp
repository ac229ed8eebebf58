// Sampler: greedy/top-k equivalence, determinism per seed, empirical frequencies against the
// softmax, filters that must exclude tokens, penalties on hand-built logits, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

namespace ft {
namespace {

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * (float(double(rng()) / 4294967296.0) * 2.0f - 1.0f);
  return v;
}

int argmax(const std::vector<float>& v) {
  int best = 0;
  for (int i = 1; i < int(v.size()); ++i)
    if (v[size_t(i)] > v[size_t(best)]) best = i;
  return best;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(Sampler, GreedyIsArgmax) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const auto logits = random_logits(1000, seed);
    Sampler s(greedy(), 1000);
    EXPECT_EQ(s.sample(logits.data()), argmax(logits));
  }
}

TEST(Sampler, GreedyTiesPickLowestId) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  Sampler s(greedy(), 5);
  EXPECT_EQ(s.sample(logits.data()), 1);
  logits[1] = 1.9f;
  EXPECT_EQ(s.sample(logits.data()), 3);
}

// The greedy pick scans in blocks of 16 (sampler.cpp: index_of, count_finite): the maximum at
// every position of odd-sized vocabularies, tied later or not, among NaN and infinities or not.
TEST(Sampler, GreedyFindsTheFirstMaximumAtEveryPosition) {
  for (int n : {1, 2, 15, 16, 17, 31, 33, 100}) {
    for (int at = 0; at < n; ++at) {
      for (int variant = 0; variant < 3; ++variant) {
        auto logits = random_logits(n, uint32_t(n * 131 + at));
        logits[size_t(at)] = 10.0f;
        if (variant >= 1 && at + 3 < n) logits[size_t(at + 3)] = 10.0f;  // a tie after it
        if (variant == 2) {  // non-finite values before and after it, never picked
          if (at > 0) logits[size_t(at - 1)] = std::nanf("");
          if (at + 1 < n) logits[size_t(at + 1)] = INFINITY;
          if (at + 2 < n) logits[size_t(at + 2)] = -INFINITY;
        }
        Sampler s(greedy(), n);
        ASSERT_EQ(s.sample(logits.data()), at) << "n " << n << " variant " << variant;
      }
    }
  }
}

TEST(Sampler, DoesNotModifyLogits) {
  auto logits = random_logits(100, 3);
  const auto copy = logits;
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.top_k = 10;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  Sampler s(p, 100);
  const int32_t prompt[] = {1, 2, 3, argmax(logits)};
  s.add_prompt(prompt);
  for (int i = 0; i < 10; ++i) s.accept(s.sample(logits.data()));
  EXPECT_EQ(logits, copy);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  for (float t : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 1;
    for (uint32_t seed = 1; seed <= 10; ++seed) {
      p.seed = seed;
      const auto logits = random_logits(500, seed + 100);
      Sampler s(p, 500);
      for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(logits.data()), argmax(logits)) << t;
    }
  }
}

std::vector<int32_t> draw_sequence(const SamplingParams& p, const std::vector<float>& logits,
                                   int count) {
  Sampler s(p, int(logits.size()));
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) out.push_back(s.sample(logits.data()));
  return out;
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  const std::vector<float> flat(1000, 0.25f);  // uniform over 1000 tokens
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  const auto a = draw_sequence(p, flat, 50);
  const auto b = draw_sequence(p, flat, 50);
  EXPECT_EQ(a, b);
  p.seed = 1235;
  const auto c = draw_sequence(p, flat, 50);
  EXPECT_NE(a, c);
  // A flat distribution really is sampled broadly: 50 draws from 1000 tokens repeat rarely.
  std::vector<int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 40);
}

TEST(Sampler, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  Sampler s(p, 5);
  const int draws = 20000;
  std::vector<int> hits(5, 0);
  for (int i = 0; i < draws; ++i) ++hits[size_t(s.sample(logits.data()))];
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  for (size_t i = 0; i < 5; ++i) {
    const double expected = std::exp(double(logits[i])) / z;
    // Binomial standard deviation is at most sqrt(0.25/20000) = 0.0035; allow ~4.3 sigma.
    EXPECT_NEAR(double(hits[i]) / draws, expected, 0.015) << "token " << i;
  }
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = {1.0f, 0.0f};
  for (float t : {0.5f, 2.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 7;
    Sampler s(p, 2);
    int zeros = 0;
    for (int i = 0; i < 20000; ++i) zeros += s.sample(logits.data()) == 0;
    const double expected = 1.0 / (1.0 + std::exp(-1.0 / t));  // 0.881 at t=0.5, 0.622 at t=2
    EXPECT_NEAR(zeros / 20000.0, expected, 0.015) << t;
  }
}

TEST(Sampler, TopKExcludesTheRest) {
  const auto logits = random_logits(50, 5, 1.0f);
  std::vector<int> order(50);
  for (int i = 0; i < 50; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  SamplingParams p;
  p.temperature = 3.0f;  // flat enough that everything would otherwise be drawn
  p.top_k = 5;
  Sampler s(p, 50);
  std::vector<int> hits(50, 0);
  for (int i = 0; i < 5000; ++i) ++hits[size_t(s.sample(logits.data()))];
  for (int r = 0; r < 50; ++r) {
    if (r < 5) {
      EXPECT_GT(hits[size_t(order[size_t(r)])], 0) << "rank " << r;
    } else {
      EXPECT_EQ(hits[size_t(order[size_t(r)])], 0) << "rank " << r;
    }
  }
}

TEST(Sampler, TopPExcludesTail) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (logits are their logs).
  const std::vector<float> logits = {std::log(0.0625f), std::log(0.25f), std::log(0.5f),
                                     std::log(0.125f), std::log(0.0625f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.7f;  // 0.5 + 0.25 = 0.75 >= 0.7: keeps tokens 2 and 1 only
  Sampler s(p, 5);
  std::vector<int> hits(5, 0);
  for (int i = 0; i < 10000; ++i) ++hits[size_t(s.sample(logits.data()))];
  EXPECT_EQ(hits[0], 0);
  EXPECT_EQ(hits[3], 0);
  EXPECT_EQ(hits[4], 0);
  EXPECT_NEAR(hits[2] / 10000.0, 2.0 / 3.0, 0.03);  // renormalised 0.5/0.75
  EXPECT_NEAR(hits[1] / 10000.0, 1.0 / 3.0, 0.03);

  p.top_p = 0.8f;  // needs the 0.125 token too
  Sampler s2(p, 5);
  std::vector<int> hits2(5, 0);
  for (int i = 0; i < 10000; ++i) ++hits2[size_t(s2.sample(logits.data()))];
  EXPECT_GT(hits2[3], 0);
  EXPECT_EQ(hits2[0], 0);
  EXPECT_EQ(hits2[4], 0);
}

// top_p sorts only as far as its prefix reaches (partial sorts of a growing k): the kept set must
// be the full sort's prefix whose mass first reaches top_p, with ties by lower id, for peaked
// and flat distributions whose prefix ends within the first partial sort, past it, or at the
// whole vocabulary, with and without non-finite logits. Reference: the top_p = 1 distribution
// sorted in full here.
TEST(Sampler, TopPKeepsTheSortedPrefixThatReachesIt) {
  int checked = 0;
  for (const int n : {300, 5000, 40000})
    for (const float scale : {0.5f, 3.0f, 12.0f})
      for (const bool ties : {false, true})
        for (const bool holes : {false, true})
          for (const float top_p : {0.3f, 0.9f, 0.999f}) {
            std::vector<float> logits = random_logits(n, uint32_t(n) + uint32_t(scale * 10) + (ties ? 7 : 0), scale);
            if (ties)
              for (auto& x : logits) x = std::round(x * 2.0f) / 2.0f;
            if (holes)
              for (int i = 3; i < n; i += 97) logits[size_t(i)] = -INFINITY;
            SamplingParams p;
            p.temperature = 0.7f;
            Sampler all(p, n);
            std::vector<float> full(static_cast<size_t>(n)), kept(static_cast<size_t>(n));
            all.sample(logits.data(), full.data());
            p.top_p = top_p;
            Sampler s(p, n);
            s.sample(logits.data(), kept.data());
            std::vector<int> order;
            for (int i = 0; i < n; ++i)
              if (std::isfinite(logits[size_t(i)])) order.push_back(i);
            std::sort(order.begin(), order.end(), [&](int a, int b) {
              return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
            });
            double cum = 0;
            size_t keep = 0;
            while (keep < order.size() && cum < top_p) cum += full[size_t(order[keep++])];
            const std::string at = "n=" + std::to_string(n) + " scale=" + std::to_string(scale) + " ties=" +
                                   std::to_string(ties) + " holes=" + std::to_string(holes) + " top_p=" + std::to_string(top_p);
            const double before = cum - full[size_t(order[keep - 1])];
            if (std::abs(cum - top_p) < 3e-7 || std::abs(before - top_p) < 3e-7) continue;  // (at the rounding's mercy)
            ++checked;
            for (size_t i = 0; i < order.size(); ++i) {
              const size_t t = size_t(order[i]);
              if (i < keep) {
                ASSERT_NEAR(kept[t], full[t] / cum, 1e-5 * full[t] / cum + 1e-12) << at << " rank " << i;
              } else {
                ASSERT_EQ(kept[t], 0.0f) << at << " rank " << i << " of " << keep << " kept";
              }
            }
            if (n == 40000 && scale == 0.5f && top_p > 0.5f) {
              EXPECT_GT(keep, 2048u) << at;  // (past the second partial sort)
            }
          }
  EXPECT_GT(checked, 90);
}

// top_k's heap selection (blocks of 16 skipped on their maximum): the kept set is the k best by
// logit, ties to the lower id, for vocabularies that are and are not multiples of 16, ties
// everywhere (logits on a 0.5 grid) and k from 1 to n - 1.
TEST(Sampler, TopKKeepsTheKBestTiesToLowerIds) {
  for (const int n : {17, 1000, 32003})
    for (const bool ties : {false, true})
      for (const int k : {1, 5, 40, 999, n - 1}) {
        if (k >= n) continue;
        std::vector<float> logits = random_logits(n, uint32_t(n) + uint32_t(k) + (ties ? 3 : 0), 4.0f);
        if (ties)
          for (auto& x : logits) x = std::round(x * 2.0f) / 2.0f;
        SamplingParams p;
        p.temperature = 1.0f;
        p.top_k = k;
        Sampler s(p, n);
        std::vector<float> probs(static_cast<size_t>(n));
        s.sample(logits.data(), probs.data());
        std::vector<int> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
        });
        for (int i = 0; i < n; ++i) {
          const size_t t = size_t(order[size_t(i)]);
          if (i < k) {
            ASSERT_GT(probs[t], 0.0f) << "n=" << n << " k=" << k << " ties=" << ties << " rank " << i;
          } else {
            ASSERT_EQ(probs[t], 0.0f) << "n=" << n << " k=" << k << " ties=" << ties << " rank " << i;
          }
        }
      }
}

TEST(Sampler, MinPExcludesUnlikely) {
  // p relative to the max: 1, 0.5, 0.2, 0.09, 0.01.
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.2f), std::log(0.09f),
                                     std::log(0.01f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.1f;
  Sampler s(p, 5);
  std::vector<int> hits(5, 0);
  for (int i = 0; i < 20000; ++i) ++hits[size_t(s.sample(logits.data()))];
  EXPECT_GT(hits[0], 0);
  EXPECT_GT(hits[1], 0);
  EXPECT_GT(hits[2], 0);
  EXPECT_EQ(hits[3], 0);
  EXPECT_EQ(hits[4], 0);
  EXPECT_NEAR(hits[2] / 20000.0, 0.2 / 1.7, 0.015);
}

TEST(Sampler, NonFiniteLogitsAreNeverDrawn) {
  std::vector<float> logits(10, -INFINITY);
  logits[3] = 0.0f;
  logits[7] = std::nanf("");
  logits[8] = 0.0f;
  SamplingParams p;
  p.temperature = 1.0f;
  Sampler s(p, 10);
  for (int i = 0; i < 1000; ++i) {
    const int32_t t = s.sample(logits.data());
    ASSERT_TRUE(t == 3 || t == 8) << t;
  }
  std::vector<float> none(10, -INFINITY);
  EXPECT_THROW(s.sample(none.data()), Error);
}

TEST(Sampler, RepetitionPenaltyChangesArgmax) {
  // Token 0 leads with a positive logit, token 2 with a negative one.
  const std::vector<float> logits = {2.0f, 1.8f, -0.5f, -0.6f};
  SamplingParams p = greedy();
  p.repetition_penalty = 1.5f;
  {
    Sampler s(p, 4);
    const int32_t prompt[] = {0, 0, 0};  // repeated: penalised once, 2.0/1.5 = 1.33 < 1.8
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(logits.data()), 1);
  }
  {
    Sampler s(p, 4);
    const int32_t prompt[] = {0, 1};  // both penalised: 1.33 vs 1.2 -> 0 again
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(logits.data()), 0);
  }
  {
    // Negative logits are multiplied: only -0.5 and -0.6 left; penalising 2 gives -0.75.
    const std::vector<float> neg = {-0.5f, -0.6f};
    Sampler s(p, 2);
    const int32_t prompt[] = {0};
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(neg.data()), 1);
  }
  {
    // Outside the window: no penalty.
    SamplingParams w = p;
    w.penalty_last_n = 2;
    Sampler s(w, 4);
    const int32_t prompt[] = {0, 3, 3};
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(logits.data()), 0);
    s.accept(0);  // now inside the window
    EXPECT_EQ(s.sample(logits.data()), 1);
  }
  {
    SamplingParams off = p;
    off.penalty_last_n = 0;
    Sampler s(off, 4);
    const int32_t prompt[] = {0};
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(logits.data()), 0);
  }
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  const std::vector<float> logits = {1.0f, 0.7f, 0.0f};
  {
    SamplingParams p = greedy();
    p.presence_penalty = 0.5f;  // 1.0 - 0.5 = 0.5 < 0.7 after one generation
    Sampler s(p, 3);
    const int32_t prompt[] = {0, 0};  // prompt tokens do not count
    s.add_prompt(prompt);
    EXPECT_EQ(s.sample(logits.data()), 0);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data()), 1);
  }
  {
    SamplingParams p = greedy();
    p.frequency_penalty = 0.2f;  // 1.0 - 0.2*count: 0.8 after one, 0.6 after two
    Sampler s(p, 3);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data()), 0);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data()), 1);
  }
  {
    SamplingParams p = greedy();
    p.presence_penalty = -1.5f;  // negative values encourage repetition: 0 + 1.5 > 1.0
    Sampler s(p, 3);
    s.accept(2);
    EXPECT_EQ(s.sample(logits.data()), 2);
  }
}

TEST(Sampler, RejectsOutOfRangeTokens) {
  Sampler s(greedy(), 10);
  EXPECT_THROW(s.accept(10), Error);
  EXPECT_THROW(s.accept(-1), Error);
  const int32_t bad[] = {1, 11};
  EXPECT_THROW(s.add_prompt(bad), Error);
  EXPECT_THROW(Sampler(greedy(), 0), Error);
}

void expect_invalid(const SamplingParams& p, const std::string& field) {
  try {
    validate(p);
    ADD_FAILURE() << field << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
  EXPECT_THROW(Sampler(p, 10), Error) << field;
}

// The distribution at temperature t over every token, in double (a reference of its own).
std::vector<double> softmax_at(const std::vector<float>& logits, double t) {
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, double(x));
  std::vector<double> q(logits.size());
  double s = 0;
  for (size_t i = 0; i < q.size(); ++i) s += q[i] = std::exp((double(logits[i]) - mx) / t);
  for (double& x : q) x /= s;
  return q;
}
double entropy_of(const std::vector<double>& q) {
  double h = 0;
  for (double x : q)
    if (x > 0) h -= x * std::log(x);
  return h;
}
// kept: the tokens a filter keeps; want: q restricted to them, renormalised; got: the sampler's.
void expect_restricted(const std::vector<double>& q, const std::vector<bool>& kept, const std::vector<float>& got,
                       const std::string& at) {
  double mass = 0;
  for (size_t i = 0; i < q.size(); ++i) mass += kept[i] ? q[i] : 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (!kept[i]) {
      ASSERT_EQ(got[i], 0.0f) << at << " token " << i;
    } else {
      ASSERT_NEAR(got[i], q[i] / mass, 2e-5 * q[i] / mass + 1e-9) << at << " token " << i;
    }
  }
}

// typical_p: with q the tempered distribution and H its entropy, the tokens in increasing
// |-log q - H| (ties by id) until their mass exceeds typical_p; at least min_keep.
TEST(Sampler, TypicalPKeepsTheTokensNearestTheEntropy) {
  int checked = 0;
  for (const int n : {50, 1000, 32003})
    for (const float scale : {1.0f, 4.0f, 12.0f})
      for (const float typical : {0.2f, 0.5f, 0.95f})
        for (const int min_keep : {0, 7}) {
          const std::vector<float> logits = random_logits(n, uint32_t(n) * 3 + uint32_t(scale), scale);
          const std::vector<double> q = softmax_at(logits, 0.8);
          const double h = entropy_of(q);
          std::vector<int> order(static_cast<size_t>(n));
          std::iota(order.begin(), order.end(), 0);
          auto score = [&](int i) { return std::abs(-std::log(q[size_t(i)]) - h); };
          std::sort(order.begin(), order.end(), [&](int a, int b) { return score(a) < score(b) || (score(a) == score(b) && a < b); });
          std::vector<bool> kept(static_cast<size_t>(n), false);
          double cum = 0;
          bool edge = false;
          for (size_t i = 0; i < order.size(); ++i) {
            kept[size_t(order[i])] = true;
            cum += q[size_t(order[i])];
            edge = edge || std::abs(cum - typical) < 1e-6;
            if (cum > typical && int(i) + 1 >= std::max(min_keep, 1)) break;
          }
          if (edge) continue;  // (at the rounding's mercy)
          SamplingParams p;
          p.temperature = 0.8f;
          p.typical_p = typical;
          p.min_keep = min_keep;
          Sampler smp(p, n);
          std::vector<float> got(static_cast<size_t>(n));
          smp.sample(logits.data(), got.data());
          expect_restricted(q, kept, got, "n=" + std::to_string(n) + " scale=" + std::to_string(scale) +
                                               " typical=" + std::to_string(typical) + " min_keep=" + std::to_string(min_keep));
          ++checked;
        }
  EXPECT_GT(checked, 45);
}

// typical_p can drop the most likely token (its surprise far below the entropy); min_p then
// measures against the best one left, as llama.cpp's does, not against the dropped one.
TEST(Sampler, MinPAfterTypicalIsRelativeToTheBestKept) {
  const int n = 1001;  // one token of p 0.4, 1,000 of p 0.0006: entropy 4.82 nats, surprises 0.92 and 7.42
  std::vector<float> logits(static_cast<size_t>(n), std::log(0.0006f));
  logits[0] = std::log(0.4f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.typical_p = 0.3003f;  // 501 of the small ones (their surprise is nearer the entropy)
  for (const float min_p : {0.0f, 0.5f}) {
    p.min_p = min_p;
    Sampler smp(p, n);
    std::vector<float> got(static_cast<size_t>(n));
    smp.sample(logits.data(), got.data());
    EXPECT_EQ(got[0], 0.0f) << "min_p " << min_p;
    int kept = 0;
    for (int i = 1; i < n; ++i) kept += got[size_t(i)] > 0;
    EXPECT_EQ(kept, 501) << "min_p " << min_p;
  }
}

// dynatemp: t = lo + (hi - lo) (H1 / log n)^exponent, H1 the entropy at temperature 1: a flat
// distribution samples hotter than a peaked one.
TEST(Sampler, DynamicTemperatureFollowsTheEntropy) {
  for (const float scale : {0.2f, 3.0f, 30.0f})
    for (const float exponent : {0.5f, 1.0f, 2.0f}) {
      const int n = 777;
      const std::vector<float> logits = random_logits(n, 99, scale);
      const double norm = entropy_of(softmax_at(logits, 1.0)) / std::log(double(n));
      const double lo = 0.3, hi = 1.5;  // temperature 0.9, range 0.6
      const double t = lo + (hi - lo) * std::pow(norm, double(exponent));
      SamplingParams p;
      p.temperature = 0.9f;
      p.dynatemp_range = 0.6f;
      p.dynatemp_exponent = exponent;
      Sampler smp(p, n);
      std::vector<float> got(static_cast<size_t>(n));
      smp.sample(logits.data(), got.data());
      expect_restricted(softmax_at(logits, t), std::vector<bool>(size_t(n), true), got,
                        "scale=" + std::to_string(scale) + " exponent=" + std::to_string(exponent));
    }
}

// min_keep: top_p, min_p (and typical_p, above) keep at least this many, the best by logit.
TEST(Sampler, MinKeepHoldsTheBestFew) {
  const int n = 3000;
  const std::vector<float> logits = random_logits(n, 5, 12.0f);
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const std::vector<double> q = softmax_at(logits, 1.0);
  for (const int which : {0, 1}) {
    SamplingParams p;
    p.temperature = 1.0f;
    (which == 0 ? p.top_p : p.min_p) = which == 0 ? 0.001f : 0.999f;  // alone: the best token only
    for (const int min_keep : {0, 1, 5, 300}) {
      p.min_keep = min_keep;
      Sampler smp(p, n);
      std::vector<float> got(static_cast<size_t>(n));
      smp.sample(logits.data(), got.data());
      std::vector<bool> kept(static_cast<size_t>(n), false);
      for (int i = 0; i < std::max(min_keep, 1); ++i) kept[size_t(order[size_t(i)])] = true;
      expect_restricted(q, kept, got, std::string(which == 0 ? "top_p" : "min_p") + " min_keep=" + std::to_string(min_keep));
    }
  }
}

// Mirostat 2: the tokens of surprise -log2 q <= mu (mu = 2 tau at first); then each draw moves mu
// by eta (surprise in the kept distribution - tau), which holds the mean surprise at tau.
// Mirostat 1: the best k, k from the Zipf exponent fitted on the best 100 (llama.cpp's formula).
TEST(Sampler, MirostatTruncatesBySurpriseAndHoldsItsTarget) {
  const int n = 2000;  // a Zipf distribution of exponent 1.1 over shuffled ids, slightly perturbed
  std::vector<float> logits(static_cast<size_t>(n));
  std::vector<int> rank(static_cast<size_t>(n));
  std::iota(rank.begin(), rank.end(), 1);
  std::shuffle(rank.begin(), rank.end(), std::mt19937(7));
  const std::vector<float> noise = random_logits(n, 13, 0.05f);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = -1.1f * std::log(float(rank[i])) + noise[i];
  const std::vector<double> q = softmax_at(logits, 1.0);
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  for (const int version : {1, 2}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.mirostat = version;
    p.mirostat_tau = 3.0f;
    p.mirostat_eta = 0.1f;
    p.top_k = 1;  // ignored under mirostat
    p.seed = 42;
    Sampler smp(p, n);
    EXPECT_TRUE(smp.stateful());
    EXPECT_FLOAT_EQ(smp.mirostat_mu(), 6.0f);
    std::vector<bool> kept(static_cast<size_t>(n), false);
    if (version == 2) {
      for (int i = 0; i < n; ++i) kept[size_t(i)] = -std::log2(q[size_t(i)]) <= 6.0;
    } else {
      double ti_bi = 0, ti_sq = 0;
      for (int i = 0; i < 99; ++i) {
        const double t = std::log(double(i + 2) / double(i + 1));
        ti_bi += t * std::log(q[size_t(order[size_t(i)])] / q[size_t(order[size_t(i + 1)])]);
        ti_sq += t * t;
      }
      const double s_hat = ti_bi / ti_sq, e = s_hat - 1;
      const int k = int(std::pow(e * std::exp2(6.0) / (1 - std::pow(double(n), -e)), 1 / s_hat));
      ASSERT_GE(k, 2);
      ASSERT_LT(k, n / 2);
      for (int i = 0; i < k; ++i) kept[size_t(order[size_t(i)])] = true;
    }
    std::vector<float> got(static_cast<size_t>(n));
    int32_t t = smp.sample(logits.data(), got.data());
    expect_restricted(q, kept, got, "mirostat " + std::to_string(version) + ", first token");
    // The feedback: mu moves by eta times each draw's surprise error; the mean surprise nears tau.
    double mu = 6.0, surprise_sum = 0;
    const int steps = 4000;
    for (int step = 0; step < steps; ++step) {
      if (step > 0) t = smp.sample(logits.data(), got.data());
      const double s = -std::log2(double(got[size_t(t)]));
      surprise_sum += s;
      mu -= 0.1 * (s - 3.0);
      ASSERT_NEAR(smp.mirostat_mu(), mu, 1e-3 * std::max(1.0, std::abs(mu))) << "step " << step;
    }
    EXPECT_NEAR(surprise_sum / steps, 3.0, version == 2 ? 0.05 : 0.1) << "mirostat " << version;
  }
}

TEST(Sampler, ValidateRejectsBadValues) {
  EXPECT_NO_THROW(validate(SamplingParams{}));
  EXPECT_NO_THROW(validate(greedy()));
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return p;
  };
  expect_invalid(with([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature");
  expect_invalid(with([](SamplingParams& p) { p.temperature = NAN; }), "temperature");
  expect_invalid(with([](SamplingParams& p) { p.temperature = INFINITY; }), "temperature");
  expect_invalid(with([](SamplingParams& p) { p.top_k = -1; }), "top_k");
  expect_invalid(with([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p");
  expect_invalid(with([](SamplingParams& p) { p.top_p = NAN; }), "top_p");
  expect_invalid(with([](SamplingParams& p) { p.min_p = -0.01f; }), "min_p");
  expect_invalid(with([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p");
  expect_invalid(with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
                 "repetition_penalty");
  expect_invalid(with([](SamplingParams& p) { p.repetition_penalty = INFINITY; }),
                 "repetition_penalty");
  expect_invalid(with([](SamplingParams& p) { p.presence_penalty = NAN; }), "presence_penalty");
  expect_invalid(with([](SamplingParams& p) { p.frequency_penalty = -INFINITY; }),
                 "frequency_penalty");
  expect_invalid(with([](SamplingParams& p) { p.penalty_last_n = -2; }), "penalty_last_n");
  expect_invalid(with([](SamplingParams& p) { p.typical_p = 0.0f; }), "typical_p");
  expect_invalid(with([](SamplingParams& p) { p.typical_p = 1.5f; }), "typical_p");
  expect_invalid(with([](SamplingParams& p) { p.dynatemp_range = -1.0f; }), "dynatemp_range");
  expect_invalid(with([](SamplingParams& p) { p.dynatemp_exponent = NAN; }), "dynatemp_exponent");
  expect_invalid(with([](SamplingParams& p) { p.mirostat = 3; }), "mirostat");
  expect_invalid(with([](SamplingParams& p) { p.mirostat_tau = -1.0f; }), "mirostat_tau");
  expect_invalid(with([](SamplingParams& p) { p.mirostat_eta = INFINITY; }), "mirostat_eta");
  expect_invalid(with([](SamplingParams& p) { p.min_keep = -1; }), "min_keep");
  // Boundaries that are valid.
  EXPECT_NO_THROW(validate(with([](SamplingParams& p) {
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.penalty_last_n = -1;
    p.presence_penalty = -2.0f;
  })));
}

}  // namespace
}  // namespace ft
