// libFuzzer target: the GGUF reader (GGUFFile::parse) on arbitrary bytes, then what loading does
// with a file that parses: the tokenizer built from its metadata (and used once), and the model's
// hyperparameters read and weights bound (Model::bind). Every failure must be an ft::Error; any
// other exception, a crash or a sanitizer report is a bug.
// FT_FUZZ_WRITE_SEEDS=DIR fuzz_gguf writes the seed corpus (corpus/fuzz_gguf: a few KiB each) and exits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

// A whole model of the architecture at toy size (dim 8, 1 layer, 2 heads, 1 KV head, ffn 16, a
// vocabulary of `tokens`; a mixture of experts: 2 of ffn 16, 1 used): every tensor its table
// lists, weights of `type`, zeros. bpe_pre: the byte-level BPE pre-tokenizer (null: SentencePiece).
void write_seed(const std::string& path, const char* arch_name, ft::GGMLType type, const std::vector<std::string>& tokens,
                const char* bpe_pre) {
  const bool bpe = bpe_pre != nullptr;
  using ft::GGUFValue;
  ft::GGUFWriter w;
  const std::string a = arch_name;
  w.set("general.architecture", GGUFValue::of_str(a));
  w.set(a + ".embedding_length", GGUFValue::of_u32(8));
  w.set(a + ".block_count", GGUFValue::of_u32(1));
  w.set(a + ".feed_forward_length", GGUFValue::of_u32(16));
  w.set(a + ".attention.head_count", GGUFValue::of_u32(2));
  w.set(a + ".attention.head_count_kv", GGUFValue::of_u32(1));
  w.set(a + ".context_length", GGUFValue::of_u32(64));
  w.set(a + ".rope.scaling.type", GGUFValue::of_str("linear"));
  w.set(a + ".rope.scaling.factor", GGUFValue::of_f32(2));
  w.set("tokenizer.ggml.model", GGUFValue::of_str(bpe ? "gpt2" : "llama"));
  w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(tokens));
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2;  // <unk> / the first: unknown; then control tokens
  types[1] = types[2] = 3;
  w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(types));
  if (bpe) {
    w.set("tokenizer.ggml.pre", GGUFValue::of_str(bpe_pre));
    w.set("tokenizer.ggml.merges", GGUFValue::of_str_array({"h e", "l l", "he ll"}));
  } else {
    std::vector<float> scores(tokens.size());
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = -float(i);
    w.set("tokenizer.ggml.scores", GGUFValue::of_f32_array(scores));
  }
  w.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(1));
  w.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(2));
  w.set("tokenizer.chat_template", GGUFValue::of_str("{{ '<|im_start|>' }}"));
  const ft::ArchSpec& spec = *ft::find_arch(a);
  ft::HParams hp;
  hp.dim = 8, hp.n_layers = 1, hp.n_heads = 2, hp.n_kv_heads = 1, hp.head_dim = 4, hp.ffn_dim = 16;
  hp.n_vocab = int32_t(tokens.size() + 2);  // padded: more embedding rows than tokens
  hp.rope.n_rot = 4;
  if (ft::has_experts(spec) && !ft::has_dense_ffn(spec)) {
    hp.n_experts = 2, hp.n_experts_used = 1, hp.expert_ffn_dim = 16;
    w.set(a + ".expert_count", GGUFValue::of_u32(2));
    w.set(a + ".expert_used_count", GGUFValue::of_u32(1));
    w.set(a + ".expert_feed_forward_length", GGUFValue::of_u32(16));
  }
  ft::for_each_tensor(spec, 1, hp.n_experts > 0, [&](const ft::TensorSpec& t, int32_t layer) {
    if (t.optional) return;
    const uint64_t rows = uint64_t(ft::extent(t.rows, hp)), cols = t.matrix ? uint64_t(ft::extent(t.cols, hp)) : 0;
    const ft::GGMLType ty = t.matrix && t.type == ft::TypeClass::Weight ? type : ft::GGMLType::F32;
    std::vector<uint64_t> ne = t.matrix ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{rows};
    const uint64_t n = t.per_expert ? uint64_t(hp.n_experts) : 1;
    if (t.per_expert) ne.push_back(n);
    w.add_tensor(ft::tensor_name(t, layer), ty, ne,
                 std::vector<uint8_t>(*ft::row_bytes(ty, ne[0]) * (t.matrix ? rows : 1) * n));
  });
  w.write(path);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("FT_FUZZ_WRITE_SEEDS");
  if (!dir) return 0;
  const std::string d = dir;
  write_seed(d + "/llama_spm_f32.gguf", "llama", ft::GGMLType::F32,
             {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "<0x0A>", "ab", "ba"}, nullptr);
  write_seed(d + "/qwen2_bpe_f16.gguf", "qwen2", ft::GGMLType::F16,
             {"!", "<|im_start|>", "<|im_end|>", "h", "e", "l", "o", "he", "ll", "hell", "\xc4\xa0"}, "qwen2");
  write_seed(d + "/qwen3moe_tekken_f32.gguf", "qwen3moe", ft::GGMLType::F32,
             {"!", "<s>", "</s>", "h", "e", "l", "o", "he", "ll", "hell", "\xc4\xa0"}, "tekken");
  write_seed(d + "/gptoss_o200k_bf16.gguf", "gpt-oss", ft::GGMLType::BF16,
             {"!", "<|startoftext|>", "<|return|>", "h", "e", "l", "o", "he", "ll", "hell", "\xc4\xa0"}, "gpt-4o");
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<ft::GGUFFile> file;
  try {
    file = ft::GGUFFile::parse(data, size, "fuzz.gguf");
  } catch (const ft::Error&) {
    return 0;
  }
  try {
    const ft::Tokenizer tok = ft::Tokenizer::from_gguf(*file);
    const std::vector<ft::TokenId> ids = tok.encode("Hello <s> world\n\xe4\xb8\x96 12345", true, true);
    for (const ft::TokenId id : ids) FT_FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
    (void)tok.decode(ids);
  } catch (const ft::Error&) {
  }
  try {
    const std::unique_ptr<ft::Model> m = ft::Model::bind(std::move(file));
    const ft::HParams& hp = m->hparams();
    FT_FUZZ_CHECK(hp.n_tokens > 0 && hp.n_tokens <= hp.n_vocab);
    FT_FUZZ_CHECK(m->weights().layers.size() == size_t(hp.n_layers));
  } catch (const ft::Error&) {
  }
  return 0;
}
