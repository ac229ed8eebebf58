// SentencePiece-style BPE, as llama.cpp's llm_tokenizer_spm_session: start from one symbol per
// UTF-8 character (or malformed byte), repeatedly merge the adjacent pair whose concatenation is the vocabulary
// token with the highest score (leftmost on ties), then emit each symbol's token, or its bytes
// as <0xXX> tokens when the symbol is not in the vocabulary.
// Symbols are always contiguous in the text, so a pair's text is a substring: no allocation.
#include <algorithm>

#include "tokenizer/tokenizer_internal.h"

namespace ft::tok {

namespace {

struct Symbol {
  uint32_t begin;
  uint32_t size;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;
};

// Max-heap order: higher score pops first, then the lefter pair.
struct PopsLater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void spm_tokenize(const Vocab& vocab, std::string_view text, std::vector<TokenId>& out) {
  if (text.empty()) return;
  constexpr std::string_view kSpace = "\xE2\x96\x81";
  // Symbols are linked within a segment only. A segment starts at a U+2581 that follows
  // something else, when the vocabulary guarantees no token spans such a point: merging the
  // segments one by one is then exactly merging the whole text, with small heaps.
  std::vector<Symbol> symbols;
  std::vector<int32_t> segment_starts = {0};
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    // One symbol per character. llama.cpp sizes a symbol by its lead byte alone, so a malformed
    // lead swallows what follows (an escaped space, say) into raw bytes; here each malformed
    // byte is its own symbol, which changes nothing for valid UTF-8.
    uint32_t cp;
    const size_t len = std::max<size_t>(decode_utf8(text, pos, cp), 1);
    const int32_t index = int32_t(symbols.size());
    if (vocab.spm_words_independent && index > 0 && text.compare(pos, kSpace.size(), kSpace) == 0 &&
        !(pos >= kSpace.size() && text.compare(pos - kSpace.size(), kSpace.size(), kSpace) == 0)) {
      segment_starts.push_back(index);
      symbols.back().next = -1;
      symbols.push_back({uint32_t(pos), uint32_t(len), -1, -1});
    } else {
      if (index > 0) symbols.back().next = index;
      symbols.push_back({uint32_t(pos), uint32_t(len), index - 1, -1});
    }
    pos += len;
  }

  std::vector<Bigram> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    if (size > vocab.max_token_bytes) return;
    const TokenId id = vocab.text_to_id.find(text.substr(symbols[left].begin, size));
    if (id < 0) return;
    queue.push_back({vocab.score[id], left, right, size});
    std::push_heap(queue.begin(), queue.end(), PopsLater{});
  };

  segment_starts.push_back(int32_t(symbols.size()));
  for (size_t seg = 0; seg + 1 < segment_starts.size(); ++seg) {
    const int32_t first = segment_starts[seg], last = segment_starts[seg + 1];
    queue.clear();
    for (int32_t i = first + 1; i < last; ++i) try_add(i - 1, i);

    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), PopsLater{});
      const Bigram bigram = queue.back();
      queue.pop_back();
      Symbol& left = symbols[bigram.left];
      Symbol& right = symbols[bigram.right];
      if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = bigram.left;
      try_add(left.prev, bigram.left);
      try_add(bigram.left, left.next);
    }

    for (int32_t i = first; i != -1; i = symbols[i].next) {
      const std::string_view piece = text.substr(symbols[i].begin, symbols[i].size);
      const TokenId id = vocab.text_to_id.find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Merged symbols are always tokens; only single characters missing from the vocabulary
      // get here.
      for (const char c : piece) {
        const TokenId t = vocab.byte_token[uint8_t(c)];
        if (t >= 0) out.push_back(t);
        else if (vocab.unk >= 0) out.push_back(vocab.unk);
      }
    }
  }
}

}  // namespace ft::tok
