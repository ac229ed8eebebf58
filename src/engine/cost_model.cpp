#include "engine/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ft {

OnlineCostModel::OnlineCostModel(const CostModel& prior, const CostModelLearning& l) : l_(l), model_(prior) {
  theta_ = {prior.base_ms * kScale[0], prior.per_token_ms * kScale[1], prior.per_attn_ms * kScale[2]};
  // Each coefficient's prior standard deviation is about its own size (at least 1 ms).
  for (int i = 0; i < K; ++i) P_[i][i] = l_.prior_variance * (theta_[i] * theta_[i] + 1);
  publish();
}

void OnlineCostModel::observe(int64_t tokens, double attn_pairs, double forward_ms) {
  if (!(forward_ms > 0) || tokens <= 0) return;
  // Weighted by 1/measured: the residual is the relative error.
  const std::array<double, K> x = {1.0 / kScale[0] / forward_ms, double(tokens) / kScale[1] / forward_ms,
                                   attn_pairs / kScale[2] / forward_ms};
  double pred = 0;
  for (int i = 0; i < K; ++i) pred += x[i] * theta_[i];
  const double r = 1.0 - pred;
  const double lim = l_.huber_k * scale_;
  const double rc = std::clamp(r, -lim, lim);
  // The scale follows the clipped residuals: an isolated outlier barely moves it, a lasting
  // change of regime grows it by up to (1 + 0.05 (k - 1)) per step until it is no longer clipped.
  scale_ = std::max(l_.min_scale, 0.95 * scale_ + 0.05 * std::abs(rc));

  std::array<double, K> Px{};
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) Px[i] += P_[i][j] * x[j];
  double den = l_.forgetting;
  for (int i = 0; i < K; ++i) den += x[i] * Px[i];
  std::array<double, K> g{};
  for (int i = 0; i < K; ++i) g[i] = Px[i] / den;
  for (int i = 0; i < K; ++i) theta_[i] = std::max(0.0, theta_[i] + g[i] * rc);
  double trace = 0, bound = 0;
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) P_[i][j] = (P_[i][j] - g[i] * Px[j]) / l_.forgetting;
  for (int i = 0; i < K; ++i) {
    trace += P_[i][i];
    bound += l_.max_variance * (theta_[i] * theta_[i] + 1);
  }
  if (trace > bound)
    for (auto& row : P_)
      for (double& v : row) v *= bound / trace;
  ++n_;
  publish();
}

void OnlineCostModel::publish() {
  model_.base_ms = theta_[0] / kScale[0];
  model_.per_token_ms = theta_[1] / kScale[1];
  model_.per_attn_ms = theta_[2] / kScale[2];
}

void PredictionErrorHistogram::observe(double ratio) {
  size_t i = 0;
  while (i < kBounds.size() && ratio > kBounds[i]) ++i;
  ++counts[i];
  sum += ratio;
  ++count;
}

}  // namespace ft
