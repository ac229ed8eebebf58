#include "engine/json_schema.h"

#include <algorithm>
#include <bitset>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/grammar.h"

namespace ft {

namespace {

using json = nlohmann::ordered_json;  // a schema's keys in its text's order

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxCount = 10000;  // minLength, maxItems, minProperties, ... at most
// Optional properties in a row that an object may have (Grammar::kMaxExpandDepth less room for
// the schema's own nesting around the object).
constexpr size_t kMaxOptionalRun = size_t(Grammar::kMaxExpandDepth) - 56;

// A number's integer part, fraction and exponent have at most this many digits, as llama.cpp's (a
// model wrote "-3.1000000..." to its max_tokens, which a client's parse() then refused); the
// largest integer and number within them (a double's: 9999999999999999 is not one).
constexpr int kMaxDigits = 16;
constexpr int64_t kMaxInteger = 9999999999999999;
constexpr double kMaxNumber = 9999999999999998.0;

// The rules every schema grammar shares: whitespace (bounded, as llama.cpp's: nothing, " ", or "\n"
// and up to 20 spaces/tabs between two tokens, so output cannot loop on it), and the generic JSON
// values, numbers' digits bounded.
const std::string kBase = cat(R"(ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,)", kMaxDigits - 1, R"(})
json-number ::= json-integer ("." [0-9]{1,)", kMaxDigits, R"(})? ([eE] [-+]? ("0" | [1-9] [0-9]{0,)", kMaxDigits - 1, R"(}))?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)");


// Where a schema node is, for error messages: its parent's path, then seg and key ("/items",
// "/properties/" NAME); made into text only when an error names it (a copy of the text for each
// child was quadratic: a 2 MB key copied for each of its 150,000 properties, 16 s).
struct Path {
  const Path* up = nullptr;
  std::string_view seg;
  std::string key;
  std::string str() const { return (up ? up->str() : std::string()) + std::string(seg) + key; }
};

// ---- Numbers: exact ranges as digit grammars ----------------------------------------------------

// GBNF pieces over digits: a literal, a class, [0-9]{lo,hi} ("" when hi is 0), a sequence, and one
// of several sequences ("" the empty one; no alternatives at all is the caller's to rule out).
std::string lit(const std::string& digits) { return "\"" + digits + "\""; }
std::string digit_set(char lo, char hi) { return lo == hi ? lit(std::string(1, lo)) : cat("[", lo, "-", hi, "]"); }
std::string any_digits(size_t lo, size_t hi) {
  if (hi == 0) return "";
  return lo == hi ? (lo == 1 ? "[0-9]" : cat("[0-9]{", lo, "}")) : cat("[0-9]{", lo, ",", hi, "}");
}
std::string seq(const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + " " + b; }
std::string one_of(const std::vector<std::string>& alts) {
  std::string body;
  bool empty = false;
  size_t n = 0;
  for (const std::string& a : alts) {
    if (a.empty()) {
      empty = true;
    } else {
      body += (n++ ? " | " : "") + a;
    }
  }
  if (n == 0) return "";
  return n == 1 && !empty ? body : "(" + body + ")" + (empty ? "?" : "");
}
using Maybe = std::optional<std::string>;  // a GBNF sequence, or none: no string fits

// The digit strings of the numbers in [a, b], a and b of equal length (as digit strings), from
// position k on (equal before it): a's digit then at least a's rest, the digits between with any
// rest, b's digit then at most b's rest. O(length^2) text.
std::string same_length_range(const std::string& a, const std::string& b, size_t k) {
  if (k == a.size()) return "";
  const size_t rest = a.size() - k - 1;
  if (a[k] == b[k]) return seq(lit(std::string(1, a[k])), same_length_range(a, b, k + 1));
  const bool a_lowest = a.find_first_not_of('0', k + 1) == std::string::npos;
  const bool b_highest = b.find_first_not_of('9', k + 1) == std::string::npos;
  std::vector<std::string> alts;
  char lo = a[k], hi = b[k];
  if (!a_lowest) {
    alts.push_back(seq(lit(std::string(1, lo)), same_length_range(a, a.substr(0, k + 1) + std::string(rest, '9'), k + 1)));
    ++lo;
  }
  if (!b_highest) --hi;
  if (lo <= hi) alts.push_back(seq(digit_set(lo, hi), any_digits(rest, rest)));
  if (!b_highest) alts.push_back(seq(lit(std::string(1, b[k])), same_length_range(b.substr(0, k + 1) + std::string(rest, '0'), b, k + 1)));
  return one_of(alts);
}
// The decimal forms (no leading zeros) of the integers in [a, b].
std::string uint_range(uint64_t a, uint64_t b) {
  const std::string as = std::to_string(a), bs = std::to_string(b);
  std::vector<std::string> alts;
  for (size_t len = as.size(); len <= bs.size(); ++len)
    alts.push_back(same_length_range(len == as.size() ? as : "1" + std::string(len - 1, '0'), len == bs.size() ? bs : std::string(len, '9'), 0));
  return one_of(alts);
}

// A non-negative decimal: integer digits (no leading zeros) and fraction digits (no trailing zeros).
struct Dec {
  std::string i, f;
};
// v >= 0, below kMaxNumber: its shortest decimal form that reads back as v.
Dec dec_of(double v) {
  char buf[512];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::fixed);
  const std::string s(buf, ec == std::errc() ? end : buf);
  const size_t dot = s.find('.');
  Dec d{s.substr(0, dot), dot == std::string::npos ? "" : s.substr(dot + 1)};
  while (!d.f.empty() && d.f.back() == '0') d.f.pop_back();
  return d;
}
bool dec_le(const Dec& a, const Dec& b) {
  if (a.i.size() != b.i.size()) return a.i.size() < b.i.size();
  return a.i != b.i ? a.i < b.i : a.f <= b.f;  // (no trailing zeros: as text)
}

// Fraction digits from position k on (equal to the bound's before it), at most kMaxDigits in all:
// at least f, at most f (must: at least one digit here), between lo and hi.
Maybe frac_at_least(const std::string& f, size_t k) {
  if (k >= f.size()) return any_digits(0, size_t(kMaxDigits) - k);
  if (k >= size_t(kMaxDigits)) return std::nullopt;  // (f goes on past the digits we write)
  std::vector<std::string> alts;
  if (f[k] < '9') alts.push_back(seq(digit_set(char(f[k] + 1), '9'), any_digits(0, size_t(kMaxDigits) - k - 1)));
  if (const Maybe rest = frac_at_least(f, k + 1)) alts.push_back(seq(lit(std::string(1, f[k])), *rest));
  if (alts.empty()) return std::nullopt;
  return one_of(alts);
}
std::string frac_at_most(const std::string& f, size_t k, bool must) {
  if (k >= size_t(kMaxDigits)) return "";
  if (k >= f.size()) {  // zeros only
    const size_t room = size_t(kMaxDigits) - k;
    return must ? seq("\"0\"", room > 1 ? cat("\"0\"{0,", room - 1, "}") : "") : cat("\"0\"{0,", room, "}");
  }
  std::vector<std::string> alts;
  if (f[k] > '0') alts.push_back(seq(digit_set('0', char(f[k] - 1)), any_digits(0, size_t(kMaxDigits) - k - 1)));
  alts.push_back(seq(lit(std::string(1, f[k])), frac_at_most(f, k + 1, false)));
  if (!must) alts.push_back("");
  return one_of(alts);
}
Maybe frac_between(const std::string& lo, const std::string& hi, size_t k, bool must) {
  if (k >= lo.size()) return frac_at_most(hi, k, must);
  if (k >= size_t(kMaxDigits)) return std::nullopt;
  // lo goes on with a non-zero digit, so hi (>= lo, equal so far) has a digit here too.
  if (lo[k] == hi[k]) {
    const Maybe rest = frac_between(lo, hi, k + 1, false);
    return rest ? Maybe(seq(lit(std::string(1, lo[k])), *rest)) : std::nullopt;
  }
  std::vector<std::string> alts;
  if (const Maybe rest = frac_at_least(lo, k + 1)) alts.push_back(seq(lit(std::string(1, lo[k])), *rest));
  if (lo[k] + 1 <= hi[k] - 1) alts.push_back(seq(digit_set(char(lo[k] + 1), char(hi[k] - 1)), any_digits(0, size_t(kMaxDigits) - k - 1)));
  alts.push_back(seq(lit(std::string(1, hi[k])), frac_at_most(hi, k + 1, false)));
  return one_of(alts);
}
// The decimal forms (integer part, then an optional fraction; no exponent) of the numbers in
// [a, b], a <= b: a's integer part with a fraction of at least a's, the integers between with any,
// b's with at most b's.
Maybe decimal_range(const Dec& a, const Dec& b) {
  const std::string any_frac = cat("(\".\" [0-9]{1,", kMaxDigits, "})?");
  std::vector<std::string> alts;
  if (a.i == b.i) {
    if (const Maybe f = frac_between(a.f, b.f, 0, true))
      alts.push_back(seq(lit(a.i), a.f.empty() ? "(\".\" " + *f + ")?" : seq("\".\"", *f)));
    else if (a.f.empty())
      alts.push_back(lit(a.i));
  } else {
    if (a.f.empty()) alts.push_back(seq(lit(a.i), any_frac));
    else if (const Maybe f = frac_at_least(a.f, 0)) alts.push_back(seq(lit(a.i), seq("\".\"", *f)));
    const uint64_t ai = std::stoull(a.i), bi = std::stoull(b.i);
    if (ai + 1 < bi) alts.push_back(seq(uint_range(ai + 1, bi - 1), any_frac));
    alts.push_back(seq(lit(b.i), "(\".\" " + frac_at_most(b.f, 0, true) + ")?"));
  }
  if (alts.empty()) return std::nullopt;
  return one_of(alts);
}

// ---- Patterns: an ECMAScript regex subset, by its position automaton ----------------------------

// The characters one position of a pattern admits: ASCII ones, listed non-ASCII ones, and (an
// unanchored pattern's surroundings only) any byte of a non-ASCII character.
struct CharSet {
  std::bitset<128> ascii;
  std::vector<uint32_t> wide;  // sorted, distinct
  bool high_bytes = false;
};
constexpr size_t kMaxWideChars = 256;  // non-ASCII characters one class may list (each a literal)

struct ReNode {
  enum Kind : uint8_t { Chars, Cat, Alt, Repeat } kind = Chars;
  int set = -1;           // Chars: its CharSet
  std::vector<int> kids;  // Cat, Alt; Repeat: one
  int64_t lo = 0, hi = 0;  // Repeat: hi -1 unbounded
};
struct Regex {
  std::vector<ReNode> nodes;
  std::vector<CharSet> sets;
  int root = -1;
};
struct PatternError {
  std::string what;
};

class RegexParser {
 public:
  explicit RegexParser(std::string_view src) : s_(src) {}

  // Top-level alternatives, each anchored by ^ and $ or not (a search: any text around a match).
  Regex run() {
    std::vector<int> alts;
    do {
      const bool start = eat('^');
      std::vector<int> parts;
      if (!start) parts.push_back(anything());
      parts.push_back(sequence(0, true));
      const bool end = eat('$');
      if (!end) parts.push_back(anything());
      if (p_ < s_.size() && s_[p_] != '|') fail(end ? "'$' is supported at the pattern's end only" : "unbalanced ')'");
      alts.push_back(node(ReNode::Cat, std::move(parts)));
    } while (eat('|'));
    re_.root = alts.size() == 1 ? alts[0] : node(ReNode::Alt, std::move(alts));
    return std::move(re_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw PatternError{cat(what, " (at offset ", p_, ")")}; }
  bool eat(char c) {
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  int node(ReNode::Kind kind, std::vector<int> kids, int64_t lo = 0, int64_t hi = 0) {
    re_.nodes.push_back(ReNode{kind, -1, std::move(kids), lo, hi});
    return int(re_.nodes.size()) - 1;
  }
  int chars(CharSet cs) {
    if (cs.ascii.none() && cs.wide.empty() && !cs.high_bytes)
      fail("a class that admits no ASCII character ('.', \\D, \\S, \\W and negated classes admit ASCII characters only here)");
    re_.sets.push_back(std::move(cs));
    re_.nodes.push_back(ReNode{ReNode::Chars, int(re_.sets.size()) - 1, {}, 0, 0});
    return int(re_.nodes.size()) - 1;
  }
  int anything() {
    CharSet any;
    any.ascii.set();
    any.high_bytes = true;
    return node(ReNode::Repeat, {chars(std::move(any))}, 0, -1);
  }

  int alternation(int depth) {
    std::vector<int> alts{sequence(depth, false)};
    while (eat('|')) alts.push_back(sequence(depth, false));
    return alts.size() == 1 ? alts[0] : node(ReNode::Alt, std::move(alts));
  }
  int sequence(int depth, bool top) {
    std::vector<int> parts;
    while (p_ < s_.size() && s_[p_] != '|' && s_[p_] != ')') {
      if (s_[p_] == '$') {
        if (top) break;
        fail("'$' is supported at the pattern's end only");
      }
      if (s_[p_] == '^') fail("'^' is supported at the pattern's start only");
      int atom = this->atom(depth);
      int64_t lo = 0, hi = 0;
      if (quantifier(lo, hi)) {
        eat('?');  // (lazy: the same strings)
        int64_t l2 = 0, h2 = 0;
        if (quantifier(l2, h2)) fail("nothing to repeat");
        atom = node(ReNode::Repeat, {atom}, lo, hi);
      }
      parts.push_back(atom);
    }
    return parts.size() == 1 ? parts[0] : node(ReNode::Cat, std::move(parts));
  }
  // * + ? {m} {m,} {m,n} at p_ (consumed) into lo, hi; a '{' of another shape is a literal.
  bool quantifier(int64_t& lo, int64_t& hi) {
    if (p_ >= s_.size()) return false;
    const char c = s_[p_];
    if (c == '*' || c == '+' || c == '?') {
      ++p_;
      lo = c == '+' ? 1 : 0;
      hi = c == '?' ? 1 : -1;
      return true;
    }
    if (c != '{') return false;
    size_t q = p_ + 1;
    const auto number = [&](int64_t& v) {
      const size_t b = q;
      v = 0;
      while (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) v = std::min<int64_t>(v * 10 + (s_[q++] - '0'), Grammar::kMaxRepeat + 1);
      return q > b;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (q < s_.size() && s_[q] == ',') {
      ++q;
      if (!number(hi)) hi = -1;
    }
    if (q >= s_.size() || s_[q] != '}') return false;
    p_ = q + 1;
    if (lo > Grammar::kMaxRepeat || hi > Grammar::kMaxRepeat) fail(cat("a repetition count above ", Grammar::kMaxRepeat));
    if (hi >= 0 && hi < lo) fail("a repetition {m,n} with m > n");
    return true;
  }
  int atom(int depth) {
    const char c = s_[p_];
    if (c == '(') {
      if (depth >= kMaxDepth) fail("groups nest too deeply");
      ++p_;
      if (eat('?')) {
        if (eat(':')) {
        } else if ((s_.substr(p_, 1) == "<" && s_.substr(p_, 2) != "<=" && s_.substr(p_, 2) != "<!") || s_.substr(p_, 2) == "P<") {
          const size_t close = s_.find('>', p_);  // (a name: (?<n> and Python's (?P<n>)
          if (close == std::string_view::npos) fail("unterminated group name");
          p_ = close + 1;
        } else if (eat('=') || eat('!') || eat('<')) {
          fail("lookaround is not supported");
        } else {
          fail("'(?' is supported as (?:, (?<name> and (?P<name> only");
        }
      }
      const int inner = alternation(depth + 1);
      if (!eat(')')) fail("unbalanced '('");
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '{') {
      const size_t at = p_;
      int64_t lo = 0, hi = 0;
      if (quantifier(lo, hi)) {
        p_ = at;
        fail("nothing to repeat");
      }
    }
    CharSet cs;
    if (c == '.') {
      ++p_;
      cs.ascii.set();
      cs.ascii.reset('\n');
      cs.ascii.reset('\r');
      return chars(std::move(cs));
    }
    if (c == '\\') {
      ++p_;
      escape(cs, false);
      return chars(std::move(cs));
    }
    add(cs, utf8_char());
    return chars(std::move(cs));
  }
  // The code point at p_ (consumed).
  uint32_t utf8_char() {
    const unsigned char b = static_cast<unsigned char>(s_[p_]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || p_ + n > s_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[p_ + k]) & 0x3F);
    p_ += n;
    return cp;
  }
  void add(CharSet& cs, uint32_t lo, uint32_t hi) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 127); ++c) cs.ascii.set(c);
    if (hi < 128 || negated_) return;  // (a negated class admits ASCII characters only)
    lo = std::max<uint32_t>(lo, 128);
    if (hi - lo + 1 > kMaxWideChars || cs.wide.size() + (hi - lo + 1) > kMaxWideChars)
      fail(cat("a class of more than ", kMaxWideChars, " non-ASCII characters is not supported"));
    for (uint32_t c = lo; c <= hi; ++c) cs.wide.push_back(c);
  }
  void add(CharSet& cs, uint32_t c) { add(cs, c, c); }
  static void add_class(CharSet& cs, char kind) {  // \d \D \w \W \s \S (ASCII)
    std::bitset<128> b;
    const char k = char(std::tolower(kind));
    for (int c = 0; c < 128; ++c)
      b[size_t(c)] = k == 'd' ? std::isdigit(c) != 0 : k == 'w' ? (std::isalnum(c) != 0 || c == '_') : (c == ' ' || (c >= '\t' && c <= '\r'));
    cs.ascii |= kind == k ? b : ~b;
  }
  // After a '\': a class (\d ...) into cs, or one character (returned; -1 for a class).
  int64_t escape(CharSet& cs, bool in_class) {
    if (p_ >= s_.size()) fail("a '\\' at the end");
    const char e = s_[p_];
    const auto one = [&](uint32_t c) {
      add(cs, c);
      return int64_t(c);
    };
    if (e != '\0' && std::strchr("dDwWsS", e)) {
      ++p_;
      add_class(cs, e);
      return -1;
    }
    ++p_;
    switch (e) {
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0':
        if (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) fail("octal escapes are not supported");
        return one(0);
      case 'b':
        if (in_class) return one('\b');
        fail("'\\b' (a word boundary) is not supported");
      case 'c':
        if (p_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[p_]))) return one(uint32_t(s_[p_++]) % 32);
        fail("'\\c' needs a letter");
      case 'x': return one(hex(2));
      case 'u': {
        uint32_t c = hex(4);
        if (c >= 0xD800 && c < 0xDC00 && s_.substr(p_, 2) == "\\u") {  // a surrogate pair
          p_ += 2;
          const uint32_t low = hex(4);
          if (low < 0xDC00 || low > 0xDFFF) fail("an unpaired surrogate");
          c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
        } else if (c >= 0xD800 && c <= 0xDFFF) {
          fail("an unpaired surrogate");
        }
        return one(c);
      }
      default: break;
    }
    if (std::isdigit(static_cast<unsigned char>(e))) fail("backreferences are not supported");
    if (e == 'p' || e == 'P') fail("Unicode property escapes are not supported");
    if (std::isalpha(static_cast<unsigned char>(e))) fail(cat("the escape '\\", e, "' is not supported"));
    --p_;
    return one(utf8_char());  // an escaped character: itself
  }
  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) fail("a bad hex escape");
      const char c = char(std::tolower(s_[p_++]));
      v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : c - 'a' + 10);
    }
    return v;
  }
  int char_class() {
    ++p_;  // '['
    const bool neg = eat('^');
    negated_ = neg;
    CharSet cs;
    if (eat(']')) {  // ECMAScript's [] matches nothing, [^] anything
      if (!neg) fail("'[]' matches nothing");
      cs.ascii.set();
      return chars(std::move(cs));
    }
    // One member: a character (returned), or a class escape (-1).
    const auto member = [&]() -> int64_t {
      if (s_[p_] == '\\') {
        ++p_;
        return escape(cs, true);
      }
      const uint32_t c = utf8_char();
      add(cs, c);
      return c;
    };
    while (p_ < s_.size() && s_[p_] != ']') {
      const int64_t lo = member();
      if (lo < 0 || p_ + 1 >= s_.size() || s_[p_] != '-' || s_[p_ + 1] == ']') continue;
      ++p_;  // a range lo-hi (its hi a class escape: '-' itself, as ECMAScript's Annex B reads it)
      CharSet hi_cs;
      std::swap(cs, hi_cs);
      const int64_t hi = member();
      std::swap(cs, hi_cs);
      if (hi < 0) {
        add(cs, '-');
        cs.ascii |= hi_cs.ascii;
        continue;
      }
      if (hi < lo) fail("a range out of order in a class");
      add(cs, uint32_t(lo), uint32_t(hi));
    }
    if (!eat(']')) fail("unterminated '['");
    negated_ = false;
    std::sort(cs.wide.begin(), cs.wide.end());
    cs.wide.erase(std::unique(cs.wide.begin(), cs.wide.end()), cs.wide.end());
    if (neg) {  // (its complement among ASCII characters)
      cs.ascii.flip();
      cs.wide.clear();
    }
    return chars(std::move(cs));
  }

  std::string_view s_;
  size_t p_ = 0;
  bool negated_ = false;  // in a negated class
  Regex re_;
};

// Bounds of a pattern's expansion: positions (each copy of a repeated part its own; saturating
// at cap) and the lengths of the strings it matches (max -1: unbounded).
int64_t positions(const Regex& re, int n, int64_t cap) {
  const ReNode& x = re.nodes[size_t(n)];
  if (x.kind == ReNode::Chars) return 1;
  if (x.kind == ReNode::Repeat) {
    const int64_t copies = x.hi < 0 ? std::max<int64_t>(x.lo, 1) : x.hi;
    return copies == 0 ? 0 : std::min(cap, positions(re, x.kids[0], cap) * copies);  // (both <= cap + 1: no overflow)
  }
  int64_t sum = 0;
  for (int k : x.kids) sum = std::min(cap, sum + positions(re, k, cap));
  return sum;
}
std::pair<int64_t, int64_t> lengths(const Regex& re, int n) {
  constexpr int64_t kBig = int64_t(1) << 40;  // (beyond any length bound)
  const ReNode& x = re.nodes[size_t(n)];
  if (x.kind == ReNode::Chars) return {1, 1};
  if (x.kind == ReNode::Repeat) {
    const auto [lo, hi] = lengths(re, x.kids[0]);
    return {std::min(kBig, lo * x.lo), x.hi < 0 ? (hi == 0 ? 0 : -1) : hi < 0 ? -1 : std::min(kBig, hi * x.hi)};
  }
  int64_t lo = x.kind == ReNode::Alt ? kBig : 0, hi = 0;
  for (int k : x.kids) {
    const auto [a, b] = lengths(re, k);
    lo = x.kind == ReNode::Alt ? std::min(lo, a) : std::min(kBig, lo + a);
    hi = hi < 0 || b < 0 ? -1 : x.kind == ReNode::Alt ? std::max(hi, b) : std::min(kBig, hi + b);
  }
  return {lo, hi};
}

// The position automaton (Glushkov's) of a pattern: each position one character of a set, first
// the positions a match may start at, last those it may end at, follow[p] those after p. No empty
// moves: as a grammar, a rule per position that reads its character, then one of its followers'
// rules (right-linear: a parse's stack stays one deep; the parses alive are positions).
struct Positions {
  std::vector<int> set;  // position -> its CharSet
  std::vector<std::vector<int>> follow;
  std::vector<int> first;
  std::vector<char> last;
  bool nullable = false;
};
class PositionBuilder {
 public:
  // work: a budget of links made and positions copied (a PatternError past it).
  PositionBuilder(const Regex& re, size_t budget) : re_(re), budget_(budget) {}
  Positions run() {
    const Frag f = build(re_.root);
    out_.first = f.first;
    out_.nullable = f.nullable;
    out_.last.assign(out_.set.size(), 0);
    for (int p : f.last) out_.last[size_t(p)] = 1;
    for (auto& fl : out_.follow) {
      std::sort(fl.begin(), fl.end());
      fl.erase(std::unique(fl.begin(), fl.end()), fl.end());
    }
    return std::move(out_);
  }
  size_t work() const { return work_; }
  [[noreturn]] static void too_large(size_t budget) {
    throw PatternError{cat("it needs more than ", budget, " grammar elements (its repetitions each copied)")};
  }

 private:
  struct Frag {
    std::vector<int> first, last;
    bool nullable = true;
  };
  void spend(size_t n) {
    if ((work_ += n) > budget_) too_large(budget_);
  }
  void link(const std::vector<int>& from, const std::vector<int>& to) {
    spend(from.size() * to.size());
    for (int p : from) out_.follow[size_t(p)].insert(out_.follow[size_t(p)].end(), to.begin(), to.end());
  }
  static void append(std::vector<int>& to, const std::vector<int>& more) { to.insert(to.end(), more.begin(), more.end()); }
  Frag concat(Frag a, const Frag& b) {
    link(a.last, b.first);
    spend(b.first.size() + a.last.size());
    if (a.nullable) append(a.first, b.first);
    if (b.nullable) append(a.last, b.last);
    else a.last = b.last;
    a.nullable = a.nullable && b.nullable;
    return a;
  }
  Frag build(int n) {
    const ReNode& x = re_.nodes[size_t(n)];
    switch (x.kind) {
      case ReNode::Chars: {
        spend(1);
        const int p = int(out_.set.size());
        out_.set.push_back(x.set);
        out_.follow.emplace_back();
        return Frag{{p}, {p}, false};
      }
      case ReNode::Cat: {
        Frag f;
        for (int k : x.kids) f = concat(std::move(f), build(k));
        return f;
      }
      case ReNode::Alt: {
        Frag f{{}, {}, false};
        for (int k : x.kids) {
          const Frag g = build(k);
          spend(g.first.size() + g.last.size());
          append(f.first, g.first);
          append(f.last, g.last);
          f.nullable = f.nullable || g.nullable;
        }
        return f;
      }
      case ReNode::Repeat: break;
    }
    // x{lo,hi}: lo copies, then hi - lo optional ones, each after the one before (or, unbounded, one
    // more that may follow itself).
    Frag f;
    for (int64_t k = 0; k < x.lo; ++k) f = concat(std::move(f), build(x.kids[0]));
    if (x.hi < 0) {
      Frag loop = build(x.kids[0]);
      link(loop.last, loop.first);
      loop.nullable = true;
      return concat(std::move(f), loop);
    }
    std::vector<int> open = f.last;  // what the next optional copy may follow
    bool prefix_nullable = f.nullable;
    for (int64_t k = x.lo; k < x.hi; ++k) {
      Frag g = build(x.kids[0]);
      link(open, g.first);
      spend(g.first.size() + g.last.size());
      if (prefix_nullable) append(f.first, g.first);
      if (g.nullable) append(open, g.last);
      else open = g.last;
      append(f.last, g.last);
      prefix_nullable = prefix_nullable && g.nullable;
    }
    return f;
  }

  const Regex& re_;
  size_t budget_, work_ = 0;
  Positions out_;
};

// The JSON text of character c inside a string: itself, or its escape.
std::string json_char(uint32_t c) {
  if (c == '"') return "\\\"";
  if (c == '\\') return "\\\\";
  if (c >= 0x20 && c != 0x7F) {
    std::string s;
    if (c < 0x80) return std::string(1, char(c));
    if (c < 0x800) return s + char(0xC0 | (c >> 6)) + char(0x80 | (c & 0x3F));
    if (c < 0x10000) return s + char(0xE0 | (c >> 12)) + char(0x80 | ((c >> 6) & 0x3F)) + char(0x80 | (c & 0x3F));
    return s + char(0xF0 | (c >> 18)) + char(0x80 | ((c >> 12) & 0x3F)) + char(0x80 | ((c >> 6) & 0x3F)) + char(0x80 | (c & 0x3F));
  }
  switch (c) {
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  char b[8];
  std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
  return b;
}

// The formats we generate, as patterns, written so that the strict parsers clients run read them
// back (Zod's, Pydantic's, ajv-formats'): dates real ones (leap years too) of years 0001-9999
// (Pydantic refuses year 0); date-times in UTC ("Z": Zod's default datetime() refuses offsets);
// times without a zone (Zod's time() refuses one; RFC 3339's full-time would want one);
// UUIDs in any case.
std::string format_pattern(const std::string& format) {
  const std::string date =
      "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])-02-29|(?:0[48]|[2468][048]|[13579][26])00-02-29|"
      "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-"
      "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8])))";
  const std::string time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{3})?";
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "T" + time + "Z$";
  if (format == "uuid") return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  return "";
}

class Compiler {
 public:
  // prefix: of the names of the rules it adds (several compilers' rules in one grammar).
  explicit Compiler(const json& root, std::string prefix = "", std::string root_path = "#")
      : root_(root), prefix_(std::move(prefix)), root_path_(std::move(root_path)) {}

  std::string run() {
    const std::string r = top();
    return kBase + "root ::= " + r + "\n" + rules_;
  }
  // The root schema's rule (or expression); rules() the rules it needs (without kBase).
  std::string top() { return rule_for(root_, Path{nullptr, root_path_, ""}, 0); }
  const std::string& rules() const { return rules_; }

 private:
  [[noreturn]] static void bad(const Path& path, const std::string& what) {
    fail("json schema: ", path.str(), ": ", what);
  }

  std::string add_rule(const std::string& body) {
    if (auto it = by_body_.find(body); it != by_body_.end()) return it->second;
    const std::string name = prefix_ + "s" + std::to_string(n_++);
    rules_ += name + " ::= " + body + "\n";
    by_body_.emplace(body, name);
    return name;
  }

  // The rule (or inline expression) that matches a value of schema s, compiled once per schema
  // node: a node reached again (a "type" list compiles its node once per type, and nested lists
  // multiply that: 2^depth compilations of the innermost node without this) gives its rule again,
  // so the work is linear in the schema's size. Its reach (levels nested below it) keeps the depth
  // limit exact on reuse.
  std::string rule_for(const json& s, const Path& path, int depth) {
    if (depth > kMaxDepth) bad(path, "nests too deeply");
    if (auto it = done_.find(&s); it != done_.end()) {
      if (depth + it->second.reach > kMaxDepth) bad(path, "nests too deeply");
      deepest_ = std::max(deepest_, depth + it->second.reach);
      return it->second.rule;
    }
    const int outer = deepest_;
    deepest_ = depth;
    std::string r = compile(s, path, depth);
    const int reach = deepest_ - depth;
    deepest_ = std::max(outer, deepest_);
    done_.emplace(&s, Compiled{r, reach});
    return r;
  }

  std::string compile(const json& s, const Path& path, int depth) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad(path, "'false' accepts nothing");
      return "json-value";
    }
    if (!s.is_object()) bad(path, "a schema must be an object or a boolean");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) bad(path, "'$ref' must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      const json* target = resolve(ref, path);
      const std::string name = prefix_ + "ref" + std::to_string(n_++);
      refs_.emplace(ref, name);  // before compiling: recursive schemas refer to it
      rules_ += name + " ::= " + rule_for(*target, Path{nullptr, "", ref}, depth + 1) + "\n";
      return name;
    }
    std::string r = body_for(s, path, depth);
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) bad(path, "'nullable' must be a boolean");
      if (s["nullable"] == true) r = add_rule("(" + r + ") | json-null");
    }
    return r;
  }

  const json* resolve(const std::string& ref, const Path& path) {
    if (ref == "#") return &root_;
    for (size_t k = 0; k < 2; ++k) {
      const std::string p = std::string("#/") + kDefSections[k] + "/";
      if (ref.rfind(p, 0) != 0) continue;
      // The section's names indexed once (an ordered object's lookup scans its keys: 100,000
      // $refs into 100,000 $defs would be quadratic).
      if (!defs_indexed_[k]) {
        defs_indexed_[k] = true;
        if (const auto it = root_.find(kDefSections[k]); it != root_.end() && it->is_object())
          for (const auto& [name, def] : it->items()) defs_[k].emplace(name, &def);
      }
      if (const auto it = defs_[k].find(ref.substr(p.size())); it != defs_[k].end()) return it->second;
      bad(path, "'$ref' " + ref + " does not resolve");
    }
    bad(path, "'$ref' " + ref + " is not supported (only #, #/$defs/... and #/definitions/...)");
  }

  std::string alternatives(const json& list, const Path& path, const char* key, int depth) {
    if (!list.is_array() || list.empty()) bad(path, std::string("'") + key + "' must be a non-empty array");
    std::string out;
    for (size_t k = 0; k < list.size(); ++k) {
      if (k) out += " | ";
      out += rule_for(list[k], Path{&path, "/", std::string(key) + "/" + std::to_string(k)}, depth + 1);
    }
    return add_rule(out);
  }

  std::string body_for(const json& s, const Path& path, int depth) {
    if (s.contains("const")) return gbnf_literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) bad(path, "'enum' must be a non-empty array");
      std::vector<std::string> values;
      for (const json& v : e) values.push_back(v.dump());
      return choice_gbnf(std::move(values), [this](const std::string& body) { return add_rule(body); });
    }
    if (s.contains("anyOf")) return alternatives(s["anyOf"], path, "anyOf", depth);
    if (s.contains("oneOf")) return alternatives(s["oneOf"], path, "oneOf", depth);
    if (s.contains("allOf")) {
      const json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) bad(path, "'allOf' is supported with one schema only");
      return rule_for(a[0], Path{&path, "/allOf/0", ""}, depth + 1);
    }
    if (!s.contains("type")) {
      if (s.contains("properties")) return object_rule(s, path, depth);
      if (s.contains("items")) return array_rule(s, path, depth);
      return "json-value";  // {} and annotation-only schemas accept anything
    }
    const json& t = s["type"];
    if (t.is_array()) {
      if (t.empty()) bad(path, "'type' must not be empty");
      std::string out;
      for (size_t k = 0; k < t.size(); ++k) out += (k ? " | " : "") + typed_body(s, t[k], path, depth);
      return add_rule(out);
    }
    return typed_body(s, t, path, depth);
  }

  // Schema s's body as a value of type t (its "type" or one entry of its list).
  std::string typed_body(const json& s, const json& t, const Path& path, int depth) {
    if (!t.is_string()) bad(path, "'type' must be a string or an array of strings");
    const std::string type = t.get<std::string>();
    if (type == "string") return string_rule(s, path);
    if (type == "integer") return integer_rule(s, path);
    if (type == "number") return number_rule(s, path);
    if (type == "boolean") return "json-boolean";
    if (type == "null") return "json-null";
    if (type == "object") return object_rule(s, path, depth);
    if (type == "array") return array_rule(s, path, depth);
    bad(path, "unknown type '" + type + "'");
  }

  static int64_t bound(const json& s, const char* key, int64_t dflt, const Path& path) {
    if (!s.contains(key)) return dflt;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0 || s[key].get<int64_t>() > kMaxCount)
      bad(path, cat("'", key, "' must be an integer in [0, ", kMaxCount, "]"));
    return s[key].get<int64_t>();
  }

  // Grammar elements spent (patterns' positions and links, counting states), of the grammar's
  // Grammar::kMaxElems: past it, a 400 naming what and where, not a compile of that size.
  void spend(size_t n, const Path& path, const std::string& what) {
    if ((elems_ += n) > Grammar::kMaxElems)
      bad(path, cat(what, " needs more than ", Grammar::kMaxElems, " grammar elements (repetitions and counts each copied)"));
  }

  // minimum / maximum and their exclusive forms (a number, or draft 4's boolean on the other).
  static bool has_range(const json& s) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) return true;
    return false;
  }
  // f(bound, lower, exclusive) for each bound s sets; checks their types.
  template <class F>
  static void each_bound(const json& s, const Path& path, F&& f) {
    for (const bool lower : {true, false}) {
      const char* key = lower ? "minimum" : "maximum";
      const char* ex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
      bool draft4 = false;  // exclusiveMinimum: true makes minimum exclusive
      if (s.contains(ex)) {
        if (s[ex].is_boolean()) draft4 = s[ex].get<bool>();
        else if (s[ex].is_number()) f(s[ex], lower, true);
        else bad(path, cat("'", ex, "' must be a number"));
      }
      if (s.contains(key)) {
        if (!s[key].is_number()) bad(path, cat("'", key, "' must be a number"));
        f(s[key], lower, draft4);
      }
    }
  }

  // An integer in [minimum, maximum] (exact: a digit grammar, O(digits^2)).
  std::string integer_rule(const json& s, const Path& path) {
    if (!has_range(s)) return "json-integer";
    constexpr int64_t kOut = kMaxInteger + 1;  // (past every integer we write)
    int64_t lo = -kMaxInteger, hi = kMaxInteger;
    each_bound(s, path, [&](const json& v, bool lower, bool exclusive) {
      int64_t b = 0;
      if (v.is_number_integer()) {
        b = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kOut) ? kOut : std::clamp<int64_t>(v.get<int64_t>(), -kOut, kOut);
        if (exclusive) b += lower ? 1 : -1;
      } else {
        const double d = v.get<double>(), r = lower ? std::ceil(d) : std::floor(d);
        b = r >= double(kOut) ? kOut : r <= -double(kOut) ? -kOut : int64_t(r) + (exclusive && r == d ? (lower ? 1 : -1) : 0);
      }
      if (lower) lo = std::max(lo, b);
      else hi = std::min(hi, b);
    });
    if (lo > hi) bad(path, cat("no integer of at most ", kMaxDigits, " digits is within its 'minimum'/'maximum'"));
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back(seq("\"-\"", uint_range(uint64_t(hi < 0 ? -hi : 1), uint64_t(-lo))));
    if (hi >= 0) alts.push_back(uint_range(uint64_t(std::max<int64_t>(lo, 0)), uint64_t(hi)));
    return add_rule(alts.size() == 1 ? alts[0] : alts[0] + " | " + alts[1]);
  }

  // A number in [minimum, maximum], written without an exponent. Its bounds as a client checks
  // them (a double, Zod's and Pydantic's): a bound v is the double at or inside it (an integer
  // beyond 2^53 rounds), an exclusive one the next double inside; a decimal at or past that reads
  // back at or past it (rounding is monotonic), strictly past v where it is exclusive (past v
  // itself, 1000.9999999999999999 would read back as 1001).
  std::string number_rule(const json& s, const Path& path) {
    if (!has_range(s)) return "json-number";
    double lo = -kMaxNumber, hi = kMaxNumber;
    each_bound(s, path, [&](const json& v, bool lower, bool exclusive) {
      const double inward = lower ? INFINITY : -INFINITY;
      double d = v.get<double>();
      bool exact = true;
      if (v.is_number_integer() && std::fabs(d) < 9e18) {
        const int64_t b = v.get<int64_t>();
        if (lower ? int64_t(d) < b : int64_t(d) > b) d = std::nextafter(d, inward);
        exact = int64_t(d) == b;
      }
      if (exclusive && exact) d = std::nextafter(d, inward);
      if (lower) lo = std::max(lo, d);
      else hi = std::min(hi, d);
    });
    std::vector<std::string> alts;
    if (lo <= hi && hi >= 0)
      if (const Maybe r = decimal_range(dec_of(std::max(lo, 0.0)), dec_of(hi))) alts.push_back(*r);
    if (lo <= hi && lo < 0) {  // "-" and a magnitude above 0
      const Dec a = hi < 0 ? dec_of(hi) : Dec{"0", std::string(kMaxDigits - 1, '0') + "1"}, b = dec_of(lo);
      if (dec_le(a, b))
        if (const Maybe r = decimal_range(a, b)) alts.push_back(seq("\"-\"", *r));
    }
    if (alts.empty()) bad(path, cat("no number of at most ", kMaxDigits, " digits a part is within its 'minimum'/'maximum'"));
    return add_rule(alts.size() == 1 ? alts[0] : alts[0] + " | " + alts[1]);
  }

  std::string string_rule(const json& s, const Path& path) {
    const int64_t lo = bound(s, "minLength", 0, path), hi = bound(s, "maxLength", -1, path);
    if (hi >= 0 && hi < lo) bad(path, "'maxLength' is below 'minLength'");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) bad(path, "'pattern' must be a string");
      return pattern_rule(s["pattern"].get<std::string>(), lo, hi, path, "'pattern'");
    }
    if (s.contains("format") && s["format"].is_string())
      if (const std::string p = format_pattern(s["format"].get<std::string>()); !p.empty())
        return pattern_rule(p, lo, hi, path, "'format' " + s["format"].get<std::string>());
    if (lo == 0 && hi < 0) return "json-string";
    return add_rule("\"\\\"\" json-char{" + std::to_string(lo) + "," + (hi >= 0 ? std::to_string(hi) : "") + "} \"\\\"\"");
  }

  // A string the pattern matches (PatternError: a construct outside the subset, named), of lo..hi
  // characters (hi -1: any number): a rule per position of its automaton, or per (position,
  // characters so far) where the pattern does not imply the lengths.
  std::string pattern_rule(const std::string& pattern, int64_t lo, int64_t hi, const Path& path, const std::string& what) {
    Regex re;
    Positions pos;
    try {
      re = RegexParser(pattern).run();
      const size_t budget = Grammar::kMaxElems - std::min(elems_, Grammar::kMaxElems);
      if (size_t(positions(re, re.root, int64_t(budget) + 1)) > budget) PositionBuilder::too_large(budget);
      PositionBuilder builder(re, budget);
      pos = builder.run();
      elems_ += builder.work();
    } catch (const PatternError& e) {
      bad(path, what + ": " + e.what);
    }
    const auto [min_len, max_len] = lengths(re, re.root);
    const bool counting = min_len < lo || (hi >= 0 && (max_len < 0 || max_len > hi));
    if (!counting) lo = 0, hi = -1;
    // States: (position, characters so far: at most hi, or (no hi) counted up to lo; 0 when not
    // counting); -1: none (past hi).
    const auto after = [&](int64_t k) -> int64_t { return !counting ? 0 : hi >= 0 ? (k < hi ? k + 1 : -1) : std::min(k + 1, lo); };
    std::unordered_map<uint64_t, int> ids;
    std::vector<std::pair<int, int64_t>> states;
    std::vector<std::vector<int>> next;
    const auto state = [&](int p, int64_t k) {
      const auto [it, fresh] = ids.emplace(uint64_t(p) * uint64_t(kMaxCount + 1) + uint64_t(k), int(states.size()));
      if (fresh) {
        states.emplace_back(p, k);
        next.emplace_back();
      }
      return it->second;
    };
    std::vector<int> start;
    if (const int64_t k = after(0); k >= 0)
      for (const int q : pos.first) start.push_back(state(q, k));
    for (size_t i = 0; i < states.size(); ++i) {  // (states grows: those reachable)
      const auto [p, k] = states[i];
      const std::vector<int>& follow = pos.follow[size_t(p)];
      spend(follow.size() + 1, path, what);
      if (const int64_t k2 = after(k); k2 >= 0)
        for (const int q : follow) {
          const int j = state(q, k2);  // (before next[i]: it may grow next)
          next[i].push_back(j);
        }
    }
    // Live: an end reachable (a rule without one would let the output stop where it may not).
    const auto ends = [&](size_t i) { return pos.last[size_t(states[i].first)] && states[i].second >= lo; };
    std::vector<std::vector<int>> prev(states.size());
    std::vector<int> todo;
    std::vector<char> live(states.size(), 0);
    for (size_t i = 0; i < states.size(); ++i) {
      for (const int j : next[i]) prev[size_t(j)].push_back(int(i));
      if (ends(i)) live[i] = 1, todo.push_back(int(i));
    }
    while (!todo.empty()) {
      const int j = todo.back();
      todo.pop_back();
      for (const int i : prev[size_t(j)])
        if (!live[size_t(i)]) live[size_t(i)] = 1, todo.push_back(i);
    }
    // The rules: a state reads its position's character, then one of its live successors' rules
    // (optional where it may end).
    std::vector<std::string> names(states.size()), set_rules(re.sets.size());
    for (size_t i = 0; i < states.size(); ++i)
      if (live[i]) names[i] = prefix_ + "s" + std::to_string(n_++);
    const auto successors = [&](const std::vector<int>& to, bool may_end) {
      std::vector<std::string> alts;
      for (const int j : to)
        if (live[size_t(j)]) alts.push_back(names[size_t(j)]);
      if (alts.empty()) return std::string();
      const std::string out = rule_of(alts);
      return may_end ? out + "?" : out;
    };
    for (size_t i = 0; i < states.size(); ++i) {
      if (!live[i]) continue;
      const int set = pos.set[size_t(states[i].first)];
      if (set_rules[size_t(set)].empty()) set_rules[size_t(set)] = charset_rule(re.sets[size_t(set)], counting);
      rules_ += names[i] + " ::= " + seq(set_rules[size_t(set)], successors(next[i], ends(i))) + "\n";
      spend(next[i].size() + 3, path, what);
    }
    const std::string body = successors(start, pos.nullable && lo == 0);
    if (body.empty() && !(pos.nullable && lo == 0))
      bad(path, what + (counting ? " matches no string of the length 'minLength'/'maxLength' allow" : " matches no string"));
    return add_rule(seq(seq("\"\\\"\"", body), "\"\\\"\""));
  }

  // One character of cs as JSON string content: a class of the printable ASCII ones, the escapes
  // of the others, the listed non-ASCII ones as literals, any non-ASCII byte where cs admits them
  // and the length is not counted (a byte would count as a character).
  std::string charset_rule(const CharSet& cs, bool counting) {
    std::string cls;
    std::vector<std::string> alts;
    for (unsigned c = 0; c < 128; ++c) {
      if (!cs.ascii[c]) continue;
      if (c < 0x20 || c == '"' || c == '\\' || c == 0x7F) {
        alts.push_back(gbnf_literal(json_char(c)));
        continue;
      }
      unsigned e = c;
      while (e + 1 < 0x7F && cs.ascii[e + 1] && e + 1 != '"' && e + 1 != '\\') ++e;
      char b[16];
      std::snprintf(b, sizeof b, e == c ? "\\x%02X" : "\\x%02X-\\x%02X", c, e);
      cls += b;
      c = e;
    }
    if (!cls.empty()) alts.insert(alts.begin(), "[" + cls + "]");
    if (cs.high_bytes && !counting) alts.push_back("[^\\x00-\\x7F]");
    if (!cs.wide.empty()) {
      std::vector<std::string> wide;
      for (const uint32_t c : cs.wide) wide.push_back(json_char(c));
      alts.push_back(choice_gbnf(std::move(wide), [this](const std::string& body) { return add_rule(body); }));
    }
    if (alts.size() == 1) return alts[0];
    std::string body;
    for (const std::string& a : alts) body += (body.empty() ? "" : " | ") + a;
    return add_rule(body);
  }

  std::string array_rule(const json& s, const Path& path, int depth) {
    const int64_t lo = bound(s, "minItems", 0, path), hi = bound(s, "maxItems", -1, path);
    if (hi >= 0 && hi < lo) bad(path, "'maxItems' is below 'minItems'");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) bad(path, "'prefixItems' must be an array");
      for (size_t k = 0; k < p.size(); ++k) prefix.push_back(rule_for(p[k], Path{&path, "/prefixItems/", std::to_string(k)}, depth + 1));
    }
    const bool items_false = s.contains("items") && s["items"] == false;
    const std::string item = s.contains("items") && !items_false ? rule_for(s["items"], Path{&path, "/items", ""}, depth + 1) : "json-value";
    if (!prefix.empty()) {  // the fixed prefix, then items (none when items is false)
      std::string out = "\"[\" ws ";
      for (size_t k = 0; k < prefix.size(); ++k) out += (k ? "\",\" ws " : "") + prefix[k] + " ws ";
      if (!items_false) out += "( \",\" ws " + item + " ws )* ";
      return add_rule(out + "\"]\"");
    }
    return list_rule("[", "]", item + " ws", lo, hi);
  }

  // A rule of one of alts, or the one where it is a reference (or nothing) already.
  std::string rule_of(const std::vector<std::string>& alts) {
    if (alts.size() == 1 && alts[0].find(' ') == std::string::npos) return alts[0];
    std::string body = alts[0];
    for (size_t k = 1; k < alts.size(); ++k) body += " | " + alts[k];
    return add_rule(body);
  }

  // open, lo..hi items (hi -1: any number; each item with its trailing ws) between commas, close:
  // open ws ( item ( "," ws item ){lo-1, hi-1} )? close (the group required when lo > 0).
  std::string list_rule(const char* open, const char* close, const std::string& item, int64_t lo, int64_t hi) {
    const std::string o = gbnf_literal(open) + " ws ", c = gbnf_literal(close);
    if (hi == 0) return add_rule(o + c);
    const std::string body = item + " ( \",\" ws " + item + " ){" + std::to_string(lo > 0 ? lo - 1 : 0) + "," +
                             (hi >= 0 ? std::to_string(hi - 1) : "") + "}";
    return add_rule(o + (lo > 0 ? body : "( " + body + " )?") + " " + c);
  }

  std::string object_rule(const json& s, const Path& path, int depth) {
    const int64_t min_props = bound(s, "minProperties", 0, path), max_props = bound(s, "maxProperties", -1, path);
    if (max_props >= 0 && max_props < min_props) bad(path, "'maxProperties' is below 'minProperties'");
    if (!s.contains("properties") || !s["properties"].is_object() || s["properties"].empty()) {
      // No listed properties: any object, or one whose values follow additionalProperties; its
      // members counted as written (a key written twice counts twice).
      if (s.value("additionalProperties", json(true)) == false) {
        if (min_props > 0) bad(path, "'minProperties' is above 0 where no property is allowed");
        return add_rule("\"{\" ws \"}\"");
      }
      const bool typed = s.contains("additionalProperties") && s["additionalProperties"].is_object();
      if (!typed && min_props == 0 && max_props < 0) return "json-object";
      const std::string v = typed ? rule_for(s["additionalProperties"], Path{&path, "/additionalProperties", ""}, depth + 1) : "json-value";
      return list_rule("{", "}", "json-string ws \":\" ws " + v + " ws", min_props, max_props);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) bad(path, "'required' must be an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) bad(path, "'required' must list strings");
        required.insert(r.get<std::string>());
      }
    }
    std::vector<std::pair<std::string, bool>> kvs;  // (rule text of "key": value, required)
    for (const auto& [k, v] : s["properties"].items()) {
      const std::string val = rule_for(v, Path{&path, "/properties/", k}, depth + 1);
      kvs.emplace_back(gbnf_literal(json(k).dump()) + " ws \":\" ws " + val + " ws", required.count(k) > 0);
      required.erase(k);
    }
    if (!required.empty()) bad(path, "'required' names '" + *required.begin() + "', which is not in 'properties'");
    // Skipping optional properties expands a reference each, before a byte (below): a run of them
    // longer than the grammar's expansion depth, less room for the levels around the object,
    // would fail as "nesting too deeply" (left recursion?) mid-generation; say what it is here.
    size_t run = 0, longest = 0;
    for (const auto& kv : kvs) longest = std::max(longest, run = kv.second ? 0 : run + 1);
    if (longest > kMaxOptionalRun)
      bad(path, "more than " + std::to_string(kMaxOptionalRun) + " optional properties in a row (" + std::to_string(longest) +
                    ", in schema order): make some of them required");
    // minProperties / maxProperties: counted where the required ones and the listed ones do not
    // imply them (the properties present so far, up to maxProperties, or (none) to minProperties).
    const int64_t n = int64_t(kvs.size());
    std::vector<int64_t> required_from(size_t(n) + 1, 0);  // required ones among kvs[i...]
    for (int64_t i = n; i-- > 0;) required_from[size_t(i)] = required_from[size_t(i) + 1] + (kvs[size_t(i)].second ? 1 : 0);
    const bool counting = min_props > required_from[0] || (max_props >= 0 && max_props < n);
    const int64_t cap = !counting ? 0 : max_props >= 0 ? max_props : min_props;
    const auto after = [&](int64_t c) -> int64_t { return !counting ? 0 : max_props >= 0 ? (c < max_props ? c + 1 : -1) : std::min(c + 1, min_props); };
    const auto live = [&](int64_t i, int64_t c) {  // (c present before kvs[i]: some way on fits)
      return !counting || ((max_props < 0 || c + required_from[size_t(i)] <= max_props) && c + (n - i) >= min_props);
    };
    if (max_props >= 0 && required_from[0] > max_props) bad(path, "'maxProperties' is below the number of required properties");
    // The properties in order, optional ones skippable, commas only between those present:
    // first_i: nothing emitted yet from i on; rest_i(c): something was (c of them), so each next
    // one needs ","; none: no way on fits the counts.
    if (counting) spend(size_t(n) * size_t(cap + 2), path, "'minProperties'/'maxProperties'");
    std::vector<Maybe> rest(size_t(cap) + 1), next_rest(size_t(cap) + 1);
    for (int64_t c = 0; c <= cap; ++c) next_rest[size_t(c)] = live(n, c) ? Maybe("") : std::nullopt;
    Maybe first = live(n, 0) ? Maybe("") : std::nullopt;
    const auto then = [](const std::string& a, const Maybe& b) { return b->empty() ? a : a + " " + *b; };
    for (int64_t i = n; i-- > 0;) {
      // (counting: the pair its own rule, not copied into each count's)
      const std::string& kv = kvs[size_t(i)].first;
      const std::string item = counting ? add_rule(kv) : kv;
      const bool req = kvs[size_t(i)].second;
      for (int64_t c = 0; c <= cap; ++c) {
        // rest_i(c) ::= "," kv_i rest_i+1(c+1) (| rest_i+1(c) when optional: one reference a skip)
        rest[size_t(c)] = std::nullopt;
        if (!live(i, c)) continue;
        std::vector<std::string> alts;
        if (const int64_t c2 = after(c); c2 >= 0 && next_rest[size_t(c2)]) alts.push_back(then("\",\" ws " + item, next_rest[size_t(c2)]));
        if (!req && next_rest[size_t(c)]) alts.push_back(*next_rest[size_t(c)]);
        if (!alts.empty()) rest[size_t(c)] = rule_of(alts);
      }
      std::vector<std::string> alts;
      if (const int64_t c1 = after(0); c1 >= 0 && next_rest[size_t(c1)]) alts.push_back(then(item, next_rest[size_t(c1)]));
      if (!req && first) alts.push_back(*first);
      first = alts.empty() ? std::nullopt : Maybe(rule_of(alts));
      std::swap(rest, next_rest);
    }
    if (!first) bad(path, "no object of its properties has as many as 'minProperties'/'maxProperties' ask");
    return add_rule("\"{\" ws " + *first + " \"}\"");
  }

  struct Compiled {
    std::string rule;
    int reach;  // the deepest level compiling it reached, less its own
  };
  const json& root_;
  std::string prefix_, root_path_;
  std::map<const json*, Compiled> done_;
  int deepest_ = 0;
  std::string rules_;
  std::map<std::string, std::string> by_body_, refs_;
  static constexpr const char* kDefSections[2] = {"$defs", "definitions"};
  bool defs_indexed_[2] = {false, false};
  std::map<std::string, const json*> defs_[2];  // name -> schema, per section
  int n_ = 0;
  size_t elems_ = 0;  // spend()
};

}  // namespace

std::string gbnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

namespace {
// The bytes of the UTF-8 character that starts with b (1 for a stray byte).
size_t utf8_len(unsigned char b) { return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// The trie node of sorted, distinct c[lo, hi), which share their first d bytes: the edge to
// their longest common prefix, then (where they part) a rule of one alternative per next
// character, optional where one of them ends there. Edges end on character boundaries: the
// grammar reads a literal's bytes as UTF-8. (Choices that are not UTF-8 part by bytes where
// characters would not part them, and the grammar refuses them with a clear error.)
std::string trie_node(const std::vector<std::string>& c, size_t lo, size_t hi, size_t d, int level,
                      const std::function<std::string(const std::string&)>& add_rule) {
  if (level >= kMaxChoiceNesting)
    fail("choices: they part at more than ", kMaxChoiceNesting, " points along one choice (e.g. choices that are prefixes of one another)");
  const std::string &first = c[lo], &last = c[hi - 1];
  size_t raw = d;
  while (raw < first.size() && raw < last.size() && first[raw] == last[raw]) ++raw;
  const bool ends_here = first.size() == raw;  // (sorted: the one that ends is first)
  // The next character of each (after the ones that end), grouped: at l, by characters; at the
  // common prefix itself, by bytes, when characters do not part them.
  auto parts = [&](size_t l, bool by_char) {
    std::vector<std::pair<size_t, size_t>> g;
    for (size_t i = ends_here && l == raw ? lo + 1 : lo; i < hi;) {
      const size_t n = by_char ? utf8_len(static_cast<unsigned char>(c[i][l])) : 1;
      size_t j = i + 1;
      while (j < hi && c[j].compare(l, n, c[i], l, n) == 0) ++j;
      g.emplace_back(i, j);
      i = j;
    }
    return g;
  };
  size_t l = raw;
  while (l > d && l < first.size() && (static_cast<unsigned char>(first[l]) & 0xC0) == 0x80) --l;
  std::vector<std::pair<size_t, size_t>> groups = parts(l, true);
  if (groups.size() == 1 && l != raw) groups = parts(l = raw, false);  // (not UTF-8: progress by bytes)
  std::string out = l > d ? gbnf_literal(first.substr(d, l - d)) : std::string();
  if (groups.empty()) return out.empty() ? "\"\"" : out;
  std::string alts;
  for (const auto& [i, j] : groups) alts += (alts.empty() ? "" : " | ") + trie_node(c, i, j, l, level + 1, add_rule);
  return (out.empty() ? "" : out + " ") + add_rule(alts) + (ends_here && l == raw ? "?" : "");
}
}  // namespace

std::string choice_gbnf(std::vector<std::string> choices, const std::function<std::string(const std::string&)>& add_rule) {
  if (choices.empty()) fail("choices: none given");
  std::sort(choices.begin(), choices.end());
  choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
  return trie_node(choices, 0, choices.size(), 0, 0, add_rule);
}

std::string choice_grammar(std::vector<std::string> choices) {
  std::string rules;
  int n = 0;
  const std::string root = choice_gbnf(std::move(choices), [&](const std::string& body) {
    const std::string name = "choice" + std::to_string(n++);
    rules += name + " ::= " + body + "\n";
    return name;
  });
  return "root ::= " + root + "\n" + rules;
}

std::string json_schema_to_gbnf(const json& schema) { return Compiler(schema).run(); }

std::string tool_calls_gbnf(const std::vector<std::pair<std::string, json>>& tools, int64_t max_calls) {
  if (tools.empty()) fail("json schema: no tools to call");
  std::string rules, call;
  const std::string name_key = gbnf_literal("\"name\""), args_key = gbnf_literal("\"arguments\"");
  for (size_t i = 0; i < tools.size(); ++i) {
    // Each tool's parameters compiled on their own (their $refs are theirs), rules named t<i>s<n>.
    Compiler c(tools[i].second, "t" + std::to_string(i), "tools[" + std::to_string(i) + "].parameters#");
    const std::string args = c.top();
    rules += c.rules();
    const std::string rule = "t" + std::to_string(i) + "call";
    rules += rule + " ::= \"{\" ws " + name_key + " ws \":\" ws " + gbnf_literal(json(tools[i].first).dump()) +
             " ws \",\" ws " + args_key + " ws \":\" ws " + args + " ws \"}\"\n";
    call += (i ? " | " : "") + rule;
  }
  rules += "call ::= " + call + "\n";
  // "[" ws call ws ("," ws call ws){0, max-1} "]": at least one call (as minItems 1 made it).
  const std::string more = max_calls < 0 ? "{0,}" : "{0," + std::to_string(std::max<int64_t>(max_calls, 1) - 1) + "}";
  return kBase + "root ::= \"[\" ws call ws ( \",\" ws call ws )" + more + " \"]\"\n" + rules;
}

std::string json_object_gbnf() { return kBase + "root ::= json-object\n"; }

}  // namespace ft
