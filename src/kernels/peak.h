// This machine's ceilings, measured: fp32 FMA and int8 dot-product throughput per instruction
// set, and memory read bandwidth. They are the denominators of the benchmarks' "% of peak" and
// "% of bandwidth".
#pragma once
#include <cstddef>
#include <string_view>

namespace ft {

// GFLOP/s (an FMA counts 2) of `threads` threads each running 12 independent FMA chains of the
// widest vectors of `isa` ("avx512": 16 lanes, "avx2": 8, "scalar"; "" = the CPU's best), for
// about `seconds`.
double measure_fma_peak_gflops(int threads, double seconds = 0.3, std::string_view isa = "");
// GOP/s (a multiply-add counts 2) of u8 x s8 dot products summed into int32, as the integer path
// uses them: "avx512" vpdpbusd (64 per instruction), "avx2" vpmaddubsw + vpmaddwd + add (32);
// 0 for "scalar". "" = the CPU's best.
double measure_int8_peak_gops(int threads, double seconds = 0.3, std::string_view isa = "");

// GFLOP/s (a multiply-add counts 2) of bf16 pair products summed into f32 (vdpbf16ps, 32 per
// instruction), as BF16 weights use them on "avx512_bf16" and "amx"; 0 for other sets. "" = the
// CPU's best.
double measure_bf16_peak_gflops(int threads, double seconds = 0.3, std::string_view isa = "");

// GB/s (1e9 bytes) of `threads` threads reading disjoint parts of a `bytes` buffer (far larger
// than the caches), best of `reps` passes.
double measure_read_bandwidth_gbs(int threads, size_t bytes = size_t(1) << 29, int reps = 5);

}  // namespace ft
