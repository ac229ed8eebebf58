// Portable scalar instantiation of the fast-kernel drivers (the fallback when the CPU lacks
// AVX2/FMA, and a second implementation every kernel test runs). It emulates the AVX2 path's
// 8-lane summation order with plain arrays.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/kernels_impl.h"

namespace ft::cpu {
namespace {

struct ScalarIsa {
  // C (mr, ldc)[:, 0:kGroup] (+)= rows x[i] (len,) @ w (len, kGroup): one fma chain per output,
  // k in order, starting from C unless first (then from 0).
  static void mk_rows(int mr, const float* const* x, const float* w, int64_t len, float* c,
                      int64_t ldc, bool first) {
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < kGroup; ++j) {
        float acc = first ? 0.0f : c[i * ldc + j];
        for (int64_t k = 0; k < len; ++k) acc = std::fma(x[i][k], w[k * kGroup + j], acc);
        c[i * ldc + j] = acc;
      }
  }
  static constexpr int64_t kFusedMaxM = 0;  // no in-register dequantizing GEMV here
  static void unpack(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp) {
    unpack_group(t, group, k0, len, Wp);
  }
  static void unpack_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V,
                         float* S1, float* S2) {
    unpack_group_int(t, group, k0, len, V, S1, S2);
  }
  static void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows,
                        int64_t K, uint8_t* out) {
    cpu::pack_rows(t, rows, row_bytes, n_rows, K, out);
  }
  static void mk_int(int mr, const IntRows& x, GGMLType t, const int16_t* const* V,
                     const float* const* S1, const float* const* S2, int ng, int64_t len, float* c,
                     int64_t ldc, bool first) {
    t = gemm_type(t);  // (the unpacked chunk's form: the level types' is Q8_0's, its bias and signs)
    for (int i = 0; i < ng; ++i)
      mk_int1(mr, x, V[i], S1[i], has_min_term(t) ? S2[i] : nullptr,
              has_min16(t) ? q2k_min_scales(V[i], len) : nullptr, len, c + i * kGroup, ldc, first);
  }
  // C (mr, ldc)[:, 0:16] (+)= the integer path over one K chunk of unpacked weights (packed.h's
  // pair layout): per 32-block the exact int32 sum I, then y = fma(I, s1 * dx, y) (and
  // fma(X, s2 * dx, y) where S2; fma(b_h, f_h, y) for h = 0, 1 where B, Q2_K's); y starts at 0
  // when first, else from C.
  static void mk_int1(int mr, const IntRows& x, const int16_t* V, const float* S1, const float* S2,
                      const float* B, int64_t len, float* c, int64_t ldc, bool first) {
    for (int i = 0; i < mr; ++i)
      for (int r = 0; r < kGroup; ++r) {
        float y = first ? 0.0f : c[i * ldc + r];
        for (int64_t kb = 0; kb < len / kQBlock; ++kb) {
          const int16_t* v = V + kb * kQBlock * kGroup;
          const int16_t* xq = x.xq[i] + kb * kQBlock;
          int32_t I = 0;
          for (int k = 0; k < kQBlock; ++k) I += int32_t(v[(k / 2) * 2 * kGroup + r * 2 + k % 2]) * xq[k];
          const float dx = x.dx[i][kb];
          y = std::fma(float(I), S1[kb * kGroup + r] * dx, y);
          if (S2) y = std::fma(float(x.xs[i][kb]), S2[kb * kGroup + r] * dx, y);
          for (int h = 0; B && h < 2; ++h) {
            float b;
            std::memcpy(&b, B + (2 * kb + h) * kGroup + r, 4);  // (floats in the int16 scratch)
            y = std::fma(b, x.fx[i][2 * kb + h], y);
          }
        }
        c[i * ldc + r] = y;
      }
  }
  static void dequant(GGMLType t, const uint8_t* src, int64_t len, float* dst) {
    dequantize_row(t, src, dst, len);
  }
  static void prefetch_bytes(const uint8_t*, int64_t) {}

  // BF16 weights (kernels_impl.h: bf16_item): the definition of vdpbf16ps's chain, with its
  // flushes explicit (the FMA may be a library call that MXCSR does not reach).
  static constexpr int kMRBf16 = 8;
  static float flush(float v) { return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.0f, v) : v; }
  static void mk_bf16(int mr, const float* const* xf, const uint32_t* const*, const uint8_t* const* w, int ng,
                      int64_t len, float* c, int64_t ldc, bool first) {
    for (int g = 0; g < ng; ++g)
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < kGroup; ++j) {
          auto wk = [&](int64_t k) {
            uint16_t b;
            std::memcpy(&b, w[g] + 32 * k + 2 * j, 2);
            const uint32_t u = uint32_t(b) << 16;
            float f;
            std::memcpy(&f, &u, 4);
            return flush(f);
          };
          float& out = c[i * ldc + g * kGroup + j];
          float y = first ? 0.0f : out;
          int64_t k = 0;
          for (; k + 1 < len; k += 2) {
            y = flush(std::fma(xf[i][k + 1], wk(k + 1), y));
            y = flush(std::fma(xf[i][k], wk(k), y));
          }
          if (k < len) y = flush(std::fma(xf[i][k], wk(k), flush(y + 0.0f)));
          out = y;
        }
  }
};

}  // namespace

const IsaKernels& scalar_kernels() { return make_table<ScalarIsa>("scalar"); }

}  // namespace ft::cpu
