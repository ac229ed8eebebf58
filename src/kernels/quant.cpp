// Scalar reference (de)quantization of the ggml block formats (see quant.h for the layouts).
//
// Dequantization performs the same float operations in the same order as ggml's
// dequantize_row_* so results are bit-identical; quantization follows ggml's reference
// quantizers (quantize_row_*_ref), so files we write decode identically in ggml/llama.cpp.
#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_iq.h"

// Bit-exactness with ggml: every product in the dequantizers is exact in float (Q4_K: f16 d
// (11 significant bits) * 6-bit scale * 4-bit q <= 21 bits; Q6_K: d * int8 scale is exact and
// the product with the 6-bit q is one rounding of the same exact value in any order; Q8_0/Q4_0
// products are single roundings), so only the final add/sub rounds and FMA contraction or
// reassociation of the products cannot change a result.
//
// The quantizers' least-squares sums are sensitive to FMA contraction (g++ contracts by default,
// even in ISO mode, once -march allows FMA), which would make the bytes make-model writes depend
// on the build machine. Contraction is off here, so the output equals ggml's *_ref quantizers
// evaluated without contraction on every machine.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ft {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF block data is little-endian");

using blocks::QK4_0;
using blocks::QK8_0;
using blocks::QK_K;
using BlockQ8_0 = blocks::Q8_0;
using BlockQ4_0 = blocks::Q4_0;
using BlockQ4_K = blocks::Q4_K;
using BlockQ6_K = blocks::Q6_K;
using blocks::load_f16;

void store_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Round half to even for |x| < 2^22 (ggml's nearest_int): adding 1.5*2^23 leaves the rounded
// integer in the low mantissa bits. Defined for any input (no float->int conversion UB).
int nearest_int(float x) {
  const float v = x + 12582912.0f;
  return (std::bit_cast<int32_t>(v) & 0x007fffff) - 0x00400000;
}

// Inverse of blocks::scale_min_k4 (ggml's get_scale_min_k4) for all 8 sub-blocks (ls, lm <= 63).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = uint8_t((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      q[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      q[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantization

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = float(b[i].qs[j]) * d;
  }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int x0 = (b[i].qs[j] & 0x0F) - 8;
      const int x1 = (b[i].qs[j] >> 4) - 8;
      y[i * QK4_0 + j] = float(x0) * d;
      y[i * QK4_0 + j + QK4_0 / 2] = float(x1) * d;
    }
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    const float dmin = load_f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int c = 0; c < 4; ++c) {  // 64 elements = sub-blocks 2c (low nibbles), 2c+1 (high)
      uint8_t sc, m;
      blocks::scale_min_k4(2 * c, b[i].scales, sc, m);
      const float d1 = d * float(sc), m1 = dmin * float(m);
      blocks::scale_min_k4(2 * c + 1, b[i].scales, sc, m);
      const float d2 = d * float(sc), m2 = dmin * float(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half) {  // 128 elements: 4 rows of 32 sharing ql/qh bytes
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * float(sc[is + 0]) * float(q1);
        y[l + 32] = d * float(sc[is + 2]) * float(q2);
        y[l + 64] = d * float(sc[is + 4]) * float(q3);
        y[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}


void dequant_q4_1(const blocks::Q4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = load_f16(b[i].d), m = load_f16(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = float(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q5_0(const blocks::Q5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const int x0 = ((b[i].qs[j] & 0xF) | (blocks::q5_high(b[i].qh, j) << 4)) - 16;
      const int x1 = ((b[i].qs[j] >> 4) | (blocks::q5_high(b[i].qh, j + 16) << 4)) - 16;
      y[j] = float(x0) * d;
      y[j + 16] = float(x1) * d;
    }
  }
}

void dequant_q5_1(const blocks::Q5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = load_f16(b[i].d), m = load_f16(b[i].m);
    for (int j = 0; j < 16; ++j) {
      const int x0 = (b[i].qs[j] & 0xF) | (blocks::q5_high(b[i].qh, j) << 4);
      const int x1 = (b[i].qs[j] >> 4) | (blocks::q5_high(b[i].qh, j + 16) << 4);
      y[j] = float(x0) * d + m;
      y[j + 16] = float(x1) * d + m;
    }
  }
}

// Q2_K/Q3_K: element e's 2-bit field is blocks::low2_k; its scale is 16-element sub-block e / 16.
void dequant_q2_k(const blocks::Q2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    for (int e = 0; e < QK_K; ++e) {
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
      *y++ = dl * float(blocks::q2k_q(b[i], e)) - ml;
    }
  }
}

void dequant_q3_k(const blocks::Q3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int e = 0; e < QK_K; ++e) {
      const float dl = d * float(blocks::scale_k3(e / 16, b[i].scales) - 32);
      *y++ = dl * float(blocks::q3k_q(b[i], e));
    }
  }
}

void dequant_q5_k(const blocks::Q5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      blocks::scale_min_k4(s, b[i].scales, sc, m);
      const float d1 = d * float(sc), m1 = dmin * float(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(blocks::q5k_q(b[i], 32 * s + l)) - m1;
    }
  }
}

void dequant_iq4_nl(const blocks::IQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(blocks::kValuesIQ4NL[b[i].qs[j] & 0xF]);
      y[j + 16] = d * float(blocks::kValuesIQ4NL[b[i].qs[j] >> 4]);
    }
  }
}

void dequant_mxfp4(const blocks::MXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = blocks::e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(blocks::kValuesMXFP4[b[i].qs[j] & 0xF]) * d;
      y[j + 16] = float(blocks::kValuesMXFP4[b[i].qs[j] >> 4]) * d;
    }
  }
}

// ggml's dequantize_row_tq1_0: trit n of a byte b is (uint8(b * 3^n) * 3) >> 8.
void dequant_tq1_0(const blocks::TQ1_0* b, float* y, int64_t nb) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  auto trit = [&](uint8_t byte, int n) { return int((uint16_t(uint8_t(byte * kPow3[n])) * 3) >> 8); };
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 32; ++m) *y++ = float(trit(b[i].qs[m], n) - 1) * d;
    for (int n = 0; n < 5; ++n)
      for (int m = 0; m < 16; ++m) *y++ = float(trit(b[i].qs[32 + m], n) - 1) * d;
    for (int n = 0; n < 4; ++n)
      for (int m = 0; m < 4; ++m) *y++ = float(trit(b[i].qh[m], n) - 1) * d;
  }
}

void dequant_tq2_0(const blocks::TQ2_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < 64; j += 32)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m) *y++ = float(((b[i].qs[j + m] >> (2 * l)) & 3) - 1) * d;
  }
}

void dequant_iq4_xs(const blocks::IQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int s = 0; s < 8; ++s, y += 32) {
      const float dl = d * float(blocks::scale_iq4xs(b[i], s) - 32);
      const uint8_t* qs = b[i].qs + 16 * s;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * float(blocks::kValuesIQ4NL[qs[j] & 0xF]);
        y[j + 16] = dl * float(blocks::kValuesIQ4NL[qs[j] >> 4]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantization

// ggml quantize_row_q8_0_ref: d = amax/127, q = round-half-away(x/d).
void quant_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    for (int j = 0; j < QK8_0; ++j) b[i].qs[j] = int8_t(std::round(x[j] * id));
  }
}

// ggml quantize_row_q4_0_ref: d = (signed value of largest magnitude) / -8, so that element maps
// exactly to q = 0; the others are truncated after +8.5 and clamped to 15.
void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int q0 = std::min(15, int(int8_t(x[j] * id + 8.5f)));
      const int q1 = std::min(15, int(int8_t(x[j + QK4_0 / 2] * id + 8.5f)));
      b[i].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

// Fits x ~= scale*L - the_min with L in [0, nmax] and the_min >= 0 minimising the weighted
// squared error: start from the min/max grid, then try nstep+1 perturbed grids
// (nmax + rmin + rdelta*k levels over the range), solving the 2x2 least-squares problem for
// (scale, min) on each. This is ggml's make_qkx2_quants; the error is squared, or absolute with
// use_mad (Q2_K).
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float& the_min,
                    uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad = false) {
  const auto err = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float min = x[0], max = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t(0));
    the_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::clamp(l, 0, nmax));
    const float diff = scale * float(L[i]) + min - x[i];
    best_error += w[i] * err(diff);
  }
  if (nstep < 1) {
    the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float cur_error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * float(Laux[i]) + this_min - x[i];
      cur_error += w[i] * err(diff);
    }
    if (cur_error < best_error) {
      std::copy(Laux, Laux + n, L);
      best_error = cur_error;
      scale = this_scale;
      min = this_min;
    }
  }
  the_min = -min;
  return scale;
}

// ggml quantize_row_q{4,5}_K_ref's levels of one 256-block: per 32-element sub-block a (scale,
// min) fit with levels 0..nmax (fit_scale_min's rmin, nstep), then scales and mins quantized to
// 6 bits against the block maxima (d = max_scale/63, dmin = max_min/63, into d, dmin, scales),
// then the levels L[256] recomputed against the stored (rounded) scales.
void fit_k_levels(const float* x, int nmax, float rmin, int nstep, uint8_t* L, uint8_t* d2, uint8_t* dmin2,
                  uint8_t* scales12) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, mins[j], Laux, rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // Narrow before clamping, as ggml does (a negative fit would wrap, then clamp to 63).
    ls[j] = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
  }
  pack_scale_min_k4(ls, lm, scales12);
  store_f16(d2, max_scale / 63.0f);
  store_f16(dmin2, max_min / 63.0f);

  const float d_all = load_f16(d2), dmin_all = load_f16(dmin2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    blocks::scale_min_k4(j, scales12, sc, m);
    const float d = d_all * float(sc);
    if (d == 0.0f) continue;  // keep the fitted levels, as ggml does
    const float dm = dmin_all * float(m);
    for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
}

// ggml quantize_row_q4_K_ref: 4-bit levels (fit_k_levels), two sub-blocks' nibbles a 32 bytes.
void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    fit_k_levels(x, 15, -1.0f, 20, L, b[i].d, b[i].dmin, b[i].scales);
    uint8_t* q = b[i].qs;
    for (int c = 0; c < QK_K; c += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[c + l] | (L[c + l + 32] << 4));
    }
  }
}

// The 6-bit levels L[256] (q + 32) of a Q6_K block into its ql/qh bytes (see dequant_q6_k).
void pack_q6k_levels(const uint8_t* L, BlockQ6_K& b) {
  uint8_t* ql = b.ql;
  uint8_t* qh = b.qh;
  for (int c = 0; c < QK_K; c += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lc = L + c + l;
      ql[l] = uint8_t((Lc[0] & 0xF) | ((Lc[64] & 0xF) << 4));
      ql[l + 32] = uint8_t((Lc[32] & 0xF) | ((Lc[96] & 0xF) << 4));
      qh[l] = uint8_t((Lc[0] >> 4) | ((Lc[32] >> 4) << 2) | ((Lc[64] >> 4) << 4) | ((Lc[96] >> 4) << 6));
    }
  }
}

// Symmetric fit x ~= scale*(L - nmax), L in [0, 2*nmax-1], weights x^2: the abs-max grid and
// 18 perturbed grids, keeping the one with the best weighted least-squares scale. ggml's
// make_qx_quants with rmse_type 1 and no importance weights.
float fit_scale_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  auto level = [nmax](float v) { return std::clamp(nearest_int(v), -nmax, nmax - 1); };
  float iscale = -float(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale * x[i]);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale * x[i]);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + level(iscale * x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml quantize_row_q6_K_ref: per 16-element sub-block a signed scale fit with 6-bit levels,
// scales quantized to int8 against the largest-magnitude one (d = max_scale / -128).
void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  int8_t L[QK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = fit_scale_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < 1e-15f) {
      std::memset(&b[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    store_f16(b[i].d, 1 / iscale);
    for (int ib = 0; ib < 16; ++ib) {
      b[i].scales[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
    }
    const float d_all = load_f16(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(b[i].scales[j]);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = int8_t(std::clamp(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
      }
    }
    pack_q6k_levels(reinterpret_cast<const uint8_t*>(L), b[i]);
  }
}


// ggml quantize_row_q4_1_ref / q5_1_ref: d = (max - min) / nmax, m = min, q = trunc((x - min)/d
// + 0.5) (Q4_1 clamped to 15 after an int8 narrowing, Q5_1 narrowed to uint8 unclamped, as ggml).
template <class Block, int kBits>
void quant_q_1(const float* x, Block* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / float((1 << kBits) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    store_f16(b[i].m, min);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const float x0 = (x[j] - min) * id, x1 = (x[j + 16] - min) * id;
      int q0, q1;
      if constexpr (kBits == 4) {
        q0 = std::min(15, int(int8_t(x0 + 0.5f)));
        q1 = std::min(15, int(int8_t(x1 + 0.5f)));
      } else {
        q0 = int(uint8_t(x0 + 0.5f));
        q1 = int(uint8_t(x1 + 0.5f));
        qh |= uint32_t((q0 >> 4) & 1) << j;
        qh |= uint32_t((q1 >> 4) & 1) << (j + 16);
      }
      b[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
    }
    if constexpr (kBits == 5) std::memcpy(b[i].qh, &qh, 4);
  }
}

// ggml quantize_row_q5_0_ref: as Q4_0 with 32 levels (d = max / -16, q = trunc(x/d + 16.5)).
void quant_q5_0(const float* x, blocks::Q5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(31, int(int8_t(x[j] * id + 16.5f)));
      const int q1 = std::min(31, int(int8_t(x[j + 16] * id + 16.5f)));
      b[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= uint32_t((q0 >> 4) & 1) << j;
      qh |= uint32_t((q1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

// The 2-bit fields of Q2_K/Q3_K: level L[128h + 32j + l] at shift 2j of qs[32h + l].
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < QK_K / 128; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lh = L + 128 * h + l;
      qs[32 * h + l] = uint8_t(Lh[0] | (Lh[32] << 2) | (Lh[64] << 4) | (Lh[96] << 6));
    }
}

// ggml quantize_row_q2_K_ref: per 16 elements a (scale, min) fit with 2-bit levels (weights
// |x|, absolute error), scales and mins quantized to 4 bits against their maxima.
void quant_q2_k(const float* x, blocks::Q2_K* b, int64_t nb) {
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[16], scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, mins[j], Laux, -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    std::memset(b[i].scales, 0, 16);
    if (max_scale > 0) {
      const float iscale = 15.0f / max_scale;
      for (int j = 0; j < 16; ++j) b[i].scales[j] = uint8_t(nearest_int(iscale * scales[j]));
      store_f16(b[i].d, max_scale / 15.0f);
    } else {
      store_f16(b[i].d, 0.0f);
    }
    if (max_min > 0) {
      const float iscale = 15.0f / max_min;
      for (int j = 0; j < 16; ++j) b[i].scales[j] |= uint8_t(nearest_int(iscale * mins[j]) << 4);
      store_f16(b[i].dmin, max_min / 15.0f);
    } else {
      store_f16(b[i].dmin, 0.0f);
    }
    const float d_all = load_f16(b[i].d), dmin_all = load_f16(b[i].dmin);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(b[i].scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = dmin_all * float(b[i].scales[j] >> 4);
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = uint8_t(std::clamp(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
    }
    pack_2bit(L, b[i].qs);
  }
}

// ggml make_q3_quants (do_rmse): symmetric levels in [-nmax, nmax - 1] from the abs-max grid,
// then up to 5 rounds of single-level moves that raise sumlx^2/suml2 (weights x^2). L gets
// level + nmax.
float fit_scale_q3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0.0f) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  const float iscale = -float(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * float(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * float(L[i]) * float(L[i]);
        const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          slx += w * x[i] * float(new_l);
          sl2 += w * float(new_l) * float(new_l);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = int8_t(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return sumlx / suml2;
}

// ggml quantize_row_q3_K_ref: per 16 elements a symmetric 3-bit fit, the 16 scales quantized to
// 6 bits against the largest-magnitude one (d = max_scale / -32).
void quant_q3_k(const float* x, blocks::Q3_K* b, int64_t nb) {
  int8_t L[QK_K];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(b[i].scales, 0, 12);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = std::clamp(int(int8_t(nearest_int(iscale * scales[j]))), -32, 31) + 32;
        if (j < 8) b[i].scales[j] = uint8_t(l & 0xF);
        else b[i].scales[j - 8] |= uint8_t((l & 0xF) << 4);
        b[i].scales[j % 4 + 8] |= uint8_t((l >> 4) << (2 * (j / 4)));
      }
      store_f16(b[i].d, 1 / iscale);
    } else {
      store_f16(b[i].d, 0.0f);
    }
    const float d_all = load_f16(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(blocks::scale_k3(j, b[i].scales) - 32);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = int8_t(std::clamp(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
    }
    // High bit of element e at bit e / 32 of hmask[e % 32]; the low 2 bits as Q2_K.
    std::memset(b[i].hmask, 0, 32);
    uint8_t low[QK_K];
    for (int e = 0; e < QK_K; ++e) {
      if (L[e] > 3) b[i].hmask[e % 32] |= uint8_t(1 << (e / 32));
      low[e] = uint8_t(L[e] & 3);
    }
    pack_2bit(low, b[i].qs);
  }
}

// ggml quantize_row_q5_K_ref: Q4_K's scheme with 5-bit levels (the fit over 16 grids).
void quant_q5_k(const float* x, blocks::Q5_K* b, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    fit_k_levels(x, 31, -0.5f, 15, L, b[i].d, b[i].dmin, b[i].scales);
    std::memset(b[i].qh, 0, 32);
    std::memset(b[i].qs, 0, QK_K / 2);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int q = L[32 * j + l];
        b[i].qs[32 * (j / 2) + l] |= uint8_t((q & 0xF) << (4 * (j % 2)));
        b[i].qh[l] |= uint8_t((q >> 4) << j);
      }
  }
}

// Index of the level of kValuesIQ4NL nearest to v (ggml's best_index_int8; ties go up).
int best_index_iq4(float v) {
  const int8_t* val = blocks::kValuesIQ4NL;
  if (v <= float(val[0])) return 0;
  if (v >= float(val[15])) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (v < float(val[mav])) mu = mav;
    else ml = mav;
  }
  return v - float(val[mu - 1]) < float(val[mu]) - v ? mu - 1 : mu;
}

// ggml quantize_row_iq4_nl_impl (ntry 7, no importance weights: weights x^2), the path of
// llama-quantize for IQ4_NL (one 32-block) and IQ4_XS (8 sub-blocks of 32 under a 256 block):
// per 32 elements the best of 15 scales for the non-linear levels, then (IQ4_XS) the scales
// quantized to 6 bits (d = max_scale / -32) and the levels picked again for the rounded scale.
// Writes the f16 d, the 4-bit indices (q4: 16 bytes per 32 as Q4_0) and, for IQ4_XS, the
// 6-bit scales.
void quant_iq4(const float* x, int n_sub, uint8_t* dh, uint8_t* q4, uint8_t* scales_h,
               uint8_t* scales_l) {
  constexpr int ntry = 7;
  uint8_t L[QK_K];
  float scales[8];
  float max_scale = 0, amax_scale = 0;
  std::memset(q4, 0, size_t(n_sub) * 16);
  for (int ib = 0; ib < n_sub; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    if (amax < 1e-15f) {
      scales[ib] = 0;
      std::fill(Lb, Lb + 32, uint8_t(0));
      continue;
    }
    const float v0 = float(blocks::kValuesIQ4NL[0]);
    float d = -max / v0;
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = best_index_iq4(id * xb[j]);
      Lb[j] = uint8_t(l);
      const float q = float(blocks::kValuesIQ4NL[l]);
      const float w = xb[j] * xb[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; ++itry) {
      id = (float(itry) + v0) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = float(blocks::kValuesIQ4NL[best_index_iq4(id * xb[j])]);
        const float w = xb[j] * xb[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }
  if (n_sub > 1) {
    scales_h[0] = scales_h[1] = 0;
    const float d = -max_scale / 32;
    store_f16(dh, d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int ib = 0; ib < n_sub; ++ib) {
      int l = std::clamp(nearest_int(id * scales[ib]), -32, 31);
      const float dl = d * float(l);
      const float idl = dl != 0.0f ? 1 / dl : 0.0f;
      for (int j = 0; j < 32; ++j) L[32 * ib + j] = uint8_t(best_index_iq4(idl * x[32 * ib + j]));
      l += 32;
      if (ib % 2 == 0) scales_l[ib / 2] = uint8_t(l & 0xF);
      else scales_l[ib / 2] |= uint8_t((l & 0xF) << 4);
      scales_h[ib / 4] |= uint8_t((l >> 4) << (2 * (ib % 4)));
    }
  } else {
    store_f16(dh, scales[0]);
    const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
    for (int j = 0; j < 32; ++j) L[j] = uint8_t(best_index_iq4(id * x[j]));
  }
  for (int i = 0; i < n_sub; ++i)
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = uint8_t(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

// ggml's best_index_mxfp4: the level nearest x under scale d, first (lowest index) on ties.
int best_index_mxfp4(float x, float d) {
  int best = 0;
  float best_err = std::fabs(float(blocks::kValuesMXFP4[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(float(blocks::kValuesMXFP4[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

// ggml quantize_row_mxfp4_ref: e = floor(log2f(amax)) - 2 + 127, so amax / 2^(e - 127) lies in
// [4, 8) (log2f's rounding aside): the largest level, 12 * 2^(e - 128) = 6 * 2^(e - 127), is
// between 3/4 and 3/2 of amax (values above it clamp to it), each value its nearest level.
// Byte-identical to ggml wherever that exponent is in [0, 252], i.e. amax >= 2^-125. Below
// (amax < 2^-125, subnormals included: log2f(2^-126) = -126 gives -1, 2^-149 gives -24) ggml
// converts the negative float to uint8_t, which is undefined behaviour; x86 truncates it modulo
// 256 (2^-126 -> 255, NaN in the MX format; 2^-149 -> 232, scale 2^104, every value 0). We clamp
// to e = 0, the least scale 2^-128, so a nonzero finite block never gets e = 255 and its values
// keep their nearest levels (2^-126 = 4 x 2^-128 exactly; 2^-149 rounds to 0).
void quant_mxfp4(const float* x, blocks::MXFP4* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    uint8_t e = 0;
    if (amax > 0.0f) {
      const float f = std::floor(log2f(amax)) - 2 + 127;  // in [-24, 252] for finite amax
      e = f > 0.0f ? uint8_t(std::min(f, 254.0f)) : uint8_t(0);  // (254: an inf amax, not NaN's 255)
    }
    const float d = blocks::e8m0_to_fp32_half(e);
    b[i].e = e;
    for (int j = 0; j < 16; ++j)
      b[i].qs[j] = uint8_t(best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + 16], d) << 4));
  }
}

// ggml quantize_row_tq1_0_ref / tq2_0_ref: d = amax, each trit lroundf(x / d) + 1; TQ1_0 packs 5
// (4) trits as the base-3 number they form, times 256 / 243 rounded up (a fraction of 256 whose
// digits the decoder reads back by multiplying by 3).
// A ternary block's d = amax of its 256 values, stored at d; returns 1 / d (0 for a zero block).
float ternary_scale(const float* x, uint8_t* d) {
  float amax = 0.0f;
  for (int j = 0; j < QK_K; ++j) amax = std::max(amax, std::fabs(x[j]));
  store_f16(d, amax);
  return amax != 0.0f ? 1.0f / amax : 0.0f;
}

void quant_tq1_0(const float* x, blocks::TQ1_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float id = ternary_scale(x, b[i].d);
    auto pack = [&](const float* xs, int stride, int n_trits) {  // (q <= 242: no wrap)
      unsigned q = 0;
      for (int n = 0; n < n_trits; ++n) q = q * 3 + unsigned(std::lround(xs[n * stride] * id) + 1);
      if (n_trits == 4) q *= 3;  // (the first trit in the most significant place)
      return uint8_t((q * 256 + 242) / 243);
    };
    for (int m = 0; m < 32; ++m) b[i].qs[m] = pack(x + m, 32, 5);
    x += 160;
    for (int m = 0; m < 16; ++m) b[i].qs[32 + m] = pack(x + m, 16, 5);
    x += 80;
    for (int m = 0; m < 4; ++m) b[i].qh[m] = pack(x + m, 4, 4);
    x += 16;
  }
}

void quant_tq2_0(const float* x, blocks::TQ2_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float id = ternary_scale(x, b[i].d);
    for (int j = 0; j < 64; j += 32, x += 128)
      for (int m = 0; m < 32; ++m) {
        unsigned q = 0;
        for (int l = 0; l < 4; ++l) q += unsigned((std::lround(x[m + 32 * l] * id) + 1) & 3) << (2 * l);
        b[i].qs[j + m] = uint8_t(q);
      }
  }
}

// Blocks in a row of n elements of a supported type; fails on unsupported types and on n not a
// multiple of the block size.
int64_t block_count(GGMLType type, int64_t n, const char* what) {
  int64_t bs = 0;
  switch (type) {
    case GGMLType::F32:
    case GGMLType::F16:
    case GGMLType::BF16: bs = 1; break;
    case GGMLType::Q8_0: case GGMLType::Q4_0: case GGMLType::Q4_1: case GGMLType::Q5_0:
    case GGMLType::Q5_1: case GGMLType::IQ4_NL: case GGMLType::MXFP4: bs = 32; break;
    case GGMLType::Q2_K: case GGMLType::Q3_K: case GGMLType::Q4_K: case GGMLType::Q5_K:
    case GGMLType::Q6_K: case GGMLType::IQ4_XS: case GGMLType::TQ1_0: case GGMLType::TQ2_0: bs = QK_K; break;
    default:
      if (iq::is_grid_type(type)) {
        bs = QK_K;
        break;
      }
      fail(what, ": unsupported tensor type ", type_traits(type).name, " (id ", uint32_t(type),
           ")");
  }
  if (n < 0 || n % bs != 0) {
    fail(what, ": ", n, " elements is not a multiple of the block size ", bs, " of type ",
         type_traits(type).name);
  }
  return n / bs;
}

}  // namespace

void dequantize_row(GGMLType type, const void* src, float* dst, int64_t n) {
  const int64_t nb = block_count(type, n, "dequantize");
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GGMLType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f16(p + 2 * i);
      break;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    case GGMLType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); break;
    case GGMLType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); break;
    case GGMLType::Q4_K: dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); break;
    case GGMLType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); break;
    case GGMLType::Q4_1: dequant_q4_1(static_cast<const blocks::Q4_1*>(src), dst, nb); break;
    case GGMLType::Q5_0: dequant_q5_0(static_cast<const blocks::Q5_0*>(src), dst, nb); break;
    case GGMLType::Q5_1: dequant_q5_1(static_cast<const blocks::Q5_1*>(src), dst, nb); break;
    case GGMLType::Q2_K: dequant_q2_k(static_cast<const blocks::Q2_K*>(src), dst, nb); break;
    case GGMLType::Q3_K: dequant_q3_k(static_cast<const blocks::Q3_K*>(src), dst, nb); break;
    case GGMLType::Q5_K: dequant_q5_k(static_cast<const blocks::Q5_K*>(src), dst, nb); break;
    case GGMLType::IQ4_NL: dequant_iq4_nl(static_cast<const blocks::IQ4_NL*>(src), dst, nb); break;
    case GGMLType::IQ4_XS: dequant_iq4_xs(static_cast<const blocks::IQ4_XS*>(src), dst, nb); break;
    case GGMLType::MXFP4: dequant_mxfp4(static_cast<const blocks::MXFP4*>(src), dst, nb); break;
    case GGMLType::TQ1_0: dequant_tq1_0(static_cast<const blocks::TQ1_0*>(src), dst, nb); break;
    case GGMLType::TQ2_0: dequant_tq2_0(static_cast<const blocks::TQ2_0*>(src), dst, nb); break;
    default: iq::dequantize(type, p, dst, nb); break;  // the i-quants on grids (else rejected by block_count)
  }
}

void quantize_row(GGMLType type, const float* src, void* dst, int64_t n) {
  const int64_t nb = block_count(type, n, "quantize");
  auto* p = static_cast<uint8_t*>(dst);
  switch (type) {
    case GGMLType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) store_f16(p + 2 * i, src[i]);
      break;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case GGMLType::Q8_0: quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); break;
    case GGMLType::Q4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); break;
    case GGMLType::Q4_K: quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); break;
    case GGMLType::Q6_K: quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); break;
    case GGMLType::Q4_1: quant_q_1<blocks::Q4_1, 4>(src, static_cast<blocks::Q4_1*>(dst), nb); break;
    case GGMLType::Q5_1: quant_q_1<blocks::Q5_1, 5>(src, static_cast<blocks::Q5_1*>(dst), nb); break;
    case GGMLType::Q5_0: quant_q5_0(src, static_cast<blocks::Q5_0*>(dst), nb); break;
    case GGMLType::Q2_K: quant_q2_k(src, static_cast<blocks::Q2_K*>(dst), nb); break;
    case GGMLType::Q3_K: quant_q3_k(src, static_cast<blocks::Q3_K*>(dst), nb); break;
    case GGMLType::Q5_K: quant_q5_k(src, static_cast<blocks::Q5_K*>(dst), nb); break;
    case GGMLType::IQ4_NL:
      for (int64_t i = 0; i < nb; ++i) {
        auto& b = static_cast<blocks::IQ4_NL*>(dst)[i];
        quant_iq4(src + 32 * i, 1, b.d, b.qs, nullptr, nullptr);
      }
      break;
    case GGMLType::IQ4_XS:
      for (int64_t i = 0; i < nb; ++i) {
        auto& b = static_cast<blocks::IQ4_XS*>(dst)[i];
        quant_iq4(src + QK_K * i, 8, b.d, b.qs, b.scales_h, b.scales_l);
      }
      break;
    case GGMLType::MXFP4: quant_mxfp4(src, static_cast<blocks::MXFP4*>(dst), nb); break;
    case GGMLType::TQ1_0: quant_tq1_0(src, static_cast<blocks::TQ1_0*>(dst), nb); break;
    case GGMLType::TQ2_0: quant_tq2_0(src, static_cast<blocks::TQ2_0*>(dst), nb); break;
    default: iq::quantize(type, src, p, nb); break;  // the i-quants on grids (else rejected by block_count)
  }
}

}  // namespace ft
