// Model::load binding errors: each defect in an otherwise valid tiny model (written with
// GGUFWriter) fails with a message naming the file and the tensor or key, and what was expected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "model/model.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// dim 32, 1 layer, 2 heads (head_dim 16), 1 KV head, ffn 64, vocab 40.
constexpr uint64_t kDim = 32, kKv = 16, kFfn = 64, kVocab = 40;

struct Mutation {
  std::string arch = "llama";
  std::set<std::string> drop_keys, drop_tensors;
  std::map<std::string, GGUFValue> set_keys;
  std::map<std::string, std::vector<uint64_t>> shapes;  // tensor -> replacement ne
  std::map<std::string, GGMLType> types;                // tensor -> replacement type
};

std::vector<uint8_t> random_data(GGMLType t, const std::vector<uint64_t>& ne, uint32_t seed) {
  uint64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  const uint64_t rb = *row_bytes(t, ne[0]);
  std::vector<uint8_t> out(rb * rows);
  std::mt19937 rng(seed);
  if (t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::Q8_0) {
    std::normal_distribution<float> d(0.0f, 0.2f);
    std::vector<float> row(ne[0]);
    for (uint64_t r = 0; r < rows; ++r) {
      for (auto& x : row) x = d(rng);
      quantize_row(t, row.data(), out.data() + r * rb, int64_t(ne[0]));
    }
  } else {
    for (auto& b : out) b = uint8_t(rng());  // layout only matters for the binder, not values
  }
  return out;
}

std::string write_model(const Mutation& m, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / cat("ft_test_binding_", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  GGUFWriter w;
  const std::string a = m.arch + ".";
  std::vector<std::pair<std::string, GGUFValue>> kv = {
      {"general.architecture", GGUFValue::of_str(m.arch)},
      {a + "embedding_length", GGUFValue::of_u32(kDim)},
      {a + "block_count", GGUFValue::of_u32(1)},
      {a + "feed_forward_length", GGUFValue::of_u32(kFfn)},
      {a + "attention.head_count", GGUFValue::of_u32(2)},
      {a + "attention.head_count_kv", GGUFValue::of_u32(1)},
      {a + "context_length", GGUFValue::of_u32(128)},
  };
  for (auto& [k, v] : kv)
    if (!m.drop_keys.count(k)) w.set(k, v);
  for (const auto& [k, v] : m.set_keys) w.set(k, v);
  std::vector<std::tuple<std::string, GGMLType, std::vector<uint64_t>>> tensors = {
      {"token_embd.weight", GGMLType::Q8_0, {kDim, kVocab}},
      {"output_norm.weight", GGMLType::F32, {kDim}},
      {"output.weight", GGMLType::F16, {kDim, kVocab}},
      {"blk.0.attn_norm.weight", GGMLType::F32, {kDim}},
      {"blk.0.attn_q.weight", GGMLType::F32, {kDim, kDim}},
      {"blk.0.attn_k.weight", GGMLType::F32, {kDim, kKv}},
      {"blk.0.attn_v.weight", GGMLType::F32, {kDim, kKv}},
      {"blk.0.attn_output.weight", GGMLType::F32, {kDim, kDim}},
      {"blk.0.ffn_norm.weight", GGMLType::F32, {kDim}},
      {"blk.0.ffn_gate.weight", GGMLType::Q8_0, {kDim, kFfn}},
      {"blk.0.ffn_up.weight", GGMLType::Q8_0, {kDim, kFfn}},
      {"blk.0.ffn_down.weight", GGMLType::Q8_0, {kFfn, kDim}},
  };
  if (m.arch == "qwen2") {
    tensors.push_back({"blk.0.attn_q.bias", GGMLType::F32, {kDim}});
    tensors.push_back({"blk.0.attn_k.bias", GGMLType::F32, {kKv}});
    tensors.push_back({"blk.0.attn_v.bias", GGMLType::F32, {kKv}});
  }
  uint32_t seed = 1;
  for (auto& [tname, type, ne] : tensors) {
    if (m.drop_tensors.count(tname)) continue;
    if (auto it = m.shapes.find(tname); it != m.shapes.end()) ne = it->second;
    if (auto it = m.types.find(tname); it != m.types.end()) type = it->second;
    w.add_tensor(tname, type, ne, random_data(type, ne, seed++));
  }
  w.write(path);
  return path;
}

void remove_model(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(fs::path(path).parent_path(), ec);  // only once empty
}

std::string load_error(const Mutation& m, const std::string& name) {
  const std::string path = write_model(m, name);
  std::string msg;
  try {
    Model::load(path);
    ADD_FAILURE() << name << ": loaded without error";
  } catch (const Error& e) {
    msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
  }
  remove_model(path);
  return msg;
}

#define EXPECT_HAS(msg, sub) EXPECT_NE((msg).find(sub), std::string::npos) << "message: " << (msg)

TEST(ModelBinding, ValidFixtureLoads) {
  for (const char* arch : {"llama", "qwen2"}) {
    Mutation m;
    m.arch = arch;
    const std::string path = write_model(m, cat("ok_", arch, ".gguf"));
    const auto model = Model::load(path);
    const HParams& hp = model->hparams();
    EXPECT_EQ(hp.dim, int32_t(kDim));
    EXPECT_EQ(hp.n_layers, 1);
    EXPECT_EQ(hp.head_dim, 16);
    EXPECT_EQ(hp.kv_dim(), int32_t(kKv));
    EXPECT_EQ(hp.n_vocab, int32_t(kVocab));
    EXPECT_FALSE(hp.tied_embeddings);
    EXPECT_EQ(model->weights().output.type, GGMLType::F16);
    EXPECT_EQ(model->weights().layers[0].bq != nullptr, std::string(arch) == "qwen2");
    remove_model(path);
  }
}

TEST(ModelBinding, WrongShapeNamesTensorAndShapes) {
  Mutation m;
  m.shapes["blk.0.attn_k.weight"] = {kDim, 8};
  std::string msg = load_error(m, "shape.gguf");
  EXPECT_HAS(msg, "tensor 'blk.0.attn_k.weight': expected shape [32, 16], got [32, 8]");
  Mutation t;
  t.shapes["blk.0.ffn_down.weight"] = {kDim, kFfn};  // transposed
  msg = load_error(t, "transposed.gguf");
  EXPECT_HAS(msg, "tensor 'blk.0.ffn_down.weight': expected shape [64, 32], got [32, 64]");
  Mutation v;  // (a trailing 1 is no dimension, llama.cpp's rule: [32, 1] binds as [32]; [32, 2] does not)
  v.shapes["blk.0.ffn_norm.weight"] = {kDim, 2};
  msg = load_error(v, "rank.gguf");
  EXPECT_HAS(msg, "tensor 'blk.0.ffn_norm.weight': expected shape [32], got [32, 2]");
  Mutation one;
  one.shapes["blk.0.ffn_norm.weight"] = {kDim, 1};
  const std::string one_path = write_model(one, "trailing_one.gguf");
  EXPECT_NO_THROW(Model::load(one_path));
  remove_model(one_path);
  Mutation e;
  e.shapes["token_embd.weight"] = {kFfn, kVocab};
  msg = load_error(e, "embd.gguf");
  EXPECT_HAS(msg, "token_embd.weight");
  EXPECT_HAS(msg, "[64, 40]");
}

TEST(ModelBinding, UnsupportedWeightTypeNamesTensorAndType) {
  Mutation m;  // every unsupported tensor is named, with its type, in one message
  m.types["blk.0.attn_q.weight"] = GGMLType::Q8_1;
  m.types["blk.0.ffn_up.weight"] = GGMLType::I32;
  std::string msg = load_error(m, "q8_1.gguf");
  EXPECT_HAS(msg, "2 tensors of a type this engine cannot compute with");
  EXPECT_HAS(msg, "tensor 'blk.0.attn_q.weight': type q8_1 is not supported");
  EXPECT_HAS(msg, "tensor 'blk.0.ffn_up.weight': type i32 is not supported");
  EXPECT_HAS(msg, "supported weight types: f32, f16, bf16, q8_0, q4_0, q4_1");
  Mutation n;
  n.types["blk.0.attn_norm.weight"] = GGMLType::F16;
  msg = load_error(n, "f16norm.gguf");
  EXPECT_HAS(msg, "tensor 'blk.0.attn_norm.weight': type f16");
  EXPECT_HAS(msg, "expected f32");
}

TEST(ModelBinding, MissingRequiredKeyNamed) {
  for (const char* key : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "general.architecture"}) {
    Mutation m;
    m.drop_keys.insert(key);
    const std::string msg = load_error(m, "nokey.gguf");
    EXPECT_HAS(msg, cat("missing required key '", key, "'"));
  }
}

TEST(ModelBinding, BadKeyValues) {
  Mutation s;
  s.set_keys["llama.embedding_length"] = GGUFValue::of_str("32");
  std::string msg = load_error(s, "strkey.gguf");
  EXPECT_HAS(msg, "key 'llama.embedding_length': expected an integer, got string");
  Mutation kv;
  kv.set_keys["llama.attention.head_count_kv"] = GGUFValue::of_u32(3);
  msg = load_error(kv, "kvheads.gguf");
  EXPECT_HAS(msg, "head_count_kv");
  Mutation z;
  z.set_keys["llama.block_count"] = GGUFValue::of_u32(0);
  msg = load_error(z, "zero.gguf");
  EXPECT_HAS(msg, "key 'llama.block_count': value 0 out of range");
  Mutation more;
  more.set_keys["llama.block_count"] = GGUFValue::of_u32(2);
  msg = load_error(more, "layers.gguf");
  EXPECT_HAS(msg, "missing tensor 'blk.1.attn_norm.weight'");
  Mutation vocab;
  std::vector<std::string> toks(kVocab + 1, "x");
  vocab.set_keys["tokenizer.ggml.tokens"] = GGUFValue::of_str_array(toks);
  msg = load_error(vocab, "vocab.gguf");
  EXPECT_HAS(msg, "tokenizer has 41 tokens");
}

TEST(ModelBinding, PaddedVocabularyKeepsItsTokenCount) {
  Mutation m;
  m.set_keys["tokenizer.ggml.tokens"] = GGUFValue::of_str_array(std::vector<std::string>(kVocab - 7, "x"));
  const std::string path = write_model(m, "padded.gguf");
  const auto model = Model::load(path);
  EXPECT_EQ(model->hparams().n_vocab, int32_t(kVocab));  // logits rows
  EXPECT_EQ(model->hparams().n_tokens, int32_t(kVocab - 7));  // what may be sampled
  remove_model(path);
  Mutation none;  // no token list: every row is a token
  const std::string p2 = write_model(none, "plain.gguf");
  EXPECT_EQ(Model::load(p2)->hparams().n_tokens, int32_t(kVocab));
  remove_model(p2);
  Mutation empty;
  empty.set_keys["tokenizer.ggml.tokens"] = GGUFValue::of_str_array({});
  EXPECT_HAS(load_error(empty, "empty.gguf"), "'tokenizer.ggml.tokens' is empty");
}

// Sizes from metadata are checked before anything is sized from them (each load here would
// otherwise resize tables for 2^24 layers, or overflow int32 widths).
TEST(ModelBinding, AbsurdSizesAreRefusedBeforeUse) {
  Mutation layers;
  layers.set_keys["llama.block_count"] = GGUFValue::of_u32(1u << 24);
  EXPECT_HAS(load_error(layers, "layers.gguf"), "key 'llama.block_count': 16777216 layers, but the file has only");
  Mutation heads;
  heads.set_keys["llama.attention.head_count"] = GGUFValue::of_u32(1u << 24);
  heads.set_keys["llama.attention.head_count_kv"] = GGUFValue::of_u32(1u << 24);
  heads.set_keys["llama.attention.key_length"] = GGUFValue::of_u32(1u << 24);
  heads.set_keys["llama.rope.dimension_count"] = GGUFValue::of_u32(16);
  EXPECT_HAS(load_error(heads, "heads.gguf"), "key 'llama.attention.head_count': 16777216 heads of 16777216");
  Mutation rope;
  rope.set_keys["llama.rope.scaling.type"] = GGUFValue::of_str("linear");
  rope.set_keys["llama.rope.scaling.factor"] = GGUFValue::of_f32(1e-40f);  // its inverse is inf in float
  EXPECT_HAS(load_error(rope, "rope.gguf"), "key 'llama.rope.scaling.factor'");
  Mutation inf;
  inf.set_keys["llama.rope.scaling.type"] = GGUFValue::of_str("linear");
  inf.set_keys["llama.rope.scaling.factor"] = GGUFValue::of_f32(std::numeric_limits<float>::infinity());
  EXPECT_HAS(load_error(inf, "rope_inf.gguf"), "key 'llama.rope.scaling.factor'");
  // Scales are checked as the floats used: an f64 of 1e300 is inf as a float (every logit NaN).
  for (const double v : {1e300, 1e-300, 0.0}) {
    Mutation scale;
    GGUFValue f64;
    f64.type = GGUFValueType::FLOAT64;
    f64.f = v;
    scale.set_keys["llama.rope.scaling.attn_factor"] = f64;
    EXPECT_HAS(load_error(scale, "attn_factor.gguf"), "key 'llama.rope.scaling.attn_factor'");
  }
  // Past the attention kernels' limits: refused at load, not at every request.
  Mutation wide;
  wide.set_keys["llama.attention.key_length"] = GGUFValue::of_u32(kAttentionMaxHeadDim + 4);
  wide.set_keys["llama.attention.value_length"] = GGUFValue::of_u32(kAttentionMaxHeadDim + 4);
  EXPECT_HAS(load_error(wide, "head_dim.gguf"), "above the attention kernels'");
}

TEST(ModelBinding, UnknownArchitectureNamed) {
  Mutation m;
  m.arch = "mamba";
  const std::string msg = load_error(m, "arch.gguf");
  EXPECT_HAS(msg, "architecture 'mamba' is not supported");
}

TEST(ModelBinding, MissingTensorsNamed) {
  Mutation m;
  m.drop_tensors.insert("blk.0.ffn_up.weight");
  EXPECT_HAS(load_error(m, "noup.gguf"), "missing tensor 'blk.0.ffn_up.weight' (expected shape [32, 64])");
  Mutation b;
  b.arch = "qwen2";
  b.drop_tensors.insert("blk.0.attn_v.bias");
  EXPECT_HAS(load_error(b, "nobias.gguf"), "missing tensor 'blk.0.attn_v.bias'");
  Mutation e;
  e.drop_tensors.insert("token_embd.weight");
  EXPECT_HAS(load_error(e, "noembd.gguf"), "missing tensor 'token_embd.weight'");
}

TEST(ModelBinding, MissingOutputMeansTiedEmbeddings) {
  Mutation m;
  m.drop_tensors.insert("output.weight");
  const std::string path = write_model(m, "tied.gguf");
  const auto model = Model::load(path);
  EXPECT_TRUE(model->hparams().tied_embeddings);
  const ModelWeights& w = model->weights();
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.output.type, GGMLType::Q8_0);
  EXPECT_EQ(w.output.n_rows, int64_t(kVocab));
  EXPECT_EQ(w.output.n_cols, int64_t(kDim));
  remove_model(path);
}

}  // namespace
}  // namespace ft
