#include "engine/json_schema.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/grammar.h"

namespace ft {

namespace {

using json = nlohmann::ordered_json;  // a schema's keys in its text's order

constexpr int kMaxDepth = 64;
// Optional properties in a row that an object may have (Grammar::kMaxExpandDepth less room for
// the schema's own nesting around the object).
constexpr size_t kMaxOptionalRun = size_t(Grammar::kMaxExpandDepth) - 56;

// The rules every schema grammar shares: whitespace (bounded, as llama.cpp's: nothing, " ", or "\n"
// and up to 20 spaces/tabs between two tokens, so output cannot loop on it), and the generic JSON
// values, numbers' digits bounded as llama.cpp's (16 a part: a model wrote "-3.1000000..." to its
// max_tokens, which a client's parse() then refused).
const char* const kBase = R"(ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-integer ("." [0-9]{1,16})? ([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";


// Where a schema node is, for error messages: its parent's path, then seg and key ("/items",
// "/properties/" NAME); made into text only when an error names it (a copy of the text for each
// child was quadratic: a 2 MB key copied for each of its 150,000 properties, 16 s).
struct Path {
  const Path* up = nullptr;
  std::string_view seg;
  std::string key;
  std::string str() const { return (up ? up->str() : std::string()) + std::string(seg) + key; }
};

class Compiler {
 public:
  // prefix: of the names of the rules it adds (several compilers' rules in one grammar).
  explicit Compiler(const json& root, std::string prefix = "", std::string root_path = "#")
      : root_(root), prefix_(std::move(prefix)), root_path_(std::move(root_path)) {}

  std::string run() {
    const std::string r = top();
    return std::string(kBase) + "root ::= " + r + "\n" + rules_;
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
    if (type == "integer") return "json-integer";
    if (type == "number") return "json-number";
    if (type == "boolean") return "json-boolean";
    if (type == "null") return "json-null";
    if (type == "object") return object_rule(s, path, depth);
    if (type == "array") return array_rule(s, path, depth);
    bad(path, "unknown type '" + type + "'");
  }

  static int64_t bound(const json& s, const char* key, int64_t dflt, const Path& path) {
    if (!s.contains(key)) return dflt;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0 || s[key].get<int64_t>() > 10000)
      bad(path, std::string("'") + key + "' must be an integer in [0, 10000]");
    return s[key].get<int64_t>();
  }

  std::string string_rule(const json& s, const Path& path) {
    const int64_t lo = bound(s, "minLength", 0, path), hi = bound(s, "maxLength", -1, path);
    if (lo == 0 && hi < 0) return "json-string";
    if (hi >= 0 && hi < lo) bad(path, "'maxLength' is below 'minLength'");
    return add_rule("\"\\\"\" json-char{" + std::to_string(lo) + "," + (hi >= 0 ? std::to_string(hi) : "") + "} \"\\\"\"");
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
    // "[" ws ( item ws ( "," ws item ws ){lo-1, hi-1} )? "]" (the group is required when lo > 0)
    const std::string more = "( \",\" ws " + item + " ws ){" + std::to_string(lo > 0 ? lo - 1 : 0) + "," +
                             (hi >= 0 ? std::to_string(hi > 0 ? hi - 1 : 0) : "") + "}";
    if (hi == 0) return add_rule("\"[\" ws \"]\"");
    const std::string body = item + " ws " + more;
    return add_rule("\"[\" ws " + (lo > 0 ? body : "( " + body + " )?") + " \"]\"");
  }

  std::string object_rule(const json& s, const Path& path, int depth) {
    if (!s.contains("properties") || !s["properties"].is_object() || s["properties"].empty()) {
      // No listed properties: any object, or one whose values follow additionalProperties.
      if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
        const std::string v = rule_for(s["additionalProperties"], Path{&path, "/additionalProperties", ""}, depth + 1);
        const std::string kv = "json-string ws \":\" ws " + v + " ws";
        return add_rule("\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\"");
      }
      if (s.value("additionalProperties", json(true)) == false) return add_rule("\"{\" ws \"}\"");
      return "json-object";
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
    // The properties in order, optional ones skippable, commas only between those present:
    // first_i: nothing emitted yet from i on; rest_i: something was, so each next one needs ",".
    const size_t n = kvs.size();
    std::vector<std::string> rest(n + 1), first(n + 1);
    rest[n] = "";
    for (size_t i = n; i-- > 0;) {
      // rest_i ::= "," kv_i rest_i+1 (| rest_i+1 when optional: one reference a skip, not a group's two)
      const std::string item = "\",\" ws " + kvs[i].first;
      const std::string with = item + (rest[i + 1].empty() ? "" : " " + rest[i + 1]);
      rest[i] = add_rule(kvs[i].second ? with : with + " | " + rest[i + 1]);
    }
    first[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string with = kvs[i].first + (rest[i + 1].empty() ? "" : " " + rest[i + 1]);
      if (kvs[i].second) {
        first[i] = add_rule(with);
      } else {
        first[i] = add_rule(first[i + 1].empty() ? with + " | " : with + " | " + first[i + 1]);
      }
    }
    return add_rule("\"{\" ws " + first[0] + " \"}\"");
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

namespace {
// nlohmann's SAX events into an ordered_json, an object's keys indexed while it is open (its
// members appended to its vector; a repeated key's value replaced in place).
class OrderedBuilder {
 public:
  json root;

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(json::binary_t&) { return false; }  // (not in JSON text)
  bool start_object(size_t) { return open(json::object()); }
  bool start_array(size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    auto& members = static_cast<json::object_t::Container&>(open_.back().value->get_ref<json::object_t&>());
    const auto [it, fresh] = open_.back().keys.emplace(k, members.size());
    if (fresh) members.emplace_back(std::move(k), nullptr);
    slot_ = &members[it->second].second;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

 private:
  struct Open {
    json* value;
    std::unordered_map<std::string, size_t> keys;  // an object's: key -> its index
  };
  json* place(json v) {
    if (open_.empty()) return &(root = std::move(v));
    json& top = *open_.back().value;
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(*slot_ = std::move(v));
  }
  bool put(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json v) {
    open_.push_back({place(std::move(v)), {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }
  // (A value's place stays put while it is open: only the innermost open value grows.)
  std::vector<Open> open_;
  json* slot_ = nullptr;  // the value of the key just read
};
}  // namespace

json parse_ordered_json(std::string_view text) {
  OrderedBuilder b;
  if (!json::sax_parse(text.begin(), text.end(), &b)) return json(json::value_t::discarded);
  return std::move(b.root);
}

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
  return std::string(kBase) + "root ::= \"[\" ws call ws ( \",\" ws call ws )" + more + " \"]\"\n" + rules;
}

std::string json_object_gbnf() { return std::string(kBase) + "root ::= json-object\n"; }

}  // namespace ft
