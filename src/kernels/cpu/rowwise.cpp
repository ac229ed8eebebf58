#include "kernels/cpu/rowwise.h"

#include <cmath>

#include "core/error.h"
#include "kernels/quant.h"

namespace ft::rowwise {

void add_bias(float* Y, int64_t M, int64_t N, const float* bias) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) Y[m * N + n] += bias[n];
}

void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * n;
    float* yr = y + m * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) {
  const uint64_t rb = *row_bytes(E.type, uint64_t(E.n_cols));
  for (int64_t m = 0; m < M; ++m)
    dequantize_row(E.type, static_cast<const uint8_t*>(E.data) + uint64_t(tokens[m]) * rb,
                   out + m * E.n_cols, E.n_cols);
}

void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos,
          const RopeParams& p, int threads) {
  // Same arithmetic as the reference (theta accumulated multiplicatively, as ggml does); the
  // cos/sin table of one row lives on the stack (n_rot <= 512).
  if (p.n_rot > 512) fail("rope: n_rot ", p.n_rot, " exceeds 512");
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
#pragma omp parallel for schedule(static) num_threads(threads) if (M * n_heads * head_dim > 65536)
  for (int64_t m = 0; m < M; ++m) {
    float cs[512];
    float theta = float(pos[m]) * p.freq_scale;
    for (int32_t i = 0; i < p.n_rot / 2; ++i) {
      const float t = p.freq_factors ? theta / p.freq_factors[i] : theta;
      cs[2 * i] = std::cos(t);
      cs[2 * i + 1] = std::sin(t);
      theta *= theta_scale;
    }
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (m * n_heads + h) * head_dim;
      for (int32_t i = 0; i < p.n_rot / 2; ++i) {
        const int32_t a = p.style == RopeStyle::Interleaved ? 2 * i : i;
        const int32_t b = p.style == RopeStyle::Interleaved ? 2 * i + 1 : i + p.n_rot / 2;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

void swiglu(const float* gate, const float* up, float* a, int64_t M, int64_t n) {
  for (int64_t i = 0; i < M * n; ++i) {
    const float g = gate[i];
    a[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(float* y, const float* x, int64_t M, int64_t n) {
  for (int64_t i = 0; i < M * n; ++i) y[i] += x[i];
}

}  // namespace ft::rowwise
