// LoRA adapters (model/lora.h) at the forward pass: an adapter's output equals the merged model's
// (make-model's --merged-out), for each architecture and adapter type; the base and 4 adapters in
// one batch give each sequence what it gives alone; bad adapter files are clear errors naming the
// tensor, expected vs actual.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kv/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace ft {
namespace {

using test::TempFile;

// Greedy generation of one or more sequences in lock step: a prefill batch with every prompt,
// then decode steps with one row per sequence. rows[i] = all logits rows of sequence i (its last
// prompt position, then each decode), tokens[i] = its generated tokens.
struct GenOut {
  std::vector<std::vector<std::vector<float>>> rows;
  std::vector<std::vector<int32_t>> tokens;
};

struct Seq {
  std::vector<int32_t> prompt;
  const LoraAdapter* lora = nullptr;
};

GenOut generate(const Model& m, Backend& be, const std::vector<Seq>& seqs, int n_gen, bool reverse_decode_order = false) {
  const HParams& hp = m.hparams();
  int64_t total = 0;
  for (const Seq& s : seqs) total += int64_t(s.prompt.size());
  Forward fwd(m, be, std::max<int64_t>(total, 8));
  fwd.enable_lora();
  KVCache kv(KVCacheConfig{hp.n_layers, hp.kv_dim(), 16, 64, false, hp.n_kv_heads});
  const size_t V = size_t(hp.n_vocab);
  GenOut out;
  out.rows.resize(seqs.size());
  out.tokens.resize(seqs.size());
  std::vector<float> logits(seqs.size() * V);
  std::vector<int32_t> last(seqs.size());
  auto take = [&](size_t slot, size_t i) {
    const float* l = logits.data() + slot * V;
    out.rows[i].emplace_back(l, l + V);
    last[i] = int32_t(std::max_element(l, l + hp.n_tokens) - l);
    out.tokens[i].push_back(last[i]);
  };
  Batch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n = int64_t(seqs[i].prompt.size());
    EXPECT_TRUE(kv.reserve(int32_t(i), n + n_gen));
    for (int64_t p = 0; p < n; ++p) b.add(seqs[i].prompt[size_t(p)], int32_t(p), int32_t(i), p == n - 1, seqs[i].lora);
  }
  fwd.run(b, kv, logits.data());
  for (size_t i = 0; i < seqs.size(); ++i) take(i, i);
  for (int g = 1; g < n_gen; ++g) {
    b.clear();
    std::vector<size_t> order(seqs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = reverse_decode_order ? order.size() - 1 - i : i;
    for (size_t i : order)
      b.add(last[i], int32_t(seqs[i].prompt.size()) + g - 1, int32_t(i), true, seqs[i].lora);
    fwd.run(b, kv, logits.data());
    for (size_t k = 0; k < order.size(); ++k) take(k, order[k]);
  }
  return out;
}

float max_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  float d = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t r = 0; r < std::min(a.size(), b.size()); ++r)
    for (size_t j = 0; j < a[r].size(); ++j) d = std::max(d, std::abs(a[r][j] - b[r][j]));
  return d;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 250);
  return p;
}

// The f32 tolerance: the adapter computes W x + s B (A x) and the merged model (W + s B A) x, the
// same real numbers summed in another order (and, with adapters, RoPE and the gate activation
// as separate passes instead of the GEMM epilogue). Each f32 dot product of K <= 768 terms of O(1)
// carries a relative error of ~ sqrt(K) 2^-24 ~ 2e-6; through 2-12 layers of residual updates the
// logits (|l| ~ 1-10) move by ~1e-5..1e-4. 2e-3 is 20x that and still 100x below the adapters'
// own effect on the logits (checked: each adapter moves them by > 0.2).
constexpr float kTol = 2e-3f;
// A Q8_0 A runs on the integer path (lora.h), as the base's Q8_0 weights do and as llama.cpp's
// CPU backend multiplies any Q8_0 matrix: x rounded to int8 per 32-block, each element by at
// most 1/254 of its block's largest |x|, which moves ya by well under 1%; through the layers
// the logits then differ from the merged model's by a small fraction of the adapter's own
// effect (measured 0.4-0.9%): the bound is 2% of it (a wrong row, scale or block of the
// shrink moves them by ~100%).
constexpr float kIntShrinkTol = 0.02f;

struct LoraCase {
  const char* arch;
  const char* lora_type;
  int rank;
};

class AdapterVsMerged : public ::testing::TestWithParam<LoraCase> {};

TEST_P(AdapterVsMerged, SameLogitsAndGreedyTokens) {
  const LoraCase c = GetParam();
  TempFile base("lora_base.gguf"), ad("lora_adapter.gguf"), merged("lora_merged.gguf");
  SyntheticOptions opt;
  opt.arch = c.arch;
  write_synthetic_model(opt, base.path());
  SyntheticLoraOptions lo;
  lo.rank = c.rank;
  lo.type = *parse_type_name(c.lora_type);
  write_synthetic_lora(base.path(), lo, ad.path(), merged.path());
  const auto m = Model::load(base.path());
  const auto mm = Model::load(merged.path());
  auto be = make_backend("cpu", 2);
  const auto a = LoraAdapter::load(ad.path(), *m);
  EXPECT_EQ(a->rank(), c.rank);
  EXPECT_GT(a->n_adapted(), 0);
  a->prepare(*be);
  const std::vector<int32_t> p = prompt(21, 1);
  const GenOut with = generate(*m, *be, {{p, a.get()}}, 12);
  const GenOut ref = generate(*mm, *be, {{p, nullptr}}, 12);
  const GenOut plain = generate(*m, *be, {{p, nullptr}}, 12);
  const float d = max_diff(with.rows[0], ref.rows[0]), effect = max_diff(with.rows[0], plain.rows[0]);
  std::printf("[ %s %s rank %d ] max |adapter - merged| logit difference %.3g; vs the base %.3g\n", c.arch, c.lora_type,
              c.rank, double(d), double(effect));
  EXPECT_LT(d, lo.type == GGMLType::Q8_0 ? kIntShrinkTol * effect : kTol);
  EXPECT_EQ(with.tokens[0], ref.tokens[0]);
  EXPECT_GT(max_diff(with.rows[0], plain.rows[0]), 100 * kTol) << "the adapter changes nothing";
}

INSTANTIATE_TEST_SUITE_P(Lora, AdapterVsMerged,
                         ::testing::Values(LoraCase{"llama", "f32", 16}, LoraCase{"llama", "f16", 8},
                                           LoraCase{"llama", "q8_0", 32}, LoraCase{"llama", "q8_0", 16},
                                           LoraCase{"qwen2", "f32", 16}, LoraCase{"qwen3", "f32", 16},
                                           LoraCase{"qwen3moe", "f32", 8},
                                           LoraCase{"gemma2", "f32", 4}, LoraCase{"gemma3", "f16", 8},
                                           LoraCase{"phi3", "f16", 16}, LoraCase{"gpt-oss", "f32", 8},
                                           // (olmo2: no pre-norms, the shrink reads x itself)
                                           LoraCase{"olmo2", "f32", 8}, LoraCase{"gemma", "f32", 8},
                                           LoraCase{"qwen2moe", "f32", 8}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.arch) + "_" + info.param.lora_type + "_r" +
                                           std::to_string(info.param.rank);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Packed a matrix at a time (prepare_some with no budget: how a server packs an adapter between
// steps), every matrix has its packed copy, the logits are the same bits as packed at once, and
// done, it refuses a second preparation.
TEST(Lora, PreparedInSlicesEqualsAtOnce) {
  TempFile base("lora_slices_base.gguf"), ad("lora_slices_adapter.gguf");
  write_synthetic_model(SyntheticOptions{}, base.path());
  SyntheticLoraOptions lo;
  lo.type = GGMLType::F16;
  write_synthetic_lora(base.path(), lo, ad.path());
  const auto m = Model::load(base.path());
  auto be = make_backend("cpu", 2);
  const auto whole = LoraAdapter::load(ad.path(), *m), sliced = LoraAdapter::load(ad.path(), *m);
  whole->prepare(*be);
  int slices = 1;
  while (!sliced->prepare_some(*be, 0.0)) ++slices;
  EXPECT_GT(slices, 2);
  EXPECT_EQ(sliced->prepared_sources().size(), whole->prepared_sources().size());
  for (const void* src : sliced->prepared_sources()) EXPECT_TRUE(be->has_copy_of(src));
  EXPECT_THROW(sliced->prepare_some(*be, 0.0), Error);
  const std::vector<int32_t> p = prompt(13, 2);
  const GenOut a = generate(*m, *be, {{p, whole.get()}}, 6), b = generate(*m, *be, {{p, sliced.get()}}, 6);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.tokens, b.tokens);
}

// The base and 4 adapters in one batch (prefill together, decode rows in another order than
// the prefill's): each sequence gets what it gets alone.
TEST(Lora, BaseAndFourAdaptersInOneBatch) {
  TempFile base("lora_mix_base.gguf");
  std::vector<std::unique_ptr<TempFile>> files;
  write_synthetic_model(SyntheticOptions{}, base.path());
  const auto m = Model::load(base.path());
  auto be = make_backend("cpu", 2);
  std::vector<std::unique_ptr<LoraAdapter>> ads;
  for (int k = 0; k < 4; ++k) {
    files.push_back(std::make_unique<TempFile>("lora_mix_" + std::to_string(k) + ".gguf"));
    SyntheticLoraOptions lo;
    lo.seed = uint64_t(k + 1);
    lo.rank = 8 + 8 * (k % 2);
    write_synthetic_lora(base.path(), lo, files.back()->path());
    ads.push_back(LoraAdapter::load(files.back()->path(), *m));
    ads.back()->prepare(*be);
  }
  // Two sequences share adapter 0, so one adapter's rows are not always contiguous.
  const std::vector<Seq> seqs = {{prompt(9, 0), nullptr},        {prompt(17, 1), ads[0].get()},
                                 {prompt(5, 2), ads[1].get()},   {prompt(12, 3), ads[2].get()},
                                 {prompt(30, 4), ads[3].get()},  {prompt(7, 5), ads[0].get()}};
  const GenOut all = generate(*m, *be, seqs, 8, /*reverse_decode_order=*/true);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const GenOut alone = generate(*m, *be, {seqs[i]}, 8);
    EXPECT_EQ(all.tokens[i], alone.tokens[0]) << "sequence " << i;
    EXPECT_LT(max_diff(all.rows[i], alone.rows[0]), kTol) << "sequence " << i;
  }
  // And the adapters do differ from each other.
  const GenOut a0 = generate(*m, *be, {{seqs[0].prompt, ads[0].get()}}, 1);
  const GenOut a1 = generate(*m, *be, {{seqs[0].prompt, ads[1].get()}}, 1);
  EXPECT_GT(max_diff(a0.rows[0], a1.rows[0]), 100 * kTol);
}

// --- bad files -------------------------------------------------------------------------------

std::string load_error(const std::string& path, const Model& m) {
  try {
    LoraAdapter::load(path, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// A copy of `src`'s adapter with edits: keys set, tensors renamed / reshaped / dropped.
void rewrite(const std::string& src, const std::string& dst, const std::function<void(GGUFWriter&)>& keys,
             const std::function<bool(std::string&, std::vector<uint64_t>&)>& tensor) {
  const auto f = GGUFFile::open(src);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  keys(w);
  for (const GGUFTensorInfo& t : f->tensors()) {
    std::string name = t.name;
    std::vector<uint64_t> ne = t.ne;
    if (!tensor(name, ne)) continue;
    uint64_t n = 1;
    for (uint64_t x : ne) n *= x;
    std::vector<uint8_t> bytes(t.data, t.data + std::min<uint64_t>(t.n_bytes, n * 4));
    bytes.resize(*row_bytes(t.type, ne[0]) * (n / ne[0]));
    w.add_tensor(name, t.type, ne, std::move(bytes));
  }
  w.write(dst);
}

TEST(Lora, BadAdapterFilesAreClearErrors) {
  TempFile base("lora_bad_base.gguf"), ad("lora_bad_adapter.gguf"), other("lora_bad_other.gguf"), bad("lora_bad.gguf");
  write_synthetic_model(SyntheticOptions{}, base.path());
  SyntheticLoraOptions lo;
  write_synthetic_lora(base.path(), lo, ad.path());
  const auto m = Model::load(base.path());
  EXPECT_EQ(load_error(ad.path(), *m), "no error");
  auto none = [](GGUFWriter&) {};
  auto all = [](std::string&, std::vector<uint64_t>&) { return true; };

  // A model, not an adapter.
  EXPECT_NE(load_error(base.path(), *m).find("is not a LoRA adapter file"), std::string::npos) << load_error(base.path(), *m);
  // Another architecture.
  rewrite(ad.path(), bad.path(), [](GGUFWriter& w) { w.set("general.architecture", GGUFValue::of_str("qwen2")); }, all);
  EXPECT_NE(load_error(bad.path(), *m).find("the adapter is for 'qwen2', the base model is 'llama'"), std::string::npos)
      << load_error(bad.path(), *m);
  // Not LoRA.
  rewrite(ad.path(), bad.path(), [](GGUFWriter& w) { w.set("adapter.type", GGUFValue::of_str("control_vector")); }, all);
  EXPECT_NE(load_error(bad.path(), *m).find("'control_vector' is not supported"), std::string::npos);
  // An adapter of another shape: expected vs actual, naming the tensor.
  SyntheticOptions o256;
  o256.shape = "tiny-256";
  write_synthetic_model(o256, other.path());
  write_synthetic_lora(other.path(), lo, bad.path());
  std::string e = load_error(bad.path(), *m);
  EXPECT_NE(e.find("tensor 'blk.0.attn_k.weight.lora_a': expected shape [64, rank]"), std::string::npos) << e;
  EXPECT_NE(e.find("got [256, 16]"), std::string::npos) << e;
  // B's shape wrong.
  rewrite(ad.path(), bad.path(), none, [](std::string& n, std::vector<uint64_t>& ne) {
    if (n == "blk.1.ffn_down.weight.lora_b") ne = {16, 32};
    return true;
  });
  e = load_error(bad.path(), *m);
  EXPECT_NE(e.find("tensor 'blk.1.ffn_down.weight.lora_b': expected shape [16, 64], got [16, 32]"), std::string::npos) << e;
  // A tensor the base does not have; one without its pair; one of a tensor that cannot be adapted.
  rewrite(ad.path(), bad.path(), none, [](std::string& n, std::vector<uint64_t>&) {
    if (n.starts_with("blk.0.attn_k.weight.")) n.replace(0, 5, "blk.7");
    return true;
  });
  EXPECT_NE(load_error(bad.path(), *m).find("the base model has no matrix 'blk.7.attn_k.weight'"), std::string::npos)
      << load_error(bad.path(), *m);
  rewrite(ad.path(), bad.path(), none, [](std::string& n, std::vector<uint64_t>&) { return n != "blk.0.attn_v.weight.lora_b"; });
  EXPECT_NE(load_error(bad.path(), *m).find("'blk.0.attn_v.weight.lora_a' has no matching 'blk.0.attn_v.weight.lora_b'"),
            std::string::npos)
      << load_error(bad.path(), *m);
  rewrite(ad.path(), bad.path(), none, [](std::string& n, std::vector<uint64_t>&) {
    if (n.starts_with("blk.0.attn_q.weight.")) n.replace(0, 19, "output.weight");
    return true;
  });
  EXPECT_NE(load_error(bad.path(), *m).find("adapting 'output.weight' is not supported"), std::string::npos)
      << load_error(bad.path(), *m);
  rewrite(ad.path(), bad.path(), none, [](std::string& n, std::vector<uint64_t>&) {
    if (n == "blk.0.attn_q.weight.lora_a") n = "blk.0.attn_q.weight.extra";
    return true;
  });
  EXPECT_NE(load_error(bad.path(), *m).find("not a LoRA tensor"), std::string::npos);
  // Unsupported tensor types are named.
  EXPECT_THROW(write_synthetic_lora(base.path(), {.rank = 16, .type = GGMLType::Q4_0}, bad.path()), Error);
}

TEST(Lora, ForwardRefusesAdaptersUntilEnabled) {
  TempFile base("lora_en_base.gguf"), ad("lora_en_adapter.gguf");
  write_synthetic_model(SyntheticOptions{}, base.path());
  write_synthetic_lora(base.path(), {}, ad.path());
  const auto m = Model::load(base.path());
  auto be = make_backend("cpu", 1);
  const auto a = LoraAdapter::load(ad.path(), *m);
  Forward fwd(*m, *be, 4);
  KVCache kv(KVCacheConfig{m->hparams().n_layers, m->hparams().kv_dim(), 16, 4, false, m->hparams().n_kv_heads});
  ASSERT_TRUE(kv.reserve(0, 2));
  Batch b;
  b.add(5, 0, 0, true, a.get());
  std::vector<float> logits(size_t(m->hparams().n_vocab));
  EXPECT_THROW(fwd.run(b, kv, logits.data()), Error);
  fwd.enable_lora();
  EXPECT_NO_THROW(fwd.run(b, kv, logits.data()));
}

}  // namespace
}  // namespace ft
