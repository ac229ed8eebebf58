#include "tokenizer/jinja.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ft::jinja {

// ============================================================================================
// Values: Python's, as templates see them. Lists and dicts are shared (reference semantics:
// list.append and namespace attributes are seen through every reference).
// ============================================================================================
struct Value;
using List = std::vector<Value>;

constexpr int kMaxDepth = 200;                 // expression / statement / macro nesting
constexpr int64_t kMaxIterations = 1'000'000;  // loop iterations per render, and a list's elements
constexpr size_t kMaxOutput = 64u << 20;       // bytes of the output, and of a string

// A render past one of these limits (or kRenderWork): LimitExceeded, which no caller retries.
template <class... Args>
[[noreturn]] void limit(const Args&... args) {
  throw LimitExceeded(cat(args...));
}

// The work one render may do (kRenderWork), in units: a byte of each string it builds or copies,
// an element of each list it builds, 32 for a value it visits to compare or print (about as
// long). Loops, nesting and the output have their own limits, but a loop may copy a 32 MB string
// a million times, and a list built by doubling (a = [a, a], 60 times) prints or compares in 2^60
// steps: such a template fails instead of running for hours.
inline thread_local int64_t t_work_left = -1;  // < 0: no render under way on this thread
inline thread_local int64_t t_work_limit = 0;  // the render's
inline void charge(uint64_t units) {
  if (t_work_left < 0) return;
  t_work_left -= int64_t(std::min<uint64_t>(units, uint64_t(t_work_limit) + 1));
  if (t_work_left < 0) limit("jinja: the template does more than ", t_work_limit, " units of work (bytes built or copied, values visited)");
}
struct Dict;
struct Func;
// The lists and dicts made during the render under way on this thread (null outside one): at its
// end Template::render empties those still alive, which are only ones in a cycle (a list that
// holds itself, a namespace set to itself: shared_ptrs that would never be freed).
inline thread_local std::vector<std::weak_ptr<List>>* t_lists = nullptr;
inline thread_local std::vector<std::weak_ptr<Dict>>* t_dicts = nullptr;

struct ValueFields {
  enum T { Undef, None, Bool, Int, Float, Str, Lst, Dct, Fn } t = Undef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;
  std::shared_ptr<Func> fn;
  bool tuple = false;  // a list that prints as (a, b)
  bool ns = false;     // a dict made by namespace(): its attributes may be set
  bool safe = false;   // a str marked |safe (jinja2's Markup: what is added to it is HTML-escaped)
  bool lazy = false;   // a list made by map/select/reject (a generator in jinja2: no len(), no JSON)
};

// The interpreter passes values by value: a copy of a string is work (charge) like building one.
struct Value : ValueFields {
  Value() = default;
  Value(const Value& o) : ValueFields(o) { charge(o.s.size()); }
  Value(Value&&) noexcept = default;
  Value& operator=(const Value& o) {
    charge(o.s.size());
    ValueFields::operator=(o);
    return *this;
  }
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;

  static Value none() { Value v; v.t = None; return v; }
  static Value boolean(bool x) { Value v; v.t = Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = Int; v.i = x; return v; }
  static Value flt(double x) { Value v; v.t = Float; v.f = x; return v; }
  static Value str(std::string x) {
    if (x.size() > kMaxOutput) limit("jinja: a string of more than ", kMaxOutput, " bytes");
    charge(x.size());
    Value v;
    v.t = Str;
    v.s = std::move(x);
    return v;
  }
  static Value list(List x = {}) {
    if (x.size() > size_t(kMaxIterations)) limit("jinja: a list of more than ", kMaxIterations, " elements");
    charge(x.size() + 1);
    Value v;
    v.t = Lst;
    v.l = std::make_shared<List>(std::move(x));
    if (t_lists) t_lists->push_back(v.l);
    return v;
  }
  static Value dict();
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  Value* find(std::string_view k) {
    for (auto& [key, v] : items)
      if (key == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    if (Value* p = find(k)) *p = std::move(v);
    else items.emplace_back(k, std::move(v));
  }
};

Value Value::dict() {
  charge(1);
  Value v;
  v.t = Dct;
  v.d = std::make_shared<Dict>();
  if (t_dicts) t_dicts->push_back(v.d);
  return v;
}

using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Func {
  std::string name;
  std::function<Value(List& args, Kwargs& kwargs)> call;
};

namespace {


const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::Undef: return "undefined";
    case Value::None: return "NoneType";
    case Value::Bool: return "bool";
    case Value::Int: return "int";
    case Value::Float: return "float";
    case Value::Str: return "str";
    case Value::Lst: return v.tuple ? "tuple" : "list";
    case Value::Dct: return v.ns ? "Namespace" : "dict";
    case Value::Fn: return "function";
  }
  return "?";
}

// (an object's members in its order: an ordered_json's as written, a json's sorted)
Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(std::numeric_limits<int64_t>::max()) ? Value::flt(double(u)) : Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::flt(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::dict();
      for (const auto& [k, x] : j.items()) v.d->items.emplace_back(k, from_json(x));
      return v;
    }
    default: return Value::none();
  }
}

bool truthy(const Value& v) {
  if (v.lazy) return true;  // a generator object
  switch (v.t) {
    case Value::Undef:
    case Value::None: return false;
    case Value::Bool: return v.b;
    case Value::Int: return v.i != 0;
    case Value::Float: return v.f != 0;
    case Value::Str: return !v.s.empty();
    case Value::Lst: return !v.l->empty();
    case Value::Dct: return !v.d->items.empty();
    case Value::Fn: return true;
  }
  return false;
}

bool is_num(const Value& v) { return v.t == Value::Int || v.t == Value::Float || v.t == Value::Bool; }
double num(const Value& v) { return v.t == Value::Float ? v.f : v.t == Value::Int ? double(v.i) : v.b ? 1.0 : 0.0; }
bool is_intlike(const Value& v) { return v.t == Value::Int || v.t == Value::Bool; }
int64_t as_int(const Value& v) { return v.t == Value::Int ? v.i : v.b ? 1 : 0; }

// Python's float repr: the shortest string that reads back to the same double.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf: [-]d.ddde[+-]XX
  std::string e(buf);
  const size_t epos = e.find('e');
  const int exp = std::atoi(e.c_str() + epos + 1);
  std::string mant = e.substr(0, epos);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -5 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_repr(const Value& v);

std::string py_str(const Value& v) {
  if (v.lazy) return "<generator object>";
  switch (v.t) {
    case Value::Undef: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: return float_repr(v.f);
    case Value::Str: return v.s;
    default: return py_repr(v);
  }
}

std::string str_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += char(c);
  }
  return out + char(q);
}

// A value's depth and size as it is walked (printed, compared): a list may hold itself.
void walk_step(int depth, const char* what) {
  if (depth > kMaxDepth) limit("jinja: ", what, ": the value nests more than ", kMaxDepth, " levels (does it hold itself?)");
  charge(32);
}
void check_built(const std::string& out, const char* what) {
  if (out.size() > kMaxOutput) limit("jinja: ", what, ": more than ", kMaxOutput, " bytes");
}

// Appends v's repr to out (one buffer for the whole value: a list of lists copied each level's
// text into its parent's).
void py_repr_into(const Value& v, std::string& out, int depth) {
  walk_step(depth, "repr");
  switch (v.t) {
    case Value::Str: out += str_repr(v.s); break;
    case Value::Lst: {
      out += v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += ", ";
        py_repr_into((*v.l)[k], out, depth + 1);
        check_built(out, "repr");
      }
      if (v.tuple && v.l->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      break;
    }
    case Value::Dct: {
      out += v.ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.d->items) {
        out += (first ? "" : ", ") + str_repr(k) + ": ";
        py_repr_into(x, out, depth + 1);
        check_built(out, "repr");
        first = false;
      }
      out += v.ns ? "}>" : "}";
      break;
    }
    case Value::Fn: out += "<function " + v.fn->name + ">"; break;
    default: out += py_str(v);
  }
}
std::string py_repr(const Value& v) {
  std::string out;
  py_repr_into(v, out, 0);
  return out;
}

// json.dumps(x, ensure_ascii=False, indent=indent) (Hugging Face's tojson).
void json_dump(const Value& v, int indent, int level, std::string& out, int depth) {
  walk_step(depth, "tojson");
  check_built(out, "tojson");
  if (v.lazy) fail("tojson: Object of type generator is not JSON serializable");
  const auto nl = [&](int lv) {
    out += '\n';
    out.append(size_t(indent) * size_t(lv), ' ');
  };
  switch (v.t) {
    case Value::Undef: fail("tojson: the value is undefined");
    case Value::None: out += "null"; return;
    case Value::Bool: out += v.b ? "true" : "false"; return;
    case Value::Int: out += std::to_string(v.i); return;
    case Value::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::Str: {
      out += '"';
      for (unsigned char c : v.s) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              char b[8];
              std::snprintf(b, sizeof b, "\\u%04x", c);
              out += b;
            } else {
              out += char(c);
            }
        }
      }
      out += '"';
      return;
    }
    case Value::Lst: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) nl(level + 1);
        json_dump((*v.l)[k], indent, level + 1, out, depth + 1);
      }
      if (indent >= 0) nl(level);
      out += ']';
      return;
    }
    case Value::Dct: {
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.d->items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) nl(level + 1);
        json_dump(Value::str(k), indent, level + 1, out, depth + 1);
        out += ": ";
        json_dump(x, indent, level + 1, out, depth + 1);
      }
      if (indent >= 0) nl(level);
      out += '}';
      return;
    }
    case Value::Fn: fail("tojson: a function is not JSON serializable");
  }
}

// UTF-8 code point boundaries of s (Python indexes strings by code point): offsets of each code
// point's first byte, plus s.size().
std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> cp;
  cp.reserve(s.size() + 1);
  for (size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) cp.push_back(k);
  cp.push_back(s.size());
  return cp;
}
int64_t str_len(const std::string& s) { return int64_t(code_points(s).size()) - 1; }

int64_t length(const Value& v) {
  if (v.lazy) fail("object of type 'generator' has no len()");
  switch (v.t) {
    case Value::Str: return str_len(v.s);
    case Value::Lst: return int64_t(v.l->size());
    case Value::Dct: return int64_t(v.d->items.size());
    case Value::Undef: return 0;
    default: fail("object of type '", type_name(v), "' has no len()");
  }
}

bool equal(const Value& a, const Value& b, int depth = 0) {
  walk_step(depth, "==");
  if (is_num(a) && is_num(b)) {
    if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
    return num(a) == num(b);
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::Undef:
    case Value::None: return true;
    case Value::Str: return a.s == b.s;
    case Value::Lst:
      if (a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); ++k)
        if (!equal((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    case Value::Dct: {
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& [k, x] : a.d->items) {
        const Value* y = b.d->find(k);
        if (!y || !equal(x, *y, depth + 1)) return false;
      }
      return true;
    }
    case Value::Fn: return a.fn == b.fn;
    default: return false;
  }
}

// a < b: -1, a == b: 0, a > b: 1 for orderable pairs; throws otherwise.
int compare(const Value& a, const Value& b, int depth = 0) {
  walk_step(depth, "<");
  if (is_num(a) && is_num(b)) {
    const double x = num(a), y = num(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.t == Value::Str && b.t == Value::Str) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.t == Value::Lst && b.t == Value::Lst) {
    for (size_t k = 0; k < std::min(a.l->size(), b.l->size()); ++k)
      if (int c = compare((*a.l)[k], (*b.l)[k], depth + 1)) return c;
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  fail("'<' is not supported between '", type_name(a), "' and '", type_name(b), "'");
}

bool contains(const Value& hay, const Value& needle) {
  switch (hay.t) {
    case Value::Str:
      if (needle.t != Value::Str) fail("'in <string>' requires a string as left operand, not ", type_name(needle));
      return hay.s.find(needle.s) != std::string::npos;
    case Value::Lst:
      for (const Value& x : *hay.l)
        if (equal(x, needle)) return true;
      return false;
    case Value::Dct: return needle.t == Value::Str && hay.d->find(needle.s) != nullptr;
    case Value::Undef: return false;
    default: fail("argument of type '", type_name(hay), "' is not iterable");
  }
}

// The items a for loop or a filter iterates: a list's elements, a dict's keys, a string's
// characters, nothing for undefined.
List iterate(const Value& v) {
  switch (v.t) {
    case Value::Lst: charge(v.l->size()); return *v.l;
    case Value::Dct: {
      List out;
      for (const auto& [k, x] : v.d->items) out.push_back(Value::str(k));
      return out;
    }
    case Value::Str: {
      List out;
      const auto cp = code_points(v.s);
      for (size_t k = 0; k + 1 < cp.size(); ++k) out.push_back(Value::str(v.s.substr(cp[k], cp[k + 1] - cp[k])));
      return out;
    }
    case Value::Undef: return {};
    default: fail("'", type_name(v), "' object is not iterable");
  }
}

// Python slicing of a length-n sequence: the indices it selects.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step) {
  const auto get = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->t == Value::None || v->t == Value::Undef) return std::nullopt;
    if (!is_intlike(*v)) fail("slice ", what, " must be an integer");
    return as_int(*v);
  };
  const int64_t st = get(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t k = *x;
    if (k < 0) k += n;
    if (st > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t b = clamp(get(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(get(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) out.push_back(k);
  return out;
}

// markupsafe.escape.
std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto in = [&](char c) {
    return chars && chars->t == Value::Str ? chars->s.find(c) != std::string::npos : is_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && in(s[b])) ++b;
  if (right)
    while (e > b && in(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Python's str.upper()/lower() for ASCII and the two-byte UTF-8 scripts with simple one-to-one
// case pairs (Latin-1, Latin Extended-A, Greek, Cyrillic); other characters are kept as they are.
char32_t case_map(char32_t c, bool up) {
  if (c < 0x80) return char32_t(up ? std::toupper(int(c)) : std::tolower(int(c)));
  if (up) {
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
      const bool odd_lower = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
      if (odd_lower) return (c & 1) ? c - 1 : c;
      return (c & 1) ? c : c - 1;  // 0x139-0x148, 0x179-0x17E: lower case is even
    }
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
    if (c >= 0x430 && c <= 0x44F) return c - 0x20;
    if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  } else {
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
      const bool odd_lower = (c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
      if (odd_lower) return (c & 1) ? c : c + 1;
      return (c & 1) ? c + 1 : c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
    if (c >= 0x410 && c <= 0x42F) return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  }
  return c;
}
std::string change_case(const std::string& s, bool up) {
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char b = static_cast<unsigned char>(s[k]);
    if (b < 0x80) {
      out += char(case_map(b, up));
    } else if ((b & 0xE0) == 0xC0 && k + 1 < s.size()) {
      const char32_t c = char32_t((b & 0x1F) << 6 | (static_cast<unsigned char>(s[k + 1]) & 0x3F));
      const char32_t m = case_map(c, up);
      out += char(0xC0 | (m >> 6));
      out += char(0x80 | (m & 0x3F));
      ++k;
    } else {
      out += char(b);
    }
  }
  return out;
}
std::string lower(const std::string& s) { return change_case(s, false); }
std::string upper(const std::string& s) { return change_case(s, true); }

std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count = -1) {
  if (a.empty()) {  // Python inserts b between every character
    std::string out = b;
    for (char c : s) {
      out += c;
      out += b;
      check_built(out, "replace");
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t k = s.find(a, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out += b;
    check_built(out, "replace");
    pos = k + a.size();
  }
  out.append(s, pos);
  return out;
}

// ============================================================================================
// Lexer: the template as text and tags; inside tags, expression tokens.
// ============================================================================================
struct Tok {
  enum K { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof } k;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // keep_trailing_newline=False: one trailing newline of the source is dropped.
    if (!src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
      if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    }
  }

  std::vector<Tok> run() {
    size_t pos = 0;
    bool lstrip_next = false, trim_newline = false;
    while (pos <= src_.size()) {
      size_t p = pos;
      for (;;) {
        p = src_.find('{', p);
        if (p == std::string_view::npos || p + 1 >= src_.size()) {
          p = std::string_view::npos;
          break;
        }
        const char c = src_[p + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++p;
      }
      std::string text(src_.substr(pos, p == std::string_view::npos ? std::string_view::npos : p - pos));
      if (lstrip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      } else if (trim_newline) {
        if (text.starts_with("\r\n")) text.erase(0, 2);
        else if (text.starts_with("\n")) text.erase(0, 1);
      }
      if (p == std::string_view::npos) {
        emit_text(text, pos);
        break;
      }
      const char kind = src_[p + 1];
      const char mod = p + 2 < src_.size() ? src_[p + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: whitespace from the start of the line to a block or comment tag.
        size_t ls = p;
        while (ls > 0 && (src_[ls - 1] == ' ' || src_[ls - 1] == '\t')) --ls;
        if (ls == 0 || src_[ls - 1] == '\n') {
          const size_t k = p - ls;
          text.erase(text.size() >= k ? text.size() - k : 0);
        }
      }
      emit_text(text, pos);
      size_t q = p + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      line_ = line_at(p);
      bool right_minus = false, right_plus = false;
      if (kind == '#') {
        const size_t e = src_.find("#}", q);
        if (e == std::string_view::npos) fail("jinja: line ", line_, ": unclosed comment");
        right_minus = e > q && src_[e - 1] == '-';
        right_plus = e > q && src_[e - 1] == '+';
        pos = e + 2;
      } else {
        const bool var = kind == '{';
        out_.push_back({var ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, line_});
        const size_t first_tok = out_.size();
        q = lex_tag(q, var ? '}' : '%', right_minus, right_plus);
        out_.push_back({var ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, line_});
        pos = q;
        if (!var && out_.size() > first_tok && out_[first_tok].k == Tok::Name && out_[first_tok].s == "raw") {
          out_.resize(first_tok - 1);
          pos = lex_raw(pos, right_minus, right_plus);
        }
      }
      lstrip_next = right_minus;
      trim_newline = kind != '{' && !right_plus;
    }
    out_.push_back({Tok::Eof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  // Tags are met in order, so lines are counted incrementally.
  int line_at(size_t p) {
    if (p < counted_pos_) counted_pos_ = 0, counted_line_ = 1;
    counted_line_ += int(std::count(src_.begin() + long(counted_pos_), src_.begin() + long(p), '\n'));
    counted_pos_ = p;
    return counted_line_;
  }
  size_t counted_pos_ = 0;
  int counted_line_ = 1;

  void emit_text(const std::string& text, size_t at) {
    if (!text.empty()) out_.push_back({Tok::Text, text, 0, 0, line_at(at)});
  }

  // {% raw %}...{% endraw %}: the text between, verbatim (whitespace control of both tags applied).
  size_t lex_raw(size_t pos, bool& right_minus, bool& right_plus) {
    for (size_t p = src_.find("{%", pos); p != std::string_view::npos; p = src_.find("{%", p + 2)) {
      size_t q = p + 2;
      const bool lminus = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.substr(q, 6) != "endraw") continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      right_minus = q < src_.size() && src_[q] == '-';
      right_plus = q < src_.size() && src_[q] == '+';
      if (right_minus || right_plus) ++q;
      if (src_.substr(q, 2) != "%}") fail("jinja: line ", line_at(p), ": malformed endraw");
      std::string text(src_.substr(pos, p - pos));
      if (lminus)
        while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_text(text, pos);
      return q + 2;
    }
    fail("jinja: line ", line_, ": {% raw %} without {% endraw %}");
  }

  // Expression tokens up to the tag's end ("}}" / "%}", optionally "-}}" / "+%}"); returns the
  // position after it.
  size_t lex_tag(size_t q, char close, bool& right_minus, bool& right_plus) {
    for (;;) {
      while (q < src_.size() && is_space(src_[q])) {
        if (src_[q] == '\n') ++line_;
        ++q;
      }
      if (q >= src_.size()) fail("jinja: line ", line_, ": unclosed tag");
      const auto at = [&](size_t k) { return k < src_.size() ? src_[k] : '\0'; };
      if ((at(q) == '-' || at(q) == '+') && at(q + 1) == close && at(q + 2) == '}') {
        right_minus = at(q) == '-';
        right_plus = at(q) == '+';
        return q + 3;
      }
      if (at(q) == close && at(q + 1) == '}') return q + 2;
      const char c = src_[q];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = q;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out_.push_back({Tok::Name, std::string(src_.substr(q, e - q)), 0, 0, line_});
        q = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = q;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (at(e) == '.' && std::isdigit(static_cast<unsigned char>(at(e + 1)))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if ((at(e) == 'e' || at(e) == 'E') &&
            (std::isdigit(static_cast<unsigned char>(at(e + 1))) ||
             ((at(e + 1) == '-' || at(e + 1) == '+') && std::isdigit(static_cast<unsigned char>(at(e + 2)))))) {
          is_float = true;
          e += 2;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        std::string t;
        for (size_t k = q; k < e; ++k)
          if (src_[k] != '_') t += src_[k];
        Tok tok{is_float ? Tok::Float : Tok::Int, t, 0, 0, line_};
        if (is_float) {
          tok.f = std::strtod(t.c_str(), nullptr);
        } else {
          errno = 0;
          tok.i = std::strtoll(t.c_str(), nullptr, 10);
          if (errno == ERANGE) fail("jinja: line ", line_, ": integer literal out of range");
        }
        out_.push_back(tok);
        q = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t e = q + 1;
        for (;; ++e) {
          if (e >= src_.size()) fail("jinja: line ", line_, ": unterminated string");
          if (src_[e] == c) break;
          if (src_[e] == '\\' && e + 1 < src_.size()) {
            const char x = src_[++e];
            switch (x) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '\n': ++line_; break;  // a line continuation
              default: s += '\\'; s += x;
            }
          } else {
            if (src_[e] == '\n') ++line_;
            s += src_[e];
          }
        }
        out_.push_back({Tok::String, s, 0, 0, line_});
        q = e + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::strlen(op);
          if (src_.substr(q, n) == op) {
            out_.push_back({Tok::Op, op, 0, 0, line_});
            q += n;
            found = true;
            break;
          }
        }
        if (!found) fail("jinja: line ", line_, ": unexpected character '", c, "'");
      }
    }
  }

  std::string_view src_;
  std::vector<Tok> out_;
  int line_ = 1;
};

}  // namespace

// ============================================================================================
// Syntax tree.
// ============================================================================================
struct Node {
  enum K {
    // expressions
    Lit, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Bin, Cmp, Cond, ListLit, TupleLit,
    DictLit,
    // statements
    Seq, Text, Out, If, For, Set, SetBlock, Macro, FilterBlock, Break, Continue
  } k;
  int line = 0;
  std::string s;                          // name, operator, text
  Value lit;                              // Lit
  std::vector<std::unique_ptr<Node>> a;   // children (nullptr: absent)
  std::vector<std::string> names;         // call/filter/test keyword names ("" = positional); targets; params
  bool neg = false;                       // Test: is not; Cmp: not in
};

namespace {

using NodeP = std::unique_ptr<Node>;

NodeP node(Node::K k, int line, std::string s = {}) {
  auto n = std::make_unique<Node>();
  n->k = k;
  n->line = line;
  n->s = std::move(s);
  return n;
}

class Parser {
 public:
  explicit Parser(std::vector<Tok> toks) : t_(std::move(toks)) {}

  NodeP parse_template() {
    std::string end;
    NodeP body = parse_body({}, end);
    return body;
  }

 private:
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Tok& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void error(const std::string& what) const { fail("jinja: line ", peek().line, ": ", what); }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).k == Tok::Op && peek(k).s == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).k == Tok::Name && peek(k).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cat("expected '", op, "'"));
    ++p_;
  }
  std::string expect_name() {
    if (peek().k != Tok::Name) error("expected a name");
    return next().s;
  }
  void expect_block_end() {
    if (peek().k != Tok::BlockEnd) error("expected the end of the tag");
    ++p_;
  }
  struct Depth {
    Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) p_.error("the template nests too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  // Statements until a block tag whose name is in `ends` (consumed up to its name; `end` = the name).
  NodeP parse_body(const std::vector<std::string>& ends, std::string& end) {
    Depth d(*this);
    auto seq = node(Node::Seq, peek().line);
    for (;;) {
      const Tok& t = peek();
      if (t.k == Tok::Eof) {
        if (!ends.empty()) error(cat("unexpected end of template; expected {% ", ends.back(), " %}"));
        end.clear();
        return seq;
      }
      if (t.k == Tok::Text) {
        seq->a.push_back(node(Node::Text, t.line, t.s));
        ++p_;
      } else if (t.k == Tok::VarBegin) {
        ++p_;
        auto out = node(Node::Out, t.line);
        out->a.push_back(parse_expr());
        if (peek().k != Tok::VarEnd) error("expected '}}'");
        ++p_;
        seq->a.push_back(std::move(out));
      } else if (t.k == Tok::BlockBegin) {
        ++p_;
        const std::string name = expect_name();
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          end = name;
          return seq;
        }
        seq->a.push_back(parse_statement(name, t.line));
      } else {
        error("unexpected token");
      }
    }
  }

  NodeP parse_statement(const std::string& name, int line) {
    std::string end;
    if (name == "if") {
      auto n = node(Node::If, line);
      n->a.push_back(parse_expr());
      expect_block_end();
      n->a.push_back(parse_body({"elif", "else", "endif"}, end));
      Node* cur = n.get();
      while (end == "elif") {
        auto e = node(Node::If, peek().line);
        e->a.push_back(parse_expr());
        expect_block_end();
        e->a.push_back(parse_body({"elif", "else", "endif"}, end));
        Node* next_cur = e.get();
        auto wrap = node(Node::Seq, e->line);
        wrap->a.push_back(std::move(e));
        cur->a.push_back(std::move(wrap));
        cur = next_cur;
      }
      if (end == "else") {
        expect_block_end();
        cur->a.push_back(parse_body({"endif"}, end));
      }
      expect_block_end();
      return n;
    }
    if (name == "for") {
      auto n = node(Node::For, line);
      n->names.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        n->names.push_back(expect_name());
      }
      if (!is_name("in")) error("expected 'in'");
      ++p_;
      n->a.push_back(parse_expr(/*no_cond=*/true));
      NodeP cond;
      if (is_name("if")) {
        ++p_;
        cond = parse_expr();
      }
      if (is_name("recursive")) error("recursive loops are not supported");
      n->a.push_back(std::move(cond));
      expect_block_end();
      ++loops_;
      n->a.push_back(parse_body({"else", "endfor"}, end));
      --loops_;
      if (end == "else") {
        expect_block_end();
        n->a.push_back(parse_body({"endfor"}, end));
      } else {
        n->a.push_back(nullptr);
      }
      expect_block_end();
      return n;
    }
    if (name == "set") {
      // set a = e | set a, b = e | set ns.attr = e | set a %}...{% endset
      std::vector<std::string> targets{expect_name()};
      std::string attr;
      if (is_op(".")) {
        ++p_;
        attr = expect_name();
      }
      while (is_op(",")) {
        ++p_;
        targets.push_back(expect_name());
      }
      if (peek().k == Tok::BlockEnd && attr.empty() && targets.size() == 1) {
        ++p_;
        auto n = node(Node::SetBlock, line);
        n->names = targets;
        n->a.push_back(parse_body({"endset"}, end));
        expect_block_end();
        return n;
      }
      expect_op("=");
      auto n = node(Node::Set, line, attr);
      n->names = targets;
      n->a.push_back(parse_expr());
      expect_block_end();
      return n;
    }
    if (name == "macro") {
      auto n = node(Node::Macro, line, expect_name());
      expect_op("(");
      n->a.push_back(nullptr);  // the body, below
      while (!is_op(")")) {
        n->names.push_back(expect_name());
        if (is_op("=")) {
          ++p_;
          n->a.push_back(parse_expr());
        } else {
          n->a.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      expect_block_end();
      n->a[0] = parse_body({"endmacro"}, end);
      if (peek().k == Tok::Name) ++p_;  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (name == "filter") {
      auto n = node(Node::FilterBlock, line);
      auto f = parse_filter(node(Node::Lit, line));  // the body's text replaces the literal
      while (is_op("|")) {
        ++p_;
        f = parse_filter(std::move(f));
      }
      n->a.push_back(std::move(f));
      expect_block_end();
      n->a.push_back(parse_body({"endfilter"}, end));
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      if (loops_ == 0) error(cat("'", name, "' outside a loop"));
      expect_block_end();
      return node(name == "break" ? Node::Break : Node::Continue, line);
    }
    error(cat("unsupported tag '", name, "'"));
  }

 public:
  // The loop depth for break/continue checks.
  int loops_ = 0;

 private:
  // --- expressions (jinja2's grammar and precedence) ---
  NodeP parse_expr(bool no_cond = false) {
    Depth d(*this);
    NodeP e = parse_or();
    while (!no_cond && is_name("if")) {
      const int line = peek().line;
      ++p_;
      auto n = node(Node::Cond, line);
      n->a.push_back(parse_or());  // condition
      n->a.push_back(std::move(e));
      if (is_name("else")) {
        ++p_;
        n->a.push_back(parse_expr());
      } else {
        n->a.push_back(nullptr);
      }
      e = std::move(n);
    }
    return e;
  }
  NodeP parse_or() {
    NodeP l = parse_and();
    while (is_name("or")) {
      auto n = node(Node::Or, next().line);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_and());
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_and() {
    NodeP l = parse_not();
    while (is_name("and")) {
      auto n = node(Node::And, next().line);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_not());
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      auto n = node(Node::Not, next().line);
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
    NodeP l = parse_math1();
    for (;;) {
      std::string op;
      bool neg = false;
      if (peek().k == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                  peek().s == "<=" || peek().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "in";
        neg = true;
      } else {
        return l;
      }
      auto n = node(Node::Cmp, peek().line, op);
      n->neg = neg;
      n->a.push_back(std::move(l));
      n->a.push_back(parse_math1());
      l = std::move(n);
    }
  }
  NodeP binary(NodeP l, const std::string& op, NodeP r) {
    auto n = node(Node::Bin, r ? r->line : 0, op);
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
  }
  NodeP parse_math1() {
    NodeP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().s;
      l = binary(std::move(l), op, parse_concat());
    }
    return l;
  }
  NodeP parse_concat() {
    NodeP l = parse_math2();
    while (is_op("~")) {
      ++p_;
      l = binary(std::move(l), "~", parse_math2());
    }
    return l;
  }
  NodeP parse_math2() {
    NodeP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().s;
      l = binary(std::move(l), op, parse_pow());
    }
    return l;
  }
  NodeP parse_pow() {
    NodeP l = parse_unary();
    while (is_op("**")) {
      ++p_;
      l = binary(std::move(l), "**", parse_unary());
    }
    return l;
  }
  NodeP parse_unary(bool with_filter = true) {
    Depth d(*this);
    NodeP n;
    if (is_op("-") || is_op("+")) {
      const bool minus = next().s == "-";
      n = node(minus ? Node::Neg : Node::Pos, peek().line);
      n->a.push_back(parse_unary(false));
    } else {
      n = parse_postfix(parse_primary());
    }
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }
  NodeP parse_primary() {
    const Tok& t = peek();
    switch (t.k) {
      case Tok::Name: {
        ++p_;
        if (t.s == "true" || t.s == "True") return lit(Value::boolean(true), t.line);
        if (t.s == "false" || t.s == "False") return lit(Value::boolean(false), t.line);
        if (t.s == "none" || t.s == "None") return lit(Value::none(), t.line);
        return node(Node::Name, t.line, t.s);
      }
      case Tok::String: {
        std::string s = next().s;
        while (peek().k == Tok::String) s += next().s;  // adjacent literals concatenate
        return lit(Value::str(std::move(s)), t.line);
      }
      case Tok::Int: ++p_; return lit(Value::integer(t.i), t.line);
      case Tok::Float: ++p_; return lit(Value::flt(t.f), t.line);
      case Tok::Op:
        if (t.s == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            return node(Node::TupleLit, t.line);
          }
          NodeP e = parse_expr();
          if (is_op(",")) {
            auto tup = node(Node::TupleLit, t.line);
            tup->a.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              tup->a.push_back(parse_expr());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          ++p_;
          auto l = node(Node::ListLit, t.line);
          while (!is_op("]")) {
            l->a.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return l;
        }
        if (t.s == "{") {
          ++p_;
          auto d = node(Node::DictLit, t.line);
          while (!is_op("}")) {
            d->a.push_back(parse_expr());
            expect_op(":");
            d->a.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return d;
        }
        break;
      default: break;
    }
    error("expected an expression");
  }
  NodeP lit(Value v, int line) {
    auto n = node(Node::Lit, line);
    n->lit = std::move(v);
    return n;
  }
  // (args): positional and name=value arguments into n->a[1..] and n->names.
  void parse_args(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().k == Tok::Name && is_op("=", 1)) {
        n.names.push_back(next().s);
        ++p_;
      } else {
        n.names.emplace_back();
      }
      n.a.push_back(parse_expr());
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }
  NodeP parse_postfix(NodeP e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto n = node(Node::Attr, peek().line);
        if (peek().k == Tok::Int) n->s = std::to_string(next().i);  // x.0 = x[0]
        else n->s = expect_name();
        n->a.push_back(std::move(e));
        e = std::move(n);
      } else if (is_op("[")) {
        ++p_;
        const int line = peek().line;
        NodeP parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++colons > 2) error("bad slice");
            ++p_;
          } else {
            if (parts[colons]) error("expected ']'");
            parts[colons] = parse_expr();
          }
        }
        ++p_;
        auto n = node(colons ? Node::Slice : Node::Item, line);
        n->a.push_back(std::move(e));
        if (colons) {
          for (auto& x : parts) n->a.push_back(std::move(x));
        } else {
          if (!parts[0]) error("empty subscript");
          n->a.push_back(std::move(parts[0]));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = node(Node::Call, peek().line);
        n->a.push_back(std::move(e));
        n->names.emplace_back();  // aligned with a: names[k] names a[k]
        parse_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  NodeP parse_filter(NodeP e) {
    auto n = node(Node::Filter, peek().line, expect_name());
    n->a.push_back(std::move(e));
    n->names.emplace_back();
    if (is_op("(")) parse_args(*n);
    return n;
  }
  NodeP parse_filter_expr(NodeP e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        ++p_;
        auto n = node(Node::Test, peek().line);
        if (is_name("not")) {
          ++p_;
          n->neg = true;
        }
        n->s = peek().k == Tok::Name ? next().s : "";
        if (n->s.empty()) {  // is none / is true ... are names; ==, != and the like are ops
          if (peek().k == Tok::Op) n->s = next().s;
          else error("expected a test name");
        }
        n->a.push_back(std::move(e));
        n->names.emplace_back();
        if (is_op("(")) {
          parse_args(*n);
        } else if ((peek().k == Tok::Name || peek().k == Tok::String || peek().k == Tok::Int ||
                    peek().k == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("and") && !is_name("or") && !is_name("if") && !is_name("not") &&
                   !is_name("in")) {
          n->names.emplace_back();
          n->a.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        e = parse_postfix(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

// ============================================================================================
// Interpreter.
// ============================================================================================
class Interp {
 public:
  using Frame = std::map<std::string, Value>;

  explicit Interp(std::string& out) : out_(out) { frames_.push_back(std::make_shared<Frame>()); }

  Frame& root() { return *frames_.front(); }

  void exec(const Node& n);

 private:
  enum class Flow { Normal, Break, Continue };
  struct Guard {
    Guard(Interp& in, int line) : in_(in) {
      if (++in_.depth_ > kMaxDepth) limit("jinja: line ", line, ": nesting too deep (limit ", kMaxDepth, ")");
    }
    ~Guard() { --in_.depth_; }
    Interp& in_;
  };

  Flow run(const Node& n);
  Value eval(const Node& n);
  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (auto f = (*it)->find(name); f != (*it)->end()) return f->second;
    return {};
  }
  void assign(const std::string& name, Value v) { (*frames_.back())[name] = std::move(v); }
  void write(const std::string& s) {
    if (out_.size() + s.size() > kMaxOutput) limit("jinja: the output exceeds ", kMaxOutput, " bytes");
    out_ += s;
  }
  Value call_value(const Value& f, List& args, Kwargs& kw, int line);
  Value call_method(const Value& obj, const std::string& name, List& args, Kwargs& kw, int line, bool& found);
  Value filter(const std::string& name, Value v, List& args, Kwargs& kw, int line);
  bool test(const std::string& name, const Value& v, List& args, int line);
  Value attr(const Value& obj, const std::string& name, int line);
  Value item(const Value& obj, const Value& key, int line);
  std::string capture(const Node& body);

  std::string& out_;
  std::vector<std::shared_ptr<Frame>> frames_;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

std::string Interp::capture(const Node& body) {
  std::string saved;
  saved.swap(out_);
  try {
    run(body);
  } catch (...) {
    out_.swap(saved);
    throw;
  }
  out_.swap(saved);
  return saved;
}

void Interp::exec(const Node& n) { run(n); }

Interp::Flow Interp::run(const Node& n) {
  Guard g(*this, n.line);
  switch (n.k) {
    case Node::Seq:
      for (const auto& c : n.a)
        if (Flow f = run(*c); f != Flow::Normal) return f;
      return Flow::Normal;
    case Node::Text: write(n.s); return Flow::Normal;
    case Node::Out: write(py_str(eval(*n.a[0]))); return Flow::Normal;
    case Node::If:
      if (truthy(eval(*n.a[0]))) return run(*n.a[1]);
      if (n.a.size() > 2) return run(*n.a[2]);
      return Flow::Normal;
    case Node::For: {
      const Value seq = eval(*n.a[0]);
      List items = iterate(seq);
      if (n.a[1]) {  // {% for x in xs if cond %}: filtered before loop.* is computed
        List kept;
        frames_.push_back(std::make_shared<Frame>());
        for (const Value& it : items) {
          if (n.names.size() == 1) assign(n.names[0], it);
          else for (size_t k = 0; k < n.names.size(); ++k) assign(n.names[k], it.t == Value::Lst && k < it.l->size() ? (*it.l)[k] : Value{});
          if (truthy(eval(*n.a[1]))) kept.push_back(it);
        }
        frames_.pop_back();
        items = std::move(kept);
      }
      if (items.empty()) {
        if (n.a[3]) return run(*n.a[3]);
        return Flow::Normal;
      }
      frames_.push_back(std::make_shared<Frame>());
      struct Pop {
        ~Pop() { f.pop_back(); }
        std::vector<std::shared_ptr<Frame>>& f;
      } pop{frames_};
      const int64_t len = int64_t(items.size());
      for (int64_t k = 0; k < len; ++k) {
        if (++iterations_ > kMaxIterations) limit("jinja: more than ", kMaxIterations, " loop iterations");
        const Value& it = items[size_t(k)];
        if (n.names.size() == 1) {
          assign(n.names[0], it);
        } else {
          if (it.t != Value::Lst || it.l->size() != n.names.size())
            fail("jinja: line ", n.line, ": cannot unpack ", type_name(it), " into ", n.names.size(), " names");
          for (size_t x = 0; x < n.names.size(); ++x) assign(n.names[x], (*it.l)[x]);
        }
        Value loop = Value::dict();
        loop.d->set("index", Value::integer(k + 1));
        loop.d->set("index0", Value::integer(k));
        loop.d->set("revindex", Value::integer(len - k));
        loop.d->set("revindex0", Value::integer(len - k - 1));
        loop.d->set("first", Value::boolean(k == 0));
        loop.d->set("last", Value::boolean(k == len - 1));
        loop.d->set("length", Value::integer(len));
        loop.d->set("depth", Value::integer(1));
        loop.d->set("depth0", Value::integer(0));
        loop.d->set("previtem", k > 0 ? items[size_t(k - 1)] : Value{});
        loop.d->set("nextitem", k + 1 < len ? items[size_t(k + 1)] : Value{});
        assign("loop", loop);
        if (run(*n.a[2]) == Flow::Break) break;
      }
      return Flow::Normal;
    }
    case Node::Set: {
      Value v = eval(*n.a[0]);
      if (!n.s.empty()) {  // ns.attr = v
        Value target = lookup(n.names[0]);
        if (target.t != Value::Dct || !target.ns)
          fail("jinja: line ", n.line, ": cannot set an attribute of ", type_name(target), " (only a namespace)");
        target.d->set(n.s, std::move(v));
      } else if (n.names.size() == 1) {
        assign(n.names[0], std::move(v));
      } else {
        List items = iterate(v);
        if (items.size() != n.names.size())
          fail("jinja: line ", n.line, ": cannot unpack ", items.size(), " values into ", n.names.size(), " names");
        for (size_t k = 0; k < items.size(); ++k) assign(n.names[k], items[k]);
      }
      return Flow::Normal;
    }
    case Node::SetBlock: assign(n.names[0], Value::str(capture(*n.a[0]))); return Flow::Normal;
    case Node::Macro: {
      const Node* def = &n;
      auto fn = std::make_shared<Func>();
      fn->name = n.s;
      // Weak: the macro is stored in the globals frame, so a strong reference would be a cycle
      // (a leak per render). The frame lives as long as the Interp, which outlives every call.
      std::weak_ptr<Frame> globals_ref = frames_.front();
      fn->call = [this, def, globals_ref](List& args, Kwargs& kw) -> Value {
        const std::shared_ptr<Frame> globals = globals_ref.lock();
        if (!globals) fail("jinja: line ", def->line, ": macro '", def->s, "' called after its template finished");
        if (args.size() > def->names.size())
          fail("jinja: line ", def->line, ": macro '", def->s, "' takes ", def->names.size(), " arguments, got ",
               args.size());
        auto frame = std::make_shared<Frame>();
        for (size_t k = 0; k < def->names.size(); ++k) {
          const std::string& p = def->names[k];
          if (k < args.size()) {
            (*frame)[p] = args[k];
            continue;
          }
          auto it = std::find_if(kw.begin(), kw.end(), [&](const auto& x) { return x.first == p; });
          if (it != kw.end()) (*frame)[p] = it->second;
          else if (def->a[k + 1]) (*frame)[p] = eval(*def->a[k + 1]);
          else (*frame)[p] = Value{};
        }
        for (const auto& [k, v] : kw)
          if (std::find(def->names.begin(), def->names.end(), k) == def->names.end())
            fail("jinja: line ", def->line, ": macro '", def->s, "' has no argument '", k, "'");
        auto saved = std::move(frames_);
        frames_ = {globals, frame};
        std::string text;
        try {
          text = capture(*def->a[0]);
        } catch (...) {
          frames_ = std::move(saved);
          throw;
        }
        frames_ = std::move(saved);
        return Value::str(std::move(text));
      };
      Value v;
      v.t = Value::Fn;
      v.fn = fn;
      assign(n.s, v);
      return Flow::Normal;
    }
    case Node::FilterBlock: {
      // The filter chain's innermost operand is a placeholder literal: evaluate the chain with
      // the body's text in its place.
      const std::string text = capture(*n.a[1]);
      std::vector<const Node*> chain;
      for (const Node* f = n.a[0].get(); f->k == Node::Filter; f = f->a[0].get()) chain.push_back(f);
      Value v = Value::str(text);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const Node& f = **it;
        List args;
        Kwargs kw;
        for (size_t k = 1; k < f.a.size(); ++k) {
          if (f.names[k].empty()) args.push_back(eval(*f.a[k]));
          else kw.emplace_back(f.names[k], eval(*f.a[k]));
        }
        v = filter(f.s, std::move(v), args, kw, f.line);
      }
      write(py_str(v));
      return Flow::Normal;
    }
    case Node::Break: return Flow::Break;
    case Node::Continue: return Flow::Continue;
    default: fail("jinja: line ", n.line, ": not a statement");
  }
}

Value Interp::attr(const Value& obj, const std::string& name, int line) {
  if (obj.t == Value::Undef) fail("jinja: line ", line, ": '", name, "' of an undefined value");
  if (obj.t == Value::Dct) {
    if (const Value* v = obj.d->find(name)) return *v;
    return {};
  }
  if (obj.t == Value::Lst && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
    return item(obj, Value::integer(std::stoll(name)), line);
  return {};
}

Value Interp::item(const Value& obj, const Value& key, int line) {
  if (obj.lazy) return {};  // a generator has no items
  switch (obj.t) {
    case Value::Undef: fail("jinja: line ", line, ": subscript of an undefined value");
    case Value::Dct:
      if (key.t == Value::Str)
        if (const Value* v = obj.d->find(key.s)) return *v;
      return {};
    case Value::Lst: {
      if (!is_intlike(key)) return {};
      int64_t k = as_int(key);
      const int64_t n = int64_t(obj.l->size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return {};
      return (*obj.l)[size_t(k)];
    }
    case Value::Str: {
      if (!is_intlike(key)) return {};
      const auto cp = code_points(obj.s);
      int64_t k = as_int(key);
      const int64_t n = int64_t(cp.size()) - 1;
      if (k < 0) k += n;
      if (k < 0 || k >= n) return {};
      return Value::str(obj.s.substr(cp[size_t(k)], cp[size_t(k) + 1] - cp[size_t(k)]));
    }
    default: return {};
  }
}

Value Interp::eval(const Node& n) {
  Guard g(*this, n.line);
  switch (n.k) {
    case Node::Lit: return n.lit;
    case Node::Name: return lookup(n.s);
    case Node::Attr: return attr(eval(*n.a[0]), n.s, n.line);
    case Node::Item: return item(eval(*n.a[0]), eval(*n.a[1]), n.line);
    case Node::Slice: {
      const Value obj = eval(*n.a[0]);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (n.a[size_t(k) + 1]) parts[k] = eval(*n.a[size_t(k) + 1]);
      const auto ptr = [&](int k) { return n.a[size_t(k) + 1] ? &parts[k] : nullptr; };
      if (obj.t == Value::Lst) {
        List out;
        for (int64_t k : slice_indices(int64_t(obj.l->size()), ptr(0), ptr(1), ptr(2))) out.push_back((*obj.l)[size_t(k)]);
        Value v = Value::list(std::move(out));
        v.tuple = obj.tuple;
        return v;
      }
      if (obj.t == Value::Str) {
        const auto cp = code_points(obj.s);
        std::string out;
        for (int64_t k : slice_indices(int64_t(cp.size()) - 1, ptr(0), ptr(1), ptr(2)))
          out.append(obj.s, cp[size_t(k)], cp[size_t(k) + 1] - cp[size_t(k)]);
        return Value::str(std::move(out));
      }
      if (obj.t == Value::Undef) fail("jinja: line ", n.line, ": slice of an undefined value");
      fail("jinja: line ", n.line, ": '", type_name(obj), "' object is not subscriptable");
    }
    case Node::Call: {
      List args;
      Kwargs kw;
      for (size_t k = 1; k < n.a.size(); ++k) {
        if (n.names[k].empty()) args.push_back(eval(*n.a[k]));
        else kw.emplace_back(n.names[k], eval(*n.a[k]));
      }
      const Node& callee = *n.a[0];
      if (callee.k == Node::Attr) {  // a method of a str, list or dict
        const Value obj = eval(*callee.a[0]);
        bool found = false;
        Value r = call_method(obj, callee.s, args, kw, n.line, found);
        if (found) return r;
        return call_value(attr(obj, callee.s, n.line), args, kw, n.line);
      }
      if (callee.k == Node::Name && callee.s == "caller") fail("jinja: line ", n.line, ": call blocks are not supported");
      return call_value(eval(callee), args, kw, n.line);
    }
    case Node::Filter: {
      Value v = eval(*n.a[0]);
      List args;
      Kwargs kw;
      for (size_t k = 1; k < n.a.size(); ++k) {
        if (n.names[k].empty()) args.push_back(eval(*n.a[k]));
        else kw.emplace_back(n.names[k], eval(*n.a[k]));
      }
      return filter(n.s, std::move(v), args, kw, n.line);
    }
    case Node::Test: {
      const Value v = eval(*n.a[0]);
      List args;
      for (size_t k = 1; k < n.a.size(); ++k) args.push_back(eval(*n.a[k]));
      return Value::boolean(test(n.s, v, args, n.line) != n.neg);
    }
    case Node::Neg: {
      const Value v = eval(*n.a[0]);
      if (is_intlike(v)) return Value::integer(-as_int(v));
      if (v.t == Value::Float) return Value::flt(-v.f);
      fail("jinja: line ", n.line, ": bad operand type for unary -: '", type_name(v), "'");
    }
    case Node::Pos: return eval(*n.a[0]);
    case Node::Not: return Value::boolean(!truthy(eval(*n.a[0])));
    case Node::And: {
      Value l = eval(*n.a[0]);
      return truthy(l) ? eval(*n.a[1]) : l;
    }
    case Node::Or: {
      Value l = eval(*n.a[0]);
      return truthy(l) ? l : eval(*n.a[1]);
    }
    case Node::Cond:
      if (truthy(eval(*n.a[0]))) return eval(*n.a[1]);
      return n.a[2] ? eval(*n.a[2]) : Value{};
    case Node::Cmp: {
      const Value l = eval(*n.a[0]), r = eval(*n.a[1]);
      if (n.s == "in") return Value::boolean(contains(r, l) != n.neg);
      if (n.s == "==") return Value::boolean(equal(l, r));
      if (n.s == "!=") return Value::boolean(!equal(l, r));
      const int c = compare(l, r);
      if (n.s == "<") return Value::boolean(c < 0);
      if (n.s == ">") return Value::boolean(c > 0);
      if (n.s == "<=") return Value::boolean(c <= 0);
      return Value::boolean(c >= 0);
    }
    case Node::Bin: {
      const Value l = eval(*n.a[0]), r = eval(*n.a[1]);
      const std::string& op = n.s;
      if (op == "~") return Value::str(py_str(l) + py_str(r));  // (each <= kMaxOutput: Value::str)
      if (op == "+") {
        if (l.t == Value::Str && r.t == Value::Str) {
          if (!l.safe && !r.safe) return Value::str(l.s + r.s);
          Value v = Value::str((l.safe ? l.s : html_escape(l.s)) + (r.safe ? r.s : html_escape(r.s)));
          v.safe = true;
          return v;
        }
        if (l.t == Value::Lst && r.t == Value::Lst) {
          List out = *l.l;
          out.insert(out.end(), r.l->begin(), r.l->end());
          return Value::list(std::move(out));
        }
      }
      if (op == "*" && ((l.t == Value::Str && is_intlike(r)) || (r.t == Value::Str && is_intlike(l)))) {
        const std::string& s = l.t == Value::Str ? l.s : r.s;
        const int64_t times = std::max<int64_t>(0, as_int(l.t == Value::Str ? r : l));
        if (s.empty()) return Value::str("");  // (not 2^63 appends of nothing)
        if (uint64_t(times) > kMaxOutput / s.size()) limit("jinja: line ", n.line, ": string too long");
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += s;
        return Value::str(std::move(out));
      }
      if (!is_num(l) || !is_num(r))
        fail("jinja: line ", n.line, ": unsupported operand types for ", op, ": '", type_name(l), "' and '",
             type_name(r), "'");
      const bool ints = is_intlike(l) && is_intlike(r);
      const int64_t a = as_int(l), b = as_int(r);
      const double x = num(l), y = num(r);
      if (op == "+" || op == "-" || op == "*") {
        if (ints) {
          int64_t out = 0;
          const bool ovf = op == "+" ? __builtin_add_overflow(a, b, &out)
                           : op == "-" ? __builtin_sub_overflow(a, b, &out)
                                       : __builtin_mul_overflow(a, b, &out);
          if (ovf) fail("jinja: line ", n.line, ": integer overflow");
          return Value::integer(out);
        }
        return Value::flt(op == "+" ? x + y : op == "-" ? x - y : x * y);
      }
      if (op == "/") {
        if (y == 0) fail("jinja: line ", n.line, ": division by zero");
        return Value::flt(x / y);
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail("jinja: line ", n.line, ": integer division or modulo by zero");
        if (ints) {
          if (a == std::numeric_limits<int64_t>::min() && b == -1) fail("jinja: line ", n.line, ": integer overflow");
          int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
            --q;
            m += b;
          }
          return Value::integer(op == "//" ? q : m);
        }
        const double q = std::floor(x / y);
        return Value::flt(op == "//" ? q : x - q * y);
      }
      if (op == "**") {
        if (ints && b >= 0) {  // by squaring: O(log b) multiplications
          int64_t out = 1, base = a;
          for (int64_t e = b; e > 0; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(out, base, &out)) fail("jinja: line ", n.line, ": integer overflow");
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("jinja: line ", n.line, ": integer overflow");
          }
          return Value::integer(out);
        }
        return Value::flt(std::pow(x, y));
      }
      fail("jinja: line ", n.line, ": unknown operator ", op);
    }
    case Node::ListLit:
    case Node::TupleLit: {
      List out;
      for (const auto& c : n.a) out.push_back(eval(*c));
      Value v = Value::list(std::move(out));
      v.tuple = n.k == Node::TupleLit;
      return v;
    }
    case Node::DictLit: {
      Value v = Value::dict();
      for (size_t k = 0; k + 1 < n.a.size(); k += 2) {
        const Value key = eval(*n.a[k]);
        if (key.t != Value::Str) fail("jinja: line ", n.line, ": only string dict keys are supported");
        v.d->set(key.s, eval(*n.a[k + 1]));
      }
      return v;
    }
    default: fail("jinja: line ", n.line, ": not an expression");
  }
}

Value Interp::call_value(const Value& f, List& args, Kwargs& kw, int line) {
  if (f.t != Value::Fn) fail("jinja: line ", line, ": '", type_name(f), "' object is not callable");
  if (depth_ > kMaxDepth) limit("jinja: line ", line, ": calls nest too deeply");
  return f.fn->call(args, kw);
}

// Arguments by position or name, as Python binds them.
const Value* arg(const List& args, const Kwargs& kw, size_t pos, const char* name) {
  if (pos < args.size()) return &args[pos];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

std::string str_arg(const List& args, const Kwargs& kw, size_t pos, const char* name, const std::string& dflt, int line) {
  const Value* v = arg(args, kw, pos, name);
  if (!v || v->t == Value::None) return dflt;
  if (v->t != Value::Str) fail("jinja: line ", line, ": argument '", name, "' must be a string");
  return v->s;
}

Value Interp::call_method(const Value& obj, const std::string& m, List& args, Kwargs& kw, int line, bool& found) {
  found = true;
  if (obj.t == Value::Str) {
    const std::string& s = obj.s;
    if (m == "strip" || m == "lstrip" || m == "rstrip")
      return Value::str(strip(s, arg(args, kw, 0, "chars"), m != "rstrip", m != "lstrip"));
    if (m == "lower") return Value::str(lower(s));
    if (m == "upper") return Value::str(upper(s));
    if (m == "startswith" || m == "endswith") {
      const Value* p = arg(args, kw, 0, "prefix");
      if (!p) fail("jinja: line ", line, ": ", m, "() takes an argument");
      List cands = p->t == Value::Lst ? *p->l : List{*p};
      for (const Value& c : cands) {
        if (c.t != Value::Str) fail("jinja: line ", line, ": ", m, "() takes strings");
        if (m == "startswith" ? s.starts_with(c.s) : s.ends_with(c.s)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "split" || m == "rsplit") {
      const Value* sep = arg(args, kw, 0, "sep");
      const Value* maxs = arg(args, kw, 1, "maxsplit");
      const int64_t max_split = maxs && is_intlike(*maxs) ? as_int(*maxs) : -1;
      List out;
      if (!sep || sep->t == Value::None) {
        if (m == "rsplit" && max_split >= 0) fail("jinja: line ", line, ": rsplit with maxsplit is not supported");
        size_t k = 0;
        int64_t n = 0;
        while (k < s.size()) {
          while (k < s.size() && is_space(s[k])) ++k;
          if (k >= s.size()) break;
          if (max_split >= 0 && n == max_split) {
            std::string rest = s.substr(k);
            while (!rest.empty() && is_space(rest.back())) rest.pop_back();
            out.push_back(Value::str(rest));
            break;
          }
          size_t e = k;
          while (e < s.size() && !is_space(s[e])) ++e;
          out.push_back(Value::str(s.substr(k, e - k)));
          ++n;
          k = e;
        }
        return Value::list(std::move(out));
      }
      if (sep->t != Value::Str || sep->s.empty()) fail("jinja: line ", line, ": empty or non-string separator");
      if (m == "rsplit" && max_split >= 0) {
        size_t end = s.size();
        int64_t n = 0;
        List rev;
        while (n < max_split) {
          const size_t k = end == 0 ? std::string::npos : s.rfind(sep->s, end - sep->s.size());
          if (k == std::string::npos || end < sep->s.size()) break;
          rev.push_back(Value::str(s.substr(k + sep->s.size(), end - k - sep->s.size())));
          end = k;
          ++n;
        }
        rev.push_back(Value::str(s.substr(0, end)));
        std::reverse(rev.begin(), rev.end());
        return Value::list(std::move(rev));
      }
      size_t pos = 0;
      int64_t n = 0;
      for (;;) {
        const size_t k = (max_split >= 0 && n >= max_split) ? std::string::npos : s.find(sep->s, pos);
        if (k == std::string::npos) {
          out.push_back(Value::str(s.substr(pos)));
          break;
        }
        out.push_back(Value::str(s.substr(pos, k - pos)));
        pos = k + sep->s.size();
        ++n;
      }
      return Value::list(std::move(out));
    }
    if (m == "replace") {
      const Value* c = arg(args, kw, 2, "count");
      return Value::str(replace_all(s, str_arg(args, kw, 0, "old", "", line), str_arg(args, kw, 1, "new", "", line),
                                    c && is_intlike(*c) ? as_int(*c) : -1));
    }
    if (m == "find") {
      const size_t k = s.find(str_arg(args, kw, 0, "sub", "", line));
      return Value::integer(k == std::string::npos ? -1 : str_len(s.substr(0, k)));
    }
    if (m == "count") {
      const std::string sub = str_arg(args, kw, 0, "sub", "", line);
      if (sub.empty()) return Value::integer(str_len(s) + 1);
      int64_t n = 0;
      for (size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
      return Value::integer(n);
    }
    if (m == "join") {
      const Value* xs = arg(args, kw, 0, "iterable");
      if (!xs) fail("jinja: line ", line, ": join() takes an argument");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(*xs)) {
        if (x.t != Value::Str) fail("jinja: line ", line, ": join() takes strings, got ", type_name(x));
        if (!first) out += s;
        out += x.s;
        check_built(out, "join");
        first = false;
      }
      return Value::str(std::move(out));
    }
    if (m == "title" || m == "capitalize") {
      std::string out = s;
      bool start = true;
      for (size_t k = 0; k < out.size(); ++k) {
        const unsigned char c = static_cast<unsigned char>(out[k]);
        const bool alpha = std::isalpha(c) != 0;
        out[k] = char(start && alpha ? std::toupper(c) : std::tolower(c));
        if (m == "title") start = !alpha;
        else if (alpha || k == 0) start = false;
      }
      return Value::str(out);
    }
  } else if (obj.t == Value::Dct && !obj.ns) {
    if (m == "get") {
      const Value* k = arg(args, kw, 0, "key");
      if (!k) fail("jinja: line ", line, ": get() takes a key");
      if (k->t == Value::Str)
        if (const Value* v = obj.d->find(k->s)) return *v;
      const Value* d = arg(args, kw, 1, "default");
      return d ? *d : Value::none();
    }
    if (m == "items" || m == "keys" || m == "values") {
      List out;
      for (const auto& [k, v] : obj.d->items) {
        if (m == "items") {
          Value t = Value::list({Value::str(k), v});
          t.tuple = true;
          out.push_back(std::move(t));
        } else {
          out.push_back(m == "keys" ? Value::str(k) : v);
        }
      }
      return Value::list(std::move(out));
    }
  } else if (obj.t == Value::Lst && !obj.tuple) {
    if (m == "append") {
      const Value* x = arg(args, kw, 0, "object");
      if (!x) fail("jinja: line ", line, ": append() takes an argument");
      if (obj.l->size() >= size_t(kMaxIterations)) limit("jinja: line ", line, ": list too long");
      obj.l->push_back(*x);
      return Value::none();
    }
    if (m == "pop") {
      if (obj.l->empty()) fail("jinja: line ", line, ": pop from an empty list");
      const Value* i = arg(args, kw, 0, "index");
      int64_t k = i && is_intlike(*i) ? as_int(*i) : -1;
      if (k < 0) k += int64_t(obj.l->size());
      if (k < 0 || k >= int64_t(obj.l->size())) fail("jinja: line ", line, ": pop index out of range");
      Value v = (*obj.l)[size_t(k)];
      obj.l->erase(obj.l->begin() + k);
      return v;
    }
  }
  found = false;
  return {};
}

bool Interp::test(const std::string& name, const Value& v, List& args, int line) {
  const auto arg0 = [&]() -> const Value& {
    if (args.empty()) fail("jinja: line ", line, ": test '", name, "' takes an argument");
    return args[0];
  };
  if (name == "defined") return v.t != Value::Undef;
  if (name == "undefined") return v.t == Value::Undef;
  if (name == "none") return v.t == Value::None;
  if (name == "boolean") return v.t == Value::Bool;
  if (name == "true") return v.t == Value::Bool && v.b;
  if (name == "false") return v.t == Value::Bool && !v.b;
  if (name == "integer") return v.t == Value::Int;
  if (name == "float") return v.t == Value::Float;
  if (name == "number") return is_num(v);
  if (name == "string") return v.t == Value::Str;
  if (name == "mapping") return v.t == Value::Dct;
  if (name == "iterable") return v.t == Value::Str || v.t == Value::Lst || v.t == Value::Dct;
  if (name == "sequence") return v.t == Value::Str || v.t == Value::Lst || v.t == Value::Dct;
  if (name == "callable") return v.t == Value::Fn;
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equal(v, arg0());
  if (name == "ne" || name == "!=") return !equal(v, arg0());
  if (name == "lt" || name == "<" || name == "lessthan") return compare(v, arg0()) < 0;
  if (name == "le" || name == "<=") return compare(v, arg0()) <= 0;
  if (name == "gt" || name == ">" || name == "greaterthan") return compare(v, arg0()) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg0()) >= 0;
  if (name == "in") return contains(arg0(), v);
  if (name == "odd" || name == "even") {
    if (!is_intlike(v)) fail("jinja: line ", line, ": test '", name, "' needs an integer");
    return (as_int(v) % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (!is_intlike(v) || !is_intlike(arg0()) || as_int(arg0()) == 0) fail("jinja: line ", line, ": bad divisibleby");
    return as_int(v) % as_int(arg0()) == 0;
  }
  if (name == "lower") return v.t == Value::Str && lower(v.s) == v.s;
  if (name == "upper") return v.t == Value::Str && upper(v.s) == v.s;
  fail("jinja: line ", line, ": unknown test '", name, "'");
}

Value Interp::filter(const std::string& name, Value v, List& args, Kwargs& kw, int line) {
  const auto need_str = [&](const Value& x) -> std::string {
    return x.t == Value::Str ? x.s : py_str(x);
  };
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name != "safe") fail("jinja: line ", line, ": filter '", name, "' is not supported (no autoescaping)");
    if (v.t != Value::Str) v = Value::str(py_str(v));
    v.safe = true;
    return v;
  }
  if (name == "trim" || name == "strip") return Value::str(strip(need_str(v), arg(args, kw, 0, "chars"), true, true));
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "lower") return Value::str(lower(need_str(v)));
  if (name == "upper") return Value::str(upper(need_str(v)));
  if (name == "string") return Value::str(py_str(v));
  if (name == "capitalize" || name == "title") {
    List none;
    Kwargs nokw;
    bool found = false;
    Value s = Value::str(need_str(v));
    return call_method(s, name, none, nokw, line, found);
  }
  if (name == "replace") {
    const Value* c = arg(args, kw, 2, "count");
    return Value::str(replace_all(need_str(v), str_arg(args, kw, 0, "old", "", line),
                                  str_arg(args, kw, 1, "new", "", line), c && is_intlike(*c) ? as_int(*c) : -1));
  }
  if (name == "tojson") {
    const Value* ind = arg(args, kw, 0, "indent");
    std::string out;
    json_dump(v, ind && is_intlike(*ind) ? int(std::clamp<int64_t>(as_int(*ind), 0, 64)) : -1, 0, out, 0);
    return Value::str(std::move(out));
  }
  if (name == "items") {
    if (v.t == Value::Undef) return Value::list();
    if (v.t != Value::Dct) fail("jinja: line ", line, ": items needs a mapping, got ", type_name(v));
    List none;
    Kwargs nokw;
    bool found = false;
    return call_method(v, "items", none, nokw, line, found);
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "first" || name == "last") {
    if (name == "last" && v.lazy) fail("jinja: line ", line, ": 'generator' object is not reversible");
    List xs = iterate(v);
    if (xs.empty()) return {};
    return name == "first" ? xs.front() : xs.back();
  }
  if (name == "reverse") {
    if (v.t == Value::Str) {
      List cs = iterate(v);
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += it->s;
      return Value::str(out);
    }
    List xs = iterate(v);
    std::reverse(xs.begin(), xs.end());
    return Value::list(std::move(xs));
  }
  if (name == "join") {
    const std::string sep = str_arg(args, kw, 0, "d", "", line);
    const Value* at = arg(args, kw, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) out += sep;
      out += py_str(at && at->t == Value::Str ? attr(x, at->s, line) : x);
      check_built(out, "join");
      first = false;
    }
    return Value::str(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* dflt = arg(args, kw, 0, "default_value");
    const Value* boolean = arg(args, kw, 1, "boolean");
    const bool use = v.t == Value::Undef || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dflt ? *dflt : Value::str("")) : v;
  }
  if (name == "indent") {
    const Value* w = arg(args, kw, 0, "width");
    const std::string ind = w && w->t == Value::Str ? w->s : std::string(size_t(w && is_intlike(*w) ? std::clamp<int64_t>(as_int(*w), 0, 256) : 4), ' ');
    const Value* first = arg(args, kw, 1, "first");
    const Value* blank = arg(args, kw, 2, "blank");
    std::string s = need_str(v) + "\n";
    std::vector<std::string> lines;  // str.splitlines() over \n, \r\n, \r
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\n' || s[k] == '\r') {
        lines.push_back(s.substr(b, k - b));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
    }
    if (b < s.size()) lines.push_back(s.substr(b));
    std::string rv;
    if (blank && truthy(*blank)) {
      for (size_t k = 0; k < lines.size(); ++k) {
        rv += (k ? "\n" + ind : "") + lines[k];
        check_built(rv, "indent");
      }
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t k = 1; k < lines.size(); ++k) {
        rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
        check_built(rv, "indent");
      }
    }
    if (first && truthy(*first)) rv = ind + rv;
    return Value::str(rv);
  }
  if (name == "unique") {
    List out;
    std::vector<Value> keys;
    for (const Value& x : iterate(v)) {
      const Value key = x.t == Value::Str ? Value::str(lower(x.s)) : x;
      if (std::none_of(keys.begin(), keys.end(), [&](const Value& k) { return equal(k, key); })) {
        keys.push_back(key);
        out.push_back(x);
      }
    }
    return Value::list(std::move(out));
  }
  if ((name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") &&
      !truthy(v)) {  // jinja2: `if value:` before iterating
    Value e = Value::list();
    e.lazy = true;
    return e;
  }
  if (name == "map") {
    List out;
    const Value* at = arg({}, kw, 0, "attribute");
    for (const Value& x : iterate(v)) {
      if (at) {
        Value r = at->t == Value::Str ? attr(x, at->s, line) : item(x, *at, line);
        if (r.t == Value::Undef)
          if (const Value* d = arg({}, kw, 0, "default")) r = *d;
        out.push_back(std::move(r));
      } else {
        if (args.empty() || args[0].t != Value::Str) fail("jinja: line ", line, ": map needs a filter name or attribute=");
        List rest(args.begin() + 1, args.end());
        Kwargs nokw;
        out.push_back(filter(args[0].s, x, rest, nokw, line));
      }
    }
    Value r = Value::list(std::move(out));
    r.lazy = true;
    return r;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name.ends_with("attr");
    const bool keep_if = name.starts_with("select");
    size_t k = 0;
    std::string at;
    if (by_attr) {
      if (args.empty() || args[0].t != Value::Str) fail("jinja: line ", line, ": ", name, " needs an attribute name");
      at = args[k++].s;
    }
    std::string tname;
    if (k < args.size()) {
      if (args[k].t != Value::Str) fail("jinja: line ", line, ": ", name, " needs a test name");
      tname = args[k++].s;
    }
    List targs(args.begin() + long(k), args.end());
    List out;
    for (const Value& x : iterate(v)) {
      const Value subj = by_attr ? attr(x, at, line) : x;
      const bool t = tname.empty() ? truthy(subj) : test(tname, subj, targs, line);
      if (t == keep_if) out.push_back(x);
    }
    Value r = Value::list(std::move(out));
    r.lazy = true;
    return r;
  }
  if (name == "int") {
    if (is_intlike(v)) return Value::integer(as_int(v));
    if (v.t == Value::Float && std::isfinite(v.f) && std::fabs(v.f) < 9e18) return Value::integer(int64_t(v.f));
    if (v.t == Value::Str) {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(v.s.c_str(), &end, 10);
      if (errno == 0 && end && *end == 0 && !v.s.empty()) return Value::integer(x);
    }
    const Value* d = arg(args, kw, 0, "default");
    return d ? *d : Value::integer(0);
  }
  if (name == "float") {
    if (is_num(v)) return Value::flt(num(v));
    if (v.t == Value::Str) {
      char* end = nullptr;
      const double x = std::strtod(v.s.c_str(), &end);
      if (end && *end == 0 && !v.s.empty()) return Value::flt(x);
    }
    const Value* d = arg(args, kw, 0, "default");
    return d ? *d : Value::flt(0);
  }
  if (name == "abs") {
    if (is_intlike(v)) {
      if (as_int(v) == std::numeric_limits<int64_t>::min()) fail("jinja: line ", line, ": integer overflow");
      return Value::integer(std::abs(as_int(v)));
    }
    if (v.t == Value::Float) return Value::flt(std::fabs(v.f));
    fail("jinja: line ", line, ": abs needs a number");
  }
  if (name == "dictsort") {
    if (v.t != Value::Dct) fail("jinja: line ", line, ": dictsort needs a mapping");
    auto items = v.d->items;
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
    List out;
    for (auto& [k, x] : items) {
      Value t = Value::list({Value::str(k), x});
      t.tuple = true;
      out.push_back(std::move(t));
    }
    return Value::list(std::move(out));
  }
  fail("jinja: line ", line, ": unknown filter '", name, "'");
}

Value make_fn(std::string name, std::function<Value(List&, Kwargs&)> f) {
  Value v;
  v.t = Value::Fn;
  v.fn = std::make_shared<Func>(Func{std::move(name), std::move(f)});
  return v;
}

}  // namespace

Template::Template(std::string_view source) {
  Parser p(Lexer(source).run());
  root_ = p.parse_template();
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context, int64_t work_limit) const {
  if (!context.is_object()) fail("jinja: the context must be a JSON object");
  struct RenderState {  // (this render's budget and containers; the previous ones back on every exit)
    int64_t saved_left = t_work_left, saved_limit = t_work_limit;
    std::vector<std::weak_ptr<List>>* saved_lists = t_lists;
    std::vector<std::weak_ptr<Dict>>* saved_dicts = t_dicts;
    std::vector<std::weak_ptr<List>> lists;
    std::vector<std::weak_ptr<Dict>> dicts;
    explicit RenderState(int64_t limit) {
      t_work_left = t_work_limit = std::max<int64_t>(0, limit);
      t_lists = &lists;
      t_dicts = &dicts;
    }
    ~RenderState() {  // (after the interpreter's scopes: what is still alive is in a cycle)
      t_lists = saved_lists, t_dicts = saved_dicts;
      for (const auto& w : lists)
        if (const auto l = w.lock()) List().swap(*l);
      for (const auto& w : dicts)
        if (const auto d = w.lock()) decltype(d->items)().swap(d->items);
      t_work_left = saved_left, t_work_limit = saved_limit;
    }
  } state(work_limit);
  std::string out;
  Interp in(out);
  auto& g = in.root();
  g["range"] = make_fn("range", [](List& a, Kwargs&) {
    for (const Value& x : a)
      if (!is_intlike(x)) fail("jinja: range() takes integers");
    int64_t b = 0, e = 0, st = 1;
    if (a.size() == 1) e = as_int(a[0]);
    else if (a.size() >= 2) b = as_int(a[0]), e = as_int(a[1]);
    if (a.size() == 3) st = as_int(a[2]);
    if (a.empty() || a.size() > 3 || st == 0) fail("jinja: bad range() arguments");
    List out;
    for (int64_t k = b; st > 0 ? k < e : k > e;) {
      if (out.size() >= size_t(kMaxIterations)) limit("jinja: range() too long");
      out.push_back(Value::integer(k));
      if (__builtin_add_overflow(k, st, &k)) break;  // (past INT64_MAX or MIN: past e too)
    }
    return Value::list(std::move(out));
  });
  const auto dict_fn = [](bool ns) {
    return [ns](List& a, Kwargs& kw) {
      Value v = Value::dict();
      v.ns = ns;
      for (const Value& x : a) {
        if (x.t != Value::Dct) fail("jinja: ", ns ? "namespace" : "dict", "() takes a mapping or keyword arguments");
        for (const auto& [k, y] : x.d->items) v.d->set(k, y);
      }
      for (auto& [k, y] : kw) v.d->set(k, y);
      return v;
    };
  };
  g["namespace"] = make_fn("namespace", dict_fn(true));
  g["dict"] = make_fn("dict", dict_fn(false));
  g["raise_exception"] = make_fn("raise_exception", [](List& a, Kwargs&) -> Value {
    throw Raised(cat("the chat template raised: ", a.empty() ? std::string("an error") : py_str(a[0])));
  });
  g["strftime_now"] = make_fn("strftime_now", [](List& a, Kwargs&) {
    if (a.empty() || a[0].t != Value::Str) fail("jinja: strftime_now() takes a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, a[0].s.c_str(), &tm);
    return Value::str(std::string(buf, n));
  });
  for (const auto& [k, v] : context.items()) g[k] = from_json(v);
  in.exec(*root_);
  return out;
}

}  // namespace ft::jinja
