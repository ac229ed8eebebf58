// AVX-512 (F/BW/VL/DQ + VNNI) instantiation of the fast-kernel drivers (isa_avx512.h). Compiled
// for those extensions whatever the build flags; only called after cpu_supports(Avx512).
// Standard headers come first so their inline functions are not compiled for AVX-512 here.
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

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"
#include "kernels/cpu/isa_avx512.h"

namespace ft::cpu {

const IsaKernels& avx512_kernels() { return make_table<Avx512Isa>("avx512"); }

}  // namespace ft::cpu
