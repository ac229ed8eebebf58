#include "kernels/cpu/rowwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

// No FMA contraction here: RoPE's rotation must round the same way wherever it is inlined (the
// separate pass and the GEMM epilogue give bit-identical results).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ft::rowwise {

using cpu::parallel_for_static;

void add_bias(float* Y, int64_t M, int64_t N, const float* bias) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) Y[m * N + n] += bias[n];
}

void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * n;
    float* yr = y + m * n;
    // Sum of squares in double, in 8 interleaved partial sums (lane j takes i = j mod 8) that
    // the compiler keeps in vector registers: one serial chain of n dependent adds was ~4
    // cycles per element (~6 us per 2048-wide row, 45 rows per decode step of a 22-layer
    // model, 5x that for a speculative verification). Each square is exact in double; only
    // the order of the additions differs from a serial sum (then rounded to the float scale).
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) part[j] += double(xr[i + j]) * xr[i + j];
    for (; i < n; ++i) part[i % 8] += double(xr[i]) * xr[i];
    const double ss = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    const float scale = float(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) {
  if (E.layout != WeightLayout::Rows) fail("embed: the table must be in GGUF row layout");
  const uint64_t rb = *row_bytes(E.type, uint64_t(E.n_cols));
  for (int64_t m = 0; m < M; ++m)
    dequantize_row(E.type, static_cast<const uint8_t*>(E.data) + uint64_t(tokens[m]) * rb,
                   out + m * E.n_cols, E.n_cols);
}

namespace {
void rope_row_table(int32_t pos, const RopeParams& p, float theta_scale, float* cs) {
  float theta = float(pos) * p.freq_scale;
  for (int32_t i = 0; i < p.n_rot / 2; ++i) {
    const float t = p.freq_factors ? theta / p.freq_factors[i] : theta;
    cs[2 * i] = std::cos(t) * p.attn_factor;
    cs[2 * i + 1] = std::sin(t) * p.attn_factor;
    theta *= theta_scale;
  }
}
inline void rotate(float& x0r, float& x1r, float c, float s) {
  const float x0 = x0r, x1 = x1r;
  x0r = x0 * c - x1 * s;
  x1r = x0 * s + x1 * c;
}
}  // namespace

void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  for (int64_t m = 0; m < M; ++m) rope_row_table(pos[m], p, theta_scale, cs + m * p.n_rot);
}

// Not inlined: OpenMP-outlined callers ignore the contraction pragma, and the fused epilogue
// and the separate pass must run this same code.
__attribute__((noinline)) void rope_rotate(float* y, int64_t col0, int64_t n, int32_t head_dim,
                                           int32_t n_rot, const float* cs) {
  // d = c % head_dim, carried from pair to pair: a 64-bit division per pair took half the time
  // (a 16-column group of the fused QKV epilogue: 15.3 ns -> 7.4 ns, Zen 5; the same rotations).
  int32_t d = int32_t(col0 % head_dim);
  for (int64_t c = col0; c < col0 + n; c += 2) {
    if (d < n_rot) rotate(y[c], y[c + 1], cs[d], cs[d + 1]);
    d += 2;
    if (d >= head_dim) d -= head_dim;
  }
}

void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos,
          const RopeParams& p, int threads) {
  // Same arithmetic as the reference (theta accumulated multiplicatively, as ggml does); the
  // cos/sin table of one row lives on the stack (n_rot <= 512).
  if (p.n_rot > 512) fail("rope: n_rot ", p.n_rot, " exceeds 512");
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  parallel_for_static(M, M * n_heads * head_dim > 65536 ? threads : 1, [&](int64_t m) {
    float cs[512];
    rope_row_table(pos[m], p, theta_scale, cs);
    if (p.style == RopeStyle::Interleaved) {
      rope_rotate(x + m * n_heads * head_dim, 0, int64_t(n_heads) * head_dim, head_dim, p.n_rot, cs);
      return;
    }
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (m * n_heads + h) * head_dim;
      for (int32_t i = 0; i < p.n_rot / 2; ++i) {
        const int32_t a = p.style == RopeStyle::Interleaved ? 2 * i : i;
        const int32_t b = p.style == RopeStyle::Interleaved ? 2 * i + 1 : i + p.n_rot / 2;
        rotate(v[a], v[b], cs[2 * i], cs[2 * i + 1]);
      }
    }
  });
}

void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n) {
  if (act == GateAct::SwigluOai) {
    for (int64_t i = 0; i < M * n; ++i) a[i] = swiglu_oai(gate[i], up[i]);
  } else if (act == GateAct::GeluTanh) {
    for (int64_t i = 0; i < M * n; ++i) a[i] = gelu_tanh(gate[i]) * up[i];
  } else {
    for (int64_t i = 0; i < M * n; ++i) a[i] = silu(gate[i]) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void exp_shifted(const float* x, int64_t n, float shift, float div, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = exp_cephes((x[i] - shift) / div);
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add(float* y, const float* x, int64_t M, int64_t n) {
  for (int64_t i = 0; i < M * n; ++i) y[i] += x[i];
}

}  // namespace ft::rowwise

namespace ft {

void quantize_activations(const float* x, int64_t K, int16_t* xq, float* dx, int32_t* xsum) {
  if (K % 32 != 0) fail("quantize_activations: K = ", K, " is not a multiple of 32");
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    int16_t* qb = xq + 32 * b;
    float amax = 0;
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    int32_t sum = 0;
    if (!finite || amax == 0) {
      for (int i = 0; i < 32; ++i) qb[i] = 0;
      dx[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    } else {
      const float id = 127.0f / amax;
      for (int i = 0; i < 32; ++i) {
        const float v = std::nearbyint(xb[i] * id);
        qb[i] = int16_t(std::clamp(v, -127.0f, 127.0f));
        sum += qb[i];
      }
      dx[b] = amax / 127.0f;
    }
    xsum[b] = sum;
  }
}

}  // namespace ft
