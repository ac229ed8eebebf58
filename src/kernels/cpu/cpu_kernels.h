// Internal interface of the fast CPU kernels: one table of entry points per instruction set
// (avx2.cpp, scalar.cpp), both instantiated from the same drivers (kernels_impl.h), chosen at
// run time by fast_backend.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "gguf/ggml_types.h"
#include "kernels/cpu/packed.h"
#include "kernels/kernels.h"

namespace ft::cpu {

// One weight matrix of a GEMM and where its result goes: Y (M, ldy)[:, 0:n_rows].
struct GemmSeg {
  GGMLType type = GGMLType::F32;
  const uint8_t* data = nullptr;
  uint64_t row_bytes = 0;  // packed: bytes per group of kGroup rows (packed.h)
  bool packed = false;     // data in the panel layout of packed.h, else GGUF rows
  int64_t n_rows = 0;
  float* Y = nullptr;
  int64_t ldy = 0;
  const float* bias = nullptr;  // (n_rows,) or null
  const float* rope_cs = nullptr;  // Store: RoPE rows after the bias (Backend::MatmulTarget)
  int32_t rope_head_dim = 0, rope_n_rot = 0;
  LoraDelta lora = {};  // added to X W^T before the epilogue (B packed, F32/F16/BF16, rank <= kKC)
};

enum class Epilogue {
  Store,   // Y = X W^T (+ bias)
  Add,     // Y += X W^T
  SwiGLU,  // two segments gate, up: Y_gate = silu(X Wg^T) * (X Wu^T)
  GeGLU,   // the same with gelu_tanh (rowwise.h) for silu
};

// The int8-quantized activations of one GEMM call (integer path, quantize_activations),
// owned by the backend (sized by Backend::reserve, grown on demand if a call is larger).
struct QAct {
  std::vector<int16_t> xq;  // (M, K)
  std::vector<int8_t> xq8;  // (M, K): the same values as int8, for ISAs with int8 dot products
  std::vector<float> dx;    // (M, K / 32)
  std::vector<int32_t> xs;  // (M, K / 32): each block's sum of xq
  std::vector<int32_t> xs0;  // (M, K / 32): the sum of its first 16 (Q6_K's half-block scales)
  std::vector<float> fx;     // (M, K / 32, 2): dx times each half's sum, dx * float(X_h) (Q2_K's mins)
  // BF16 weights' activations (Drivers::round_bf16): X rounded to bf16, K padded to even (Kp)
  // with a zero, as f32 (xbf, (M, Kp)), the same with each pair's two swapped (xbs), and as
  // pairs (xbp, (M, Kp / 2): k = 2p low, 2p + 1 high).
  std::vector<float> xbf, xbs;
  std::vector<uint32_t> xbp;
  void reserve(int64_t max_rows, int64_t max_k) {
    const size_t n = size_t(max_rows * max_k), nb = n / 32;
    if (xq.size() < n) { xq.resize(n); xq8.resize(n); }
    if (dx.size() < nb) { dx.resize(nb); xs.resize(nb); xs0.resize(nb); fx.resize(2 * nb); }
  }
  void reserve_bf16(int64_t rows, int64_t K) {
    const size_t n = size_t(rows * (K + (K & 1)));
    if (xbf.size() < n) { xbf.resize(n); xbs.resize(n); xbp.resize(n / 2); }
  }
};

// Backend::matmul_runs left for the next GEMM to run (fuse): target i's rows of X times
// segs[i] (its A), Y, ldy and scale from t[i].
struct ShrinkJob {
  const float* X;
  int64_t K;
  const RunTarget* t;
  const GemmSeg* segs;
  int n;
};

struct IsaKernels {
  const char* name;
  // W (n_rows, K) in GGUF rows -> this ISA's panel layout (packed.h; same size for every ISA).
  void (*pack)(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
               uint8_t* out);
  // X (M, K) row-major @ each segment's W (n_rows, K)^T. All segments share K (types may differ).
  // qa: scratch for the integer path's quantized X.
  // shrink (or null): a matmul_runs job whose Y the segments' LoRA deltas read, run first
  // (inside the same parallel pass where it can).
  void (*gemm)(const float* X, int64_t M, int64_t K, const GemmSeg* segs, int n_segs, Epilogue e,
               QAct& qa, int threads, const ShrinkJob* shrink);
  // Sizes each worker thread's scratch for up to max_rows activation rows.
  void (*reserve)(int64_t max_rows, int threads);
  // Backend::matmul_runs: target i's rows of X times segs[i] (its A: a float type, or a
  // quantized one on the integer path; Y, ldy and scale from t[i]), all targets' work items in
  // one parallel pass. qa: X's rows quantized where quantized, else scratch they are quantized
  // into (where an A is quantized).
  void (*gemm_runs)(const float* X, int64_t K, const RunTarget* t, const GemmSeg* segs, int n, int threads,
                    QAct& qa, bool quantized);
};

// Instruction-set levels of the fast kernels, slowest first. Scalar: portable C++. Avx2: AVX2 +
// FMA + F16C. AvxVnni: Avx2 + AVX-VNNI (256-bit vpdpbusd), e.g. Alder Lake, Zen 5. Avx512:
// Avx2 + AVX-512 F/BW/VL/DQ + VNNI (512-bit vpdpbusd), e.g. Ice Lake, Zen 4 and later.
// Avx512Bf16: Avx512 + AVX512_BF16 (BF16 weights on vdpbf16ps), Zen 4 and later, Cooper Lake. Amx:
// Avx512 + AMX-TILE/INT8 (the quantized GEMM's 16-row tiles on tdpbsud), Sapphire Rapids and
// later. Every level includes Avx2, but not each other: Ice Lake has Avx512 without AvxVnni,
// Alder Lake the reverse, so a CPU's set of levels is not a prefix of this list (cpu_supports).
enum class IsaLevel : int { Scalar, Avx2, AvxVnni, Avx512, Avx512Bf16, Amx };
constexpr IsaLevel kIsaLevels[] = {IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::AvxVnni, IsaLevel::Avx512,
                                   IsaLevel::Avx512Bf16, IsaLevel::Amx};
const char* isa_name(IsaLevel l);
// An AMX tile configuration (ldtilecfg's 64 bytes; palette 1): tile t has rows[t] rows of
// colsb[t] bytes. Per thread: amx.cpp's kernels load theirs once per thread, and bench peak's
// probe puts back the one it found.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);
// Whether this CPU and OS support a level (cpuid; the OS saves the vector state).
bool cpu_supports(IsaLevel l);
// Whether this build has a level's kernel table (CMake's FT_KERNEL_ISAS), and whether it can run
// here (built and cpu_supports).
bool kernels_built(IsaLevel l);
bool isa_usable(IsaLevel l);
// The fastest usable level (the last one in kIsaLevels).
IsaLevel cpu_best_isa();
// l's table; only for a usable l.
const IsaKernels& kernels_for(IsaLevel l);

// Memory that kernels stream front to back (packed weights, the bandwidth probe), for
// std::free: on 4 KiB pages every page is a TLB miss and a restart of the hardware prefetcher
// (decode measured 2.6x slower on one thread), so blocks of 2 MiB or more are 2 MiB-aligned and
// advised to be backed by transparent huge pages (THP mode "madvise" or "always"). Null when out
// of memory. (Smaller weights share such blocks: CpuFastBackend's arena.)
constexpr uint64_t kHugePage = uint64_t(2) << 20;
uint8_t* alloc_streamed(uint64_t bytes);

const IsaKernels& scalar_kernels();

// Flash attention over the KV cache as stored (attention_impl.h), per level; the contract of
// Backend::attention.
using AttentionFn = void (*)(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                             const AttentionShape& s, float* out, int threads);
AttentionFn attention_for(IsaLevel l);
AttentionFn scalar_attention();
AttentionFn avx2_attention();
AttentionFn avx512_attention();
// ft::exp_shifted per level (every level but Scalar has AVX2: exp256; the same bits).
using ExpShiftedFn = void (*)(const float* x, int64_t n, float shift, float div, float* out);
ExpShiftedFn exp_shifted_for(IsaLevel l);
void avx2_exp_shifted(const float* x, int64_t n, float shift, float div, float* out);
const IsaKernels& avx2_kernels();
const IsaKernels& avx_vnni_kernels();
const IsaKernels& avx512_kernels();
const IsaKernels& avx512_bf16_kernels();
const IsaKernels& amx_kernels();

// K is processed in chunks of kKC (a multiple of every block size): one chunk of a group's
// weights, unpacked to f32, is what the micro-kernel streams (kKC * kGroup floats).
constexpr int64_t kKC = 256;

}  // namespace ft::cpu
