// The AVX-512 (F/BW/VL/DQ + VNNI) inner kernels of the fast-kernel drivers (kernels_impl.h), as
// one Isa class derived from Avx2Isa. Included only by translation units compiled for AVX-512 (or
// a superset): avx512.cpp instantiates the drivers with it, amx.cpp derives its own Isa from it.
// Everything is in an anonymous namespace (see isa_avx2.h). Include after isa_avx2.h, under the
// includer's `#pragma GCC target`.
// Quantized Q8_0/Q4_0/Q4_K/Q5_K and level-type weights take the integer path on vpdpbusd (u8 weights x s8
// activations, 64 products per instruction) over the quad layout of packed.h, and so does Q6_K
// over its own quad variant (a chain per half block, scaled in int32); the float types on
// 512-bit FMA. Attention: attention_avx512.cpp.
#pragma once

namespace ft::cpu {
namespace {

struct Avx512Isa : Avx2Isa {
  static constexpr int kMRInt = 6;        // 6 rows x 2 groups: 12 int32 + 12 f32 accumulators

  static void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows,
                        int64_t K, uint8_t* out) {
    if (t == GGMLType::Q6_K) return pack_rows_q6k_quad(rows, row_bytes, n_rows, K, out);
    pack_rows_quad(t, rows, row_bytes, n_rows, K, out);
  }

  // ---- Float weights (F32/F16/BF16) on 512-bit FMA: one register = a group's 16 rows at one k.
  // Each output is one fma chain over k in order, as on every ISA (bit-identical results).
  static constexpr int kMR = 12;  // 12 rows x 2 groups: 24 accumulators of the 32 registers

  // C (MR, ldc)[:, 16g : 16g + 16] (+)= MR rows x[i] (len,) @ w[g] (len, 16) for g < NG, from 0
  // when first, else from C.
  template <int MR, int NG>
  static void mkf_t(const float* const* x, const float* const* w, int64_t len, float* c,
                    int64_t ldc, bool first) {
    __m512 acc[MR][NG];
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g)
        acc[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
    for (int64_t k = 0; k < len; ++k) {
      __m512 b[NG];
      for (int g = 0; g < NG; ++g) b[g] = _mm512_loadu_ps(w[g] + 16 * k);
      for (int i = 0; i < MR; ++i) {
        const __m512 a = _mm512_set1_ps(x[i][k]);
        for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_fmadd_ps(a, b[g], acc[i][g]);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, acc[i][g]);
  }
  template <int NG>
  static void mkf(int mr, const float* const* x, const float* const* w, int64_t len, float* c,
                  int64_t ldc, bool first) {
    switch (mr) {
      case 1: return mkf_t<1, NG>(x, w, len, c, ldc, first);
      case 2: return mkf_t<2, NG>(x, w, len, c, ldc, first);
      case 3: return mkf_t<3, NG>(x, w, len, c, ldc, first);
      case 4: return mkf_t<4, NG>(x, w, len, c, ldc, first);
      case 5: return mkf_t<5, NG>(x, w, len, c, ldc, first);
      case 6: return mkf_t<6, NG>(x, w, len, c, ldc, first);
      case 7: return mkf_t<7, NG>(x, w, len, c, ldc, first);
      case 8: return mkf_t<8, NG>(x, w, len, c, ldc, first);
      case 9: return mkf_t<9, NG>(x, w, len, c, ldc, first);
      case 10: return mkf_t<10, NG>(x, w, len, c, ldc, first);
      case 11: return mkf_t<11, NG>(x, w, len, c, ldc, first);
      default: return mkf_t<12, NG>(x, w, len, c, ldc, first);
    }
  }
  static void mk_rows(int mr, const float* const* x, const float* w, int64_t len, float* c,
                      int64_t ldc, bool first) {
    mkf<1>(mr, x, &w, len, c, ldc, first);
  }
  static void mk_rows_n(int mr, const float* const* x, const float* const* w, int ng, int64_t len,
                        float* c, int64_t ldc, bool first) {
    if (ng == 2) return mkf<2>(mr, x, w, len, c, ldc, first);
    mkf<1>(mr, x, w, len, c, ldc, first);
  }

  // BF16 weights on the numerics of vdpbf16ps (kernels_impl.h: bf16_item), emulated as Avx2Isa
  // does: per pair of k the odd one's fma, then the even one's. Up to 12 rows x 2 groups.
  static constexpr int kMRBf16 = 12;
  // (12 x 32 tiles convert each pair once per 24 chains: measured on the Zen 5 as fast as the
  // f32 GEMM's panels, which Avx2Isa's 4-row tiles need.)
  static constexpr bool kBf16Panels = false;
  static __m512 bf16_at(const uint8_t* g, int64_t k) {  // a group's 16 bf16 at k -> f32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * k))), 16));
  }
  template <int MR, int NG>
  static void mkb_t(const float* const* x, const uint8_t* const* w, int64_t len, float* c, int64_t ldc, bool first) {
    __m512 acc[MR][NG];
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) acc[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
    int64_t past[NG];  // (decode's consecutive groups: prefetches past one run into the next's)
    past_end<NG>(w, 32 * len, past);
    int64_t k = 0;
    for (; k + 1 < len; k += 2) {
      for (int g = 0; g < NG; ++g) {
        int64_t off = 32 * k + kPrefetch;
        if (off >= 32 * len) off += past[g];
        _mm_prefetch(reinterpret_cast<const char*>(w[g]) + off, _MM_HINT_T0);
      }
      for (int64_t kk = k + 1; kk >= k; --kk) {  // (the odd k, then the even one)
        __m512 b[NG];
        for (int g = 0; g < NG; ++g) b[g] = bf16_at(w[g], kk);
        for (int i = 0; i < MR; ++i) {
          const __m512 a = _mm512_set1_ps(x[i][kk]);
          for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_fmadd_ps(a, b[g], acc[i][g]);
        }
      }
    }
    if (k < len) {  // (K odd: the last k's pair is a zero)
      for (int g = 0; g < NG; ++g) {
        const __m512 we = bf16_at(w[g], k);
        for (int i = 0; i < MR; ++i)
          acc[i][g] = _mm512_fmadd_ps(_mm512_set1_ps(x[i][k]), we, _mm512_add_ps(acc[i][g], _mm512_setzero_ps()));
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, acc[i][g]);
  }
  // Tiles of up to kMRBf16 rows for a kernel template K<MR, NG> (this one, and Avx512Bf16Isa's).
  template <template <int, int> class Kern, class... A>
  static void bf16_tile(int mr, int ng, A... a) {
    auto run = [&](auto ngc) {
      constexpr int NG = decltype(ngc)::value;
      switch (mr) {
        case 1: return Kern<1, NG>::run(a...);
        case 2: return Kern<2, NG>::run(a...);
        case 3: return Kern<3, NG>::run(a...);
        case 4: return Kern<4, NG>::run(a...);
        case 5: return Kern<5, NG>::run(a...);
        case 6: return Kern<6, NG>::run(a...);
        case 7: return Kern<7, NG>::run(a...);
        case 8: return Kern<8, NG>::run(a...);
        case 9: return Kern<9, NG>::run(a...);
        case 10: return Kern<10, NG>::run(a...);
        case 11: return Kern<11, NG>::run(a...);
        default: return Kern<12, NG>::run(a...);
      }
    };
    if (ng == 4 && mr == 1) return Kern<1, 4>::run(a...);  // (decode: two work items' groups)
    if (ng == 2) run(std::integral_constant<int, 2>{});
    else run(std::integral_constant<int, 1>{});
  }
  template <int MR, int NG>
  struct EmulatedBf16 {
    static void run(const float* const* xf, const uint32_t* const*, const uint8_t* const* w, int64_t len, float* c,
                    int64_t ldc, bool first) {
      mkb_t<MR, NG>(xf, w, len, c, ldc, first);
    }
  };
  static void mk_bf16(int mr, const float* const* xf, const uint32_t* const* xp, const uint8_t* const* w, int ng,
                      int64_t len, float* c, int64_t ldc, bool first) {
    bf16_tile<EmulatedBf16>(mr, ng, xf, xp, w, len, c, ldc, first);
  }

  // A group's 16 f32 weights at k from the panel layout, converted exactly as dequantize_row.
  template <GGMLType T>
  static __m512 wload(const uint8_t* g, int64_t k) {
    if constexpr (T == GGMLType::F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(g) + 16 * k);
    if constexpr (T == GGMLType::F16) return h16(g + 32 * k);
    if constexpr (T == GGMLType::BF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * k))), 16));
  }
  // Small M (decode): C (MR, ldc)[:, 16g : 16g + 16] = x (MR, ldx) @ group_g^T over all of K.
  template <GGMLType T, int MR, int NG>
  static void gemvf_t(const uint8_t* const* groups, int64_t K, const float* x, int64_t ldx,
                      float* c, int64_t ldc) {
    __m512 acc[MR][NG];
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_setzero_ps();
    constexpr int64_t kBytesPerK = T == GGMLType::F32 ? 64 : 32;  // a group's 16 weights at k
    int64_t past[NG];
    past_end<NG>(groups, K * kBytesPerK, past);
    for (int64_t k = 0; k < K; ++k) {
      if ((k * kBytesPerK) % 64 == 0)  // each stream's next lines, as the integer GEMV does
        for (int g = 0; g < NG; ++g) {
          int64_t off = k * kBytesPerK + kPrefetch;
          if (off >= K * kBytesPerK) off += past[g];
          _mm_prefetch(reinterpret_cast<const char*>(groups[g]) + off, _MM_HINT_T0);
        }
      __m512 b[NG];
      for (int g = 0; g < NG; ++g) b[g] = wload<T>(groups[g], k);
      for (int i = 0; i < MR; ++i) {
        const __m512 a = _mm512_set1_ps(x[i * ldx + k]);
        for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_fmadd_ps(a, b[g], acc[i][g]);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, acc[i][g]);
  }
  // Float weights take this path up to 32 rows: in tiles of up to 8 rows x 2 groups (16
  // accumulators), each tile reading the item's weights (in L2) and converting them in
  // registers. From 9 rows that beats unpacking each K chunk to f32 for so few rows (F16, in
  // cache, the rate over the 512-row rate on an Intel Xeon: 16 rows 0.74 -> 1.06, 17 rows
  // 0.53 -> 0.90); at 32 rows the two are even (0.99, 0.98).
  static constexpr int64_t kFusedMaxMFloat = 32;
  template <GGMLType T, int NG>
  static void gemvf(const uint8_t* const* groups, int64_t K, const float* x, int64_t M, float* c,
                    int64_t ldc) {
    // Rows in tiles of at most 8, split evenly (17 -> 6+6+5, not 8+8+1: a tile of one row has
    // two FMA chains to hide the weights' conversion and the FMA latency).
    const int64_t n_tiles = (M + 7) / 8;
    for (int64_t m = 0, t = 0; m < M; ++t) {
      switch (M / n_tiles + (t < M % n_tiles ? 1 : 0)) {
        case 1: gemvf_t<T, 1, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 1; break;
        case 2: gemvf_t<T, 2, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 2; break;
        case 3: gemvf_t<T, 3, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 3; break;
        case 4: gemvf_t<T, 4, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 4; break;
        case 5: gemvf_t<T, 5, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 5; break;
        case 6: gemvf_t<T, 6, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 6; break;
        case 7: gemvf_t<T, 7, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 7; break;
        default: gemvf_t<T, 8, NG>(groups, K, x + m * K, K, c + m * ldc, ldc); m += 8; break;
      }
    }
  }
  // One row takes up to kGemvFloatGroups groups per pass (Drivers::gemm: two work items at
  // decode): an output's chain issues one fma per fma latency, so a pass of 2 groups (2 chains)
  // left the FMA pipes idle 3 cycles in 4; 4 groups ran 1.8x faster with the weights in L2
  // (Zen 5, F16).
  static constexpr int kGemvFloatGroups = 4;
  template <GGMLType T>
  static void gemvf_n(const uint8_t* const* groups, int ng, int64_t K, const float* x, int64_t M,
                      float* c, int64_t ldc) {
    if (ng == 4 && M == 1) return gemvf_t<T, 1, 4>(groups, K, x, K, c, ldc);
    if (ng > 2) fail("gemv: ", ng, " groups at ", M, " rows");
    if (ng == 2) return gemvf<T, 2>(groups, K, x, M, c, ldc);
    gemvf<T, 1>(groups, K, x, M, c, ldc);
  }
  // LoRA's expand (Drivers::add_lora): c (mr, 16 ng) = x (mr, ldx) @ [group_0 .. group_ng-1]
  // (K, 16 each), mr <= 4, ng <= 2.
  template <GGMLType T, int NG>
  static void gemvf_rows(const uint8_t* const* groups, int64_t K, const float* x, int64_t ldx, int mr, float* c) {
    switch (mr) {
      case 1: return gemvf_t<T, 1, NG>(groups, K, x, ldx, c, 16 * NG);
      case 2: return gemvf_t<T, 2, NG>(groups, K, x, ldx, c, 16 * NG);
      case 3: return gemvf_t<T, 3, NG>(groups, K, x, ldx, c, 16 * NG);
      case 4: return gemvf_t<T, 4, NG>(groups, K, x, ldx, c, 16 * NG);
      default: fail("gemv_rows: ", mr, " rows (1..4)");
    }
  }
  template <GGMLType T>
  static void gemvf_rows_n(const uint8_t* const* groups, int ng, int64_t K, const float* x, int64_t ldx, int mr,
                           float* c) {
    if (ng == 2) return gemvf_rows<T, 2>(groups, K, x, ldx, mr, c);
    gemvf_rows<T, 1>(groups, K, x, ldx, mr, c);
  }
  // LoRA's expand over nr single-row runs at once (Drivers::add_lora, a decode batch mixing
  // adapters): c (nr, 16 ng) row r = x[r] (K,) @ [groups[r ng] .. groups[r ng + ng - 1]], each
  // run its own B; nr <= 4, ng <= 2. The same fma chain per output as gemvf_t (over k in order
  // from 0), the runs' chains side by side (independent: up to 8 in flight instead of 2).
  template <GGMLType T, int NR, int NG>
  static void gemvf_runs_t(const uint8_t* const* groups, int64_t K, const float* const* x, float* c) {
    __m512 acc[NR][NG];
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_setzero_ps();
    constexpr int64_t kBytesPerK = T == GGMLType::F32 ? 64 : 32;  // a group's 16 weights at k
    for (int64_t k = 0; k < K; ++k)
      for (int r = 0; r < NR; ++r) {
        // (LoRA's shrink streams A's groups over K = dim from memory; the expand's K = rank
        // never reaches kPrefetch.)
        if ((k * kBytesPerK) % 64 == 0 && k * kBytesPerK + kPrefetch < K * kBytesPerK)
          for (int g = 0; g < NG; ++g)
            _mm_prefetch(reinterpret_cast<const char*>(groups[r * NG + g]) + k * kBytesPerK + kPrefetch, _MM_HINT_T0);
        const __m512 a = _mm512_set1_ps(x[r][k]);
        for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_fmadd_ps(a, wload<T>(groups[r * NG + g], k), acc[r][g]);
      }
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + r * 16 * NG + 16 * g, acc[r][g]);
  }
  template <GGMLType T, int NG>
  static void gemvf_runs_n(const uint8_t* const* groups, int nr, int64_t K, const float* const* x, float* c) {
    switch (nr) {
      case 1: return gemvf_runs_t<T, 1, NG>(groups, K, x, c);
      case 2: return gemvf_runs_t<T, 2, NG>(groups, K, x, c);
      case 3: return gemvf_runs_t<T, 3, NG>(groups, K, x, c);
      case 4: return gemvf_runs_t<T, 4, NG>(groups, K, x, c);
      default: fail("gemv_runs: ", nr, " runs (1..4)");
    }
  }
  template <GGMLType T>
  static void gemvf_runs(const uint8_t* const* groups, int ng, int nr, int64_t K, const float* const* x, float* c) {
    if (ng == 2) return gemvf_runs_n<T, 2>(groups, nr, K, x, c);
    gemvf_runs_n<T, 1>(groups, nr, K, x, c);
  }
  // LoRA's expand over nr single-row runs, added in place (Drivers::ExpandQueue): for run r,
  // c[r] (16 ng) += x[r] (K,) @ [groups[r ng] .. groups[r ng + ng - 1]], nr <= 4, ng <= 2.
  // The same fma chain per output as gemvf_runs_t (over k in order from 0; K = 16, the usual
  // rank, unrolled), then one add into c: the bits of gemv_runs and an add. (Calls of up to 8
  // runs measured ~1% slower on the 110m decode step than of 4, Zen 5.)
  template <GGMLType T, int NR, int NG, int KC>
  static void expand_t(const uint8_t* const* groups, int64_t K, const float* const* x, float* const* c) {
    __m512 acc[NR][NG];
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_setzero_ps();
    const int64_t kn = KC > 0 ? KC : K;
#pragma GCC unroll 16
    for (int64_t k = 0; k < kn; ++k)
      for (int r = 0; r < NR; ++r) {
        const __m512 a = _mm512_set1_ps(x[r][k]);
        for (int g = 0; g < NG; ++g) acc[r][g] = _mm512_fmadd_ps(a, wload<T>(groups[r * NG + g], k), acc[r][g]);
      }
    for (int r = 0; r < NR; ++r)
      for (int g = 0; g < NG; ++g)
        _mm512_storeu_ps(c[r] + 16 * g, _mm512_add_ps(_mm512_loadu_ps(c[r] + 16 * g), acc[r][g]));
  }
  template <GGMLType T, int NG, int KC>
  static void expand_n(const uint8_t* const* groups, int nr, int64_t K, const float* const* x, float* const* c) {
    switch (nr) {
      case 1: return expand_t<T, 1, NG, KC>(groups, K, x, c);
      case 2: return expand_t<T, 2, NG, KC>(groups, K, x, c);
      case 3: return expand_t<T, 3, NG, KC>(groups, K, x, c);
      case 4: return expand_t<T, 4, NG, KC>(groups, K, x, c);
      default: fail("expand_runs: ", nr, " runs (1..4)");
    }
  }
  template <GGMLType T>
  static void expand_typed(const uint8_t* const* groups, int ng, int nr, int64_t K, const float* const* x,
                           float* const* c) {
    if (K == 16) return ng == 2 ? expand_n<T, 2, 16>(groups, nr, K, x, c) : expand_n<T, 1, 16>(groups, nr, K, x, c);
    ng == 2 ? expand_n<T, 2, 0>(groups, nr, K, x, c) : expand_n<T, 1, 0>(groups, nr, K, x, c);
  }
  // LoRA's expand over n consecutive work items of one B for one row x (Drivers::expand_span):
  // item i's ng (1 or 2) groups are B's groups g0 + i ng .. (contiguous, gb bytes each), and
  // c + i ldi + 16 j (16) += x (K,) @ group j. The items go 4 at a time, one broadcast of x[k]
  // for their 4 ng chains; each output the same fma chain as expand_runs (the same bits).
  template <GGMLType T, int NI, int NG, int KC>
  static void expand_items_t(const uint8_t* g, uint64_t gb, int64_t K, const float* x, float* c, int64_t ldi) {
    __m512 acc[NI][NG];
    for (int i = 0; i < NI; ++i)
      for (int j = 0; j < NG; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t kn = KC > 0 ? KC : K;
#pragma GCC unroll 16
    for (int64_t k = 0; k < kn; ++k) {
      const __m512 a = _mm512_set1_ps(x[k]);
      for (int i = 0; i < NI; ++i)
        for (int j = 0; j < NG; ++j) acc[i][j] = _mm512_fmadd_ps(a, wload<T>(g + uint64_t(i * NG + j) * gb, k), acc[i][j]);
    }
    for (int i = 0; i < NI; ++i)
      for (int j = 0; j < NG; ++j)
        _mm512_storeu_ps(c + i * ldi + 16 * j, _mm512_add_ps(_mm512_loadu_ps(c + i * ldi + 16 * j), acc[i][j]));
  }
  template <GGMLType T, int NG, int KC>
  static void expand_items_n(const uint8_t* g, uint64_t gb, int64_t n, int64_t K, const float* x, float* c,
                             int64_t ldi) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) expand_items_t<T, 4, NG, KC>(g + uint64_t(i * NG) * gb, gb, K, x, c + i * ldi, ldi);
    switch (n - i) {
      case 1: return expand_items_t<T, 1, NG, KC>(g + uint64_t(i * NG) * gb, gb, K, x, c + i * ldi, ldi);
      case 2: return expand_items_t<T, 2, NG, KC>(g + uint64_t(i * NG) * gb, gb, K, x, c + i * ldi, ldi);
      case 3: return expand_items_t<T, 3, NG, KC>(g + uint64_t(i * NG) * gb, gb, K, x, c + i * ldi, ldi);
      default: return;
    }
  }
  template <GGMLType T>
  static void expand_items_typed(const uint8_t* g, uint64_t gb, int ng, int64_t n, int64_t K, const float* x,
                                 float* c, int64_t ldi) {
    if (K == 16)
      return ng == 2 ? expand_items_n<T, 2, 16>(g, gb, n, K, x, c, ldi) : expand_items_n<T, 1, 16>(g, gb, n, K, x, c, ldi);
    ng == 2 ? expand_items_n<T, 2, 0>(g, gb, n, K, x, c, ldi) : expand_items_n<T, 1, 0>(g, gb, n, K, x, c, ldi);
  }
  static void expand_items(GGMLType t, const uint8_t* g, uint64_t gb, int ng, int64_t n, int64_t K, const float* x,
                           float* c, int64_t ldi) {
    switch (t) {
      case GGMLType::F32: return expand_items_typed<GGMLType::F32>(g, gb, ng, n, K, x, c, ldi);
      case GGMLType::F16: return expand_items_typed<GGMLType::F16>(g, gb, ng, n, K, x, c, ldi);
      case GGMLType::BF16: return expand_items_typed<GGMLType::BF16>(g, gb, ng, n, K, x, c, ldi);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }
  static void expand_runs(GGMLType t, const uint8_t* const* groups, int ng, int nr, int64_t K, const float* const* x,
                          float* const* c) {
    switch (t) {
      case GGMLType::F32: return expand_typed<GGMLType::F32>(groups, ng, nr, K, x, c);
      case GGMLType::F16: return expand_typed<GGMLType::F16>(groups, ng, nr, K, x, c);
      case GGMLType::BF16: return expand_typed<GGMLType::BF16>(groups, ng, nr, K, x, c);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }
  static void gemv_runs(GGMLType t, const uint8_t* const* groups, int ng, int nr, int64_t K, const float* const* x,
                        float* c) {
    switch (t) {
      case GGMLType::F32: return gemvf_runs<GGMLType::F32>(groups, ng, nr, K, x, c);
      case GGMLType::F16: return gemvf_runs<GGMLType::F16>(groups, ng, nr, K, x, c);
      case GGMLType::BF16: return gemvf_runs<GGMLType::BF16>(groups, ng, nr, K, x, c);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }
  static void gemv_rows(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const float* x, int64_t ldx,
                        int mr, float* c) {
    switch (t) {
      case GGMLType::F32: return gemvf_rows_n<GGMLType::F32>(groups, ng, K, x, ldx, mr, c);
      case GGMLType::F16: return gemvf_rows_n<GGMLType::F16>(groups, ng, K, x, ldx, mr, c);
      case GGMLType::BF16: return gemvf_rows_n<GGMLType::BF16>(groups, ng, K, x, ldx, mr, c);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }
  // ng (1 or 2; 4 at one row) groups of the same float type, consecutive in C (16 columns each).
  static void gemv(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const float* x,
                   int64_t M, float* c, int64_t ldc) {
    switch (t) {
      case GGMLType::F32: return gemvf_n<GGMLType::F32>(groups, ng, K, x, M, c, ldc);
      case GGMLType::F16: return gemvf_n<GGMLType::F16>(groups, ng, K, x, M, c, ldc);
      case GGMLType::BF16: return gemvf_n<GGMLType::BF16>(groups, ng, K, x, M, c, ldc);
      default: fail("fast kernels: unsupported packed weight type ", int(t));
    }
  }

  // A group's prefetches run kPrefetch past its end (group_bytes), into the next group in
  // memory: the group this thread reads next (a thread takes runs of consecutive items), except
  // where the pass reads n consecutive groups of one matrix (an item's two; two items' four),
  // whose overshoot would land in a group being read and leave the next pass's to start cold, a
  // full DRAM latency at each pass. There each goes n - 1 groups further (past[g]: bytes to add
  // to an offset past the end): into its counterpart of the next pass. (SwiGLU's gate j, up j:
  // n = 1; two such items: gate j, up j, gate j + 1, up j + 1, n = 2.)
  // One or two groups are two compares; of four, the two layouts passes read are checked first,
  // consecutive groups and SwiGLU's two items (gate j, up j, gate j + 1, up j + 1, the matrices
  // further apart than a pass). The count over every pair (32 64-bit divisions at four groups,
  // ~32 ns) was ~2% of the 110m decode's kernel samples (`perf`), whose K = 768 calls are short;
  // the checks take ~2 ns. (The same offsets as the count on 600K random layouts.)
  template <int NG>
  static void past_end(const uint8_t* const* groups, int64_t group_bytes, int64_t* past) {
    if constexpr (NG <= 2) {  // (n = 2 where two groups are 0 or 1 group apart)
      const int64_t d = groups[NG - 1] - groups[0];
      const int n = NG == 2 && (d == 0 || d == group_bytes || d == -group_bytes) ? 2 : 1;
      for (int g = 0; g < NG; ++g) past[g] = (n - 1) * group_bytes;
      return;
    }
    bool consecutive = true;
    for (int h = 1; h < NG; ++h) consecutive = consecutive && groups[h] == groups[0] + h * group_bytes;
    bool gate_up = false;
    if constexpr (NG == 4) {
      const int64_t apart = groups[1] - groups[0];
      gate_up = groups[2] == groups[0] + group_bytes && groups[3] == groups[1] + group_bytes &&
                (apart > NG * group_bytes || apart < -NG * group_bytes);  // (no cross pair within NG - 1)
    }
    for (int g = 0; g < NG; ++g) {
      int n = consecutive ? NG : gate_up ? 2 : 0;
      for (int h = 0; h < NG && !consecutive && !gate_up; ++h) {
        const int64_t d = groups[h] - groups[g];
        n += d % group_bytes == 0 && d / group_bytes >= 1 - NG && d / group_bytes <= NG - 1;
      }
      past[g] = (n - 1) * group_bytes;
    }
  }
  static void prefetch_block(const uint8_t* g, int64_t kb, int bytes_per_32, int64_t group_bytes, int64_t past) {
    int64_t off = (kb + 1) * bytes_per_32 + kPrefetch;
    if (off >= group_bytes) off += past;
    for (int o = 0; o < bytes_per_32; o += 64) _mm_prefetch(reinterpret_cast<const char*>(g) + off + o, _MM_HINT_T0);
  }

  // ---- Integer path ----
  static __m512 h16(const uint8_t* p) {  // 16 f16 -> f32
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 u8f16(const uint8_t* p) {  // 16 uint8 -> f32
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static __m512i ld(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static __m512i bcast4(const int8_t* x) {  // x[0..3] into every 32-bit lane
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
  }

  // Decoders of the quad layout: begin(kb) moves to 32-block kb, scales() gives its s1 (and s2)
  // for the 16 rows, quads(P, w0, w1) quads 2P and 2P + 1 (k = 8P .. 8P + 7) as u8, 16 rows x 4 k.
  // u = v + kBias. (Methods always inlined, as Avx2Isa's decoders: QDecQ4_K's scales was a call.)
  struct QDecQ8_0 {
    static constexpr int kBias = 128, kBytesPer32 = 544;
    static constexpr bool kS2 = false, kSub16 = false;
    const uint8_t* g;
    const uint8_t* blk = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { blk = g + kb * kBytesPer32; }
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = h16(blk); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      w0 = ld(blk + 32 + 128 * P);
      w1 = ld(blk + 32 + 128 * P + 64);
    }
  };
  static void nibble_quads(const uint8_t* p, __m512i& w0, __m512i& w1) {
    const __m512i b = ld(p), m = _mm512_set1_epi8(0x0F);
    w0 = _mm512_and_si512(b, m);
    w1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), m);
  }
  struct QDecQ4_0 {
    static constexpr int kBias = 8, kBytesPer32 = 288;
    static constexpr bool kS2 = false, kSub16 = false;
    const uint8_t* g;
    const uint8_t* blk = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { blk = g + kb * kBytesPer32; }
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = h16(blk); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const { nibble_quads(blk + 32 + 64 * P, w0, w1); }
  };
  // The level types (packed.h): each nibble index q mapped by vpshufb to u = kLevels[q] + kB.
  template <const int8_t* kLevels, int kB>  // (u = levels[i] + kB, for a byte shuffle)
  [[gnu::always_inline]] static __m512i level_lut() {
    return _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kLevels))),
                           _mm512_set1_epi8(char(kB)));
  }
  template <const int8_t* kLevels, int kB>
  [[gnu::always_inline]] static void level_quads(const uint8_t* p, __m512i& w0, __m512i& w1) {
    const __m512i lut = level_lut<kLevels, kB>();
    nibble_quads(p, w0, w1);
    w0 = _mm512_shuffle_epi8(lut, w0);
    w1 = _mm512_shuffle_epi8(lut, w1);
  }
  // MXFP4 and IQ4_NL (quad layout as Q4_0, d its f16 scale): u = kLevels[q] + kB (MXFP4 in [0,
  // 24], B = 12; IQ4_NL in [1, 241], B = 128). kQ8Form: unpack_int gives Q8_0's form (gemm_type).
  template <GGMLType T, int kB>
  struct QDecLevels32 : QDecQ4_0 {
    static constexpr int kBias = kB;
    static constexpr bool kQ8Form = true;
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      level_quads<level_values(T), kB>(blk + 32 + 64 * P, w0, w1);
    }
  };
  // The levels layout (packed.h: IQ4_XS, IQ3_XXS, IQ3_S, with nibbles): s1 = d sc unit of
  // sub-block sb, u = levels[q] + 128 in [1, 255].
  template <GGMLType T>  // (the levels and levels3 layouts' s1 of sub-block sb)
  [[gnu::always_inline]] static __m512 levels_s1(const uint8_t* blk, int sb) {
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + LevelsBlock::kSc + 16 * sb))));
    const __m512 s1 = _mm512_mul_ps(h16(blk + LevelsBlock::kD), sc);
    if constexpr (level_unit(T) != 1.0f) return _mm512_mul_ps(s1, _mm512_set1_ps(level_unit(T)));
    return s1;
  }
  template <GGMLType T>
  struct QDecLevels256 : LevelsCursor {
    static_assert(!is_levels3_layout(T), "the levels3 layout's types pack 3-bit indices");
    static constexpr int kBias = 128, kBytesPer32 = LevelsBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSub16 = false, kQ8Form = true;
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = levels_s1<T>(blk, sb); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      level_quads<level_values(T), kBias>(q + 64 * P, w0, w1);
    }
  };
  // Quad 4h + t (k = 16h + 4t .. 16h + 4t + 3) of a 32-block's 3-bit indices (packed.h: the low
  // fields q, the high bits qh), 16 rows: i = low | (high & 4), ternary logic 0xF8 = A | (B & C).
  // (16-bit shifts: the ands keep bits 0-1 and bit 2 of each byte, which came from the same byte.)
  [[gnu::always_inline]] static __m512i fields3_quad(const uint8_t* q, const uint8_t* qh, int h, int t) {
    const int s = 4 * h + t;  // (the high bit's place in its byte, to bit 2)
    const __m512i b = ld(q + 64 * h), H = ld(qh);
    const __m512i low = _mm512_and_si512(t == 0 ? b : _mm512_srli_epi16(b, unsigned(2 * t)), _mm512_set1_epi8(3));
    const __m512i high = s >= 2 ? _mm512_srli_epi16(H, unsigned(s - 2)) : _mm512_slli_epi16(H, unsigned(2 - s));
    return _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi8(4), 0xF8);
  }
  // The levels3 layout (packed.h: IQ2_XXS, IQ1_S, TQ1_0, TQ2_0): QDecLevels256's scales, its
  // quads from 3-bit indices (fields3_quad), u = levels[i] + 128 in [1, 255].
  template <GGMLType T>
  struct QDecLevels3 : Levels3Cursor {
    static_assert(is_levels3_layout(T) && levels_fit_3_bits(T));
    static constexpr int kBias = 128, kBytesPer32 = Levels3Block::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSub16 = false, kQ8Form = true;
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = levels_s1<T>(blk, sb); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      const __m512i lut = level_lut<level_values(T), kBias>();
      const int h = P / 2, t = 2 * (P % 2);  // (quads 2P, 2P + 1)
      w0 = _mm512_shuffle_epi8(lut, fields3_quad(q, qh, h, t));
      w1 = _mm512_shuffle_epi8(lut, fields3_quad(q, qh, h, t + 1));
    }
  };
  // Q4_K's and Q5_K's s1 = d sc, s2 = -(dmin m) of sub-block sb of a block's header (Q4KBlock).
  [[gnu::always_inline]] static void k_scales(const uint8_t* blk, int sb, __m512& s1, __m512& s2) {
    s1 = _mm512_mul_ps(h16(blk + Q4KBlock::kD), u8f16(blk + Q4KBlock::kSc + 16 * sb));
    s2 = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_set1_epi32(int32_t(0x80000000u)),
        _mm512_castps_si512(_mm512_mul_ps(h16(blk + Q4KBlock::kDmin), u8f16(blk + Q4KBlock::kM + 16 * sb)))));
  }
  struct QDecQ4_K : Q4KCursor {
    static constexpr int kBias = 0, kBytesPer32 = 296;  // (on average)
    static constexpr bool kS2 = true, kSub16 = false;
    [[gnu::always_inline]] void scales(__m512& s1, __m512& s2) const { k_scales(blk, sb, s1, s2); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const { nibble_quads(q + 64 * P, w0, w1); }
  };
  // Quads 2P and 2P + 1 (w0, w1) of a nibble type, plus their 5th bits from the plane qh (packed.h:
  // byte (r, e) holds quad j's 5th bit at bit j): to bit 4 (16-bit shifts; the and keeps bit 4
  // of each byte, which came from the same byte). w | (b & 0x10): 0xF8.
  [[gnu::always_inline]] static void fifth_bits(const uint8_t* qh, int P, __m512i& w0, __m512i& w1) {
    const __m512i H = ld(qh), m = _mm512_set1_epi8(0x10);
    const auto at4 = [&](int j) { return j <= 4 ? _mm512_slli_epi16(H, unsigned(4 - j)) : _mm512_srli_epi16(H, unsigned(j - 4)); };
    w0 = _mm512_ternarylogic_epi32(w0, at4(2 * P), m, 0xF8);
    w1 = _mm512_ternarylogic_epi32(w1, at4(2 * P + 1), m, 0xF8);
  }
  // Q5_K (quad layout as Q4_K, then its 5th bits: packed.h): u = q + 16 h in [0, 31].
  struct QDecQ5_K : Q5KCursor {
    static constexpr int kBias = 0, kBytesPer32 = Q5KBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = true, kSub16 = false;
    [[gnu::always_inline]] void scales(__m512& s1, __m512& s2) const { k_scales(blk, sb, s1, s2); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      nibble_quads(q + 64 * P, w0, w1);
      fifth_bits(qh, P, w0, w1);
    }
  };
  // Q4_1 and Q5_1 (kFifth; packed.h): s1 = d, s2 = m; u = q (+ 16 h), B = 0.
  template <bool kFifth>
  struct QDecMin32 {
    static constexpr int kBias = 0, kBytesPer32 = kFifth ? Q51Block::kBytes : Q41Block::kBytes;
    static constexpr bool kS2 = true, kSub16 = false;
    const uint8_t* g;
    const uint8_t* blk = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { blk = g + kb * kBytesPer32; }
    [[gnu::always_inline]] void scales(__m512& s1, __m512& s2) const {
      s1 = h16(blk + Q41Block::kD);
      s2 = h16(blk + Q41Block::kM);
    }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      nibble_quads(blk + Q41Block::kQ + 64 * P, w0, w1);
      if constexpr (kFifth) fifth_bits(blk + Q51Block::kQh, P, w0, w1);
    }
  };
  // Q5_0 (packed.h: Q4_0's, then the 5th bits' plane): u = q + 16 h in [0, 31], B = 16.
  struct QDecQ5_0 {
    static constexpr int kBias = 16, kBytesPer32 = Q50Block::kBytes;
    static constexpr bool kS2 = false, kSub16 = false, kQ8Form = true;
    const uint8_t* g;
    const uint8_t* blk = nullptr;
    [[gnu::always_inline]] void begin(int64_t kb) { blk = g + kb * kBytesPer32; }
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = h16(blk); }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      nibble_quads(blk + Q50Block::kQ + 64 * P, w0, w1);
      fifth_bits(blk + Q50Block::kQh, P, w0, w1);
    }
  };
  // Q6_K's quad variant (packed.h): per half block h (kSub16), quads(h, w) gives its 4 quads as
  // u = q in [0, 63] (I_h = sum u xq - kBias X_h), sc(h) its 16 rows' int8 scales as int32.
  struct QDecQ6_K : Q6KQuadCursor {
    static constexpr int kBias = 32, kBytesPer32 = Q6KBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSub16 = true;
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = h16(blk + Q6KBlock::kD); }
    [[gnu::always_inline]] __m512i sc(int h) const {
      return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + Q6KBlock::kSc + (2 * j + h) * 16)));
    }
    [[gnu::always_inline]] void quads(int h, __m512i w[4]) const {
      const __m512i b0 = ld(ql + 128 * h), b1 = ld(ql + 128 * h + 64), H = ld(qh + 64 * h);
      const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
      // (16-bit shifts: the and keeps bits 4-5 of each byte, which came from the same byte.)
      // w = (nibble & 0x0F) | field: ternary logic 0xEC = (A & C) | B.
      w[0] = _mm512_ternarylogic_epi32(b0, _mm512_and_si512(_mm512_slli_epi16(H, 4), m30), m4, 0xEC);
      w[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b0, 4), _mm512_and_si512(_mm512_slli_epi16(H, 2), m30), m4, 0xEC);
      w[2] = _mm512_ternarylogic_epi32(b1, _mm512_and_si512(H, m30), m4, 0xEC);
      w[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b1, 4), _mm512_and_si512(_mm512_srli_epi16(H, 2), m30), m4, 0xEC);
    }
  };
  // The levels16 layout (packed.h: Q3_K, IQ2_XS, IQ2_S, IQ1_M), as Q6_K's quad variant: per half
  // block h its 4 quads of indices i = low + 4 high, as u = levels[i] + 128 by a byte shuffle
  // (Q3_K: u = i itself, B = 3: levels16_index_bias), so I_h = sum u xq - B X_h; sc(h) its rows'
  // scales (the grid types' steps 2s + 1); s1 = d unit.
  template <GGMLType T>
  struct QDecLevels16 : Levels16Cursor {
    static constexpr int kIndexBias = levels16_index_bias(T);
    static constexpr int kBias = kIndexBias >= 0 ? kIndexBias : 128, kBytesPer32 = Levels16Block::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSub16 = true;
    static constexpr bool kQ8Form = T == GGMLType::Q3_K;  // (its chunk: levels x scale fit an int8)
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const {
      s1 = h16(blk + Levels16Block::kD);
      if constexpr (level_unit(T) != 1.0f) s1 = _mm512_mul_ps(s1, _mm512_set1_ps(level_unit(T)));
    }
    [[gnu::always_inline]] __m512i sc(int h) const {
      return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + Levels16Block::kSc + (2 * sb + h) * 16)));
    }
    [[gnu::always_inline]] void quads(int h, __m512i w[4]) const {
      for (int t = 0; t < 4; ++t) {
        w[t] = fields3_quad(q, qh, h, t);
        if constexpr (kIndexBias < 0) w[t] = _mm512_shuffle_epi8(level_lut<level_values(T), kBias>(), w[t]);
      }
    }
  };
  // Q2_K (packed.h): s1 = d; min_scales(b_0, b_1) the rows' b_h = -dmin m_h, the min term's
  // scales (kMin16: y = fma(b_h, f_h, y) for h = 0, 1, f_h = QAct::fx). The GEMV takes its half
  // blocks as the sub16 types' (kSub16: quads(h, w) the fields q in [0, 3], B = 0; sc(h) the
  // rows' scales: I = sc_0 I_0 + sc_1 I_1); its GEMM chunk is Q4_K's form, u = sc q in [0, 45]
  // (quads(P, w0, w1): a byte shuffle of each row's table (0, sc, 2 sc, 3 sc), sc times
  // 0x03020100 in its int32 lane, at index q + 4 (row % 4)). (The tables in the GEMV too, u =
  // sc q in one chain: 1.10-1.19x its time in cache, Zen 5.)
  struct QDecQ2_K : Q2KCursor {
    static constexpr int kBias = 0, kBytesPer32 = Q2KBlock::kBytes / 8;  // (on average)
    static constexpr bool kS2 = false, kSub16 = true, kMin16 = true;
    [[gnu::always_inline]] __m512i sm32(int h) const {  // half h's scale/min bytes as int32
      return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sm + kGroup * h)));
    }
    [[gnu::always_inline]] void scales(__m512& s1, __m512&) const { s1 = h16(blk + Q2KBlock::kD); }
    [[gnu::always_inline]] void min_scales(__m512& b0, __m512& b1) const {  // (exact)
      const __m512 neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_set1_epi32(int32_t(0x80000000u)),
                                                                   _mm512_castps_si512(h16(blk + Q2KBlock::kDmin))));
      b0 = _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm32(0), 4)));
      b1 = _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm32(1), 4)));
    }
    [[gnu::always_inline]] __m512i sc(int h) const { return _mm512_and_si512(sm32(h), _mm512_set1_epi32(0xF)); }
    // (16-bit shifts: the and keeps bits 0-1 of each byte, which came from the same byte.)
    [[gnu::always_inline]] void quads(int h, __m512i w[4]) const {
      const __m512i b = ld(q + 64 * h), three = _mm512_set1_epi8(3);
      w[0] = _mm512_and_si512(b, three);
      for (int t = 1; t < 4; ++t) w[t] = _mm512_and_si512(_mm512_srli_epi16(b, unsigned(2 * t)), three);
    }
    [[gnu::always_inline]] void quads(int P, __m512i& w0, __m512i& w1) const {
      const int h = P / 2, t = 2 * (P % 2);  // (quads 2P, 2P + 1: fields t, t + 1 of half h)
      const __m512i b = ld(q + 64 * h), three = _mm512_set1_epi8(3);
      const __m512i tbl = _mm512_mullo_epi32(sc(h), _mm512_set1_epi32(0x03020100));
      const __m512i row = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
      // index = (field & 3) | 4 (row % 4): ternary logic 0xEA = (A & B) | C.
      w0 = _mm512_shuffle_epi8(tbl, _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, unsigned(2 * t)), three, row, 0xEA));
      w1 = _mm512_shuffle_epi8(tbl, _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, unsigned(2 * t + 2)), three, row, 0xEA));
    }
  };
  // Q2_K's min term: y = fma(b_0, f[0], y), then fma(b_1, f[1], y) (f: a block's QAct::fx).
  static __m512 min16_term(__m512 b0, __m512 b1, const float* f, __m512 y) {
    return _mm512_fmadd_ps(b1, _mm512_set1_ps(f[1]), _mm512_fmadd_ps(b0, _mm512_set1_ps(f[0]), y));
  }
  template <class F>
  static bool with_qdecoder(GGMLType t, const uint8_t* group, F&& f) {
    switch (t) {
      case GGMLType::Q8_0: f(QDecQ8_0{group}); return true;
      case GGMLType::Q4_0: f(QDecQ4_0{group}); return true;
      case GGMLType::Q5_0: f(QDecQ5_0{group}); return true;
      case GGMLType::Q4_1: f(QDecMin32<false>{group}); return true;
      case GGMLType::Q5_1: f(QDecMin32<true>{group}); return true;
      case GGMLType::MXFP4: f(QDecLevels32<GGMLType::MXFP4, 12>{{group}}); return true;
      case GGMLType::IQ4_NL: f(QDecLevels32<GGMLType::IQ4_NL, 128>{{group}}); return true;
      case GGMLType::IQ4_XS: f(QDecLevels256<GGMLType::IQ4_XS>{{group}}); return true;
      case GGMLType::IQ2_XXS: f(QDecLevels3<GGMLType::IQ2_XXS>{{group}}); return true;
      case GGMLType::IQ3_XXS: f(QDecLevels256<GGMLType::IQ3_XXS>{{group}}); return true;
      case GGMLType::IQ3_S: f(QDecLevels256<GGMLType::IQ3_S>{{group}}); return true;
      case GGMLType::IQ1_S: f(QDecLevels3<GGMLType::IQ1_S>{{group}}); return true;
      case GGMLType::TQ1_0: f(QDecLevels3<GGMLType::TQ1_0>{{group}}); return true;
      case GGMLType::TQ2_0: f(QDecLevels3<GGMLType::TQ2_0>{{group}}); return true;
      case GGMLType::Q4_K: f(QDecQ4_K{{group}}); return true;
      case GGMLType::Q5_K: f(QDecQ5_K{{group}}); return true;
      case GGMLType::Q6_K: f(QDecQ6_K{{group}}); return true;
      case GGMLType::IQ2_XS: f(QDecLevels16<GGMLType::IQ2_XS>{{group}}); return true;
      case GGMLType::IQ2_S: f(QDecLevels16<GGMLType::IQ2_S>{{group}}); return true;
      case GGMLType::IQ1_M: f(QDecLevels16<GGMLType::IQ1_M>{{group}}); return true;
      case GGMLType::Q3_K: f(QDecLevels16<GGMLType::Q3_K>{{group}}); return true;
      case GGMLType::Q2_K: f(QDecQ2_K{{group}}); return true;
      default: return false;
    }
  }

  // Small M: C (MR, ldc)[:, 16g : 16g + 16] (+)= NG groups' 16 rows (g < NG, all of one
  // type) over 32-blocks [kb0, kb1) of K (from 0 when first, else from C), straight from the
  // packed bytes. Per 32-block and row: I = sum u xq - B sum xq (exact; the dpbusd chain starts
  // from -B sum xq), then y = fma(float(I), s1 * dx, y) (and fma(float(sum xq), s2 * dx, y)):
  // mk_int's sums. Two groups share each activation broadcast, each its own chain (12 chains
  // at 6 rows); one group splits its chain into even and odd quads (two chains per row).
  // The sub16 types (D::kSub16: Q6_K, the levels16 layout, Q2_K): per half block h the chain
  // starts from -B X_h (X_0 = xs0, X_1 = xs - xs0) and I = sc_0 I_0 + sc_1 I_1 (exact), then the
  // same y = fma(float(I), s1 * dx, y) (Q2_K: then its min term, min16_term).
  template <int MR, int NG, class D>
  static void gemv_q_t(const D* dec, int64_t kb0, int64_t kb1, int64_t nkb, const int8_t* xq, int64_t ldx,
                       const float* dx, const int32_t* xs, const int32_t* xs0, const float* fx, float* c,
                       int64_t ldc, bool first) {
    __m512 y[MR][NG];
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      #pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) y[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
    if (kb0 == 0)
      #pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) prefetch_start(dec[g].g, D::kBytesPer32);
    D d[NG];
    const uint8_t* gp[NG];
    #pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) d[g] = dec[g], gp[g] = dec[g].g;
    const int64_t gbytes = nkb * D::kBytesPer32;
    int64_t past[NG];
    past_end<NG>(gp, gbytes, past);
    for (int64_t kb = kb0; kb < kb1; ++kb) {
      #pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) {
        prefetch_block(d[g].g, kb, D::kBytesPer32, gbytes, past[g]);
        d[g].begin(kb);
      }
      if constexpr (D::kSub16) {
        __m512i I[MR][NG];
        #pragma GCC unroll 8
        for (int h = 0; h < 2; ++h) {
          __m512i a[MR][NG];
          #pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const int32_t X0 = xs0[i * nkb + kb], X = h == 0 ? X0 : xs[i * nkb + kb] - X0;
            #pragma GCC unroll 8
            for (int g = 0; g < NG; ++g) a[i][g] = _mm512_set1_epi32(-D::kBias * X);
          }
          __m512i w[NG][4];
          #pragma GCC unroll 8
          for (int g = 0; g < NG; ++g) d[g].quads(h, w[g]);
          #pragma GCC unroll 8
          for (int t = 0; t < 4; ++t)
            #pragma GCC unroll 8
            for (int i = 0; i < MR; ++i) {
              const __m512i xb = bcast4(xq + i * ldx + kb * kQBlock + 16 * h + 4 * t);
              #pragma GCC unroll 8
              for (int g = 0; g < NG; ++g) a[i][g] = _mm512_dpbusd_epi32(a[i][g], w[g][t], xb);
            }
          #pragma GCC unroll 8
          for (int g = 0; g < NG; ++g) {
            const __m512i sc = d[g].sc(h);
            #pragma GCC unroll 8
            for (int i = 0; i < MR; ++i) {
              const __m512i p = _mm512_mullo_epi32(a[i][g], sc);
              I[i][g] = h == 0 ? p : _mm512_add_epi32(I[i][g], p);
            }
          }
        }
        #pragma GCC unroll 8
        for (int g = 0; g < NG; ++g) {
          __m512 s1, s2;
          d[g].scales(s1, s2);
          [[maybe_unused]] __m512 b0, b1;
          if constexpr (min16_of<D>()) d[g].min_scales(b0, b1);
          #pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512 dv = _mm512_set1_ps(dx[i * nkb + kb]);
            y[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[i][g]), _mm512_mul_ps(s1, dv), y[i][g]);
            if constexpr (min16_of<D>()) y[i][g] = min16_term(b0, b1, fx + 2 * (i * nkb + kb), y[i][g]);
          }
        }
      } else {
        // Chains per group: one group, two (its even and odd quads); Q4_K's four-group pass too
        // (4 vpdpbusd deep a block, not 8: TinyLlama Q4_K_M's decode step 0.970-0.976x, `--ab`;
        // Q4_0's and Q8_0's 1.02-1.05x, the extra add per block on their lighter decoders).
        constexpr int NC = NG == 1 || (D::kS2 && MR == 1 && NG == kGemvIntGroups) ? 2 : 1;
        __m512i a[MR][NG][NC];
        #pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512i a0 = D::kBias != 0 ? _mm512_set1_epi32(-D::kBias * xs[i * nkb + kb]) : _mm512_setzero_si512();
          #pragma GCC unroll 8
          for (int g = 0; g < NG; ++g) {
            a[i][g][0] = a0;
            if constexpr (NC == 2) a[i][g][NC - 1] = _mm512_setzero_si512();
          }
        }
        #pragma GCC unroll 8
        for (int P = 0; P < 4; ++P) {
          __m512i w[NG][2];
          #pragma GCC unroll 8
          for (int g = 0; g < NG; ++g) d[g].quads(P, w[g][0], w[g][1]);
          #pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const int8_t* x = xq + i * ldx + kb * kQBlock + 8 * P;
            const __m512i x0 = bcast4(x), x1 = bcast4(x + 4);
            #pragma GCC unroll 8
            for (int g = 0; g < NG; ++g) {
              a[i][g][0] = _mm512_dpbusd_epi32(a[i][g][0], w[g][0], x0);
              a[i][g][NC - 1] = _mm512_dpbusd_epi32(a[i][g][NC - 1], w[g][1], x1);
            }
          }
        }
        #pragma GCC unroll 8
        for (int g = 0; g < NG; ++g) {
          __m512 s1, s2 = _mm512_setzero_ps();
          d[g].scales(s1, s2);
          #pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512i I = NC == 2 ? _mm512_add_epi32(a[i][g][0], a[i][g][1]) : a[i][g][0];
            const __m512 dv = _mm512_set1_ps(dx[i * nkb + kb]);
            y[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(s1, dv), y[i][g]);
            if constexpr (D::kS2)
              y[i][g] = _mm512_fmadd_ps(_mm512_set1_ps(float(xs[i * nkb + kb])), _mm512_mul_ps(s2, dv), y[i][g]);
          }
        }
      }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      #pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, y[i][g]);
  }
  // Quad types take this path up to kFusedMaxMQuad rows (the scheduler's small prefill chunks):
  // one group's packed bytes (18-50 KB) stay in L1/L2 for every tile of rows after the first,
  // and each tile keeps its sums in registers over all of K (no unpacked copy, no C reloads).
  static constexpr int64_t kFusedMaxMQuad = 32;
  static bool fused_int(GGMLType t, int64_t M) {
    return M <= kFusedMaxM || ((is_quad_type(t) || is_sub16_type(t) || has_min16(t)) && M <= kFusedMaxMQuad);
  }
  // One row takes up to kGemvIntGroups groups per pass (Drivers::gemm: two work items at
  // decode), four streams per thread where two work items' passes were two each. Zen 5, one
  // thread, K = 2048, 256 MB of groups: Q8_0 / Q4_0 from memory 1.09x / 1.03x the rate of two
  // passes of 2 (32.9 vs 28.9 / 28.2 vs 26.7 GB/s), in L2 1.03x / 1.06x; in the model
  // (`--ab`, decode step time) Q8_0 0.89-0.92x, Q4_K_M 0.93-0.98x, Q4_0 0.98-1.0x.
  static constexpr int kGemvIntGroups = 4;
  // ng (1, 2, or kGemvIntGroups at one row) groups of type t (consecutive in C, 16 columns each)
  // x rows [r0, r0 + M) of qa.
  static void gemv_int_n(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const QAct& qa,
                         int64_t r0, int64_t M, float* c, int64_t ldc) {
    const int64_t nkb = K / kQBlock;
    if (ng > 2 && M > 1) {  // (more than two groups' chains at one row only: registers)
      gemv_int_n(t, groups, 2, K, qa, r0, M, c, ldc);
      return gemv_int_n(t, groups + 2, ng - 2, K, qa, r0, M, c + 2 * kGroup, ldc);
    }
    if (ng != 1 && ng != 2 && ng != kGemvIntGroups) fail("fast kernels: gemv_int_n of ", ng, " groups");
    const bool quad = with_qdecoder(t, groups[0], [&](auto dec0) {
      using D = decltype(dec0);
      D dec[kGemvIntGroups];
      for (int g = 0; g < kGemvIntGroups; ++g) dec[g] = D{groups[g < ng ? g : 0]};
      if (ng == kGemvIntGroups)
        return gemv_q_t<1, kGemvIntGroups>(dec, 0, nkb, nkb, qa.xq8.data() + r0 * K, K, qa.dx.data() + r0 * nkb,
                                           qa.xs.data() + r0 * nkb, qa.xs0.data() + r0 * nkb,
                                           qa.fx.data() + 2 * r0 * nkb, c, ldc, true);
      // Decode: one tile, all of K. More rows: tiles of at most 6 rows, split evenly (16 -> 6 +
      // 5 + 5), all of them over one chunk of K before the next, so the chunk is read from
      // memory once, by the first tile, whose stream prefetches run into the next chunk as
      // decode's do. (The next chunk asked for at once at each chunk's start made the 1.1B
      // model's 8-32-row prefill steps 1.06-1.28x slower on an Intel Xeon: the burst held the
      // compute back until its lines came.)
      if constexpr (D::kSub16 && !min16_of<D>())
        if (M > kSub16ChunksAbove) return sub16_chunks<D>(t, groups, ng, K, qa, r0, M, c, ldc);
      const int64_t n_tiles = (M + 5) / 6;
      const int64_t chunk = n_tiles == 1 ? nkb : kKC / kQBlock;
      for (int64_t kb0 = 0; kb0 < nkb; kb0 += chunk) {
        const int64_t kb1 = std::min(nkb, kb0 + chunk);
        for (int64_t tile = 0, m = 0; tile < n_tiles; ++tile) {
          const int64_t mr = M / n_tiles + (tile < M % n_tiles ? 1 : 0);
          const int8_t* x = qa.xq8.data() + (r0 + m) * K;
          const float* dx = qa.dx.data() + (r0 + m) * nkb;
          const int32_t* xs = qa.xs.data() + (r0 + m) * nkb;
          const int32_t* xs0 = qa.xs0.data() + (r0 + m) * nkb;
          const float* fx = qa.fx.data() + 2 * (r0 + m) * nkb;
          float* cm = c + m * ldc;
          const bool first = kb0 == 0;
          auto run = [&](auto ng_c) {
            constexpr int NG = decltype(ng_c)::value;
            switch (mr) {
              case 1: return gemv_q_t<1, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
              case 2: return gemv_q_t<2, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
              case 3: return gemv_q_t<3, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
              case 4: return gemv_q_t<4, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
              case 5: return gemv_q_t<5, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
              default: return gemv_q_t<6, NG>(dec, kb0, kb1, nkb, x, K, dx, xs, xs0, fx, cm, ldc, first);
            }
          };
          if (ng == 2) run(std::integral_constant<int, 2>{});
          else run(std::integral_constant<int, 1>{});
          m += mr;
        }
      }
    });
    if (!quad) fail("fast kernels: ", int(t), " is not an integer type");
  }

  // Q6_K (and the other sub16 types, not Q2_K) above kSub16ChunksAbove rows (to kFusedMaxMQuad): each K
  // chunk of the ng groups unpacked once (unpack_sub16, its blocks prefetched as the GEMV's
  // stream), then every 6-row tile from it (mk_sub16: the GEMM's sums, the same bits), where
  // gemv_q_t's tiles decoded the chunk once each.
  // Measured (5632 x 2048, alternated): 32 rows 0.92-0.94x the time from memory, 0.79-0.84x in
  // cache; at 7-16 rows 1.1-1.6x slower from memory (the stream waits while the tiles compute),
  // so those keep gemv_q_t.
  // Q3_K's chunks are Q8_0's form (gemm_type: unpack_sub16<true>, then Q8_0's micro-kernels mk_q).
  // From memory (5632 x 2048, Zen 5) they too were slower than the tiles at 7-16 rows: 1.37x
  // the time at 7, 1.25x at 8, 1.08x at 16.
  static constexpr int64_t kSub16ChunksAbove = 16;
  template <class D>
  static void sub16_chunks(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const QAct& qa, int64_t r0,
                           int64_t M, float* c, int64_t ldc) {
    static_assert(!min16_of<D>(), "Q2_K's min term has no place in the sub16 chunks");
    const bool q8_form = gemm_type(t) == GGMLType::Q8_0;
    constexpr int64_t kChunkBlocks = kKC / kQBlock;
    alignas(64) uint8_t V[2][kChunkBlocks * kSub16Bytes];
    alignas(64) float S1[2][kChunkBlocks * kGroup], S2[kChunkBlocks * kGroup];
    const int64_t nkb = K / kQBlock, gbytes = nkb * D::kBytesPer32;
    int64_t past[2];
    if (ng == 2) past_end<2>(groups, gbytes, past);
    else past_end<1>(groups, gbytes, past);
    const uint8_t* v[2] = {V[0], V[1]};
    const float* s1[2] = {S1[0], S1[1]};
    const int64_t n_tiles = (M + 5) / 6;
    for (int64_t kb0 = 0; kb0 < nkb; kb0 += kChunkBlocks) {
      const int64_t kb1 = std::min(nkb, kb0 + kChunkBlocks), len = (kb1 - kb0) * kQBlock;
      for (int g = 0; g < ng; ++g) {
        if (kb0 == 0) prefetch_start(groups[g], D::kBytesPer32);
        for (int64_t kb = kb0; kb < kb1; ++kb) prefetch_block(groups[g], kb, D::kBytesPer32, gbytes, past[g]);
        if (q8_form) unpack_sub16<true>(D{groups[g]}, kb0 * kQBlock, len, reinterpret_cast<int16_t*>(V[g]), S1[g], S2);
        else unpack_sub16<false>(D{groups[g]}, kb0 * kQBlock, len, reinterpret_cast<int16_t*>(V[g]), S1[g], S2);
      }
      for (int64_t tile = 0, m = 0; tile < n_tiles; ++tile) {
        const int mr = int(M / n_tiles + (tile < M % n_tiles ? 1 : 0));
        IntRows x;
        for (int j = 0; j < mr; ++j) {
          const int64_t r = r0 + m + j;
          x.xq8[j] = qa.xq8.data() + r * K + kb0 * kQBlock;
          x.dx[j] = qa.dx.data() + r * nkb + kb0;
          x.xs[j] = qa.xs.data() + r * nkb + kb0;
          x.xs0[j] = qa.xs0.data() + r * nkb + kb0;
          x.fx[j] = qa.fx.data() + 2 * (r * nkb + kb0);
        }
        if (q8_form && ng == 2) mk_q<2>(mr, x, QDecQ8_0::kBias, v, s1, nullptr, nullptr, len, c + m * ldc, ldc, kb0 == 0);
        else if (q8_form) mk_q<1>(mr, x, QDecQ8_0::kBias, v, s1, nullptr, nullptr, len, c + m * ldc, ldc, kb0 == 0);
        else if (ng == 2) mk_sub16<2>(mr, x, D::kBias, v, s1, len, c + m * ldc, ldc, kb0 == 0);
        else mk_sub16<1>(mr, x, D::kBias, v, s1, len, c + m * ldc, ldc, kb0 == 0);
        m += mr;
      }
    }
  }

  // The GEMM's view of one K chunk: quad types (and Q2_K) as V = u8 [len / 32][8 quads][16
  // rows][4] (in the int16 scratch's bytes; the types in Q8_0's form, gemm_type, as u = v + 128:
  // the level types, Q5_0, Q3_K: unpack_sub16<true>), S1, S2 (len / 32, 16), Q2_K's min scales
  // after (q2k_min_scales); the other sub16 types as unpack_sub16 gives them.
  static void unpack_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V,
                         float* S1, float* S2) {
    if (is_sub16_type(t)) {
      with_qdecoder(t, group, [&](auto dec) {
        if constexpr (decltype(dec)::kSub16 && !min16_of<decltype(dec)>()) {
          if (gemm_type(t) == GGMLType::Q8_0) unpack_sub16<true>(dec, k0, len, V, S1, S2);
          else unpack_sub16<false>(dec, k0, len, V, S1, S2);
        }
      });
      return;
    }
    uint8_t* v = reinterpret_cast<uint8_t*>(V);
    const bool quad = with_qdecoder(t, group, [&](auto dec) {
      using D = decltype(dec);
      if constexpr (!D::kSub16 || min16_of<D>()) {  // (Q2_K's chunk: Q4_K's form, its mins after)
        for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
          dec.begin(k0 / kQBlock + kb);
          __m512 s1, s2 = _mm512_setzero_ps();
          dec.scales(s1, s2);
          _mm512_storeu_ps(S1 + 16 * kb, s1);
          _mm512_storeu_ps(S2 + 16 * kb, s2);
          if constexpr (min16_of<D>()) {
            __m512 b0, b1;
            dec.min_scales(b0, b1);
            _mm512_storeu_ps(q2k_min_scales(V, len) + 32 * kb, b0);
            _mm512_storeu_ps(q2k_min_scales(V, len) + 32 * kb + 16, b1);
          }
          for (int P = 0; P < 4; ++P) {
            __m512i w0, w1;
            dec.quads(P, w0, w1);
            if constexpr (q8_form_of<D>() && D::kBias != QDecQ8_0::kBias) {
              const __m512i rebias = _mm512_set1_epi8(char(QDecQ8_0::kBias - D::kBias));
              w0 = _mm512_add_epi8(w0, rebias);
              w1 = _mm512_add_epi8(w1, rebias);
            }
            _mm512_storeu_si512(v + kb * 512 + 128 * P, w0);
            _mm512_storeu_si512(v + kb * 512 + 128 * P + 64, w1);
          }
        }
      }
    });
    if (!quad) fail("fast kernels: ", int(t), " is not an integer type");
  }
  // A sub16 type's chunk. For mk_sub16 (kQ8 false; kSub16Bytes per 32-block of V, as Avx2Isa's):
  // [0, 512) its 8 quads as its decoder D gives them (quad 4h + t: k = 16h + 4t .. 16h + 4t + 3,
  // 16 rows x 4, u = v + D::kBias), [512, 640) int32 sc[2][16] (half h's scale of each row).
  // In Q8_0's form (kQ8: a type whose products v sc fit an int8, Q3_K: gemm_type): V = u8 [len
  // / 32][8 quads][16 rows][4], u = v sc + 128, the same exact I as the half blocks' sc_0 I_0 +
  // sc_1 I_1; per byte, from the decoder's u' = v + B (B <= 128, u' <= 255): vpmaddubsw of u'
  // with (sc, 0) and with (0, sc) gives the even and odd bytes' u' sc in 16-bit lanes (|u' sc|
  // <= 255 * 32: no saturation), plus 128 - B sc = u, whose low bytes go back in place. S1 =
  // its s1, S2 = 0.
  template <bool kQ8, class D>
  static void unpack_sub16(const D dec0, int64_t k0, int64_t len, int16_t* V, float* S1, float* S2) {
    static_assert(!min16_of<D>(), "Q2_K's min term has no place in the sub16 chunks");
    static_assert(!kQ8 || (D::kBias >= 0 && D::kBias <= 128), "Q8_0's form takes u = v + B, B <= 128");
    if constexpr (kQ8 && !q8_form_of<D>()) fail("fast kernels: Q8_0's form of a type whose products do not fit an int8");
    uint8_t* v = reinterpret_cast<uint8_t*>(V);
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      D dec = dec0;
      dec.begin(k0 / kQBlock + kb);
      __m512 s1, s2;
      dec.scales(s1, s2);
      _mm512_storeu_ps(S1 + 16 * kb, s1);
      _mm512_storeu_ps(S2 + 16 * kb, _mm512_setzero_ps());
      uint8_t* b = v + kb * (kQ8 ? 512 : kSub16Bytes);
      for (int h = 0; h < 2; ++h) {
        __m512i w[4];
        dec.quads(h, w);
        if constexpr (!kQ8) {
          for (int t = 0; t < 4; ++t) _mm512_storeu_si512(b + 64 * (4 * h + t), w[t]);
          _mm512_storeu_si512(b + 512 + 64 * h, dec.sc(h));
          continue;
        }
        const __m512i sc32 = dec.sc(h);  // (int32 lanes: row r's scale)
        const __m512i sc_b = _mm512_and_si512(sc32, _mm512_set1_epi32(0xFF));  // (sc's byte, from the sign-extended int32)
        const __m512i sc_even = _mm512_or_si512(sc_b, _mm512_slli_epi32(sc_b, 16));
        const __m512i sc_odd = _mm512_slli_epi16(sc_even, 8);
        const __m512i c32 = _mm512_sub_epi32(_mm512_set1_epi32(128), _mm512_mullo_epi32(sc32, _mm512_set1_epi32(D::kBias)));
        const __m512i c = _mm512_mask_blend_epi16(0xAAAAAAAA, c32, _mm512_slli_epi32(c32, 16));
        for (int t = 0; t < 4; ++t) {
          const __m512i even = _mm512_add_epi16(_mm512_maddubs_epi16(w[t], sc_even), c);
          const __m512i odd = _mm512_add_epi16(_mm512_maddubs_epi16(w[t], sc_odd), c);
          const __m512i u = _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even, _mm512_slli_epi16(odd, 8));
          _mm512_storeu_si512(b + 64 * (4 * h + t), u);
        }
      }
    }
  }

  // C (MR, ldc)[:, 16g : 16g + 16] (+)= MR activation rows x NG groups over one K chunk of
  // unpacked quads (unpack_int): per 32-block exact int32 sums I = sum u xq - bias * sum xq,
  // then y = fma(float(I), s1 * dx, y) [and y = fma(float(sum xq), s2 * dx, y) when S2, kMin;
  // Q2_K's min term from its min scales Mn when kMin16]; y starts at 0 when first, else from C.
  // (ScalarIsa::mk_int1's and gemv_q_t's sums.) kMin, kMin16: bias 0 (no subtraction of zero: 12
  // of ~170 ops a block at 6 x 2). (Q2_K's min term as one vpmaddwd m_0 X_0 + m_1 X_1 times
  // -dmin dx: 1.13-1.18x the time of these two fmas, 512 x 2048 x 2048.)
  template <int MR, int NG, bool kMin, bool kMin16 = false>
  static void mk_q_t(const IntRows& x, int bias, const uint8_t* const* V, const float* const* S1,
                     const float* const* S2, const float* const* Mn, int64_t len, float* c, int64_t ldc,
                     bool first) {
    __m512 y[MR][NG];
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g)
        y[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      __m512i a[MR][NG];
      for (int i = 0; i < MR; ++i)
        for (int g = 0; g < NG; ++g) a[i][g] = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        __m512i w[NG];
        for (int g = 0; g < NG; ++g) w[g] = ld(V[g] + kb * 512 + 64 * p);
        for (int i = 0; i < MR; ++i) {
          const __m512i xb = bcast4(x.xq8[i] + kb * kQBlock + 4 * p);
          for (int g = 0; g < NG; ++g) a[i][g] = _mm512_dpbusd_epi32(a[i][g], w[g], xb);
        }
      }
      for (int i = 0; i < MR; ++i) {
        const __m512 d = _mm512_set1_ps(x.dx[i][kb]);
        const __m512i bv = _mm512_set1_epi32(bias * x.xs[i][kb]);
        for (int g = 0; g < NG; ++g) {
          const __m512i I = kMin || kMin16 ? a[i][g] : _mm512_sub_epi32(a[i][g], bv);
          y[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(_mm512_loadu_ps(S1[g] + 16 * kb), d), y[i][g]);
          if constexpr (kMin16)
            y[i][g] = min16_term(_mm512_loadu_ps(Mn[g] + 32 * kb), _mm512_loadu_ps(Mn[g] + 32 * kb + 16), x.fx[i] + 2 * kb,
                                 y[i][g]);
          else if constexpr (kMin)
            y[i][g] = _mm512_fmadd_ps(_mm512_set1_ps(float(x.xs[i][kb])),
                                      _mm512_mul_ps(_mm512_loadu_ps(S2[g] + 16 * kb), d), y[i][g]);
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, y[i][g]);
  }
  // (S2 given: a K type's chunk; Mn: Q2_K's; bias 0.)
  template <int NG, bool kMin, bool kMin16 = false>
  static void mk_q_m(int mr, const IntRows& x, int bias, const uint8_t* const* V, const float* const* S1,
                     const float* const* S2, const float* const* Mn, int64_t len, float* c, int64_t ldc,
                     bool first) {
    switch (mr) {
      case 1: return mk_q_t<1, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 2: return mk_q_t<2, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 3: return mk_q_t<3, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 4: return mk_q_t<4, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      case 5: return mk_q_t<5, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
      default: return mk_q_t<6, NG, kMin, kMin16>(x, bias, V, S1, S2, Mn, len, c, ldc, first);
    }
  }
  template <int NG>
  static void mk_q(int mr, const IntRows& x, int bias, const uint8_t* const* V, const float* const* S1,
                   const float* const* S2, const float* const* Mn, int64_t len, float* c, int64_t ldc,
                   bool first) {
    if ((S2 || Mn) && bias != 0) fail("fast kernels: a chunk with a min term and a bias");
    if (S2) return mk_q_m<NG, true>(mr, x, 0, V, S1, S2, Mn, len, c, ldc, first);
    if (Mn) return mk_q_m<NG, false, true>(mr, x, 0, V, S1, S2, Mn, len, c, ldc, first);
    mk_q_m<NG, false>(mr, x, bias, V, S1, S2, Mn, len, c, ldc, first);
  }
  // A sub16 type's unpacked chunk (unpack_sub16): C (MR, ldc)[:, 16g : 16g + 16] (+)= MR rows x
  // NG groups; per 32-block and half h a chain of vpdpbusd from -bias X_h (X_0 = xs0, X_1 = xs -
  // xs0), then I = sc_0 I_0 + sc_1 I_1 (exact int32: |I_h| <= 16 * 128 * 127, |sc| <= 128) and
  // y = fma(float(I), s1 * dx, y): gemv_q_t's sums. (Three accumulators per row and group: at 6
  // rows x 2 groups the compiler spills a few; two tiles of 3 rows, which do not spill, ran
  // 0.85-0.95x as fast.)
  template <int MR, int NG>
  static void mk_sub16_t(const IntRows& x, int bias, const uint8_t* const* V, const float* const* S1, int64_t len,
                         float* c, int64_t ldc, bool first) {
    __m512 y[MR][NG];
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g)
        y[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
    for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
      __m512i I[MR][NG];
      for (int h = 0; h < 2; ++h) {
        __m512i a[MR][NG];
        for (int i = 0; i < MR; ++i) {
          const int32_t X0 = x.xs0[i][kb], X = h == 0 ? X0 : x.xs[i][kb] - X0;
          for (int g = 0; g < NG; ++g) a[i][g] = _mm512_set1_epi32(-bias * X);
        }
        for (int t = 0; t < 4; ++t) {
          __m512i w[NG];
          for (int g = 0; g < NG; ++g) w[g] = ld(V[g] + kb * kSub16Bytes + 64 * (4 * h + t));
          for (int i = 0; i < MR; ++i) {
            const __m512i xb = bcast4(x.xq8[i] + kb * kQBlock + 16 * h + 4 * t);
            for (int g = 0; g < NG; ++g) a[i][g] = _mm512_dpbusd_epi32(a[i][g], w[g], xb);
          }
        }
        for (int g = 0; g < NG; ++g) {
          const __m512i sc = ld(V[g] + kb * kSub16Bytes + 512 + 64 * h);
          for (int i = 0; i < MR; ++i) {
            const __m512i p = _mm512_mullo_epi32(a[i][g], sc);
            I[i][g] = h == 0 ? p : _mm512_add_epi32(I[i][g], p);
          }
        }
      }
      for (int i = 0; i < MR; ++i) {
        const __m512 d = _mm512_set1_ps(x.dx[i][kb]);
        for (int g = 0; g < NG; ++g)
          y[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[i][g]), _mm512_mul_ps(_mm512_loadu_ps(S1[g] + 16 * kb), d), y[i][g]);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, y[i][g]);
  }
  template <int NG>
  static void mk_sub16(int mr, const IntRows& x, int bias, const uint8_t* const* V, const float* const* S1,
                       int64_t len, float* c, int64_t ldc, bool first) {
    switch (mr) {
      case 1: return mk_sub16_t<1, NG>(x, bias, V, S1, len, c, ldc, first);
      case 2: return mk_sub16_t<2, NG>(x, bias, V, S1, len, c, ldc, first);
      case 3: return mk_sub16_t<3, NG>(x, bias, V, S1, len, c, ldc, first);
      case 4: return mk_sub16_t<4, NG>(x, bias, V, S1, len, c, ldc, first);
      case 5: return mk_sub16_t<5, NG>(x, bias, V, S1, len, c, ldc, first);
      default: return mk_sub16_t<6, NG>(x, bias, V, S1, len, c, ldc, first);
    }
  }
  static void mk_int(int mr, const IntRows& x, GGMLType t, const int16_t* const* V,
                     const float* const* S1, const float* const* S2, int ng, int64_t len, float* c,
                     int64_t ldc, bool first) {
    t = gemm_type(t);  // (the unpacked chunk's form: the level types' is Q8_0's, its bias and signs)
    const uint8_t* v[2] = {reinterpret_cast<const uint8_t*>(V[0]),
                           reinterpret_cast<const uint8_t*>(ng > 1 ? V[1] : V[0])};
    if (is_sub16_type(t)) {
      const int bias = t == GGMLType::Q6_K ? QDecQ6_K::kBias : QDecLevels16<GGMLType::IQ2_XS>::kBias;
      if (ng == 2) return mk_sub16<2>(mr, x, bias, v, S1, len, c, ldc, first);
      return mk_sub16<1>(mr, x, bias, v, S1, len, c, ldc, first);
    }
    const int bias = t == GGMLType::Q8_0 ? QDecQ8_0::kBias : t == GGMLType::Q4_0 ? QDecQ4_0::kBias : 0;
    const float* s2[2] = {S2[0], ng > 1 ? S2[1] : S2[0]};
    const float* const* s2p = has_min_term(t) ? s2 : nullptr;
    const float* mn[2] = {nullptr, nullptr};
    if (has_min16(t)) mn[0] = q2k_min_scales(V[0], len), mn[1] = q2k_min_scales(V[ng > 1 ? 1 : 0], len);
    const float* const* mnp = has_min16(t) ? mn : nullptr;
    if (ng == 2) return mk_q<2>(mr, x, bias, v, S1, s2p, mnp, len, c, ldc, first);
    mk_q<1>(mr, x, bias, v, S1, s2p, mnp, len, c, ldc, first);
  }
};

}  // namespace
}  // namespace ft::cpu
