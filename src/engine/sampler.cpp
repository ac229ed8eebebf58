#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kernels/kernels.h"  // exp_shifted

namespace ft {

namespace {
// top_p's partial sorts (distribution, step 5): the best kTopPFirst candidates first, then
// kTopPGrowth times as many each time their mass falls short.
constexpr size_t kTopPFirst = 256, kTopPGrowth = 8;

// max of x (n > 0, no NaN): 16 running maxima in four 4-lane vectors (GCC and clang vector
// extensions: the vectorizer leaves a max over 16 lanes scalar).
float max_of(const float* x, size_t n) {
  typedef float F4 __attribute__((vector_size(16)));
  F4 m[4];
  for (auto& v : m) v = F4{x[0], x[0], x[0], x[0]};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t k = 0; k < 4; ++k) {
      F4 v;
      std::memcpy(&v, x + i + 4 * k, sizeof v);
      m[k] = m[k] > v ? m[k] : v;
    }
  float r = x[0];
  for (const F4& v : m)
    for (int k = 0; k < 4; ++k) r = std::max(r, v[k]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}
// The first i with x[i] == v (n if none), v not NaN: blocks of 16 compared at once as bits (a
// float compare is not vectorized there), then the one block. Zero compares equal to -0, which
// has other bits: found one by one.
size_t index_of(const float* x, size_t n, float v) {
  size_t i = 0;
  if (v != 0.0f) {
    const uint32_t vb = std::bit_cast<uint32_t>(v);
    for (; i + 16 <= n; i += 16) {
      uint32_t hit = 0;
      for (size_t k = 0; k < 16; ++k) hit |= uint32_t(std::bit_cast<uint32_t>(x[i + k]) == vb);
      if (hit) break;
    }
  }
  while (i < n && x[i] != v) ++i;
  return i;
}
// How many of x[0, n) are finite (exponent bits not all ones), without a branch per token.
size_t count_finite(const float* x, size_t n) {
  uint32_t c[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t k = 0; k < 16; ++k) c[k] += (std::bit_cast<uint32_t>(x[i + k]) & 0x7f800000u) != 0x7f800000u;
  size_t total = 0;
  for (; i < n; ++i) total += std::isfinite(x[i]);
  for (size_t k = 0; k < 16; ++k) total += c[k];
  return total;
}
// Higher logit first; equal logits by lower id, so every ordering is a total order.
bool better(const float* logits, int32_t a, int32_t b) {
  const float la = logits[size_t(a)], lb = logits[size_t(b)];
  return la > lb || (la == lb && a < b);
}
}  // namespace

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    fail("sampling: temperature must be finite and >= 0, got ", p.temperature);
  }
  if (p.top_k < 0) fail("sampling: top_k must be >= 0 (0 = off), got ", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    fail("sampling: top_p must be in (0, 1] (1 = off), got ", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    fail("sampling: min_p must be in [0, 1] (0 = off), got ", p.min_p);
  }
  if (!std::isfinite(p.repetition_penalty) || !(p.repetition_penalty > 0.0f)) {
    fail("sampling: repetition_penalty must be finite and > 0 (1 = off), got ",
         p.repetition_penalty);
  }
  if (!std::isfinite(p.presence_penalty)) {
    fail("sampling: presence_penalty must be finite, got ", p.presence_penalty);
  }
  if (!std::isfinite(p.frequency_penalty)) {
    fail("sampling: frequency_penalty must be finite, got ", p.frequency_penalty);
  }
  if (p.penalty_last_n < -1) {
    fail("sampling: penalty_last_n must be >= -1 (-1 = all, 0 = off), got ", p.penalty_last_n);
  }
  if (!(p.typical_p > 0.0f && p.typical_p <= 1.0f)) {
    fail("sampling: typical_p must be in (0, 1] (1 = off), got ", p.typical_p);
  }
  if (!(p.dynatemp_range >= 0.0f) || !std::isfinite(p.dynatemp_range)) {
    fail("sampling: dynatemp_range must be finite and >= 0 (0 = off), got ", p.dynatemp_range);
  }
  if (!(p.dynatemp_exponent >= 0.0f) || !std::isfinite(p.dynatemp_exponent)) {
    fail("sampling: dynatemp_exponent must be finite and >= 0, got ", p.dynatemp_exponent);
  }
  if (p.mirostat < 0 || p.mirostat > 2) fail("sampling: mirostat must be 0 (off), 1 or 2, got ", p.mirostat);
  if (!(p.mirostat_tau >= 0.0f) || !std::isfinite(p.mirostat_tau)) {
    fail("sampling: mirostat_tau must be finite and >= 0, got ", p.mirostat_tau);
  }
  if (!(p.mirostat_eta >= 0.0f) || !std::isfinite(p.mirostat_eta)) {
    fail("sampling: mirostat_eta must be finite and >= 0, got ", p.mirostat_eta);
  }
  if (p.min_keep < 0) fail("sampling: min_keep must be >= 0, got ", p.min_keep);
}

Sampler::Sampler(const SamplingParams& p, int n_vocab)
    : params_(p), n_vocab_(n_vocab), temperature_(p.temperature), mu_(2.0f * p.mirostat_tau) {
  validate(p);
  if (n_vocab <= 0) fail("sampler: n_vocab must be > 0, got ", n_vocab);
  const size_t n = size_t(n_vocab);
  counts_.assign(n, 0);
  work_.resize(n);
  seen_.assign(n, 0);
  cand_.resize(n);
  prob_.resize(n);
}

void Sampler::check_token(int32_t token) const {
  if (token < 0 || token >= n_vocab_) {
    fail("sampler: token id ", token, " out of range [0, ", n_vocab_, ")");
  }
}

void Sampler::add_prompt(std::span<const int32_t> prompt) {
  for (int32_t t : prompt) check_token(t);
  history_.insert(history_.end(), prompt.begin(), prompt.end());
}

void Sampler::accept(int32_t token) {
  check_token(token);
  history_.push_back(token);
  if (counts_[size_t(token)]++ == 0) generated_.push_back(token);
}

size_t Sampler::distribution(const float* logits, double& sum) {
  const SamplingParams& p = params_;
  const bool repetition = p.repetition_penalty != 1.0f && p.penalty_last_n != 0 && !history_.empty();
  const bool presence = (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && !generated_.empty();

  // 1. Penalties, on a copy (otherwise the logits are read in place).
  if (repetition || presence) std::copy(logits, logits + n_vocab_, work_.begin());
  const float* w = repetition || presence ? work_.data() : logits;
  if (repetition) {
    const size_t window = p.penalty_last_n < 0
                              ? history_.size()
                              : std::min(history_.size(), size_t(p.penalty_last_n));
    const auto first = history_.end() - std::ptrdiff_t(window);
    for (auto it = first; it != history_.end(); ++it) {
      const size_t t = size_t(*it);
      if (seen_[t]) continue;
      seen_[t] = 1;
      float& l = work_[t];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
    for (auto it = first; it != history_.end(); ++it) seen_[size_t(*it)] = 0;
  }
  if (presence) {
    for (int32_t t : generated_) {
      const int32_t c = counts_[size_t(t)];
      work_[size_t(t)] -= float(c) * p.frequency_penalty + p.presence_penalty;
    }
  }

  // Candidates: tokens with a finite logit (NaN and -inf are never drawn). Usually every token:
  // counted first, and only otherwise collected one by one.
  size_t n = count_finite(w, size_t(n_vocab_));
  if (n == 0) fail("sampler: no finite logits (all NaN or -inf)");
  // Every token a candidate: cand_ is 0..n-1 (filled below unless greedy), and maxima are taken
  // straight from the logits.
  const bool all = n == size_t(n_vocab_);
  if (!all) {
    n = 0;
    for (int32_t t = 0; t < n_vocab_; ++t)
      if (std::isfinite(w[size_t(t)])) cand_[n++] = t;
  }
  const auto by_logit = [w](int32_t a, int32_t b) { return better(w, a, b); };

  // 2. Greedy: a point mass on the argmax.
  if (p.temperature <= 0.0f) {
    if (all) {
      cand_[0] = int32_t(index_of(w, n, max_of(w, n)));
    } else {
      cand_[0] = *std::min_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
    }
    prob_[0] = 1.0f;
    sum = 1.0;
    return 1;
  }

  if (all) std::iota(cand_.begin(), cand_.end(), 0);

  // 3. top_k: the k best candidates, sorted (not under mirostat, which truncates by itself).
  bool sorted = false;
  if (p.top_k > 0 && size_t(p.top_k) < n && p.mirostat == 0) {
    const auto k = std::ptrdiff_t(p.top_k);
    if (all) {
      // std::partial_sort's heap selection, with a test on the logits alone for the tokens that
      // cannot enter (most of them: a block of 16 at once when its maximum is not above the
      // heap's worst). Ids ascend, so a logit equal to the worst kept one ranks after it. The same
      // k tokens in the same order, ~35 -> ~10 us a token on a 32,000-token vocabulary.
      const auto heap = cand_.begin();
      std::make_heap(heap, heap + k, by_logit);  // (cand_ is 0..n-1: the first k ids)
      float worst = w[size_t(heap[0])];
      auto offer = [&](size_t i) {
        if (!(w[i] > worst)) return;
        std::pop_heap(heap, heap + k, by_logit);
        heap[k - 1] = int32_t(i);
        std::push_heap(heap, heap + k, by_logit);
        worst = w[size_t(heap[0])];
      };
      size_t i = size_t(k);
      for (; i < n && i % 16 != 0; ++i) offer(i);
      for (; i + 16 <= n; i += 16) {
        float m = w[i];
        for (size_t j = 1; j < 16; ++j) m = std::max(m, w[i + j]);
        if (m > worst)
          for (size_t j = 0; j < 16; ++j) offer(i + j);
      }
      for (; i < n; ++i) offer(i);
      std::sort_heap(heap, heap + k, by_logit);
    } else {
      std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.begin() + std::ptrdiff_t(n), by_logit);
    }
    n = size_t(p.top_k);
    sorted = true;
  }

  // 4. Softmax at the temperature (unnormalised; the sum is kept in double). Every candidate's
  // exp: the kernels' vector exp (a full vocabulary's took ~0.2 ms with std::exp, most of a
  // small model's decode step).
  float max_logit = -INFINITY;
  if (all && !sorted) {
    max_logit = max_of(w, n);
  } else {
    for (size_t i = 0; i < n; ++i) max_logit = std::max(max_logit, w[size_t(cand_[i])]);
  }
  temperature_ = p.temperature;
  if (p.dynatemp_range > 0.0f && p.mirostat == 0) dynamic_temperature(w, n, max_logit, all && !sorted);
  exp_of_candidates(w, n, max_logit, all && !sorted);
  sum = sum_of_probs(n);
  if (p.mirostat != 0) return mirostat(w, n, sum, max_logit, sorted);
  const size_t need = std::min(n, size_t(std::max(p.min_keep, 1)));  // what each filter keeps at least

  // 4b. typical_p: the candidates nearest the entropy in surprise, as many as reach the mass.
  if (p.typical_p < 1.0f && n > 1) {
    n = typical(w, n, sum);
    sorted = true;
  }

  // 5. top_p over the probability-sorted candidates (probabilities are monotone in the logits,
  // so sorting by logit is sorting by probability), sorted only as far as the kept prefix
  // reaches: the best k by a partial sort (the full sort's first k, in its order), k growing
  // kTopPGrowth-fold until their mass reaches top_p (a full sort of a 32,000-token vocabulary
  // took ~3 ms a token, longer than a small model's whole decode step).
  if (p.top_p < 1.0f && n > 1) {
    const double target = double(p.top_p) * sum;
    for (size_t k = sorted ? n : std::min(n, std::max(kTopPFirst, need));; k = std::min(n, k * kTopPGrowth)) {
      if (!sorted) sort_prefix(w, k, n, max_logit);
      double cum = 0.0;
      size_t keep = 0;
      for (size_t i = 0; i < k && keep == 0; ++i) {
        cum += prob_[i];
        if (cum >= target) keep = i + 1;
      }
      if (keep > 0 || k == n) {
        for (; keep > 0 && keep < need; ++keep) cum += prob_[keep];  // min_keep
        n = keep > 0 ? keep : n;
        sum = cum;  // mass of the kept prefix
        break;
      }
    }
  }

  // 6. min_p relative to the most likely candidate: exp(0) = 1 unless typical_p dropped it (the
  // candidates are then sorted, so it is the first).
  if (p.min_p > 0.0f) {
    const float bound = p.min_p * (sorted ? prob_[0] : 1.0f);
    size_t passing = 0;
    for (size_t i = 0; i < n; ++i) passing += prob_[i] >= bound;  // p_i / p_max >= min_p
    if (passing < need) {  // min_keep: the best `need` instead
      if (!sorted) sort_prefix(w, need, n, max_logit);
      n = need;
      sum = sum_of_probs(n);
    } else {
      size_t kept = 0;
      double kept_sum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        if (prob_[i] >= bound) {
          cand_[kept] = cand_[i];
          prob_[kept] = prob_[i];
          kept_sum += prob_[i];
          ++kept;
        }
      }
      n = kept;  // >= 1: the maximum passes
      sum = kept_sum;
    }
  }
  return n;
}

void Sampler::sort_prefix(const float* logits, size_t k, size_t n, float max_logit) {
  const auto by_logit = [logits](int32_t a, int32_t b) { return better(logits, a, b); };
  if (k < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(k), cand_.begin() + std::ptrdiff_t(n), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
  }
  exp_of_candidates(logits, k, max_logit, false);
}

// llama.cpp's temp_ext: the entropy H of the candidates at temperature 1 over its maximum
// log(n) sets t = lo + (hi - lo) (H / log n)^exponent, lo = max(0, T - range), hi = T + range.
void Sampler::dynamic_temperature(const float* logits, size_t n, float max_logit, bool all_in_order) {
  if (n <= 1) return;
  temperature_ = 1.0f;
  exp_of_candidates(logits, n, max_logit, all_in_order);
  const double s = sum_of_probs(n);
  double h = 0;  // -sum (p/s) log(p/s) = log s - sum p log p / s
  for (size_t i = 0; i < n; ++i)
    if (prob_[i] > 0) h -= double(prob_[i]) * std::log(double(prob_[i]));
  h = h / s + std::log(s);
  const double lo = std::max(0.0, double(params_.temperature) - params_.dynatemp_range);
  const double hi = double(params_.temperature) + params_.dynatemp_range;
  const double t = lo + (hi - lo) * std::pow(std::clamp(h / std::log(double(n)), 0.0, 1.0), double(params_.dynatemp_exponent));
  temperature_ = float(std::clamp(t, 1e-6, 1e30));  // (0: the maximum alone, as greedy)
}

// Locally typical sampling: with p normalised and H = -sum p log p, candidates in increasing
// |-log p - H| until their mass exceeds typical_p (at least min_keep), then back in logit order.
size_t Sampler::typical(const float* logits, size_t n, double& sum) {
  double h = 0;
  for (size_t i = 0; i < n; ++i) {
    const double q = double(prob_[i]) / sum;
    if (q > 0) h -= q * std::log(q);
  }
  std::vector<Typical>& c = typical_;
  c.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double q = double(prob_[i]) / sum;
    c[i] = {q > 0 ? std::abs(-std::log(q) - h) : INFINITY, cand_[i], prob_[i]};
  }
  const auto nearer = [](const Typical& a, const Typical& b) { return a.score < b.score || (a.score == b.score && a.id < b.id); };
  const size_t need = std::min(n, size_t(std::max(params_.min_keep, 1)));
  const double target = double(params_.typical_p) * sum;
  // The nearest first, sorted only as far as the kept prefix reaches (top_p's growth).
  size_t keep = n;
  for (size_t k = std::min(n, std::max(kTopPFirst, need)), done = 0;; k = std::min(n, k * kTopPGrowth)) {
    std::partial_sort(c.begin() + std::ptrdiff_t(done), c.begin() + std::ptrdiff_t(k), c.end(), nearer);
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += c[i].prob;
      if (cum > target && i + 1 >= need) {
        keep = i + 1;
        break;
      }
    }
    if (keep < n || k == n) break;
    done = k;
  }
  std::sort(c.begin(), c.begin() + std::ptrdiff_t(keep), [logits](const Typical& a, const Typical& b) { return better(logits, a.id, b.id); });
  for (size_t i = 0; i < keep; ++i) cand_[i] = c[i].id, prob_[i] = c[i].prob;
  sum = sum_of_probs(keep);
  return keep;
}

// Mirostat (Basu et al. 2021, llama.cpp's versions). 2: the candidates of surprise
// -log2 p <= mu (at least the best). 1: the best k, k from the Zipf exponent s estimated on the
// best 100: k = (e 2^mu / (1 - V^-e))^(1/s), e = s - 1. sample() then moves mu by eta times
// the drawn token's surprise (in the kept, renormalised distribution) minus tau.
size_t Sampler::mirostat(const float* logits, size_t n, double& sum, float max_logit, bool sorted) {
  size_t k = 1;
  if (params_.mirostat == 2) {
    const double bound = sum * std::exp2(-double(mu_));
    k = 0;
    for (size_t i = 0; i < n; ++i) k += double(prob_[i]) >= bound;
    k = std::max<size_t>(k, 1);
  } else if (n > 1) {
    const size_t m = std::min<size_t>(n, 100);
    if (!sorted) sort_prefix(logits, m, n, max_logit);
    double ti_bi = 0, ti_sq = 0;
    for (size_t i = 0; i + 1 < m && prob_[i + 1] > 0; ++i) {
      const double t = std::log(double(i + 2) / double(i + 1));
      ti_bi += t * std::log(double(prob_[i]) / double(prob_[i + 1]));
      ti_sq += t * t;
    }
    const double s_hat = ti_sq > 0 ? ti_bi / ti_sq : 1.0;
    const double e = s_hat - 1;
    const double kk = std::pow(e * std::exp2(double(mu_)) / (1 - std::pow(double(n_vocab_), -e)), 1 / s_hat);
    k = kk >= double(n) ? n : kk >= 1 ? size_t(kk) : 1;  // (NaN, at s = 1 exactly: 1; +inf: all)
  }
  if (!sorted) sort_prefix(logits, k, n, max_logit);
  sum = sum_of_probs(k);
  return k;
}

void Sampler::exp_of_candidates(const float* logits, size_t n, float max_logit, bool all_in_order) {
  const float* x = logits;
  if (!all_in_order) {
    for (size_t i = 0; i < n; ++i) prob_[i] = logits[size_t(cand_[i])];
    x = prob_.data();
  }
  exp_shifted(x, int64_t(n), max_logit, temperature_, prob_.data());
}

double Sampler::sum_of_probs(size_t n) const {
  // Four running sums (one order on every machine), so the adds do not wait on each other.
  double s[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (size_t k = 0; k < 4; ++k) s[k] += prob_[i + k];
  for (; i < n; ++i) s[0] += prob_[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: a bijection, every input bit in every output bit
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

double Sampler::uniform_at(uint64_t seed, uint64_t position) {
  // The seed hashed first, so (seed + 1, i) and (seed, i + 1) (n choices are seeded seed + i)
  // share nothing.
  const uint64_t h = mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ (position * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  return double(h >> 11) * 0x1.0p-53;
}

size_t Sampler::draw(size_t n, double sum, double u) {
  // The first candidate whose cumulative mass exceeds u * sum.
  const double target = u * sum;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob_[i];
    if (cum > target) return i;
  }
  return n - 1;  // rounding left target at the very end of the mass
}

void Sampler::write_probs(size_t n, double sum, float* probs) const {
  std::fill(probs, probs + n_vocab_, 0.0f);
  for (size_t i = 0; i < n; ++i) probs[size_t(cand_[i])] = float(double(prob_[i]) / sum);
}

int32_t Sampler::sample(const float* logits, float* probs) {
  const uint64_t position = position_++;  // (greedy too: the position is the token's index)
  double sum = 0;
  const size_t n = distribution(logits, sum);
  if (probs) write_probs(n, sum, probs);
  // 7. Draw (greedy: the argmax, no randomness).
  if (params_.temperature <= 0.0f) return cand_[0];
  const size_t i = draw(n, sum, uniform_at(params_.seed, position));
  if (params_.mirostat != 0)
    mu_ -= params_.mirostat_eta * (float(-std::log2(double(prob_[i]) / sum)) - params_.mirostat_tau);
  return cand_[i];
}

int32_t Sampler::verify(const float* logits, int32_t draft, bool& accepted) {
  check_token(draft);
  // Sample the target's token at this position, then compare: exact (the token is the one
  // sample() draws here) and deterministic per position. Rejection sampling with the drafter's
  // probabilities (min(1, p/q)) would also follow p, but with a u of its own: which token a
  // position gets would then depend on whether it was drafted.
  const int32_t tok = sample(logits);
  accepted = tok == draft;
  return tok;
}

}  // namespace ft
