// AVX2 + FMA (+ F16C) + AVX-VNNI instantiation of the fast-kernel drivers: the AVX2 kernels with
// the integer path on 256-bit vpdpbusd (isa_avx2.h, FT_AVX_VNNI). Compiled for those extensions
// whatever the build flags; only called after cpu_supports(AvxVnni).
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

#pragma GCC target("avx2,fma,f16c,avxvnni")
#define FT_AVX_VNNI 1  // isa_avx2.h: int8 dot products on vpdpbusd
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"

namespace ft::cpu {

const IsaKernels& avx_vnni_kernels() { return make_table<Avx2Isa>("avx_vnni"); }

}  // namespace ft::cpu
