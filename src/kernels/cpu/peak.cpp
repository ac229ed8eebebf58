// Peak FMA throughput and memory read bandwidth probes (see kernels/peak.h).
#include "kernels/peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

namespace ft {
namespace {

using clock_type = std::chrono::steady_clock;

// 12 independent accumulators x 8 lanes: enough chains to cover FMA latency x 2 ports.
__attribute__((noipa)) float fma_loop_avx2(int64_t iters) {
  __m256 a0 = _mm256_set1_ps(0.00f), a1 = _mm256_set1_ps(0.01f), a2 = _mm256_set1_ps(0.02f),
         a3 = _mm256_set1_ps(0.03f), a4 = _mm256_set1_ps(0.04f), a5 = _mm256_set1_ps(0.05f),
         a6 = _mm256_set1_ps(0.06f), a7 = _mm256_set1_ps(0.07f), a8 = _mm256_set1_ps(0.08f),
         a9 = _mm256_set1_ps(0.09f), a10 = _mm256_set1_ps(0.10f), a11 = _mm256_set1_ps(0.11f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c); a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c); a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c); a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c); a10 = _mm256_fmadd_ps(a10, m, c); a11 = _mm256_fmadd_ps(a11, m, c);
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                     "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  const __m256 s = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
      _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  return _mm256_cvtss_f32(s);
}

__attribute__((noipa)) double read_avx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  return _mm256_cvtss_f32(s);
}
#pragma GCC pop_options

__attribute__((noipa)) float fma_loop_scalar(int64_t iters) {
  float a[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int64_t it = 0; it < iters; ++it)
    for (float& x : a) x = x * 0.999999f + 1e-7f;
  return a[0] + a[7];
}

__attribute__((noipa)) double read_scalar(const float* p, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

double measure_fma_peak_gflops(int threads, double seconds) {
  const bool avx2 = cpu::cpu_has_avx2_fma();
  const double flops_per_iter = avx2 ? 12 * 8 * 2 : 8 * 2;
  // Calibrate on one thread, then run all threads together.
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = clock_type::now();
    volatile float sink = avx2 ? fma_loop_avx2(iters) : fma_loop_scalar(iters);
    (void)sink;
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (s > 0.02) {
      iters = int64_t(double(iters) * seconds / s) + 1;
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clock_type::now();
#pragma omp parallel num_threads(threads)
    {
      volatile float sink = avx2 ? fma_loop_avx2(iters) : fma_loop_scalar(iters);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, double(threads) * double(iters) * flops_per_iter / s / 1e9);
  }
  return best;
}

double measure_read_bandwidth_gbs(int threads, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  if (!p) return 0;
  const bool avx2 = cpu::cpu_has_avx2_fma();
  // First touch by the threads that read, so pages are where they are used.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < int64_t(n); ++i) p[i] = 1.0f;
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = clock_type::now();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t per = n / size_t(nt) / 32 * 32;
      const float* q = p + size_t(t) * per;
      volatile double sink = avx2 ? read_avx2(q, per) : read_scalar(q, per);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, double(n * sizeof(float)) / s / 1e9);
  }
  std::free(p);
  return best;
}

}  // namespace ft
