// The AVX-512 + AVX512_BF16 inner kernels of the fast-kernel drivers (kernels_impl.h): Avx512Isa
// with BF16 weights on vdpbf16ps. Included only by translation units compiled for AVX512_BF16
// (avx512_bf16.cpp, amx.cpp), after isa_avx512.h, under the includer's `#pragma GCC target`.
//
// vdpbf16ps adds, per f32 lane, two products of bf16 pairs: y = fma(a1, b1, y), then y =
// fma(a0, b0, y) (each product exact, one rounding per add, denormal inputs and results flushed
// to zero). That is the numerics every ISA gives BF16 weights (kernels_impl.h: bf16_item), with
// the activations rounded to bf16 first, so this level is bit-identical to the others (tested
// against the scalar ISA like the rest; measured on AMD Zen 5: the instruction follows Intel's
// definition on 3.2M random lanes, denormals and NaNs included).
#pragma once

namespace ft::cpu {
namespace {

struct Avx512Bf16Isa : Avx512Isa {
  static constexpr bool kBf16Dot = true;  // (every M on vdpbf16ps)
  // A group's k and k + 1 (64 bytes: 16 rows' bf16 at k, then at k + 1) as vdpbf16ps's pairs:
  // lane r = (w[r][k], w[r][k + 1]). Word 2r + e of the result takes word 16e + r.
  static __m512i pair_index() {
    alignas(64) static constexpr uint16_t idx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_load_si512(idx);
  }
  static __m512bh bh(__m512i v) { return (__m512bh)v; }
  // C (MR, ldc)[:, 16g : 16g + 16] (+)= the pairs of [0, len) (xp[i][p]: row i's x[2p], x[2p + 1]).
  template <int MR, int NG>
  struct DotBf16 {
    static void run(const float* const*, const uint32_t* const* xp, const uint8_t* const* w, int64_t len, float* c,
                    int64_t ldc, bool first) {
      const __m512i idx = pair_index();
      __m512 acc[MR][NG];
      for (int i = 0; i < MR; ++i)
        for (int g = 0; g < NG; ++g) acc[i][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * g);
      const int64_t np = len / 2;
      int64_t past[NG];  // (as the emulation's)
      past_end<NG>(w, 32 * len, past);
      for (int64_t p = 0; p < np; ++p) {
        __m512i wp[NG];
        for (int g = 0; g < NG; ++g) {
          int64_t off = 64 * p + kPrefetch;
          if (off >= 32 * len) off += past[g];
          _mm_prefetch(reinterpret_cast<const char*>(w[g]) + off, _MM_HINT_T0);
          wp[g] = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(w[g] + 64 * p));
        }
        for (int i = 0; i < MR; ++i) {
          const __m512i xb = _mm512_set1_epi32(int32_t(xp[i][p]));
          for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_dpbf16_ps(acc[i][g], bh(wp[g]), bh(xb));
        }
      }
      if (len % 2) {  // (K odd: the last k pairs with a zero, in x as round_bf16 pads it and here)
        for (int g = 0; g < NG; ++g) {
          const __m512i wp = _mm512_permutexvar_epi16(
              idx, _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[g] + 64 * np))));
          for (int i = 0; i < MR; ++i)
            acc[i][g] = _mm512_dpbf16_ps(acc[i][g], bh(wp), bh(_mm512_set1_epi32(int32_t(xp[i][np]))));
        }
      }
      for (int i = 0; i < MR; ++i)
        for (int g = 0; g < NG; ++g) _mm512_storeu_ps(c + i * ldc + 16 * g, acc[i][g]);
    }
  };
  static void mk_bf16(int mr, const float* const* xf, const uint32_t* const* xp, const uint8_t* const* w, int ng,
                      int64_t len, float* c, int64_t ldc, bool first) {
    bf16_tile<DotBf16>(mr, ng, xf, xp, w, len, c, ldc, first);
  }
};

}  // namespace
}  // namespace ft::cpu
