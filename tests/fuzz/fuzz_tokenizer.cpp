// libFuzzer target: every tokenizer in the shared vocabularies (FT_SHARED_DIR/tokenizer/*.gguf,
// or $FT_SHARED_DIR at run time), on arbitrary text.
// Input: byte 0 picks the vocabulary, byte 1 the flags (bit 0 add_bos, bit 1 parse_special),
// byte 2.. the text. Checks: ids in range; decode, token_to_piece and the streaming decoder never
// fail on them; byte-level BPE ("gpt2") without special parsing decodes back to the input, less
// the bytes that the vocabulary cannot spell (dropped by design, as llama.cpp does: bpe.cpp).
// Inputs with a byte that a vocabulary spells with a token of its own that does not decode to it
// (deepseek-coder lists U+00FF "\xc3\xbf" as a user-defined token, written as text) are not checked.
// Without the vocabularies it does nothing (scripts/fuzz.sh says so and skips it).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocabulary {
  ft::Tokenizer tok;
  bool spells[256];       // the byte alone encodes to something
  bool round_trips[256];  // ... that decodes to it
};

std::vector<Vocabulary>& vocabularies() {
  static std::vector<Vocabulary> v;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("FT_SHARED_DIR");
  const std::filesystem::path dir = std::filesystem::path(env ? env : FT_SHARED_DIR) / "tokenizer";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  std::sort(files.begin(), files.end());  // byte 0 picks the same vocabulary on every machine
  for (const auto& f : files) {
    Vocabulary& v = vocabularies().emplace_back(Vocabulary{ft::Tokenizer::from_gguf(*ft::GGUFFile::open(f.string())), {}, {}});
    for (int b = 0; b < 256; ++b) {
      const std::string one(1, char(b));
      const std::vector<ft::TokenId> ids = v.tok.encode(one, false, false);
      v.spells[b] = !ids.empty();
      v.round_trips[b] = v.tok.decode(ids) == one;
    }
  }
  std::fprintf(stderr, "fuzz_tokenizer: %zu vocabularies in %s\n", files.size(), dir.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Vocabulary>& vocabs = vocabularies();
  if (vocabs.empty() || size < 2) return 0;
  const Vocabulary& vocab = vocabs[data[0] % vocabs.size()];
  const ft::Tokenizer& tok = vocab.tok;
  const bool add_bos = data[1] & 1, parse_special = data[1] & 2;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const std::vector<ft::TokenId> ids = tok.encode(text, add_bos, parse_special);
  for (const ft::TokenId id : ids) FT_FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
  const std::string back = tok.decode(ids);
  if (tok.model_name() == "gpt2" && !parse_special && !add_bos) {
    std::string spelled;
    bool checkable = true;
    for (const char c : text) {
      if (vocab.round_trips[uint8_t(c)]) spelled += c;
      checkable = checkable && (vocab.round_trips[uint8_t(c)] || !vocab.spells[uint8_t(c)]);
    }
    if (checkable) FT_FUZZ_CHECK(back == spelled);
  }
  ft::StreamDecoder sd(tok);
  std::string streamed;
  for (const ft::TokenId id : ids) {
    (void)tok.token_to_piece(id);
    streamed += sd.push(id);
  }
  streamed += sd.flush();
  return 0;
}
