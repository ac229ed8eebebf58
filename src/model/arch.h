// Architectures as data: one table per architecture lists every tensor (name pattern, role,
// shape from the hyperparameters, type class, optional) and its hyperparameter defaults. Weight
// binding (model_spec.cpp), the synthetic-model writer (synthetic.cpp) and the profiler's op
// names (profile/profiling_backend.cpp) all read it; adding an architecture means adding a table
// here and its differences in the forward pass.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "model/model.h"

namespace ft {

// Where a tensor goes in ModelWeights (layer fields for per-layer rows).
// Fused tensors bind whole (WQkv, WGateUp) and the forward's per-projection weights are row views
// of them (fused_views), never copies.
enum class Role {
  TokenEmbd, OutputNorm, Output, RopeFreqs, RopeLong, RopeShort,
  AttnNorm, Wq, Wk, Wv, WQkv, Bq, Bk, Bv, QNorm, KNorm, Wo, AttnPostNorm,
  FfnNorm, WGate, WUp, WGateUp, WDown, FfnPostNorm,
  MoeRouter, WGateExps, WUpExps, WDownExps,  // mixture of experts: the router, the experts' stacked FFNs
  Bo, AttnSinks, MoeRouterBias, BGateExps, BUpExps, BDownExps,  // gpt-oss: biases and attention sinks
  ShexpGateInp, WGateShexp, WUpShexp, WDownShexp  // qwen2moe: the shared expert and its gate
};
// A shape dimension, from the hyperparameters. QkvDim = q_dim + 2 kv_dim, Ffn2 = 2 ffn; Experts:
// the expert count, ExpertFfn an expert's FFN width; Heads the query heads; ShexpFfn the shared
// expert's FFN width.
enum class Extent { Dim, QDim, KvDim, QkvDim, HeadDim, Ffn, Ffn2, Vocab, RotHalf, Experts, ExpertFfn, Heads, ShexpFfn };
enum class TypeClass { Weight /* any supported weight type */, F32 };
// How the synthetic writer fills a tensor: matrices ~ N(0, 1/fan_in), norms ~ 1 + noise, biases
// ~ small noise, attention sinks ~ N(0, 1) (as large as the scores they compete with), a gate vector
// (dotted with a normed row: qwen2moe's shared expert's) ~ N(0, 1/length); in the Q4_K_M mix, which matrices get Q6_K (llama.cpp's use_more_bits layers,
// or always).
enum class Init { Matrix, Norm, Bias, Sink, Gate };
enum class MoreBits { Never, SomeLayers, Always };

struct TensorSpec {
  std::string_view pattern;  // GGUF name; "{i}" is the layer ("blk.{i}.attn_q.weight")
  Role role;
  std::string_view op_name;  // the profiler's name for it ("wq")
  Extent rows;               // a matrix is (rows, cols) = GGUF ne [cols, rows]; a vector is (rows)
  Extent cols;
  bool matrix;
  TypeClass type;
  bool per_layer;
  bool optional;             // absent: output -> tied to token_embd; rope_freqs -> none
  Init init;
  MoreBits more_bits = MoreBits::Never;
  bool synthetic = true;     // written by the synthetic writer
  // A stack of the experts' matrices: GGUF ne [cols, rows, n_experts], bound as one (n_experts *
  // rows, cols) matrix whose rows [e rows, (e + 1) rows) are expert e's (fused_views' row views).
  // A stack of vectors (biases): ne [rows, n_experts], expert e's at e * rows.
  bool per_expert = false;
};

// The forward differences of an architecture, as data (model/forward.cpp reads them from HParams).
struct ArchFeatures {
  GateAct ffn_act = GateAct::SiLU;
  bool embd_scale = false;             // embeddings * sqrt(dim)
  // The query's scale is 1/sqrt(head_dim), but 1/sqrt(dim / heads) for a model of this many
  // layers (0: none): Gemma's 1/sqrt(query_pre_attn_scalar), which GGUF does not store, keyed by
  // model size as llama.cpp does (the 27B: gemma2 46 layers, gemma3 62).
  int32_t dim_per_head_scale_layers = 0;
  // Granite's multipliers from its keys ({arch}.embedding_scale, .residual_scale,
  // .attention.scale, .logit_scale), each 1 (the attention's: the head rule above) when absent.
  bool granite_scales = false;
  bool softcap = false;                // reads {arch}.attn_logit_softcapping / final_logit_softcapping
  float attn_softcap = 0, final_softcap = 0;  //   defaults when those keys are absent
  SwaLayers swa = SwaLayers::None;     // layers with {arch}.attention.sliding_window
  int32_t swa_period = 0;              //   SwaLayers::Period's period (HParams::windowed)
  int32_t sliding_window = 0;          //   default when that key is absent (0: none)
  float swa_rope_base = 0;             // > 0: the windowed layers' RoPE base, unscaled (HParams)
  // A mixture of experts' weights: the softmax of the router's logits renormalised over the chosen
  // experts (llama.cpp's norm_w: qwen3moe, Mixtral), or over all of them (qwen2moe).
  bool moe_renorm = true;
};

struct ArchSpec {
  std::string_view name;  // general.architecture
  Arch arch;
  float rms_eps;          // defaults when the GGUF has no key
  float rope_freq_base;
  RopeStyle rope_style;
  // Order: the global tensors listed before the first per-layer row, then each layer's rows, then
  // the remaining globals (llama.cpp's order, which the synthetic writer keeps).
  std::span<const TensorSpec> tensors;
  ArchFeatures features = {};
};

// The architecture named `name`, or null.
const ArchSpec* find_arch(std::string_view name);
const ArchSpec& arch_spec(Arch a);
std::string known_archs();  // "llama, qwen2"

int64_t extent(Extent e, const HParams& hp);
// The tensor's GGUF name for layer i (per-layer rows).
std::string tensor_name(const TensorSpec& t, int32_t layer);
// A table may list a dense FFN and a mixture of experts both (llama: Mixtral's files are llama
// with experts); a model has one of them (HParams::n_experts > 0: the experts).
constexpr bool dense_ffn_role(Role r) {
  return r == Role::WGate || r == Role::WUp || r == Role::WDown || r == Role::WGateUp;
}
constexpr bool expert_role(Role r) {
  return r == Role::MoeRouter || r == Role::WGateExps || r == Role::WUpExps || r == Role::WDownExps ||
         r == Role::MoeRouterBias || r == Role::BGateExps || r == Role::BUpExps || r == Role::BDownExps ||
         r == Role::ShexpGateInp || r == Role::WGateShexp || r == Role::WUpShexp || r == Role::WDownShexp;
}
bool has_dense_ffn(const ArchSpec& a);
bool has_experts(const ArchSpec& a);
bool has_shared_expert(const ArchSpec& a);  // (qwen2moe)
// Whether a file of architecture a is a mixture of experts: a has only experts, or it has both and
// the file counts experts ({arch}.expert_count > 0: Mixtral's llama files).
bool file_has_experts(const ArchSpec& a, const GGUFFile& f);
// llama.cpp's LLAMA_MAX_EXPERTS, and a bound on the experts a token uses (the largest released
// models use 8-16).
inline constexpr int32_t kMaxExperts = 512, kMaxExpertsUsed = 64;

// Calls f(spec, layer) for every tensor of a model in file order (layer -1 for globals): of its
// FFN kind only, the experts' where `experts`, else the dense one's.
template <class F>
void for_each_tensor(const ArchSpec& a, int32_t n_layers, bool experts, F f) {
  auto in_model = [experts](const TensorSpec& t) { return experts ? !dense_ffn_role(t.role) : !expert_role(t.role); };
  size_t first_layer = 0;
  while (first_layer < a.tensors.size() && !a.tensors[first_layer].per_layer) f(a.tensors[first_layer++], -1);
  for (int32_t i = 0; i < n_layers; ++i)
    for (const TensorSpec& t : a.tensors.subspan(first_layer))
      if (t.per_layer && in_model(t)) f(t, i);
  for (const TensorSpec& t : a.tensors.subspan(first_layer))
    if (!t.per_layer) f(t, -1);
}

// The ModelWeights field a tensor binds to: a matrix or a vector (the other is null).
struct WeightSlot {
  WeightView* matrix = nullptr;
  const float** vector = nullptr;
};
WeightSlot weight_slot(ModelWeights& w, Role r, int32_t layer);
struct ConstWeightSlot {
  const WeightView* matrix = nullptr;
  const float* const* vector = nullptr;
};
ConstWeightSlot weight_slot(const ModelWeights& w, Role r, int32_t layer);
// After binding: a layer's fused tensors (wqkv, w_gate_up) as row views wq/wk/wv and
// w_gate/w_up (no copy: each view points into the fused rows).
void fused_views(LayerWeights& L, const HParams& hp);

}  // namespace ft
