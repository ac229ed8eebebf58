#include "engine/cost_model.h"

#include <algorithm>
#include <cmath>

namespace ft {

OnlineCostModel::OnlineCostModel(const CostModel& prior, const CostModelLearning& l) : l_(l), model_(prior) {
  theta_ = {prior.base_ms * kScale[0], prior.per_token_ms * kScale[1], prior.per_attn_ms * kScale[2],
            prior.warm_up_ms * kScale[3]};
  // Each coefficient's prior standard deviation is about its own size (at least 1 ms); the
  // warm-up's, of a prior that rarely knows it, the base's.
  for (int i = 0; i < K; ++i) P_[i][i] = l_.prior_variance * (theta_[i] * theta_[i] + 1);
  P_[3][3] = std::max(P_[3][3], P_[0][0]);
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

  std::array<double, K> Px{};
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) Px[i] += P_[i][j] * x[j];
  double den = l_.forgetting;
  for (int i = 0; i < K; ++i) den += x[i] * Px[i];
  std::array<double, K> g{};
  for (int i = 0; i < K; ++i) g[i] = Px[i] / den;
  for (int i = 0; i < K; ++i) theta_[i] = std::max(0.0, theta_[i] + g[i] * rc);
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) P_[i][j] = (P_[i][j] - g[i] * Px[j]) / l_.forgetting;
  // Each coefficient's variance bounded on its own (P <- D P D, D diagonal: P stays positive
  // semi-definite): a feature never excited (a machine that never idles) winds up only its own
  // and leaves the others' gains alone.
  for (int i = 0; i < K; ++i) {
    const double bound = l_.max_variance * (theta_[i] * theta_[i] + 1);
    if (!(P_[i][i] > bound)) continue;
    const double f = std::sqrt(bound / P_[i][i]);
    for (int j = 0; j < K; ++j) P_[i][j] *= f, P_[j][i] *= f;
  }
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
