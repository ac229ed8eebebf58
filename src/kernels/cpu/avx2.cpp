// AVX2 + FMA (+ F16C) instantiation of the fast-kernel drivers. Compiled for those extensions
// whatever the build flags; only called after cpu_has_avx2_fma() says the CPU has them.
// Standard headers come first so their inline functions are not compiled for AVX2 here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"

namespace ft::cpu {
namespace {

// Canonical reduction of 4 vectors: lane i = ((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7)) of vector i.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// exp(x) for 8 floats (Cephes polynomial, ~1 ulp); x < -87.3 (and -inf) gives exactly 0.
inline __m256 exp256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

// f16 -> f32 with F16C (exact, like blocks::load_f16).
inline float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256 i8x8_to_ps(const void* p) {  // 8 int8 -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

struct Avx2Isa {
  template <int MR, int NR>
  static void tile(const float* const* x, const float* const* w, int64_t len, float* out) {
    static_assert(MR >= 1 && MR <= 3 && NR >= 1 && NR <= 3);
    // Named registers (no arrays: GCC would keep arrays on the stack). Unused ones fold away.
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00,
           a20 = a00, a21 = a00, a22 = a00;
    const float* x0 = x[0];
    const float* x1 = MR > 1 ? x[1] : x[0];
    const float* x2 = MR > 2 ? x[2] : x[0];
    const float* w0 = w[0];
    const float* w1 = NR > 1 ? w[1] : w[0];
    const float* w2 = NR > 2 ? w[2] : w[0];
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
      // Weights into registers once (the asm keeps GCC from re-loading them as memory operands
      // of every FMA, which makes the loop load-port bound), then one x row at a time.
      __m256 v0 = _mm256_loadu_ps(w0 + k), v1, v2;
      __asm__("" : "+x"(v0));
      if constexpr (NR > 1) { v1 = _mm256_loadu_ps(w1 + k); __asm__("" : "+x"(v1)); }
      if constexpr (NR > 2) { v2 = _mm256_loadu_ps(w2 + k); __asm__("" : "+x"(v2)); }
      {
        __m256 xv = _mm256_loadu_ps(x0 + k);
        __asm__("" : "+x"(xv));
        a00 = _mm256_fmadd_ps(xv, v0, a00);
        if constexpr (NR > 1) a01 = _mm256_fmadd_ps(xv, v1, a01);
        if constexpr (NR > 2) a02 = _mm256_fmadd_ps(xv, v2, a02);
      }
      if constexpr (MR > 1) {
        __m256 xv = _mm256_loadu_ps(x1 + k);
        __asm__("" : "+x"(xv));
        a10 = _mm256_fmadd_ps(xv, v0, a10);
        if constexpr (NR > 1) a11 = _mm256_fmadd_ps(xv, v1, a11);
        if constexpr (NR > 2) a12 = _mm256_fmadd_ps(xv, v2, a12);
      }
      if constexpr (MR > 2) {
        __m256 xv = _mm256_loadu_ps(x2 + k);
        __asm__("" : "+x"(xv));
        a20 = _mm256_fmadd_ps(xv, v0, a20);
        if constexpr (NR > 1) a21 = _mm256_fmadd_ps(xv, v1, a21);
        if constexpr (NR > 2) a22 = _mm256_fmadd_ps(xv, v2, a22);
      }
    }
    alignas(16) float h[12];
    const __m256 z = _mm256_setzero_ps();
    _mm_store_ps(h + 0, hsum4(a00, a01, a02, a10));
    if constexpr (MR > 1) _mm_store_ps(h + 4, hsum4(a11, a12, a20, a21));
    if constexpr (MR > 2) _mm_store_ps(h + 8, hsum4(a22, z, z, z));
    // h in (i, j) order with row stride 3.
    const float* xr[3] = {x0, x1, x2};
    const float* wr[3] = {w0, w1, w2};
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        float s = h[i * 3 + j];
        for (int64_t t = k; t < len; ++t) s = std::fma(xr[i][t], wr[j][t], s);
        out[i * NR + j] = s;
      }
  }

  // Decode fast path: out[j] = chunk_dot(x, row j) for j < nr, dequantizing in registers (the
  // same f32 weight values and summation order as dequant() + tile<1, nr>, without the round
  // trip through L1). rows[j] point at the chunk's first block. Returns false for types it does
  // not handle (the caller then dequantizes into the panel).
  static bool dot_rows(GGMLType t, const uint8_t* const* rows, int nr, const float* x, int64_t len,
                       float* out) {
    if (len % 32 != 0) return false;
    switch (t) {
      case GGMLType::F16:
        return dot_rows_t(nr, x, len, out, [&](int j, int64_t k) {
          return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + 2 * k)));
        });
      case GGMLType::BF16:
        return dot_rows_t(nr, x, len, out, [&](int j, int64_t k) {
          const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + 2 * k)));
          return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        });
      case GGMLType::Q8_0:
        return dot_rows_t(nr, x, len, out, [&](int j, int64_t k) {
          const auto* b = reinterpret_cast<const blocks::Q8_0*>(rows[j]) + k / 32;
          return _mm256_mul_ps(i8x8_to_ps(b->qs + (k % 32)), _mm256_set1_ps(f16c(b->d)));
        });
      case GGMLType::Q4_0:
        return dot_rows_t(nr, x, len, out, [&](int j, int64_t k) {
          const auto* b = reinterpret_cast<const blocks::Q4_0*>(rows[j]) + k / 32;
          const int c = int(k % 32) / 8;  // 0,1: low nibbles of qs[0..15]; 2,3: high nibbles
          __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + (c & 1) * 8));
          if (c >= 2) q = _mm_srli_epi16(q, 4);
          q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
          return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(f16c(b->d)));
        });
      default:
        return false;
    }
  }
  template <class Load>
  static bool dot_rows_t(int nr, const float* x, int64_t len, float* out, Load load) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0;
    if (nr == 3) {
      for (int64_t k = 0; k < len; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xv, load(0, k), a0);
        a1 = _mm256_fmadd_ps(xv, load(1, k), a1);
        a2 = _mm256_fmadd_ps(xv, load(2, k), a2);
      }
    } else if (nr == 2) {
      for (int64_t k = 0; k < len; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xv, load(0, k), a0);
        a1 = _mm256_fmadd_ps(xv, load(1, k), a1);
      }
    } else {
      for (int64_t k = 0; k < len; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load(0, k), a0);
    }
    alignas(16) float h[4];
    _mm_store_ps(h, hsum4(a0, a1, a2, a2));
    for (int j = 0; j < nr; ++j) out[j] = h[j];
    return true;
  }

  // len elements of one row from a block-aligned src, bit-identical to dequantize_row.
  static void dequant(GGMLType t, const uint8_t* src, int64_t len, float* dst) {
    switch (t) {
      case GGMLType::F16: {
        int64_t i = 0;
        for (; i + 8 <= len; i += 8)
          _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
        if (i < len) dequantize_row(t, src + 2 * i, dst + i, len - i);
        return;
      }
      case GGMLType::BF16: {
        int64_t i = 0;
        for (; i + 8 <= len; i += 8) {
          const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
          _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        if (i < len) dequantize_row(t, src + 2 * i, dst + i, len - i);
        return;
      }
      case GGMLType::Q8_0: {
        const auto* b = reinterpret_cast<const blocks::Q8_0*>(src);
        for (int64_t i = 0; i < len / 32; ++i, dst += 32) {
          const __m256 d = _mm256_set1_ps(f16c(b[i].d));
          for (int c = 0; c < 4; ++c) _mm256_storeu_ps(dst + 8 * c, _mm256_mul_ps(i8x8_to_ps(b[i].qs + 8 * c), d));
        }
        return;
      }
      case GGMLType::Q4_0: {
        const auto* b = reinterpret_cast<const blocks::Q4_0*>(src);
        const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
        for (int64_t i = 0; i < len / 32; ++i, dst += 32) {
          const __m256 d = _mm256_set1_ps(f16c(b[i].d));
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
          const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), e8);
          const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), e8);
          _mm256_storeu_ps(dst + 0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
          _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
          _mm256_storeu_ps(dst + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
          _mm256_storeu_ps(dst + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
        }
        return;
      }
      case GGMLType::Q4_K: {
        const auto* b = reinterpret_cast<const blocks::Q4_K*>(src);
        const __m256i m4 = _mm256_set1_epi32(0xF);
        for (int64_t i = 0; i < len / 256; ++i) {
          const float d = f16c(b[i].d), dmin = f16c(b[i].dmin);
          const uint8_t* q = b[i].qs;
          for (int c = 0; c < 4; ++c, q += 32) {
            uint8_t sc, m;
            blocks::scale_min_k4(2 * c, b[i].scales, sc, m);
            const __m256 d1 = _mm256_set1_ps(d * float(sc)), m1 = _mm256_set1_ps(dmin * float(m));
            blocks::scale_min_k4(2 * c + 1, b[i].scales, sc, m);
            const __m256 d2 = _mm256_set1_ps(d * float(sc)), m2 = _mm256_set1_ps(dmin * float(m));
            for (int l = 0; l < 32; l += 8) {
              const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + l)));
              // d*q is exact (<= 21 significant bits), so the fused form equals the reference's.
              _mm256_storeu_ps(dst + l, _mm256_fmsub_ps(d1, _mm256_cvtepi32_ps(_mm256_and_si256(v, m4)), m1));
              _mm256_storeu_ps(dst + 32 + l, _mm256_fmsub_ps(d2, _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), m2));
            }
            dst += 64;
          }
        }
        return;
      }
      case GGMLType::Q6_K: {
        const auto* b = reinterpret_cast<const blocks::Q6_K*>(src);
        const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3), o32 = _mm256_set1_epi32(32);
        for (int64_t i = 0; i < len / 256; ++i) {
          const float d = f16c(b[i].d);
          const uint8_t* ql = b[i].ql;
          const uint8_t* qh = b[i].qh;
          const int8_t* sc = b[i].scales;
          for (int half = 0; half < 2; ++half) {
            for (int l = 0; l < 32; l += 8) {
              const int is = l / 16;
              auto ld = [](const uint8_t* p) {
                return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
              };
              const __m256i a = ld(ql + l), bq = ld(ql + l + 32), h = ld(qh + l);
              const __m256i q1 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m3), 4)), o32);
              const __m256i q2 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(bq, m4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m3), 4)), o32);
              const __m256i q3 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m3), 4)), o32);
              const __m256i q4 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(bq, 4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 6), m3), 4)), o32);
              _mm256_storeu_ps(dst + l + 0, _mm256_mul_ps(_mm256_set1_ps(d * float(sc[is + 0])), _mm256_cvtepi32_ps(q1)));
              _mm256_storeu_ps(dst + l + 32, _mm256_mul_ps(_mm256_set1_ps(d * float(sc[is + 2])), _mm256_cvtepi32_ps(q2)));
              _mm256_storeu_ps(dst + l + 64, _mm256_mul_ps(_mm256_set1_ps(d * float(sc[is + 4])), _mm256_cvtepi32_ps(q3)));
              _mm256_storeu_ps(dst + l + 96, _mm256_mul_ps(_mm256_set1_ps(d * float(sc[is + 6])), _mm256_cvtepi32_ps(q4)));
            }
            dst += 128;
            ql += 64;
            qh += 32;
            sc += 8;
          }
        }
        return;
      }
      default:
        dequantize_row(t, src, dst, len);
        return;
    }
  }

  static float exp1(float x) { return std::exp(x); }
  static void prefetch(const uint8_t* p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
  }

  static float exp_row(float* S, int n, float m) {  // n is a multiple of 8
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
      const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(S + j), vm));
      _mm256_storeu_ps(S + j, p);
      acc = _mm256_add_ps(acc, p);
    }
    const __m128 h = hsum4(acc, acc, acc, acc);
    return _mm_cvtss_f32(h);
  }

  template <int NR, int NV>
  static void pv_chunk(float* O, const float* alpha, const float* P, int ldp, const float* const* v,
                       int len, int hd, int d0) {
    __m256 acc[NR][NV];
    for (int r = 0; r < NR; ++r) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(O + r * hd + d0 + 8 * c), a);
    }
    for (int j = 0; j < len; ++j) {
      __m256 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = _mm256_loadu_ps(v[j] + d0 + 8 * c);
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_broadcast_ss(P + r * ldp + j);
        for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) _mm256_storeu_ps(O + r * hd + d0 + 8 * c, acc[r][c]);
  }
  template <int NR>
  static void pv_rows(float* O, const float* alpha, const float* P, int ldp, const float* const* v,
                      int len, int hd) {
    int d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) pv_chunk<NR, 4>(O, alpha, P, ldp, v, len, hd, d0);
    for (; d0 + 8 <= hd; d0 += 8) pv_chunk<NR, 1>(O, alpha, P, ldp, v, len, hd, d0);
    for (int r = 0; r < NR; ++r)
      for (int d = d0; d < hd; ++d) {
        float o = O[r * hd + d] * alpha[r];
        for (int j = 0; j < len; ++j) o = std::fma(P[r * ldp + j], v[j][d], o);
        O[r * hd + d] = o;
      }
  }
  static void pv(int nr, float* O, const float* alpha, const float* P, int ldp,
                 const float* const* v, int len, int hd) {
    if (nr == 3) pv_rows<3>(O, alpha, P, ldp, v, len, hd);
    else if (nr == 2) pv_rows<2>(O, alpha, P, ldp, v, len, hd);
    else pv_rows<1>(O, alpha, P, ldp, v, len, hd);
  }
};

}  // namespace

const IsaKernels& avx2_kernels() { return make_table<Avx2Isa>("avx2"); }

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

}  // namespace ft::cpu
