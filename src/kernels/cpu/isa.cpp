// Which instruction-set level this CPU runs (core/cpu_features.h: cpuid, and whether the OS saves
// the AVX / AVX-512 register state), and the kernel table of each.
#include "kernels/cpu/cpu_kernels.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>

#include "core/cpu_features.h"
#include "core/mapped_memory.h"
#include "kernels/cpu/rowwise.h"

namespace ft::cpu {

const char* isa_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::Scalar: return "scalar";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::AvxVnni: return "avx_vnni";
    case IsaLevel::Avx512: return "avx512";
    case IsaLevel::Avx512Bf16: return "avx512_bf16";
    case IsaLevel::Amx: return "amx";
  }
  return "?";
}

namespace {
// Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, once per
// process; its threads share it): without it the first tile instruction is a SIGILL.
bool tile_state_granted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool granted = [] {
    constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
    unsigned long bits = 0;
    return syscall(SYS_arch_prctl, kArchGetXcompPerm, &bits) == 0 && (bits & (1ul << kXfeatureXtiledata));
  }();
  return granted;
#else
  return false;
#endif
}
}  // namespace

bool cpu_supports(IsaLevel l) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  switch (l) {
    case IsaLevel::Scalar: return true;
    case IsaLevel::Avx2: return avx2;
    case IsaLevel::AvxVnni: return avx2 && f.avxvnni;
    case IsaLevel::Avx512: return avx512;
    case IsaLevel::Avx512Bf16: return avx512 && f.avx512bf16;
    case IsaLevel::Amx: return avx512 && f.avx512bf16 && f.amx_int8 && tile_state_granted();
  }
  return false;
}

// FT_NO_KERNELS_<LEVEL>: that level's table is not built (CMake's FT_KERNEL_ISAS).
bool kernels_built(IsaLevel l) {
  switch (l) {
#ifdef FT_NO_KERNELS_AVX_VNNI
    case IsaLevel::AvxVnni: return false;
#endif
#ifdef FT_NO_KERNELS_AVX512
    case IsaLevel::Avx512: return false;
#endif
#ifdef FT_NO_KERNELS_AVX512_BF16
    case IsaLevel::Avx512Bf16: return false;
#endif
#ifdef FT_NO_KERNELS_AMX
    case IsaLevel::Amx: return false;
#endif
    default: return true;
  }
}

bool isa_usable(IsaLevel l) { return kernels_built(l) && cpu_supports(l); }

IsaLevel cpu_best_isa() {
  IsaLevel best = IsaLevel::Scalar;
  for (IsaLevel l : kIsaLevels)
    if (isa_usable(l)) best = l;
  return best;
}

const IsaKernels& kernels_for(IsaLevel l) {
  switch (l) {
#ifndef FT_NO_KERNELS_AVX512
    case IsaLevel::Avx512: return avx512_kernels();
#endif
#ifndef FT_NO_KERNELS_AVX512_BF16
    case IsaLevel::Avx512Bf16: return avx512_bf16_kernels();
#endif
#ifndef FT_NO_KERNELS_AMX
    case IsaLevel::Amx: return amx_kernels();
#endif
#ifndef FT_NO_KERNELS_AVX_VNNI
    case IsaLevel::AvxVnni: return avx_vnni_kernels();
#endif
    case IsaLevel::Avx2: return avx2_kernels();
    default: break;
  }
  return scalar_kernels();
}

AttentionFn attention_for(IsaLevel l) {
  switch (l) {
    case IsaLevel::Amx:  // (the tiles serve only the quantized GEMM)
    case IsaLevel::Avx512Bf16:  // (vdpbf16ps serves only BF16 weights)
    case IsaLevel::Avx512: return avx512_attention();
    case IsaLevel::AvxVnni:  // (the AVX2 attention: its int8 Q.K is a small part of the step)
    case IsaLevel::Avx2: return avx2_attention();
    case IsaLevel::Scalar: break;
  }
  return scalar_attention();
}

ExpShiftedFn exp_shifted_for(IsaLevel l) {
  return l == IsaLevel::Scalar ? &rowwise::exp_shifted : &avx2_exp_shifted;
}

uint8_t* alloc_streamed(uint64_t bytes) {
  const uint64_t align = bytes >= kHugePage ? kHugePage : 64, size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(size_t(align), size_t(size));
#ifdef MADV_HUGEPAGE
  if (p && align == kHugePage && huge_pages_wanted()) madvise(p, size_t(size), MADV_HUGEPAGE);  // (advice)
#endif
  return static_cast<uint8_t*>(p);
}

}  // namespace ft::cpu

namespace ft {

void exp_shifted(const float* x, int64_t n, float shift, float div, float* out) {
  static const cpu::ExpShiftedFn f = cpu::exp_shifted_for(cpu::cpu_best_isa());  // (the same bits on each)
  f(x, n, shift, div, out);
}

}  // namespace ft
