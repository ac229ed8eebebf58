// AVX-512 (F/BW/VL/DQ + VNNI) instantiation of the flash-attention driver (attention_impl.h).
// Scores: one zmm = one K tile's 16 positions; F16 widened by vcvtph2ps, BF16 by a shift, Q8_0
// on vpdpbusd (K made unsigned by flipping its sign bit, k + 128, and the query's 128 * block sum
// subtracted: exact int32 block sums). Compiled for those extensions whatever the build flags;
// only called after cpu_best_isa() says the CPU has them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/cpu_kernels.h"  // (before the target pragma, as below: its inline functions stay baseline)
#include "kernels/cpu/thread_pool.h"  // (before the target pragma: its std headers stay baseline)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"  // softcap_row256, ExpConst

namespace ft::cpu {
namespace {

struct Avx512Attn {
  using Drv = Attention<Avx512Attn>;
  // S (n,) -> cap * tanh(S / cap) (the driver's soft cap; n a multiple of 8).
  static void softcap(float* S, int n, float cap) { softcap_row256(S, n, cap); }


  static void prefetch(const void* p, uint64_t n) {
    for (uint64_t i = 0; i < n; i += 64) _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T0);
  }

  template <GGMLType T>
  static __m512 load16(const uint8_t* p) {
    if constexpr (T == GGMLType::F32) return _mm512_loadu_ps(p);
    else if constexpr (T == GGMLType::F16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }

  // NR rows x the chunk's 4 tiles: 4 NR accumulators (NR = 6: 24 of the 32 registers).
  template <GGMLType T, int NR>
  static void scores_f_t(const float* Q, int hd, const uint8_t* const* tiles, float* S, int ldS) {
    constexpr uint64_t es = T == GGMLType::F32 ? 4 : 2;
    __m512 acc[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      __m512 k[4];
      for (int t = 0; t < 4; ++t) k[t] = load16<T>(tiles[t] + uint64_t(d) * kKvTile * es);
      for (int r = 0; r < NR; ++r) {
        const __m512 qb = _mm512_set1_ps(Q[r * hd + d]);
        for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_fmadd_ps(qb, k[t], acc[r][t]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < 4; ++t) _mm512_storeu_ps(S + r * ldS + t * kKvTile, acc[r][t]);
  }
  template <GGMLType T>
  static void scores_f_rows(int rows, const float* Q, int hd, const uint8_t* const* tiles, float* S, int ldS) {
    for_score_tiles(rows, [&](auto nr, int r0) {
      scores_f_t<T, decltype(nr)::value>(Q + r0 * hd, hd, tiles, S + r0 * ldS, ldS);
    });
  }
  static void scores_f(GGMLType type, int rows, const float* Q, int hd, const uint8_t* const* tiles, float* S,
                       int ldS) {
    switch (type) {
      case GGMLType::F16: return scores_f_rows<GGMLType::F16>(rows, Q, hd, tiles, S, ldS);
      case GGMLType::BF16: return scores_f_rows<GGMLType::BF16>(rows, Q, hd, tiles, S, ldS);
      default: return scores_f_rows<GGMLType::F32>(rows, Q, hd, tiles, S, ldS);
    }
  }

  // NR rows x 4 tiles: per 32-block 4 NR int32 accumulators of vpdpbusd, then into 4 NR f32 ones
  // (NR = 3: 24 registers).
  template <int NR>
  static void scores_q8_t(const int8_t* Qq, const float* Qd, const int32_t* Qs, int hd, int nqb,
                          const uint8_t* const* tiles, float* S, int ldS) {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    __m512 acc[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int b = 0; b < nqb; ++b) {
      __m512i ia[NR][4];
      for (int r = 0; r < NR; ++r)
        for (int t = 0; t < 4; ++t) ia[r][t] = _mm512_setzero_si512();
      const int d1 = std::min(hd, (b + 1) * kKvQBlock);
      for (int d = b * kKvQBlock; d < d1; d += 4) {
        __m512i k[4];
        for (int t = 0; t < 4; ++t)
          k[t] = _mm512_xor_si512(_mm512_loadu_si512(tiles[t] + uint64_t(d) * kKvTile), flip);  // k + 128 as u8
        for (int r = 0; r < NR; ++r) {
          int32_t q4;
          std::memcpy(&q4, Qq + r * hd + d, 4);
          const __m512i qb = _mm512_set1_epi32(q4);
          for (int t = 0; t < 4; ++t) ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], k[t], qb);
        }
      }
      __m512 kd[4];
      for (int t = 0; t < 4; ++t)
        kd[t] = _mm512_loadu_ps(tiles[t] + uint64_t(hd) * kKvTile + uint64_t(b) * kKvTile * sizeof(float));
      for (int r = 0; r < NR; ++r) {
        const __m512i corr = _mm512_set1_epi32(128 * Qs[r * nqb + b]);
        const __m512 qd = _mm512_set1_ps(Qd[r * nqb + b]);
        for (int t = 0; t < 4; ++t)
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ia[r][t], corr)),
                                      _mm512_mul_ps(kd[t], qd), acc[r][t]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < 4; ++t) _mm512_storeu_ps(S + r * ldS + t * kKvTile, acc[r][t]);
  }
  static void scores_q8(int rows, const int8_t* Qq, const float* Qd, const int32_t* Qs, int hd, int nqb,
                        const uint8_t* const* tiles, float* S, int ldS) {
    int r0 = 0;
    for (; r0 + 3 <= rows; r0 += 3)
      scores_q8_t<3>(Qq + r0 * hd, Qd + r0 * nqb, Qs + r0 * nqb, hd, nqb, tiles, S + r0 * ldS, ldS);
    if (rows - r0 == 2) scores_q8_t<2>(Qq + r0 * hd, Qd + r0 * nqb, Qs + r0 * nqb, hd, nqb, tiles, S + r0 * ldS, ldS);
    if (rows - r0 == 1) scores_q8_t<1>(Qq + r0 * hd, Qd + r0 * nqb, Qs + r0 * nqb, hd, nqb, tiles, S + r0 * ldS, ldS);
  }

  // exp256 (isa_avx2.h) on 16 lanes: the same constants and operations in the same order, so
  // each lane's result is exp256's. (The two attentions still differ in the last bits: the
  // softmax's row sums add 16 lanes here, 8 there.)
  static __m512 exp16(__m512 x) {
    using C = ExpConst;
    const __m512 lo = _mm512_set1_ps(C::lo);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(C::hi));
    x = _mm512_max_ps(x, lo);
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(C::log2e), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(C::ln2_hi), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(C::ln2_lo), x);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(C::p[0]);
    for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(C::p[i]));
    y = _mm512_fmadd_ps(y, z, x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(__mmask16(~underflow), y);
  }

  // See ScalarAttn::softmax. R rows at a time, interleaved: each row's chain (max, exp, sum)
  // is long and serial, R of them overlap; each row's operations are those of one row alone.
  // alpha = 1 without calling exp where the row's maximum did not move (exp(0) is 1 exactly;
  // a row with nothing unmasked yet has l = 0 and O = 0, which alpha 1 keeps as 0 does).
  template <int R>
  static void softmax_rows(float* S, int ldS, float* m, float* l, float* alpha) {
    const float ninf = -std::numeric_limits<float>::infinity();
    __m512 v[R][4], sum[R];
    float mn[R], mu[R];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) v[i][t] = _mm512_loadu_ps(S + i * ldS + 16 * t);
      const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[i][0], v[i][1]), _mm512_max_ps(v[i][2], v[i][3])));
      mn[i] = std::max(m[i], mx);
      mu[i] = mn[i] == ninf ? 0.0f : mn[i];
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m512 mub = _mm512_set1_ps(mu[i]);
      sum[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m512 p = exp16(_mm512_sub_ps(v[i][t], mub));
        _mm512_storeu_ps(S + i * ldS + 16 * t, p);
        sum[i] = _mm512_add_ps(sum[i], p);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      alpha[i] = mn[i] == m[i] ? 1.0f : std::exp(m[i] - mu[i]);
      l[i] = l[i] * alpha[i] + _mm512_reduce_add_ps(sum[i]);
      m[i] = mn[i];
    }
  }
  static void softmax(float* S, int ldS, int rows, float* m, float* l, float* alpha) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) softmax_rows<4>(S + r * ldS, ldS, m + r, l + r, alpha + r);
    for (; r < rows; ++r) softmax_rows<1>(S + r * ldS, ldS, m + r, l + r, alpha + r);
  }
  // One V row -> f32 (head_dim,), 16 at a time (the tail masked).
  static void v_row(const KVGeometry& g, const uint8_t* row, float* v) {
    const int hd = g.head_dim;
    for (int d = 0; d < hd; d += 16) {
      const __mmask16 mk = hd - d >= 16 ? __mmask16(0xffff) : __mmask16((1u << (hd - d)) - 1);
      __m512 x;
      if (g.type == GGMLType::Q8_0) {
        float sc;
        std::memcpy(&sc, row + uint64_t(hd) + uint64_t(d / kKvQBlock) * sizeof(float), sizeof(float));
        const __m128i q = _mm_maskz_loadu_epi8(mk, row + d);
        x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(sc));
      } else if (g.type == GGMLType::F16) {
        x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, row + 2 * d));
      } else {  // BF16
        x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, row + 2 * d)), 16));
      }
      _mm512_mask_storeu_ps(v + d, mk, x);
    }
  }

  // NR rows x NV vectors of 16 columns from d0: NR * NV accumulators (6 x 4 = 24 registers).
  template <int NR, int NV, GGMLType T = GGMLType::F32, class VPtr = const float*>
  static void pv_t(float* O, int hd, int d0, const float* alpha, const float* P, int ldP, const VPtr* v,
                   int len) {
    const int rem = hd - d0 - 16 * (NV - 1);
    const __mmask16 last = rem >= 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
    __mmask16 mk[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) mk[c] = c == NV - 1 ? last : __mmask16(0xffff);
    // (Fully unrolled: GCC otherwise keeps the accumulators' array in memory and stores all
    // NR * NV of them every iteration, which made P.V 3x slower than the scores.)
    __m512 acc[NR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[c], O + r * hd + d0 + 16 * c), a);
    }
    for (int j = 0; j < len; ++j) {
      __m512 vv[NV];
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) {
        if constexpr (T == GGMLType::F32) {
          vv[c] = _mm512_maskz_loadu_ps(mk[c], v[j] + d0 + 16 * c);
        } else {  // F16/BF16 row bytes, widened here
          const __m256i h = _mm256_maskz_loadu_epi16(mk[c], v[j] + 2 * (d0 + 16 * c));
          if constexpr (T == GGMLType::F16) vv[c] = _mm512_cvtph_ps(h);
          else vv[c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m512 p = _mm512_set1_ps(P[r * ldP + j]);
#pragma GCC unroll 4
        for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) _mm512_mask_storeu_ps(O + r * hd + d0 + 16 * c, mk[c], acc[r][c]);
  }
  template <int NR, GGMLType T, class VPtr>
  static void pv_rows(float* O, int hd, const float* alpha, const float* P, int ldP, const VPtr* v, int len) {
    for (int d0 = 0; d0 < hd; d0 += 64) {
      switch (std::min(4, (hd - d0 + 15) / 16)) {
        case 1: pv_t<NR, 1, T>(O, hd, d0, alpha, P, ldP, v, len); break;
        case 2: pv_t<NR, 2, T>(O, hd, d0, alpha, P, ldP, v, len); break;
        case 3: pv_t<NR, 3, T>(O, hd, d0, alpha, P, ldP, v, len); break;
        default: pv_t<NR, 4, T>(O, hd, d0, alpha, P, ldP, v, len); break;
      }
    }
  }
  template <GGMLType T, class VPtr>
  static void pv_any(int rows, float* O, int hd, const float* alpha, const float* P, int ldP, const VPtr* v, int len) {
    for (int r0 = 0; r0 < rows; r0 += 6) {
      float* o = O + r0 * hd;
      const float* a = alpha + r0;
      const float* p = P + r0 * ldP;
      switch (std::min(6, rows - r0)) {
        case 1: pv_rows<1, T>(o, hd, a, p, ldP, v, len); break;
        case 2: pv_rows<2, T>(o, hd, a, p, ldP, v, len); break;
        case 3: pv_rows<3, T>(o, hd, a, p, ldP, v, len); break;
        case 4: pv_rows<4, T>(o, hd, a, p, ldP, v, len); break;
        case 5: pv_rows<5, T>(o, hd, a, p, ldP, v, len); break;
        default: pv_rows<6, T>(o, hd, a, p, ldP, v, len); break;
      }
    }
  }
  static void pv(int rows, float* O, int hd, const float* alpha, const float* P, int ldP, const float* const* v,
                 int len) {
    pv_any<GGMLType::F32>(rows, O, hd, alpha, P, ldP, v, len);
  }
  // pv with F16/BF16 V rows (their bytes), widened in registers (few rows: decode).
  static void pv_half(GGMLType type, int rows, float* O, int hd, const float* alpha, const float* P, int ldP,
                      const uint8_t* const* v, int len) {
    if (type == GGMLType::F16) return pv_any<GGMLType::F16>(rows, O, hd, alpha, P, ldP, v, len);
    pv_any<GGMLType::BF16>(rows, O, hd, alpha, P, ldP, v, len);
  }
};

}  // namespace

AttentionFn avx512_attention() { return &Attention<Avx512Attn>::run; }

}  // namespace ft::cpu
