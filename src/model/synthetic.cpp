#include "model/synthetic.h"

#include <algorithm>
#include <map>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "model/arch.h"

namespace ft {

const std::vector<SyntheticShape>& synthetic_shapes() {
  static const std::vector<SyntheticShape> shapes = {
      // name            dim  layers heads kv  ffn   vocab  ctx
      {"tiny", 64, 2, 4, 2, 192, 0, 2048},
      {"tiny-256", 256, 2, 4, 2, 768, 0, 2048},
      {"110m", 768, 12, 12, 4, 2048, 0, 4096},
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048},
      // gpt-oss-20b's (with --arch gpt-oss --head-dim 64 --experts 32 --experts-used 4; its o200k
      // vocabulary's 201,088 rows; 4,096 is YaRN's original context)
      {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, 4096},
  };
  return shapes;
}

namespace {

// splitmix64: a fast generator whose every output is a well-mixed function of its state, so a
// stream can start anywhere (one per row) and stay deterministic under any threading.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // ~N(0, 1): Irwin-Hall sum of four 16-bit uniforms (mean 2, variance 1/3), rescaled.
  // Bounded to +-3.46; plenty for random weights and ~10x cheaper than Box-Muller.
  float normal() {
    const uint64_t r = next();
    const uint32_t sum = uint32_t(r & 0xFFFF) + uint32_t((r >> 16) & 0xFFFF) +
                         uint32_t((r >> 32) & 0xFFFF) + uint32_t(r >> 48);
    return (float(sum) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }
};

uint64_t mix(uint64_t a, uint64_t b) { return SplitMix{a ^ (b * 0xD1B54A32D192ED03ull)}.next(); }

struct TensorPlan {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] = row length
  GGMLType type;
  float mean, std;           // elements ~ mean + std * N(0, 1)
  uint64_t rows() const {
    uint64_t r = 1;
    for (size_t d = 1; d < ne.size(); ++d) r *= ne[d];
    return r;
  }
};

// Row r of tensor t is a function of (seed, t, r) only.
std::vector<uint8_t> generate(const TensorPlan& t, uint64_t seed, uint64_t tensor_index) {
  const uint64_t ne0 = t.ne[0], rows = t.rows();
  const uint64_t rb = *row_bytes(t.type, ne0);
  std::vector<uint8_t> out(rb * rows);
  const uint64_t tensor_seed = mix(seed, tensor_index + 1);
  std::atomic<uint64_t> next_row{0};
  constexpr uint64_t kChunk = 16;
  auto work = [&] {
    std::vector<float> buf(ne0);
    for (;;) {
      const uint64_t r0 = next_row.fetch_add(kChunk);
      if (r0 >= rows) break;
      for (uint64_t r = r0; r < std::min(rows, r0 + kChunk); ++r) {
        SplitMix rng{mix(tensor_seed, r)};
        for (auto& x : buf) x = t.mean + t.std * rng.normal();
        quantize_row(t.type, buf.data(), out.data() + r * rb, int64_t(ne0));
      }
    }
  };
  const uint64_t elems = ne0 * rows;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned n_threads = elems < (1u << 16) ? 1u : unsigned(std::min<uint64_t>(hw, rows));
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < n_threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return out;
}

const SyntheticShape& find_shape(const std::string& name) {
  std::string known;
  for (const auto& s : synthetic_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  fail("synthetic model: unknown shape '", name, "' (known: ", known, ")");
}

// tokenizer.* keys: copied from a vocabulary GGUF, or the built-in byte-level vocabulary.
// Returns the number of tokens.
uint64_t add_vocab(GGUFWriter& w, const std::string& vocab_path, int shape_vocab) {
  if (!vocab_path.empty()) {
    const auto f = GGUFFile::open(vocab_path);
    const GGUFValue* tokens = f->find("tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUFValueType::ARRAY || tokens->array.empty())
      fail(vocab_path, ": no tokenizer.ggml.tokens array to take the vocabulary from");
    for (const auto& [k, v] : f->metadata())
      if (k.starts_with("tokenizer.")) w.set(k, v);
    return tokens->array.size();
  }
  // SentencePiece-style ids: <unk>=0 <s>=1 </s>=2, the 256 byte tokens, "\u2581" (the escaped
  // space, so spaces decode back to spaces), then unused padding.
  constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6;
  std::vector<std::string> text = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> type = {kUnknown, kControl, kControl};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    text.push_back(cat("<0x", hex[b >> 4], hex[b & 15], ">"));
    type.push_back(kByte);
  }
  text.push_back("\u2581");
  type.push_back(kNormal);
  for (int k = 0; int(text.size()) < shape_vocab; ++k) {
    text.push_back(cat("<unused_", k, ">"));
    type.push_back(kUnused);
  }
  const uint64_t n = text.size();
  w.set("tokenizer.ggml.model", GGUFValue::of_str("llama"));
  w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(text));
  w.set("tokenizer.ggml.scores", GGUFValue::of_f32_array(std::vector<float>(n, 0.0f)));
  w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(type));
  w.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(1));
  w.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GGUFValue::of_u32(0));
  w.set("tokenizer.ggml.add_bos_token", GGUFValue::of_bool(true));
  // Text maps to tokens as is (no space prefix), so decode(encode(x)) == x.
  w.set("tokenizer.ggml.add_space_prefix", GGUFValue::of_bool(false));
  return n;
}

}  // namespace

namespace {
constexpr struct {
  std::string_view name;
  SyntheticOptions::Mix mix;
  GGMLType base;
} kMixes[] = {{"q4_k_m", SyntheticOptions::Mix::Q4_K_M, GGMLType::Q4_K},
              {"q5_k_m", SyntheticOptions::Mix::Q5_K_M, GGMLType::Q5_K},
              {"q3_k_m", SyntheticOptions::Mix::Q3_K_M, GGMLType::Q3_K}};
std::string_view mix_name(SyntheticOptions::Mix m) {
  for (const auto& x : kMixes)
    if (x.mix == m) return x.name;
  return {};
}
}  // namespace

GGMLType mix_tensor_type(SyntheticOptions::Mix mix, GGMLType base, Role role, bool always_more_bits,
                         bool more_bits, int32_t layer, int32_t n_layers) {
  using Mix = SyntheticOptions::Mix;
  switch (mix) {
    case Mix::None: return base;
    case Mix::Q4_K_M: case Mix::Q5_K_M: return more_bits ? GGMLType::Q6_K : base;
    case Mix::Q3_K_M:
      if (always_more_bits) return GGMLType::Q6_K;
      if (role == Role::Wv) return layer < 2 ? GGMLType::Q5_K : GGMLType::Q4_K;
      if (role == Role::WDown) return layer < n_layers / 16 ? GGMLType::Q5_K : GGMLType::Q4_K;
      if (role == Role::Wo) return GGMLType::Q4_K;
      return base;
  }
  return base;
}

std::optional<NamedMix> parse_mix_name(std::string_view name) {
  for (const auto& x : kMixes)
    if (x.name == name) return NamedMix{x.mix, x.base};
  return std::nullopt;
}

void write_synthetic_model(const SyntheticOptions& opt, const std::string& path,
                           std::function<void(float)> progress) {
  const SyntheticShape& s = find_shape(opt.shape);
  const ArchSpec* spec = find_arch(opt.arch);
  if (!spec) fail("synthetic model: unknown architecture '", opt.arch, "' (known: ", known_archs(), ")");
  if (!is_supported_weight_type(opt.type))
    fail("synthetic model: weight type ", type_traits(opt.type).name, " is not supported (",
         supported_weight_type_names(), ")");
  if (s.dim % s.n_heads != 0 || s.n_heads % s.n_kv_heads != 0)
    fail("synthetic model: shape '", s.name, "' has inconsistent head counts");
  const std::string type_name(type_traits(opt.type).name);

  GGUFWriter w;
  const std::string a = opt.arch + ".";
  w.set("general.architecture", GGUFValue::of_str(opt.arch));
  w.set("general.name", GGUFValue::of_str(cat("synthetic-", s.name, "-", mix_name(opt.mix).empty() ? type_name : std::string(mix_name(opt.mix)), " (random weights)")));
  w.set("general.alignment", GGUFValue::of_u32(32));
  if (opt.n_layers < 0 || opt.n_layers > 4096 || opt.head_dim < 0 || opt.head_dim > 4096 || opt.head_dim % 2 != 0)
    fail("synthetic model: layers and head width must be in [0, 4096] (an even width)");
  if (opt.sliding_window < 0 || opt.sliding_window > (1 << 24))
    fail("synthetic model: the window must be in [0, 2^24]");
  if (opt.rope_scale != 0 && !(opt.rope_scale >= 1e-6f && opt.rope_scale <= 1e6f))
    fail("synthetic model: the RoPE scale must be in [1e-6, 1e6]");
  if (opt.rope_scaling != "linear" && opt.rope_scaling != "yarn")
    fail("synthetic model: RoPE scaling '", opt.rope_scaling, "' (linear, yarn)");
  if (opt.rope_orig_ctx < 0 || opt.rope_orig_ctx > (1 << 24)) fail("synthetic model: the original context must be in [0, 2^24]");
  if (opt.sliding_window > 0 && spec->features.swa == SwaLayers::None)
    fail("synthetic model: architecture '", opt.arch, "' has no windowed layers");
  const int n_layers = opt.n_layers > 0 ? opt.n_layers : s.n_layers;
  const int n_kv_heads = opt.n_kv_heads != 0 ? opt.n_kv_heads : s.n_kv_heads;
  if (n_kv_heads <= 0 || n_kv_heads > s.n_heads || s.n_heads % n_kv_heads != 0)
    fail("synthetic model: ", n_kv_heads, " KV heads do not divide the shape's ", s.n_heads, " heads");
  const uint32_t head_dim = uint32_t(opt.head_dim > 0 ? opt.head_dim : s.dim / s.n_heads);
  w.set(a + "context_length", GGUFValue::of_u32(uint32_t(s.ctx_len)));
  w.set(a + "embedding_length", GGUFValue::of_u32(uint32_t(s.dim)));
  w.set(a + "block_count", GGUFValue::of_u32(uint32_t(n_layers)));
  w.set(a + "feed_forward_length", GGUFValue::of_u32(uint32_t(s.ffn_dim)));
  w.set(a + "attention.head_count", GGUFValue::of_u32(uint32_t(s.n_heads)));
  w.set(a + "attention.head_count_kv", GGUFValue::of_u32(uint32_t(n_kv_heads)));
  w.set(a + "attention.layer_norm_rms_epsilon", GGUFValue::of_f32(spec->rms_eps));
  w.set(a + "rope.freq_base", GGUFValue::of_f32(spec->rope_freq_base));
  w.set(a + "rope.dimension_count", GGUFValue::of_u32(head_dim));
  if (head_dim != uint32_t(s.dim / s.n_heads)) {
    w.set(a + "attention.key_length", GGUFValue::of_u32(head_dim));
    w.set(a + "attention.value_length", GGUFValue::of_u32(head_dim));
  }
  if (opt.rope_scale > 0) {
    w.set(a + "rope.scaling.type", GGUFValue::of_str(opt.rope_scaling));
    w.set(a + "rope.scaling.factor", GGUFValue::of_f32(opt.rope_scale));
  }
  if (opt.rope_orig_ctx > 0)
    w.set(a + "rope.scaling.original_context_length", GGUFValue::of_u32(uint32_t(opt.rope_orig_ctx)));
  const ArchFeatures& ft = spec->features;
  if (ft.granite_scales) {  // (Granite 3.x 2B's values but the attention's, 1/head_dim as in its config)
    w.set(a + "embedding_scale", GGUFValue::of_f32(12.0f));
    w.set(a + "residual_scale", GGUFValue::of_f32(0.22f));
    w.set(a + "attention.scale", GGUFValue::of_f32(1.0f / float(head_dim)));
    w.set(a + "logit_scale", GGUFValue::of_f32(8.0f));
  }
  if (ft.softcap) {
    w.set(a + "attn_logit_softcapping", GGUFValue::of_f32(ft.attn_softcap));
    w.set(a + "final_logit_softcapping", GGUFValue::of_f32(ft.final_softcap));
  }
  if (ft.swa != SwaLayers::None)
    w.set(a + "attention.sliding_window",
          GGUFValue::of_u32(uint32_t(opt.sliding_window > 0   ? opt.sliding_window
                                     : ft.sliding_window > 0 ? ft.sliding_window
                                                             : s.ctx_len / 2)));
  const uint64_t n_vocab = add_vocab(w, opt.vocab_path, s.n_vocab);

  // The architecture's tensors in its table's (llama.cpp's) order. ne = [row length (fan-in), rows].
  HParams hp;
  hp.dim = s.dim;
  hp.n_heads = s.n_heads;
  hp.n_kv_heads = n_kv_heads;
  hp.head_dim = int32_t(head_dim);
  hp.ffn_dim = s.ffn_dim;
  hp.n_vocab = int32_t(n_vocab);
  hp.rope.n_rot = int32_t(head_dim);
  const bool experts = opt.n_experts > 0 || !has_dense_ffn(*spec);
  if (experts && !has_experts(*spec)) fail("synthetic model: architecture '", opt.arch, "' has no experts");
  if (experts) {
    hp.n_experts = opt.n_experts > 0 ? opt.n_experts : 4;
    hp.n_experts_used = opt.n_experts_used > 0 ? opt.n_experts_used : 2;
    hp.expert_ffn_dim = s.ffn_dim;
    if (hp.n_experts > kMaxExperts || hp.n_experts_used > std::min(hp.n_experts, kMaxExpertsUsed))
      fail("synthetic model: at most ", kMaxExperts, " experts, of which at most ", kMaxExpertsUsed, " used");
    w.set(a + "expert_count", GGUFValue::of_u32(uint32_t(hp.n_experts)));
    w.set(a + "expert_used_count", GGUFValue::of_u32(uint32_t(hp.n_experts_used)));
    w.set(a + "expert_feed_forward_length", GGUFValue::of_u32(uint32_t(hp.expert_ffn_dim)));
    hp.shexp_ffn_dim = s.ffn_dim;  // (qwen2moe's shared expert, where the table has one)
    if (has_shared_expert(*spec))
      w.set(a + "expert_shared_feed_forward_length", GGUFValue::of_u32(uint32_t(hp.shexp_ffn_dim)));
  }
  if (opt.mix != SyntheticOptions::Mix::None && opt.type != parse_mix_name(mix_name(opt.mix))->base)
    fail("synthetic model: the ", mix_name(opt.mix), " mix needs type ", type_traits(parse_mix_name(mix_name(opt.mix))->base).name);
  auto use_more_bits = [n_layers](int i) {  // llama.cpp's choice of Q6_K layers in Q4_K_M / Q5_K_M
    return i < n_layers / 8 || i >= 7 * n_layers / 8 || (i - n_layers / 8) % 3 == 2;
  };
  std::vector<TensorPlan> plan;
  for_each_tensor(*spec, n_layers, experts, [&](const TensorSpec& t, int32_t layer) {
    if (!t.synthetic) return;
    std::string name = tensor_name(t, layer);
    const uint64_t rows = uint64_t(extent(t.rows, hp));
    switch (t.init) {
      case Init::Matrix: {
        const uint64_t fan_in = uint64_t(extent(t.cols, hp));
        const bool more_bits =
            t.more_bits == MoreBits::Always || (t.more_bits == MoreBits::SomeLayers && use_more_bits(layer));
        const GGMLType type =
            t.type == TypeClass::F32
                ? GGMLType::F32
                : mix_tensor_type(opt.mix, opt.type, t.role, t.more_bits == MoreBits::Always, more_bits, layer, n_layers);
        std::vector<uint64_t> ne = {fan_in, rows};
        if (t.per_expert) ne.push_back(uint64_t(hp.n_experts));
        plan.push_back({std::move(name), std::move(ne), type, 0.0f, 1.0f / std::sqrt(float(fan_in))});
        break;
      }
      case Init::Norm: plan.push_back({std::move(name), {rows}, GGMLType::F32, 1.0f, 0.05f}); break;
      case Init::Bias: {
        std::vector<uint64_t> ne = {rows};
        if (t.per_expert) ne.push_back(uint64_t(hp.n_experts));
        plan.push_back({std::move(name), std::move(ne), GGMLType::F32, 0.0f, 0.05f});
        break;
      }
      case Init::Sink: plan.push_back({std::move(name), {rows}, GGMLType::F32, 0.0f, 1.0f}); break;
      case Init::Gate: plan.push_back({std::move(name), {rows}, GGMLType::F32, 0.0f, 1.0f / std::sqrt(float(rows))}); break;
    }
  });

  // Validate every tensor before generating anything.
  uint64_t total = 0;
  for (const auto& t : plan) {
    const auto rb = row_bytes(t.type, t.ne[0]);
    if (!rb)
      fail("synthetic model: tensor '", t.name, "': row length ", t.ne[0], " is not a multiple of the ",
           type_traits(t.type).name, " block size ", type_traits(t.type).block_size, " (shape '", s.name,
           "')");
    total += *rb * t.rows();
  }

  // Each tensor is generated and quantized straight into the writer (no f32 copy of the model).
  uint64_t done = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    std::vector<uint8_t> data = generate(plan[k], opt.seed, k);
    done += data.size();
    w.add_tensor(plan[k].name, plan[k].type, plan[k].ne, std::move(data));
    if (progress) progress(0.9f * float(double(done) / double(total)));
  }
  w.write(path);
  if (progress) progress(1.0f);
}

void write_synthetic_lora(const std::string& base_path, const SyntheticLoraOptions& opt, const std::string& adapter_path,
                          const std::string& merged_path) {
  if (opt.rank < 1 || opt.rank > 4096) fail("synthetic LoRA: rank must be in [1, 4096], got ", opt.rank);
  if (opt.type != GGMLType::F32 && opt.type != GGMLType::F16 && opt.type != GGMLType::Q8_0)
    fail("synthetic LoRA: type ", type_traits(opt.type).name, " is not supported (f32, f16, q8_0)");
  // B's rows are rank long: where they are not whole blocks of the type, F16 (as llama.cpp's
  // converter falls back for such tensors: a rank-16 adapter at --outtype q8_0).
  const GGMLType type_b = row_bytes(opt.type, uint64_t(opt.rank)) ? opt.type : GGMLType::F16;
  const auto base = GGUFFile::open(base_path);
  const std::string arch = base->require_str("general.architecture");
  const ArchSpec* spec = find_arch(arch);
  if (!spec) fail(base_path, ": architecture '", arch, "' is not supported");
  const int32_t n_layers = int32_t(base->require_u64(arch + ".block_count"));
  const float scale = opt.alpha / float(opt.rank);
  const uint64_t r = uint64_t(opt.rank);

  GGUFWriter ad;
  ad.set("general.architecture", GGUFValue::of_str(arch));
  ad.set("general.type", GGUFValue::of_str("adapter"));
  ad.set("general.name", GGUFValue::of_str(cat("synthetic LoRA rank ", opt.rank, " (random weights)")));
  ad.set("general.alignment", GGUFValue::of_u32(32));
  ad.set("adapter.type", GGUFValue::of_str("lora"));
  ad.set("adapter.lora.alpha", GGUFValue::of_f32(opt.alpha));
  GGUFWriter merged;
  if (!merged_path.empty())
    for (const auto& [k, v] : base->metadata()) merged.set(k, v);
  // The adapted matrices: every per-layer matrix of the table (attention and FFN; not a mixture
  // of experts' router, experts or shared expert (qwen2moe), which adapters do not reach: model/lora.h).
  std::map<std::string, bool> adapted;
  for_each_tensor(*spec, n_layers, file_has_experts(*spec, *base), [&](const TensorSpec& t, int32_t layer) {
    if (t.matrix && t.per_layer && !expert_role(t.role)) adapted[tensor_name(t, layer)] = true;
  });
  uint64_t k = 0;
  for (const GGUFTensorInfo& t : base->tensors()) {
    std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
    if (adapted.count(t.name) && t.ne.size() == 2) {
      const uint64_t in = t.ne[0], out = t.ne[1];
      if (!row_bytes(opt.type, in))
        fail("synthetic LoRA: ", t.name, ": rows of ", in, " are not whole ", type_traits(opt.type).name, " blocks");
      const TensorPlan pa{t.name + ".lora_a", {in, r}, opt.type, 0.0f, 1.0f / std::sqrt(float(in))};
      const TensorPlan pb{t.name + ".lora_b", {r, out}, type_b, 0.0f, 0.25f / std::sqrt(float(r))};
      std::vector<uint8_t> a = generate(pa, opt.seed ^ 0x4C6F5241ull, 2 * k);
      std::vector<uint8_t> b = generate(pb, opt.seed ^ 0x4C6F5241ull, 2 * k + 1);
      ++k;
      if (!merged_path.empty()) {
        // W + scale * B A, from the stored A and B (what a loader dequantizes).
        std::vector<float> fa(in * r), fb(r * out), w(in);
        const uint64_t rba = *row_bytes(opt.type, in), rbb = *row_bytes(type_b, r), rbw = *row_bytes(t.type, in);
        for (uint64_t i = 0; i < r; ++i) dequantize_row(opt.type, a.data() + i * rba, fa.data() + i * in, int64_t(in));
        for (uint64_t o = 0; o < out; ++o) dequantize_row(type_b, b.data() + o * rbb, fb.data() + o * r, int64_t(r));
        for (uint64_t o = 0; o < out; ++o) {
          dequantize_row(t.type, bytes.data() + o * rbw, w.data(), int64_t(in));
          for (uint64_t i = 0; i < r; ++i) {
            const float c = scale * fb[o * r + i];
            const float* ai = fa.data() + i * in;
            for (uint64_t j = 0; j < in; ++j) w[j] += c * ai[j];
          }
          quantize_row(t.type, w.data(), bytes.data() + o * rbw, int64_t(in));
        }
      }
      ad.add_tensor(pa.name, pa.type, pa.ne, std::move(a));
      ad.add_tensor(pb.name, pb.type, pb.ne, std::move(b));
    }
    if (!merged_path.empty()) merged.add_tensor(t.name, t.type, t.ne, std::move(bytes));
  }
  if (k == 0) fail(base_path, ": no matrix to adapt");
  ad.write(adapter_path);
  if (!merged_path.empty()) merged.write(merged_path);
}

}  // namespace ft
