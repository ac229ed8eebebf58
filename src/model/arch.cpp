#include "model/arch.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "gguf/ggml_types.h"

namespace ft {

namespace {

using E = Extent;
using T = TypeClass;

// clang-format off
const TensorSpec kLlama[] = {
  // pattern                     role              op name        rows        cols      matrix type       layer  optional init
  {"token_embd.weight",          Role::TokenEmbd,  "token_embd",  E::Vocab,   E::Dim,   true,  T::Weight, false, false, Init::Matrix},
  {"blk.{i}.attn_norm.weight",   Role::AttnNorm,   "attn_norm",   E::Dim,     E::Dim,   false, T::F32,    true,  false, Init::Norm},
  {"blk.{i}.attn_q.weight",      Role::Wq,         "wq",          E::QDim,    E::Dim,   true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_k.weight",      Role::Wk,         "wk",          E::KvDim,   E::Dim,   true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_v.weight",      Role::Wv,         "wv",          E::KvDim,   E::Dim,   true,  T::Weight, true,  false, Init::Matrix, MoreBits::SomeLayers},
  {"blk.{i}.attn_output.weight", Role::Wo,         "wo",          E::Dim,     E::QDim,  true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.ffn_norm.weight",    Role::FfnNorm,    "ffn_norm",    E::Dim,     E::Dim,   false, T::F32,    true,  false, Init::Norm},
  {"blk.{i}.ffn_gate.weight",    Role::WGate,      "w_gate",      E::Ffn,     E::Dim,   true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.ffn_up.weight",      Role::WUp,        "w_up",        E::Ffn,     E::Dim,   true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.ffn_down.weight",    Role::WDown,      "w_down",      E::Dim,     E::Ffn,   true,  T::Weight, true,  false, Init::Matrix, MoreBits::SomeLayers},
  {"output_norm.weight",         Role::OutputNorm, "output_norm", E::Dim,     E::Dim,   false, T::F32,    false, false, Init::Norm},
  {"output.weight",              Role::Output,     "output",      E::Vocab,   E::Dim,   true,  T::Weight, false, true,  Init::Matrix, MoreBits::Always},
  {"rope_freqs.weight",          Role::RopeFreqs,  "rope_freqs",  E::RotHalf, E::RotHalf, false, T::F32,  false, true,  Init::Norm, MoreBits::Never, false},
};
// Qwen2: Llama's tensors with Q/K/V biases after attn_v.
const TensorSpec kQkvBias[] = {
  {"blk.{i}.attn_q.bias",        Role::Bq,         "bq",          E::QDim,    E::QDim,  false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_k.bias",        Role::Bk,         "bk",          E::KvDim,   E::KvDim, false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_v.bias",        Role::Bv,         "bv",          E::KvDim,   E::KvDim, false, T::F32,    true,  false, Init::Bias},
};
// Qwen3, Gemma 3: each q and k head RMS-normed (one (head_dim,) weight for all heads) before RoPE;
// after attn_v (with_qk_norm).
const TensorSpec kQkNorm[] = {
  {"blk.{i}.attn_q_norm.weight", Role::QNorm,      "q_norm",      E::HeadDim, E::HeadDim, false, T::F32,  true,  false, Init::Norm},
  {"blk.{i}.attn_k_norm.weight", Role::KNorm,      "k_norm",      E::HeadDim, E::HeadDim, false, T::F32,  true,  false, Init::Norm},
};
// Qwen3 MoE: Qwen3's tensors with the dense FFN replaced by a router (F32, as llama.cpp's quantizer
// leaves it) and the stacked experts' gate, up and down (qwen3moe_tensors).
const TensorSpec kMoeFfn[] = {
  {"blk.{i}.ffn_gate_inp.weight",  Role::MoeRouter, "moe_router",    E::Experts,   E::Dim,       true, T::F32,    true, false, Init::Matrix},
  {"blk.{i}.ffn_gate_exps.weight", Role::WGateExps, "w_gate_exps",   E::ExpertFfn, E::Dim,       true, T::Weight, true, false, Init::Matrix, MoreBits::Never, true, true},
  {"blk.{i}.ffn_up_exps.weight",   Role::WUpExps,   "w_up_exps",     E::ExpertFfn, E::Dim,       true, T::Weight, true, false, Init::Matrix, MoreBits::Never, true, true},
  {"blk.{i}.ffn_down_exps.weight", Role::WDownExps, "w_down_exps",   E::Dim,       E::ExpertFfn, true, T::Weight, true, false, Init::Matrix, MoreBits::SomeLayers, true, true},
};
// Qwen2 MoE: the shared expert after the routed ones: its gate vector (dim,), one logit per token
// (F32: a vector, which quantizers leave), and its gate, up and down (qwen2moe_tensors).
const TensorSpec kSharedExpert[] = {
  {"blk.{i}.ffn_gate_inp_shexp.weight", Role::ShexpGateInp, "shexp_gate_inp", E::Dim,      E::Dim,      false, T::F32,    true, false, Init::Gate},
  {"blk.{i}.ffn_gate_shexp.weight",     Role::WGateShexp,   "w_gate_shexp",   E::ShexpFfn, E::Dim,      true,  T::Weight, true, false, Init::Matrix},
  {"blk.{i}.ffn_up_shexp.weight",       Role::WUpShexp,     "w_up_shexp",     E::ShexpFfn, E::Dim,      true,  T::Weight, true, false, Init::Matrix},
  {"blk.{i}.ffn_down_shexp.weight",     Role::WDownShexp,   "w_down_shexp",   E::Dim,      E::ShexpFfn, true,  T::Weight, true, false, Init::Matrix, MoreBits::SomeLayers},
};
// gpt-oss (OpenAI's MoE): Qwen2's Q/K/V biases and an output bias, each query head's attention
// sink, the pre-FFN norm under the name post_attention_norm, and a router and experts with biases.
const TensorSpec kGptOss[] = {
  {"token_embd.weight",              Role::TokenEmbd,     "token_embd",    E::Vocab,     E::Dim,       true,  T::Weight, false, false, Init::Matrix},
  {"blk.{i}.attn_norm.weight",       Role::AttnNorm,      "attn_norm",     E::Dim,       E::Dim,       false, T::F32,    true,  false, Init::Norm},
  {"blk.{i}.attn_q.weight",          Role::Wq,            "wq",            E::QDim,      E::Dim,       true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_q.bias",            Role::Bq,            "bq",            E::QDim,      E::QDim,      false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_k.weight",          Role::Wk,            "wk",            E::KvDim,     E::Dim,       true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_k.bias",            Role::Bk,            "bk",            E::KvDim,     E::KvDim,     false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_v.weight",          Role::Wv,            "wv",            E::KvDim,     E::Dim,       true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_v.bias",            Role::Bv,            "bv",            E::KvDim,     E::KvDim,     false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_output.weight",     Role::Wo,            "wo",            E::Dim,       E::QDim,      true,  T::Weight, true,  false, Init::Matrix},
  {"blk.{i}.attn_output.bias",       Role::Bo,            "bo",            E::Dim,       E::Dim,       false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.attn_sinks.weight",      Role::AttnSinks,     "attn_sinks",    E::Heads,     E::Heads,     false, T::F32,    true,  false, Init::Sink},
  {"blk.{i}.post_attention_norm.weight", Role::FfnNorm,   "ffn_norm",      E::Dim,       E::Dim,       false, T::F32,    true,  false, Init::Norm},
  {"blk.{i}.ffn_gate_inp.weight",    Role::MoeRouter,     "moe_router",    E::Experts,   E::Dim,       true,  T::F32,    true,  false, Init::Matrix},
  {"blk.{i}.ffn_gate_inp.bias",      Role::MoeRouterBias, "moe_router_b",  E::Experts,   E::Experts,   false, T::F32,    true,  false, Init::Bias},
  {"blk.{i}.ffn_gate_exps.weight",   Role::WGateExps,     "w_gate_exps",   E::ExpertFfn, E::Dim,       true,  T::Weight, true,  false, Init::Matrix, MoreBits::Never, true, true},
  {"blk.{i}.ffn_gate_exps.bias",     Role::BGateExps,     "b_gate_exps",   E::ExpertFfn, E::ExpertFfn, false, T::F32,    true,  false, Init::Bias,   MoreBits::Never, true, true},
  {"blk.{i}.ffn_up_exps.weight",     Role::WUpExps,       "w_up_exps",     E::ExpertFfn, E::Dim,       true,  T::Weight, true,  false, Init::Matrix, MoreBits::Never, true, true},
  {"blk.{i}.ffn_up_exps.bias",       Role::BUpExps,       "b_up_exps",     E::ExpertFfn, E::ExpertFfn, false, T::F32,    true,  false, Init::Bias,   MoreBits::Never, true, true},
  {"blk.{i}.ffn_down_exps.weight",   Role::WDownExps,     "w_down_exps",   E::Dim,       E::ExpertFfn, true,  T::Weight, true,  false, Init::Matrix, MoreBits::SomeLayers, true, true},
  {"blk.{i}.ffn_down_exps.bias",     Role::BDownExps,     "b_down_exps",   E::Dim,       E::Dim,       false, T::F32,    true,  false, Init::Bias,   MoreBits::Never, true, true},
  {"output_norm.weight",             Role::OutputNorm,    "output_norm",   E::Dim,       E::Dim,       false, T::F32,    false, false, Init::Norm},
  {"output.weight",                  Role::Output,        "output",        E::Vocab,     E::Dim,       true,  T::Weight, false, true,  Init::Matrix, MoreBits::Always},
};
// Gemma 2: Llama's tensors (q_dim = heads * key_length, not dim) with a norm after attention and
// one after the FFN (gemma2_tensors inserts them after wo and w_down).
const TensorSpec kPostAttnNorm =
  {"blk.{i}.post_attention_norm.weight", Role::AttnPostNorm, "attn_post_norm", E::Dim, E::Dim, false, T::F32, true, false, Init::Norm};
const TensorSpec kPostFfnNorm =
  {"blk.{i}.post_ffw_norm.weight",      Role::FfnPostNorm,  "ffn_post_norm",  E::Dim, E::Dim, false, T::F32, true, false, Init::Norm};
// Phi-3: Llama's tensors with Q, K, V fused into one matrix (q rows, then k, then v) and gate and
// up into one (gate rows, then up) (phi3_tensors); the long-context variants' rope factors (long /
// short, chosen by the context) where Llama has rope_freqs.
const TensorSpec kFusedQkv =
  {"blk.{i}.attn_qkv.weight",    Role::WQkv,       "wqkv",        E::QkvDim,  E::Dim,   true,  T::Weight, true,  false, Init::Matrix};
const TensorSpec kFusedGateUp =
  {"blk.{i}.ffn_up.weight",      Role::WGateUp,    "w_gate_up",   E::Ffn2,    E::Dim,   true,  T::Weight, true,  false, Init::Matrix};
const TensorSpec kRopeFactors[] = {
  {"rope_factors_long.weight",   Role::RopeLong,   "rope_long",   E::RotHalf, E::RotHalf, false, T::F32,  false, true,  Init::Norm, MoreBits::Never, false},
  {"rope_factors_short.weight",  Role::RopeShort,  "rope_short",  E::RotHalf, E::RotHalf, false, T::F32,  false, true,  Init::Norm, MoreBits::Never, false},
};
// clang-format on

// Gemma: Llama's table without rope_freqs, and the output matrix is not written by the synthetic
// writer (Gemma ties it to token_embd; its converter writes none).
std::vector<TensorSpec> gemma_tensors(std::span<const TensorSpec> base) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    if (t.role == Role::RopeFreqs) continue;
    out.push_back(t);
    if (t.role == Role::Output) out.back().synthetic = false;
  }
  return out;
}

// base with Gemma 2's post-norms after wo and w_down.
std::vector<TensorSpec> with_post_norms(std::span<const TensorSpec> base) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    out.push_back(t);
    if (t.role == Role::Wo) out.push_back(kPostAttnNorm);
    if (t.role == Role::WDown) out.push_back(kPostFfnNorm);
  }
  return out;
}

// Gemma's table with Gemma 2's post-norms.
std::vector<TensorSpec> gemma2_tensors(std::span<const TensorSpec> base) { return with_post_norms(gemma_tensors(base)); }

std::vector<TensorSpec> phi3_tensors(std::span<const TensorSpec> base) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    switch (t.role) {
      case Role::Wq: out.push_back(kFusedQkv); break;
      case Role::WGate: out.push_back(kFusedGateUp); break;
      case Role::Wk: case Role::Wv: case Role::WUp: break;
      case Role::RopeFreqs: out.insert(out.end(), std::begin(kRopeFactors), std::end(kRopeFactors)); break;
      default: out.push_back(t);
    }
  }
  return out;
}

// OLMo 2: Llama's tensors without the pre-norms (nor rope_freqs); q and k RMS-normed over the whole
// projection (Qwen3's names, one weight of q_dim and of kv_dim: qk_norm_whole) after attn_v, and
// Gemma 2's post-norms after wo and w_down.
std::vector<TensorSpec> olmo2_tensors(std::span<const TensorSpec> base) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    if (t.role == Role::AttnNorm || t.role == Role::FfnNorm || t.role == Role::RopeFreqs) continue;
    out.push_back(t);
    if (t.role == Role::Wv)
      for (TensorSpec n : kQkNorm) {
        n.rows = n.cols = n.role == Role::QNorm ? E::QDim : E::KvDim;
        out.push_back(n);
      }
  }
  return with_post_norms(out);
}

// base with the experts' FFN (kMoeFfn) after ffn_norm, in place of its dense FFN or beside it
// (keep_dense: a model of the architecture has one or the other, for_each_tensor).
std::vector<TensorSpec> with_moe_ffn(std::span<const TensorSpec> base, bool keep_dense) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    if (!keep_dense && dense_ffn_role(t.role)) continue;
    out.push_back(t);
    if (t.role == Role::FfnNorm) out.insert(out.end(), std::begin(kMoeFfn), std::end(kMoeFfn));
  }
  return out;
}

// base with the tensors `extra` inserted after each layer's FFN (its last per-layer rows).
std::vector<TensorSpec> after_ffn(std::span<const TensorSpec> base, std::span<const TensorSpec> extra) {
  std::vector<TensorSpec> out(base.begin(), base.end());
  const auto last = std::find_if(out.rbegin(), out.rend(), [](const TensorSpec& t) { return t.per_layer; });
  out.insert(last.base(), extra.begin(), extra.end());
  return out;
}

// base with the tensors `extra` inserted after attn_v.
std::vector<TensorSpec> after_wv(std::span<const TensorSpec> base, std::span<const TensorSpec> extra) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& t : base) {
    out.push_back(t);
    if (t.role == Role::Wv) out.insert(out.end(), extra.begin(), extra.end());
  }
  return out;
}

std::span<const ArchSpec> archs() {
  static const std::vector<TensorSpec> llama = with_moe_ffn(kLlama, true);  // (Mixtral: llama with experts)
  static const std::vector<TensorSpec> qwen2 = after_wv(kLlama, kQkvBias);
  static const std::vector<TensorSpec> qwen3 = after_wv(kLlama, kQkNorm);
  static const std::vector<TensorSpec> qwen3moe = with_moe_ffn(qwen3, false);
  static const std::vector<TensorSpec> gemma_t = gemma_tensors(kLlama);
  static const std::vector<TensorSpec> gemma2_t = gemma2_tensors(kLlama);
  static const std::vector<TensorSpec> gemma3_t = after_wv(gemma2_t, kQkNorm);
  static const std::vector<TensorSpec> phi3_t = phi3_tensors(kLlama);
  static const std::vector<TensorSpec> olmo2_t = olmo2_tensors(kLlama);
  static const std::vector<TensorSpec> qwen2moe_t = after_ffn(with_moe_ffn(qwen2, false), kSharedExpert);
  // Gemma (1): embeddings * sqrt(dim), the GELU (tanh form) gate, the query scale 1/sqrt(head_dim);
  // no soft caps, post-norms or window. Its norm weights (Gemma 2's and 3's too, q/k included) are
  // stored as 1 + w (llama.cpp's converter adds the 1), so its RMSNorm is the plain x / rms(x) * weight.
  static const ArchFeatures gemma{.ffn_act = GateAct::GeluTanh, .embd_scale = true};
  // Gemma 2: Gemma's, and llama.cpp's defaults when the keys are absent (window 4096, caps 50 and 30).
  static const ArchFeatures gemma2 = [] {
    ArchFeatures f = gemma;
    f.dim_per_head_scale_layers = 46;
    f.softcap = true;
    f.attn_softcap = 50.0f;
    f.final_softcap = 30.0f;
    f.swa = SwaLayers::Period;
    f.swa_period = 2;
    f.sliding_window = 4096;
    return f;
  }();
  // Gemma 3 (llama.cpp's rules, as Gemma 2's): Gemma's, no soft caps; five windowed layers, then a
  // global one; the windowed layers rotate with base 10000 unscaled, the global ones with the
  // file's base and linear scaling. Defaults where a key is absent (real files carry both): the
  // family's RoPE base 1e6 (as qwen2's table), Gemma 2's window.
  static const ArchFeatures gemma3 = [] {
    ArchFeatures f = gemma;
    f.dim_per_head_scale_layers = 62;
    f.swa = SwaLayers::Period;
    f.swa_period = 6;
    f.sliding_window = 4096;
    f.swa_rope_base = 1e4f;
    return f;
  }();
  static const ArchFeatures phi3{.swa = SwaLayers::All};
  static const ArchFeatures granite{.granite_scales = true};
  static const ArchFeatures qwen2moe{.moe_renorm = false};
  // gpt-oss (llama.cpp's openai-moe): even layers windowed (128 positions), the experts' clamped
  // SwiGLU; RoPE with YaRN from the file's keys.
  static const ArchFeatures gpt_oss{.ffn_act = GateAct::SwigluOai, .swa = SwaLayers::Period, .swa_period = 2,
                                    .sliding_window = 128};
  static const ArchSpec a[] = {
      {"llama", Arch::Llama, 1e-5f, 1e4f, RopeStyle::Interleaved, llama},
      {"qwen2", Arch::Qwen2, 1e-6f, 1e6f, RopeStyle::Halves, qwen2},
      {"qwen3", Arch::Qwen3, 1e-6f, 1e6f, RopeStyle::Halves, qwen3},
      {"qwen3moe", Arch::Qwen3Moe, 1e-6f, 1e6f, RopeStyle::Halves, qwen3moe},
      {"gemma2", Arch::Gemma2, 1e-6f, 1e4f, RopeStyle::Halves, gemma2_t, gemma2},
      {"gemma3", Arch::Gemma3, 1e-6f, 1e6f, RopeStyle::Halves, gemma3_t, gemma3},
      {"phi3", Arch::Phi3, 1e-5f, 1e4f, RopeStyle::Halves, phi3_t, phi3},
      // IBM Granite 3.x: Llama's tensors and four multipliers (ArchFeatures::granite_scales).
      {"granite", Arch::Granite, 1e-5f, 1e4f, RopeStyle::Interleaved, kLlama, granite},
      {"gpt-oss", Arch::GptOss, 1e-5f, 150000.0f, RopeStyle::Halves, kGptOss, gpt_oss},
      // OLMo 2: post-norms only (none before attention or the FFN), q/k norms over the projection.
      {"olmo2", Arch::Olmo2, 1e-6f, 1e4f, RopeStyle::Halves, olmo2_t},
      {"gemma", Arch::Gemma, 1e-6f, 1e4f, RopeStyle::Halves, gemma_t, gemma},
      // Qwen1.5-MoE, Qwen2-57B-A14B: Qwen2's attention, Qwen3 MoE's experts (weights not
      // renormalised) and a shared expert gated by sigmoid(x · ffn_gate_inp_shexp).
      {"qwen2moe", Arch::Qwen2Moe, 1e-6f, 1e6f, RopeStyle::Halves, qwen2moe_t, qwen2moe},
  };
  return a;
}

}  // namespace

bool has_dense_ffn(const ArchSpec& a) {
  return std::any_of(a.tensors.begin(), a.tensors.end(), [](const TensorSpec& t) { return dense_ffn_role(t.role); });
}
bool has_experts(const ArchSpec& a) {
  return std::any_of(a.tensors.begin(), a.tensors.end(), [](const TensorSpec& t) { return expert_role(t.role); });
}

bool has_shared_expert(const ArchSpec& a) {
  return std::any_of(a.tensors.begin(), a.tensors.end(), [](const TensorSpec& t) { return t.role == Role::WGateShexp; });
}

bool file_has_experts(const ArchSpec& a, const GGUFFile& f) {
  return has_experts(a) && (!has_dense_ffn(a) || f.get_u64(cat(a.name, ".expert_count"), 0) > 0);
}

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec& a : archs())
    if (a.name == name) return &a;
  return nullptr;
}

const ArchSpec& arch_spec(Arch arch) {
  for (const ArchSpec& a : archs())
    if (a.arch == arch) return a;
  fail("no table for architecture ", int(arch));
}

std::string known_archs() {
  std::string s;
  for (const ArchSpec& a : archs()) s += cat(s.empty() ? "" : ", ", a.name);
  return s;
}

int64_t extent(Extent e, const HParams& hp) {
  switch (e) {
    case Extent::Dim: return hp.dim;
    case Extent::QDim: return hp.q_dim();
    case Extent::KvDim: return hp.kv_dim();
    case Extent::QkvDim: return int64_t(hp.q_dim()) + 2 * int64_t(hp.kv_dim());
    case Extent::HeadDim: return hp.head_dim;
    case Extent::Ffn: return hp.ffn_dim;
    case Extent::Ffn2: return 2 * int64_t(hp.ffn_dim);
    case Extent::Vocab: return hp.n_vocab;
    case Extent::RotHalf: return hp.rope.n_rot / 2;
    case Extent::Experts: return hp.n_experts;
    case Extent::ExpertFfn: return hp.expert_ffn_dim;
    case Extent::Heads: return hp.n_heads;
    case Extent::ShexpFfn: return hp.shexp_ffn_dim;
  }
  return 0;
}

std::string tensor_name(const TensorSpec& t, int32_t layer) {
  std::string s(t.pattern);
  if (const size_t at = s.find("{i}"); at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  return s;
}

WeightSlot weight_slot(ModelWeights& w, Role r, int32_t layer) {
  LayerWeights* L = layer >= 0 ? &w.layers.at(size_t(layer)) : nullptr;
  switch (r) {
    case Role::TokenEmbd: return {&w.token_embd, nullptr};
    case Role::OutputNorm: return {nullptr, &w.output_norm};
    case Role::Output: return {&w.output, nullptr};
    case Role::RopeFreqs: return {nullptr, &w.rope_freqs};
    case Role::RopeLong: return {nullptr, &w.rope_long};
    case Role::RopeShort: return {nullptr, &w.rope_short};
    case Role::WQkv: return {&L->wqkv, nullptr};
    case Role::AttnPostNorm: return {nullptr, &L->attn_post_norm};
    case Role::WGateUp: return {&L->w_gate_up, nullptr};
    case Role::FfnPostNorm: return {nullptr, &L->ffn_post_norm};
    case Role::AttnNorm: return {nullptr, &L->attn_norm};
    case Role::Wq: return {&L->wq, nullptr};
    case Role::Wk: return {&L->wk, nullptr};
    case Role::Wv: return {&L->wv, nullptr};
    case Role::Bq: return {nullptr, &L->bq};
    case Role::Bk: return {nullptr, &L->bk};
    case Role::Bv: return {nullptr, &L->bv};
    case Role::QNorm: return {nullptr, &L->q_norm};
    case Role::KNorm: return {nullptr, &L->k_norm};
    case Role::Wo: return {&L->wo, nullptr};
    case Role::FfnNorm: return {nullptr, &L->ffn_norm};
    case Role::WGate: return {&L->w_gate, nullptr};
    case Role::WUp: return {&L->w_up, nullptr};
    case Role::WDown: return {&L->w_down, nullptr};
    case Role::MoeRouter: return {&L->moe_router, nullptr};
    case Role::WGateExps: return {&L->gate_exps, nullptr};
    case Role::WUpExps: return {&L->up_exps, nullptr};
    case Role::WDownExps: return {&L->down_exps, nullptr};
    case Role::Bo: return {nullptr, &L->bo};
    case Role::AttnSinks: return {nullptr, &L->attn_sinks};
    case Role::MoeRouterBias: return {nullptr, &L->moe_router_b};
    case Role::BGateExps: return {nullptr, &L->gate_exps_b};
    case Role::BUpExps: return {nullptr, &L->up_exps_b};
    case Role::BDownExps: return {nullptr, &L->down_exps_b};
    case Role::ShexpGateInp: return {nullptr, &L->shexp_gate_inp};
    case Role::WGateShexp: return {&L->w_gate_shexp, nullptr};
    case Role::WUpShexp: return {&L->w_up_shexp, nullptr};
    case Role::WDownShexp: return {&L->w_down_shexp, nullptr};
  }
  return {};
}

namespace {
// Rows [r0, r0 + n) of W (GGUF rows, which are whole blocks each).
WeightView row_view(const WeightView& W, int64_t r0, int64_t n) {
  const uint64_t rb = *row_bytes(W.type, uint64_t(W.n_cols));
  return {W.type, static_cast<const uint8_t*>(W.data) + uint64_t(r0) * rb, n, W.n_cols, W.layout};
}
}  // namespace

void fused_views(LayerWeights& L, const HParams& hp) {
  if (L.wqkv.data) {
    L.wq = row_view(L.wqkv, 0, hp.q_dim());
    L.wk = row_view(L.wqkv, hp.q_dim(), hp.kv_dim());
    L.wv = row_view(L.wqkv, int64_t(hp.q_dim()) + hp.kv_dim(), hp.kv_dim());
  }
  if (L.w_gate_up.data) {
    L.w_gate = row_view(L.w_gate_up, 0, hp.ffn_dim);
    L.w_up = row_view(L.w_gate_up, hp.ffn_dim, hp.ffn_dim);
  }
  if (L.gate_exps.data) {
    L.experts.resize(size_t(hp.n_experts));
    auto rows_of = [](const float* stack, int64_t e, int64_t n) { return stack ? stack + e * n : nullptr; };
    for (int32_t e = 0; e < hp.n_experts; ++e)
      L.experts[size_t(e)] = {row_view(L.gate_exps, int64_t(e) * hp.expert_ffn_dim, hp.expert_ffn_dim),
                              row_view(L.up_exps, int64_t(e) * hp.expert_ffn_dim, hp.expert_ffn_dim),
                              row_view(L.down_exps, int64_t(e) * hp.dim, hp.dim),
                              rows_of(L.gate_exps_b, e, hp.expert_ffn_dim), rows_of(L.up_exps_b, e, hp.expert_ffn_dim),
                              rows_of(L.down_exps_b, e, hp.dim)};
  }
}

ConstWeightSlot weight_slot(const ModelWeights& w, Role r, int32_t layer) {
  const WeightSlot s = weight_slot(const_cast<ModelWeights&>(w), r, layer);  // only read through
  return {s.matrix, s.vector};
}

}  // namespace ft
