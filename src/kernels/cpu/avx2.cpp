// AVX2 + FMA (+ F16C) instantiation of the fast-kernel drivers. Compiled for those extensions
// whatever the build flags; only called after cpu_supports(Avx2).
// Standard headers come first so their inline functions are not compiled for AVX2 here.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/cpu_kernels.h"  // (before the target pragma, as below: its inline functions stay baseline)
#include "kernels/cpu/thread_pool.h"  // (before the target pragma: its std headers stay baseline)

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"

namespace ft::cpu {

const IsaKernels& avx2_kernels() { return make_table<Avx2Isa>("avx2"); }

void avx2_exp_shifted(const float* x, int64_t n, float shift, float div, float* out) {
  const __m256 s = _mm256_set1_ps(shift), d = _mm256_set1_ps(div);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, exp256(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), s), d)));
  rowwise::exp_shifted(x + i, n - i, shift, div, out + i);
}

}  // namespace ft::cpu
