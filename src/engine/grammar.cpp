#include "engine/grammar.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"

namespace ft {

namespace {

constexpr size_t kMaxElems = Grammar::kMaxElems;
constexpr int kMaxRepeat = Grammar::kMaxRepeat;
constexpr int kMaxExpandDepth = Grammar::kMaxExpandDepth;
constexpr size_t kMaxStacks = 4096;      // stacks per matcher state
constexpr size_t kMaxCachedMasks = 512;  // per matcher
constexpr size_t kTopElems = 3;          // stack positions a cached walk of the vocabulary covers

using Elem = Grammar::Elem;
using Seq = std::vector<Elem>;

Elem bytes_elem() {
  Elem e;
  e.kind = Elem::Bytes;
  return e;
}
void set_byte(Elem& e, unsigned b) { e.set[b >> 6] |= uint64_t(1) << (b & 63); }
Elem rule_elem(int32_t r) {
  Elem e;
  e.kind = Elem::Rule;
  e.rule = r;
  return e;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view s) : s_(s) {}

  std::shared_ptr<const Grammar> run() {
    skip(true);
    while (p_ < s_.size()) {
      const std::string name = parse_name();
      skip(false);
      if (s_.substr(p_, 3) != "::=") error("expected '::='");
      p_ += 3;
      skip(true);
      const int32_t r = rule_id(name);
      if (defined_[size_t(r)]) error("rule '" + name + "' is defined twice");
      defined_[size_t(r)] = true;
      rules_[size_t(r)] = parse_alternates(false);
      skip(true);
    }
    auto g = std::make_shared<Grammar>();
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) fail("grammar: rule '", names_[r], "' is used but not defined");
    auto it = ids_.find("root");
    if (it == ids_.end()) fail("grammar: no 'root' rule");
    g->root = it->second;
    g->names = names_;
    g->alts.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Seq& alt : rules_[r]) {
        g->alts[r].push_back(int32_t(g->elems.size()));
        g->elems.insert(g->elems.end(), alt.begin(), alt.end());
        g->elems.push_back(Elem{});
        if (g->elems.size() > kMaxElems) fail("grammar: more than ", kMaxElems, " elements");
      }
    }
    return g;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    const int line = 1 + int(std::count(s_.begin(), s_.begin() + long(std::min(p_, s_.size())), '\n'));
    fail("grammar: line ", line, ": ", what);
  }
  // Whitespace and # comments; newlines only when newline_ok (a newline ends a rule at top level).
  void skip(bool newline_ok) {
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == '#') {
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
        ++p_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }
  std::string parse_name() {
    const size_t b = p_;
    while (p_ < s_.size() && name_char(s_[p_])) ++p_;
    if (p_ == b) error("expected a rule name");
    return std::string(s_.substr(b, p_ - b));
  }
  int32_t rule_id(const std::string& name) {
    auto [it, fresh] = ids_.emplace(name, int32_t(rules_.size()));
    if (fresh) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }
  int32_t new_rule(std::vector<Seq> alts) {
    const int32_t r = rule_id(cat("_gen", rules_.size()));
    rules_[size_t(r)] = std::move(alts);
    defined_[size_t(r)] = true;
    count(rules_[size_t(r)]);
    return r;
  }
  void count(const std::vector<Seq>& alts) {
    for (const Seq& a : alts) n_elems_ += a.size() + 1;
    if (n_elems_ > kMaxElems) fail("grammar: more than ", kMaxElems, " elements");
  }
  // One code point of a literal or class (escapes decoded).
  uint32_t parse_char() {
    if (p_ >= s_.size()) error("unexpected end of grammar");
    const unsigned char c = static_cast<unsigned char>(s_[p_]);
    if (c == '\\') {
      if (++p_ >= s_.size()) error("unexpected end of grammar");
      const char e = s_[p_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': return '\\';
        case '"': return '"';
        case '\'': return '\'';
        case '[': return '[';
        case ']': return ']';
        case '-': return '-';
        case '^': return '^';
        case '/': return '/';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: error(std::string("unknown escape \\") + e);
      }
    }
    // A UTF-8 sequence: its code point.
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || p_ + size_t(n) > s_.size()) error("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[p_ + size_t(k)]) & 0x3F);
    p_ += size_t(n);
    return cp;
  }
  uint32_t parse_hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) error("bad hex escape");
      const char c = s_[p_++];
      v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    }
    if (v > 0x10FFFF) error("code point out of range");
    return v;
  }

  std::vector<Seq> parse_alternates(bool nested) {
    if (++depth_ > 64) error("groups nest too deeply");
    std::vector<Seq> alts{parse_sequence(nested)};
    while (p_ < s_.size() && s_[p_] == '|') {
      ++p_;
      skip(true);
      alts.push_back(parse_sequence(nested));
    }
    --depth_;
    count(alts);
    return alts;
  }

  Seq parse_sequence(bool nested) {
    Seq seq;
    size_t last_start = 0;  // where the last element (what a postfix operator repeats) begins
    for (;;) {
      skip(nested);
      if (p_ >= s_.size()) break;
      const char c = s_[p_];
      if (c == '"') {
        ++p_;
        last_start = seq.size();
        std::string bytes;
        while (p_ < s_.size() && s_[p_] != '"') append_utf8(bytes, parse_char());
        if (p_ >= s_.size()) error("unterminated literal");
        ++p_;
        for (unsigned char b : bytes) {  // one element per byte (a repetition repeats them all)
          Elem e = bytes_elem();
          set_byte(e, b);
          seq.push_back(e);
        }
      } else if (c == '[') {
        ++p_;
        last_start = seq.size();
        const bool neg = p_ < s_.size() && s_[p_] == '^';
        if (neg) ++p_;
        Elem e = bytes_elem();
        while (p_ < s_.size() && s_[p_] != ']') {
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (p_ + 1 < s_.size() && s_[p_] == '-' && s_[p_ + 1] != ']') {
            ++p_;
            hi = parse_char();
          }
          if (hi < lo) error("empty character range");
          if (lo >= 0x80 || hi >= 0x80) {
            if (!neg) error("non-ASCII character classes are not supported (write the characters as literals)");
            continue;  // a negated class matches every non-ASCII byte anyway
          }
          for (uint32_t b = lo; b <= hi; ++b) set_byte(e, b);
        }
        if (p_ >= s_.size()) error("unterminated character class");
        ++p_;
        if (neg) {
          for (auto& w : e.set) w = ~w;
          for (unsigned b = 0x80; b < 0x100; ++b) set_byte(e, b);
        }
        seq.push_back(e);
      } else if (c == '.') {
        ++p_;
        last_start = seq.size();
        Elem e = bytes_elem();
        for (auto& w : e.set) w = ~uint64_t(0);
        seq.push_back(e);
      } else if (c == '(') {
        ++p_;
        skip(true);
        last_start = seq.size();
        auto alts = parse_alternates(true);
        skip(true);
        if (p_ >= s_.size() || s_[p_] != ')') error("expected ')'");
        ++p_;
        seq.push_back(rule_elem(new_rule(std::move(alts))));
      } else if (name_char(c)) {
        // A reference, unless it is the next rule's name (`name ::=`) at top level.
        const size_t save = p_;
        const std::string name = parse_name();
        skip(false);
        if (s_.substr(p_, 3) == "::=") {
          p_ = save;
          break;
        }
        p_ = save + name.size();
        last_start = seq.size();
        seq.push_back(rule_elem(rule_id(name)));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (seq.empty() || last_start >= seq.size()) error("a repetition needs something to repeat");
        ++p_;
        int lo = 0, hi = -1;  // hi -1: unbounded
        if (c == '+') lo = 1;
        else if (c == '?') hi = 1;
        else if (c == '{') {
          lo = parse_int();
          hi = lo;
          if (p_ < s_.size() && s_[p_] == ',') {
            ++p_;
            hi = p_ < s_.size() && s_[p_] == '}' ? -1 : parse_int();
          }
          if (p_ >= s_.size() || s_[p_] != '}') error("expected '}'");
          ++p_;
          if (hi >= 0 && hi < lo) error("bad repetition bounds");
        }
        Seq item(seq.begin() + long(last_start), seq.end());
        seq.resize(last_start);
        repeat(seq, item, lo, hi);
        last_start = seq.size();  // x** is not a thing
      } else {
        break;  // | ) or a newline: the sequence ends
      }
    }
    return seq;
  }
  int parse_int() {
    skip(false);
    int v = 0;
    const size_t b = p_;
    while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) {
      v = v * 10 + (s_[p_++] - '0');
      if (v > kMaxRepeat) error(cat("repetition count above ", kMaxRepeat));
    }
    if (p_ == b) error("expected a number");
    skip(false);
    return v;
  }
  // item{lo,hi} appended to seq: lo copies, then hi-lo nested optionals (or item* when unbounded).
  void repeat(Seq& seq, const Seq& item, int lo, int hi) {
    for (int k = 0; k < lo; ++k) {
      seq.insert(seq.end(), item.begin(), item.end());
      n_elems_ += item.size();
      if (n_elems_ > kMaxElems) fail("grammar: more than ", kMaxElems, " elements");
    }
    if (hi < 0) {  // star ::= item star |
      const int32_t star = rule_id(cat("_gen", rules_.size()));
      Seq again = item;
      again.push_back(rule_elem(star));
      rules_[size_t(star)] = {again, {}};
      defined_[size_t(star)] = true;
      count(rules_[size_t(star)]);
      seq.push_back(rule_elem(star));
      return;
    }
    int32_t tail = -1;  // opt_k ::= item opt_{k-1} |
    for (int k = 0; k < hi - lo; ++k) {
      Seq s = item;
      if (tail >= 0) s.push_back(rule_elem(tail));
      tail = new_rule({s, {}});
    }
    if (tail >= 0) seq.push_back(rule_elem(tail));
  }

  std::string_view s_;
  size_t p_ = 0;
  int depth_ = 0;
  size_t n_elems_ = 0;
  std::map<std::string, int32_t> ids_;
  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
};

using Stack = GrammarMatcher::Stack;

// Expands st until its top is a byte set (or it is empty: the grammar may end), appending the
// results to out[n...] (reusing the storage of stacks already there; n counts them). st is
// restored before returning (alternatives are tried by push and pop, not by copies).
void expand_into(const Grammar& g, Stack& st, std::vector<Stack>& out, size_t& n, int depth) {
  // (RequestError: these can first happen in a generation, the request's grammar its cause.)
  if (depth > kMaxExpandDepth)
    throw RequestError("grammar: rule references nest too deeply without consuming input (left recursion?)");
  if (st.empty() || g.elems[size_t(st.back())].kind == Elem::Bytes) {
    if (n < out.size()) out[n].assign(st.begin(), st.end());
    else out.push_back(st);
    if (++n > kMaxStacks) throw RequestError(cat("grammar: more than ", kMaxStacks, " parses are alive at once (too ambiguous)"));
    return;
  }
  const int32_t pos = st.back();
  const Elem& e = g.elems[size_t(pos)];
  st.pop_back();
  const bool more = g.elems[size_t(pos) + 1].kind != Elem::End;  // the rest of this alternative
  if (more) st.push_back(pos + 1);
  for (const int32_t a : g.alts[size_t(e.rule)]) {
    const bool nonempty = g.elems[size_t(a)].kind != Elem::End;
    if (nonempty) st.push_back(a);
    expand_into(g, st, out, n, depth + 1);
    if (nonempty) st.pop_back();
  }
  if (more) st.pop_back();
  st.push_back(pos);
}

void expand(const Grammar& g, Stack& st, std::vector<Stack>& out, int depth) {
  size_t n = out.size();
  expand_into(g, st, out, n, depth);
}

void normalize(std::vector<Stack>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

// Refuses left recursion (a rule that can reach a reference to itself without consuming a byte)
// and references that nest deeper than kMaxExpandDepth before a byte, from the rules' "starts
// with" graph: r -> s where an alternative of r reaches a reference to s through nullable rules
// only; linear in the grammar's size, where expanding every reference, as a matcher does, costs
// references x their expansions. The expansion's depth through a nullable rule's empty
// alternative can exceed the graph's path by that rule's own depth; a matcher still stops at
// kMaxExpandDepth with the same error.
void check_references(const Grammar& g) {
  const size_t n = g.alts.size();
  // Nullable rules (r can match the empty string), by a worklist: an alternative of references
  // only is nullable once each of them is (left: how many are not yet, per alternative).
  std::vector<char> nullable(n, 0);
  std::vector<int32_t> owner, left, ready;                  // per alternative of references only
  std::vector<std::vector<int32_t>> used_in(n);             // rule -> those alternatives, per use
  for (size_t r = 0; r < n; ++r)
    for (const int32_t a : g.alts[r]) {
      size_t i = size_t(a);
      while (g.elems[i].kind == Elem::Rule) ++i;
      if (g.elems[i].kind != Elem::End) continue;  // (a byte: never empty)
      const int32_t k = int32_t(owner.size());
      owner.push_back(int32_t(r));
      left.push_back(int32_t(i - size_t(a)));
      for (size_t j = size_t(a); j < i; ++j) used_in[size_t(g.elems[j].rule)].push_back(k);
      if (i == size_t(a) && !nullable[r]) ready.push_back(int32_t(r)), nullable[r] = 1;
    }
  while (!ready.empty()) {
    const size_t s = size_t(ready.back());
    ready.pop_back();
    for (const int32_t k : used_in[s])
      if (--left[size_t(k)] == 0 && !nullable[size_t(owner[size_t(k)])]) {
        nullable[size_t(owner[size_t(k)])] = 1;
        ready.push_back(owner[size_t(k)]);
      }
  }
  std::vector<std::vector<int32_t>> starts(n);  // r -> the rules its alternatives start with
  for (size_t r = 0; r < n; ++r)
    for (const int32_t a : g.alts[r])
      for (size_t i = size_t(a); g.elems[i].kind == Elem::Rule; ++i) {
        starts[r].push_back(g.elems[i].rule);
        if (!nullable[size_t(g.elems[i].rule)]) break;
      }
  // Depth-first, each rule's longest path once; the recursion stops at kMaxExpandDepth + 1 levels.
  enum : char { kNew, kOpen, kDone };
  std::vector<char> state(n, kNew);
  std::vector<int> height(n, 0);
  const auto visit = [&](auto& self, size_t r, int depth) -> int {
    if (state[r] == kOpen)
      fail("grammar: left recursion: rule '", g.names[r], "' reaches a reference to itself without consuming input");
    if (state[r] == kNew) {
      if (depth > kMaxExpandDepth) fail("grammar: rule references nest too deeply without consuming input");
      state[r] = kOpen;
      for (const int32_t s : starts[r]) height[r] = std::max(height[r], 1 + self(self, size_t(s), depth + 1));
      state[r] = kDone;
    }
    if (depth + height[r] > kMaxExpandDepth) fail("grammar: rule references nest too deeply without consuming input");
    return height[r];
  };
  for (size_t r = 0; r < n; ++r) visit(visit, r, 0);
}

// Refuses a reference whose expansion keeps more than kMaxStacks parses alive (what a matcher
// would refuse mid-generation), expanding one reference to each rule, as long as the stacks made
// stay within a budget (a grammar of many wide rules is left to the matcher beyond it).
void check_ambiguity(const Grammar& g) {
  constexpr size_t kBudget = size_t(1) << 22;  // stacks made, all rules together
  std::vector<char> seen(g.alts.size(), 0);
  size_t made = 0;
  std::vector<Stack> out;
  for (size_t i = 0; i < g.elems.size() && made < kBudget; ++i) {
    if (g.elems[i].kind != Elem::Rule || seen[size_t(g.elems[i].rule)]) continue;
    seen[size_t(g.elems[i].rule)] = 1;
    Stack st{int32_t(i)};
    out.clear();
    expand(g, st, out, 0);
    made += out.size();
  }
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf) {
  auto g = GbnfParser(gbnf).run();
  check_references(*g);
  check_ambiguity(*g);
  return g;
}

GrammarVocab::GrammarVocab(std::vector<std::string> pieces, std::vector<bool> eog)
    : pieces_(std::move(pieces)), eog_(std::move(eog)) {
  eog_.resize(pieces_.size(), false);
  for (int32_t t = 0; t < int32_t(pieces_.size()); ++t)
    if (!eog_[size_t(t)] && !pieces_[size_t(t)].empty()) order_.push_back(t);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });
  lcp_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const std::string& a = pieces_[size_t(order_[i - 1])];
    const std::string& b = pieces_[size_t(order_[i])];
    size_t n = 0;
    while (n < a.size() && n < b.size() && n < 0xFFFF && a[n] == b[n]) ++n;
    lcp_[i] = uint16_t(n);
  }
  const size_t n = order_.size();
  for (size_t d = 1; d <= kSkipDepths; ++d) {
    std::vector<int32_t>& skip = skip_[d - 1];
    skip.assign(n, int32_t(n));
    for (size_t i = n; i-- > 1;) skip[i - 1] = lcp_[i] < d ? int32_t(i) : skip[i];
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const GrammarVocab> vocab,
                               uint64_t mask_work_limit)
    : g_(std::move(g)), vocab_(std::move(vocab)), work_limit_(mask_work_limit), credit_(mask_work_limit) {
  for (const int32_t a : g_->alts[size_t(g_->root)]) {
    Stack st;
    if (g_->elems[size_t(a)].kind != Elem::End) st.push_back(a);
    expand(*g_, st, stacks_, 0);
  }
  normalize(stacks_);
}

std::vector<Stack> GrammarMatcher::advance(const std::vector<Stack>& from, uint8_t b) const {
  std::vector<Stack> out;
  Stack scratch;
  advance_into(from, b, out, scratch);
  return out;
}

// advance() into out, reusing its stacks' storage (the vocabulary walks call this per byte).
void GrammarMatcher::advance_into(const std::vector<Stack>& from, uint8_t b, std::vector<Stack>& out, Stack& scratch) const {
  size_t n = 0;
  for (const Stack& st : from) {
    if (st.empty()) continue;
    const int32_t pos = st.back();
    if (!g_->elems[size_t(pos)].has(b)) continue;
    scratch.assign(st.begin(), st.end() - 1);
    if (g_->elems[size_t(pos) + 1].kind != Elem::End) scratch.push_back(pos + 1);
    expand_into(*g_, scratch, out, n, 0);
  }
  work_ += from.size() + n;
  out.resize(n);
  if (n > 1) normalize(out);
}

bool GrammarMatcher::complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}
bool GrammarMatcher::done() const {
  return std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  std::vector<Stack> cur = stacks_;
  for (const char c : bytes) {
    cur = advance(cur, static_cast<uint8_t>(c));
    if (cur.empty()) return false;
  }
  stacks_ = std::move(cur);
  return true;
}

bool GrammarMatcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_->n_vocab()) return false;
  credit_ += std::min(std::max<uint64_t>(1, work_limit_ / kMaskRefillTokens), work_limit_ - credit_);
  if (vocab_->eog(token)) return complete();
  const std::string& p = vocab_->piece(token);
  return !p.empty() && accept_bytes(p);
}

// The tokens accepted from the one stack `top` (bits), over the byte-sorted vocabulary: a token
// shares the advanced states of its common prefix with the previous one, and a rejected prefix
// rejects every token that starts with it in O(1). When `dep` is given, a token `top` does not
// accept but whose walk emptied `top` before its last byte is recorded there with each such
// offset d (1 <= d < its length): whether the stack below `top` takes the rest of its bytes
// decides it (GrammarMatcher::mask_for_state).
void GrammarMatcher::walk(const Stack& top, std::vector<uint64_t>& bits, std::vector<Dep>* dep) const {
  const auto& order = vocab_->order_;
  const auto& lcp = vocab_->lcp_;
  // level[d]: the stacks after the first d bytes of the current token; emptied[d]: one of them
  // is empty (the walk left `top` there).
  std::vector<std::vector<Stack>> level(1, std::vector<Stack>{top});
  std::vector<uint8_t> emptied(1, 0);
  Stack scratch;
  const auto record = [&](int32_t t, size_t upto) {  // offsets 1..upto where `top` was left
    for (size_t d = 1; d <= upto; ++d)
      if (emptied[d]) dep->push_back(Dep{t, uint32_t(d)});
  };
  // Each token looked at counts, if only to be passed over with a rejected prefix (a state of
  // 4,000 tops, choices that part at their first character, took 2.4 s in these alone, uncounted);
  // a prefix rejected within its first kSkipDepths bytes is jumped over whole (GrammarVocab::skip_).
  size_t dead = std::numeric_limits<size_t>::max();  // a rejected prefix length shared so far
  for (size_t i = 0; i < order.size(); ++i) {
    ++work_;
    const int32_t t = order[i];
    const std::string& p = vocab_->piece(t);
    const size_t l = i == 0 ? 0 : lcp[i];
    if (dead <= l) {  // shares the rejected prefix
      if (dep) record(t, std::min(dead - 1, p.size() - 1));
      continue;
    }
    dead = std::numeric_limits<size_t>::max();
    if (level.size() < p.size() + 1) level.resize(p.size() + 1), emptied.resize(p.size() + 1, 0);
    bool ok = true;
    for (size_t d = l + 1; d <= p.size(); ++d) {
      advance_into(level[d - 1], static_cast<uint8_t>(p[d - 1]), level[d], scratch);
      emptied[d] = !level[d].empty() && level[d].front().empty();  // normalized: the empty stack sorts first
      if (level[d].empty()) {
        dead = d;
        ok = false;
        break;
      }
    }
    if (ok) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    else if (dep) record(t, std::min(dead - 1, p.size() - 1));
    // The tokens that share the rejected prefix are rejected too; jump past them when none has a
    // dependency to record (the walk left `top` nowhere before the prefix's end).
    if (!ok && dead <= GrammarVocab::kSkipDepths &&
        (!dep || std::none_of(emptied.begin() + 1, emptied.begin() + long(dead), [](uint8_t e) { return e != 0; })))
      i = size_t(vocab_->skip_[dead - 1][i]) - 1;
    if (work_ > credit_) check_work();
  }
}

void GrammarMatcher::check_work() const {
  if (work_ <= credit_) return;
  if (credit_ == work_limit_)
    throw RequestError(cat("grammar: finding the tokens allowed at this point takes more than ", work_limit_,
                           " parse steps (", stacks_.size(), " parses alive: too ambiguous a grammar)"));
  throw RequestError(cat("grammar: finding the tokens allowed takes more than ", work_limit_ / kMaskRefillTokens,
                         " parse steps a token on average (this point more than ", credit_, " of what is left, ",
                         stacks_.size(), " parses alive: too ambiguous a grammar)"));
}

// The mask of a state is the union of its stacks' masks (advance() treats each stack on its own).
// A stack [below..., top] (top: its last kTopElems positions) is split: the tokens `top` decides
// alone (accepted without leaving it, or rejected before leaving it) come from a walk of the
// vocabulary over `top`, cached by `top` (the same string, number or whitespace context recurs
// under many different stacks); the few that leave `top` mid-token (a closing quote followed by
// more bytes) are finished one by one on the stacks below. Same result as one walk over the whole
// state (the reference in tests/unit/test_grammar.cpp), at a fraction of the work.
std::string GrammarMatcher::state_key() const {
  std::string key;
  for (const Stack& s : stacks_) {
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
    key.append(4, '\xff');  // -1: the stack's end
  }
  return key;
}

GrammarMatcher GrammarMatcher::fork() const {
  GrammarMatcher m(*this);
  m.caches_ = std::make_shared<Caches>();
  if (auto it = caches_->masks.find(state_key()); it != caches_->masks.end()) m.caches_->masks.insert(*it);
  return m;
}

const std::vector<uint64_t>& GrammarMatcher::mask_for_state() {
  std::string key = state_key();
  work_ = 0;
  auto& cache = caches_->masks;
  auto& top_cache = caches_->tops;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedMasks) cache.clear();
  const int32_t V = vocab_->n_vocab();
  const size_t words = size_t(V + 63) / 64;
  std::vector<uint64_t> bits(words, 0);
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;  // complete: only the end-of-generation tokens (below)
    const size_t k = std::min(s.size(), kTopElems);
    const Stack top(s.end() - long(k), s.end());
    std::string tkey(reinterpret_cast<const char*>(top.data()), top.size() * sizeof(int32_t));
    auto it = top_cache.find(tkey);
    if (it == top_cache.end()) {
      TopMask tm;
      tm.bits.assign(words, 0);
      walk(top, tm.bits, &tm.dep);
      if (top_cache.size() >= kMaxCachedMasks) top_cache.clear();  // (one state may walk 4,096 tops)
      it = top_cache.emplace(std::move(tkey), std::move(tm)).first;
    }
    const TopMask& tm = it->second;
    for (size_t w = 0; w < words; ++w) bits[w] |= tm.bits[w];
    if (k == s.size() || tm.dep.empty()) continue;  // nothing below `top`: leaving it ends the parse
    // The stacks where a token that left `top` goes on: the positions below it, expanded.
    Stack below(s.begin(), s.end() - long(k));
    std::vector<Stack> base;
    expand(*g_, below, base, 0);
    normalize(base);
    for (const Dep& d : tm.dep) {
      if ((bits[size_t(d.token) >> 6] >> (d.token & 63)) & 1) continue;
      const std::string& p = vocab_->piece(d.token);
      std::vector<Stack> cur = advance(base, static_cast<uint8_t>(p[d.offset]));
      for (size_t j = d.offset + 1; j < p.size() && !cur.empty(); ++j) cur = advance(cur, static_cast<uint8_t>(p[j]));
      if (!cur.empty()) bits[size_t(d.token) >> 6] |= uint64_t(1) << (d.token & 63);
      check_work();
    }
  }
  if (complete())
    for (int32_t t = 0; t < V; ++t)
      if (vocab_->eog(t)) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
  credit_ -= std::min(credit_, work_);
  return cache.emplace(std::move(key), std::move(bits)).first->second;
}

void GrammarMatcher::mask(float* logits, int32_t n_vocab) {
  const std::vector<uint64_t>& bits = mask_for_state();
  const int32_t n = std::min(n_vocab, vocab_->n_vocab());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t w = 0; w * 64 < n; ++w) {
    const uint64_t word = bits[size_t(w)];
    if (word == ~uint64_t(0)) continue;
    const int32_t end = std::min(n, w * 64 + 64);
    if (word == 0) {  // most words of a narrow state
      std::fill(logits + w * 64, logits + end, kNegInf);
      continue;
    }
    for (int32_t t = w * 64; t < end; ++t)
      if (!((word >> (t & 63)) & 1)) logits[t] = kNegInf;
  }
  for (int32_t t = n; t < n_vocab; ++t) logits[t] = kNegInf;
}

void GrammarProcessor::apply(float* logits, int32_t n_vocab, int64_t) { m_.mask(logits, n_vocab); }

void GrammarProcessor::accept(int32_t token) {
  if (!m_.accept(token)) fail("the grammar rejected token ", token);
  ++accepted_;
  if (m_.done() && done_after_.load() < 0) done_after_.store(accepted_);
}

}  // namespace ft
