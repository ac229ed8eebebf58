// Internals of the tokenizer module, shared by its .cpp files and its unit tests.
// Not part of the public API: everything here may change with the implementation.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ft::tok {

// Fast hash for short byte strings (token texts are mostly under 16 bytes).
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

// String -> id, open addressing (one probe into a flat array, then one key compare), owning
// its keys. Far fewer cache misses than std::unordered_map on vocabularies of 10^5 entries.
class StringIndex {
 public:
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(key);
    const uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.entry < 0) return -1;
      if (slot.tag == tag && keys_[slot.entry] == key) return ids_[slot.entry];
    }
  }
  // Adds key -> id unless the key is present; returns the id now stored for key.
  int32_t insert(std::string_view key, int32_t id) {
    if ((keys_.size() + 1) * 2 > slots_.size()) rehash(std::max<size_t>(64, slots_.size() * 2));
    const uint64_t h = hash_bytes(key);
    const uint32_t tag = uint32_t(h >> 32);
    size_t i = h & mask_;
    for (;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.entry < 0) break;
      if (slot.tag == tag && keys_[slot.entry] == key) return ids_[slot.entry];
    }
    slots_[i] = {tag, int32_t(keys_.size())};
    keys_.emplace_back(key);
    ids_.push_back(id);
    return id;
  }
  void reserve(size_t n) {
    keys_.reserve(n);
    ids_.reserve(n);
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    if (cap > slots_.size()) rehash(cap);
  }
  size_t size() const { return keys_.size(); }

 private:
  struct Slot {
    uint32_t tag;
    int32_t entry;  // index into keys_/ids_, -1 when empty
  };
  void rehash(size_t capacity) {
    slots_.assign(capacity, Slot{0, -1});
    mask_ = capacity - 1;
    for (size_t e = 0; e < keys_.size(); ++e) {
      const uint64_t h = hash_bytes(keys_[e]);
      size_t i = h & mask_;
      while (slots_[i].entry >= 0) i = (i + 1) & mask_;
      slots_[i] = {uint32_t(h >> 32), int32_t(e)};
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::vector<std::string> keys_;
  std::vector<int32_t> ids_;
};

// uint64 -> V, open addressing. Keys must not be ~0 (the empty marker).
template <class V>
class U64Map {
 public:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  const V* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  // Inserts unless present; returns the stored value and whether it was inserted.
  std::pair<V*, bool> insert(uint64_t key, const V& value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(64, slots_.size() * 2));
    size_t i = slot_of(key);
    for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
      if (slots_[i].key == key) return {&slots_[i].value, false};
    slots_[i] = {key, value};
    ++size_;
    return {&slots_[i].value, true};
  }
  void reserve(size_t n) {
    size_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    if (cap > slots_.size()) rehash(cap);
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    V value;
  };
  size_t slot_of(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return size_t(h ^ (h >> 29)) & mask_;
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{kEmpty, V{}});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = slot_of(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// ---- UTF-8 ----------------------------------------------------------------------------------

// Sequence length announced by a lead byte, as llama.cpp's unicode_len_utf8 (continuation and
// invalid bytes count as 1).
inline size_t utf8_lead_len(unsigned char c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}
void append_utf8(std::string& out, uint32_t cp);
// Decodes one well-formed code point at s[pos]; returns its byte length, or 0 if malformed.
size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp);
// Number of trailing bytes of s that start a well-formed but unfinished sequence (0..3).
size_t incomplete_utf8_tail(std::string_view s);

// ---- GPT-2 byte-level alphabet ----------------------------------------------------------------
// Every byte is shown as one printable code point (printable Latin-1 bytes as themselves, the
// rest as U+0100 + n in byte order); vocabularies and merges of "gpt2" models are written in it.

int gpt2_codepoint_to_byte(uint32_t cp);  // -1 when cp is not in the alphabet
// Raw bytes of a text written in the alphabet; false when some character is outside it.
bool gpt2_decode(std::string_view text, std::string& raw);

// ---- Pre-tokenizer (byte-level BPE) ------------------------------------------------------------

struct Span {
  size_t begin;
  size_t size;
};

// A chain of regexes as llama.cpp's llm_tokenizer_bpe applies them: each regex splits every
// piece produced by the previous one into its matches and the unmatched gaps between them.
// Compiled once (PCRE2, UTF + UCP, JIT); copies share the compiled code and own their match
// data, so each copy may be used from its own thread.
class PreTokenizer {
 public:
  // Canonical pre-tokenizer names understood (tokenizer.ggml.pre values and aliases).
  static bool is_known(std::string_view name);
  // Whether llama.cpp adds BOS for this pre-tokenizer when the file does not say (llama3, tekken).
  static bool adds_bos(std::string_view name);
  // Throws ft::Error for an unknown name.
  explicit PreTokenizer(std::string_view name);
  PreTokenizer(const PreTokenizer& other);
  PreTokenizer& operator=(const PreTokenizer& other);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends to `out` consecutive non-empty spans that cover `text` exactly.
  void split(std::string_view text, std::vector<Span>& out) const;
  std::vector<std::string> split(std::string_view text) const;

  // Llama 3 family: a piece that is a whole vocabulary token skips the merges.
  bool ignore_merges() const;

 private:
  struct Compiled;
  struct Scratch;
  std::shared_ptr<const Compiled> compiled_;
  std::unique_ptr<Scratch> scratch_;
};

// ---- Vocabulary --------------------------------------------------------------------------------

struct BpeMerge {
  int32_t rank = 0;
  int32_t result = 0;  // piece id of the concatenation
};

// Immutable data shared by all copies of a Tokenizer.
struct Vocab {
  enum class Model { SPM, BPE };
  Model model = Model::SPM;
  std::string model_name;  // "llama" | "gpt2"
  std::string pre_name;

  std::vector<std::string> text;   // as stored in tokenizer.ggml.tokens
  std::vector<float> score;        // SPM merge priority
  std::vector<TokenType> type;
  std::vector<std::string> piece;  // bytes produced when the token is decoded
  std::vector<uint8_t> eog;        // 1 for end-of-generation tokens

  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  TokenId fim_pre = -1, fim_suf = -1, fim_mid = -1;  // fill in the middle; -1: none
  TokenId fim_rep = -1, fim_sep = -1;  // repository-level FIM: repository name, file separator; -1: none
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;

  // SPM: every token text -> id.
  StringIndex text_to_id;
  size_t max_token_bytes = 0;
  // SPM: no token has U+2581 after another character except U+2581 itself, so no merge can
  // cross the start of a word and words can be merged independently (cache-friendly heaps).
  bool spm_words_independent = false;
  // SPM byte fallback (<0xXX>) / BPE single-byte tokens; -1 when the vocabulary lacks one.
  std::array<TokenId, 256> byte_token{};

  // BPE works on raw bytes. A "piece id" is a token id (< n_vocab) or, for byte strings that
  // merges produce but the vocabulary lacks, an id from n_vocab up in order of first use.
  StringIndex bytes_to_piece;
  int32_t n_bpe_tokens = 0;  // entries of bytes_to_piece that are vocabulary tokens
  std::array<int32_t, 256> byte_piece{};
  U64Map<BpeMerge> merges;  // (left piece << 32 | right piece) -> merge

  // Control / user-defined / unknown tokens, matched in the text before tokenization.
  struct SpecialTrie {
    std::array<int32_t, 256> root{};                // first byte -> node, -1 when none
    U64Map<int32_t> edges;                          // (node << 8 | byte) -> node
    std::vector<TokenId> token_at;                  // node -> token ending there, or -1
    std::vector<int32_t> priority;                  // token id -> rank (0 = tried first), -1
  } specials;

  int32_t n_vocab() const { return int32_t(text.size()); }
  int32_t piece_id_for(std::string_view bytes);  // builder: find or add an extra piece
};

// Reads and validates tokenizer.ggml.* (see Tokenizer::from_gguf). Throws ft::Error.
std::shared_ptr<Vocab> load_vocab(const GGUFFile& file);

// A text fragment or a special token, in input order.
struct Fragment {
  TokenId token;  // -1 for text
  size_t begin;
  size_t size;
};
// Splits text on special-token texts the way llama.cpp's tokenizer_st_partition does: tokens
// are tried longest first, each claiming its leftmost non-overlapping occurrences inside the
// text not yet claimed. User-defined tokens always count; control and unknown tokens only with
// parse_special.
void partition_special(const Vocab& vocab, std::string_view text, bool parse_special,
                       std::vector<Fragment>& out);

// SentencePiece BPE over `escaped` (spaces already U+2581), appending ids.
void spm_tokenize(const Vocab& vocab, std::string_view escaped, std::vector<TokenId>& out);

// Byte-level BPE of one pre-tokenized word (raw bytes), appending ids. Scratch is reused
// between words to avoid allocations.
struct BpeScratch;
class BpeSession {
 public:
  explicit BpeSession(const Vocab& vocab, bool ignore_merges);
  ~BpeSession();
  void tokenize_word(std::string_view word, std::vector<TokenId>& out);

 private:
  const Vocab& vocab_;
  bool ignore_merges_;
  std::unique_ptr<BpeScratch> scratch_;
};

}  // namespace ft::tok
