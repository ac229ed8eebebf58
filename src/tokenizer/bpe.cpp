// Byte-level BPE of one pre-tokenized word, as llama.cpp's llm_tokenizer_bpe_session: start from
// one symbol per byte, repeatedly merge the adjacent pair with the lowest merge rank (leftmost
// on ties), then look each symbol up in the vocabulary, falling back to single-byte tokens.
// Symbols carry piece ids so a merge lookup is one hash probe on an integer pair.
#include <algorithm>

#include "tokenizer/tokenizer_internal.h"

namespace ft::tok {

namespace {

struct Symbol {
  int32_t piece;
  uint32_t begin;  // byte offset in the word
  uint32_t size;   // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t result;
  uint32_t size;  // bytes of left + right when queued; stale if the symbols changed since
};

// std heap functions build a max-heap: "less" means later, so lower rank / lefter pops first.
struct PopsLater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

struct BpeScratch {
  std::vector<Symbol> symbols;
  std::vector<Bigram> queue;
};

BpeSession::BpeSession(const Vocab& vocab, bool ignore_merges)
    : vocab_(vocab), ignore_merges_(ignore_merges), scratch_(std::make_unique<BpeScratch>()) {}

BpeSession::~BpeSession() = default;

void BpeSession::tokenize_word(std::string_view word, std::vector<TokenId>& out) {
  if (word.empty()) return;
  const int32_t n_vocab = vocab_.n_vocab();
  if (ignore_merges_) {
    const int32_t piece = vocab_.bytes_to_piece.find(word);
    if (piece >= 0 && piece < n_vocab) {
      out.push_back(piece);
      return;
    }
  }

  auto& symbols = scratch_->symbols;
  auto& queue = scratch_->queue;
  symbols.clear();
  queue.clear();
  const int32_t n = int32_t(word.size());
  for (int32_t i = 0; i < n; ++i)
    symbols.push_back({vocab_.byte_piece[uint8_t(word[i])], uint32_t(i), 1, i - 1,
                       i + 1 < n ? i + 1 : -1});

  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint64_t key = (uint64_t(uint32_t(symbols[left].piece)) << 32) |
                         uint32_t(symbols[right].piece);
    const BpeMerge* merge = vocab_.merges.find(key);
    if (!merge) return;
    queue.push_back({merge->rank, left, right, merge->result,
                     symbols[left].size + symbols[right].size});
    std::push_heap(queue.begin(), queue.end(), PopsLater{});
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), PopsLater{});
    const Bigram bigram = queue.back();
    queue.pop_back();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // A symbol only grows by absorbing its right neighbour, so an unchanged total size means
    // both symbols are still the ones this bigram was queued for.
    if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
    left.piece = bigram.result;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const Symbol& sym = symbols[i];
    if (sym.piece >= 0 && sym.piece < n_vocab) {
      out.push_back(sym.piece);
      continue;
    }
    // A byte the vocabulary cannot spell (e.g. 0xFF, absent from some vocabularies as it never
    // occurs in UTF-8) is dropped, as llama.cpp does: the "unknown" id of such vocabularies is
    // often <|endoftext|>, which must not appear mid-prompt.
    for (uint32_t b = sym.begin; b < sym.begin + sym.size; ++b) {
      const TokenId t = vocab_.byte_token[uint8_t(word[b])];
      if (t >= 0) out.push_back(t);
    }
  }
}

}  // namespace ft::tok
