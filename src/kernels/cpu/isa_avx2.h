// The AVX2 + FMA (+ F16C) inner kernels of the fast-kernel drivers (kernels_impl.h), as one Isa
// class. Included only by translation units compiled for AVX2 (or a superset): avx2.cpp
// instantiates the drivers with it, avx512.cpp derives its own Isa from it. Everything is in an
// anonymous namespace, so each includer gets its own copy compiled for its own target: no
// inline symbol compiled for a wider ISA can be picked by the linker for a narrower path.
// Include after <immintrin.h> and kernels_impl.h, under the includer's `#pragma GCC target`.
#pragma once

namespace ft::cpu {
namespace {

using rowwise::ExpConst;  // (exp's constants: rowwise.h, with the scalar form)

// exp(x) for 8 floats (Cephes polynomial, ~1 ulp); x < -87.3 (and -inf) gives exactly 0. Each
// lane is rowwise::exp_cephes's result (the same operations in the same order).
inline __m256 exp256(__m256 x) {
  using C = ExpConst;
  const __m256 lo = _mm256_set1_ps(C::lo);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(C::hi));
  x = _mm256_max_ps(x, lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(C::log2e), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(C::ln2_hi), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(C::ln2_lo), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(C::p[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(C::p[i]));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

// cap * tanh(x / cap) for 8 floats, as 1 - 2 / (exp(2|y|) + 1) with the sign of y = x / cap:
// within ~2^-23 absolute of tanh, so cap * 2^-23 of the scalar form (attention scores, where
// that is far below the softmax's own rounding); |y| beyond exp's range gives +-cap.
inline __m256 softcap256(__m256 x, float cap) {
  const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap));
  const __m256 sign = _mm256_and_ps(y, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), y), _mm256_set1_ps(40.0f));
  const __m256 e = exp256(_mm256_add_ps(a, a));
  const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                 _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  return _mm256_mul_ps(_mm256_or_ps(t, sign), _mm256_set1_ps(cap));
}
// S (n,) -> softcap256 in place, 8 at a time (n a multiple of 8): attention's score rows.
inline void softcap_row256(float* S, int n, float cap) {
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(S + i, softcap256(_mm256_loadu_ps(S + i), cap));
}

struct Avx2Isa {
  // The SwiGLU epilogue: y[j] = silu(g[j]) * u[j] for j < n, rowwise::silu's operations on 8
  // lanes (exp256, x / (1 + e), the product), so each output is the scalar form's bits.
  static void silu_mul(const float* g, const float* u, float* y, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 x = _mm256_loadu_ps(g + j);
      const __m256 e = exp256(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
      _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                            _mm256_loadu_ps(u + j)));
    }
    for (; j < n; ++j) y[j] = rowwise::silu(g[j]) * u[j];
  }
  // ---- GEMM on the panel layout (packed.h) ----
  // C (MR, ldc)[:, 0:16] (+)= x (MR, ldx) @ w (len, 16): 12 accumulators, each one fma chain
  // over k in order (from 0 when first, else from C).
  // (x: MR row pointers.)
  template <int MR>
  static void mk_t(const float* const* x, const float* w, int64_t len, float* c, int64_t ldc,
                   bool first) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float* x0 = x[0];
    const float* x1 = x[MR > 1 ? 1 : 0];
    const float* x2 = x[MR > 2 ? 2 : 0];
    const float* x3 = x[MR > 3 ? 3 : 0];
    const float* x4 = x[MR > 4 ? 4 : 0];
    const float* x5 = x[MR > 5 ? 5 : 0];
#define FT_LD(i)                                                                   \
  if constexpr (MR > i) {                                                          \
    if (!first) {                                                                  \
      c##i##0 = _mm256_loadu_ps(c + i * ldc);                                      \
      c##i##1 = _mm256_loadu_ps(c + i * ldc + 8);                                  \
    }                                                                              \
  }
#define FT_FM(i, xk)                                                               \
  if constexpr (MR > i) {                                                          \
    const __m256 a = _mm256_broadcast_ss(xk);                                      \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                                     \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);                                     \
  }
#define FT_ST(i)                                                                   \
  if constexpr (MR > i) {                                                          \
    _mm256_storeu_ps(c + i * ldc, c##i##0);                                        \
    _mm256_storeu_ps(c + i * ldc + 8, c##i##1);                                    \
  }
    FT_LD(0) FT_LD(1) FT_LD(2) FT_LD(3) FT_LD(4) FT_LD(5)
    for (int64_t k = 0; k < len; ++k) {
      const __m256 b0 = _mm256_loadu_ps(w + k * 16), b1 = _mm256_loadu_ps(w + k * 16 + 8);
      FT_FM(0, x0 + k) FT_FM(1, x1 + k) FT_FM(2, x2 + k) FT_FM(3, x3 + k) FT_FM(4, x4 + k) FT_FM(5, x5 + k)
    }
    FT_ST(0) FT_ST(1) FT_ST(2) FT_ST(3) FT_ST(4) FT_ST(5)
  }
  static void mk_rows(int mr, const float* const* x, const float* w, int64_t len, float* c,
                      int64_t ldc, bool first) {
    switch (mr) {
      case 1: return mk_t<1>(x, w, len, c, ldc, first);
      case 2: return mk_t<2>(x, w, len, c, ldc, first);
      case 3: return mk_t<3>(x, w, len, c, ldc, first);
      case 4: return mk_t<4>(x, w, len, c, ldc, first);
      case 5: return mk_t<5>(x, w, len, c, ldc, first);
      default: return mk_t<6>(x, w, len, c, ldc, first);
    }
  }

  // Calls f(k - k0, b) for k in [k0, k0 + len) with b[2g], b[2g+1] = group g's 16 f32 weights at
  // k (rows 0-7, 8-15), g < NG (all of float type t), converted in registers exactly as
  // dequantize_row does. Several groups at once give the FMA chains that consume them independent
  // work to overlap (one chain per output is the numerics contract).
  static __m256 h8(const uint8_t* p) {  // 8 f16 -> f32
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <int NG, class F>
  static void for_k(GGMLType t, const uint8_t* const* groups, int64_t k0, int64_t len, F&& f) {
    const int64_t k1 = k0 + len;
    __m256 b[2 * NG];
    switch (t) {
      case GGMLType::F32:
        for (int64_t k = k0; k < k1; ++k) {
          for (int g = 0; g < NG; ++g) {
            const float* w = reinterpret_cast<const float*>(groups[g]) + 16 * k;
            b[2 * g] = _mm256_loadu_ps(w);
            b[2 * g + 1] = _mm256_loadu_ps(w + 8);
          }
          f(k - k0, b);
        }
        return;
      case GGMLType::F16:
        for (int64_t k = k0; k < k1; ++k) {
          for (int g = 0; g < NG; ++g) {
            b[2 * g] = h8(groups[g] + 32 * k);
            b[2 * g + 1] = h8(groups[g] + 32 * k + 16);
          }
          f(k - k0, b);
        }
        return;
      case GGMLType::BF16:
        for (int64_t k = k0; k < k1; ++k) {
          for (int g = 0; g < NG; ++g) {
            const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(groups[g] + 32 * k)));
            const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(groups[g] + 32 * k + 16)));
            b[2 * g] = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
            b[2 * g + 1] = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
          }
          f(k - k0, b);
        }
        return;
      default:
        fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }

  static void unpack(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp) {
    for_k<1>(t, &group, k0, len, [Wp](int64_t k, const __m256* b) {
      _mm256_storeu_ps(Wp + 16 * k, b[0]);
      _mm256_storeu_ps(Wp + 16 * k + 8, b[1]);
    });
  }
  // unpack with each pair's two k swapped (k0 even): k at k ^ 1 (Drivers::bf16_panels; an odd
  // len's last k lands at len, its pair's other row left to the caller).
  static void unpack_swapped(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp) {
    for_k<1>(t, &group, k0, len, [Wp](int64_t k, const __m256* b) {
      _mm256_storeu_ps(Wp + 16 * (k ^ 1), b[0]);
      _mm256_storeu_ps(Wp + 16 * (k ^ 1) + 8, b[1]);
    });
  }

  // Small M (decode): C (M, ldc)[:, 16g : 16g+16] = X (M, ldx) @ group_g^T over all of K for
  // g < NG, weights dequantized in registers; the same chains as unpack + mk.
  static constexpr int64_t kFusedMaxM = 4;
  // (Named accumulators: GCC keeps an accumulator array captured by the lambda in memory.)
  template <int MR>
  static void gemv_t(GGMLType t, const uint8_t* group, int64_t K, const float* x, int64_t ldx,
                     float* c, int64_t ldc) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00;
    const float* x0 = x;
    const float* x1 = MR > 1 ? x + ldx : x;
    const float* x2 = MR > 2 ? x + 2 * ldx : x;
    const float* x3 = MR > 3 ? x + 3 * ldx : x;
    for_k<1>(t, &group, 0, K, [&](int64_t k, const __m256* b) {
      const __m256 b0 = b[0], b1 = b[1];
      FT_FM(0, x0 + k) FT_FM(1, x1 + k) FT_FM(2, x2 + k) FT_FM(3, x3 + k)
    });
    FT_ST(0) FT_ST(1) FT_ST(2) FT_ST(3)
  }
  // M = 1 over two groups at once: four independent chains instead of two, so the FMA latency
  // overlaps (one row's 16 outputs alone would wait on it every k).
  static void gemv_1x2(GGMLType t, const uint8_t* const* groups, int64_t K, const float* x, float* c) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for_k<2>(t, groups, 0, K, [&](int64_t k, const __m256* b) {
      const __m256 xv = _mm256_broadcast_ss(x + k);
      a0 = _mm256_fmadd_ps(xv, b[0], a0);
      a1 = _mm256_fmadd_ps(xv, b[1], a1);
      a2 = _mm256_fmadd_ps(xv, b[2], a2);
      a3 = _mm256_fmadd_ps(xv, b[3], a3);
    });
    _mm256_storeu_ps(c, a0);
    _mm256_storeu_ps(c + 8, a1);
    _mm256_storeu_ps(c + 16, a2);
    _mm256_storeu_ps(c + 24, a3);
  }
#undef FT_LD
#undef FT_FM
#undef FT_ST
  // LoRA's expand (Drivers::add_lora): c (mr, 16 ng) = x (mr, ldx) @ [group_0 .. group_ng-1]
  // (K, 16 each), mr <= 4, ng <= 2.
  static void gemv_rows(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const float* x, int64_t ldx,
                        int mr, float* c) {
    if (ng == 2 && mr == 1) return gemv_1x2(t, groups, K, x, c);
    for (int g = 0; g < ng; ++g) {
      float* cg = c + 16 * g;
      switch (mr) {
        case 1: gemv_t<1>(t, groups[g], K, x, ldx, cg, 16 * ng); break;
        case 2: gemv_t<2>(t, groups[g], K, x, ldx, cg, 16 * ng); break;
        case 3: gemv_t<3>(t, groups[g], K, x, ldx, cg, 16 * ng); break;
        case 4: gemv_t<4>(t, groups[g], K, x, ldx, cg, 16 * ng); break;
        default: fail("gemv_rows: ", mr, " rows (1..4)");
      }
    }
  }
  // LoRA (Drivers::add_lora over single-row runs, Drivers::gemm_runs_decode): c (nr, 16 ng)
  // row r = x[r] (K,) @ [groups[r ng] .. groups[r ng + ng - 1]], nr <= 4, ng <= 2. Per group
  // column, the nr runs' chains side by side (2 nr accumulators: 8 at most of the 16 registers);
  // the same fma chain per output as gemv_t, so the same bits.
  template <int NR>
  static void runs_t(GGMLType t, const uint8_t* const* groups, int64_t K, const float* const* x, float* c,
                     int64_t ldc) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00;
    const float* x0 = x[0];
    const float* x1 = x[NR > 1 ? 1 : 0];
    const float* x2 = x[NR > 2 ? 2 : 0];
    const float* x3 = x[NR > 3 ? 3 : 0];
    for_k<NR>(t, groups, 0, K, [&](int64_t k, const __m256* b) {
#define FT_RUN(i, xp)                                                  \
  if constexpr (NR > i) {                                              \
    const __m256 v = _mm256_broadcast_ss(xp);                          \
    c##i##0 = _mm256_fmadd_ps(v, b[2 * i], c##i##0);                   \
    c##i##1 = _mm256_fmadd_ps(v, b[2 * i + 1], c##i##1);               \
  }
      FT_RUN(0, x0 + k) FT_RUN(1, x1 + k) FT_RUN(2, x2 + k) FT_RUN(3, x3 + k)
#undef FT_RUN
    });
#define FT_RUN_ST(i)                              \
  if constexpr (NR > i) {                         \
    _mm256_storeu_ps(c + i * ldc, c##i##0);       \
    _mm256_storeu_ps(c + i * ldc + 8, c##i##1);   \
  }
    FT_RUN_ST(0) FT_RUN_ST(1) FT_RUN_ST(2) FT_RUN_ST(3)
#undef FT_RUN_ST
  }
  // LoRA's expand over n consecutive work items of one B for one row x (Drivers::expand_span):
  // item i's ng (1 or 2) groups are B's groups i ng .. from g (gb bytes each), and
  // c + i ldi + 16 j (16) += x (K,) @ group j. Four groups per runs_t call (their chains side
  // by side; the same chain per output as gemv_t), then one add: the queue path's bits.
  static void expand_items(GGMLType t, const uint8_t* g, uint64_t gb, int ng, int64_t n, int64_t K, const float* x,
                           float* c, int64_t ldi) {
    const int64_t total = n * ng;
    const float* xs[4] = {x, x, x, x};
    for (int64_t q0 = 0; q0 < total; q0 += 4) {
      const int nr = int(std::min<int64_t>(4, total - q0));
      const uint8_t* gr[4];
      for (int r = 0; r < nr; ++r) gr[r] = g + uint64_t(q0 + r) * gb;
      alignas(32) float dl[4 * 16];
      switch (nr) {
        case 1: runs_t<1>(t, gr, K, xs, dl, 16); break;
        case 2: runs_t<2>(t, gr, K, xs, dl, 16); break;
        case 3: runs_t<3>(t, gr, K, xs, dl, 16); break;
        default: runs_t<4>(t, gr, K, xs, dl, 16); break;
      }
      for (int r = 0; r < nr; ++r) {
        float* cq = c + (q0 + r) / ng * ldi + 16 * ((q0 + r) % ng);
        for (int j = 0; j < 16; j += 8)
          _mm256_storeu_ps(cq + j, _mm256_add_ps(_mm256_loadu_ps(cq + j), _mm256_load_ps(dl + 16 * r + j)));
      }
    }
  }
  static void gemv_runs(GGMLType t, const uint8_t* const* groups, int ng, int nr, int64_t K, const float* const* x,
                        float* c) {
    for (int g = 0; g < ng; ++g) {
      const uint8_t* gr[4];
      for (int r = 0; r < nr; ++r) gr[r] = groups[r * ng + g];
      float* cg = c + 16 * g;
      switch (nr) {
        case 1: runs_t<1>(t, gr, K, x, cg, 16 * ng); break;
        case 2: runs_t<2>(t, gr, K, x, cg, 16 * ng); break;
        case 3: runs_t<3>(t, gr, K, x, cg, 16 * ng); break;
        case 4: runs_t<4>(t, gr, K, x, cg, 16 * ng); break;
        default: fail("gemv_runs: ", nr, " runs (1..4)");
      }
    }
  }
  // M = 1 over four groups (Drivers::gemm: two work items at decode): eight chains, as the two
  // FMA pipes at a latency of 4 keep eight in flight.
  static constexpr int kGemvFloatGroups = 4;
  // Half h (8 weights) of a group's 16 at k, as for_k converts them.
  template <GGMLType T>
  static __m256 half_at(const uint8_t* g, int64_t k, int h) {
    if constexpr (T == GGMLType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(g) + 16 * k + 8 * h);
    if constexpr (T == GGMLType::F16) return h8(g + 32 * k + 16 * h);
    if constexpr (T == GGMLType::BF16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 32 * k + 16 * h));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
  }
  // BF16 weights on the numerics of vdpbf16ps (kernels_impl.h: bf16_item), emulated: per pair
  // of k the odd one's fma, then the even one's (MXCSR flushes denormals: bf16_item's scope).
  // Per group, tiles of up to 4 rows: 8 accumulators, the pair's 4 weight halves, 2 broadcasts.
  static constexpr int kMRBf16 = 4;
  // f[0..8) = x[0..8) rounded to bf16 as Drivers::bf16_bits_daz does (the same bits).
  static void round_bf16_8(const float* x, float* f) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i hi = _mm256_set1_epi32(int32_t(0xffff0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), hi);
    const __m256i nan = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
    const __m256i zero = _mm256_and_si256(u, _mm256_set1_epi32(int32_t(0x80000000u)));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i is_den = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    const __m256i r = _mm256_blendv_epi8(_mm256_blendv_epi8(rounded, nan, is_nan), zero, is_den);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(f), r);
  }
  static constexpr bool kBf16Panels = true;  // (Drivers::bf16_panels beyond one tile)
  template <int MR>
  static void mkb_t(const float* const* x, const uint8_t* w, int64_t len, float* c, int64_t ldc, bool first) {
    __m256 acc[MR][2];
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h) acc[i][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc + 8 * h);
    int64_t k = 0;
    for (; k + 1 < len; k += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(w) + 32 * k + kPrefetch, _MM_HINT_T0);
      const __m256 wo0 = half_at<GGMLType::BF16>(w, k + 1, 0), wo1 = half_at<GGMLType::BF16>(w, k + 1, 1);
      const __m256 we0 = half_at<GGMLType::BF16>(w, k, 0), we1 = half_at<GGMLType::BF16>(w, k, 1);
      for (int i = 0; i < MR; ++i) {
        const __m256 xo = _mm256_broadcast_ss(x[i] + k + 1), xe = _mm256_broadcast_ss(x[i] + k);
        acc[i][0] = _mm256_fmadd_ps(xe, we0, _mm256_fmadd_ps(xo, wo0, acc[i][0]));
        acc[i][1] = _mm256_fmadd_ps(xe, we1, _mm256_fmadd_ps(xo, wo1, acc[i][1]));
      }
    }
    if (k < len) {  // (K odd: the last k's pair is a zero)
      const __m256 we0 = half_at<GGMLType::BF16>(w, k, 0), we1 = half_at<GGMLType::BF16>(w, k, 1), z = _mm256_setzero_ps();
      for (int i = 0; i < MR; ++i) {
        const __m256 xe = _mm256_broadcast_ss(x[i] + k);
        acc[i][0] = _mm256_fmadd_ps(xe, we0, _mm256_add_ps(acc[i][0], z));
        acc[i][1] = _mm256_fmadd_ps(xe, we1, _mm256_add_ps(acc[i][1], z));
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(c + i * ldc + 8 * h, acc[i][h]);
  }
  // One row over NG groups (decode: up to two work items' four): 2 NG chains side by side, each
  // weight loaded beside its fma (as gemv_1x4_t: all of them at once would spill).
  template <int NG>
  static void mkb_1_t(const float* x, const uint8_t* const* w, int64_t len, float* c, bool first) {
    __m256 acc[NG][2];
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h) acc[g][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 16 * g + 8 * h);
    int64_t k = 0;
    for (; k + 1 < len; k += 2) {
      const __m256 xo = _mm256_broadcast_ss(x + k + 1), xe = _mm256_broadcast_ss(x + k);
      for (int g = 0; g < NG; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(w[g]) + 32 * k + kPrefetch, _MM_HINT_T0);
        for (int h = 0; h < 2; ++h)
          acc[g][h] = _mm256_fmadd_ps(xe, half_at<GGMLType::BF16>(w[g], k, h),
                                      _mm256_fmadd_ps(xo, half_at<GGMLType::BF16>(w[g], k + 1, h), acc[g][h]));
      }
    }
    if (k < len) {
      const __m256 xe = _mm256_broadcast_ss(x + k), z = _mm256_setzero_ps();
      for (int g = 0; g < NG; ++g)
        for (int h = 0; h < 2; ++h)
          acc[g][h] = _mm256_fmadd_ps(xe, half_at<GGMLType::BF16>(w[g], k, h), _mm256_add_ps(acc[g][h], z));
    }
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(c + 16 * g + 8 * h, acc[g][h]);
  }
  static void mk_bf16(int mr, const float* const* xf, const uint32_t* const*, const uint8_t* const* w, int ng,
                      int64_t len, float* c, int64_t ldc, bool first) {
    if (mr == 1 && ng > 1) {
      switch (ng) {
        case 2: return mkb_1_t<2>(xf[0], w, len, c, first);
        case 3: return mkb_1_t<3>(xf[0], w, len, c, first);
        default: return mkb_1_t<4>(xf[0], w, len, c, first);
      }
    }
    for (int g = 0; g < ng; ++g) {
      float* cg = c + g * kGroup;
      switch (mr) {
        case 1: mkb_t<1>(xf, w[g], len, cg, ldc, first); break;
        case 2: mkb_t<2>(xf, w[g], len, cg, ldc, first); break;
        case 3: mkb_t<3>(xf, w[g], len, cg, ldc, first); break;
        default: mkb_t<4>(xf, w[g], len, cg, ldc, first); break;
      }
    }
  }
  template <GGMLType T>
  static void gemv_1x4_t(const uint8_t* const* groups, int64_t K, const float* x, float* c) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const uint8_t *g0 = groups[0], *g1 = groups[1], *g2 = groups[2], *g3 = groups[3];
    for (int64_t k = 0; k < K; ++k) {  // (each weight loaded next to its fma: 17 live registers otherwise)
      const __m256 xv = _mm256_broadcast_ss(x + k);
      a0 = _mm256_fmadd_ps(xv, half_at<T>(g0, k, 0), a0);
      a1 = _mm256_fmadd_ps(xv, half_at<T>(g0, k, 1), a1);
      a2 = _mm256_fmadd_ps(xv, half_at<T>(g1, k, 0), a2);
      a3 = _mm256_fmadd_ps(xv, half_at<T>(g1, k, 1), a3);
      a4 = _mm256_fmadd_ps(xv, half_at<T>(g2, k, 0), a4);
      a5 = _mm256_fmadd_ps(xv, half_at<T>(g2, k, 1), a5);
      a6 = _mm256_fmadd_ps(xv, half_at<T>(g3, k, 0), a6);
      a7 = _mm256_fmadd_ps(xv, half_at<T>(g3, k, 1), a7);
    }
    _mm256_storeu_ps(c, a0);  // (stores one by one: an array of the eight kept them in memory in the loop)
    _mm256_storeu_ps(c + 8, a1);
    _mm256_storeu_ps(c + 16, a2);
    _mm256_storeu_ps(c + 24, a3);
    _mm256_storeu_ps(c + 32, a4);
    _mm256_storeu_ps(c + 40, a5);
    _mm256_storeu_ps(c + 48, a6);
    _mm256_storeu_ps(c + 56, a7);
  }
  static void gemv_1x4(GGMLType t, const uint8_t* const* groups, int64_t K, const float* x, float* c) {
    switch (t) {
      case GGMLType::F32: return gemv_1x4_t<GGMLType::F32>(groups, K, x, c);
      case GGMLType::F16: return gemv_1x4_t<GGMLType::F16>(groups, K, x, c);
      case GGMLType::BF16: return gemv_1x4_t<GGMLType::BF16>(groups, K, x, c);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }
  // ng (1 or 2; 4 at one row) groups of the same type, consecutive in C (16 columns each).
  static void gemv(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const float* x,
                   int64_t M, float* c, int64_t ldc) {
    if (ng == 4 && M == 1) return gemv_1x4(t, groups, K, x, c);
    if (ng > 2) fail("gemv: ", ng, " groups at ", M, " rows");
    if (ng == 2 && M == 1) return gemv_1x2(t, groups, K, x, c);
    for (int g = 0; g < ng; ++g) {
      float* cg = c + 16 * g;
      switch (M) {
        case 1: gemv_t<1>(t, groups[g], K, x, K, cg, ldc); break;
        case 2: gemv_t<2>(t, groups[g], K, x, K, cg, ldc); break;
        case 3: gemv_t<3>(t, groups[g], K, x, K, cg, ldc); break;
        default: gemv_t<4>(t, groups[g], K, x, K, cg, ldc); break;
      }
    }
  }


  // ---- Integer path (quantized weights, packed.h) ----
  // Decoders of one group's packed bytes: begin(kb) moves to 32-block kb, scales() gives its s1
  // (and s2) for rows 0-7 / 8-15; the quad types (quad layout): quads_h(P, h, w) its quads 2P and
  // 2P + 1 of rows 8h..8h+7 as bytes (see the quad kernels below); the sub16 types (Q6_K's quad
  // variant, the levels16 layout): quads6_h(hh, h, w) the 4 quads of half block hh. (A constant kBias comes off the block's integer sum as
  // kBias * sum xq, exactly.) Their methods are always inlined: GCC had left Q4_K's scales (and
  // Q6_K's quads6_h) out of line, a call per 32-block and group across which every live vector
  // register spilled (callgrind; TinyLlama Q4_K_M's decode step on `avx2` 0.7x, see README).
  static __m256 u8f(const uint8_t* p) {  // 8 uint8 -> f32
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // Q8_0 and Q4_0: one f16 scale per row and 32-block, then the block's q bytes.
  template <int kBlockBytes>
  struct DecBlock32 {
    static constexpr int kBytesPer32 = kBlockBytes;  // packed bytes per 32-block of k
    static constexpr bool kS2 = false;
    const uint8_t* g;
    const uint8_t* q = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { q = g + kb * kBlockBytes + 32; }
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const {
      s1lo = h8(q - 32);
      s1hi = h8(q - 16);
    }
  };
  struct DecQ8_0 : DecBlock32<544> {
    static constexpr int kBias = 0;
    static constexpr bool kSignedQuads = true;  // quad layout: q + 128 bytes, used as signed q
    // Quad layout (packed.h), rows 8h..8h+7: w[e] = quad 2P + e as int8 q.
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      const __m256i f = _mm256_set1_epi8(int8_t(0x80));
      for (int e = 0; e < 2; ++e)
        w[e] = _mm256_xor_si256(f, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * (2 * P + e) + 32 * h)));
    }
  };
  // Quad layout, nibble types, rows 8h..8h+7: w[e] = quad 2P + e as u8 (0..15).
  static void nibble_quads_h(const uint8_t* q, int P, int h, __m256i (&w)[2]) {
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * P + 32 * h));
    w[0] = _mm256_and_si256(b, m);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
  }
  struct DecQ4_0 : DecBlock32<288> {
    static constexpr int kBias = 8;  // quads_h() give q; v = q - 8
    static constexpr bool kSignedQuads = false;
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const { nibble_quads_h(q, P, h, w); }
  };
  // The level types (packed.h: MXFP4, IQ4_NL and the levels layout): each nibble index q mapped
  // by vpshufb to its level. With AVX-VNNI u = levels[q] + B (MXFP4 12: u in [0, 24]; the others
  // 128: [1, 255]) into vpdpbusd's int32; plain AVX2 sums 8 quads' vpmaddubsw pairs in int16,
  // where u x xq pairs (MXFP4's <= 2 * 24 * 127) would pass 32767 by the sixth quad (5 x 6096 <=
  // 32767 < 6 x 6096), so there the quads are v = levels[q] itself, signed as Q8_0's (|v| x
  // sign(xq, v), widened per quad). unpack_int gives the GEMM Q8_0's form (signed v, kQ8Form).
#ifdef FT_AVX_VNNI
  static constexpr bool kVnniQuads = true;
#else
  static constexpr bool kVnniQuads = false;
#endif
  template <const int8_t* kLevels, int kB>  // (levels[i] + kB, for a byte shuffle)
  [[gnu::always_inline]] static __m256i level_lut() {
    return _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kLevels))),
                           _mm256_set1_epi8(char(kB)));
  }
  template <const int8_t* kLevels, int kB>
  [[gnu::always_inline]] static void level_quads_h(const uint8_t* q, int P, int h, __m256i (&w)[2]) {
    const __m256i lut = level_lut<kLevels, kB>();
    nibble_quads_h(q, P, h, w);
    w[0] = _mm256_shuffle_epi8(lut, w[0]);
    w[1] = _mm256_shuffle_epi8(lut, w[1]);
  }
  // MXFP4 and IQ4_NL: quad layout as Q4_0, d its f16 scale.
  template <GGMLType T, int kVnniBias>
  struct DecLevels32 : DecBlock32<288> {
    static constexpr int kBias = kVnniQuads ? kVnniBias : 0;
    static constexpr bool kSignedQuads = !kVnniQuads, kQ8Form = true;
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      level_quads_h<level_values(T), kBias>(q, P, h, w);
    }
  };
  static __m256 i8f(const uint8_t* p) {  // 8 int8 -> f32
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // The levels layout (packed.h: IQ4_XS, IQ3_XXS, IQ3_S, with nibbles): s1 = d sc unit of
  // sub-block sb, its quads as IQ4_NL's.
  template <GGMLType T>  // (the levels and levels3 layouts' s1 of sub-block sb)
  [[gnu::always_inline]] static void levels_s1(const uint8_t* blk, int sb, __m256& s1lo, __m256& s1hi) {
    s1lo = _mm256_mul_ps(h8(blk + LevelsBlock::kD), i8f(blk + LevelsBlock::kSc + 16 * sb));
    s1hi = _mm256_mul_ps(h8(blk + LevelsBlock::kD + 16), i8f(blk + LevelsBlock::kSc + 16 * sb + 8));
    if constexpr (level_unit(T) != 1.0f) {
      s1lo = _mm256_mul_ps(s1lo, _mm256_set1_ps(level_unit(T)));
      s1hi = _mm256_mul_ps(s1hi, _mm256_set1_ps(level_unit(T)));
    }
  }
  template <GGMLType T>
  struct DecLevels256 : LevelsCursor {
    static_assert(!is_levels3_layout(T), "the levels3 layout's types pack 3-bit indices");
    static constexpr int kBias = kVnniQuads ? 128 : 0, kBytesPer32 = LevelsBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSignedQuads = !kVnniQuads, kQ8Form = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const { levels_s1<T>(blk, sb, s1lo, s1hi); }
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      level_quads_h<level_values(T), kBias>(q, P, h, w);
    }
  };
  // Quad 4hh + t (k = 16hh + 4t .. 16hh + 4t + 3) of a 32-block's 3-bit indices (packed.h: the
  // low fields q, the high bits qh), rows 8h..8h+7: i = low | (high & 4). (16-bit shifts: the
  // ands keep bits 0-1 and bit 2 of each byte, which came from the same byte.)
  [[gnu::always_inline]] static __m256i fields3_quad_h(const uint8_t* q, const uint8_t* qh, int hh, int t, int h) {
    const int s = 4 * hh + t;  // (the high bit's place in its byte, to bit 2)
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * hh + 32 * h));
    const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    const __m256i low = _mm256_and_si256(t == 0 ? b : _mm256_srli_epi16(b, 2 * t), _mm256_set1_epi8(3));
    const __m256i high = s >= 2 ? _mm256_srli_epi16(H, s - 2) : _mm256_slli_epi16(H, 2 - s);
    return _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(4)));
  }
  // The levels3 layout (packed.h: IQ2_XXS, IQ1_S, TQ1_0, TQ2_0): DecLevels256's scales and quads
  // (u = levels[i] + 128 with AVX-VNNI, else signed v = levels[i]), from 3-bit indices.
  template <GGMLType T>
  struct DecLevels3 : Levels3Cursor {
    static_assert(is_levels3_layout(T) && levels_fit_3_bits(T));
    static constexpr int kBias = kVnniQuads ? 128 : 0, kBytesPer32 = Levels3Block::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSignedQuads = !kVnniQuads, kQ8Form = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const { levels_s1<T>(blk, sb, s1lo, s1hi); }
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      const __m256i lut = level_lut<level_values(T), kBias>();
      const int hh = P / 2, t = 2 * (P % 2);  // (quads 2P, 2P + 1)
      w[0] = _mm256_shuffle_epi8(lut, fields3_quad_h(q, qh, hh, t, h));
      w[1] = _mm256_shuffle_epi8(lut, fields3_quad_h(q, qh, hh, t + 1, h));
    }
  };
  // Q4_K's and Q5_K's s1 = d sc, s2 = -(dmin m) of sub-block sb of a block's header (Q4KBlock).
  [[gnu::always_inline]] static void k_scales(const uint8_t* blk, int sb, __m256& s1lo, __m256& s1hi, __m256& s2lo,
                                              __m256& s2hi) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    s1lo = _mm256_mul_ps(h8(blk + Q4KBlock::kD), u8f(blk + Q4KBlock::kSc + 16 * sb));
    s1hi = _mm256_mul_ps(h8(blk + Q4KBlock::kD + 16), u8f(blk + Q4KBlock::kSc + 16 * sb + 8));
    s2lo = _mm256_xor_ps(sign, _mm256_mul_ps(h8(blk + Q4KBlock::kDmin), u8f(blk + Q4KBlock::kM + 16 * sb)));
    s2hi = _mm256_xor_ps(sign, _mm256_mul_ps(h8(blk + Q4KBlock::kDmin + 16), u8f(blk + Q4KBlock::kM + 16 * sb + 8)));
  }
  struct DecQ4_K : Q4KCursor {
    static constexpr int kBias = 0;
    static constexpr bool kSignedQuads = false;
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const { nibble_quads_h(q, P, h, w); }
    static constexpr int kBytesPer32 = 296;  // packed bytes per 32-block of k (on average)
    static constexpr bool kS2 = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256& s2lo, __m256& s2hi) const {
      k_scales(blk, sb, s1lo, s1hi, s2lo, s2hi);
    }
  };
  // Quads 2P and 2P + 1 of rows 8h..8h+7 (w), plus their 5th bits from the plane qh (packed.h:
  // byte (r, e) holds quad j's 5th bit at bit j): to bit 4 (16-bit shifts; the and keeps bit 4 of
  // each byte, which came from the same byte).
  [[gnu::always_inline]] static void fifth_bits_h(const uint8_t* qh, int P, int h, __m256i (&w)[2]) {
    const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    const __m256i m = _mm256_set1_epi8(0x10);
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * P + e;
      const __m256i b = j <= 4 ? _mm256_slli_epi16(H, 4 - j) : _mm256_srli_epi16(H, j - 4);
      w[e] = _mm256_or_si256(w[e], _mm256_and_si256(b, m));
    }
  }
  // Q4_1 and Q5_1 (kFifth; packed.h): s1 = d, s2 = m; u = q (+ 16 h), B = 0; Q5_1's pair sums
  // widened per quad without VNNI, as Q5_K's.
  template <bool kFifth>
  struct DecMin32 {
    static constexpr int kBias = 0, kBytesPer32 = kFifth ? Q51Block::kBytes : Q41Block::kBytes;
    static constexpr bool kS2 = true, kSignedQuads = false, kWideQuads = kFifth;
    const uint8_t* g;
    const uint8_t* q = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { q = g + kb * kBytesPer32 + Q41Block::kQ; }
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256& s2lo, __m256& s2hi) const {
      const uint8_t* b = q - Q41Block::kQ;
      s1lo = h8(b + Q41Block::kD);
      s1hi = h8(b + Q41Block::kD + 16);
      s2lo = h8(b + Q41Block::kM);
      s2hi = h8(b + Q41Block::kM + 16);
    }
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      nibble_quads_h(q, P, h, w);
      if constexpr (kFifth) fifth_bits_h(q + (Q51Block::kQh - Q41Block::kQ), P, h, w);
    }
  };
  // Q5_0 (packed.h: Q4_0's, then the 5th bits' plane): u = q + 16 h in [0, 31], B = 16; its
  // vpmaddubsw pair sums widened per quad without VNNI, as Q5_K's.
  struct DecQ5_0 : DecBlock32<Q50Block::kBytes> {
    static constexpr int kBias = 16;
    static constexpr bool kSignedQuads = false, kWideQuads = true, kQ8Form = true;
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      nibble_quads_h(q, P, h, w);
      fifth_bits_h(q + (Q50Block::kQh - Q50Block::kQ), P, h, w);
    }
  };
  // Q5_K (quad layout as Q4_K, then its 5th bits: packed.h): u = q + 16 h in [0, 31]. Without
  // VNNI its vpmaddubsw pair sums (<= 2 * 31 * 127) are widened per quad (kWideQuads): eight
  // would pass int16.
  struct DecQ5_K : Q5KCursor {
    static constexpr int kBias = 0;
    static constexpr bool kSignedQuads = false, kWideQuads = true;
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      nibble_quads_h(q, P, h, w);
      fifth_bits_h(qh, P, h, w);
    }
    static constexpr int kBytesPer32 = Q5KBlock::kBytes / 8;  // packed bytes per 32-block of k (on average)
    static constexpr bool kS2 = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256& s2lo, __m256& s2hi) const {
      k_scales(blk, sb, s1lo, s1hi, s2lo, s2hi);
    }
  };
  // Q6_K in its quad variant (packed.h): per half block hh (16 k, kSub16) and rows 8h..8h+7,
  // quads6_h gives its 4 quads as u = q in [0, 63] and sc32 the rows' int8 scales as int32;
  // I = sc_0 (sum u xq - 32 X_0) + sc_1 (...), exact (half_sum).
  struct DecQ6_K : Q6KQuadCursor {
    static constexpr int kBias = 32;
    static constexpr int kBytesPer32 = Q6KBlock::kBytes / 8;  // packed bytes per 32-block of k (on average)
    static constexpr bool kS2 = false, kSignedQuads = false, kSub16 = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const {
      s1lo = h8(blk + Q6KBlock::kD);
      s1hi = h8(blk + Q6KBlock::kD + 16);
    }
    [[gnu::always_inline]] __m256i sc32(int hh, int h) const {
      return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + Q6KBlock::kSc + (2 * j + hh) * 16 + 8 * h)));
    }
    [[gnu::always_inline]] void quads6_h(int hh, int h, __m256i (&w)[4]) const {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 128 * hh + 32 * h));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 128 * hh + 64 + 32 * h));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 64 * hh + 32 * h));
      const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
      // (16-bit shifts: the and keeps bits 4-5 of each byte, which came from the same byte.)
      w[0] = _mm256_or_si256(_mm256_and_si256(b0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
      w[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b0, 4), m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
      w[2] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_and_si256(H, m30));
      w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
    }
  };
  // The levels16 layout (packed.h: Q3_K, IQ2_XS, IQ2_S, IQ1_M), as Q6_K's quad variant: per half
  // block hh and rows 8h..8h+7, quads6_h gives its 4 quads of indices i = low + 4 high as
  // IQ4_NL's quads do by a byte shuffle (u = levels[i] + 128 with AVX-VNNI, else signed v =
  // levels[i]; Q3_K: u = i itself, B = 3, on both: levels16_index_bias), sc32 the rows' scales
  // (the grid types' steps 2s + 1); s1 = d unit.
  template <GGMLType T>
  struct DecLevels16 : Levels16Cursor {
    static constexpr int kIndexBias = levels16_index_bias(T);
    static constexpr int kBias = kIndexBias >= 0 ? kIndexBias : kVnniQuads ? 128 : 0;
    static constexpr int kBytesPer32 = Levels16Block::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSignedQuads = kIndexBias < 0 && !kVnniQuads, kSub16 = true;
    static constexpr bool kQ8Form = T == GGMLType::Q3_K;  // (its chunk: levels x scale fit an int8)
    static_assert(max_abs_level(T) <= 63, "half_sum's int16 sums of signed levels");
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const {
      s1lo = h8(blk + Levels16Block::kD);
      s1hi = h8(blk + Levels16Block::kD + 16);
      if constexpr (level_unit(T) != 1.0f) {
        s1lo = _mm256_mul_ps(s1lo, _mm256_set1_ps(level_unit(T)));
        s1hi = _mm256_mul_ps(s1hi, _mm256_set1_ps(level_unit(T)));
      }
    }
    [[gnu::always_inline]] __m256i sc32(int hh, int h) const {
      return _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + Levels16Block::kSc + (2 * sb + hh) * 16 + 8 * h)));
    }
    [[gnu::always_inline]] void quads6_h(int hh, int h, __m256i (&w)[4]) const {
      for (int t = 0; t < 4; ++t) {
        w[t] = fields3_quad_h(q, qh, hh, t, h);
        if constexpr (kIndexBias < 0) w[t] = _mm256_shuffle_epi8(level_lut<level_values(T), kBias>(), w[t]);
      }
    }
  };
  // Q2_K (packed.h): s1 = d; min_scales(h, b_0, b_1) rows 8h..8h+7's b_hh = -dmin m_hh, the min term's
  // scales (kMin16: y = fma(b_0, f_0, y), fma(b_1, f_1, y), f = QAct::fx). The GEMV takes its
  // half blocks as the sub16 types' (kSub16: quads6_h the fields q in [0, 3], B = 0; sc32 the
  // rows' scales); its GEMM chunk is Q4_K's form, u = sc q in [0, 45] (quads_h: a byte shuffle of
  // each row's table (0, sc, 2 sc, 3 sc), sc times 0x03020100 in its int32 lane, at index q + 4
  // (row % 4)), widened per quad without VNNI (8 quads' pair sums, <= 2 * 45 * 127 each, would
  // pass int16).
  struct DecQ2_K : Q2KCursor {
    static constexpr int kBias = 0, kBytesPer32 = Q2KBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSignedQuads = false, kSub16 = true, kMin16 = true;
    [[gnu::always_inline]] void scales(__m256& s1lo, __m256& s1hi, __m256&, __m256&) const {
      s1lo = h8(blk + Q2KBlock::kD);
      s1hi = h8(blk + Q2KBlock::kD + 16);
    }
    [[gnu::always_inline]] __m256i sm32(int hh, int h) const {  // half hh's bytes of rows 8h..8h+7
      return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + kGroup * hh + 8 * h)));
    }
    [[gnu::always_inline]] __m256i sc32(int hh, int h) const { return _mm256_and_si256(sm32(hh, h), _mm256_set1_epi32(0xF)); }
    [[gnu::always_inline]] void min_scales(int h, __m256& b0, __m256& b1) const {  // (exact)
      const __m256 neg_dmin = _mm256_xor_ps(_mm256_set1_ps(-0.0f), h8(blk + Q2KBlock::kDmin + 16 * h));
      b0 = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm32(0, h), 4)));
      b1 = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm32(1, h), 4)));
    }
    // (16-bit shifts: the and keeps bits 0-1 of each byte, which came from the same byte.)
    [[gnu::always_inline]] void quads6_h(int hh, int h, __m256i (&w)[4]) const {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * hh + 32 * h));
      const __m256i three = _mm256_set1_epi8(3);
      w[0] = _mm256_and_si256(b, three);
      for (int t = 1; t < 4; ++t) w[t] = _mm256_and_si256(_mm256_srli_epi16(b, 2 * t), three);
    }
    [[gnu::always_inline]] void quads_h(int P, int h, __m256i (&w)[2]) const {
      const int hh = P / 2, t = 2 * (P % 2);  // (quads 2P, 2P + 1: fields t, t + 1 of half hh)
      const __m256i tbl = _mm256_mullo_epi32(sc32(hh, h), _mm256_set1_epi32(0x03020100));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * hh + 32 * h));
      const __m256i three = _mm256_set1_epi8(3), row = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0,
                                                                         0x04040404, 0x08080808, 0x0C0C0C0C);
      for (int e = 0; e < 2; ++e)
        w[e] = _mm256_shuffle_epi8(
            tbl, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 2 * (t + e)), three), row));
    }
  };
  template <class D>
  static constexpr bool min16_of() {
    if constexpr (requires { D::kMin16; }) return D::kMin16;
    else return false;
  }
  // Q2_K's min term, 8 rows: y = fma(b_0, f[0], y), then fma(b_1, f[1], y) (f: a block's QAct::fx).
  static __m256 min16_term(__m256 b0, __m256 b1, const float* f, __m256 y) {
    return _mm256_fmadd_ps(b1, _mm256_set1_ps(f[1]), _mm256_fmadd_ps(b0, _mm256_set1_ps(f[0]), y));
  }
  template <class D>
  static constexpr bool sub16_of() {
    if constexpr (requires { D::kSub16; }) return D::kSub16;
    else return false;
  }
  template <class D>
  static constexpr bool wide_of() {
    if constexpr (requires { D::kWideQuads; }) return D::kWideQuads;
    else return false;
  }
  template <class D>  // (unpack_int gives Q8_0's form: the level types, gemm_type)
  static constexpr bool q8_form_of() {
    if constexpr (requires { D::kQ8Form; }) return D::kQ8Form;
    else return false;
  }
  // One half block of a sub16 type, 8 rows: sum over its 16 k of w xq - bias X (X = the 16 xq's
  // sum) as int32 lanes, exact; w unsigned (Q6_K's u in [0, 63]; Q3_K's index u in [0, 7]; the
  // grid levels16 types' levels[i] + 128 with VNNI) or signed (the grid levels16 types'
  // levels[i], |v| <= 63, without: |v| x sign(xq, v)). Without VNNI, vpmaddubsw pair sums (<= 2 *
  // 63 * 127) add two at a time in int16 (<= 32004) before widening.
  template <bool kSigned>
  static __m256i half_sum(const __m256i (&w)[4], const int8_t* x, int32_t X, int bias) {
#ifdef FT_AVX_VNNI
    __m256i a = _mm256_set1_epi32(-bias * X);
    for (int t = 0; t < 4; ++t) a = acc<kSigned>(a, w[t], bcast4(x + 4 * t));
    return a;
#else
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i s01 = _mm256_add_epi16(dot4<kSigned>(w[0], bcast4(x)), dot4<kSigned>(w[1], bcast4(x + 4)));
    const __m256i s23 = _mm256_add_epi16(dot4<kSigned>(w[2], bcast4(x + 8)), dot4<kSigned>(w[3], bcast4(x + 12)));
    return _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(s01, one), _mm256_madd_epi16(s23, one)),
                            _mm256_set1_epi32(bias * X));
#endif
  }

  // Small M (decode) on the integer path: C (M, ldc)[:, 0:16] = the group's 16 rows over all of
  // K, decoded straight from the packed bytes (no unpacked copy); the same sums as mk_int.
  static constexpr int kPrefetch = 2048;
  // A group's weights are one contiguous stream (bytes_per_32 packed bytes per 32-block):
  // prefetch_start asks for its first kPrefetch bytes, prefetch_ahead(kb) at block kb for the
  // block kPrefetch ahead, as the hardware prefetcher alone falls behind a GEMV's demand (DRAM
  // latency x too few misses in flight).
  static void prefetch_start(const uint8_t* g, int bytes_per_32) {
    for (int off = 0; off < kPrefetch + bytes_per_32; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(g) + off, _MM_HINT_T0);
  }
  static void prefetch_ahead(const uint8_t* g, int64_t kb, int bytes_per_32) {
    const char* ahead = reinterpret_cast<const char*>(g) + (kb + 1) * bytes_per_32 + kPrefetch;
    for (int off = 0; off < bytes_per_32; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
  }
  // ---- Integer path on the quad layout (is_quad_type; packed.h): vpmaddubsw ----
  // A register holds 8 rows x 4 k as bytes; vpmaddubsw multiplies u8 by s8 and adds pairs into
  // int16, vpmaddwd by 1 widens to int32 (the 4 products of a lane). Nibble types: u (0..15) x
  // xq, pair sums <= 2 * 15 * 127, so the 8 quads of a 32-block add up in int16 (<= 30480)
  // before one widening; Q5_K's (u <= 31) are widened per quad. Q8_0: the sign trick, |q| (<=
  // 128 as u8) x sign(xq, q), pair sums <= 32512, widened per quad; it forms sum q xq directly.
  // Then I = sum - kBias * sum xq and y = fma(float(I), s1 * dx, y) (+ the K types' min term):
  // the sums every ISA forms.
  static constexpr bool kInt8Act = true;
  static __m256i bcast4(const int8_t* x) {  // x[0..3] into every 32-bit lane
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
  }
  template <bool kSigned>
  static __m256i dot4(__m256i w, __m256i xb) {  // int16 pair sums of w x xb (see above)
    if constexpr (kSigned) return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xb, w));
    else return _mm256_maddubs_epi16(w, xb);
  }
  // The accumulators a of one 32-block, 8 lanes (rows): acc<kSigned>(a, w, xb) adds the 4
  // products w x xb of each lane. With AVX-VNNI (the avx_vnni level compiles this header with
  // FT_AVX_VNNI) one vpdpbusd into int32; without, signed quads widened at once, unsigned ones
  // summed in int16 (bounds above) and widened once per block by widen().
  // (kWide: unsigned quads too large for 8 int16 pair sums, Q5_K's, widened per quad as signed ones.)
  template <bool kSigned, bool kWide = false>
  static __m256i acc(__m256i a, __m256i w, __m256i xb) {
#ifdef FT_AVX_VNNI
    if constexpr (kSigned) return _mm256_dpbusd_avx_epi32(a, _mm256_abs_epi8(w), _mm256_sign_epi8(xb, w));
    else return _mm256_dpbusd_avx_epi32(a, w, xb);
#else
    if constexpr (kSigned || kWide) return _mm256_add_epi32(a, _mm256_madd_epi16(dot4<kSigned>(w, xb), _mm256_set1_epi16(1)));
    else return _mm256_add_epi16(a, dot4<false>(w, xb));
#endif
  }
  template <bool kSigned, bool kWide = false>
  static __m256i widen(__m256i a) {  // acc's sums as int32
#ifdef FT_AVX_VNNI
    return a;
#else
    if constexpr (kSigned || kWide) return a;
    else return _mm256_madd_epi16(a, _mm256_set1_epi16(1));
#endif
  }
  // The sub16 types (kSub16): I[i] = row i's exact int32 sums of block kb for rows 8h..8h+7,
  // sc_0 (sum w xq - B X_0) + sc_1 (...) over the two half blocks (X_0 = xs0, X_1 = xs - xs0).
  template <int MR, class D>
  static void sub16_sums(const D& dec, int h, int64_t kb, const int8_t* xq, int64_t ldx, const int32_t* xs,
                         const int32_t* xs0, int64_t nkb, __m256i (&I)[MR]) {
    for (int i = 0; i < MR; ++i) I[i] = _mm256_setzero_si256();
    for (int hh = 0; hh < 2; ++hh) {
      __m256i w[4];
      dec.quads6_h(hh, h, w);
      const __m256i sc = dec.sc32(hh, h);
      for (int i = 0; i < MR; ++i) {
        const int32_t X0 = xs0[i * nkb + kb];
        const __m256i S = half_sum<D::kSignedQuads>(w, xq + i * ldx + kb * kQBlock + 16 * hh,
                                                    hh == 0 ? X0 : xs[i * nkb + kb] - X0, D::kBias);
        I[i] = _mm256_add_epi32(I[i], _mm256_mullo_epi32(S, sc));
      }
    }
  }
  // C (MR, ldc)[:, 16g : 16g + 16] = NG groups' rows (g < NG, of one type, consecutive in C)
  // over all of K, y in registers (MR NG <= 2). One row's two groups in one pass: two weight
  // streams at once (decode: an item's two groups, spread half the weight apart). Each chain
  // (int32 or int16 sums, acc) and its y update is the same at any MR and NG: the same bits.
  // The sub16 types: one group (sub16_sums).
  template <int MR, int NG, class D>
  static void gemv_quad_t(const D* dec, int64_t nkb, const int8_t* xq, int64_t ldx, const float* dx,
                          const int32_t* xs, const int32_t* xs0, const float* fx, float* c, int64_t ldc) {
    static_assert(MR * NG <= 2 && (NG == 1 || !sub16_of<D>()));
    D d[NG];
    __m256 y[MR][NG][2];
    for (int g = 0; g < NG; ++g) {
      d[g] = dec[g];
      prefetch_start(d[g].g, D::kBytesPer32);
      for (int i = 0; i < MR; ++i) y[i][g][0] = y[i][g][1] = _mm256_setzero_ps();
    }
    for (int64_t kb = 0; kb < nkb; ++kb) {
      for (int g = 0; g < NG; ++g) {
        prefetch_ahead(d[g].g, kb, D::kBytesPer32);
        d[g].begin(kb);
      }
      if constexpr (sub16_of<D>()) {
        __m256 s1[2], s2[2];
        d[0].scales(s1[0], s1[1], s2[0], s2[1]);
        for (int h = 0; h < 2; ++h) {
          __m256i I[MR];
          sub16_sums<MR>(d[0], h, kb, xq, ldx, xs, xs0, nkb, I);
          [[maybe_unused]] __m256 b0, b1;
          if constexpr (min16_of<D>()) d[0].min_scales(h, b0, b1);
          for (int i = 0; i < MR; ++i) {
            const __m256 dv = _mm256_set1_ps(dx[i * nkb + kb]);
            y[i][0][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[i]), _mm256_mul_ps(s1[h], dv), y[i][0][h]);
            if constexpr (min16_of<D>()) y[i][0][h] = min16_term(b0, b1, fx + 2 * (i * nkb + kb), y[i][0][h]);
          }
        }
      } else {
        __m256i a[MR][NG][2];
        for (int i = 0; i < MR; ++i)
          for (int g = 0; g < NG; ++g) a[i][g][0] = a[i][g][1] = _mm256_setzero_si256();
        for (int P = 0; P < 4; ++P)
          for (int i = 0; i < MR; ++i) {
            const int8_t* x = xq + i * ldx + kb * kQBlock + 8 * P;
            const __m256i x0 = bcast4(x), x1 = bcast4(x + 4);
            for (int g = 0; g < NG; ++g)
              for (int h = 0; h < 2; ++h) {
                __m256i w[2];
                d[g].quads_h(P, h, w);
                a[i][g][h] = acc<D::kSignedQuads, wide_of<D>()>(acc<D::kSignedQuads, wide_of<D>()>(a[i][g][h], w[0], x0), w[1], x1);
              }
          }
        for (int g = 0; g < NG; ++g) {
          __m256 s1[2], s2[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
          d[g].scales(s1[0], s1[1], s2[0], s2[1]);
          for (int i = 0; i < MR; ++i) {
            const __m256 dv = _mm256_set1_ps(dx[i * nkb + kb]);
            for (int h = 0; h < 2; ++h) {
              __m256i I = widen<D::kSignedQuads, wide_of<D>()>(a[i][g][h]);
              if constexpr (D::kBias != 0) I = _mm256_sub_epi32(I, _mm256_set1_epi32(D::kBias * xs[i * nkb + kb]));
              y[i][g][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(s1[h], dv), y[i][g][h]);
              if constexpr (D::kS2)
                y[i][g][h] = _mm256_fmadd_ps(_mm256_set1_ps(float(xs[i * nkb + kb])), _mm256_mul_ps(s2[h], dv), y[i][g][h]);
            }
          }
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(c + i * ldc + 16 * g + 8 * h, y[i][g][h]);
  }
  template <class F>
  static bool with_quad_decoder(GGMLType t, const uint8_t* group, F&& f) {
    switch (t) {
      case GGMLType::Q8_0: f(DecQ8_0{{group}}); return true;
      case GGMLType::Q4_0: f(DecQ4_0{{group}}); return true;
      case GGMLType::Q5_0: f(DecQ5_0{{group}}); return true;
      case GGMLType::Q4_1: f(DecMin32<false>{group}); return true;
      case GGMLType::Q5_1: f(DecMin32<true>{group}); return true;
      case GGMLType::MXFP4: f(DecLevels32<GGMLType::MXFP4, 12>{{group}}); return true;
      case GGMLType::IQ4_NL: f(DecLevels32<GGMLType::IQ4_NL, 128>{{group}}); return true;
      case GGMLType::IQ4_XS: f(DecLevels256<GGMLType::IQ4_XS>{{group}}); return true;
      case GGMLType::IQ2_XXS: f(DecLevels3<GGMLType::IQ2_XXS>{{group}}); return true;
      case GGMLType::IQ3_XXS: f(DecLevels256<GGMLType::IQ3_XXS>{{group}}); return true;
      case GGMLType::IQ3_S: f(DecLevels256<GGMLType::IQ3_S>{{group}}); return true;
      case GGMLType::IQ1_S: f(DecLevels3<GGMLType::IQ1_S>{{group}}); return true;
      case GGMLType::TQ1_0: f(DecLevels3<GGMLType::TQ1_0>{{group}}); return true;
      case GGMLType::TQ2_0: f(DecLevels3<GGMLType::TQ2_0>{{group}}); return true;
      case GGMLType::Q4_K: f(DecQ4_K{{group}}); return true;
      case GGMLType::Q5_K: f(DecQ5_K{{group}}); return true;
      case GGMLType::Q6_K: f(DecQ6_K{{group}}); return true;
      case GGMLType::IQ2_XS: f(DecLevels16<GGMLType::IQ2_XS>{{group}}); return true;
      case GGMLType::IQ2_S: f(DecLevels16<GGMLType::IQ2_S>{{group}}); return true;
      case GGMLType::IQ1_M: f(DecLevels16<GGMLType::IQ1_M>{{group}}); return true;
      case GGMLType::Q3_K: f(DecLevels16<GGMLType::Q3_K>{{group}}); return true;
      case GGMLType::Q2_K: f(DecQ2_K{{group}}); return true;
      default: return false;
    }
  }
  // 3 to kQuadMaxM rows in one pass over the packed bytes: C (MR, ldc)[:, 0:16] = the group's
  // rows over all of K. Per 32-block, half h (rows 8h..8h+7) at a time: MR chains of int32 (or
  // int16, see acc) sums, each row's y for that half from C (L1) and back, since 16 registers
  // cannot hold MR rows x 16 outputs. The same sums as gemv_quad_t (whose 2-row tile keeps y in
  // registers but reads the weights M / 2 times).
  static constexpr int kQuadMaxM = 8;
  template <int MR, class D>
  static void gemv_quad_m_t(D dec, int64_t nkb, const int8_t* xq, int64_t ldx, const float* dx,
                            const int32_t* xs, const int32_t* xs0, const float* fx, float* c, int64_t ldc) {
    prefetch_start(dec.g, D::kBytesPer32);
    for (int64_t kb = 0; kb < nkb; ++kb) {
      prefetch_ahead(dec.g, kb, D::kBytesPer32);
      dec.begin(kb);
      __m256 s1[2], s2[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      dec.scales(s1[0], s1[1], s2[0], s2[1]);
      if constexpr (sub16_of<D>()) {
        for (int h = 0; h < 2; ++h) {
          __m256i I[MR];
          sub16_sums<MR>(dec, h, kb, xq, ldx, xs, xs0, nkb, I);
          [[maybe_unused]] __m256 b0, b1;
          if constexpr (min16_of<D>()) dec.min_scales(h, b0, b1);
          for (int i = 0; i < MR; ++i) {
            float* ci = c + i * ldc + 8 * h;
            const __m256 dv = _mm256_set1_ps(dx[i * nkb + kb]);
            __m256 y = kb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ci);
            y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[i]), _mm256_mul_ps(s1[h], dv), y);
            if constexpr (min16_of<D>()) y = min16_term(b0, b1, fx + 2 * (i * nkb + kb), y);
            _mm256_storeu_ps(ci, y);
          }
        }
      } else {
        for (int h = 0; h < 2; ++h) {
          __m256i a[MR];
          for (int i = 0; i < MR; ++i) a[i] = _mm256_setzero_si256();
          for (int P = 0; P < 4; ++P) {
            __m256i w[2];
            dec.quads_h(P, h, w);
            for (int i = 0; i < MR; ++i) {
              const int8_t* x = xq + i * ldx + kb * kQBlock + 8 * P;
              a[i] = acc<D::kSignedQuads, wide_of<D>()>(a[i], w[0], bcast4(x));
              a[i] = acc<D::kSignedQuads, wide_of<D>()>(a[i], w[1], bcast4(x + 4));
            }
          }
          for (int i = 0; i < MR; ++i) {
            const __m256 d = _mm256_set1_ps(dx[i * nkb + kb]);
            __m256i I = widen<D::kSignedQuads, wide_of<D>()>(a[i]);
            if constexpr (D::kBias != 0) I = _mm256_sub_epi32(I, _mm256_set1_epi32(D::kBias * xs[i * nkb + kb]));
            float* ci = c + i * ldc + 8 * h;
            __m256 y = kb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ci);
            y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(s1[h], d), y);
            if constexpr (D::kS2)
              y = _mm256_fmadd_ps(_mm256_set1_ps(float(xs[i * nkb + kb])), _mm256_mul_ps(s2[h], d), y);
            _mm256_storeu_ps(ci, y);
          }
        }
      }
    }
  }
  // The fused path's bound per type (kernels_impl.h): quad types, the sub16 types and Q2_K up to
  // kQuadMaxM rows.
  static bool fused_int(GGMLType t, int64_t M) {
    return M <= kFusedMaxM || ((is_quad_type(t) || is_sub16_type(t) || has_min16(t)) && M <= kQuadMaxM);
  }
  // ng groups of type t (consecutive in C, 16 columns each) x rows [r0, r0 + M) of qa: two of a
  // quad type at one row in one pass (gemv_quad_t<1, 2>), else one at a time (gemv_int). A
  // decode work item's two groups (spread half the weight apart) were two streams one after the
  // other; at once, on a Zen 5 forced to these levels (`--ab`, TinyLlama decode step): avx2 Q4_0
  // 0.78, 0.84, Q8_0 0.80, 0.81, Q4_K_M 1.01, 1.00; avx_vnni Q4_0 0.76, Q8_0 0.81. (Two items'
  // four groups a call, as the AVX-512 levels take them, in one pass for Q8_0 and in two for
  // Q4_K, against items one at a time: avx2 Q8_0 0.95-0.99, Q4_K_M 0.97-1.04, avx_vnni Q8_0
  // 0.99-1.03, Q4_K_M 1.01-1.02, with an A/A control at 1.00-1.03: not kept. Four in one pass
  // for every type: Q4_0 1.07-1.09, Q4_K_M 1.18-1.22 (16 registers: the sums and y spill).)
  static void gemv_int_n(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const QAct& qa, int64_t r0,
                         int64_t M, float* c, int64_t ldc) {
    if (ng == 2 && M == 1) {
      const int64_t nkb = K / kQBlock;
      const bool two = with_quad_decoder(t, groups[0], [&](auto dec0) {
        using D = decltype(dec0);
        if constexpr (!sub16_of<D>()) {
          D dec[2] = {dec0, dec0};
          dec[1].g = groups[1];
          gemv_quad_t<1, 2>(dec, nkb, qa.xq8.data() + r0 * K, K, qa.dx.data() + r0 * nkb, qa.xs.data() + r0 * nkb,
                            qa.xs0.data() + r0 * nkb, qa.fx.data() + 2 * r0 * nkb, c, ldc);
          return;
        }
        for (int i = 0; i < 2; ++i) gemv_int(t, groups[i], K, qa, r0, M, c + i * kGroup, ldc);
      });
      if (!two) fail("fast kernels: ", int(t), " is not an integer type");
      return;
    }
    for (int i = 0; i < ng; ++i) gemv_int(t, groups[i], K, qa, r0, M, c + i * kGroup, ldc);
  }
  // Up to 2 rows: gemv_quad_t, y in registers; 3 to kQuadMaxM: gemv_quad_m_t, one pass.
  // (Rows [r0, r0 + M) of qa.)
  static void gemv_int(GGMLType t, const uint8_t* group, int64_t K, const QAct& qa, int64_t r0, int64_t M,
                       float* c, int64_t ldc) {
    const int64_t nkb = K / kQBlock;
    const bool quad = with_quad_decoder(t, group, [&](auto dec) {
      for (int64_t m = 0; m < M; m += kQuadMaxM) {  // (one tile unless M > kQuadMaxM)
        const int8_t* x = qa.xq8.data() + (r0 + m) * K;
        const float* dx = qa.dx.data() + (r0 + m) * nkb;
        const int32_t* xs = qa.xs.data() + (r0 + m) * nkb;
        const int32_t* xs0 = qa.xs0.data() + (r0 + m) * nkb;
        const float* fx = qa.fx.data() + 2 * (r0 + m) * nkb;
        float* cm = c + m * ldc;
        switch (std::min<int64_t>(M - m, kQuadMaxM)) {
          case 1: gemv_quad_t<1, 1>(&dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 2: gemv_quad_t<2, 1>(&dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 3: gemv_quad_m_t<3>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 4: gemv_quad_m_t<4>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 5: gemv_quad_m_t<5>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 6: gemv_quad_m_t<6>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          case 7: gemv_quad_m_t<7>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
          default: gemv_quad_m_t<8>(dec, nkb, x, K, dx, xs, xs0, fx, cm, ldc); break;
        }
      }
    });
    if (!quad) fail("fast kernels: ", int(t), " is not an integer type");
  }
  // The GEMM's view of one K chunk: quad types as V = [len / 32][8 quads][16 rows][4] bytes (Q8_0
  // and the types in its form (gemm_type: the level types, Q5_0, Q3_K: unpack_sub16<true>) as
  // signed q, the other nibble types and Q2_K as u; in the int16 scratch's bytes), S1, S2 (len /
  // 32, 16), Q2_K's min scales after (q2k_min_scales); the other sub16 types as
  // unpack_sub16<false> gives them.
  static void unpack_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V,
                         float* S1, float* S2) {
    if (is_sub16_type(t)) {
      with_quad_decoder(t, group, [&](auto dec) {
        if constexpr (sub16_of<decltype(dec)>() && !min16_of<decltype(dec)>()) {
          if (gemm_type(t) == GGMLType::Q8_0) unpack_sub16<true>(dec, k0, len, V, S1, S2);
          else unpack_sub16<false>(dec, k0, len, V, S1, S2);
        }
      });
      return;
    }
    uint8_t* v = reinterpret_cast<uint8_t*>(V);
    const bool quad = with_quad_decoder(t, group, [&](auto dec) {
      using D = decltype(dec);
      // (The level types decoded unsigned: back to signed v, Q8_0's form.)
      constexpr bool kToSigned = q8_form_of<D>() && !D::kSignedQuads;
      if constexpr (!sub16_of<D>() || min16_of<D>())  // (Q2_K's chunk: Q4_K's form, its mins after)
      for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
        dec.begin(k0 / kQBlock + kb);
        __m256 a, b, c = _mm256_setzero_ps(), d = c;
        dec.scales(a, b, c, d);
        _mm256_storeu_ps(S1 + 16 * kb, a);
        _mm256_storeu_ps(S1 + 16 * kb + 8, b);
        _mm256_storeu_ps(S2 + 16 * kb, c);
        _mm256_storeu_ps(S2 + 16 * kb + 8, d);
        if constexpr (min16_of<D>())
          for (int h = 0; h < 2; ++h) {
            __m256 b0, b1;
            dec.min_scales(h, b0, b1);
            _mm256_storeu_ps(q2k_min_scales(V, len) + 32 * kb + 8 * h, b0);
            _mm256_storeu_ps(q2k_min_scales(V, len) + 32 * kb + 16 + 8 * h, b1);
          }
        for (int P = 0; P < 4; ++P)
          for (int h = 0; h < 2; ++h) {
            __m256i w[2];
            dec.quads_h(P, h, w);
            for (int e = 0; e < 2; ++e) {
              if constexpr (kToSigned) w[e] = _mm256_sub_epi8(w[e], _mm256_set1_epi8(char(D::kBias)));
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + kb * 512 + 64 * (2 * P + e) + 32 * h), w[e]);
            }
          }
      }
    });
    if (!quad) fail("fast kernels: ", int(t), " is not an integer type");
  }
  // A sub16 type's chunk. For mk_sub16 (kQ8 false; kSub16Bytes per 32-block of V): [0, 512) its
  // 8 quads as its decoder D gives them (quad 4hh + t: k = 16hh + 4t .. 16hh + 4t + 3; rows 0-7,
  // then rows 8-15, 4 bytes each; u = v + D::kBias, or signed v), [512, 640) int32 sc[2 hh][16
  // rows]. In Q8_0's form (kQ8: a type whose products v sc fit an int8, Q3_K: gemm_type;
  // unpack_int's signed v sc), the same exact I as the half blocks' sc_0 I_0 + sc_1 I_1; per
  // byte, from u' = v + B (the decoder's u, B <= 128, or its signed v + 128): vpmaddubsw of u'
  // with (sc, 0) and with (0, sc) gives the even and odd bytes' u' sc in 16-bit lanes (|u' sc|
  // <= 255 * 32: no saturation), minus B sc = v sc, whose low bytes go back in place. S1 = its
  // s1, S2 = 0.
  static constexpr int64_t kSub16Bytes = 2 * kQBlock * kGroup;  // (the int16 scratch's bytes per block)
  template <bool kQ8, class D>
  static void unpack_sub16(const D dec0, int64_t k0, int64_t len, int16_t* V, float* S1, float* S2) {
    static_assert(!min16_of<D>(), "Q2_K's min term has no place in the sub16 chunks");
    static_assert(!kQ8 || D::kSignedQuads || (D::kBias >= 0 && D::kBias <= 128), "Q8_0's form takes u = v + B, B <= 128");
    if constexpr (kQ8 && !q8_form_of<D>()) fail("fast kernels: Q8_0's form of a type whose products do not fit an int8");
    constexpr int kB = D::kSignedQuads ? 128 : D::kBias;  // (u' = v + kB)
    uint8_t* v = reinterpret_cast<uint8_t*>(V);
    const __m256i lo = _mm256_set1_epi16(0x00FF);
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      D dec = dec0;
      dec.begin(k0 / kQBlock + kb);
      __m256 a, b, c, d;
      dec.scales(a, b, c, d);
      _mm256_storeu_ps(S1 + 16 * kb, a);
      _mm256_storeu_ps(S1 + 16 * kb + 8, b);
      _mm256_storeu_ps(S2 + 16 * kb, _mm256_setzero_ps());
      _mm256_storeu_ps(S2 + 16 * kb + 8, _mm256_setzero_ps());
      uint8_t* vb = v + kb * (kQ8 ? 512 : kSub16Bytes);
      for (int hh = 0; hh < 2; ++hh)
        for (int h = 0; h < 2; ++h) {
          __m256i w[4];
          dec.quads6_h(hh, h, w);
          if constexpr (!kQ8) {
            for (int t = 0; t < 4; ++t)
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(vb + 64 * (4 * hh + t) + 32 * h), w[t]);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(vb + 512 + 64 * hh + 32 * h), dec.sc32(hh, h));
            continue;
          }
          const __m256i sc32 = dec.sc32(hh, h);  // (int32 lanes: row r's scale)
          const __m256i sc_b = _mm256_and_si256(sc32, _mm256_set1_epi32(0xFF));  // (sc's byte, from the sign-extended int32)
          const __m256i sc_even = _mm256_or_si256(sc_b, _mm256_slli_epi32(sc_b, 16));
          const __m256i sc_odd = _mm256_slli_epi16(sc_even, 8);
          const __m256i c32 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_mullo_epi32(sc32, _mm256_set1_epi32(kB)));
          const __m256i cc = _mm256_blend_epi16(c32, _mm256_slli_epi32(c32, 16), 0xAA);
          for (int t = 0; t < 4; ++t) {
            const __m256i u = D::kSignedQuads ? _mm256_xor_si256(w[t], _mm256_set1_epi8(char(0x80))) : w[t];
            const __m256i even = _mm256_add_epi16(_mm256_maddubs_epi16(u, sc_even), cc);
            const __m256i odd = _mm256_add_epi16(_mm256_maddubs_epi16(u, sc_odd), cc);
            const __m256i p = _mm256_or_si256(_mm256_and_si256(even, lo), _mm256_slli_epi16(odd, 8));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(vb + 64 * (4 * hh + t) + 32 * h), p);
          }
        }
    }
  }
  // C (MR, ldc)[:, 0:16] (+)= MR rows over one K chunk of unpacked quads; y in C between blocks.
  // (Mn: Q2_K's min scales, its min term's b_h.)
  template <int MR, bool kSigned, bool kWide>
  static void mk_quad_t(const IntRows& x, int bias, const uint8_t* V, const float* S1,
                        const float* S2, const float* Mn, int64_t len, float* c, int64_t ldc, bool first) {
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      __m256i a[MR][2];
      for (int i = 0; i < MR; ++i) a[i][0] = a[i][1] = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(V + kb * 512 + 64 * p));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(V + kb * 512 + 64 * p + 32));
        for (int i = 0; i < MR; ++i) {
          const __m256i xb = bcast4(x.xq8[i] + kb * kQBlock + 4 * p);
          a[i][0] = acc<kSigned, kWide>(a[i][0], w0, xb);
          a[i][1] = acc<kSigned, kWide>(a[i][1], w1, xb);
        }
      }
      const bool zero = first && kb == 0;
      for (int i = 0; i < MR; ++i) {
        const __m256 d = _mm256_set1_ps(x.dx[i][kb]);
        const __m256i bv = _mm256_set1_epi32(bias * x.xs[i][kb]);
        float* ci = c + i * ldc;
        for (int h = 0; h < 2; ++h) {
          const __m256i I = _mm256_sub_epi32(widen<kSigned, kWide>(a[i][h]), bv);
          __m256 y = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(ci + 8 * h);
          y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(_mm256_loadu_ps(S1 + 16 * kb + 8 * h), d), y);
          if (Mn) y = min16_term(_mm256_loadu_ps(Mn + 32 * kb + 8 * h), _mm256_loadu_ps(Mn + 32 * kb + 16 + 8 * h), x.fx[i] + 2 * kb, y);
          if (S2)
            y = _mm256_fmadd_ps(_mm256_set1_ps(float(x.xs[i][kb])), _mm256_mul_ps(_mm256_loadu_ps(S2 + 16 * kb + 8 * h), d), y);
          _mm256_storeu_ps(ci + 8 * h, y);
        }
      }
    }
  }
  template <bool kSigned, bool kWide = false>
  static void mk_quad(int mr, const IntRows& x, int bias, const uint8_t* V, const float* S1,
                      const float* S2, const float* Mn, int64_t len, float* c, int64_t ldc, bool first) {
    switch (mr) {
      case 1: return mk_quad_t<1, kSigned, kWide>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 2: return mk_quad_t<2, kSigned, kWide>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 3: return mk_quad_t<3, kSigned, kWide>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      default: return mk_quad_t<4, kSigned, kWide>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
    }
  }
  // A sub16 type's chunk (unpack_sub16): C (MR, ldc)[:, 0:16] (+)= MR rows; per 32-block and
  // rows 8h..8h+7, I = sc_0 S_0 + sc_1 S_1 over the half blocks (half_sum: S_hh = sum w xq -
  // bias X_hh, exact; sub16_sums' sums), then y = fma(float(I), s1 * dx, y); y in C between blocks.
  template <int MR, bool kSigned>
  static void mk_sub16_t(const IntRows& x, int bias, const uint8_t* V, const float* S1, int64_t len, float* c,
                         int64_t ldc, bool first) {
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      const uint8_t* vb = V + kb * kSub16Bytes;
      const bool zero = first && kb == 0;
      for (int h = 0; h < 2; ++h) {
        __m256i I[MR];
        for (int i = 0; i < MR; ++i) I[i] = _mm256_setzero_si256();
        for (int hh = 0; hh < 2; ++hh) {
          __m256i w[4];
          for (int t = 0; t < 4; ++t)
            w[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + 64 * (4 * hh + t) + 32 * h));
          const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + 512 + 64 * hh + 32 * h));
          for (int i = 0; i < MR; ++i) {
            const int32_t X0 = x.xs0[i][kb];
            const __m256i S = half_sum<kSigned>(w, x.xq8[i] + kb * kQBlock + 16 * hh, hh == 0 ? X0 : x.xs[i][kb] - X0, bias);
            I[i] = _mm256_add_epi32(I[i], _mm256_mullo_epi32(S, sc));
          }
        }
        const __m256 s1 = _mm256_loadu_ps(S1 + 16 * kb + 8 * h);
        for (int i = 0; i < MR; ++i) {
          float* ci = c + i * ldc + 8 * h;
          const __m256 y = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(ci);
          _mm256_storeu_ps(ci, _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[i]), _mm256_mul_ps(s1, _mm256_set1_ps(x.dx[i][kb])), y));
        }
      }
    }
  }
  template <bool kSigned>
  static void mk_sub16(int mr, const IntRows& x, int bias, const uint8_t* V, const float* S1, int64_t len, float* c,
                       int64_t ldc, bool first) {
    switch (mr) {
      case 1: return mk_sub16_t<1, kSigned>(x, bias, V, S1, len, c, ldc, first);
      case 2: return mk_sub16_t<2, kSigned>(x, bias, V, S1, len, c, ldc, first);
      case 3: return mk_sub16_t<3, kSigned>(x, bias, V, S1, len, c, ldc, first);
      default: return mk_sub16_t<4, kSigned>(x, bias, V, S1, len, c, ldc, first);
    }
  }
  // C (mr <= 4, ldc)[:, 16i : 16i + 16] (+)= the tile over ng groups' unpacked chunks V[i],
  // S1[i], S2[i] (all of type t, a gemm_type; S2 read for Q4_K and Q5_K only; Q2_K's min scales
  // after V[i]).
  static void mk_int(int mr, const IntRows& x, GGMLType t, const int16_t* const* V,
                     const float* const* S1, const float* const* S2, int ng, int64_t len, float* c,
                     int64_t ldc, bool first) {
    t = gemm_type(t);  // (the unpacked chunk's form: the level types' is Q8_0's, its bias and signs)
    for (int g = 0; g < ng; ++g) {
      const uint8_t* v = reinterpret_cast<const uint8_t*>(V[g]);
      if (t == GGMLType::Q6_K) {
        mk_sub16<false>(mr, x, DecQ6_K::kBias, v, S1[g], len, c + 16 * g, ldc, first);
        continue;
      }
      if (is_levels16_layout(t)) {
        using L = DecLevels16<GGMLType::IQ2_XS>;  // (every grid levels16 type's bias and signs; Q3_K's chunks are Q8_0's form)
        mk_sub16<L::kSignedQuads>(mr, x, L::kBias, v, S1[g], len, c + 16 * g, ldc, first);
        continue;
      }
      const float* s2 = has_min_term(t) ? S2[g] : nullptr;
      const float* mn = has_min16(t) ? q2k_min_scales(V[g], len) : nullptr;
      if (t == GGMLType::Q8_0) mk_quad<true>(mr, x, 0, v, S1[g], s2, mn, len, c + 16 * g, ldc, first);
      else if (t == GGMLType::Q5_K || t == GGMLType::Q2_K)  // (u <= 31, u <= 45: widened per quad)
        mk_quad<false, true>(mr, x, 0, v, S1[g], s2, mn, len, c + 16 * g, ldc, first);
      else mk_quad<false>(mr, x, t == GGMLType::Q4_0 ? DecQ4_0::kBias : 0, v, S1[g], s2, mn, len, c + 16 * g, ldc, first);
    }
  }
  static void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows,
                        int64_t K, uint8_t* out) {
    if (t == GGMLType::Q6_K) return pack_rows_q6k_quad(rows, row_bytes, n_rows, K, out);
    pack_rows_quad(t, rows, row_bytes, n_rows, K, out);
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
      default:
        dequantize_row(t, src, dst, len);
        return;
    }
  }

  // quantize_activations (kernels.h) of one row, 8 lanes at a time, bit-identical to it: amax
  // is a max (exact in any order), v = x * (127 / amax) the same f32 product, rounded to
  // nearest even as nearbyint (the default rounding mode), clamped; the sum is exact. Also
  // writes the values as int8 (xq8). (The portable version calls nearbyintf per element: for
  // decode and small batches it was a serial ~1-2 ms per step on the tinyllama shape.)
  static void quantize_act(const float* x, int64_t K, int16_t* xq, int8_t* xq8, float* dx, int32_t* xs,
                           int32_t* xs0) {
    if (K % kQBlock != 0) fail("quantize_activations: K = ", K, " is not a multiple of 32");
    const __m256 sign = _mm256_set1_ps(-0.0f), fmax = _mm256_set1_ps(std::numeric_limits<float>::max());
    for (int64_t b = 0; b < K / kQBlock; ++b) {
      __m256 v[4], a[4];
      __m256 am = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
        a[j] = _mm256_andnot_ps(sign, v[j]);
        am = _mm256_max_ps(am, a[j]);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a[j], fmax, _CMP_LE_OQ));  // false for inf, NaN
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      const bool finite = _mm256_movemask_ps(ok) == 0xFF;
      int16_t* qb = xq + 32 * b;
      int8_t* q8 = xq8 + 32 * b;
      if (!finite || amax == 0) {
        std::memset(qb, 0, 64);
        std::memset(q8, 0, 32);
        dx[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        xs[b] = xs0[b] = 0;
        continue;
      }
      const __m256 id = _mm256_set1_ps(127.0f / amax);
      const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
      __m256i q[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q[j] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      }
      // (packs works per 128-bit lane: permute the 64-bit quarters back into k order.)
      const __m256i w0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
      const __m256i w1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), w0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16), w1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8), _mm256_permute4x64_epi64(_mm256_packs_epi16(w0, w1), 0xD8));
      const auto hsum = [](__m256i v) {
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        return _mm_cvtsi128_si32(t);
      };
      xs0[b] = hsum(_mm256_add_epi32(q[0], q[1]));
      xs[b] = xs0[b] + hsum(_mm256_add_epi32(q[2], q[3]));
      dx[b] = amax / 127.0f;
    }
  }

  static void prefetch_bytes(const uint8_t* p, int64_t n) {  // n bytes from p into L1
    for (int64_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
  }
};

}  // namespace
}  // namespace ft::cpu
