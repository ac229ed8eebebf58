// GGUF metadata keys to HParams, and the architecture's tensor table (model/arch.h) to the
// weights. Every weight is bound by name with its expected type class and shape; a mismatch fails
// with expected vs actual.
//
// Metadata ({arch} = general.architecture):            default when absent
//   {arch}.embedding_length            dim                required
//   {arch}.block_count                 n_layers           required
//   {arch}.feed_forward_length         ffn_dim            required
//   {arch}.expert_count, .expert_used_count  n_experts, n_experts_used  required where the table has experts
//   {arch}.expert_feed_forward_length  expert_ffn_dim     ffn_dim
//   {arch}.attention.head_count        n_heads            required
//   {arch}.attention.head_count_kv     n_kv_heads         n_heads
//   {arch}.attention.key_length        head_dim           dim / n_heads
//   {arch}.context_length              ctx_len            2048
//   {arch}.attention.layer_norm_rms_epsilon  rms_eps      the architecture's (arch.cpp)
//   {arch}.rope.freq_base              rope base          the architecture's (arch.cpp)
//   {arch}.rope.dimension_count        rotated dims       head_dim
//   {arch}.rope.scaling.type/.factor   "linear": positions / factor; "yarn": YaRN (HParams); "none"/absent: 1
//   {arch}.rope.scaling.yarn_beta_fast/_slow  YaRN's correction betas   32, 1
//   {arch}.rope.scaling.attn_factor    cos/sin * this (Phi-3 LongRoPE)  1
//   {arch}.rope.scaling.original_context_length  above it the long rope factors apply; YaRN's  context_length
// RopeOverrides (model.h) replace rope.scaling.type, .factor, .original_context_length and rope.freq_base.
//   {arch}.attention.sliding_window    window of the architecture's windowed layers (0: none)  the architecture's
//                                      (> 0 in an architecture without windowed layers: refused, e.g. OLMo 3's olmo2)
//   {arch}.attn_logit_softcapping, {arch}.final_logit_softcapping  (gemma2)  the architecture's
//   {arch}.vocab_size                  n_vocab            rows of token_embd.weight
//   tokenizer.ggml.tokens (its length)  n_tokens (<= n_vocab; the rest is padding)  n_vocab
// Tensors: the architecture's table in model/arch.cpp (name, shape from the hyperparameters,
// type class, optional); a matrix (rows, cols) is GGUF ne [cols, rows].
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "kernels/quant_blocks.h"
#include "model/arch.h"
#include "model/model.h"

namespace ft {

namespace {

// llama.cpp's rule: trailing dimensions of 1 are no dimensions, so [n] and [n, 1] are one shape
// (the same elements in the same order; Qwen-MoE files store ffn_gate_inp_shexp as [dim, 1]).
bool same_shape(std::vector<uint64_t> a, std::vector<uint64_t> b) {
  while (!a.empty() && a.back() == 1) a.pop_back();
  while (!b.empty() && b.back() == 1) b.pop_back();
  return a == b;
}

class Binder {
 public:
  explicit Binder(const GGUFFile& f) : f_(f) {}

  const GGUFTensorInfo* find(const std::string& name, TypeClass tc,
                             const std::vector<uint64_t>& shape, bool required) {
    const GGUFTensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (required) fail(f_.path(), ": missing tensor '", name, "' (expected shape ", shape_str(shape), ")");
      return nullptr;
    }
    if (!same_shape(t->ne, shape))
      fail(f_.path(), ": tensor '", name, "': expected shape ", shape_str(shape), ", got ",
           shape_str(t->ne));
    const bool ok = tc == TypeClass::F32 ? t->type == GGMLType::F32 : is_supported_weight_type(t->type);
    if (!ok)  // (collected: every such tensor is named at once, by check_types)
      type_errors_.push_back(cat("tensor '", name, "': type ", type_traits(t->type).name,
                                 tc == TypeClass::F32 ? " is not supported here (expected f32)" : " is not supported"));
    if (t->type == GGMLType::MXFP4) check_mxfp4(name, *t);
    bytes_ += t->n_bytes;
    return t;
  }

  // Fails on the first MXFP4 block the engine refuses (blocks::mxfp4_refused: a NaN scale, or
  // one beyond f16 on a block that is not all zeros), naming the tensor and where the block is.
  void check_mxfp4(const std::string& name, const GGUFTensorInfo& t) const {
    const auto* b = reinterpret_cast<const blocks::MXFP4*>(t.data);
    const uint64_t per_row = t.ne.empty() ? 0 : t.ne[0] / 32, nb = t.n_bytes / sizeof(blocks::MXFP4);
    for (uint64_t i = 0; i < nb; ++i) {
      if (!blocks::mxfp4_refused(b[i])) continue;
      const uint64_t row = per_row ? i / per_row : 0, col = per_row ? (i % per_row) * 32 : 0;
      const uint64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
      const std::string where = t.ne.size() > 2 ? cat("expert ", row / rows, ", row ", row % rows) : cat("row ", row);
      const int e = b[i].e;
      fail(f_.path(), ": tensor '", name, "' (MXFP4): the block at ", where, ", columns ", col, "..", col + 31,
           " has scale exponent e = ", e,
           e == 255 ? " (NaN in the MX format; ggml rejects it too)"
                    : cat(" (scale 2^", e - 128, "): beyond f16 (at most 2^15, e = 143), the CPU kernels' scale; "
                          "only an all-zero block may have it"));
    }
  }

  WeightView matrix(const std::string& name, TypeClass tc, int64_t n_rows, int64_t n_cols, bool required) {
    const GGUFTensorInfo* t = find(name, tc, {uint64_t(n_cols), uint64_t(n_rows)}, required);
    if (!t) return {};
    return WeightView{t->type, t->data, n_rows, n_cols};
  }
  // ne [n_cols, n_rows, n_experts] as one (n_experts * n_rows, n_cols) matrix (TensorSpec::per_expert).
  WeightView experts(const std::string& name, TypeClass tc, int64_t n_rows, int64_t n_cols, int64_t n_experts,
                     bool required) {
    const GGUFTensorInfo* t = find(name, tc, {uint64_t(n_cols), uint64_t(n_rows), uint64_t(n_experts)}, required);
    if (!t) return {};
    return WeightView{t->type, t->data, n_experts * n_rows, n_cols};
  }

  const float* vector(const std::string& name, TypeClass tc, int64_t n, bool required) {
    const GGUFTensorInfo* t = find(name, tc, {uint64_t(n)}, required);
    return t ? reinterpret_cast<const float*>(t->data) : nullptr;
  }
  // ne [n, n_experts]: the experts' vectors back to back (TensorSpec::per_expert).
  const float* vectors(const std::string& name, TypeClass tc, int64_t n, int64_t n_experts, bool required) {
    const GGUFTensorInfo* t = find(name, tc, {uint64_t(n), uint64_t(n_experts)}, required);
    return t ? reinterpret_cast<const float*>(t->data) : nullptr;
  }

  uint64_t bytes() const { return bytes_; }

  // Fails naming every tensor whose type the engine cannot compute with (tensor, type).
  void check_types() const {
    if (type_errors_.empty()) return;
    std::string list;
    for (const auto& e : type_errors_) list += (list.empty() ? "" : "; ") + e;
    fail(f_.path(), ": ", type_errors_.size(), type_errors_.size() == 1 ? " tensor" : " tensors",
         " of a type this engine cannot compute with: ", list, " (supported weight types: ",
         supported_weight_type_names(), ")");
  }

 private:
  const GGUFFile& f_;
  uint64_t bytes_ = 0;
  std::vector<std::string> type_errors_;
};

int32_t positive_i32(const GGUFFile& f, const std::string& key, uint64_t v) {
  if (v == 0 || v > (1u << 24)) fail(f.path(), ": key '", key, "': value ", v, " out of range");
  return int32_t(v);
}

// Every size the hyperparameters imply, checked (64-bit, each factor <= 2^24) before anything is
// sized from them: the widths fit int32 (HParams::q_dim/kv_dim), and the layer count is bounded
// by the file's tensors (a block_count of 2^24 in a small file is refused here, not after
// resizing tables for it). Each tensor's bytes are checked against the file by the GGUF reader.
void check_sizes(const GGUFFile& f, const HParams& hp) {
  const std::string a = hp.arch_name + ".";
  auto width = [&](const char* what, int64_t heads, const char* heads_key) {
    const int64_t w = heads * int64_t(hp.head_dim);
    if (w > std::numeric_limits<int32_t>::max())
      fail(f.path(), ": key '", a, heads_key, "': ", heads, " heads of ", hp.head_dim, " make a ", what,
           " width of ", w, " (out of range)");
  };
  width("query", hp.n_heads, "attention.head_count");
  width("key/value", hp.n_kv_heads, "attention.head_count_kv");
  // A bound only (each layer has tensors); binding then names the first missing one.
  if (uint64_t(hp.n_layers) > f.tensors().size())
    fail(f.path(), ": key '", a, "block_count': ", hp.n_layers, " layers, but the file has only ", f.tensors().size(),
         " tensors");
}

// A scale from metadata (f64 or f32 there, float here): finite and > 0 (>= 0 with allow_zero) as
// the float used, not only as the value read.
float scale_key(const GGUFFile& f, const std::string& key, double dflt, bool allow_zero = false) {
  const double v = f.get_f64(key, dflt);
  const float x = float(v);
  if (!std::isfinite(v) || !std::isfinite(x) || !(allow_zero ? x >= 0 : x > 0))
    fail(f.path(), ": key '", key, "': ", v, " must be finite and ", allow_zero ? ">= 0" : "> 0", " as a float");
  return x;
}

HParams read_hparams(const GGUFFile& f, const RopeOverrides& ro) {
  HParams hp;
  hp.arch_name = f.require_str("general.architecture");
  const ArchSpec* spec = find_arch(hp.arch_name);
  if (!spec)
    fail(f.path(), ": key 'general.architecture': architecture '", hp.arch_name, "' is not supported (supported: ",
         known_archs(), ")");
  hp.arch = spec->arch;
  const std::string a = hp.arch_name + ".";
  auto req = [&](const std::string& k) { return positive_i32(f, a + k, f.require_u64(a + k)); };
  auto opt = [&](const std::string& k, uint64_t d) { return positive_i32(f, a + k, f.get_u64(a + k, d)); };
  hp.name = f.get_str("general.name", "");
  hp.dim = req("embedding_length");
  hp.n_layers = req("block_count");
  hp.ffn_dim = req("feed_forward_length");
  hp.n_heads = req("attention.head_count");
  hp.n_kv_heads = opt("attention.head_count_kv", uint64_t(hp.n_heads));
  if (hp.n_heads % hp.n_kv_heads != 0)
    fail(f.path(), ": key '", a, "attention.head_count_kv': ", hp.n_kv_heads,
         " does not divide head_count ", hp.n_heads);
  if (hp.dim % hp.n_heads != 0 && !f.has(a + "attention.key_length"))
    fail(f.path(), ": key '", a, "attention.head_count': ", hp.n_heads,
         " does not divide embedding_length ", hp.dim);
  hp.head_dim = opt("attention.key_length", uint64_t(hp.dim / hp.n_heads));
  if (f.has(a + "attention.value_length") && opt("attention.value_length", 1) != hp.head_dim)
    fail(f.path(), ": key '", a, "attention.value_length' differs from key_length (not supported)");
  if (file_has_experts(*spec, f)) {
    hp.n_experts = req("expert_count");
    hp.n_experts_used = req("expert_used_count");
    if (hp.n_experts > kMaxExperts)
      fail(f.path(), ": key '", a, "expert_count': ", hp.n_experts, " experts (at most ", kMaxExperts, ")");
    if (hp.n_experts_used > kMaxExpertsUsed)
      fail(f.path(), ": key '", a, "expert_used_count': ", hp.n_experts_used, " experts a token (at most ",
           kMaxExpertsUsed, ")");
    // The pre-2024 Mixtral files (one tensor per expert) as such, not as a missing stack.
    if (f.find_tensor("blk.0.ffn_gate.0.weight") && !f.find_tensor("blk.0.ffn_gate_exps.weight"))
      fail(f.path(), ": experts stored one tensor each (blk.N.ffn_gate.E.weight, before llama.cpp's 2024 format) "
                     "are not supported: convert the file again");
    // (llama.cpp's default: Mixtral's experts are feed_forward_length wide; qwen3moe's n_ff / used)
    hp.expert_ffn_dim = opt("expert_feed_forward_length",
                            uint64_t(has_dense_ffn(*spec) ? hp.ffn_dim : std::max(1, hp.ffn_dim / hp.n_experts_used)));
    hp.moe_renorm = spec->features.moe_renorm;
    if (has_shared_expert(*spec))
      hp.shexp_ffn_dim = opt("expert_shared_feed_forward_length", uint64_t(hp.ffn_dim));  // (llama.cpp's default)
    if (hp.n_experts_used > hp.n_experts)
      fail(f.path(), ": key '", a, "expert_used_count': ", hp.n_experts_used, " exceeds expert_count ", hp.n_experts);
  }
  hp.ctx_len = opt("context_length", 2048);
  hp.rms_eps = float(f.get_f64(a + "attention.layer_norm_rms_epsilon", spec->rms_eps));
  if (!(hp.rms_eps > 0) || !std::isfinite(hp.rms_eps))
    fail(f.path(), ": key '", a, "attention.layer_norm_rms_epsilon' must be > 0");
  hp.rope.style = spec->rope_style;
  hp.rope.freq_base = float(f.get_f64(a + "rope.freq_base", spec->rope_freq_base));
  if (!(hp.rope.freq_base > 1) || !std::isfinite(hp.rope.freq_base))
    fail(f.path(), ": key '", a, "rope.freq_base': ", hp.rope.freq_base, " must be > 1");
  hp.rope.n_rot = opt("rope.dimension_count", uint64_t(hp.head_dim));
  if (hp.rope.n_rot > hp.head_dim || hp.rope.n_rot % 2 != 0)
    fail(f.path(), ": key '", a, "rope.dimension_count': ", hp.rope.n_rot, " must be even and <= head dim ",
         hp.head_dim);
  // (An override names its flag, a key its key.)
  // (--rope-scale alone scales as the file says, linearly where it says nothing: llama.cpp's rule.)
  std::string scaling = !ro.scaling.empty() ? ro.scaling : f.get_str(a + "rope.scaling.type", "none");
  if (ro.scaling.empty() && ro.scale != 0 && scaling == "none") scaling = "linear";
  const std::string scaling_src = !ro.scaling.empty() ? "--rope-scaling" : cat("key '", a, "rope.scaling.type'");
  const double factor = ro.scale != 0 ? double(ro.scale) : f.get_f64(a + "rope.scaling.factor", 1.0);
  const std::string factor_src = ro.scale != 0 ? "--rope-scale" : cat("key '", a, "rope.scaling.factor'");
  if (scaling == "linear" || scaling == "yarn") {
    const float scale = float(1.0 / factor);  // what linear scaling multiplies positions by
    if (!(factor > 0) || !std::isfinite(factor) || !std::isfinite(float(factor)) || !std::isfinite(scale) || !(scale > 0))
      fail(f.path(), ": ", factor_src, ": ", factor, " must be finite and > 0 with a finite, non-zero inverse in float");
    if (scaling == "linear") hp.rope.freq_scale = scale;
    if (scaling == "yarn") {
      if (!(factor >= 1)) fail(f.path(), ": ", factor_src, ": ", factor, ": YaRN's factor must be >= 1");
      hp.yarn_factor = float(factor);
      hp.yarn_beta_fast = scale_key(f, a + "rope.scaling.yarn_beta_fast", hp.yarn_beta_fast);
      hp.yarn_beta_slow = scale_key(f, a + "rope.scaling.yarn_beta_slow", hp.yarn_beta_slow);
    }
  } else if (scaling != "none") {
    fail(f.path(), ": ", scaling_src, ": '", scaling, "' is not supported (none, linear, yarn)");
  }
  if (ro.freq_base != 0) {
    if (!(ro.freq_base > 1) || !std::isfinite(ro.freq_base))
      fail(f.path(), ": --rope-freq-base: ", ro.freq_base, " must be > 1");
    hp.rope.freq_base = ro.freq_base;
  }
  hp.rope.attn_factor = scale_key(f, a + "rope.scaling.attn_factor", 1.0);
  if (ro.orig_ctx < 0 || ro.orig_ctx > (1 << 24)) fail(f.path(), ": --yarn-orig-ctx: ", ro.orig_ctx, " out of range");
  if (ro.scale < 0 || !std::isfinite(ro.scale)) fail(f.path(), ": --rope-scale: ", ro.scale, " must be finite and > 0");
  if (ro.scale != 0 && scaling == "none") fail(f.path(), ": --rope-scale with RoPE scaling 'none' (give linear or yarn)");
  hp.rope_ctx_orig = opt("rope.scaling.original_context_length", uint64_t(hp.ctx_len));
  hp.yarn_orig_ctx = ro.orig_ctx > 0 ? ro.orig_ctx : hp.rope_ctx_orig;  // (phi3's long/short switch keeps the file's)
  hp.qkv_bias = false;
  for (const TensorSpec& t : spec->tensors) {
    hp.qkv_bias = hp.qkv_bias || t.role == Role::Bq;
    hp.qk_norm_whole = hp.qk_norm_whole || (t.role == Role::QNorm && t.rows == Extent::QDim);
  }
  // The architecture's forward differences (arch.h ArchFeatures).
  const ArchFeatures& ft = spec->features;
  hp.ffn_act = ft.ffn_act;
  hp.embd_scale = ft.embd_scale ? std::sqrt(float(hp.dim)) : 1.0f;
  const bool per_dim = ft.dim_per_head_scale_layers > 0 && hp.n_layers == ft.dim_per_head_scale_layers;
  hp.attn_scale = 1.0f / std::sqrt(float(per_dim ? hp.dim / hp.n_heads : hp.head_dim));
  if (ft.granite_scales) {
    auto scale = [&](const char* key, float d) { return scale_key(f, a + key, d); };
    hp.embd_scale = scale("embedding_scale", 1.0f);
    hp.residual_scale = scale("residual_scale", 1.0f);
    hp.attn_scale = scale("attention.scale", hp.attn_scale);
    hp.logit_scale = scale("logit_scale", 1.0f);
  }
  if (ft.softcap) {
    auto cap = [&](const char* key, float d) { return scale_key(f, a + key, d, /*allow_zero=*/true); };
    hp.attn_softcap = cap("attn_logit_softcapping", ft.attn_softcap);
    hp.final_softcap = cap("final_logit_softcapping", ft.final_softcap);
  }
  if (ft.swa != SwaLayers::None) {
    hp.swa_layers = ft.swa;
    hp.swa_period = ft.swa_period;
    hp.swa_rope_base = ft.swa_rope_base;  // (llama.cpp's gemma3 rule: no key)
    // A window of 0 is none: Phi-4's files (phi3) say so, llama.cpp's converter's mark of Phi-4.
    const std::string window_key = a + "attention.sliding_window";
    const uint64_t window = f.has(window_key) ? f.require_u64(window_key) : uint64_t(ft.sliding_window);
    hp.sliding_window = window == 0 ? 0 : positive_i32(f, window_key, window);
    if (hp.sliding_window == 0) hp.swa_layers = SwaLayers::None;  // (phi3 without the key: none)
  } else if (const std::string window_key = a + "attention.sliding_window";
             f.has(window_key) && f.require_u64(window_key) > 0) {
    // A window the architecture's forward has no layers for would be ignored, silently wrong:
    // OLMo 3's files say olmo2 with a window (and a pattern of windowed layers) and YaRN.
    fail(f.path(), ": key '", window_key, "' = ", f.require_u64(window_key),
         ": sliding-window attention is not supported for architecture '", hp.arch_name, "'",
         spec->arch == Arch::Olmo2 ? " (OLMo 3 files are not supported yet)" : "");
  }
  check_sizes(f, hp);
  // The attention kernels' limits, here rather than at every request's first attention call.
  if (hp.head_dim > kAttentionMaxHeadDim)
    fail(f.path(), ": key '", a, "attention.key_length': head_dim ", hp.head_dim, " is above the attention kernels' ",
         kAttentionMaxHeadDim);
  if (hp.n_heads / hp.n_kv_heads > kAttentionMaxGroup)
    fail(f.path(), ": key '", a, "attention.head_count_kv': ", hp.n_heads / hp.n_kv_heads,
         " query heads per KV head, above the attention kernels' ", kAttentionMaxGroup);
  return hp;
}

// YaRN as per-pair frequency divisors (llama.cpp's rope_yarn, ext_factor 1): pair i's angle is
// theta_interp (1 - mix_i) + theta_extrap mix_i with theta_interp = theta_extrap / factor, where
// mix_i ramps from 1 (pairs that turn fast: extrapolated, as trained) down to 0 (slow pairs:
// interpolated) between the correction dims of beta_fast and beta_slow rotations over the original
// context. That is theta_extrap / d_i with d_i = 1 / (1/factor (1 - mix_i) + mix_i), times the
// file's rope_freqs divisor where it has one. (n_rot/2,)
std::vector<float> yarn_factors(const HParams& hp, const float* rope_freqs) {
  const int32_t n = hp.rope.n_rot;
  const float base = hp.rope.freq_base, ctx = float(hp.yarn_orig_ctx);
  auto corr_dim = [&](float rotations) {
    return float(n) * std::log(ctx / (rotations * 2.0f * float(M_PI))) / (2.0f * std::log(base));
  };
  const float low = std::max(0.0f, std::floor(corr_dim(hp.yarn_beta_fast)));
  const float high = std::min(float(n - 1), std::ceil(corr_dim(hp.yarn_beta_slow)));
  std::vector<float> d(size_t(n / 2));
  for (int32_t i = 0; i < n / 2; ++i) {
    const float y = (float(i) - low) / std::max(0.001f, high - low);
    const float mix = 1.0f - std::clamp(y, 0.0f, 1.0f);
    d[size_t(i)] = (rope_freqs ? rope_freqs[i] : 1.0f) / ((1.0f - mix) / hp.yarn_factor + mix);
  }
  return d;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const RopeOverrides& rope) {
  return bind(GGUFFile::open(path), rope);
}

std::unique_ptr<Model> Model::bind(std::unique_ptr<GGUFFile> file, const RopeOverrides& rope) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  const GGUFFile& f = *m->file_;
  HParams& hp = m->hp_;
  hp = read_hparams(f, rope);

  const GGUFTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail(f.path(), ": missing tensor 'token_embd.weight'");
  if (emb->ne.size() != 2 || emb->ne[0] != uint64_t(hp.dim))
    fail(f.path(), ": tensor 'token_embd.weight': expected shape [", hp.dim, ", n_vocab], got ",
         shape_str(emb->ne));
  const uint64_t vocab = f.get_u64(hp.arch_name + ".vocab_size", emb->ne[1]);
  hp.n_vocab = positive_i32(f, hp.arch_name + ".vocab_size", vocab);
  // Vocabularies may be padded (Qwen2 and others): more embedding rows than listed tokens. The
  // rows beyond the list are never sampled (HParams::n_tokens).
  hp.n_tokens = hp.n_vocab;
  if (const GGUFValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->type == GGUFValueType::ARRAY) {
    if (toks->array.size() > uint64_t(hp.n_vocab))
      fail(f.path(), ": tokenizer has ", toks->array.size(), " tokens but the model's vocabulary is ",
           hp.n_vocab);
    if (toks->array.empty()) fail(f.path(), ": key 'tokenizer.ggml.tokens' is empty");
    hp.n_tokens = int32_t(toks->array.size());
  }

  Binder b(f);
  ModelWeights& w = m->w_;
  w.layers.resize(size_t(hp.n_layers));
  for_each_tensor(arch_spec(hp.arch), hp.n_layers, hp.n_experts > 0, [&](const TensorSpec& t, int32_t layer) {
    const std::string name = tensor_name(t, layer);
    const WeightSlot slot = weight_slot(w, t.role, layer);
    if (t.per_expert && t.matrix)
      *slot.matrix = b.experts(name, t.type, extent(t.rows, hp), extent(t.cols, hp), hp.n_experts, !t.optional);
    else if (t.per_expert)
      *slot.vector = b.vectors(name, t.type, extent(t.rows, hp), hp.n_experts, !t.optional);
    else if (t.matrix)
      *slot.matrix = b.matrix(name, t.type, extent(t.rows, hp), extent(t.cols, hp), !t.optional);
    else
      *slot.vector = b.vector(name, t.type, extent(t.rows, hp), !t.optional);
  });
  b.check_types();
  hp.tied_embeddings = w.output.data == nullptr;
  if (hp.tied_embeddings) w.output = w.token_embd;
  for (LayerWeights& L : w.layers) fused_views(L, hp);
  // A sink is a logit: +inf would zero its head's attention in one backend and be NaN in another.
  for (size_t il = 0; il < w.layers.size(); ++il)
    if (const float* s = w.layers[il].attn_sinks)
      for (int32_t h = 0; h < hp.n_heads; ++h)
        if (!std::isfinite(s[h]))
          fail(f.path(), ": tensor 'blk.", il, ".attn_sinks.weight': head ", h, "'s sink is ", s[h], " (must be finite)");
  hp.rope.freq_factors = w.rope_freqs;  // (long/short factors: chosen by the Forward's context)
  if (hp.yarn_factor > 0) {
    if (w.rope_long || w.rope_short) fail(f.path(), ": YaRN over the file's long/short rope factors is not supported");
    m->rope_factors_ = yarn_factors(hp, w.rope_freqs);
    hp.rope.freq_factors = m->rope_factors_.data();
    hp.yarn_mscale = 1.0f + 0.1f * std::log(hp.yarn_factor);
    hp.rope.attn_factor *= hp.yarn_mscale;
  }
  m->weight_bytes_ = b.bytes();
  return m;
}

}  // namespace ft
