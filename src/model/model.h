// A loaded model: immutable hyperparameters (from GGUF) and weights bound by name, plus the
// forward pass over a batch of (token, position, sequence) entries.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_memory.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kv/kv_cache.h"

namespace ft {

enum class Arch { Llama, Qwen2, Qwen3, Qwen3Moe, Gemma2, Gemma3, Phi3, Granite, GptOss, Olmo2, Gemma, Qwen2Moe };
// Which layers attend through the sliding window (HParams::sliding_window): none, all, or
// those of a period (llama.cpp's swa pattern): layer il is windowed unless il % period ==
// period - 1 (gemma2: period 2, the even layers; gemma3: 6, five local layers then a global one).
enum class SwaLayers { None, All, Period };

// RoPE settings given at load over the file's keys (llama.cpp's --rope-scaling, --rope-scale,
// --rope-freq-base, --yarn-orig-ctx): e.g. YaRN for the long contexts that Qwen2.5 and Qwen3 are
// released without (their cards: yarn, factor 4, original context 32768).
struct RopeOverrides {
  std::string scaling;   // "": the file's rope.scaling.type; "none", "linear" or "yarn"
  float scale = 0;       // the context's expansion factor (rope.scaling.factor); 0: the file's
  float freq_base = 0;   // 0: the file's rope.freq_base
  int32_t orig_ctx = 0;  // YaRN's original context (rope.scaling.original_context_length); 0: the file's
};

// Immutable, from GGUF metadata (see model_spec.cpp for keys and defaults).
struct HParams {
  Arch arch = Arch::Llama;
  std::string arch_name;
  int32_t n_vocab = 0;   // embedding rows: the width of a logits row
  int32_t n_tokens = 0;  // ids the tokenizer lists (<= n_vocab); rows beyond are padding, never sampled
  int32_t dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t ffn_dim = 0;
  // Mixture of experts ({arch}.expert_count, .expert_used_count, .expert_feed_forward_length):
  // each token's FFN is the sum of its n_experts_used best experts' (by the router), weighted by
  // the softmax of their router logits. 0 experts: a dense FFN.
  int32_t n_experts = 0, n_experts_used = 0, expert_ffn_dim = 0;
  // qwen2moe's shared expert ({arch}.expert_shared_feed_forward_length; 0: none) and whether the
  // chosen experts' weights are renormalised to sum 1 (ArchFeatures::moe_renorm).
  int32_t shexp_ffn_dim = 0;
  bool moe_renorm = true;
  int32_t ctx_len = 0;  // trained context
  float rms_eps = 1e-5f;
  RopeParams rope;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  // q and k RMS-normed over the whole projection (q_dim, kv_dim: olmo2) rather than head by head
  // (qwen3, gemma3); from the table's q_norm extent.
  bool qk_norm_whole = false;
  // The forward differences the architecture table (arch.cpp ArchSpec) and the keys give:
  GateAct ffn_act = GateAct::SiLU;
  float embd_scale = 1.0f;        // embeddings * this (gemma2: sqrt(dim))
  float attn_scale = 0;           // query scale in attention (1/sqrt(head_dim), or gemma2's)
  float attn_softcap = 0;         // scores -> cap * tanh(scores / cap) when > 0 (gemma2)
  float final_softcap = 0;        // the same on the logits (gemma2)
  float residual_scale = 1.0f;    // each block's output * this before its residual add (granite)
  float logit_scale = 1.0f;       // logits / this (granite)
  int32_t sliding_window = 0;     // > 0: windowed layers see only the last this many positions
  SwaLayers swa_layers = SwaLayers::None;
  int32_t swa_period = 0;         // SwaLayers::Period's period
  float swa_rope_base = 0;        // > 0: windowed layers rotate with this base and no scaling (gemma3: 10000)
  int32_t rope_ctx_orig = 0;      // phi3 long-context: above it the long rope factors apply; YaRN's original context
  // YaRN (rope.scaling.type "yarn"): its factor (0: none) and correction betas. Applied at bind
  // as rope.freq_factors (each pair's interpolation ramp, times rope_freqs) and rope.attn_factor
  // (times yarn_mscale = 1 + 0.1 ln(factor)), with freq_scale 1: llama.cpp's rope_yarn, folded.
  float yarn_factor = 0;
  int32_t yarn_orig_ctx = 0;  // its original context: --yarn-orig-ctx, else rope_ctx_orig
  float yarn_beta_fast = 32, yarn_beta_slow = 1;
  float yarn_mscale = 1;
  int32_t first_layer = 0;        // pipeline stage (Model::stage): the file's index of layers[0]
  std::string name;  // general.name
  // The window layer il attends through (0: the whole causal context).
  int32_t layer_window(int32_t il) const {
    return windowed(il) ? sliding_window : 0;
  }
  bool windowed(int32_t il) const {
    return swa_layers == SwaLayers::All || (swa_layers == SwaLayers::Period && il % swa_period != swa_period - 1);
  }
  // In 64 bits, then narrowed: Model::load refuses widths beyond int32 (model_spec.cpp check_sizes).
  int32_t q_dim() const { return int32_t(int64_t(n_heads) * head_dim); }
  int32_t kv_dim() const { return int32_t(int64_t(n_kv_heads) * head_dim); }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // (dim,)
  WeightView wq, wk, wv;             // (q_dim, dim), (kv_dim, dim), (kv_dim, dim)
  WeightView wqkv;                   // phi3: the fused (q_dim + 2 kv_dim, dim); wq/wk/wv are row views of it
  const float* bq = nullptr;         // qwen2 only: (q_dim,), (kv_dim,), (kv_dim,)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;     // qwen3, gemma3: (head_dim,) RMSNorm of each q and k head, before RoPE;
                                     // olmo2: (q_dim,) and (kv_dim,), over the whole projection (qk_norm_whole)
  const float* k_norm = nullptr;
  WeightView wo;                     // (dim, q_dim)
  const float* bo = nullptr;         // gpt-oss: (dim,)
  const float* attn_sinks = nullptr;  // gpt-oss: (n_heads,) each query head's sink logit (AttentionShape::sinks)
  const float* attn_post_norm = nullptr;  // gemma2, gemma3, olmo2: on the attention output before the residual add (dim,)
  const float* ffn_norm = nullptr;   // (dim,)
  WeightView w_gate, w_up;           // (ffn, dim)
  WeightView w_gate_up;              // phi3: the fused (2 ffn, dim), gate rows then up rows; w_gate/w_up are views
  WeightView w_down;                 // (dim, ffn)
  // Mixture of experts (HParams::n_experts > 0) instead of w_gate/w_up/w_down: the router (n_experts,
  // dim), the stacked experts (n_experts * expert_ffn, dim) x 2 and (n_experts * dim, expert_ffn),
  // and each expert's row views of them (fused_views).
  WeightView moe_router, gate_exps, up_exps, down_exps;
  // gpt-oss: the router's bias (n_experts,) and the experts' stacked biases (n_experts, expert_ffn)
  // x 2 and (n_experts, dim); each expert's rows of them in Expert.
  const float* moe_router_b = nullptr;
  const float *gate_exps_b = nullptr, *up_exps_b = nullptr, *down_exps_b = nullptr;
  struct Expert {
    WeightView gate, up, down;  // (expert_ffn, dim), (expert_ffn, dim), (dim, expert_ffn)
    const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;  // (gpt-oss) or null
  };
  std::vector<Expert> experts;
  // qwen2moe: the shared expert, every token's, weighted by sigmoid(h · shexp_gate_inp): (dim,),
  // (shexp_ffn, dim) x 2, (dim, shexp_ffn).
  const float* shexp_gate_inp = nullptr;
  WeightView w_gate_shexp, w_up_shexp, w_down_shexp;
  const float* ffn_post_norm = nullptr;   // gemma2, gemma3, olmo2: on the FFN output before the residual add (dim,)
};

struct ModelWeights {
  WeightView token_embd;             // (n_vocab, dim)
  std::vector<LayerWeights> layers;
  const float* output_norm = nullptr;  // (dim,)
  WeightView output;                   // (n_vocab, dim); = token_embd when tied
  const float* rope_freqs = nullptr;   // optional (n_rot/2,)
  const float* rope_long = nullptr;    // phi3 long-context variants: (n_rot/2,) factors for contexts
  const float* rope_short = nullptr;   //   above / up to HParams::rope_ctx_orig
};

// LoRA (model/lora.h): the projections an adapter may change, per layer.
class LoraAdapter;
enum class LoraSlot : uint8_t { Q, K, V, O, Gate, Up, Down };
inline constexpr size_t kLoraSlots = 7;
// The inputs those projections read (one shrink GEMM each): Q/K/V the attention norm's output,
// O the attention's, gate/up the FFN norm's, down the gated activation.
enum class LoraInput : uint8_t { Qkv, O, GateUp, Down };
inline constexpr size_t kLoraInputs = 4;
constexpr LoraInput lora_input(LoraSlot s) {
  return s <= LoraSlot::V ? LoraInput::Qkv
         : s == LoraSlot::O ? LoraInput::O
         : s == LoraSlot::Down ? LoraInput::Down
                               : LoraInput::GateUp;
}

// What the forward pass outputs for a batch entry (Batch::want_logits): nothing, its logits, or
// its hidden state after the final norm (an embedding's row: dim floats, the lm head's input).
enum BatchOut : uint8_t { kOutNone = 0, kOutLogits = 1, kOutHidden = 2 };

// One forward pass's input: entry i is token tokens[i] at position pos[i] of sequence seq[i].
// Entries of one sequence appear in increasing position order; their KV cache must hold
// positions [0, pos] (KVCache::reserve) before the call. lora[i]: the adapter entry i runs
// under (null: the base); the forward pass works per run of equal adapters (segments), so rows
// of one adapter are best kept together.
struct Batch {
  std::vector<int32_t> tokens, pos, seq;
  std::vector<uint8_t> want_logits;  // a BatchOut per entry
  std::vector<const LoraAdapter*> lora;
  void clear() { tokens.clear(); pos.clear(); seq.clear(); want_logits.clear(); lora.clear(); }
  // out: a BatchOut (true: kOutLogits).
  void add(int32_t token, int32_t position, int32_t sequence, uint8_t out, const LoraAdapter* adapter = nullptr) {
    tokens.push_back(token);
    pos.push_back(position);
    seq.push_back(sequence);
    want_logits.push_back(out);
    lora.push_back(adapter);
  }
  int64_t size() const { return int64_t(tokens.size()); }
};

// Tensor parallelism (src/parallel): sums x (n,) over the ranks that share each layer, in place.
class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual void allreduce_sum(float* x, int64_t n) = 0;
};

// Pipeline parallelism (src/parallel): the hidden state's way between the stages of a model split
// by layers (Model::stage). The first stage embeds the tokens, every other one receives the
// previous stage's x (M, dim); every stage but the last sends its x on; the last stage sends the
// rows that want logits (in batch order) back to the first stage, whose rank 0 computes the
// logits. (Each call moves n floats; when it returns, its buffer may be reused.)
class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;
  virtual void recv_prev(float* x, int64_t n) = 0;
  virtual void send_next(const float* x, int64_t n) = 0;
  virtual void send_head(const float* x, int64_t n) = 0;  // last stage -> the logits' rank (a no-op elsewhere)
  virtual void recv_tail(float* x, int64_t n) = 0;        // the logits' rank <- the last stage
  // Called between blocks: lets posted sends progress (an implementation may post send_next
  // and return at once, for the next step to overlap this one on the next stage).
  virtual void progress() {}
};

class Model {
 public:
  // Maps, validates and binds the file. Throws ft::Error naming file, key or tensor.
  static std::unique_ptr<Model> load(const std::string& path, const RopeOverrides& rope = {});
  // The same over a file already parsed (e.g. GGUFFile::parse of bytes in memory).
  static std::unique_ptr<Model> bind(std::unique_ptr<GGUFFile> file, const RopeOverrides& rope = {});
  const HParams& hparams() const { return hp_; }
  const ModelWeights& weights() const { return w_; }
  const GGUFFile& file() const { return *file_; }
  // Bytes of all weights (for bandwidth accounting).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Tensor parallelism: keeps rank's part of every layer (model/shard.cpp): heads [r H/n,
  // (r+1) H/n) of Q and K/V (KV heads alike) and FFN columns [r F/n, (r+1) F/n): Q/K/V and
  // gate/up are row views (column-parallel), Wo and down copies of their input-column slices
  // (row-parallel: the partial products are summed across ranks). Afterwards n_heads,
  // n_kv_heads and ffn_dim are the rank's; embeddings, norms and the output head stay whole.
  // ft::Error when heads, KV heads or FFN width do not divide by n, or a slice would cut a
  // quantization block.
  void shard(int rank, int n);
  int shard_rank() const { return shard_rank_; }
  int shard_count() const { return shard_count_; }
  // Pipeline parallelism: keeps stage s of n (model/shard.cpp): the contiguous layers
  // [s L/n, (s+1) L/n) (n_layers becomes their count, first_layer their first); only stage 0
  // keeps the token embeddings and the output head (it embeds, and its rank 0 computes the
  // logits), the others drop them (never touched). Before shard() (so only the stage's layers
  // are sliced). ft::Error when n exceeds the layers (a stage without any).
  void stage(int s, int n);
  int stage_index() const { return stage_; }
  // Whether this part of the model reads the file's tensor `name`: a stage's own layers (blk.N.*),
  // the embeddings and head on stage 0 only, the rest (rope factors) everywhere.
  bool reads_tensor(std::string_view name) const;
  int stage_count() const { return stage_count_; }

 private:
  Model() = default;
  std::unique_ptr<GGUFFile> file_;
  HParams hp_;
  ModelWeights w_;
  std::vector<float> rope_factors_;  // YaRN's (n_rot/2,): hp_.rope.freq_factors points here
  uint64_t weight_bytes_ = 0;
  int shard_rank_ = 0, shard_count_ = 1;
  int stage_ = 0, stage_count_ = 1;
  std::vector<MappedMemory> shard_copies_;  // the row-parallel weights' column slices
};

// Runs the transformer over batches with a given backend. Owns the activation scratch, sized for
// up to max_batch tokens at construction (the forward pass itself does not allocate).
class Forward {
 public:
  // n_ctx: the positions per sequence it will run with (0: the model's trained context); picks
  // the long or short rope factors of long-context models, as llama.cpp does.
  Forward(const Model& model, Backend& backend, int64_t max_batch, int64_t n_ctx = 0);
  // Writes the batch's K/V into kv, the logits of entries that want them (kOutLogits, in batch
  // order, n_vocab floats each) into logits, and the final-norm hidden states of kOutHidden
  // entries (in batch order, dim floats each) into hidden. Both null: nothing computed (a
  // tensor-parallel worker's pass). Throws ft::Error on an invalid batch.
  void run(const Batch& batch, KVCache& kv, float* logits, float* hidden = nullptr);
  // The batch's output rows: logits rows first, then hidden ones (as begin gathers them).
  struct Rows {
    int64_t logits = 0, hidden = 0;
  };
  // run() in two halves: begin runs the layers (and a stage's sends) and returns the batch's
  // output rows; finish(rows, logits, hidden) waits for them (the last stage's, under pipeline
  // parallelism) and computes the logits and hidden rows. With a stage link on a first stage,
  // other steps' begins may come between a begin and its finish (its hidden state is sent, a
  // copy: the scratch is free again), finishes in begin order (rank 0 overlapping decode steps
  // across stages); otherwise finish follows its begin.
  Rows begin(const Batch& batch, KVCache& kv);
  void finish(Rows rows, float* logits, float* hidden = nullptr);
  int64_t max_batch() const { return max_batch_; }
  // The scratch LoRA adapters need (ya = A x per row, up to kMaxLoraStack wide, and the
  // per-segment descriptors) for max_batch rows, so batches with adapters run without
  // allocating. Made on any thread: at a large max_batch it is tens of MB to allocate and zero,
  // which the thread that runs the steps should not wait for (a server loading an adapter).
  struct LoraScratch {
    std::vector<float> ya;
    std::vector<RunTarget> shrinks;
    std::array<std::vector<LoraRun>, kLoraSlots> runs;
  };
  LoraScratch lora_scratch() const;
  // Takes s (from lora_scratch()) as its LoRA scratch, or makes it. Until called, a batch naming
  // an adapter is an ft::Error. Idempotent (a second s is dropped).
  void enable_lora(LoraScratch s);
  void enable_lora() { enable_lora(lora_scratch()); }
  // Tensor parallelism over a sharded model (Model::shard): the row-parallel projections (Wo,
  // down) are summed across ranks by r before their residual add. Null: one process.
  // Not with LoRA (a sharded input cannot take an adapter's full-width A): an ft::Error.
  void set_reducer(Reducer* r);
  // Pipeline parallelism over a staged model (Model::stage): where the stage's input comes from
  // and its output goes (StageLink). Null: the whole model here. Not with LoRA either.
  void set_stage_link(StageLink* l);
  // Called on the calling thread between the blocks of every step begun here (after each
  // attention block, and after each FFN block but the last), when one process runs the whole
  // model (no stage link or reducer). It may run a step of other sequences on another Forward
  // (this one's activations stay as they are; nothing of the backend's is live between blocks)
  // and must not touch this step's sequences. Its argument: the share of the step's blocks done.
  // Empty: none.
  void set_between_blocks(std::function<void(double)> f) { between_ = std::move(f); }
  // The activation scratch: its bytes, and whether it is on huge pages.
  const MappedMemory& scratch() const { return scratch_; }

 private:
  void attention_block(int32_t layer, const Batch& batch, KVCache& kv, int64_t M);
  void ffn_block(int32_t layer, int64_t M);
  // A block's input: rmsnorm(x) into h_ with the layer's pre-norm weight w, or x itself (none: olmo2).
  const float* pre_norm(const float* w, int64_t M);
  void moe_ffn(const LayerWeights& L, const float* in, int64_t M);
  void residual_add(int32_t il, LoraSlot s, const float* a, int64_t M, const WeightView& W, const float* post_norm,
                    const float* bias);
  void validate(const Batch& batch, const KVCache& kv) const;
  // LoRA (model/lora.cpp): the batch's runs of one adapter; the shrink of input `in` of layer
  // il (X (M, K) -> lora_ya_, every adapted segment in one call; false: none adapted); and the
  // delta of slot s for the projection's epilogue (over that ya; n == 0: none).
  bool lora_segments(const Batch& batch);
  bool lora_shrink(int32_t il, LoraInput in, const float* X, int64_t K);
  LoraDelta lora_delta(int32_t il, LoraSlot s);

  const Model& model_;
  Backend& be_;
  std::function<void(double)> between_;
  // The model's weights with every matmul weight in the backend's preferred layout (prepare()).
  ModelWeights w_;
  int64_t max_batch_;
  // (max_batch, width) scratch
  // Activations (max_batch rows each), carved from one mapping on huge pages.
  MappedMemory scratch_;
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr,
        *gate_ = nullptr;
  std::vector<float> rope_cs_;  // (max_batch, n_rot): the batch's RoPE cos/sin, all layers
  RopeParams rope_;             // the model's, with the factors for this context
  RopeParams rope_swa_;         // the windowed layers' (gemma3: their own base, unscaled; else rope_)
  bool fused_rope_ = false;
  // Mixture of experts (n_experts > 0; sized at construction): router logits (max_batch,
  // n_experts); the rows routed to one expert gathered, and its output (max_batch, dim) each;
  // the weighted sum (max_batch, dim); each row's choices (max_batch, n_experts_used) as
  // (expert, weight); the rows of each expert in expert order (offsets (n_experts + 1,)).
  // the up projection's output where the experts run unfused (gpt-oss: (max_batch, expert_ffn)).
  std::vector<float> moe_logits_, moe_in_, moe_out_, moe_sum_, moe_weight_, moe_up_;
  std::vector<int32_t> moe_choice_, moe_offsets_, moe_fill_, moe_rows_;
  std::vector<float> moe_row_weight_;
  std::vector<KVLayerView> views_;
  std::vector<int32_t> n_ctx_, logit_rows_;
  struct LoraSegment {
    const LoraAdapter* a;
    int64_t first, n;
  };
  std::vector<LoraSegment> lora_segs_;  // this batch's adapted runs (empty: none)
  std::vector<float> lora_ya_;          // (max_batch, kMaxLoraStack): one input's shrink
  std::vector<RunTarget> lora_shrinks_;  // (max_batch,) per call
  std::array<std::vector<LoraRun>, kLoraSlots> lora_runs_;  // (max_batch,) each: a slot's delta
  Reducer* reduce_ = nullptr;
  StageLink* link_ = nullptr;
};

}  // namespace ft
