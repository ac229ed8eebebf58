// Tokenizer tests: llama.cpp test vectors for every vocabulary in shared/tokenizer, plus
// hand-made cases for what the vectors do not cover (qwen2 digits, special tokens, streaming,
// metadata errors).
#include <gtest/gtest.h>

#include <array>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

namespace ft {
namespace {

const std::string kTestSeparator = "\n__ggml_vocab_test__\n";

// Vocabularies are large; load each once per process.
const Tokenizer& load_vocab(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[path];
  if (!slot) {
    const auto file = GGUFFile::open(path);
    slot = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file));
  }
  return *slot;
}

std::string escaped(std::string_view s) {
  std::ostringstream os;
  os << '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') os << "\\n";
    else if (c == '\t') os << "\\t";
    else if (c == '\r') os << "\\r";
    else if (c == '"' || c == '\\') os << '\\' << c;
    else if (u < 0x20) os << "\\x" << std::hex << int(u) << std::dec;
    else os << c;
  }
  os << '"';
  return os.str();
}

std::string ids_string(const std::vector<TokenId>& ids) {
  std::ostringstream os;
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? " " : "") << ids[i];
  return os.str();
}

std::vector<std::string> split_inputs(const std::string& data) {
  std::vector<std::string> inputs;
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t end = data.find(kTestSeparator, pos);
    if (end == std::string::npos) {
      inputs.push_back(data.substr(pos));  // unterminated tail: the format forbids it, keep it
      break;
    }
    inputs.push_back(data.substr(pos, end - pos));
    pos = end + kTestSeparator.size();
  }
  return inputs;
}

std::vector<std::vector<TokenId>> parse_outputs(const std::string& data) {
  std::vector<std::vector<TokenId>> out;
  std::istringstream lines(data);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ids(line);
    std::vector<TokenId> row;
    for (long id; ids >> id;) row.push_back(TokenId(id));
    out.push_back(std::move(row));
  }
  return out;
}

// Names of the vocabularies that have test vectors, e.g. "ggml-vocab-llama-spm".
std::vector<std::string> vector_files() {
  std::vector<std::string> names;
  const std::filesystem::path dir = std::filesystem::path(test::shared_dir()) / "tokenizer";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".gguf.inp";
    if (file.size() > suffix.size() && file.ends_with(suffix))
      names.push_back(file.substr(0, file.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

class VocabVectors : public ::testing::TestWithParam<std::string> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VocabVectors);

TEST_P(VocabVectors, EncodeMatchesAndDecodeRoundTrips) {
  const std::string name = GetParam();
  FT_REQUIRE_SHARED(gguf, "tokenizer/" + name + ".gguf");
  FT_REQUIRE_SHARED(inp, "tokenizer/" + name + ".gguf.inp");
  FT_REQUIRE_SHARED(outp, "tokenizer/" + name + ".gguf.out");
  const Tokenizer& tok = load_vocab(gguf);
  const auto inputs = split_inputs(test::read_file(inp));
  const auto expected = parse_outputs(test::read_file(outp));
  ASSERT_EQ(inputs.size(), expected.size()) << name << ": .inp and .out disagree on the count";

  size_t encoded_ok = 0, decoded_ok = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = tok.encode(inputs[i], /*add_bos=*/false, /*parse_special=*/false);
    if (ids == expected[i]) {
      ++encoded_ok;
    } else {
      ADD_FAILURE() << name << " input #" << i << " " << escaped(inputs[i])
                    << "\n  expected: " << ids_string(expected[i])
                    << "\n  got:      " << ids_string(ids);
    }
    const std::string back = tok.decode(expected[i]);
    if (back == inputs[i]) {
      ++decoded_ok;
    } else {
      ADD_FAILURE() << name << " input #" << i << " does not round-trip: " << escaped(inputs[i])
                    << " decodes to " << escaped(back);
    }
  }
  std::printf("[ vectors  ] %s: encode %zu/%zu, decode %zu/%zu\n", name.c_str(), encoded_ok,
              inputs.size(), decoded_ok, inputs.size());
}

INSTANTIATE_TEST_SUITE_P(SharedVocabs, VocabVectors, ::testing::ValuesIn(vector_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param;
                           for (char& c : id)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return id;
                         });

TEST(Tokenizer, SharedVectorsPresent) {
  FT_REQUIRE_SHARED(dir, "tokenizer/README.md");
  EXPECT_GE(vector_files().size(), 10u) << "expected the vocabularies listed in the README";
}

// ---- pre-tokenizers --------------------------------------------------------------------------

TEST(PreTokenizer, Qwen2SplitsDigitsOneByOne) {
  const tok::PreTokenizer qwen2("qwen2");
  EXPECT_EQ(qwen2.split("abc 12345 x"),
            (std::vector<std::string>{"abc", " ", "1", "2", "3", "4", "5", " x"}));
  EXPECT_EQ(qwen2.split("v2.0"), (std::vector<std::string>{"v", "2", ".", "0"}));
  // Everything else is as in Llama 3: contractions, punctuation runs, newline runs.
  EXPECT_EQ(qwen2.split("I'M here!!\n\n  ok"),
            (std::vector<std::string>{"I", "'M", " here", "!!\n\n", " ", " ok"}));
  // Non-ASCII digits are \p{N} too.
  EXPECT_EQ(qwen2.split("\xD9\xA1\xD9\xA2"), (std::vector<std::string>{"\xD9\xA1", "\xD9\xA2"}));

  const tok::PreTokenizer llama3("llama-bpe");
  EXPECT_EQ(llama3.split("abc 12345 x"),
            (std::vector<std::string>{"abc", " ", "123", "45", " x"}));
}

// GPT-4o's o200k (Phi-4) and Mistral's Tekken split letters where lower case turns to upper
// ("camelCase"), keep an upper run with the lower run that follows ("HTTPServer"), and differ in
// contractions (o200k keeps "'s" on its word) and digits (o200k 1-3, Tekken 1). Expected pieces
// derived by hand from their tokenizer.json regexes.
TEST(PreTokenizer, O200kAndTekkenSplitAtCaseChanges) {
  const std::string text = "Hello World's HTTPServer 12345\n\n  x camelCase";
  EXPECT_EQ(tok::PreTokenizer("gpt-4o").split(text),
            (std::vector<std::string>{"Hello", " World's", " HTTPServer", " ", "123", "45", "\n\n", " ", " x",
                                      " camel", "Case"}));
  EXPECT_EQ(tok::PreTokenizer("tekken").split(text),
            (std::vector<std::string>{"Hello", " World", "'s", " HTTPServer", " ", "1", "2", "3", "4", "5", "\n\n",
                                      " ", " x", " camel", "Case"}));
  // Cased letters beyond ASCII are cased letters: "ÉCOLE" one upper run, "Élan" upper then lower.
  EXPECT_EQ(tok::PreTokenizer("tekken").split("\xC3\x89" "COLE \xC3\x89" "lan"),
            (std::vector<std::string>{"\xC3\x89" "COLE", " \xC3\x89" "lan"}));
  EXPECT_TRUE(tok::PreTokenizer::is_known("tekken"));
  EXPECT_TRUE(tok::PreTokenizer::is_known("gpt-4o"));
}

TEST(PreTokenizer, PiecesCoverTextAndSurviveInvalidUtf8) {
  const std::string text = "ok \xFF\xFE bad \xE2\x82 cut 123\xF0";
  for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder",
                           "falcon", "starcoder", "refact", "mpt", "gpt-4o", "tekken"}) {
    const tok::PreTokenizer pre(name);
    std::string joined;
    for (const auto& piece : pre.split(text)) {
      EXPECT_FALSE(piece.empty()) << name;
      joined += piece;
    }
    EXPECT_EQ(joined, text) << name;
  }
  EXPECT_THROW(tok::PreTokenizer("no-such-pre"), Error);
}

TEST(PreTokenizer, CopiesWorkOnTheirOwnThreads) {
  const tok::PreTokenizer original("llama-bpe");
  const auto expected = original.split("Hello, world! 1234567 ok");
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t, copy = original]() {
      bool all = true;
      for (int i = 0; i < 200; ++i) all &= copy.split("Hello, world! 1234567 ok") == expected;
      ok[t] = all;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// A copy of the llama-bpe vocabulary with tokenizer.ggml.pre replaced.
std::vector<uint8_t> vocab_with_pre(const GGUFFile& src, const std::string& pre) {
  GGUFWriter w;
  for (const auto& [key, value] : src.metadata()) w.set(key, value);
  w.set("tokenizer.ggml.pre", GGUFValue::of_str(pre));
  return w.to_bytes();
}

// Where a file does not say whether to add BOS, llama.cpp's default for its pre-tokenizer holds:
// Llama 3's and Tekken's add it (Mistral Nemo / Small 3 files would lose it otherwise), the others
// (byte-level BPE) do not.
TEST(Tokenizer, AddBosDefaultFollowsThePreTokenizer) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const auto src = GGUFFile::open(path);
  for (const auto& [pre, adds] : {std::pair<const char*, bool>{"tekken", true}, {"llama-bpe", true},
                                  {"gpt-4o", false}, {"qwen2", false}}) {
    GGUFWriter w;
    for (const auto& [key, value] : src->metadata())
      if (key != "tokenizer.ggml.add_bos_token") w.set(key, value);
    w.set("tokenizer.ggml.pre", GGUFValue::of_str(pre));
    const auto bytes = w.to_bytes();
    const auto file = GGUFFile::parse(bytes.data(), bytes.size(), pre);
    const Tokenizer t = Tokenizer::from_gguf(*file);
    EXPECT_EQ(t.add_bos_default(), adds) << pre;
    EXPECT_EQ(t.encode("hi", true, false).size(), adds ? 2u : 1u) << pre;
  }
}

TEST(Tokenizer, Qwen2PreTokenizerOnByteLevelVocab) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const auto src = GGUFFile::open(path);
  const auto bytes = vocab_with_pre(*src, "qwen2");
  const auto file = GGUFFile::parse(bytes.data(), bytes.size(), "llama-bpe-as-qwen2");
  const Tokenizer qwen = Tokenizer::from_gguf(*file);
  const Tokenizer& llama3 = load_vocab(path);
  EXPECT_EQ(qwen.pre_name(), "qwen2");

  const auto digit = [&](char c) { return llama3.encode(std::string(1, c), false, false).at(0); };
  EXPECT_EQ(qwen.encode("12345", false, false),
            (std::vector<TokenId>{digit('1'), digit('2'), digit('3'), digit('4'), digit('5')}));
  EXPECT_EQ(llama3.encode("12345", false, false).size(), 2u);  // "123" "45"

  const std::string text = "Call 911 or 0800-123-4567 now.";
  const auto ids = qwen.encode(text, false, false);
  EXPECT_EQ(qwen.decode(ids), text);
  int digit_tokens = 0;
  for (const TokenId id : ids) {
    const std::string piece = qwen.token_to_piece(id);
    if (std::any_of(piece.begin(), piece.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      EXPECT_EQ(piece.size(), 1u) << "digit token " << escaped(piece);
      ++digit_tokens;
    }
  }
  EXPECT_EQ(digit_tokens, 14);  // 911, 0800, 123, 4567
}

// ---- randomized checks -------------------------------------------------------------------

// Deterministic random text: ASCII words, digits, whitespace runs, multi-byte characters and
// special-token fragments, optionally with malformed UTF-8 and with texts that SentencePiece
// cannot give back (a literal U+2581 reads as a space; phi-3's user-defined "</s>" is matched
// even as plain text and the space prefix follows it).
std::string random_text(std::mt19937& rng, size_t parts, bool malformed, bool spm_ambiguous) {
  static const std::vector<std::string> kParts = {
      "the", "The", "quick", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "0", "42", "1234567",
      "'s", "'LL", "don't", ",", ".", "...", "!!", "(", ")", "{", "}", "<|", "|>", "<|eot_id|>",
      "\xC3\xA9", "\xC3\xBC", "\xD0\xBD\xD0\xB5", "\xE6\x88\x91", "\xE5\xB7\xA5",
      "\xF0\x9F\xA6\x99", "\xF0\x9F\x98\x81", "\xEF\xBD\x9E", "\xD9\xA1", "\xE1\x9E\x80",
      "\xC2\x85", "\xE3\x80\x80"};
  static const std::vector<std::string> kMalformed = {"\xFF", "\xC3", "\xE2\x82", "\x80", "\xF0\x9F"};
  static const std::vector<std::string> kSpmAmbiguous = {"\xE2\x96\x81", "<s>", "</s>"};
  std::string text;
  for (size_t i = 0; i < parts; ++i) {
    const uint32_t r = rng() % 100;
    if (malformed && r < 8) text += kMalformed[rng() % kMalformed.size()];
    else if (spm_ambiguous && r >= 92) text += kSpmAmbiguous[rng() % kSpmAmbiguous.size()];
    else text += kParts[rng() % kParts.size()];
  }
  return text;
}

TEST(Tokenizer, RandomTextsRoundTripOnEveryVocab) {
  std::mt19937 rng(1234);
  int vocabs = 0;
  for (const auto& name : vector_files()) {
    const std::string path = test::shared_file("tokenizer/" + name + ".gguf");
    if (path.empty()) continue;
    ++vocabs;
    const Tokenizer& tok = load_vocab(path);
    const bool spm = tok.model_name() == "llama";
    for (int i = 0; i < 40; ++i) {
      // Valid UTF-8 comes back byte for byte from every vocabulary.
      const std::string text = random_text(rng, 1 + rng() % 40, false, !spm);
      EXPECT_EQ(tok.decode(tok.encode(text, true, false)), text) << name << " " << escaped(text);
      // Anything at all is tokenized into valid ids.
      const std::string any = random_text(rng, 1 + rng() % 40, true, true);
      for (const bool parse_special : {false, true})
        for (const TokenId id : tok.encode(any, true, parse_special))
          ASSERT_TRUE(id >= 0 && id < tok.n_vocab()) << name << " " << escaped(any);
    }
  }
  if (vocabs == 0) GTEST_SKIP() << "no shared vocabularies";
}

// Fill-in-the-middle tokens, found by their text where the file names no ids: StarCoder's and
// Refact's <fim_prefix>/<fim_suffix>/<fim_middle>, DeepSeek Coder's <｜fim▁begin｜>/<｜fim▁hole｜>/
// <｜fim▁end｜>; none in Llama's vocabularies.
TEST(Tokenizer, FillInTheMiddleTokens) {
  int vocabs = 0;
  for (const auto& [name, pre, suf, mid] : std::vector<std::array<std::string, 4>>{
           {"starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
           {"refact", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
           {"deepseek-coder", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>",
            "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>"},
           {"llama-spm", "", "", ""},
           {"llama-bpe", "", "", ""}}) {
    const std::string path = test::shared_file("tokenizer/ggml-vocab-" + name + ".gguf");
    if (path.empty()) continue;
    ++vocabs;
    const Tokenizer& tok = load_vocab(path);
    if (pre.empty()) {
      EXPECT_EQ(tok.fim_prefix(), -1) << name;
      EXPECT_EQ(tok.fim_suffix(), -1) << name;
      EXPECT_EQ(tok.fim_middle(), -1) << name;
      continue;
    }
    ASSERT_GE(tok.fim_prefix(), 0) << name;
    ASSERT_GE(tok.fim_suffix(), 0) << name;
    ASSERT_GE(tok.fim_middle(), 0) << name;
    EXPECT_EQ(tok.token_text(tok.fim_prefix()), pre) << name;
    EXPECT_EQ(tok.token_text(tok.fim_suffix()), suf) << name;
    EXPECT_EQ(tok.token_text(tok.fim_middle()), mid) << name;
    EXPECT_EQ(tok.encode(pre, false, true), std::vector<TokenId>{tok.fim_prefix()}) << name;  // (special text: the token)
  }
  if (vocabs == 0) GTEST_SKIP() << "no shared vocabularies";
}

TEST(Tokenizer, MalformedUtf8RoundTrips) {
  // Byte fallback (SentencePiece) and byte-level BPE both keep malformed bytes, where the
  // vocabulary has a token for every byte. (Falcon, StarCoder and MPT lack one for 0xFF, which
  // is dropped; in DeepSeek's vocabularies the characters standing for bytes C0, C1 and F5-FF are
  // user-defined tokens that decode as those characters.)
  std::mt19937 rng(77);
  for (const char* name : {"ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-gpt-2"}) {
    const std::string path = test::shared_file(std::string("tokenizer/") + name + ".gguf");
    if (path.empty()) continue;
    const Tokenizer& tok = load_vocab(path);
    const bool spm = tok.model_name() == "llama";
    for (int i = 0; i < 40; ++i) {
      const std::string text = random_text(rng, 1 + rng() % 40, true, !spm);
      EXPECT_EQ(tok.decode(tok.encode(text, false, false)), text) << name << " " << escaped(text);
    }
  }
}

TEST(Tokenizer, SpmWordSegmentsMatchWholeTextMerging) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-spm.gguf");
  const auto file = GGUFFile::open(path);
  const auto segmented = tok::load_vocab(*file);
  ASSERT_TRUE(segmented->spm_words_independent);
  auto whole = std::make_shared<tok::Vocab>(*segmented);
  whole->spm_words_independent = false;

  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    std::string escaped_text;
    for (const char c : random_text(rng, 1 + rng() % 60, true, true)) {
      if (c == ' ') escaped_text += "\xE2\x96\x81";
      else escaped_text.push_back(c);
    }
    std::vector<TokenId> a, b;
    tok::spm_tokenize(*segmented, escaped_text, a);
    tok::spm_tokenize(*whole, escaped_text, b);
    ASSERT_EQ(a, b) << escaped(escaped_text);
  }
}

// ---- special tokens ------------------------------------------------------------------------

TEST(Tokenizer, ParseSpecialOnLlama3) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const Tokenizer& tok = load_vocab(path);
  EXPECT_EQ(tok.model_name(), "gpt2");
  EXPECT_EQ(tok.pre_name(), "llama-bpe");
  EXPECT_EQ(tok.n_vocab(), 128256);
  EXPECT_EQ(tok.bos(), 128000);
  EXPECT_EQ(tok.eos(), 128001);
  EXPECT_TRUE(tok.add_bos_default());

  const auto hi = tok.encode("hi", false, false);
  ASSERT_FALSE(hi.empty());
  std::vector<TokenId> expected = {128000};
  expected.insert(expected.end(), hi.begin(), hi.end());
  expected.push_back(128009);
  EXPECT_EQ(tok.encode("<|begin_of_text|>hi<|eot_id|>", false, true), expected);
  // add_bos puts BOS in front of whatever the text holds.
  expected.insert(expected.begin(), 128000);
  EXPECT_EQ(tok.encode("<|begin_of_text|>hi<|eot_id|>", true, true), expected);

  // Without parse_special the same text is plain text.
  const auto plain = tok.encode("<|eot_id|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 128009), 0);
  EXPECT_EQ(tok.decode(plain), "<|eot_id|>");

  EXPECT_TRUE(tok.is_eog(128009));
  EXPECT_TRUE(tok.is_eog(128008));
  EXPECT_TRUE(tok.is_eog(128001));
  EXPECT_FALSE(tok.is_eog(128000));
  EXPECT_FALSE(tok.is_eog(128006));
  EXPECT_FALSE(tok.is_eog(hi[0]));
  EXPECT_FALSE(tok.is_eog(-1));
  EXPECT_TRUE(tok.is_control(128006));
  EXPECT_FALSE(tok.is_control(hi[0]));
  EXPECT_EQ(tok.token_text(128009), "<|eot_id|>");
  EXPECT_EQ(tok.token_to_piece(128009), "");  // control tokens are not shown

  const auto header = tok.encode(
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
      "<|end_header_id|>\n\n",
      true, true);
  EXPECT_EQ(header.front(), 128000);
  EXPECT_EQ(std::count(header.begin(), header.end(), 128006), 2);
  EXPECT_EQ(std::count(header.begin(), header.end(), 128007), 2);
  EXPECT_EQ(std::count(header.begin(), header.end(), 128009), 1);
}

// gpt-oss's harmony vocabulary: <|end|> closes the analysis message and the final one follows, so
// with <|return|> and <|call|> present <|end|> does not end the generation (llama.cpp's rule);
// without them (Phi-3's <|end|>) it does. A byte-level vocabulary written here, its specials
// control tokens.
TEST(Tokenizer, HarmonyEndsAtReturnOrCallNotEnd) {
  for (const bool harmony : {true, false}) {
    std::vector<std::string> tokens = {"!", "<|startoftext|>", "<|endoftext|>", "h", "i", "<|end|>"};
    if (harmony) tokens.insert(tokens.end(), {"<|return|>", "<|call|>"});
    std::vector<int32_t> types(tokens.size(), 1);
    for (size_t i = 1; i < tokens.size(); ++i) types[i] = tokens[i].starts_with("<|") ? 3 : 1;
    GGUFWriter w;
    w.set("general.architecture", GGUFValue::of_str("gpt-oss"));
    w.set("tokenizer.ggml.model", GGUFValue::of_str("gpt2"));
    w.set("tokenizer.ggml.pre", GGUFValue::of_str("gpt-4o"));
    w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(tokens));
    w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(types));
    w.set("tokenizer.ggml.merges", GGUFValue::of_str_array({"h i"}));
    w.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(harmony ? 6 : 5));
    const auto bytes = w.to_bytes();
    const auto file = GGUFFile::parse(bytes.data(), bytes.size(), "harmony");
    const Tokenizer t = Tokenizer::from_gguf(*file);
    EXPECT_EQ(t.is_eog(5), !harmony) << "<|end|>";
    if (harmony) {
      EXPECT_TRUE(t.is_eog(6)) << "<|return|>";
      EXPECT_TRUE(t.is_eog(7)) << "<|call|>";
    }
    EXPECT_TRUE(t.is_eog(2)) << "<|endoftext|>";
  }
}

TEST(Tokenizer, SpmSpacePrefixAfterSpecialTokens) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load_vocab(path);
  EXPECT_EQ(tok.model_name(), "llama");
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.is_eog(2));
  const auto hello = tok.encode("Hello", false, false);  // "▁Hello"
  std::vector<TokenId> expected = {1};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(2);
  expected.insert(expected.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok.encode("<s>Hello</s>Hello", false, true), expected);
  EXPECT_EQ(tok.encode("Hello", true, false).front(), 1);
  EXPECT_EQ(tok.decode(tok.encode("Hello world", true, false)), "Hello world");
}

TEST(Tokenizer, UserDefinedTokensSplitEvenWithoutParseSpecial) {
  // GPT-NeoX style vocabularies list runs of spaces as user-defined tokens.
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-gpt-neox.gguf");
  const Tokenizer& tok = load_vocab(path);
  EXPECT_EQ(tok.pre_name(), "gpt-2");  // no tokenizer.ggml.pre
  const std::string text = "def f():\n        return 1";
  const auto ids = tok.encode(text, false, false);
  EXPECT_EQ(tok.decode(ids), text);
  bool has_space_run = false;
  for (const TokenId id : ids) has_space_run |= tok.token_text(id) == std::string(8, ' ');
  EXPECT_TRUE(has_space_run);
}

TEST(Tokenizer, RealModelPromptTokens) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  const auto file = GGUFFile::open(model);
  const Tokenizer tok = Tokenizer::from_gguf(*file);  // legacy seperator key, no add_bos key
  EXPECT_TRUE(tok.add_bos_default());
  EXPECT_EQ(tok.n_vocab(), 512);
  // From stories260K.golden.json (llama.cpp).
  EXPECT_EQ(tok.encode("Once upon a time", true, false),
            (std::vector<TokenId>{1, 403, 407, 261, 378}));
}

// ---- decoding ----------------------------------------------------------------------------

TEST(StreamDecoder, HoldsSplitMultibyteCharacters) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load_vocab(path);
  for (const std::string text : {"\xF0\x9F\xA6\x99 llama", "rare \xE9\xBE\x98 char"}) {
    const auto ids = tok.encode(text, true, false);
    int byte_tokens = 0;
    for (const TokenId id : ids) byte_tokens += tok.token_text(id).starts_with("<0x");
    ASSERT_GE(byte_tokens, 3) << "expected byte fallback for " << escaped(text);

    StreamDecoder stream(tok);
    std::string streamed;
    int held = 0;
    for (const TokenId id : ids) {
      const std::string piece = tok.token_to_piece(id);
      const std::string out = stream.push(id);
      if (tok.token_text(id).starts_with("<0x") && out.empty()) ++held;
      // Every chunk handed out is complete UTF-8.
      EXPECT_EQ(tok::incomplete_utf8_tail(out), 0u) << escaped(out);
      streamed += out;
    }
    streamed += stream.flush();
    // A stream is a continuation: the SentencePiece space prefix stays.
    EXPECT_EQ(streamed, " " + text);
    EXPECT_EQ(held, byte_tokens - 1) << "all but the last byte of the character are held";
  }
}

TEST(StreamDecoder, FlushReturnsIncompleteTail) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load_vocab(path);
  const auto ids = tok.encode("\xF0\x9F\xA6\x99", false, false);  // "▁" + 4 byte tokens
  ASSERT_GE(ids.size(), 4u);
  StreamDecoder stream(tok);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += stream.push(ids[i]);
  EXPECT_EQ(out, " ");  // the "▁" piece is complete, the first 3 bytes of the emoji are held
  EXPECT_EQ(stream.flush(), "\xF0\x9F\xA6");
  EXPECT_EQ(stream.flush(), "");
}

TEST(Tokenizer, DecodeStripsOnlyTheSpacePrefix) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load_vocab(path);
  for (const std::string text : {"", " ", "  x", "x ", "\n", " Hello  world "}) {
    EXPECT_EQ(tok.decode(tok.encode(text, true, false)), text) << escaped(text);
    EXPECT_EQ(tok.decode(tok.encode(text, false, false)), text) << escaped(text);
  }
  EXPECT_THROW(tok.decode({tok.n_vocab()}), Error);
  EXPECT_THROW(tok.token_to_piece(-1), Error);
}

TEST(Tokenizer, ByteLevelRoundTripsArbitraryBytes) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const Tokenizer& tok = load_vocab(path);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(char(b));
  for (const std::string& text : {all_bytes, std::string("bad \xC3 utf8 \xFF\xFE end")}) {
    const auto ids = tok.encode(text, false, false);
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, CopiesEncodeOnTheirOwnThreads) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const Tokenizer& tok = load_vocab(path);
  const std::string text = "The quick brown fox jumps over 1234567 lazy dogs! \xF0\x9F\xA6\x99";
  const auto expected = tok.encode(text, true, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(3, 0);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t, copy = tok]() {
      bool all = true;
      for (int i = 0; i < 100; ++i) all &= copy.encode(text, true, true) == expected;
      ok[t] = all;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(3, 1));
  Tokenizer assigned = tok;
  assigned = load_vocab(path);
  EXPECT_EQ(assigned.encode(text, true, true), expected);
}

// ---- metadata errors ------------------------------------------------------------------------

// A minimal SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, a few pieces.
GGUFWriter tiny_spm_vocab() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back({'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'});
    types.push_back(6);
  }
  for (const char* piece : {"\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "ab"}) {
    tokens.push_back(piece);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  scores[tokens.size() - 2] = -1.0f;  // "ab"
  scores[tokens.size() - 1] = -2.0f;  // "▁ab"
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::of_str("llama"));
  w.set("tokenizer.ggml.model", GGUFValue::of_str("llama"));
  w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(tokens));
  w.set("tokenizer.ggml.scores", GGUFValue::of_f32_array(scores));
  w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(1));
  w.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(2));
  w.set("tokenizer.ggml.seperator_token_id", GGUFValue::of_u32(0xFFFFFFFFu));
  w.set("tokenizer.ggml.padding_token_id", GGUFValue::of_u32(0xFFFFFFFFu));
  return w;
}

Tokenizer load(const GGUFWriter& w) {
  const auto bytes = w.to_bytes();
  const auto file = GGUFFile::parse(bytes.data(), bytes.size(), "memory.gguf");
  return Tokenizer::from_gguf(*file);
}

std::string load_error(const GGUFWriter& w) {
  try {
    load(w);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, TinySpmVocab) {
  const Tokenizer tok = load(tiny_spm_vocab());
  EXPECT_TRUE(tok.add_bos_default());
  const TokenId ab_prefixed = tok.n_vocab() - 1;
  EXPECT_EQ(tok.encode("ab", true, false), (std::vector<TokenId>{1, ab_prefixed}));
  // 'c' is not a piece: byte fallback <0x63> = 3 + 0x63.
  EXPECT_EQ(tok.encode("abc", false, false), (std::vector<TokenId>{ab_prefixed, 3 + 0x63}));
  EXPECT_EQ(tok.decode({1, ab_prefixed, 3 + 0x63}), "abc");
}

TEST(Tokenizer, MetadataErrorsNameTheKey) {
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.model", GGUFValue::of_str("bert"));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("bert"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.model"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(100000));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.bos_token_id"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.scores", GGUFValue::of_f32_array({0.0f, 1.0f}));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.scores"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array({1, 1}));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.token_type"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.tokens", GGUFValue::of_i32_array({1, 2, 3}));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.tokens"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.model", GGUFValue::of_str("gpt2"));  // no merges
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.merges"), std::string::npos) << msg;
  }
  {
    GGUFWriter w = tiny_spm_vocab();
    w.set("tokenizer.ggml.model", GGUFValue::of_str("gpt2"));
    w.set("tokenizer.ggml.merges", GGUFValue::of_str_array({"a b"}));
    w.set("tokenizer.ggml.pre", GGUFValue::of_str("klingon"));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
    EXPECT_NE(msg.find("klingon"), std::string::npos) << msg;
  }
  {
    GGUFWriter w;
    w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array({"a"}));
    const std::string msg = load_error(w);
    EXPECT_NE(msg.find("tokenizer.ggml.model"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ft
