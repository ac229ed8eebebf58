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
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -W(maybe-)uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

// 12 named accumulators (an array would live in memory, loaded and stored every iteration).
#define FT_ACC12(T, init)                                                                      \
  T a0 = init(0), a1 = init(1), a2 = init(2), a3 = init(3), a4 = init(4), a5 = init(5),       \
    a6 = init(6), a7 = init(7), a8 = init(8), a9 = init(9), a10 = init(10), a11 = init(11)
#define FT_EACH12(op) op(a0); op(a1); op(a2); op(a3); op(a4); op(a5); op(a6); op(a7); op(a8); op(a9); op(a10); op(a11)
#define FT_KEEP12(c)                                                                            \
  __asm__ volatile("" : "+" c(a0), "+" c(a1), "+" c(a2), "+" c(a3), "+" c(a4), "+" c(a5),       \
                   "+" c(a6), "+" c(a7), "+" c(a8), "+" c(a9), "+" c(a10), "+" c(a11))

// Integer dot products: 12 independent accumulators of u8 x s8 products summed into int32;
// `step(a)` is one instruction sequence on accumulator a (a as the s8 operand: a loop-invariant
// product would be hoisted out of the loop).
#define FT_INT8_LOOP_256(name, step)                                     \
  __attribute__((noipa)) int name(int64_t iters) {                       \
    FT_ACC12(__m256i, _mm256_set1_epi32);                                \
    const __m256i u = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);   \
    (void)one;                                                           \
    for (int64_t it = 0; it < iters; ++it) {                             \
      FT_EACH12(step);                                                   \
      FT_KEEP12("x");                                                    \
    }                                                                    \
    __m256i t = a0;                                                      \
    FT_EACH12(FT_ADD_TO_T);                                              \
    return _mm256_extract_epi32(t, 0);                                   \
  }
#define FT_ADD_TO_T(a) t = _mm256_add_epi32(t, a)
// AVX2: vpmaddubsw (32 products -> 16 int16 pair sums) + vpmaddwd by 1 (-> int32) + add.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define FT_STEP(a) a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), one))
FT_INT8_LOOP_256(int8_loop_avx2, FT_STEP)
#undef FT_STEP
#pragma GCC pop_options
// AVX-VNNI: 256-bit vpdpbusd (the same 32 products in one instruction).
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#define FT_STEP(a) a = _mm256_dpbusd_avx_epi32(a, u, a)
FT_INT8_LOOP_256(int8_loop_avx_vnni, FT_STEP)
#undef FT_STEP
#pragma GCC pop_options
#undef FT_ADD_TO_T
#undef FT_INT8_LOOP_256

// AVX-512: 512-bit FMA and vpdpbusd (64 products per instruction).
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
__attribute__((noipa)) float fma_loop_avx512(int64_t iters) {
#define FT_I(i) _mm512_set1_ps(0.01f * float(i))
  FT_ACC12(__m512, FT_I);
#undef FT_I
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#define FT_OP(a) a = _mm512_fmadd_ps(a, m, c)
    FT_EACH12(FT_OP);
#undef FT_OP
    FT_KEEP12("v");
  }
  __m512 t = a0;
#define FT_OP(a) t = _mm512_add_ps(t, a)
  FT_EACH12(FT_OP);
#undef FT_OP
  return _mm512_reduce_add_ps(t);
}
__attribute__((noipa)) int int8_loop_avx512(int64_t iters) {
#define FT_I(i) _mm512_set1_epi32(i)
  FT_ACC12(__m512i, FT_I);
#undef FT_I
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#define FT_OP(a) a = _mm512_dpbusd_epi32(a, u, s)
    FT_EACH12(FT_OP);
#undef FT_OP
    FT_KEEP12("v");
  }
  __m512i t = a0;
#define FT_OP(a) t = _mm512_add_epi32(t, a)
  FT_EACH12(FT_OP);
#undef FT_OP
  return _mm512_reduce_add_epi32(t);
}
#pragma GCC pop_options
// AVX512_BF16: vdpbf16ps (32 bf16 products per instruction, summed into 16 f32).
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
__attribute__((noipa)) float bf16_loop_avx512(int64_t iters) {
#define FT_I(i) _mm512_set1_ps(0.01f * float(i))
  FT_ACC12(__m512, FT_I);
#undef FT_I
  const __m512bh u = (__m512bh)_mm512_set1_epi32(0x3f803f80), v = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // (1, 1e-7)
  for (int64_t it = 0; it < iters; ++it) {
#define FT_OP(a) a = _mm512_dpbf16_ps(a, u, v)
    FT_EACH12(FT_OP);
#undef FT_OP
    FT_KEEP12("v");
  }
  __m512 t = a0;
#define FT_OP(a) t = _mm512_add_ps(t, a)
  FT_EACH12(FT_OP);
#undef FT_OP
  return _mm512_reduce_add_ps(t);
}
#pragma GCC pop_options
// AMX-INT8: 4 independent tdpbusd (16 x 16 int32 += 16 x 64 u8 . 64 x 16 s8: 16,384 products
// each) on 2 A and 2 B tiles. The thread's tile configuration (the kernels' own, amx.cpp) is
// saved and put back.
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
__attribute__((noipa)) int int8_loop_amx(int64_t iters) {
  cpu::TileConfig saved, c;
  _tile_storeconfig(&saved);
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
  alignas(64) static const int8_t ab[16 * 64] = {3};
  alignas(64) int32_t out[16 * 16];
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  if (saved.palette) _tile_loadconfig(&saved);
  else _tile_release();
  return out[0];
}
#pragma GCC pop_options
#undef FT_ACC12
#undef FT_EACH12
#undef FT_KEEP12

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

namespace {
// Ops per second (1e9) of `threads` threads each running loop(iters) (ops_per_iter each), for
// about `seconds`: calibrated on one thread, then all threads together, best of 3.
template <class Loop>
double measure_loop(int threads, double seconds, double ops_per_iter, Loop loop) {
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = clock_type::now();
    volatile auto sink = loop(iters);
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
      volatile auto sink = loop(iters);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, double(threads) * double(iters) * ops_per_iter / s / 1e9);
  }
  return best;
}

cpu::IsaLevel level_or_best(std::string_view isa) {
  if (isa.empty()) return cpu::cpu_best_isa();
  for (cpu::IsaLevel l : cpu::kIsaLevels)
    if (isa == cpu::isa_name(l) && cpu::cpu_supports(l)) return l;
  return cpu::IsaLevel::Scalar;
}
}  // namespace

double measure_fma_peak_gflops(int threads, double seconds, std::string_view isa) {
  switch (level_or_best(isa)) {
    case cpu::IsaLevel::Amx:
    case cpu::IsaLevel::Avx512Bf16:
    case cpu::IsaLevel::Avx512: return measure_loop(threads, seconds, 12 * 16 * 2, fma_loop_avx512);
    case cpu::IsaLevel::Avx2:
    case cpu::IsaLevel::AvxVnni: return measure_loop(threads, seconds, 12 * 8 * 2, fma_loop_avx2);
    case cpu::IsaLevel::Scalar: break;
  }
  return measure_loop(threads, seconds, 8 * 2, fma_loop_scalar);
}

double measure_bf16_peak_gflops(int threads, double seconds, std::string_view isa) {
  switch (level_or_best(isa)) {
    case cpu::IsaLevel::Amx:
    case cpu::IsaLevel::Avx512Bf16: return measure_loop(threads, seconds, 12 * 32 * 2, bf16_loop_avx512);
    default: return 0;
  }
}

double measure_int8_peak_gops(int threads, double seconds, std::string_view isa) {
  switch (level_or_best(isa)) {
    case cpu::IsaLevel::Amx: return measure_loop(threads, seconds, 4 * 16 * 16 * 64 * 2, int8_loop_amx);
    case cpu::IsaLevel::Avx512Bf16:
    case cpu::IsaLevel::Avx512: return measure_loop(threads, seconds, 12 * 64 * 2, int8_loop_avx512);
    case cpu::IsaLevel::AvxVnni: return measure_loop(threads, seconds, 12 * 32 * 2, int8_loop_avx_vnni);
    case cpu::IsaLevel::Avx2: return measure_loop(threads, seconds, 12 * 32 * 2, int8_loop_avx2);
    case cpu::IsaLevel::Scalar: break;
  }
  return 0;
}

double measure_read_bandwidth_gbs(int threads, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float) / 64 * 64;
  float* p = reinterpret_cast<float*>(cpu::alloc_streamed(n * sizeof(float)));  // as weights are
  if (!p) return 0;
  const bool avx2 = cpu::cpu_supports(cpu::IsaLevel::Avx2);
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
