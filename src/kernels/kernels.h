// The compute interface the model is written against. Kernels take raw pointers and shapes and
// know nothing of models. One Backend is chosen at start-up (make_backend); the model code never
// names a device. Row-major throughout; "(a,b)" = a rows of b contiguous elements.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/ggml_types.h"
#include "kernels/kv_layout.h"  // KVLayerView: the KV cache as attention reads it

namespace ft {

// A weight matrix W (n_rows, n_cols) in its storage type: n_rows outputs, n_cols inputs. Rows:
// as in GGUF, each row row_bytes(type, n_cols) bytes, rows contiguous. Packed: repacked by a
// backend's prepare() into that backend's own layout (only that backend can read it).
enum class WeightLayout : uint8_t { Rows, Packed };
struct WeightView {
  GGMLType type = GGMLType::F32;
  const void* data = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  WeightLayout layout = WeightLayout::Rows;
};

// The fast attention kernels' limits (attention_impl.h: registers and per-thread scratch sized
// for them); a model past them is refused at load (model_spec.cpp).
inline constexpr int kAttentionMaxHeadDim = 256;
inline constexpr int kAttentionMaxGroup = 64;  // query heads per KV head

struct AttentionShape {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;  // GQA: query head h reads KV head h / (n_heads / n_kv_heads)
  int32_t head_dim = 0;
  float scale = 0;  // usually 1/sqrt(head_dim)
  float softcap = 0;   // > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap)
  int32_t window = 0;  // > 0: a query with n_ctx sees only positions [n_ctx - window, n_ctx)
  // (n_heads,) or null: query head h's sink logit, one more term exp(sinks[h] - max) in its
  // softmax's denominator and none in its output (gpt-oss's learned attention sinks; unscaled).
  const float* sinks = nullptr;
};

// The gate activation of a gated FFN, A = act(X Wg^T) * (X Wu^T): SiLU (SwiGLU: llama, qwen2,
// phi3) or GELU in its tanh form (GeGLU: gemma2). SwigluOai (gpt-oss's experts) is not of that
// form: A = g' sigmoid(1.702 g') (u' + 1) with g' = min(g, 7), u' = clamp(u, -7, 7): Backend::glu
// computes it, the fast backend's ffn_glu (a fused epilogue) refuses it.
enum class GateAct { SiLU, GeluTanh, SwigluOai };

enum class RopeStyle { Interleaved /* llama: pairs (2i, 2i+1) */, Halves /* neox/qwen2: (i, i+d/2) */ };

struct RopeParams {
  RopeStyle style = RopeStyle::Interleaved;
  int32_t n_rot = 0;           // rotated dims per head (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;     // linear scaling: position * freq_scale
  const float* freq_factors = nullptr;  // optional (n_rot/2,): theta_i /= factor_i (Llama 3.1)
  float attn_factor = 1.0f;    // cos and sin * this (Phi-3 LongRoPE's attention factor)
};

// Low-rank deltas (LoRA, model/lora.h) as a GEMM's epilogue adds them: the batch's rows are cut
// into runs, each with its own B; for rows m in [m0, m0 + n):
//   C[m] (N,) += ya[m] (rank,) @ B (N, rank)^T      (one fma chain over rank in order, from 0)
// where C = X W^T is the projection's own product and ya the run's shrink (matmul_runs). The
// delta goes in before the bias, RoPE, gate activation or residual add that follow, so those
// stay fused. B is prepared (Backend::prepare) like any weight; rows in no run get nothing.
struct LoraRun {
  int64_t m0 = 0, n = 0;
  const float* ya = nullptr;  // row m0's (rank,) values; rows ldya apart
  int64_t ldya = 0;
  WeightView B = {};          // (N, rank)
};
struct LoraDelta {
  const LoraRun* runs = nullptr;
  int32_t n = 0;  // runs (0: no delta)
};

// One target of matmul_runs: Y (n, A.n_rows; rows ldy apart) = scale * X[m0 : m0 + n] @ A^T.
struct RunTarget {
  int64_t m0 = 0, n = 0;
  WeightView A = {};  // (N, K), a float type (F32/F16/BF16)
  float* Y = nullptr;
  int64_t ldy = 0;
  float scale = 1.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual int threads() const = 0;

  // Sizes per-thread scratch for up to max_rows activation rows, so the forward pass does not
  // allocate (Forward calls it at construction). Optional: kernels grow scratch on demand.
  virtual void reserve(int64_t max_rows) { (void)max_rows; }
  // A view of W in the layout this backend's matmuls read fastest (repacked once, at load; the
  // backend owns the copy and returns the same one for the same W). Default: W itself.
  virtual WeightView prepare(const WeightView& W) { return W; }
  // Pins the copies prepare() made in RAM (mlock: never paged out) and returns their bytes.
  // Throws ft::Error naming the cause (e.g. RLIMIT_MEMLOCK) when the OS refuses.
  virtual uint64_t lock_prepared() { return 0; }
  // Whether prepare() made a copy of the weight at src (the original is then never read).
  virtual bool has_copy_of(const void* src) const { (void)src; return false; }
  // Frees the copies prepare() made of the weight at src (a LoRA adapter being unloaded: its
  // memory, and so its address, may be reused). The views prepare() returned for it go invalid.
  // Thread-safe beside the forward pass and prepare() (an adapter is freed on whichever thread
  // drops it last: an unload's, a replaced one's last request's, a failed load's).
  virtual void release_prepared(const void* src) { (void)src; }

  // The layer the calls that follow belong to (-1: none: the embedding, the output head), set
  // by the forward pass before each layer's calls; the compute ignores it, observers (the
  // profiler) tag each call with it, with the role the weight's architecture table gives.
  virtual void set_layer(int32_t layer) { (void)layer; }

  // X (M, K) @ W(N, K)^T -> Y (M, N). K == W.n_cols.
  virtual void matmul(const float* X, int64_t M, const WeightView& W, float* Y) = 0;
  // Several weights over the same X in ONE pass (Q, K, V): for each target i,
  // Y_i (M, ld_i) [:, 0:N_i] = X (M, K) @ W_i(N_i, K)^T (+ bias_i (N_i,) when non-null).
  // All W_i have the same K (types may differ, e.g. Q4_K_M's Q6_K attn_v).
  // With rope_cs (a table from rope_table for the same M rows), Y_i's rows are then rotated
  // (interleaved-pair RoPE, heads of rope_head_dim) in the epilogue, never re-read.
  struct MatmulTarget {
    WeightView W;
    float* Y = nullptr;
    int64_t ldy = 0;
    const float* bias = nullptr;
    const float* rope_cs = nullptr;
    int32_t rope_head_dim = 0;
    int32_t rope_n_rot = 0;
    LoraDelta lora = {};  // added to X W_i^T before the bias and RoPE
  };
  virtual void matmul_multi(const float* X, int64_t M, const MatmulTarget* targets, int n) = 0;
  // Y (M, N) += X (M, K) @ W(N, K)^T (+ lora's delta): the residual add fused into the
  // projection's epilogue.
  virtual void matmul_add(const float* X, int64_t M, const WeightView& W, float* Y, const LoraDelta& lora = {}) = 0;
  // A (M, F) = act(X @ Wg(F, K)^T) * (X @ Wu(F, K)^T): gate and up computed tile by tile, the
  // intermediate never written out. Wg and Wu have the same shape. lora: null, or the deltas
  // of gate and up (2), each added before the activation.
  virtual void ffn_glu(const float* X, int64_t M, const WeightView& Wg, const WeightView& Wu, GateAct act,
                       float* A, const LoraDelta* lora = nullptr) = 0;
  // A segmented GEMM (LoRA's shrink, S-LoRA/Punica's SGMV): every target's rows of X (M, K)
  // times its own A, all in one pass (RunTarget). fuse: the backend may instead run it inside
  // the next GEMM call (matmul, matmul_multi, matmul_add, ffn_glu), before any LoRA delta
  // there reads the targets' Y; Y is then complete when that call returns, and X and the
  // targets must stay valid until then.
  virtual void matmul_runs(const float* X, int64_t K, const RunTarget* targets, int n, bool fuse = false) = 0;
  // Y (M, N) += bias (N,) per row.
  virtual void add_bias(float* Y, int64_t M, int64_t N, const float* bias) = 0;
  // y (M, n) = x (M, n) / rms(x) * w (n,)
  virtual void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) = 0;
  // out (M, dim) = rows `tokens[i]` of the embedding table E (n_vocab, dim), dequantized.
  virtual void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) = 0;
  // cs (M, p.n_rot): cos and sin of each rotated pair at positions pos (M,), for matmul_multi's
  // fused RoPE (computed once per batch, shared by every layer).
  virtual void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs) = 0;
  // In place on x (M, n_heads, head_dim) at positions pos (M,).
  virtual void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos,
                    const RopeParams& p) = 0;
  // For each of M queries: q (M, n_heads*head_dim) attends to positions [0, n_ctx[i]) of its
  // sequence's KV (views[i], in its stored type) -> out (M, n_heads*head_dim). Causality is
  // n_ctx = pos + 1; s.window > 0 narrows that to the last s.window positions (sliding-window
  // layers), s.softcap > 0 caps the scores (AttentionShape). With Q8_0 KV, Q.K is formed from q
  // quantized per block (kv_quantize_query).
  virtual void attention(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                         const AttentionShape& s, float* out) = 0;
  // a (M, n) = act(gate) * up, with gate/up (M, n).
  virtual void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n) = 0;
  // x (n,) = cap * tanh(x / cap), cap > 0 (gemma2's final logits).
  virtual void softcap(float* x, int64_t n, float cap) = 0;
  // x (n,) *= s.
  virtual void scale(float* x, int64_t n, float s) = 0;
  // y (M, n) += x (M, n)
  virtual void add(float* y, const float* x, int64_t M, int64_t n) = 0;
};

// "cpu": the fast kernels for the best instruction set this CPU has (cpu_isa; FT_ISA or
// set_cpu_isa force a lower one). "reference": the plain scalar kernels that define the
// semantics. Throws ft::Error for an unknown name.
std::unique_ptr<Backend> make_backend(std::string_view name, int threads);

// The activation side of the cpu backend's integer path (quantized weights, packed.h): x (K,),
// K a multiple of 32, in blocks of 32: dx = max|x| / 127, xq = x / dx rounded to nearest (ties
// to even) in [-127, 127], xsum = sum of the block's xq; so x ~= dx * xq within dx / 2. A block
// holding a NaN or infinity gets dx = NaN (and xq = 0), so the outputs it feeds are NaN too.
// xq (K,), dx (K/32,), xsum (K/32,).
void quantize_activations(const float* x, int64_t K, int16_t* xq, float* dx, int32_t* xsum);

// Instruction set a "cpu" backend made now uses: "amx", "avx512_bf16" (avx512 + AVX512_BF16),
// "avx512" (AVX-512 F/BW/VL/DQ + VNNI),
// "avx_vnni" (AVX2 + AVX-VNNI), "avx2" (AVX2 + FMA + F16C) or "scalar": the CPU's best, or the
// one the environment variable FT_ISA names (a name the CPU cannot run is an error), or
// set_cpu_isa's.
std::string_view cpu_isa();
// The instruction sets this CPU can run and this build has kernels for (CMake's FT_KERNEL_ISAS),
// slowest first (tests run every kernel on each).
std::vector<std::string_view> cpu_isas();
// Forces `name` (one of cpu_isas()) for backends made afterwards; "" = back to FT_ISA / the best.
void set_cpu_isa(std::string_view name);
// out[i] = exp((x[i] - shift) / div) for i < n (out may be x): exp as the kernels' own
// (rowwise::exp_cephes: within 2 ulp of std::exp, exactly 0 below -87.3; the same bits on every
// instruction set), 8 lanes at a time where the CPU has AVX2. The sampler's softmax.
void exp_shifted(const float* x, int64_t n, float shift, float div, float* out);
// Weight types the "cpu" backend multiplies with int8 dot products (its integer path).
bool is_int8_weight_type(GGMLType t);

}  // namespace ft
