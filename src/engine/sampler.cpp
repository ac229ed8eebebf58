#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"  // exp_shifted

namespace ft {

namespace {
// max of x (n > 0, no NaN): four running maxima, so the comparisons do not wait on each other.
float max_of(const float* x, size_t n) {
  float m[4] = {x[0], x[0], x[0], x[0]};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (size_t k = 0; k < 4; ++k) m[k] = std::max(m[k], x[i + k]);
  for (; i < n; ++i) m[0] = std::max(m[0], x[i]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
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
}

Sampler::Sampler(const SamplingParams& p, int n_vocab)
    : params_(p), n_vocab_(n_vocab), rng_(p.seed) {
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
  std::copy(logits, logits + n_vocab_, work_.begin());

  // 1. Penalties.
  if (p.repetition_penalty != 1.0f && p.penalty_last_n != 0) {
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
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (int32_t t : generated_) {
      const int32_t c = counts_[size_t(t)];
      work_[size_t(t)] -= float(c) * p.frequency_penalty + p.presence_penalty;
    }
  }

  // Candidates: tokens with a finite logit (NaN and -inf are never drawn).
  size_t n = 0;
  for (int32_t t = 0; t < n_vocab_; ++t) {
    if (std::isfinite(work_[size_t(t)])) cand_[n++] = t;
  }
  if (n == 0) fail("sampler: no finite logits (all NaN or -inf)");
  // Higher logit first; equal logits by lower id, so every ordering is a total order.
  const auto by_logit = [this](int32_t a, int32_t b) {
    const float la = work_[size_t(a)], lb = work_[size_t(b)];
    return la > lb || (la == lb && a < b);
  };

  // Every token a candidate: cand_ is 0..n-1, and maxima are taken straight from work_.
  const bool all = n == size_t(n_vocab_);

  // 2. Greedy: a point mass on the argmax.
  if (p.temperature <= 0.0f) {
    if (all) {
      const float mx = max_of(work_.data(), n);
      cand_[0] = int32_t(std::find(work_.begin(), work_.begin() + std::ptrdiff_t(n), mx) - work_.begin());
    } else {
      cand_[0] = *std::min_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
    }
    prob_[0] = 1.0f;
    sum = 1.0;
    return 1;
  }

  // 3. top_k: the k best candidates, sorted.
  bool sorted = false;
  if (p.top_k > 0 && size_t(p.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p.top_k, cand_.begin() + std::ptrdiff_t(n),
                      by_logit);
    n = size_t(p.top_k);
    sorted = true;
  }

  // 4. Softmax at the temperature (unnormalised; the sum is kept in double). Every candidate's
  // exp: the kernels' vector exp (a full vocabulary's took ~0.2 ms with std::exp, most of a
  // small model's decode step).
  float max_logit = -INFINITY;
  if (all && !sorted) {
    max_logit = max_of(work_.data(), n);
  } else {
    for (size_t i = 0; i < n; ++i) max_logit = std::max(max_logit, work_[size_t(cand_[i])]);
  }
  exp_of_candidates(n, max_logit, all && !sorted);
  sum = sum_of_probs(n);

  // 5. top_p over the probability-sorted candidates (probabilities are monotone in the logits,
  // so sorting by logit is sorting by probability).
  if (p.top_p < 1.0f && n > 1) {
    if (!sorted) {
      std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
      exp_of_candidates(n, max_logit, false);
      sorted = true;
    }
    const double target = double(p.top_p) * sum;
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob_[i];
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = cum;  // mass of the kept prefix
  }

  // 6. min_p relative to the most likely token (whose unnormalised probability is exp(0) = 1).
  if (p.min_p > 0.0f) {
    size_t kept = 0;
    double kept_sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (prob_[i] >= p.min_p) {  // p_i / p_max >= min_p
        cand_[kept] = cand_[i];
        prob_[kept] = prob_[i];
        kept_sum += prob_[i];
        ++kept;
      }
    }
    n = kept;  // >= 1: the maximum has prob_ 1 >= min_p
    sum = kept_sum;
  }
  return n;
}

void Sampler::exp_of_candidates(size_t n, float max_logit, bool all_in_order) {
  const float* x = work_.data();
  if (!all_in_order) {
    for (size_t i = 0; i < n; ++i) prob_[i] = work_[size_t(cand_[i])];
    x = prob_.data();
  }
  exp_shifted(x, int64_t(n), max_logit, params_.temperature, prob_.data());
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

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::draw(size_t n, double sum) {
  // u in [0,1) from the top 53 bits, then the first candidate whose cumulative mass exceeds u * sum.
  const double target = uniform() * sum;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob_[i];
    if (cum > target) return cand_[i];
  }
  return cand_[n - 1];  // rounding left target at the very end of the mass
}

void Sampler::write_probs(size_t n, double sum, float* probs) const {
  std::fill(probs, probs + n_vocab_, 0.0f);
  for (size_t i = 0; i < n; ++i) probs[size_t(cand_[i])] = float(double(prob_[i]) / sum);
}

int32_t Sampler::sample(const float* logits, float* probs) {
  double sum = 0;
  const size_t n = distribution(logits, sum);
  if (probs) write_probs(n, sum, probs);
  // 7. Draw (greedy: the argmax, no randomness consumed).
  if (params_.temperature <= 0.0f) return cand_[0];
  return draw(n, sum);
}

int32_t Sampler::verify(const float* logits, int32_t draft, const float* q, bool& accepted) {
  check_token(draft);
  double sum = 0;
  size_t n = distribution(logits, sum);
  if (params_.temperature <= 0.0f) {  // greedy: the draft stands iff it is the argmax
    accepted = cand_[0] == draft;
    return cand_[0];
  }
  // p(draft) under the target's distribution (0 when filtered out), q(draft) under the drafter's.
  double p_draft = 0;
  for (size_t i = 0; i < n; ++i)
    if (cand_[i] == draft) p_draft = double(prob_[i]) / sum;
  const double q_draft = q ? double(q[draft]) : 1.0;
  // Accept with probability min(1, p/q): u < p/q  <=>  u q < p.
  if (uniform() * q_draft < p_draft) {
    accepted = true;
    return draft;
  }
  accepted = false;
  // Rejected: draw from the residual max(0, p - q), normalised (p and q both normalised here).
  double rsum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double pi = double(prob_[i]) / sum;
    const double qi = q ? double(q[cand_[i]]) : (cand_[i] == draft ? 1.0 : 0.0);
    prob_[i] = float(std::max(0.0, pi - qi));
    rsum += prob_[i];
  }
  if (!(rsum > 0)) {  // p <= q everywhere yet rejected: only by rounding; p itself is then exact
    n = distribution(logits, sum);
    return draw(n, sum);
  }
  return draw(n, rsum);
}

}  // namespace ft
