// The step-cost model: predicted forward time of one step from its features, refitted after every
// measured step, so that no single moment (a noisy start-up calibration, another process, a
// frequency change) can mis-size the chunks of a whole run.
//
// Features of a step: 1, tokens (prefill and decode rows alike: each is one row of the same
// GEMMs), attention pairs (Σ over the step's tokens of the positions each attends to, which is
// also what the step reads of the KV cache), and how cold the machine is: a step begun as the
// engine turns busy after an idle gap runs slower, by warm_up_ms x exp(-busy ms / kWarmUpTauMs)
// (on a shared Xeon a decode step right after a second of idle took 1.6x its time once warm, back
// within ~30 ms of busy time, as a plain loop reading 16 MB does: the memory path, not our code).
// The weights are fitted by recursive least squares in information form, the relative error
// the residual (each step weighs 1/measured², so short and long steps count alike), with
// Huber-clipped residuals (a step 3 robust scales off moves the fit as if it were 3 scales off)
// and non-negative coefficients (the nearest such fit in the information's metric). Forgetting
// decays the information towards a floor, a fraction of the prior's, never below it: in a
// direction that no step excites (decode-only traffic: every step has 1 token, so base and per
// token are one direction) the gain stays bounded. Forgetting without a floor wound the gain up
// there until the fit diverged: base 0 and 68 ms a token after 1,600 single-stream decodes of
// ~1.6 ms (a per-coefficient bound that grew with the coefficient did not stop it). The
// start-up calibration is the prior.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace ft {

// Warm-up: an idle gap between steps of at least kWarmUpIdleMs starts a busy period; a step begun
// `busy` ms into one is exp(-busy / kWarmUpTauMs) cold (1 at its start).
inline constexpr double kWarmUpIdleMs = 20, kWarmUpTauMs = 15;
inline double warm_up_coldness(double busy_ms) { return std::exp(-std::max(0.0, busy_ms) / kWarmUpTauMs); }

// Predicted forward time of one step: base + per_token * tokens + per_attn * attention pairs
// + warm_up * cold (cold: of the step predicted, 0 = warm; a copy of the model carries it).
struct CostModel {
  double base_ms = 1.0;
  double per_token_ms = 0.1;
  double per_attn_ms = 0.0;  // per (query token x context position)
  double warm_up_ms = 0.0;   // extra time of a step begun fully cold
  double cold = 0;
  double predict(int64_t tokens, double attn_pairs) const {
    return base_ms + per_token_ms * double(tokens) + per_attn_ms * attn_pairs + warm_up_ms * cold;
  }
};

struct CostModelLearning {
  double forgetting = 0.995;   // per step: ~200 steps of memory
  double prior_variance = 1;   // P0 (relative-error units): how far the first steps may move the prior
  double min_information = 0.01;  // forgetting stops at this x the prior's information (P <= P0 / it):
                                  // a stronger floor slows the fit (at 1: errors 1.1-1.5% against 0.2%)
  double huber_k = 3;          // residuals beyond k robust scales are clipped
  double min_scale = 0.02;     // the robust scale's floor (relative error)
};

class OnlineCostModel {
 public:
  explicit OnlineCostModel(const CostModel& prior = {}, const CostModelLearning& l = {});
  // One measured step (forward_ms > 0; others are ignored); cold: warm_up_coldness at its start.
  void observe(int64_t tokens, double attn_pairs, double forward_ms, double cold = 0);
  const CostModel& model() const { return model_; }
  uint64_t observations() const { return n_; }

 private:
  static constexpr int K = 4;
  // Features are scaled to comparable magnitudes (a step's tokens in hundreds, pairs in 1e5s) so
  // that P stays well conditioned.
  static constexpr std::array<double, K> kScale = {1.0, 256.0, 65536.0, 1.0};
  using Matrix = std::array<std::array<double, K>, K>;
  void publish();
  CostModelLearning l_;
  std::array<double, K> theta_{};  // coefficients on scaled features
  std::array<double, K> prior_info_{};  // the prior's information (diagonal, 1 / P0)
  Matrix R_{};                     // information matrix (the inverse covariance)
  double scale_ = 0.1;                   // robust scale of the relative residual (EWMA of |r|)
  uint64_t n_ = 0;
  CostModel model_;
};

// Distribution of |predicted - measured| / measured over steps (Prometheus-style buckets).
struct PredictionErrorHistogram {
  static constexpr std::array<double, 11> kBounds = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5};
  std::array<uint64_t, kBounds.size() + 1> counts{};  // per bucket, not cumulative; last = above every bound
  double sum = 0;
  uint64_t count = 0;
  void observe(double ratio);
  double mean() const { return count ? sum / double(count) : 0; }
};

}  // namespace ft
