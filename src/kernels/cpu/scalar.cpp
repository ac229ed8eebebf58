// Portable scalar instantiation of the fast-kernel drivers (the fallback when the CPU lacks
// AVX2/FMA, and a second implementation every kernel test runs). It emulates the AVX2 path's
// 8-lane summation order with plain arrays.
#include <cmath>

#include "kernels/cpu/kernels_impl.h"

namespace ft::cpu {
namespace {

struct ScalarIsa {
  template <int MR, int NR>
  static void tile(const float* const* x, const float* const* w, int64_t len, float* out) {
    float acc[MR][NR][8] = {};
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j)
          for (int l = 0; l < 8; ++l) acc[i][j][l] = std::fma(x[i][k + l], w[j][k + l], acc[i][j][l]);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        const float* a = acc[i][j];
        float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (int64_t t = k; t < len; ++t) s = std::fma(x[i][t], w[j][t], s);
        out[i * NR + j] = s;
      }
  }
  static void dequant(GGMLType t, const uint8_t* src, int64_t len, float* dst) {
    dequantize_row(t, src, dst, len);
  }
  static float exp1(float x) { return std::exp(x); }
  static void prefetch(const uint8_t*, int64_t) {}
  static bool dot_rows(GGMLType, const uint8_t* const*, int, const float*, int64_t, float*) { return false; }
  // S[j] = exp(S[j] - m) for j < n (S = -inf gives 0); returns the sum.
  static float exp_row(float* S, int n, float m) {
    float sum = 0;
    for (int j = 0; j < n; ++j) {
      S[j] = std::exp(S[j] - m);
      sum += S[j];
    }
    return sum;
  }
  // Rows r < nr: O_r (hd,) = O_r * alpha_r + sum_{j < len} P[r*ldp + j] * v[j] (hd,).
  static void pv(int nr, float* O, const float* alpha, const float* P, int ldp,
                 const float* const* v, int len, int hd) {
    for (int r = 0; r < nr; ++r) {
      float* o = O + r * hd;
      for (int d = 0; d < hd; ++d) o[d] *= alpha[r];
      for (int j = 0; j < len; ++j) {
        const float p = P[r * ldp + j];
        for (int d = 0; d < hd; ++d) o[d] = std::fma(p, v[j][d], o[d]);
      }
    }
  }
};

}  // namespace

const IsaKernels& scalar_kernels() { return make_table<ScalarIsa>("scalar"); }

}  // namespace ft::cpu
