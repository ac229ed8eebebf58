// Speculative decoding's parts: prompt-lookup drafts, the auto-k policy, Sampler::verify's
// exactness (the token it returns follows the target's distribution, whatever the draft's), and
// the KV cache's rollback (truncate).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"

namespace ft {
namespace {

TEST(NgramDraft, LongestSuffixMostRecentOccurrence) {
  // Suffix [7, 8] occurred at 1 and 5; the most recent earlier one (5) is followed by 1, 2.
  const std::vector<int32_t> t = {0, 7, 8, 3, 4, 7, 8, 1, 2, 9, 7, 8};
  EXPECT_EQ(ngram_draft(t, 3, 1, 3), (std::vector<int32_t>{1, 2, 9}));
  EXPECT_EQ(ngram_draft(t, 1, 1, 3), (std::vector<int32_t>{1}));
  // Longer n first: [4, 7, 8] matches nothing, [7, 8] does; with n_min = 3 nothing does.
  EXPECT_TRUE(ngram_draft(t, 3, 3, 4).empty());
  // A draft never runs past the end of the tokens.
  const std::vector<int32_t> u = {5, 6, 5};
  EXPECT_EQ(ngram_draft(u, 4, 1, 2), (std::vector<int32_t>{6, 5}));
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3}, 4, 1, 2).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1}, 4, 1, 2).empty());
  // A longer match wins over a more recent shorter one: [1, 2] at 0 (followed by 3) vs [2] at 4.
  const std::vector<int32_t> v = {1, 2, 3, 0, 2, 5, 1, 2};
  EXPECT_EQ(ngram_draft(v, 1, 1, 2), (std::vector<int32_t>{3}));
  EXPECT_EQ(ngram_draft(v, 1, 1, 1), (std::vector<int32_t>{5}));
}

TEST(AutoSpecK, FollowsAcceptanceAndCost) {
  EXPECT_EQ(auto_spec_k(0.95, 0.02, 8), 8);   // drafts nearly free and nearly always right: the most
  EXPECT_EQ(auto_spec_k(0.0, 0.02, 8), 0);    // never right: none
  EXPECT_EQ(auto_spec_k(0.5, 1.0, 8), 0);     // a position costs a whole step: never pays
  const int32_t mid = auto_spec_k(0.6, 0.1, 8);
  EXPECT_GT(mid, 0);
  EXPECT_LT(mid, 8);
  EXPECT_LE(auto_spec_k(0.6, 0.3, 8), mid);   // dearer positions: no more drafts
  EXPECT_GE(auto_spec_k(0.8, 0.1, 8), mid);   // better acceptance: no fewer
}

TEST(SpecStats, RunningRate) {
  SpecStats s;
  for (int i = 0; i < 50; ++i) s.observe(4, 4);
  EXPECT_GT(s.alpha, 0.99);
  for (int i = 0; i < 50; ++i) s.observe(4, 0);
  EXPECT_LT(s.alpha, 0.01);
  EXPECT_EQ(s.drafts, 100);
  EXPECT_EQ(s.draft_tokens, 400);
  EXPECT_EQ(s.accepted_tokens, 200);
  s.observe(0, 0);  // no drafts: not a verification
  EXPECT_EQ(s.drafts, 100);
}

// Pearson's chi-square of counts against probabilities, and the critical value at 0.1% for its
// degrees of freedom (Wilson-Hilferty).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int* df) {
  double x = 0;
  *df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * double(n);
    if (e == 0) {
      if (counts[i] != 0) return INFINITY;  // a token the target never gives
      continue;
    }
    x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++*df;
  }
  return x;
}
double chi_square_critical(int df) {
  const double z = 3.090232;  // the normal's 99.9% quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

std::vector<double> softmax(const std::vector<float>& l, float temp) {
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(double(l[i]) / temp);
  for (double& x : p) x /= s;
  return p;
}

// Draft tokens from a point mass (n-gram) and from a draft distribution q (a draft model): over
// many seeds, verify()'s token follows the target's p, and a wrong p is rejected by the same test
// (it can fail). The token is sample()'s own with the same seed, accepted or not.
TEST(SamplerVerify, ReturnsTheTargetDistributionWhateverTheDraft) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f};
  const int V = int(logits.size());
  const std::vector<double> p = softmax(logits, 1.0f);
  std::vector<float> q = {0.05f, 0.5f, 0.05f, 0.1f, 0.2f, 0.1f};  // a poor draft distribution
  const int64_t N = 40000;
  std::mt19937_64 draft_rng(99);
  for (int mode = 0; mode < 3; ++mode) {  // 0: point mass on token 3 (likely), 1: on token 5 (unlikely), 2: q
    std::vector<int64_t> counts(size_t(V), 0);
    int64_t accepted = 0;
    for (int64_t seed = 0; seed < N; ++seed) {
      SamplingParams sp;
      sp.temperature = 1.0f;
      sp.seed = uint64_t(seed) * 7919 + 1;
      Sampler s(sp, V);
      int32_t draft = mode == 0 ? 3 : 5;
      if (mode == 2) {
        std::discrete_distribution<int32_t> d(q.begin(), q.end());
        draft = d(draft_rng);
      }
      bool ok = false;
      const int32_t tok = s.verify(logits.data(), draft, ok);
      EXPECT_EQ(ok, tok == draft);
      Sampler plain(sp, V);
      EXPECT_EQ(tok, plain.sample(logits.data()));
      accepted += ok;
      ++counts[size_t(tok)];
    }
    int df = 0;
    const double x = chi_square(counts, p, N, &df);
    EXPECT_LT(x, chi_square_critical(df)) << "mode " << mode;
    // Acceptance as theory says: p(d) for a point mass; sum p q for independent drafts from q.
    double want = mode == 0 ? p[3] : mode == 1 ? p[5] : 0;
    if (mode == 2)
      for (int i = 0; i < V; ++i) want += p[size_t(i)] * double(q[size_t(i)]);
    EXPECT_NEAR(double(accepted) / double(N), want, 0.015) << "mode " << mode;
    // Power: the same counts against a slightly different distribution fail the test.
    const double y = chi_square(counts, softmax(logits, 1.15f), N, &df);
    EXPECT_GT(y, chi_square_critical(df)) << "mode " << mode;
  }
}

// Each position's random number is a function of (seed, position): a sampler verifying drafts
// (accepted or not) draws the very tokens of one sampling, position by position, and a draft
// model's sampler seek()ing to a position draws with that position's number.
TEST(SamplerVerify, EveryPositionDrawsTheSameTokenAsSample) {
  const int V = 50;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  sp.seed = 77;
  Sampler a(sp, V), b(sp, V), d(sp, V);
  std::vector<float> logits(static_cast<size_t>(V));
  int agreed = 0;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    for (float& x : logits) x = nd(rng);
    const int32_t want = a.sample(logits.data());
    a.accept(want);
    bool ok = false;
    const int32_t draft = pos % 3 == 0 ? want : int32_t(rng() % uint64_t(V));
    EXPECT_EQ(b.verify(logits.data(), draft, ok), want) << pos;
    EXPECT_EQ(ok, draft == want);
    b.accept(want);
    d.seek(pos);
    agreed += d.sample(logits.data()) == want;
    EXPECT_EQ(d.position(), pos + 1);
  }
  EXPECT_EQ(agreed, 200);  // the same distribution and the same u: the same token
  EXPECT_EQ(a.position(), 200u);
  EXPECT_NE(Sampler::uniform_at(1, 0), Sampler::uniform_at(0, 1));
}

TEST(SamplerVerify, FiltersAndGreedy) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f};
  // Greedy: the argmax, accepted iff it is the draft; no randomness.
  SamplingParams g;
  g.temperature = 0;
  Sampler s(g, 6);
  bool ok = true;
  EXPECT_EQ(s.verify(logits.data(), 0, ok), 3);
  EXPECT_FALSE(ok);
  EXPECT_EQ(s.verify(logits.data(), 3, ok), 3);
  EXPECT_TRUE(ok);
  // top_k = 2: a draft outside the kept candidates is never accepted, and the replacement is one
  // of them, distributed as sample() would.
  SamplingParams k2;
  k2.temperature = 1;
  k2.top_k = 2;
  std::vector<int64_t> counts(6, 0);
  const int64_t N = 20000;
  for (int64_t seed = 0; seed < N; ++seed) {
    k2.seed = uint64_t(seed) + 5;
    Sampler t(k2, 6);
    const int32_t tok = t.verify(logits.data(), 4, ok);
    EXPECT_FALSE(ok);
    ++counts[size_t(tok)];
  }
  const std::vector<double> p = softmax({1.0f, 2.0f}, 1.0f);
  const std::vector<double> p6 = {p[0], 0, 0, p[1], 0, 0};
  int df = 0;
  const double x = chi_square(counts, p6, N, &df);
  EXPECT_LT(x, chi_square_critical(df));
  // sample()'s probs: normalised, one-hot when greedy.
  std::vector<float> probs(6);
  Sampler u(g, 6);
  EXPECT_EQ(u.sample(logits.data(), probs.data()), 3);
  EXPECT_EQ(probs, (std::vector<float>{0, 0, 0, 1, 0, 0}));
  SamplingParams t1;
  t1.temperature = 1;
  Sampler w(t1, 6);
  w.sample(logits.data(), probs.data());
  const std::vector<double> pw = softmax(logits, 1.0f);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(probs[size_t(i)], pw[size_t(i)], 1e-6);
}

TEST(KVCacheTruncate, FreesBlocksPastTheLengthWithoutTouchingPublishedOnes) {
  KVCacheConfig kc;
  kc.n_layers = 1;
  kc.kv_dim = 1;
  kc.block_size = 16;
  kc.n_blocks = 8;
  KVCache kv(kc);
  std::vector<int32_t> toks(40);
  for (int i = 0; i < 40; ++i) toks[size_t(i)] = i;
  ASSERT_TRUE(kv.reserve(1, 40));  // 3 blocks
  for (int i = 0; i < 40; ++i) {
    const float x = float(i);
    kv.write(0, 1, i, &x, &x);
  }
  kv.publish(1, toks, 20);  // block 0 published
  EXPECT_EQ(kv.free_blocks(), 5);
  kv.truncate(1, 21);  // positions [0, 21): 2 blocks
  EXPECT_EQ(kv.capacity(1), 32);
  EXPECT_EQ(kv.free_blocks(), 6);
  float y = -1;
  kv.read(0, 1, 20, &y, nullptr);  // kept in place
  EXPECT_EQ(y, 20.0f);
  kv.truncate(1, 16);  // the published block stays
  EXPECT_EQ(kv.capacity(1), 16);
  kv.truncate(1, 15);  // still inside it: nothing to free
  EXPECT_EQ(kv.capacity(1), 16);
  EXPECT_THROW(kv.truncate(1, 0), Error);  // would drop the published block
  kv.truncate(99, 0);  // unknown: no-op
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), 8);
}


// Fork (n > 1 choices of one prompt): full blocks shared by reference, the partial one copied.
KVCacheConfig fork_config(int32_t n_blocks, bool prefix_caching) {
  KVCacheConfig kc;
  kc.n_layers = 2;
  kc.kv_dim = 1;
  kc.block_size = 16;
  kc.n_blocks = n_blocks;
  kc.prefix_caching = prefix_caching;
  return kc;
}

void write_positions(KVCache& kv, int32_t seq, int64_t from, int64_t to, float base) {
  for (int64_t p = from; p < to; ++p)
    for (int32_t l = 0; l < 2; ++l) {
      const float x = base + float(p) + 1000.0f * float(l);
      kv.write(l, seq, p, &x, &x);
    }
}

float read_k(const KVCache& kv, int32_t layer, int32_t seq, int64_t pos) {
  float k = -1, v = -1;
  kv.read(layer, seq, pos, &k, &v);
  EXPECT_EQ(k, v);
  return k;
}

TEST(KVCacheFork, SharesFullBlocksCopiesThePartialOneAndFreesByReference) {
  KVCache kv(fork_config(8, false));
  ASSERT_TRUE(kv.reserve(1, 41));  // 3 blocks: the prompt's 40 positions and the first decode's
  write_positions(kv, 1, 0, 40, 0);
  kv.record_copies(true);
  ASSERT_TRUE(kv.fork(1, 2, 40));
  EXPECT_EQ(kv.free_blocks(), 4);  // one new block: the copy of block 2 (positions 32..39)
  EXPECT_EQ(kv.capacity(2), 48);
  EXPECT_EQ(kv.shared_blocks(1), 2);
  EXPECT_EQ(kv.shared_blocks(2), 2);
  const auto t1 = kv.block_table(1), t2 = kv.block_table(2);
  EXPECT_EQ(t1[0], t2[0]);
  EXPECT_EQ(t1[1], t2[1]);
  EXPECT_NE(t1[2], t2[2]);
  EXPECT_EQ(kv.take_copies(), (std::vector<std::pair<int32_t, int32_t>>{{t1[2], t2[2]}}));
  EXPECT_TRUE(kv.take_copies().empty());
  for (int64_t p = 0; p < 40; ++p)
    for (int32_t l = 0; l < 2; ++l) EXPECT_EQ(read_k(kv, l, 2, p), float(p) + 1000.0f * float(l)) << p;
  // Both write their next position into their own partial block; neither may write a shared one.
  write_positions(kv, 1, 40, 41, 500);
  write_positions(kv, 2, 40, 41, 700);
  EXPECT_EQ(read_k(kv, 0, 1, 40), 540.0f);
  EXPECT_EQ(read_k(kv, 0, 2, 40), 740.0f);
  EXPECT_EQ(read_k(kv, 1, 2, 39), 1039.0f);
  const float x = 9;
  EXPECT_THROW(kv.write(0, 2, 31, &x, &x), Error);
  EXPECT_THROW(kv.write(0, 1, 5, &x, &x), Error);
  EXPECT_THROW(kv.fork(1, 2, 40), Error);  // the child already holds blocks
  EXPECT_THROW(kv.fork(1, 3, 49), Error);  // more positions than the parent holds
  EXPECT_THROW(kv.copy_block(0, 8), Error);
  // A fork of the fork; then the parents go first: shared blocks stay until their last holder.
  ASSERT_TRUE(kv.fork(2, 3, 41));
  EXPECT_EQ(kv.free_blocks(), 3);
  EXPECT_EQ(read_k(kv, 0, 3, 40), 740.0f);
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), 4);  // its partial block alone
  kv.release(2);
  EXPECT_EQ(kv.free_blocks(), 5);
  for (int64_t p = 0; p < 32; ++p) EXPECT_EQ(read_k(kv, 1, 3, p), float(p) + 1000.0f);
  kv.release(3);
  EXPECT_EQ(kv.free_blocks(), 8);
  EXPECT_EQ(kv.n_sequences(), 0);
}

TEST(KVCacheFork, WithoutAFreeBlockChangesNothingUnlessNoneIsNeeded) {
  KVCache kv(fork_config(4, false));
  ASSERT_TRUE(kv.reserve(1, 40));  // 3 blocks
  ASSERT_TRUE(kv.reserve(9, 16));  // the last one
  write_positions(kv, 1, 0, 40, 0);
  EXPECT_FALSE(kv.fork(1, 2, 40));  // the partial block has nowhere to go
  EXPECT_FALSE(kv.has(2));
  EXPECT_EQ(kv.shared_blocks(1), 0);
  ASSERT_TRUE(kv.fork(1, 2, 32));  // whole blocks only: shared, nothing copied
  EXPECT_EQ(kv.capacity(2), 32);
  EXPECT_EQ(kv.free_blocks(), 0);
  kv.release(9);
  ASSERT_TRUE(kv.reserve(2, 33));  // its next position: a block of its own
  write_positions(kv, 2, 32, 33, 100);
  EXPECT_EQ(read_k(kv, 0, 1, 32), 32.0f);  // the parent's own position 32 is untouched
  EXPECT_EQ(read_k(kv, 0, 2, 32), 132.0f);
}

TEST(KVCacheFork, RollbackAfterAForkStopsAtTheSharedBlocks) {
  KVCache kv(fork_config(8, false));
  ASSERT_TRUE(kv.reserve(1, 41));
  write_positions(kv, 1, 0, 40, 0);
  ASSERT_TRUE(kv.fork(1, 2, 40));
  // Speculation: the fork reserves drafts past its partial block, then rejects them.
  ASSERT_TRUE(kv.reserve(2, 60));  // 4 blocks
  EXPECT_EQ(kv.free_blocks(), 3);
  write_positions(kv, 2, 40, 60, 300);
  kv.truncate(2, 41);
  EXPECT_EQ(kv.capacity(2), 48);
  EXPECT_EQ(kv.free_blocks(), 4);
  EXPECT_EQ(read_k(kv, 0, 2, 40), 340.0f);
  kv.truncate(2, 32);  // its copied block may go: it is its own
  EXPECT_EQ(kv.free_blocks(), 5);
  EXPECT_THROW(kv.truncate(2, 16), Error);  // into the shared blocks
  EXPECT_THROW(kv.truncate(1, 16), Error);  // the parent's, too
  kv.truncate(1, 33);
  EXPECT_EQ(read_k(kv, 1, 1, 31), 1031.0f);
  kv.release(2);
  kv.release(1);
  EXPECT_EQ(kv.free_blocks(), 8);
}

// Salts (prefix_salt): the base unsalted is 0; an adapter, a request's cache_salt, or both, each
// a key space of its own, so a prompt published under one is found under it alone.
TEST(KVCacheFork, SaltsAreSeparateKeySpaces) {
  const std::vector<uint64_t> salts = {prefix_salt(0), prefix_salt(7), prefix_salt(0, 99), prefix_salt(7, 99),
                                       prefix_salt(0, 98), prefix_salt(8, 99)};
  EXPECT_EQ(salts[0], 0u);
  for (size_t i = 0; i < salts.size(); ++i)
    for (size_t j = i + 1; j < salts.size(); ++j) EXPECT_NE(salts[i], salts[j]) << i << " " << j;
  KVCache kv(fork_config(8, true));
  std::vector<int32_t> toks(32);
  for (int i = 0; i < 32; ++i) toks[size_t(i)] = 5 * i + 2;
  ASSERT_EQ(kv.attach_prefix(1, toks, 32, salts[2]), 0);
  ASSERT_TRUE(kv.reserve(1, 32));
  write_positions(kv, 1, 0, 32, 0);
  kv.publish(1, toks, 32);  // under salts[2]: attach_prefix's
  kv.release(1);
  for (size_t i = 0; i < salts.size(); ++i)
    EXPECT_EQ(kv.prefix_hit(toks, 32, salts[i]).tokens, i == 2 ? 32 : 0) << i;
}

// A waiting request's prefix hit, resumed from its memo each step, equals a fresh walk: as more of
// its prompt is published, as its blocks go idle and back, after evictions, and as the request's
// tokens grow (a preempted request's generated ones).
TEST(KVCacheFork, PrefixHitResumedFromAMemoEqualsAFreshWalk) {
  KVCache kv(fork_config(6, true));
  std::vector<int32_t> toks(80);
  for (int i = 0; i < 80; ++i) toks[size_t(i)] = 7 * i + 3;
  KVCache::PrefixMemo memo;
  using Hit = std::pair<int64_t, int32_t>;  // tokens, idle blocks
  const auto same = [&](int64_t max) {
    const KVCache::PrefixHit a = kv.prefix_hit(toks, max, 0, memo), b = kv.prefix_hit(toks, max);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.blocks, b.blocks);
    EXPECT_EQ(a.idle_blocks, b.idle_blocks);
    return Hit(a.tokens, a.idle_blocks);
  };
  EXPECT_EQ(same(63), Hit(0, 0));
  ASSERT_TRUE(kv.reserve(1, 33));
  write_positions(kv, 1, 0, 32, 0);
  kv.publish(1, toks, 32);
  EXPECT_EQ(same(63), Hit(32, 0));  // held by sequence 1
  ASSERT_TRUE(kv.reserve(1, 49));
  write_positions(kv, 1, 32, 48, 0);
  kv.publish(1, toks, 48);
  EXPECT_EQ(same(63), Hit(48, 0));  // resumed after the two it had
  kv.release(1);
  EXPECT_EQ(same(63), Hit(48, 3));  // idle now
  EXPECT_EQ(same(40), Hit(32, 2));  // fewer tokens than it had: walked again
  EXPECT_EQ(same(79), Hit(48, 3));  // the tokens grew
  // Another prompt takes every block: the idle ones are evicted.
  ASSERT_TRUE(kv.reserve(2, 96));
  EXPECT_EQ(same(79), Hit(0, 0));
  kv.release(2);
  EXPECT_EQ(same(79), Hit(0, 0));
}

TEST(KVCacheFork, PrefixCacheRefcountsAndChainStayRight) {
  KVCache kv(fork_config(8, true));
  std::vector<int32_t> toks(64);
  for (int i = 0; i < 64; ++i) toks[size_t(i)] = 3 * i + 1;
  ASSERT_TRUE(kv.reserve(1, 41));
  write_positions(kv, 1, 0, 40, 0);
  kv.publish(1, toks, 40);  // blocks 0 and 1
  ASSERT_TRUE(kv.fork(1, 2, 40));
  kv.release(1);
  EXPECT_EQ(kv.cached_blocks(), 0);  // the fork still holds the published blocks
  EXPECT_EQ(kv.free_blocks(), 5);
  // The fork's own next full block publishes on the parent's chain: a later prompt of 48 of
  // these tokens finds all three blocks.
  ASSERT_TRUE(kv.reserve(2, 48));
  write_positions(kv, 2, 40, 48, 0);
  kv.publish(2, toks, 48);
  EXPECT_EQ(kv.prefix_hit(toks, 60).tokens, 48);
  kv.release(2);
  EXPECT_EQ(kv.cached_blocks(), 3);
  EXPECT_EQ(kv.free_blocks(), 8);
  EXPECT_EQ(kv.attach_prefix(3, toks, 63), 48);
  for (int64_t p = 0; p < 48; ++p) EXPECT_EQ(read_k(kv, 0, 3, p), float(p)) << p;
  // A fork of a sequence whose blocks came from the cache shares them: 3 holders, no copy.
  ASSERT_TRUE(kv.fork(3, 4, 48));
  EXPECT_EQ(kv.shared_blocks(4), 3);
  EXPECT_EQ(kv.free_blocks(), 5);
  kv.release(3);
  kv.release(4);
  EXPECT_EQ(kv.cached_blocks(), 3);
  EXPECT_EQ(kv.free_blocks(), 8);
}

}  // namespace
}  // namespace ft
