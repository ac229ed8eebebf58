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
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/thread_pool.h"  // (before the target pragma: its std headers stay baseline)

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"

namespace ft::cpu {

const IsaKernels& avx2_kernels() { return make_table<Avx2Isa>("avx2"); }

}  // namespace ft::cpu
