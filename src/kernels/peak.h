// This machine's ceilings, measured: fp32 FMA throughput and memory read bandwidth. They are the
// denominators of the benchmarks' "% of peak" and "% of bandwidth".
#pragma once
#include <cstddef>

namespace ft {

// GFLOP/s (an FMA counts 2) of `threads` threads each running independent 8-wide FMA chains
// (AVX2+FMA when the CPU has them, else scalar FMA), for about `seconds`.
double measure_fma_peak_gflops(int threads, double seconds = 0.3);

// GB/s (1e9 bytes) of `threads` threads reading disjoint parts of a `bytes` buffer (far larger
// than the caches), best of `reps` passes.
double measure_read_bandwidth_gbs(int threads, size_t bytes = size_t(1) << 29, int reps = 5);

}  // namespace ft
