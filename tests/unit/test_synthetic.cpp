// Synthetic models: every weight type and both architectures load with the expected
// hyperparameters, run a forward pass with finite logits, tokenize, and are byte-reproducible
// from the seed. Only the small shapes are generated here (110m / 1.1b take too long).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <set>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kv/kv_cache.h"
#include "model/arch.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

using test::TempFile;

// Logits (n_prompt, n_vocab) of the prompt run as one batch.
std::vector<float> run_prompt(const Model& m, const std::vector<int32_t>& tokens) {
  auto be = make_backend("cpu", 2);
  const int64_t n = int64_t(tokens.size());
  Forward fwd(m, *be, n);
  KVCache kv(KVCacheConfig{m.hparams().n_layers, m.hparams().kv_dim(), 16, 8, true, m.hparams().n_kv_heads});
  EXPECT_TRUE(kv.reserve(0, n));
  Batch b;
  for (int64_t i = 0; i < n; ++i) b.add(tokens[size_t(i)], int32_t(i), 0, true);
  std::vector<float> logits(size_t(n * m.hparams().n_vocab));
  fwd.run(b, kv, logits.data());
  return logits;
}

// Finite, not constant, and of moderate size (weights ~ N(0, 1/fan_in) keep activations O(1)).
void expect_sane_logits(const std::vector<float>& l) {
  ASSERT_FALSE(l.empty());
  double sum = 0, sq = 0;
  for (float x : l) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += double(x) * x;
  }
  const double mean = sum / double(l.size());
  const double sd = std::sqrt(std::max(0.0, sq / double(l.size()) - mean * mean));
  EXPECT_GT(sd, 0.05) << "logits nearly constant";
  EXPECT_LT(sd, 50.0) << "logits blew up";
}

struct Case {
  std::string shape;
  GGMLType type;
  std::string arch;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  std::string s = cat(p.param.arch, "_", type_traits(p.param.type).name, "_", p.param.shape);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Every architecture of the table, in its order (known_archs()).
constexpr const char* kArchs[] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "granite", "gpt-oss",
                                  "olmo2", "gemma", "qwen2moe"};

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const char* arch : kArchs) {
    for (GGMLType t : {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::MXFP4})
      out.push_back({"tiny", t, arch});  // (MXFP4: qwen3moe's and gpt-oss's experts too)
    // k-quants need rows of whole 256-element blocks: tiny's dim 64 cannot (see UnfitType).
    for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K}) out.push_back({"tiny-256", t, arch});
  }
  // The grid i-quants and the ternary types (the levels layouts: their kernels' tests are
  // test_kernels'): one architecture.
  for (GGMLType t : {GGMLType::IQ2_XXS, GGMLType::IQ2_XS, GGMLType::IQ2_S, GGMLType::IQ3_XXS, GGMLType::IQ3_S,
                     GGMLType::IQ1_S, GGMLType::IQ1_M, GGMLType::TQ1_0, GGMLType::TQ2_0})
    out.push_back({"tiny-256", t, "llama"});
  return out;
}

class SyntheticModel : public ::testing::TestWithParam<Case> {};

TEST_P(SyntheticModel, LoadsWithExpectedHParamsAndRuns) {
  const Case& c = GetParam();
  SyntheticOptions opt;
  opt.shape = c.shape;
  opt.type = c.type;
  opt.arch = c.arch;
  TempFile tmp(case_name({c, 0}) + ".gguf");
  write_synthetic_model(opt, tmp.path());
  const auto m = Model::load(tmp.path());
  const HParams& hp = m->hparams();
  const SyntheticShape* s = nullptr;
  for (const auto& x : synthetic_shapes())
    if (x.name == c.shape) s = &x;
  ASSERT_NE(s, nullptr);
  const bool qwen = c.arch == "qwen2" || c.arch == "gpt-oss" || c.arch == "qwen2moe";  // (Q/K/V biases)
  const ArchSpec* spec = find_arch(c.arch);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(hp.arch, spec->arch);
  EXPECT_EQ(hp.dim, s->dim);
  EXPECT_EQ(hp.n_layers, s->n_layers);
  EXPECT_EQ(hp.n_heads, s->n_heads);
  EXPECT_EQ(hp.n_kv_heads, s->n_kv_heads);
  EXPECT_EQ(hp.head_dim, s->dim / s->n_heads);
  EXPECT_EQ(hp.ffn_dim, s->ffn_dim);
  EXPECT_EQ(hp.ctx_len, s->ctx_len);
  EXPECT_EQ(hp.n_vocab, 260);
  EXPECT_EQ(hp.rope.n_rot, hp.head_dim);
  EXPECT_FLOAT_EQ(hp.rope.freq_base, spec->rope_freq_base);
  EXPECT_FLOAT_EQ(hp.rms_eps, spec->rms_eps);
  EXPECT_EQ(hp.qkv_bias, qwen);
  // Tied exactly when the writer leaves the output matrix out (gemma2).
  const bool writes_output = std::any_of(spec->tensors.begin(), spec->tensors.end(),
                                         [](const TensorSpec& t) { return t.role == Role::Output && t.synthetic; });
  EXPECT_EQ(hp.tied_embeddings, !writes_output);
  EXPECT_EQ(hp.name, cat("synthetic-", c.shape, "-", type_traits(c.type).name, " (random weights)"));
  EXPECT_EQ(m->file().alignment(), 32u);
  if (qwen) {
    EXPECT_NE(m->weights().layers[0].bq, nullptr);
  }

  // Matrices (a mixture of experts' stacks too) in the requested type; vectors (the experts'
  // stacked biases too) and a router in F32.
  for (const auto& t : m->file().tensors()) {
    SCOPED_TRACE(t.name);
    const bool router = t.name.find("ffn_gate_inp") != std::string::npos;
    const bool bias = t.name.ends_with(".bias");
    EXPECT_EQ(t.type, t.ne.size() >= 2 && !router && !bias ? c.type : GGMLType::F32);
  }
  if (c.arch == "qwen3moe" || c.arch == "gpt-oss" || c.arch == "qwen2moe") {
    EXPECT_EQ(hp.n_experts, 4);
    EXPECT_EQ(hp.n_experts_used, 2);
    EXPECT_EQ(hp.expert_ffn_dim, s->ffn_dim);
    for (const LayerWeights& L : m->weights().layers) {
      ASSERT_EQ(L.experts.size(), 4u);
      EXPECT_EQ(L.w_gate.data, nullptr);
      EXPECT_EQ(L.moe_router.n_rows, 4);
      const uint64_t rb = *row_bytes(c.type, uint64_t(hp.dim));
      for (size_t e = 0; e < 4; ++e) {  // row views of the stacks: expert e's rows
        EXPECT_EQ(L.experts[e].gate.data, static_cast<const uint8_t*>(L.gate_exps.data) + e * s->ffn_dim * rb);
        EXPECT_EQ(L.experts[e].down.n_rows, hp.dim);
        EXPECT_EQ(L.experts[e].down.n_cols, s->ffn_dim);
        // gpt-oss: each expert's rows of the stacked biases
        EXPECT_EQ(L.experts[e].gate_b, L.gate_exps_b ? L.gate_exps_b + e * size_t(s->ffn_dim) : nullptr);
        EXPECT_EQ(L.experts[e].down_b, L.down_exps_b ? L.down_exps_b + e * size_t(hp.dim) : nullptr);
      }
      EXPECT_EQ(L.attn_sinks != nullptr, c.arch == "gpt-oss");
      EXPECT_EQ(L.bo != nullptr, c.arch == "gpt-oss");
      EXPECT_EQ(L.moe_router_b != nullptr, c.arch == "gpt-oss");
      EXPECT_EQ(L.up_exps_b != nullptr, c.arch == "gpt-oss");
      EXPECT_EQ(L.shexp_gate_inp != nullptr, c.arch == "qwen2moe");
      EXPECT_EQ(L.w_down_shexp.n_cols, c.arch == "qwen2moe" ? s->ffn_dim : 0);
    }
  }
  // Weight statistics: matrix rows ~ N(0, 1/fan_in), norms ~ 1.
  const WeightView& wq = m->weights().layers[1].wq;
  std::vector<float> row(size_t(wq.n_cols));
  double sq = 0;
  const uint64_t rb = *row_bytes(wq.type, uint64_t(wq.n_cols));
  for (int64_t r = 0; r < wq.n_rows; ++r) {
    dequantize_row(wq.type, static_cast<const uint8_t*>(wq.data) + r * rb, row.data(), wq.n_cols);
    for (float x : row) sq += double(x) * x;
  }
  const double sd = std::sqrt(sq / double(wq.n_rows * wq.n_cols));
  // (Ternary weights are +-amax of their 256 or 0: their RMS moves by ~15%.)
  const bool ternary = c.type == GGMLType::TQ1_0 || c.type == GGMLType::TQ2_0;
  EXPECT_NEAR(sd * std::sqrt(double(wq.n_cols)), 1.0, ternary ? 0.3 : 0.15);
  // The first layer's first norm: its pre-norm, or (olmo2: none) its post-attention norm.
  const LayerWeights& L0 = m->weights().layers[0];
  const float* norm = L0.attn_norm ? L0.attn_norm : L0.attn_post_norm;
  ASSERT_NE(norm, nullptr);
  double nsum = 0;
  for (int k = 0; k < hp.dim; ++k) nsum += norm[k];
  EXPECT_NEAR(nsum / hp.dim, 1.0, 0.05);
  EXPECT_NE(norm[0], norm[1]);

  expect_sane_logits(run_prompt(*m, {1, 72, 108, 108, 111, 35}));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, SyntheticModel, ::testing::ValuesIn(all_cases()), case_name);

// One table per architecture drives the writer and the binding: the file holds exactly the
// table's tensors in its order, each binds to a distinct weight slot, and the profiler's op names
// are unique within an architecture.
TEST(Synthetic, ArchitectureTableDrivesWriterAndBinding) {
  for (const char* arch : kArchs) {
    const ArchSpec* spec = find_arch(arch);
    ASSERT_NE(spec, nullptr) << arch;
    SyntheticOptions opt;
    opt.arch = arch;
    TempFile tmp(cat("table_", arch, ".gguf"));
    write_synthetic_model(opt, tmp.path());
    const auto m = Model::load(tmp.path());
    std::vector<std::string> expected;
    std::set<const void*> slots;
    for_each_tensor(*spec, m->hparams().n_layers, m->hparams().n_experts > 0, [&](const TensorSpec& t, int32_t layer) {
      const ConstWeightSlot slot = weight_slot(m->weights(), t.role, layer);
      EXPECT_TRUE(slots.insert(slot.matrix ? static_cast<const void*>(slot.matrix) : slot.vector).second)
          << tensor_name(t, layer);
      if (!t.synthetic) return;
      expected.push_back(tensor_name(t, layer));
      EXPECT_TRUE(slot.matrix ? slot.matrix->data != nullptr : *slot.vector != nullptr) << tensor_name(t, layer);
    });
    std::vector<std::string> written;
    for (const auto& t : m->file().tensors()) written.push_back(t.name);
    EXPECT_EQ(written, expected) << arch;
    std::set<std::string_view> ops;
    for (const TensorSpec& t : spec->tensors) EXPECT_TRUE(ops.insert(t.op_name).second) << t.op_name;
  }
  EXPECT_EQ(find_arch("gpt2"), nullptr);
  std::string names;
  for (const char* arch : kArchs) names += cat(names.empty() ? "" : ", ", arch);
  EXPECT_EQ(known_archs(), names);
}

// Phi-3's fused tensors bind whole, and the per-projection weights are row views into them (no
// copies): Q, K, V and gate, up in the fused tensors' row order. Gemma 2's forward differences
// come from its table and the keys the writer sets.
TEST(Synthetic, FusedTensorsAreRowViewsAndFeaturesBind) {
  for (GGMLType type : {GGMLType::F16, GGMLType::Q8_0}) {
    SyntheticOptions opt;
    opt.arch = "phi3";
    opt.type = type;
    TempFile tmp("phi3_views.gguf");
    write_synthetic_model(opt, tmp.path());
    const auto m = Model::load(tmp.path());
    const HParams& hp = m->hparams();
    const uint64_t rb = *row_bytes(type, uint64_t(hp.dim));
    for (const LayerWeights& L : m->weights().layers) {
      const auto* base = static_cast<const uint8_t*>(L.wqkv.data);
      ASSERT_NE(base, nullptr);
      EXPECT_EQ(L.wqkv.n_rows, hp.q_dim() + 2 * hp.kv_dim());
      EXPECT_EQ(L.wq.data, base);
      EXPECT_EQ(L.wk.data, base + uint64_t(hp.q_dim()) * rb);
      EXPECT_EQ(L.wv.data, base + uint64_t(hp.q_dim() + hp.kv_dim()) * rb);
      EXPECT_EQ(L.wq.n_rows, hp.q_dim());
      EXPECT_EQ(L.wv.n_rows, hp.kv_dim());
      const auto* gu = static_cast<const uint8_t*>(L.w_gate_up.data);
      EXPECT_EQ(L.w_gate.data, gu);
      EXPECT_EQ(L.w_up.data, gu + uint64_t(hp.ffn_dim) * rb);
      EXPECT_EQ(L.w_up.n_rows, hp.ffn_dim);
    }
    EXPECT_EQ(hp.swa_layers, SwaLayers::All);
    EXPECT_GT(hp.sliding_window, 0);
    EXPECT_EQ(hp.layer_window(1), hp.sliding_window);
    EXPECT_EQ(hp.ffn_act, GateAct::SiLU);
  }
  SyntheticOptions opt;
  opt.arch = "gemma2";
  TempFile tmp("gemma2_features.gguf");
  write_synthetic_model(opt, tmp.path());
  const auto m = Model::load(tmp.path());
  const HParams& hp = m->hparams();
  EXPECT_TRUE(hp.tied_embeddings);
  EXPECT_EQ(hp.ffn_act, GateAct::GeluTanh);
  EXPECT_FLOAT_EQ(hp.embd_scale, std::sqrt(float(hp.dim)));
  EXPECT_FLOAT_EQ(hp.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(hp.final_softcap, 30.0f);
  EXPECT_EQ(hp.layer_window(0), 4096);
  EXPECT_EQ(hp.layer_window(1), 0);
  EXPECT_EQ(hp.layer_window(2), 4096);
  EXPECT_EQ(hp.swa_rope_base, 0.0f);
  for (const LayerWeights& L : m->weights().layers) {
    EXPECT_NE(L.attn_post_norm, nullptr);
    EXPECT_NE(L.ffn_post_norm, nullptr);
    EXPECT_EQ(L.q_norm, nullptr);
  }
}

// Qwen3: per-head q/k norms, no biases, a head width from key_length (Qwen3's 128 on every size,
// whatever dim / heads is). Gemma 3: Gemma 2's tensors with q/k norms, no soft caps, five windowed
// layers then a global one (llama.cpp's pattern), the windowed ones on RoPE base 10000 unscaled,
// the 27B's (62 layers) query scale from dim / heads.
TEST(Synthetic, Qwen3AndGemma3FeaturesBind) {
  {
    SyntheticOptions opt;
    opt.arch = "qwen3";
    opt.head_dim = 32;  // tiny: dim 64, 4 heads -> q_dim 128 != dim
    TempFile tmp("qwen3_features.gguf");
    write_synthetic_model(opt, tmp.path());
    const auto m = Model::load(tmp.path());
    const HParams& hp = m->hparams();
    EXPECT_EQ(hp.head_dim, 32);
    EXPECT_EQ(hp.q_dim(), 128);
    EXPECT_EQ(hp.rope.style, RopeStyle::Halves);
    EXPECT_FALSE(hp.qkv_bias);
    EXPECT_EQ(hp.swa_layers, SwaLayers::None);
    EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / std::sqrt(32.0f));
    for (const LayerWeights& L : m->weights().layers) {
      EXPECT_NE(L.q_norm, nullptr);
      EXPECT_NE(L.k_norm, nullptr);
      EXPECT_EQ(L.wq.n_rows, 128);
      EXPECT_EQ(L.wo.n_cols, 128);
    }
    expect_sane_logits(run_prompt(*m, {1, 72, 108, 108, 111, 35}));
  }
  for (const int layers : {7, 62}) {
    SyntheticOptions opt;
    opt.arch = "gemma3";
    opt.n_layers = layers;
    opt.head_dim = 32;  // != dim / heads (16), so the two query scales differ
    opt.sliding_window = 8;
    opt.rope_scale = 8;
    TempFile tmp(cat("gemma3_features_", layers, ".gguf"));
    write_synthetic_model(opt, tmp.path());
    const auto m = Model::load(tmp.path());
    const HParams& hp = m->hparams();
    EXPECT_EQ(hp.n_layers, layers);
    EXPECT_TRUE(hp.tied_embeddings);
    EXPECT_EQ(hp.ffn_act, GateAct::GeluTanh);
    EXPECT_FLOAT_EQ(hp.embd_scale, std::sqrt(float(hp.dim)));
    EXPECT_EQ(hp.attn_softcap, 0.0f);
    EXPECT_EQ(hp.final_softcap, 0.0f);
    for (int il = 0; il < layers; ++il) EXPECT_EQ(hp.layer_window(il), il % 6 == 5 ? 0 : 8) << "layer " << il;
    EXPECT_FLOAT_EQ(hp.swa_rope_base, 1e4f);
    EXPECT_FLOAT_EQ(hp.rope.freq_base, 1e6f);
    EXPECT_FLOAT_EQ(hp.rope.freq_scale, 1.0f / 8);
    EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / std::sqrt(float(layers == 62 ? hp.dim / hp.n_heads : hp.head_dim)));
    for (const LayerWeights& L : m->weights().layers) {
      EXPECT_NE(L.q_norm, nullptr);
      EXPECT_NE(L.attn_post_norm, nullptr);
    }
  }
}

// Phi-4's files are phi3 with attention.sliding_window = 0 (llama.cpp's converter marks Phi-4 so):
// no window, where a missing key is the same and any other value windows every layer.
TEST(Synthetic, Phi3WindowOfZeroIsNone) {
  SyntheticOptions opt;
  opt.arch = "phi3";
  TempFile src("phi4_src.gguf"), dst("phi4.gguf");
  write_synthetic_model(opt, src.path());
  {
    const auto f = GGUFFile::open(src.path());
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, k == "phi3.attention.sliding_window" ? GGUFValue::of_u32(0) : v);
    for (const auto& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    w.write(dst.path());
  }
  const auto windowed = Model::load(src.path());
  EXPECT_GT(windowed->hparams().layer_window(0), 0);
  const auto m = Model::load(dst.path());
  EXPECT_EQ(m->hparams().sliding_window, 0);
  EXPECT_EQ(m->hparams().swa_layers, SwaLayers::None);
  EXPECT_EQ(m->hparams().layer_window(0), 0);
  expect_sane_logits(run_prompt(*m, {1, 72, 108, 108, 111, 35}));
}

// OLMo 3's files say olmo2 with attention.sliding_window (and windowed layers olmo2's forward does
// not have): refused at load naming the key, where a window of 0 is none (as Phi-4's).
TEST(Synthetic, WindowWithoutWindowedLayersIsRefused) {
  SyntheticOptions opt;
  opt.arch = "olmo2";
  TempFile src("olmo3_src.gguf"), dst("olmo3.gguf");
  write_synthetic_model(opt, src.path());
  const auto with_window = [&](uint32_t window) {
    const auto f = GGUFFile::open(src.path());
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    w.set("olmo2.attention.sliding_window", GGUFValue::of_u32(window));
    for (const auto& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    w.write(dst.path());
  };
  with_window(4096);
  try {
    Model::load(dst.path());
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'olmo2.attention.sliding_window' = 4096: sliding-window attention is not "
                                         "supported for architecture 'olmo2' (OLMo 3 files are not supported yet)"),
              std::string::npos)
        << e.what();
  }
  with_window(0);
  EXPECT_EQ(Model::load(dst.path())->hparams().swa_layers, SwaLayers::None);
}

// gpt-oss's attention sinks are logits: a non-finite one is refused at load naming its tensor and
// head (+inf zeroes a head in the flash kernel and is NaN in the reference); a transposed expert
// bias stack is refused naming its shape.
TEST(Synthetic, GptOssSinksFiniteAndBiasStacksShaped) {
  SyntheticOptions opt;
  opt.arch = "gpt-oss";
  opt.n_experts = 3;
  TempFile src("gptoss_src.gguf"), dst("gptoss_bad.gguf");
  write_synthetic_model(opt, src.path());
  const auto good = Model::load(src.path());
  ASSERT_NE(good->weights().layers[1].attn_sinks, nullptr);
  auto load_error = [&] {
    try {
      Model::load(dst.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  auto rewrite = [&](const std::string& name, auto edit) {
    const auto f = GGUFFile::open(src.path());
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors()) {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      std::vector<uint64_t> ne = t.ne;
      if (t.name == name) edit(data, ne);
      w.add_tensor(t.name, t.type, ne, std::move(data));
    }
    w.write(dst.path());
  };
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    rewrite("blk.1.attn_sinks.weight", [&](std::vector<uint8_t>& d, std::vector<uint64_t>&) { std::memcpy(d.data() + 4, &bad, 4); });
    EXPECT_NE(load_error().find("blk.1.attn_sinks.weight': head 1's sink"), std::string::npos) << load_error();
  }
  rewrite("blk.0.ffn_up_exps.bias", [](std::vector<uint8_t>&, std::vector<uint64_t>& ne) { std::swap(ne[0], ne[1]); });
  EXPECT_NE(load_error().find("tensor 'blk.0.ffn_up_exps.bias': expected shape"), std::string::npos) << load_error();
}

// MXFP4 blocks the engine cannot compute are refused at load naming the tensor, the block's
// place and its exponent: a nonzero block with a scale beyond f16 (e >= 144: 2^16; the kernels
// hold the scale as an f16) and any e = 255 (NaN in the MX format). Tiny scales (e < 104, below
// f16's subnormals) and all-zero blocks with any other scale load and run (computed as 0).
TEST(Synthetic, Mxfp4RefusedScalesFailTheLoad) {
  SyntheticOptions opt;
  opt.arch = "gpt-oss";
  opt.type = GGMLType::MXFP4;
  opt.n_experts = 3;
  TempFile src("mxfp4_src.gguf"), dst("mxfp4_bad.gguf");
  write_synthetic_model(opt, src.path());
  const std::string name = "blk.1.ffn_down_exps.weight";
  auto load_error = [&] {
    try {
      const auto m = Model::load(dst.path());
      expect_sane_logits(run_prompt(*m, {1, 72, 108, 108, 111}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  uint64_t per_row = 0, rows = 0;
  auto rewrite = [&](uint64_t block, uint8_t e, bool zero) {
    const auto f = GGUFFile::open(src.path());
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors()) {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      if (t.name == name) {
        EXPECT_EQ(t.type, GGMLType::MXFP4);
        per_row = t.ne[0] / 32;
        rows = t.ne[1];
        data[size_t(17 * block)] = e;
        if (zero) std::memset(data.data() + 17 * block + 1, 0x08, 16);
        else data[size_t(17 * block + 1)] = 0x07;  // (+12: nonzero)
      }
      w.add_tensor(t.name, t.type, t.ne, std::move(data));
    }
    w.write(dst.path());
  };
  rewrite(0, 128, false);
  const uint64_t block = (2 * rows + 5) * per_row + 1;  // expert 2, row 5, columns 32..63
  for (int e : {144, 200, 254, 255}) {
    rewrite(block, uint8_t(e), false);
    const std::string err = load_error();
    EXPECT_NE(err.find(cat("tensor '", name, "' (MXFP4): the block at expert 2, row 5, columns 32..63 has scale exponent e = ", e)),
              std::string::npos) << err;
  }
  rewrite(block, 255, true);  // (NaN even on zeros)
  EXPECT_NE(load_error().find("e = 255 (NaN"), std::string::npos) << load_error();
  for (int e : {0, 50, 103}) {  // tiny scales: 0
    rewrite(block, uint8_t(e), false);
    EXPECT_EQ(load_error(), "(loaded)") << e;
  }
  for (int e : {144, 254}) {  // zeros under a scale beyond f16
    rewrite(block, uint8_t(e), true);
    EXPECT_EQ(load_error(), "(loaded)") << e;
  }
}

// YaRN from the file's keys and the same from load-time overrides (run/serve's --rope-scaling yarn
// --rope-scale 4 --yarn-orig-ctx 64) give the same RoPE: divisors from 1 (pairs extrapolated, fast)
// ramping to the factor (interpolated, slow), the attention factor 1 + 0.1 ln 4; linear and base
// overrides; bad values name their flag.
TEST(Synthetic, YarnFromKeysOrOverrides) {
  SyntheticOptions opt;
  opt.arch = "qwen3";
  opt.head_dim = 32;
  TempFile plain("rope_plain.gguf"), yarn("rope_yarn.gguf");
  write_synthetic_model(opt, plain.path());
  opt.rope_scale = 4;
  opt.rope_scaling = "yarn";
  opt.rope_orig_ctx = 64;
  write_synthetic_model(opt, yarn.path());
  const auto from_keys = Model::load(yarn.path());
  const auto from_flags = Model::load(plain.path(), RopeOverrides{"yarn", 4, 0, 64});
  for (const Model* m : {from_keys.get(), from_flags.get()}) {
    const HParams& hp = m->hparams();
    EXPECT_FLOAT_EQ(hp.yarn_factor, 4);
    EXPECT_EQ(hp.yarn_orig_ctx, 64);
    EXPECT_FLOAT_EQ(hp.rope.freq_scale, 1);
    EXPECT_FLOAT_EQ(hp.rope.attn_factor, 1 + 0.1f * std::log(4.0f));
    ASSERT_NE(hp.rope.freq_factors, nullptr);
    // n_rot 32: correction dims [0, 3] (ceil of 32 ln(64 / 2 pi) / (2 ln 1e6) = 2.69).
    EXPECT_FLOAT_EQ(hp.rope.freq_factors[0], 1);
    EXPECT_GT(hp.rope.freq_factors[2], 1);
    EXPECT_LT(hp.rope.freq_factors[2], 4);
    for (int i = 3; i < 16; ++i) EXPECT_FLOAT_EQ(hp.rope.freq_factors[i], 4) << i;
  }
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(from_keys->hparams().rope.freq_factors[i], from_flags->hparams().rope.freq_factors[i]);
  EXPECT_EQ(run_prompt(*from_keys, {1, 72, 108, 108, 111, 35}), run_prompt(*from_flags, {1, 72, 108, 108, 111, 35}));
  EXPECT_NE(run_prompt(*from_keys, {1, 72, 108, 108, 111, 35}),
            run_prompt(*Model::load(plain.path()), {1, 72, 108, 108, 111, 35}));
  // The file's YaRN turned off, linear instead, another base.
  EXPECT_EQ(Model::load(yarn.path(), RopeOverrides{"none"})->hparams().rope.freq_factors, nullptr);
  const auto lin = Model::load(plain.path(), RopeOverrides{"linear", 8, 5e5f});
  EXPECT_FLOAT_EQ(lin->hparams().rope.freq_scale, 1.0f / 8);
  EXPECT_FLOAT_EQ(lin->hparams().rope.freq_base, 5e5f);
  EXPECT_EQ(lin->hparams().yarn_factor, 0);
  // --rope-scale alone: the file's type (yarn), or linear where the file has none (llama.cpp's rule).
  EXPECT_FLOAT_EQ(Model::load(yarn.path(), RopeOverrides{"", 8})->hparams().yarn_factor, 8);
  EXPECT_FLOAT_EQ(Model::load(plain.path(), RopeOverrides{"", 8})->hparams().rope.freq_scale, 1.0f / 8);
  auto error = [&](const RopeOverrides& r) {
    try {
      Model::load(plain.path(), r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  EXPECT_NE(error({"ntk"}).find("--rope-scaling: 'ntk' is not supported (none, linear, yarn)"), std::string::npos);
  EXPECT_NE(error({"yarn", 0.5f}).find("--rope-scale: 0.5: YaRN's factor must be >= 1"), std::string::npos);
  EXPECT_NE(error({"linear", -2}).find("--rope-scale"), std::string::npos);
  EXPECT_NE(error({"", 0, 0.5f}).find("--rope-freq-base"), std::string::npos);
  EXPECT_NE(error({"yarn", 4, 0, -1}).find("--yarn-orig-ctx"), std::string::npos);
}

// A synthetic model of `arch` refuses tensor parallelism over 2 ranks with `message`.
void expect_shard_refused(const char* arch, const std::string& message) {
  SyntheticOptions opt;
  opt.arch = arch;
  TempFile tmp(cat(arch, "_tp.gguf"));
  write_synthetic_model(opt, tmp.path());
  const auto m = Model::load(tmp.path());
  try {
    m->shard(0, 2);
    ADD_FAILURE() << arch << " sharded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// Tensor parallelism splits the dense FFN's columns; a mixture of experts is refused, clearly.
TEST(Synthetic, MixtureOfExpertsRefusesTensorParallelism) {
  expect_shard_refused("qwen3moe", "tensor parallelism over a mixture of experts (4 experts) is not supported");
}

// Each rank holds some heads: OLMo 2's q/k norms over the whole projection would need all of them.
TEST(Synthetic, WholeProjectionQkNormsRefuseTensorParallelism) {
  expect_shard_refused("olmo2", "tensor parallelism with q/k norms over the whole projection (olmo2) is not supported");
}

TEST(Synthetic, SameSeedSameBytesOtherSeedOtherBytes) {
  TempFile a("seed_a.gguf"), b("seed_b.gguf"), c("seed_c.gguf");
  SyntheticOptions opt;
  opt.type = GGMLType::Q8_0;
  opt.seed = 7;
  write_synthetic_model(opt, a.path());
  write_synthetic_model(opt, b.path());
  opt.seed = 8;
  write_synthetic_model(opt, c.path());
  const std::string ba = test::read_file(a.path()), bb = test::read_file(b.path()),
                    bc = test::read_file(c.path());
  ASSERT_GT(ba.size(), 100000u);
  EXPECT_TRUE(ba == bb);
  ASSERT_EQ(ba.size(), bc.size());
  // Different weights throughout, not just somewhere: every tensor differs.
  const auto fa = GGUFFile::parse(reinterpret_cast<const uint8_t*>(ba.data()), ba.size(), "a");
  const auto fc = GGUFFile::parse(reinterpret_cast<const uint8_t*>(bc.data()), bc.size(), "c");
  for (size_t k = 0; k < fa->tensors().size(); ++k) {
    const auto& ta = fa->tensors()[k];
    EXPECT_NE(std::memcmp(ta.data, fc->tensors()[k].data, ta.n_bytes), 0) << ta.name;
  }
  // Tensors of one file are not copies of each other (per-tensor streams).
  const auto* q0 = fa->find_tensor("blk.0.attn_q.weight");
  const auto* q1 = fa->find_tensor("blk.1.attn_q.weight");
  EXPECT_NE(std::memcmp(q0->data, q1->data, q0->n_bytes), 0);
}

TEST(Synthetic, BuiltInByteVocabTokenizes) {
  TempFile tmp("vocab.gguf");
  write_synthetic_model({}, tmp.path());
  const auto f = GGUFFile::open(tmp.path());
  const auto toks = f->get_str_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.size(), 260u);
  EXPECT_EQ(toks[259], "\u2581");
  EXPECT_EQ(toks[0], "<unk>");
  EXPECT_EQ(toks[2], "</s>");
  EXPECT_EQ(toks[3], "<0x00>");
  EXPECT_EQ(toks[3 + 0xAB], "<0xAB>");
  const auto types = f->get_i32_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[258], 6);
  const Tokenizer tok = Tokenizer::from_gguf(*f);
  EXPECT_EQ(tok.n_vocab(), 260);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.add_bos_default());
  // One byte token per byte (id = 3 + byte), BOS first; a space is the U+2581 piece (259).
  const std::string text = "Hi \xC3\xA9!";
  const auto ids = tok.encode(text, true, false);
  EXPECT_EQ(ids, (std::vector<TokenId>{1, 3 + 'H', 3 + 'i', 259, 3 + 0xC3, 3 + 0xA9, 3 + '!'}));
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(Synthetic, CopiedVocabulary) {
  FT_REQUIRE_SHARED(vocab, "tokenizer/ggml-vocab-llama-spm.gguf");
  TempFile tmp("spm.gguf");
  SyntheticOptions opt;
  opt.vocab_path = vocab;
  opt.type = GGMLType::Q4_0;
  write_synthetic_model(opt, tmp.path());
  const auto m = Model::load(tmp.path());
  EXPECT_EQ(m->hparams().n_vocab, 32000);
  const auto src = GGUFFile::open(vocab);
  EXPECT_EQ(m->file().get_str_array("tokenizer.ggml.tokens"), src->get_str_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(m->file().get_f32_array("tokenizer.ggml.scores"), src->get_f32_array("tokenizer.ggml.scores"));
  const Tokenizer tok = Tokenizer::from_gguf(m->file());
  const auto ids = tok.encode("Hello world", true, false);
  ASSERT_GE(ids.size(), 3u);
  const auto logits = run_prompt(*m, ids);
  ASSERT_EQ(logits.size(), ids.size() * 32000);
  expect_sane_logits(logits);
}

TEST(Synthetic, Progress) {
  TempFile tmp("progress.gguf");
  std::vector<float> seen;
  write_synthetic_model({}, tmp.path(), [&](float f) { seen.push_back(f); });
  ASSERT_GT(seen.size(), 3u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_GT(seen.front(), 0.0f);
  EXPECT_EQ(seen.back(), 1.0f);
}

std::string error_of(const SyntheticOptions& opt, const std::string& path) {
  try {
    write_synthetic_model(opt, path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Synthetic, BadOptions) {
  TempFile tmp("bad.gguf");
  SyntheticOptions opt;
  opt.shape = "huge";
  std::string m = error_of(opt, tmp.path());
  EXPECT_NE(m.find("unknown shape 'huge'"), std::string::npos) << m;
  for (const auto& s : synthetic_shapes()) EXPECT_NE(m.find(s.name), std::string::npos) << m;
  opt = {};
  opt.arch = "gpt2";
  m = error_of(opt, tmp.path());
  EXPECT_NE(m.find("architecture 'gpt2'"), std::string::npos) << m;
  opt = {};
  opt.type = GGMLType::IQ2_XXS;  // (a type ggml defines that we do not compute with)
  m = error_of(opt, tmp.path());
  EXPECT_NE(m.find("iq2_xxs"), std::string::npos) << m;
  opt = {};
  opt.vocab_path = "/nonexistent/vocab.gguf";
  m = error_of(opt, tmp.path());
  EXPECT_NE(m.find("/nonexistent/vocab.gguf"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(tmp.path()));
}

TEST(Synthetic, UnfitType) {
  // tiny's rows are 64 elements: not whole 256-element k-quant blocks.
  TempFile tmp("unfit.gguf");
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K}) {
    SyntheticOptions opt;
    opt.type = t;
    const std::string m = error_of(opt, tmp.path());
    EXPECT_NE(m.find("tensor 'token_embd.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("row length 64"), std::string::npos) << m;
    EXPECT_NE(m.find("block size 256"), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(tmp.path()));
  }
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

using test::TempFile;

// The Q4_K_M mix: attn_v / ffn_down in Q6_K exactly for llama.cpp's use_more_bits layers
// (8 layers: 0, 3, 6, 7), output in Q6_K, everything else Q4_K.
TEST(Synthetic, Q4KMMix) {
  SyntheticOptions opt;
  opt.shape = "tiny-256";
  opt.type = GGMLType::Q4_K;
  opt.mix = SyntheticOptions::Mix::Q4_K_M;
  TempFile tmp("q4km.gguf");
  write_synthetic_model(opt, tmp.path());
  const auto m = Model::load(tmp.path());
  const int n = m->hparams().n_layers;
  ASSERT_GE(n, 2);
  for (int i = 0; i < n; ++i) {
    const bool more = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
    const LayerWeights& L = m->weights().layers[size_t(i)];
    EXPECT_EQ(L.wv.type, more ? GGMLType::Q6_K : GGMLType::Q4_K) << i;
    EXPECT_EQ(L.w_down.type, more ? GGMLType::Q6_K : GGMLType::Q4_K) << i;
    EXPECT_EQ(L.wq.type, GGMLType::Q4_K);
    EXPECT_EQ(L.w_gate.type, GGMLType::Q4_K);
  }
  EXPECT_EQ(m->weights().output.type, GGMLType::Q6_K);
  EXPECT_EQ(m->weights().token_embd.type, GGMLType::Q4_K);
  opt.type = GGMLType::Q8_0;
  EXPECT_THROW(write_synthetic_model(opt, tmp.path()), std::exception);
}

// The Q5_K_M and Q3_K_M mixes choose every tensor's type as the reference's quantizer did for
// the synth-llama files (4 layers) in ../shared/models/extra, and make-model writes them.
TEST(Synthetic, Q5KMAndQ3KMMixesMatchTheReference) {
  for (const char* name : {"q5_k_m", "q3_k_m"}) {
    SCOPED_TRACE(name);
    const auto mix = parse_mix_name(name);
    ASSERT_TRUE(mix.has_value());
    FT_REQUIRE_SHARED(path, std::string("models/extra/synth-llama-") + name + ".gguf");
    const auto ref = Model::load(path);
    const int n = ref->hparams().n_layers;
    const ArchSpec* spec = find_arch("llama");
    ASSERT_NE(spec, nullptr);
    int checked = 0;
    for_each_tensor(*spec, n, false, [&](const TensorSpec& t, int32_t layer) {
      if (t.init != Init::Matrix) return;
      const GGUFTensorInfo* info = ref->file().find_tensor(tensor_name(t, layer));
      if (!info) return;
      const bool more = layer >= 0 && (layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2);
      const bool more_bits = t.more_bits == MoreBits::Always || (t.more_bits == MoreBits::SomeLayers && more);
      EXPECT_EQ(type_traits(mix_tensor_type(mix->mix, mix->base, t.role, t.more_bits == MoreBits::Always,
                                            more_bits, layer, n)).name,
                type_traits(info->type).name)
          << tensor_name(t, layer);
      ++checked;
    });
    EXPECT_EQ(checked, 2 + 7 * n);
    SyntheticOptions opt;
    opt.shape = "tiny-256";
    opt.type = mix->base;
    opt.mix = mix->mix;
    TempFile tmp(std::string(name) + ".gguf");
    write_synthetic_model(opt, tmp.path());
    const auto m = Model::load(tmp.path());
    EXPECT_EQ(m->weights().output.type, GGMLType::Q6_K);
    EXPECT_EQ(m->weights().token_embd.type, mix->base);
    EXPECT_EQ(m->weights().layers[0].wq.type, mix->base);
  }
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// The forward pass's activations and the KV arena come from MappedMemory: zero-filled, writable
// to the last byte, moved without a copy; a forward pass's scratch holds its 7 buffers of
// max_batch rows, 64-byte aligned each.
TEST(MappedMemory, ZeroFilledWritableMovable) {
  MappedMemory a((3u << 20) + 5, "test");
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), (3u << 20) + 5);
  for (uint64_t i = 0; i < a.size(); i += 4093) EXPECT_EQ(a.data()[i], 0);
  a.data()[a.size() - 1] = 7;
  uint8_t* p = a.data();
  MappedMemory b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[b.size() - 1], 7);
  EXPECT_EQ(MappedMemory().size(), 0u);
}

// Prefault::Yes allocates every page at construction (mincore counts them resident), where the
// default leaves them to their first write; the KV arena and the forward pass's activations are
// prefaulted (a request's first write into fresh KV pages cost ~5 ms per 2 MiB on a KVM guest).
TEST(MappedMemory, PrefaultedPagesAreResident) {
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  auto resident = [&](const MappedMemory& m) {
    std::vector<unsigned char> vec((m.size() + page - 1) / page);
    EXPECT_EQ(mincore(m.data(), size_t(m.size()), vec.data()), 0) << std::strerror(errno);
    return std::pair<int64_t, int64_t>(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return c & 1; }),
                                       int64_t(vec.size()));
  };
  const uint64_t n = (6u << 20) + 5;
  {
    const MappedMemory lazy(n, "lazy");
    EXPECT_EQ(resident(lazy).first, 0);
  }  // (before the eager one: a huge page of that one can straddle a neighbouring mapping)
  const MappedMemory eager(n, "eager", MappedMemory::Prefault::Yes);
  const auto [in_eager, of_eager] = resident(eager);
  EXPECT_EQ(in_eager, of_eager);

  SyntheticOptions opt;
  opt.shape = "tiny";
  TempFile tmp("prefault-kv-tiny.gguf");
  write_synthetic_model(opt, tmp.path());
  const auto model = Model::load(tmp.path());
  const HParams& hp = model->hparams();
  const KVCache kv(KVCacheConfig{hp.n_layers, hp.kv_dim(), 16, 256, true, hp.n_kv_heads});
  const auto [in_kv, of_kv] = resident(kv.memory());
  EXPECT_EQ(in_kv, of_kv);
  auto be = make_backend("cpu", 1);
  const Forward fwd(*model, *be, 64);
  const auto [in_act, of_act] = resident(fwd.scratch());
  EXPECT_EQ(in_act, of_act);
}

// A step between the blocks of another (Forward::set_between_blocks, the engine's
// EngineCore::between_blocks) runs on a Forward of its own: the running step's logits and its
// own are bit for bit those of each run alone, for the float and integer paths (the backend
// holds nothing between blocks). Running it on the same Forward instead changes them (the
// check can fail).
TEST(Forward, StepsBetweenBlocksLeaveEveryStepExact) {
  for (const GGMLType type : {GGMLType::F32, GGMLType::Q8_0, GGMLType::Q4_0}) {
    SCOPED_TRACE(std::string(type_traits(type).name));
    SyntheticOptions opt;
    opt.shape = "tiny";
    opt.type = type;
    TempFile tmp("between-tiny.gguf");
    write_synthetic_model(opt, tmp.path());
    const auto model = Model::load(tmp.path());
    const HParams& hp = model->hparams();
    auto be = make_backend("cpu", 2);
    Forward main(*model, *be, 40), other(*model, *be, 16);
    // seq 0: a 37-token prompt in `main`; seqs 1 and 2: 9 and 5 tokens, each a step of `other`.
    std::vector<Batch> batches(3);
    const int64_t lens[3] = {37, 9, 5};
    for (int s = 0; s < 3; ++s)
      for (int64_t i = 0; i < lens[s]; ++i)
        batches[size_t(s)].add(int32_t((i * 7 + s * 13 + 1) % hp.n_vocab), int32_t(i), s, true);
    auto fresh_kv = [&] {
      auto kv = std::make_unique<KVCache>(KVCacheConfig{hp.n_layers, hp.kv_dim(), 16, 16, true, hp.n_kv_heads});
      for (int s = 0; s < 3; ++s) EXPECT_TRUE(kv->reserve(s, lens[s]));
      return kv;
    };
    auto logits = [&](int s) { return std::vector<float>(size_t(lens[s] * hp.n_vocab)); };
    std::vector<std::vector<float>> alone = {logits(0), logits(1), logits(2)}, got = alone, clobbered = alone;
    {
      auto kv = fresh_kv();
      for (int s = 0; s < 3; ++s) (s == 0 ? main : other).run(batches[size_t(s)], *kv, alone[size_t(s)].data());
    }
    for (Forward* nested : {&other, &main}) {
      auto& out = nested == &other ? got : clobbered;
      auto kv = fresh_kv();
      int calls = 0;
      bool inside = false;
      std::vector<double> dones;
      main.set_between_blocks([&](double done) {
        if (inside) return;  // (the same Forward's own steps call it too)
        inside = true;
        dones.push_back(done);
        ++calls;
        if (calls == 1) nested->run(batches[1], *kv, out[1].data());
        if (calls == 2 * hp.n_layers - 2) nested->run(batches[2], *kv, out[2].data());
        inside = false;
      });
      main.run(batches[0], *kv, out[0].data());
      main.set_between_blocks({});
      EXPECT_EQ(calls, 2 * hp.n_layers - 1);  // after every block but the last
      for (int k = 0; k < calls; ++k) EXPECT_DOUBLE_EQ(dones[size_t(k)], double(k + 1) / (2 * hp.n_layers));
    }
    for (int s = 0; s < 3; ++s) EXPECT_EQ(got[size_t(s)], alone[size_t(s)]) << "sequence " << s;
    EXPECT_NE(clobbered[0], alone[0]);
  }
}

TEST(MappedMemory, ForwardScratchHoldsEveryActivation) {
  SyntheticOptions opt;
  opt.shape = "tiny";
  TempFile tmp("scratch-tiny.gguf");
  write_synthetic_model(opt, tmp.path());
  const auto model = Model::load(tmp.path());
  const HParams& hp = model->hparams();
  auto be = make_backend("cpu", 1);
  const int64_t M = 33;
  Forward fwd(*model, *be, M);
  const uint64_t floats = uint64_t(M) * (2 * hp.dim + 2 * hp.q_dim() + 2 * hp.kv_dim() + hp.ffn_dim);
  EXPECT_GE(fwd.scratch().size(), floats * sizeof(float));
  EXPECT_LE(fwd.scratch().size(), (floats + 7 * 16) * sizeof(float));
}

// Forward's constructor faults in the token embedding (it stays in the file mapping; embed()
// reads single rows), so the first request does not wait on page faults. Checked by mincore()
// on the embedding's pages of a file whose page cache was dropped after loading (and whose
// mapping reads no pages around a fault): without the prefault, they stay out until a token's
// row is read.
TEST(MappedMemory, ForwardPrefaultsTheTokenEmbedding) {
  FT_REQUIRE_SHARED(vocab, "models/stories260K.gguf");  // 512 tokens: a 512 KiB F32 table
  SyntheticOptions opt;
  opt.shape = "tiny-256";
  opt.vocab_path = vocab;
  TempFile tmp("prefault-tiny256.gguf");
  write_synthetic_model(opt, tmp.path());
  auto drop_cache = [&] {
    const int fd = open(tmp.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // (leaves the pages this process has mapped)
    close(fd);
  };
  drop_cache();
  const auto model = Model::load(tmp.path());
  // No read-around on faults (the device's readahead window, often MBs, would bring the whole
  // small file in as soon as Forward reads any other weight).
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const auto& t : model->file().tensors()) {
    lo = std::min(lo, uintptr_t(t.data));
    hi = std::max(hi, uintptr_t(t.data) + t.n_bytes);
  }
  ASSERT_EQ(madvise(reinterpret_cast<void*>(lo / page * page), hi - lo / page * page, MADV_RANDOM), 0);
  drop_cache();
  const WeightView& e = model->weights().token_embd;
  ASSERT_NE(e.data, nullptr);
  const uint64_t bytes = *row_bytes(e.type, uint64_t(e.n_cols)) * uint64_t(e.n_rows);
  const uintptr_t b = uintptr_t(e.data) / page * page, end = uintptr_t(e.data) + bytes;
  std::vector<unsigned char> vec((end - b + page - 1) / page);
  auto resident = [&] {
    EXPECT_EQ(mincore(reinterpret_cast<void*>(b), end - b, vec.data()), 0) << std::strerror(errno);
    return int64_t(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return c & 1; }));
  };
  const int64_t before = resident();
  if (before == int64_t(vec.size()))
    GTEST_SKIP() << "the file's page cache could not be dropped here (tmpfs?): nothing to check";
  auto be = make_backend("cpu", 1);
  Forward fwd(*model, *be, 4);
  EXPECT_EQ(resident(), int64_t(vec.size())) << "of " << vec.size() << " pages; " << before << " before Forward";
}

}  // namespace
}  // namespace ft
