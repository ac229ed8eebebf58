// AVX2 + FMA (+ F16C) instantiation of the flash-attention driver (attention_impl.h). A K tile's
// 16 positions are two ymm; Q8_0 scores on vpmaddubsw with the sign trick (|k| as u8 times q
// with k's sign, pairs summed in int16 without overflow: 2 * 127 * 127 < 2^15), exact int32
// block sums. Compiled for those extensions whatever the build flags; only called after
// cpu_best_isa() says the CPU has them.
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

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"  // exp256

namespace ft::cpu {
namespace {

struct Avx2Attn {
  // S (n,) -> cap * tanh(S / cap) (the driver's soft cap; n a multiple of 8).
  static void softcap(float* S, int n, float cap) { softcap_row256(S, n, cap); }

  static void prefetch(const void* p, uint64_t n) {
    for (uint64_t i = 0; i < n; i += 64) _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T0);
  }

  template <GGMLType T>
  static __m256 load8(const uint8_t* p) {
    if constexpr (T == GGMLType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    else if constexpr (T == GGMLType::F16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }

  // NR rows x one tile (2 ymm): 2 NR accumulators (NR = 6: 12 of the 16 registers).
  template <GGMLType T, int NR>
  static void scores_f_t(const float* Q, int hd, const uint8_t* tile, float* S, int ldS) {
    constexpr uint64_t es = T == GGMLType::F32 ? 4 : 2;
    __m256 acc[NR][2];
    for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      const __m256 k0 = load8<T>(tile + uint64_t(d) * kKvTile * es), k1 = load8<T>(tile + (uint64_t(d) * kKvTile + 8) * es);
      for (int r = 0; r < NR; ++r) {
        const __m256 qb = _mm256_broadcast_ss(Q + r * hd + d);
        acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(S + r * ldS, acc[r][0]);
      _mm256_storeu_ps(S + r * ldS + 8, acc[r][1]);
    }
  }
  template <GGMLType T>
  static void scores_f_rows(int rows, const float* Q, int hd, const uint8_t* const* tiles, float* S, int ldS) {
    for (int t = 0; t < Attention<Avx2Attn>::kChunkTiles; ++t) {
      float* St = S + t * kKvTile;
      for_score_tiles(rows, [&](auto nr, int r0) {
        scores_f_t<T, decltype(nr)::value>(Q + r0 * hd, hd, tiles[t], St + r0 * ldS, ldS);
      });
    }
  }
  static void scores_f(GGMLType type, int rows, const float* Q, int hd, const uint8_t* const* tiles, float* S,
                       int ldS) {
    switch (type) {
      case GGMLType::F16: return scores_f_rows<GGMLType::F16>(rows, Q, hd, tiles, S, ldS);
      case GGMLType::BF16: return scores_f_rows<GGMLType::BF16>(rows, Q, hd, tiles, S, ldS);
      default: return scores_f_rows<GGMLType::F32>(rows, Q, hd, tiles, S, ldS);
    }
  }

  // One row x one tile: per 32-block two int32 accumulators (8 lanes each), then f32.
  static void scores_q8(int rows, const int8_t* Qq, const float* Qd, const int32_t*, int hd, int nqb,
                        const uint8_t* const* tiles, float* S, int ldS) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int t = 0; t < Attention<Avx2Attn>::kChunkTiles; ++t) {
      const uint8_t* tile = tiles[t];
      for (int r = 0; r < rows; ++r) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        for (int b = 0; b < nqb; ++b) {
          __m256i i0 = _mm256_setzero_si256(), i1 = i0;
          for (int d = b * kKvQBlock; d < std::min(hd, (b + 1) * kKvQBlock); d += 4) {
            int32_t q4;
            std::memcpy(&q4, Qq + r * hd + d, 4);
            const __m256i qb = _mm256_set1_epi32(q4);
            const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + uint64_t(d) * kKvTile));
            const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + uint64_t(d) * kKvTile + 32));
            i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(k0, k0), _mm256_sign_epi8(qb, k0)), ones));
            i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(k1, k1), _mm256_sign_epi8(qb, k1)), ones));
          }
          const float* kd = reinterpret_cast<const float*>(tile + uint64_t(hd) * kKvTile) + b * kKvTile;
          const __m256 qd = _mm256_set1_ps(Qd[r * nqb + b]);
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(_mm256_loadu_ps(kd), qd), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(_mm256_loadu_ps(kd + 8), qd), acc1);
        }
        _mm256_storeu_ps(S + r * ldS + t * kKvTile, acc0);
        _mm256_storeu_ps(S + r * ldS + t * kKvTile + 8, acc1);
      }
    }
  }

  // See ScalarAttn::softmax.
  static void softmax(float* S, int ldS, int rows, float* m, float* l, float* alpha) {
    const float ninf = -std::numeric_limits<float>::infinity();
    constexpr int n = Attention<Avx2Attn>::kChunk / 8;
    for (int r = 0; r < rows; ++r) {
      float* s = S + r * ldS;
      __m256 mx8 = _mm256_loadu_ps(s);
      for (int c = 1; c < n; ++c) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(s + 8 * c));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, mx8);
      float mx = ninf;
      for (float x : lanes) mx = std::max(mx, x);
      const float mn = std::max(m[r], mx), mu = mn == ninf ? 0.0f : mn;
      const __m256 mub = _mm256_set1_ps(mu);
      __m256 sum = _mm256_setzero_ps();
      for (int c = 0; c < n; ++c) {
        const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * c), mub));
        _mm256_storeu_ps(s + 8 * c, p);
        sum = _mm256_add_ps(sum, p);
      }
      _mm256_store_ps(lanes, sum);
      float total = 0;
      for (float x : lanes) total += x;
      alpha[r] = std::exp(m[r] - mu);
      l[r] = l[r] * alpha[r] + total;
      m[r] = mn;
    }
  }

  // One V row -> f32 (head_dim,), 8 at a time, the tail as kv_load_v_row does it.
  static void v_row(const KVGeometry& g, const uint8_t* row, float* v) {
    const int hd = g.head_dim;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
      __m256 x;
      if (g.type == GGMLType::Q8_0) {
        float sc;
        std::memcpy(&sc, row + uint64_t(hd) + uint64_t(d / kKvQBlock) * sizeof(float), sizeof(float));
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d));
        x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(sc));
      } else if (g.type == GGMLType::F16) {
        x = load8<GGMLType::F16>(row + 2 * d);
      } else {
        x = load8<GGMLType::BF16>(row + 2 * d);
      }
      _mm256_storeu_ps(v + d, x);
    }
    if (d < hd) {
      float tail[Attention<Avx2Attn>::kMaxHead];
      kv_load_v_row(g, row, tail);
      std::copy(tail + d, tail + hd, v + d);
    }
  }

  // NR rows x 16 columns from d0: 2 NR accumulators + 2 V vectors + a broadcast fit the 16
  // registers (NR = 6 is the widest).
  template <int NR>
  static void pv_t(float* O, int hd, int d0, const float* alpha, const float* P, int ldP, const float* const* v,
                   int len) {
    __m256 acc[NR][2];
    for (int r = 0; r < NR; ++r) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      for (int c = 0; c < 2; ++c) acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(O + r * hd + d0 + 8 * c), a);
    }
    for (int j = 0; j < len; ++j) {
      const __m256 v0 = _mm256_loadu_ps(v[j] + d0), v1 = _mm256_loadu_ps(v[j] + d0 + 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_broadcast_ss(P + r * ldP + j);
        acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 2; ++c) _mm256_storeu_ps(O + r * hd + d0 + 8 * c, acc[r][c]);
  }
  template <int NR>
  static void pv_rows(float* O, int hd, const float* alpha, const float* P, int ldP, const float* const* v, int len) {
    int d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) pv_t<NR>(O, hd, d0, alpha, P, ldP, v, len);
    for (int r = 0; r < NR; ++r)  // (columns past the last 16: scalar, the same fma chain)
      for (int d = d0; d < hd; ++d) {
        float o = O[r * hd + d] * alpha[r];
        for (int j = 0; j < len; ++j) o = std::fma(P[r * ldP + j], v[j][d], o);
        O[r * hd + d] = o;
      }
  }
  static void pv(int rows, float* O, int hd, const float* alpha, const float* P, int ldP, const float* const* v,
                 int len) {
    for (int r0 = 0; r0 < rows; r0 += 6) {
      float* o = O + r0 * hd;
      const float* a = alpha + r0;
      const float* p = P + r0 * ldP;
      switch (std::min(6, rows - r0)) {
        case 1: pv_rows<1>(o, hd, a, p, ldP, v, len); break;
        case 2: pv_rows<2>(o, hd, a, p, ldP, v, len); break;
        case 3: pv_rows<3>(o, hd, a, p, ldP, v, len); break;
        case 4: pv_rows<4>(o, hd, a, p, ldP, v, len); break;
        case 5: pv_rows<5>(o, hd, a, p, ldP, v, len); break;
        default: pv_rows<6>(o, hd, a, p, ldP, v, len); break;
      }
    }
  }
};

}  // namespace

AttentionFn avx2_attention() { return &Attention<Avx2Attn>::run; }

}  // namespace ft::cpu
