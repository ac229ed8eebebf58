// Constrained decoding: a context-free grammar over bytes (a GBNF subset, as llama.cpp's) and a
// matcher that, token by token, masks the logits of the tokens the grammar cannot accept.
//
// Grammar text (GBNF): rules `name ::= alternatives`, alternatives separated by `|`, sequences of
// "literals" (escapes \n \r \t \\ \" \xHH \uHHHH), [character classes] ([a-z0-9_], [^"\\], ASCII
// ranges; a negated class also matches every byte of a non-ASCII character), `.` (any byte),
// rule references, ( groups ), and the postfix operators * + ? {m} {m,} {m,n}; # comments. The
// start rule is `root`. Matching is over bytes: a literal non-ASCII character is its UTF-8 bytes.
//
// Matching state: a set of stacks of grammar positions (a pushdown automaton, as llama.cpp's). The
// mask for a state is the union of its stacks' masks; a stack's top positions are walked over the
// vocabulary sorted by bytes (a token shares the advanced states of its common prefix with the
// previous one; a rejected prefix rejects every token that starts with it in O(1)), that walk is
// cached by those positions (the same string or number context recurs under many stacks), and the
// tokens that leave them mid-token are finished on the stack below (GrammarMatcher::mask_for_state).
// Whole-state masks are cached too (JSON output revisits the same few states), so most steps cost
// one cache lookup and the masking of the logits row.
//
// Limits (a hostile grammar or schema is an error, not a hang): grammar size, stacks per state,
// expansion depth (left recursion is refused), repetition counts, and the work of one state's mask
// (GrammarMatcher::kMaxMaskWork: a mask is computed on the engine thread, between the steps of
// every request, so an ambiguous grammar whose parses each walk the vocabulary must not stall them).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"

namespace ft {

class Grammar {
 public:
  static constexpr int kMaxExpandDepth = 256;  // rule references expanded without consuming a byte
  static constexpr size_t kMaxElems = size_t(1) << 20;  // grammar size after expanding repetitions
  static constexpr int kMaxRepeat = 10000;              // {m,n} bounds
  // Parses GBNF text; throws ft::Error "grammar: line N: what" when it is malformed, refers to an
  // undefined rule, has no `root`, is left-recursive or exceeds the limits.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf);

  struct Elem {
    enum Kind : uint8_t { Bytes, Rule, End } kind = End;
    int32_t rule = -1;         // Rule
    uint64_t set[4] = {};      // Bytes: the accepted bytes (bit b of set[b / 64])
    bool has(uint8_t b) const { return (set[b >> 6] >> (b & 63)) & 1; }
  };
  std::vector<Elem> elems;                 // every alternative's elements, each ended by End
  std::vector<std::vector<int32_t>> alts;  // rule -> the first element of each alternative
  std::vector<std::string> names;          // rule -> name
  int32_t root = -1;
};

// The bytes of every token, sorted, shared by the requests of one tokenizer.
class GrammarVocab {
 public:
  // pieces[t]: token t's bytes as it is detokenized; eog[t]: an end-of-generation token.
  GrammarVocab(std::vector<std::string> pieces, std::vector<bool> eog);
  int32_t n_vocab() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t t) const { return pieces_[size_t(t)]; }
  bool eog(int32_t t) const { return eog_[size_t(t)]; }

 private:
  friend class GrammarMatcher;
  std::vector<std::string> pieces_;
  std::vector<bool> eog_;
  std::vector<int32_t> order_;  // token ids sorted by bytes (empty pieces dropped)
  std::vector<uint16_t> lcp_;   // lcp_[i]: common prefix of order_[i-1] and order_[i] (capped)
  // skip_[d - 1][i]: the first j > i whose lcp_[j] < d, i.e. past every token that shares order_[i]'s
  // first d bytes (d <= kSkipDepths): a walk that rejects a prefix that short jumps over its range
  // (a literal's top rejects all but one first byte: ~256 tokens looked at, not the vocabulary).
  static constexpr size_t kSkipDepths = 4;
  std::vector<int32_t> skip_[kSkipDepths];
};

// One request's progress through a grammar.
class GrammarMatcher {
 public:
  // Stacks advanced by a byte (each stack looked at, each made) to find one state's allowed
  // tokens: ~0.2 s of one core (Zen 5). A nested JSON schema's costliest state on the 128K Llama 3
  // vocabulary takes 1/10 of it (1.6M, 19 ms: Grammar.MaskCostPerTokenOnLlama3Vocabulary prints
  // it); 1,000 parses each inside its own `[^"]*` would take ~30x it (3.4 s a token before this
  // limit, for every request on the engine thread).
  static constexpr uint64_t kMaxMaskWork = uint64_t(1) << 24;
  // Over many tokens the masks may take 1/kMaskRefillTokens of the limit a token on average (~12
  // ms on Zen 5): the work is drawn from a credit of the limit at most, refilled by limit /
  // kMaskRefillTokens for each token accepted. A grammar whose every state is new and costly would
  // otherwise hold the engine thread ~0.2 s a token for as long as its output runs (and a batch of
  // them that times their number each step); the nested schema above averages ~1/100 of the limit.
  static constexpr uint64_t kMaskRefillTokens = 16;

  GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const GrammarVocab> vocab,
                 uint64_t mask_work_limit = kMaxMaskWork);

  // Sets logits[t] = -inf for every token the grammar rejects now (end-of-generation tokens are
  // allowed only once the grammar is complete). n_vocab may be below the vocabulary's (padding).
  // Throws ft::Error when the state's mask takes more than the work limit to find.
  void mask(float* logits, int32_t n_vocab);
  // Finds the current state's mask (then cached for mask()); throws as mask() does. Lets a server
  // refuse a grammar whose first step is too costly before it is queued, off the engine thread.
  void prepare_mask() { mask_for_state(); }
  uint64_t mask_work() const { return work_; }  // the work of the last mask found (0: cached)
  uint64_t mask_credit() const { return credit_; }  // the work the next masks may take (kMaskRefillTokens)
  const std::shared_ptr<const GrammarVocab>& vocab() const { return vocab_; }
  // A copy shares its original's caches (the choices of one request: one thread masks them all);
  // fork() is a matcher in the same state with caches of its own, holding the current state's
  // mask only (for another request, or to keep on another thread).
  GrammarMatcher fork() const;
  // Advances over a sampled token. Returns false (state unchanged) when the grammar rejects it.
  bool accept(int32_t token);
  // Advances over bytes (tests, and prefilled output); false when rejected.
  bool accept_bytes(std::string_view bytes);
  bool complete() const;  // the grammar may end here
  bool done() const;      // it may only end here (nothing more can follow)

  using Stack = std::vector<int32_t>;  // grammar positions, the top (next element) last

 private:
  struct Dep {  // a token that left the walked stack after `offset` of its bytes
    int32_t token;
    uint32_t offset;
  };
  struct TopMask {                // the vocabulary against the top positions of a stack
    std::vector<uint64_t> bits;   // decided there: accepted
    std::vector<Dep> dep;         // to finish on the stack below
  };
  std::vector<Stack> advance(const std::vector<Stack>& from, uint8_t b) const;
  void advance_into(const std::vector<Stack>& from, uint8_t b, std::vector<Stack>& out, Stack& scratch) const;
  void walk(const Stack& top, std::vector<uint64_t>& bits, std::vector<Dep>* dep) const;
  const std::vector<uint64_t>& mask_for_state();

  void check_work() const;  // throws when work_ is past the credit

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const GrammarVocab> vocab_;
  uint64_t work_limit_;
  uint64_t credit_;            // the work the next masks may take (work_limit_ at most)
  mutable uint64_t work_ = 0;  // of the mask being found (advance_into counts every call)
  std::vector<Stack> stacks_;
  std::string state_key() const;
  struct Caches {  // each at most kMaxCachedMasks entries (16 KB each on a 128K vocabulary)
    std::unordered_map<std::string, std::vector<uint64_t>> masks;  // state key -> allowed-token bits
    std::unordered_map<std::string, TopMask> tops;                 // top positions -> their walk
  };
  std::shared_ptr<Caches> caches_ = std::make_shared<Caches>();
};

// A LogitsProcessor over a GrammarMatcher (engine_core.h): masks each row, advances on accept.
class GrammarProcessor : public LogitsProcessor {
 public:
  explicit GrammarProcessor(GrammarMatcher m) : m_(std::move(m)) {}
  void apply(float* logits, int32_t n_vocab, int64_t n_generated) override;
  void accept(int32_t token) override;
  // How many tokens had been accepted when the grammar reached an end nothing may follow (-1:
  // not yet). Written on the engine thread before the token's event; read by its consumer.
  int64_t done_after() const { return done_after_.load(); }

 private:
  GrammarMatcher m_;
  int64_t accepted_ = 0;
  std::atomic<int64_t> done_after_{-1};
};

}  // namespace ft
