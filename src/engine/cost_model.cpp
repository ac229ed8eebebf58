#include "engine/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ft {

namespace {

// x = A⁻¹ b over the indices i with use[i] (the others of x untouched), A symmetric positive
// definite on them (Cholesky). False where it is not.
template <size_t K>
bool solve_spd(const std::array<std::array<double, K>, K>& A, const std::array<double, K>& b,
               const std::array<bool, K>& use, std::array<double, K>& x) {
  std::array<size_t, K> idx{};
  size_t n = 0;
  for (size_t i = 0; i < K; ++i)
    if (use[i]) idx[n++] = i;
  std::array<std::array<double, K>, K> L{};
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = A[idx[i]][idx[j]];
      for (size_t k = 0; k < j; ++k) s -= L[i][k] * L[j][k];
      if (i == j) {
        if (!(s > 0)) return false;
        L[i][i] = std::sqrt(s);
      } else {
        L[i][j] = s / L[j][j];
      }
    }
  }
  std::array<double, K> y{};
  for (size_t i = 0; i < n; ++i) {
    double s = b[idx[i]];
    for (size_t k = 0; k < i; ++k) s -= L[i][k] * y[k];
    y[i] = s / L[i][i];
  }
  for (size_t i = n; i-- > 0;) {
    double s = y[i];
    for (size_t k = i + 1; k < n; ++k) s -= L[k][i] * y[k];
    y[i] = s / L[i][i];
  }
  for (size_t i = 0; i < n; ++i) x[idx[i]] = y[i];
  return true;
}

}  // namespace

OnlineCostModel::OnlineCostModel(const CostModel& prior, const CostModelLearning& l) : l_(l), model_(prior) {
  theta_ = {prior.base_ms * kScale[0], prior.per_token_ms * kScale[1], prior.per_attn_ms * kScale[2],
            prior.warm_up_ms * kScale[3]};
  // Each coefficient's prior standard deviation is about its own size (at least 1 ms); the
  // warm-up's, of a prior that rarely knows it, the base's.
  std::array<double, K> var{};
  for (int i = 0; i < K; ++i) var[i] = l_.prior_variance * (theta_[i] * theta_[i] + 1);
  var[3] = std::max(var[3], var[0]);
  for (int i = 0; i < K; ++i) prior_info_[i] = R_[i][i] = 1.0 / var[i];
  model_.cold = 0;
  publish();
}

void OnlineCostModel::observe(int64_t tokens, double attn_pairs, double forward_ms, double cold) {
  if (!(forward_ms > 0) || tokens <= 0) return;
  // Weighted by 1/measured: the residual is the relative error.
  const std::array<double, K> x = {1.0 / kScale[0] / forward_ms, double(tokens) / kScale[1] / forward_ms,
                                   attn_pairs / kScale[2] / forward_ms, std::clamp(cold, 0.0, 1.0) / kScale[3] / forward_ms};
  double pred = 0;
  for (int i = 0; i < K; ++i) pred += x[i] * theta_[i];
  const double r = 1.0 - pred;
  const double lim = l_.huber_k * scale_;
  const double rc = std::clamp(r, -lim, lim);
  // The scale follows the clipped residuals: an isolated outlier barely moves it, a lasting
  // change of regime grows it by up to (1 + 0.05 (k - 1)) per step until it is no longer clipped.
  scale_ = std::max(l_.min_scale, 0.95 * scale_ + 0.05 * std::abs(rc));

  // R <- λ R + (1 - λ) F + x xᵀ (F: min_information x the prior's information), then
  // θ <- θ + R⁻¹ x rc: the recursive least squares step, whose information in a direction no
  // step excites decays to F's and no further (its gain bounded: no wind-up).
  const double lambda = l_.forgetting;
  std::array<double, K> floor{};
  for (int i = 0; i < K; ++i) floor[i] = l_.min_information * prior_info_[i];
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) R_[i][j] = lambda * R_[i][j] + x[i] * x[j] + (i == j ? (1 - lambda) * floor[i] : 0.0);
  const std::array<bool, K> all{true, true, true, true};
  std::array<double, K> g{};
  if (!solve_spd(R_, x, all, g)) return;  // (R >= its floor > 0: never)
  std::array<double, K> u{};
  for (int i = 0; i < K; ++i) u[i] = theta_[i] + g[i] * rc;
  // Non-negative: the nearest such θ in R's metric. Coefficients below 0 are fixed at 0 and
  // the others re-solved given them (θ_F = u_F + R_FF⁻¹ R_FZ u_Z), until none is below 0.
  std::array<bool, K> free{};
  for (int i = 0; i < K; ++i) free[i] = u[i] >= 0;
  std::array<double, K> t = u;
  for (int round = 0; round < K; ++round) {
    std::array<double, K> rhs{}, d{};
    bool any_fixed = false;
    for (int i = 0; i < K; ++i) {
      if (!free[i]) {
        any_fixed = true;
        continue;
      }
      for (int z = 0; z < K; ++z)
        if (!free[z]) rhs[i] += R_[i][z] * u[z];
    }
    if (!any_fixed || !solve_spd(R_, rhs, free, d)) break;
    bool below = false;
    for (int i = 0; i < K; ++i) {
      t[i] = free[i] ? u[i] + d[i] : 0.0;
      if (free[i] && t[i] < 0) free[i] = false, below = true;
    }
    if (!below) break;
  }
  for (int i = 0; i < K; ++i) theta_[i] = std::max(0.0, t[i]);
  ++n_;
  publish();
}

void OnlineCostModel::publish() {
  model_.base_ms = theta_[0] / kScale[0];
  model_.per_token_ms = theta_[1] / kScale[1];
  model_.per_attn_ms = theta_[2] / kScale[2];
  model_.warm_up_ms = theta_[3] / kScale[3];
}

void PredictionErrorHistogram::observe(double ratio) {
  size_t i = 0;
  while (i < kBounds.size() && ratio > kBounds[i]) ++i;
  ++counts[i];
  sum += ratio;
  ++count;
}

}  // namespace ft
