#pragma once
// The x86 vector features the kernels choose between, read once from cpuid, each one only where
// the OS also saves its register state (XCR0 through xgetbv). Plain cpuid rather than
// __builtin_cpu_supports: clang 14 (the fuzz build's compiler) knows neither "f16c" nor "avxvnni"
// there. Compiled for the baseline x86-64: it runs on every CPU to say what it has.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>

namespace ft {

struct CpuFeatures {
  bool avx = false, fma = false, f16c = false, avx2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false;
  bool avxvnni = false;
  bool avx512bf16 = false;  // vdpbf16ps and the conversions (CPUID 7.1 EAX bit 5)
  bool amx_int8 = false;  // AMX-TILE + AMX-INT8, with the tile state saved by the OS (XCR0 17, 18)
};

inline CpuFeatures read_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  if (!osxsave) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6u) == 0x6u;     // SSE and AVX state
  const bool zmm_state = (xcr0_lo & 0xE6u) == 0xE6u;   // + opmask, ZMM0-15 high halves, ZMM16-31
  f.avx = ymm_state && (c & (1u << 28));
  f.fma = f.avx && (c & (1u << 12));
  f.f16c = f.avx && (c & (1u << 29));
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = f.avx && (b & (1u << 5));
  f.avx512f = zmm_state && (b & (1u << 16));
  f.avx512dq = f.avx512f && (b & (1u << 17));
  f.avx512bw = f.avx512f && (b & (1u << 30));
  f.avx512vl = f.avx512f && (b & (1u << 31));
  f.avx512vnni = f.avx512f && (c & (1u << 11));
  const bool tile_state = (xcr0_lo & 0x60000u) == 0x60000u;  // XTILECFG and XTILEDATA
  f.amx_int8 = tile_state && (d & (1u << 24)) && (d & (1u << 25));
  const unsigned max_sub7 = a;
  if (max_sub7 >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = f.avx2 && (a & (1u << 4));
    f.avx512bf16 = f.avx512f && (a & (1u << 5));
  }
#endif
  return f;
}

// This CPU's features (read on first use).
inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_cpu_features();
  return f;
}

}  // namespace ft
