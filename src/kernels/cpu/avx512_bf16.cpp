// AVX-512 + AVX512_BF16 instantiation of the fast-kernel drivers (Zen 4 and later, Cooper Lake,
// Sapphire Rapids): the avx512 kernels, with BF16 weights on vdpbf16ps (isa_avx512_bf16.h: 32
// bf16 products per instruction, where 512-bit FMA gives 16). Compiled for those extensions
// whatever the build flags; only called after cpu_supports(Avx512Bf16).
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

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"
#include "kernels/cpu/isa_avx512.h"
#include "kernels/cpu/isa_avx512_bf16.h"

namespace ft::cpu {

const IsaKernels& avx512_bf16_kernels() { return make_table<Avx512Bf16Isa>("avx512_bf16"); }

}  // namespace ft::cpu
