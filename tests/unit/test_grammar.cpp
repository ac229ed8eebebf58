// Constrained decoding: the GBNF parser, the matcher (bytes, tokens, masks), JSON Schema ->
// grammar, and the per-token cost of masking on the Llama 3 vocabulary (printed; bounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

using json = nlohmann::json;

// A vocabulary of single bytes plus a few words, and an end token (id 0).
std::shared_ptr<const GrammarVocab> small_vocab() {
  std::vector<std::string> pieces{""};
  std::vector<bool> eog{true};
  for (int c = 1; c < 128; ++c) pieces.push_back(std::string(1, char(c))), eog.push_back(false);
  for (const char* w : {"true", "false", "null", "{\"", "\":", "\"}", "12", "ab\"", "tr"}) pieces.push_back(w), eog.push_back(false);
  return std::make_shared<GrammarVocab>(pieces, eog);
}

bool matches(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf), small_vocab());
  return m.accept_bytes(text) && m.complete();
}

bool schema_matches(const json& schema, const std::string& text) { return matches(json_schema_to_gbnf(schema), text); }

TEST(Grammar, GbnfSyntax) {
  const std::string g = R"(# a comment
root ::= greeting (" " name)? "!"{1,3}
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]*   # capitalised
)";
  EXPECT_TRUE(matches(g, "hi!"));
  EXPECT_TRUE(matches(g, "hello Bob!!!"));
  EXPECT_FALSE(matches(g, "hello bob!"));
  EXPECT_FALSE(matches(g, "hi!!!!"));
  EXPECT_FALSE(matches(g, "hi"));  // a prefix is not complete
  EXPECT_TRUE(matches(R"(root ::= [^"\\]* "\"")", "anything at all, é too\""));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9" .)", "A\xC3\xA9z"));
  EXPECT_TRUE(matches("root ::= (\"a\" | \"b\")+ \"c\"?", "abba"));
  EXPECT_TRUE(matches("root ::= \"ab\"{2}", "abab"));
  EXPECT_FALSE(matches("root ::= \"ab\"{2}", "ab"));
  EXPECT_TRUE(matches("root ::= x\nx ::= \"x\" root | \"y\"", "xxxy"));  // right recursion

  const auto error = [](const std::string& gbnf, const std::string& needle) {
    try {
      Grammar::parse(gbnf);
      ADD_FAILURE() << "parsed: " << gbnf;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  error("rot ::= \"a\"", "no 'root'");
  error("root ::= undefined-rule", "not defined");
  error("root ::= root \"a\" | \"b\"", "left recursion");
  error("root ::= \"a\"{99999}", "repetition");
  error("root ::= [a-", "unterminated");
  error("root ::= \"abc", "unterminated");
  error("root ::= [α-ω]", "non-ASCII");
  error("root ::= " + std::string(1000, '(') + "\"a\"" + std::string(1000, ')'), "nest");
  // Left recursion through other rules, and through a rule that can match nothing.
  error("root ::= a \"x\"\na ::= b | \"y\"\nb ::= root", "left recursion");
  error("root ::= e root \"x\" | \"y\"\ne ::= | \"z\"", "left recursion");
  error("root ::= e f root | \"y\"\ne ::= | \"z\"\nf ::= e e", "left recursion");
  EXPECT_TRUE(matches("root ::= e \"x\" root | \"y\"\ne ::= | \"z\"", "xzxy"));  // (a byte first: not left recursion)
  // References 300 deep before a byte; 200 deep is fine.
  const auto chain = [](int n) {
    std::string g = "root ::= r0\n";
    for (int k = 0; k + 1 < n; ++k) g += "r" + std::to_string(k) + " ::= r" + std::to_string(k + 1) + "\n";
    return g + "r" + std::to_string(n - 1) + " ::= \"a\"\n";
  };
  error(chain(300), "nest too deeply");
  EXPECT_TRUE(matches(chain(200), "a"));
  // Many references to a rule of many alternatives (checked once per rule, not per reference).
  std::string wide = "root ::=";
  for (int k = 0; k < 20000; ++k) wide += " x";
  wide += "\nx ::= \"a0\"";
  for (int k = 1; k < 2000; ++k) wide += " | \"a" + std::to_string(k) + "\"";
  EXPECT_NO_THROW(Grammar::parse(wide));
  // A reference that keeps more parses alive than a matcher may is refused at parse, as before.
  std::string ambiguous = "root ::= \"<\" x\nx ::= \"a0\"";
  for (int k = 1; k < 5000; ++k) ambiguous += " | \"a" + std::to_string(k) + "\"";
  error(ambiguous, "too ambiguous");
}

TEST(Grammar, MaskAllowsExactlyTheTokensTheGrammarAccepts) {
  const auto vocab = small_vocab();
  GrammarMatcher m(Grammar::parse(R"(root ::= "{" "\"" [a-z]+ "\"" ":" ("true" | "12") "}")"), vocab);
  const auto allowed = [&] {
    std::vector<float> logits(size_t(vocab->n_vocab()), 0.0f);
    m.mask(logits.data(), vocab->n_vocab());
    std::vector<std::string> out;
    for (int32_t t = 0; t < vocab->n_vocab(); ++t)
      if (std::isfinite(logits[size_t(t)])) out.push_back(t == 0 ? "<eos>" : vocab->piece(t));
    return out;
  };
  EXPECT_EQ(allowed(), (std::vector<std::string>{"{", "{\""}));
  ASSERT_TRUE(m.accept_bytes("{\"ab"));
  const auto a = allowed();  // letters (words of letters too), the closing quote alone or with ':'
  const auto has = [&](const std::string& p) { return std::find(a.begin(), a.end(), p) != a.end(); };
  EXPECT_EQ(a.size(), 26u + 7u);  // + '"', '":', 'ab"', 'true', 'false', 'null', 'tr'
  EXPECT_TRUE(has("\":") && has("ab\"") && has("true") && has("\""));
  EXPECT_FALSE(has("\"}") || has("12") || has("{"));
  ASSERT_TRUE(m.accept_bytes("\":"));
  EXPECT_EQ(allowed(), (std::vector<std::string>{"1", "t", "true", "12", "tr"}));  // in id order
  ASSERT_TRUE(m.accept_bytes("12}"));
  EXPECT_TRUE(m.done());
  EXPECT_EQ(allowed(), (std::vector<std::string>{"<eos>"}));  // complete: only the end
  EXPECT_FALSE(m.accept_bytes("x"));
}

// choice_grammar's trie against membership: over random sets of short strings (shared prefixes,
// choices that are prefixes of others, duplicates, the empty string), every string up to one
// character longer is matched whole iff it is a choice, and accepted as a prefix iff it begins
// some choice; on ASCII and on characters whose UTF-8 shares lead bytes (é è: C3 A9 / C3 A8;
// 是 星: E6 98 AF / E6 98 9F), so that choices part inside a character.
TEST(Grammar, ChoicesMatchExactlyTheirSet) {
  std::mt19937 rng(3);
  const std::shared_ptr<const GrammarVocab> vocab = small_vocab();
  for (const std::vector<std::string>& alphabet : {std::vector<std::string>{"a", "b"},
                                                  std::vector<std::string>{"a", "\xC3\xA9", "\xC3\xA8", "\xE6\x98\xAF", "\xE6\x98\x9F"}}) {
    const size_t max_len = alphabet.size() == 2 ? 6 : 3;
    std::vector<std::string> all{""};
    std::vector<size_t> len{0};
    for (size_t i = 0; i < all.size(); ++i)
      if (len[i] <= max_len)
        for (const std::string& ch : alphabet) all.push_back(all[i] + ch), len.push_back(len[i] + 1);
    std::vector<std::string> shorter;
    for (size_t i = 0; i < all.size(); ++i)
      if (len[i] < max_len + 1) shorter.push_back(all[i]);
    for (int round = 0; round < 40; ++round) {
      std::vector<std::string> choices;
      const int n = 1 + int(rng() % 12);
      for (int k = 0; k < n; ++k) choices.push_back(shorter[rng() % shorter.size()]);
      const std::string g = choice_grammar(choices);
      const std::shared_ptr<const Grammar> grammar = Grammar::parse(g);
      for (const std::string& s : all) {
        for (const std::string& t : {s, s + "\xC3", s + "\xE6\x98"}) {  // whole characters, then a character's first bytes
          const bool member = std::find(choices.begin(), choices.end(), t) != choices.end();
          bool prefix = false;
          for (const std::string& c : choices) prefix = prefix || c.compare(0, t.size(), t) == 0;
          GrammarMatcher m(grammar, vocab);
          const bool accepted = m.accept_bytes(t);
          ASSERT_EQ(accepted, prefix) << g << "'" << t << "'";
          ASSERT_EQ(accepted && m.complete(), member) << g << "'" << t << "'";
        }
      }
    }
  }
}

// 100,000 choices after one prefix (a flat alternation kept a parse for each: "too ambiguous"),
// as guided_choice and as a JSON schema enum; choices nested 1,001 deep are a clear error.
TEST(Grammar, ManyChoicesWithACommonPrefix) {
  std::vector<std::string> ids;
  json values = json::array();
  for (int i = 0; i < 100000; ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "item-%05d", i);
    ids.push_back(b);
    values.push_back(b);
  }
  const auto g = Grammar::parse(choice_grammar(ids));
  for (const char* s : {"item-00000", "item-54321", "item-99999"}) {
    GrammarMatcher m(g, small_vocab());
    EXPECT_TRUE(m.accept_bytes(s) && m.complete()) << s;
  }
  for (const char* s : {"item-0000", "item-1234x", "item-999999", "item-"}) {
    GrammarMatcher m(g, small_vocab());
    EXPECT_FALSE(m.accept_bytes(s) && m.complete()) << s;
  }
  const json schema = {{"type", "object"}, {"properties", {{"id", {{"enum", values}}}}}, {"required", {"id"}}};
  EXPECT_TRUE(schema_matches(schema, R"({"id": "item-31415"})"));
  EXPECT_FALSE(schema_matches(schema, R"({"id": "item-3141"})"));
  std::vector<std::string> nested;
  for (int k = 1; k <= kMaxChoiceNesting + 1; ++k) nested.push_back(std::string(size_t(k), 'a'));
  try {
    choice_grammar(nested);
    ADD_FAILURE() << "choices nested " << nested.size() << " deep were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefixes of one another"), std::string::npos) << e.what();
  }
  nested.pop_back();
  EXPECT_NO_THROW(choice_grammar(nested));
  EXPECT_TRUE(matches(choice_grammar({""}), ""));
  EXPECT_TRUE(matches(json_schema_to_gbnf(json::parse(R"({"enum": ["café", "cafè", "是", "星"]})")), "\"cafè\""));
  EXPECT_FALSE(matches(choice_grammar({""}), "a"));
}

TEST(Grammar, JsonSchemaSubset) {
  const json person = json::parse(R"({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
    "title": "Person", "properties": {"name": {"type": "string", "description": "x"}, "age": {"type": "integer"},
    "email": {"type": ["string", "null"]}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age"], "additionalProperties": false})");
  // Properties come in the schema's order, here a json's, keys sorted: age, email, name, tags.
  EXPECT_TRUE(schema_matches(person, R"({"age": 3, "name": "Ann"})"));
  EXPECT_TRUE(schema_matches(person, R"({"age":-3,"email":null,"name":"Ann","tags":["a","b"]})"));
  EXPECT_TRUE(schema_matches(person, "{\n  \"age\": 0,\n  \"name\": \"A\\\"n\\u00e9\",\n  \"tags\": []\n}"));
  EXPECT_TRUE(schema_matches(person, R"({"age": 3, "name": "Ann", "tags": ["b"]})"));  // email skipped
  EXPECT_FALSE(schema_matches(person, R"({"name": "Ann", "age": 3})"));          // out of order
  EXPECT_FALSE(schema_matches(person, R"({"name": "Ann"})"));                    // age is required
  EXPECT_FALSE(schema_matches(person, R"({"age": 3.5, "name": "Ann"})"));        // integer
  EXPECT_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann", "x": 1})"));  // no additional properties
  EXPECT_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann", "tags": ["a","b","a"]})"));  // maxItems
  EXPECT_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann", "tags": ["c"]})"));          // enum
  EXPECT_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann",})"));
  EXPECT_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann"} )"));  // nothing after the value

  const json tree = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(schema_matches(tree, R"({"kids": [{"v": 2}, {"kids": [], "v": -0.5}], "v": 1.5e3})"));
  EXPECT_FALSE(schema_matches(tree, R"({"kids": [{"w": 2}], "v": 1})"));

  const json any = json::parse(R"({"anyOf": [{"type": "boolean"}, {"const": {"k": [1]}}], "nullable": true})");
  EXPECT_TRUE(schema_matches(any, "true"));
  EXPECT_TRUE(schema_matches(any, R"({"k":[1]})"));
  EXPECT_TRUE(schema_matches(any, "null"));
  EXPECT_FALSE(schema_matches(any, "1"));
  EXPECT_TRUE(schema_matches(json::parse(R"({"type": "array", "minItems": 2, "items": {"type": "string", "maxLength": 2}})"),
                             R"(["ab", ""])"));
  EXPECT_FALSE(schema_matches(json::parse(R"({"type": "array", "minItems": 2, "items": {"type": "string"}})"), R"(["ab"])"));
  EXPECT_TRUE(schema_matches(json::object(), R"([1, {"a": null}, "x"])"));  // {} accepts any value

  for (const char* bad : {R"({"type": "date"})", R"({"$ref": "http://example.com/s"})", R"({"$ref": "#/$defs/missing"})",
                          R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})",
                          R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})"}) {
    EXPECT_THROW(json_schema_to_gbnf(json::parse(bad)), Error) << bad;
  }
  json deep = json::object();
  for (int k = 0; k < 100; ++k) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_THROW(json_schema_to_gbnf(deep), Error);
  EXPECT_THROW(json_schema_to_gbnf(json::parse(R"({"type": "string", "nullable": "yes"})")), Error);
  // An error names where: the path through properties, items and the list entries.
  try {
    json_schema_to_gbnf(json::parse(R"({"properties": {"a": {"items": {"anyOf": [{}, {"type": "date"}]}}}})"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("#/properties/a/items/anyOf/1: unknown type 'date'"), std::string::npos) << e.what();
  }
  // Numbers' parts have at most 16 digits (a number cannot run on to max_tokens).
  const json num = {{"type", "number"}};
  EXPECT_TRUE(schema_matches(num, "-3.1000000000000000"));   // 16 fraction digits
  EXPECT_FALSE(schema_matches(num, "-3.10000000000000000"));  // 17
  EXPECT_TRUE(schema_matches(num, "1e-7"));
  EXPECT_TRUE(schema_matches(num, "2.5E+10"));
  EXPECT_FALSE(schema_matches(num, "1e12345678901234567"));
  // Optional properties: 200 in a row compile and match (129 failed mid-match, "nest too deeply":
  // a skipped one cost two references); 201 are a clear error saying what to do.
  {
    json props = json::object();
    for (int k = 0; k < 201; ++k) props[cat("p", 1000 + k)] = {{"type", "integer"}};
    json many = {{"type", "object"}, {"properties", props}};
    try {
      json_schema_to_gbnf(many);
      ADD_FAILURE() << "no error for 201 optional properties";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("optional properties in a row (201"), std::string::npos) << e.what();
    }
    many["required"] = {"p1100"};  // two runs of 100
    EXPECT_TRUE(schema_matches(many, R"({"p1100": 1, "p1199": 2})"));
    many["properties"].erase("p1200");
    many.erase("required");
    EXPECT_TRUE(schema_matches(many, R"({"p1000": 1, "p1150": 2, "p1199": 3})"));
    EXPECT_TRUE(schema_matches(many, R"({"p1199": 3})"));
    EXPECT_TRUE(schema_matches(many, "{}"));
    EXPECT_FALSE(schema_matches(many, R"({"p1150": 2, "p1000": 1})"));  // (key order)
  }
  // The path is text only for an error: a 1 MB key over 20,000 properties was copied for each (20
  // GB of copies, seconds of an I/O thread).
  {
    json inner = json::object(), all = json::array();
    for (int k = 0; k < 20000; ++k) inner[std::to_string(k)] = json::object(), all.push_back(std::to_string(k));
    const json wide = {{"type", "object"},
                       {"properties", {{std::string(1 << 20, 'k'), {{"type", "object"}, {"properties", inner}, {"required", all}}}}}};
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(json_schema_to_gbnf(wide).empty());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);  // (~0.1 s)
  }

  // A type list compiles its node once per type; nested lists used to multiply that (2^40
  // compilations here: a 3 KB schema that never finished). Each node is compiled once now.
  json typed = {{"type", "string"}};
  std::string value = "\"v\"";
  for (int k = 0; k < 40; ++k) {
    typed = {{"type", {"object", "object", "null"}}, {"properties", {{"a", typed}}}, {"required", {"a"}}};
    value = "{\"a\":" + value + "}";
  }
  EXPECT_TRUE(schema_matches(typed, value));
  EXPECT_TRUE(schema_matches(typed, "null"));
  EXPECT_FALSE(schema_matches(typed, "{\"a\":1}"));
}

// Properties come in the schema's order (an ordered_json, as the server reads a schema's own text):
// "zeta" before "alpha", as OpenAI's and llama.cpp's write them; a json (keys sorted) in key order.
TEST(Grammar, JsonSchemaPropertiesInSchemaOrder) {
  using ordered_json = nlohmann::ordered_json;
  const ordered_json schema = ordered_json::parse(R"({"type": "object", "properties": {"zeta": {"type": "integer"},
    "alpha": {"type": "string"}, "mid": {"$ref": "#/$defs/m"}}, "required": ["zeta", "alpha", "mid"],
    "$defs": {"m": {"properties": {"b": {"type": "boolean"}, "a": {"type": "null"}}}}})");
  const std::string g = json_schema_to_gbnf(schema);
  EXPECT_TRUE(matches(g, R"({"zeta": 1, "alpha": "x", "mid": {"b": true, "a": null}})")) << g;
  EXPECT_TRUE(matches(g, R"({"zeta": 1, "alpha": "x", "mid": {"a": null}})"));
  EXPECT_FALSE(matches(g, R"({"alpha": "x", "mid": {}, "zeta": 1})"));  // (sorted)
  EXPECT_FALSE(matches(g, R"({"zeta": 1, "alpha": "x", "mid": {"a": null, "b": true}})"));
  EXPECT_TRUE(schema_matches(json(schema), R"({"alpha": "x", "mid": {}, "zeta": 1})"));
  // The server reads a schema's text with parse_ordered_json: the same value, keys in order, a
  // repeated key's last value at its first place (as nlohmann's own ordered parse).
  const std::string text = R"({"b": 1, "a": [{"y": null, "x": 2.5}], "b": {"c": "d"}, "e": true})";
  EXPECT_EQ(parse_ordered_json(text), ordered_json::parse(text));
  EXPECT_EQ(parse_ordered_json(text).dump(), R"({"b":{"c":"d"},"a":[{"y":null,"x":2.5}],"e":true})");
  EXPECT_TRUE(parse_ordered_json("{\"a\": }").is_discarded());
  EXPECT_TRUE(parse_ordered_json("[1] 2").is_discarded());
  // Linear in the text: nlohmann's ordered parse scans an object's keys for each new one (these
  // 100,000 properties: 5e9 comparisons, a minute).
  const int n = test::kSanitized ? 10000 : 100000;
  std::string big = "{\"properties\": {";
  for (int k = 0; k < n; ++k) big += (k ? ", \"p" : "\"p") + std::to_string(k) + "\": {\"$ref\": \"#/$defs/d" + std::to_string(k) + "\"}";
  big += "}, \"$defs\": {";
  for (int k = 0; k < n; ++k) big += (k ? ", \"d" : "\"d") + std::to_string(k) + "\": {\"type\": \"integer\"}";
  big += "}}";
  auto t0 = std::chrono::steady_clock::now();
  const ordered_json parsed = parse_ordered_json(big);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);  // (~0.3 s)
  ASSERT_EQ(parsed["properties"].size(), size_t(n));
  EXPECT_EQ(parsed["properties"].begin().key(), "p0");
  // Their $refs each looked up in an index of the $defs (an ordered object's lookup scans its keys:
  // 5e9 comparisons again). (All optional: more than 200 in a row are refused, after the walk.)
  t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(json_schema_to_gbnf(parsed), Error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);  // (~0.5 s)
}

// Schema keywords that constrain values exactly: each a grammar that accepts what the keyword
// allows and nothing else (a client's strict parse, Zod's or Pydantic's, then passes).
std::shared_ptr<const Grammar> schema_grammar(const std::string& schema) { return Grammar::parse(json_schema_to_gbnf(json::parse(schema))); }
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  static const auto vocab = small_vocab();
  GrammarMatcher m(g, vocab);
  return m.accept_bytes(text) && m.complete();
}
// The error a schema is refused with ("" when it is not).
std::string schema_error(const std::string& schema) {
  try {
    json_schema_to_gbnf(nlohmann::ordered_json::parse(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
#define EXPECT_REFUSED(schema, needle) EXPECT_NE(schema_error(schema).find(needle), std::string::npos) << schema << ": " << schema_error(schema)

// Integers: minimum / maximum / exclusive ones (numbers, or draft 4's booleans), exact against
// membership on every value near the bounds, negative ranges, 0, one value, and at most 16 digits.
TEST(Grammar, JsonSchemaIntegerRanges) {
  const auto g = schema_grammar(R"({"type": "integer", "minimum": -15, "maximum": 1234})");
  for (int x = -2000; x <= 2000; ++x) EXPECT_EQ(accepts(g, std::to_string(x)), x >= -15 && x <= 1234) << x;
  for (const char* bad : {"-0", "01", "+5", "5.0", "1e2", " 5", "-"}) EXPECT_FALSE(accepts(g, bad)) << bad;
  std::mt19937_64 rng(7);
  const int64_t kMax = 9999999999999999;
  for (int trial = 0; trial < 300; ++trial) {
    // Bounds of 1 to 16 digits either side of 0, exclusive or not, as integers or as floats.
    const auto draw = [&]() {
      const int64_t mag = int64_t(rng() % uint64_t(std::pow(10.0, double(1 + rng() % 16))));
      return rng() % 3 == 0 ? -mag : mag;
    };
    int64_t a = draw(), b = draw();
    if (a > b) std::swap(a, b);
    const bool ex_lo = rng() % 2, ex_hi = rng() % 2;
    json s = {{"type", "integer"}};
    s[ex_lo ? "exclusiveMinimum" : "minimum"] = a;
    s[ex_hi ? "exclusiveMaximum" : "maximum"] = b;
    const int64_t lo = ex_lo ? a + 1 : a, hi = ex_hi ? b - 1 : b;
    if (lo > hi) {
      EXPECT_THROW(json_schema_to_gbnf(s), Error) << s;
      continue;
    }
    const auto gt = Grammar::parse(json_schema_to_gbnf(s));
    for (const int64_t x : {a - 1, a, a + 1, b - 1, b, b + 1, int64_t(0), int64_t(-1), int64_t(1), a / 2 + b / 2, -kMax, kMax,
                            lo + int64_t(rng() % uint64_t(hi - lo + 1))})
      if (x >= -kMax && x <= kMax) {
        EXPECT_EQ(accepts(gt, std::to_string(x)), x >= lo && x <= hi) << s << " " << x;
      }
  }
  // One value; 0 (never "-0"); float and draft 4 bounds; one side only (16 digits at most).
  const auto seven = schema_grammar(R"({"type": "integer", "minimum": 7, "maximum": 7})");
  EXPECT_TRUE(accepts(seven, "7"));
  EXPECT_FALSE(accepts(seven, "8"));
  EXPECT_FALSE(accepts(seven, "70"));
  const auto zero = schema_grammar(R"({"type": "integer", "minimum": 0, "maximum": 0})");
  EXPECT_TRUE(accepts(zero, "0"));
  EXPECT_FALSE(accepts(zero, "-0"));
  const auto floats = schema_grammar(R"({"type": "integer", "minimum": -2.5, "exclusiveMaximum": 3.0})");
  for (int x = -5; x <= 5; ++x) EXPECT_EQ(accepts(floats, std::to_string(x)), x >= -2 && x <= 2) << x;
  const auto draft4 = schema_grammar(R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true, "maximum": 3, "exclusiveMaximum": false})");
  for (int x = 0; x <= 4; ++x) EXPECT_EQ(accepts(draft4, std::to_string(x)), x == 2 || x == 3) << x;
  const auto above = schema_grammar(R"({"type": "integer", "minimum": 5})");
  EXPECT_TRUE(accepts(above, "9999999999999999"));
  EXPECT_FALSE(accepts(above, "10000000000000000"));
  EXPECT_FALSE(accepts(above, "4"));
  EXPECT_FALSE(accepts(above, "-5"));
  const auto below = schema_grammar(R"({"type": ["integer", "null"], "maximum": -3})");
  EXPECT_TRUE(accepts(below, "-9999999999999999"));
  EXPECT_TRUE(accepts(below, "null"));
  EXPECT_FALSE(accepts(below, "-2"));
  EXPECT_FALSE(accepts(below, "3"));
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "integer", "maximum": 1e300})"), "123"));
  EXPECT_REFUSED(R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer");
  EXPECT_REFUSED(R"({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5})", "no integer");
  EXPECT_REFUSED(R"({"type": "integer", "minimum": 1e17})", "no integer of at most 16 digits");
  EXPECT_REFUSED(R"({"type": "integer", "minimum": "5"})", "'minimum' must be a number");
  EXPECT_REFUSED(R"({"type": "integer", "exclusiveMaximum": null})", "'exclusiveMaximum' must be a number");
  // The widest range stays small: O(digits^2).
  EXPECT_LT(json_schema_to_gbnf(json::parse(R"({"type": "integer", "minimum": -9999999999999998, "maximum": 9999999999999997})")).size(),
            json_object_gbnf().size() + 4000);
}

// Numbers: written without an exponent, within the bounds as a client's double reads them (an
// exclusive bound: past it once read back, 99.9999999999999999 is 100).
TEST(Grammar, JsonSchemaNumberRanges) {
  const auto unit = schema_grammar(R"({"type": "number", "minimum": 0, "maximum": 1})");
  for (const char* ok : {"0", "0.5", "1", "1.0", "1.0000000000000000", "0.9999999999999999", "0.0", "0.0000000000000001"})
    EXPECT_TRUE(accepts(unit, ok)) << ok;
  for (const char* bad : {"-0.1", "1.0000000000000001", "1.5", "2", "1e0", "0.5e-1", "-0", "01", "0.", ".5", "0.00000000000000001"})
    EXPECT_FALSE(accepts(unit, bad)) << bad;
  const auto positive = schema_grammar(R"({"type": "number", "exclusiveMinimum": 0})");
  for (const char* ok : {"0.0000000000000001", "1", "9999999999999998", "3.25"}) EXPECT_TRUE(accepts(positive, ok)) << ok;
  for (const char* bad : {"0", "0.0", "0.0000000000000000", "-1", "-0.5", "9999999999999999"}) EXPECT_FALSE(accepts(positive, bad)) << bad;
  const auto under = schema_grammar(R"({"type": "number", "exclusiveMaximum": 100})");
  EXPECT_TRUE(accepts(under, "99.99999999999998"));
  EXPECT_FALSE(accepts(under, "99.9999999999999999"));  // (reads back as 100)
  EXPECT_FALSE(accepts(under, "100"));
  EXPECT_TRUE(accepts(under, "-5.5"));
  const auto neg = schema_grammar(R"({"type": "number", "minimum": -2.5, "maximum": -1.25})");
  for (const char* ok : {"-2.5", "-1.25", "-2", "-1.3", "-2.4999"}) EXPECT_TRUE(accepts(neg, ok)) << ok;
  for (const char* bad : {"-1.2", "-2.51", "0", "-0", "-1", "1.5", "-3"}) EXPECT_FALSE(accepts(neg, bad)) << bad;
  const auto half = schema_grammar(R"({"type": "number", "minimum": 0.5, "maximum": 0.5})");
  EXPECT_TRUE(accepts(half, "0.5"));
  EXPECT_TRUE(accepts(half, "0.50"));
  EXPECT_FALSE(accepts(half, "0.51"));
  EXPECT_FALSE(accepts(half, "0.4"));
  EXPECT_REFUSED(R"({"type": "number", "minimum": 2, "maximum": 1})", "no number");
  EXPECT_REFUSED(R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1})", "no number");
  // Every accepted text reads back within the bounds (as a client's double), on random bounds at
  // random scales and random decimals near them; those well inside are accepted.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const auto draw = [&]() {
      const double v = std::ldexp(double(rng() % 1000000) / 1000000.0, int(rng() % 60) - 30);
      return rng() % 3 == 0 ? -v : v;
    };
    double a = draw(), b = draw();
    if (a > b) std::swap(a, b);
    const bool ex_lo = rng() % 2, ex_hi = rng() % 2;
    json s = {{"type", "number"}, {ex_lo ? "exclusiveMinimum" : "minimum", a}, {ex_hi ? "exclusiveMaximum" : "maximum", b}};
    if (a == b && (ex_lo || ex_hi)) continue;
    const auto gt = Grammar::parse(json_schema_to_gbnf(s));
    for (int k = 0; k < 40; ++k) {
      const double base = k % 2 ? a : b, x = base + (double(int64_t(rng() % 2001)) - 1000.0) * std::fabs(base) * 1e-15 * double(k % 4 == 0 ? 1e12 : 1);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*f", int(rng() % 17), x);
      std::string text = buf;
      if (text.find_first_not_of("-0.") == std::string::npos) continue;  // (0 and -0: the bounds' own cases above)
      const size_t dot = text.find('.');
      if ((dot == std::string::npos ? text.size() : dot) - (text[0] == '-') > 16) continue;
      const double v = std::strtod(text.c_str(), nullptr);
      const bool in = (ex_lo ? v > a : v >= a) && (ex_hi ? v < b : v <= b);
      if (accepts(gt, text)) {
        EXPECT_TRUE(in) << s << " " << text;
      } else if (in && std::fabs(v - a) > std::fabs(a) * 1e-9 && std::fabs(v - b) > std::fabs(b) * 1e-9) {
        ADD_FAILURE() << s << " " << text;
      }
    }
  }
}

// Patterns (an ECMAScript regex subset) against std::regex's ECMAScript on every short string of
// an alphabet: JSON-escaped characters, classes, anchors or a search, alternation, repetition.
TEST(Grammar, JsonSchemaPatternsMatchAsRegexes) {
  const std::string alphabet = "abcz19.- _\n\"\\/";
  // (pattern, the same for std::regex where its ECMAScript lacks Annex B or named groups)
  const std::vector<std::pair<std::string, std::string>> patterns = {
      {"^[a-c]+$", ""}, {"a|b", ""}, {"^(ab|a)*c?$", ""}, {"^a{2,3}(b|c){0,2}$", ""}, {"\\d{2}", ""}, {"^x?b*z+$", ""},
      {"^[^abc]{1,3}$", ""}, {"(a|b)\\.c", ""}, {"^.{0,3}$", ""}, {"^\\w+\\s?\\w*$", ""}, {"^[a\\-c]$", ""}, {"^(?:a|bc)+$", ""},
      {"b{2}$", ""}, {"^\\D\\S\\W$", ""}, {"^\"\\\\$", ""}, {"^[\\d-z]+$", "^[\\d\\-z]+$"}, {"^(a*)*$", ""}, {"^(a|b?){3}$", ""},
      {"^a{,2}$", "^a\\{,2\\}$"}, {"^[^]$", "^[\\s\\S]$"}, {"^(?<n>1|9)\\/$", "^(1|9)\\/$"}, {"^(?P<n>a)b$", "^(a)b$"}, {"^$|^z$", ""}, {"^\\n?\\x61+?$", ""},
      {"^[\\s\\S]$", ""}, {"^a+b+$|^c$", ""}, {"^(((a)+)+)$", ""}};
  for (const auto& [p, same] : patterns) {
    const auto g = Grammar::parse(json_schema_to_gbnf(json{{"type", "string"}, {"pattern", p}}));
    const std::regex re(same.empty() ? p : same, std::regex::ECMAScript);
    std::vector<std::string> strings{""};
    // (every string of up to 3 characters; 2 under the sanitizers: the same paths, 1/15 the time)
    for (size_t begin = 0, len = 1; len <= (test::kSanitized ? 2u : 3u); ++len) {
      const size_t end = strings.size();
      for (size_t i = begin; i < end; ++i)
        for (const char c : alphabet) strings.push_back(strings[i] + c);
      begin = end;
    }
    strings.push_back("a{,2}");
    for (const std::string& str : strings)
      EXPECT_EQ(accepts(g, json(str).dump()), std::regex_search(str, re)) << p << " on " << json(str).dump();
  }
  // Characters: JSON's escapes (and only them) for quotes, backslashes and controls; non-ASCII
  // literals; '.' and negated classes ASCII only (a byte class would count bytes as characters).
  const auto quote = schema_grammar(R"({"type": "string", "pattern": "^a\"b\\\\c\\t$"})");
  EXPECT_TRUE(accepts(quote, R"("a\"b\\c\t")"));
  EXPECT_FALSE(accepts(quote, "\"a\"b\\c\t\""));
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "string", "pattern": "^café[äö]{2}\\u00e9$"})"), "\"caféöäé\""));
  EXPECT_FALSE(accepts(schema_grammar(R"({"type": "string", "pattern": "^.$"})"), "\"é\""));
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "string", "pattern": "z"})"), "\"éz\""));  // (a search: any text around)
  // minLength / maxLength counted where the pattern does not imply them.
  const auto word = schema_grammar(R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3})");
  for (const char* ok : {"\"ab\"", "\"abc\""}) EXPECT_TRUE(accepts(word, ok)) << ok;
  for (const char* bad : {"\"a\"", "\"abcd\"", "\"\""}) EXPECT_FALSE(accepts(word, bad)) << bad;
  const auto search = schema_grammar(R"({"type": "string", "pattern": "\\d", "maxLength": 3})");
  EXPECT_TRUE(accepts(search, "\"a1b\""));
  EXPECT_FALSE(accepts(search, "\"ab1c\""));
  EXPECT_FALSE(accepts(search, "\"abc\""));
  const auto least = schema_grammar(R"({"type": "string", "pattern": "^a*$", "minLength": 3})");
  EXPECT_FALSE(accepts(least, "\"aa\""));
  EXPECT_TRUE(accepts(least, "\"aaaaaaaaaaaaaaaaaaaaaaaaa\""));
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^\\d{5}$", "maxLength": 3})", "no string of the length");
  // Outside the subset: a 400 naming the place and the construct.
  EXPECT_REFUSED(R"({"properties": {"code": {"type": "string", "pattern": "(?=a)b"}}})", "#/properties/code: 'pattern': lookaround is not supported");
  for (const auto& [p, needle] : std::vector<std::pair<std::string, std::string>>{
           {"(a)\\\\1", "backreferences"}, {"\\\\bword", "word boundary"}, {"a^b", "'^'"}, {"a$b", "'$'"}, {"\\\\p{L}", "Unicode property"},
           {"[a", "unterminated '['"}, {"(a", "unbalanced '('"}, {"a)", "unbalanced ')'"}, {"*a", "nothing to repeat"},
           {"a**", "nothing to repeat"}, {"a{3,2}", "m > n"}, {"a{10001}", "above 10000"}, {"[\\\\u4e00-\\\\u9fff]", "non-ASCII"},
           {"\\\\q", "'\\q'"}, {"[]", "matches nothing"}, {"[^\\\\x00-\\\\x7F]", "admits no ASCII"}, {"(?i)a", "'(?'"}})
    EXPECT_REFUSED(R"({"type": "string", "pattern": ")" + p + "\"}", needle);
  EXPECT_REFUSED(R"({"type": "string", "pattern": 5})", "'pattern' must be a string");
  // Hostile sizes: repetitions' copies (1e6 positions) and links (2e8) refused fast, within the
  // grammar's element budget; groups nested past 64.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^(a{1000}){1000}$"})", "grammar elements");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^(a?){10000}(b?){10000}$"})", "grammar elements");
  EXPECT_REFUSED(R"({"type": "string", "pattern": ")" + std::string(100, '(') + "a" + std::string(100, ')') + "\"}", "nest too deeply");
  json props = json::object();
  for (int k = 0; k < 200; ++k) props[cat("p", k)] = {{"type", "string"}, {"pattern", "^[a-z]{1000,2000}x?y?$"}};
  EXPECT_THROW(json_schema_to_gbnf(json{{"properties", props}}), Error);  // (1,000 elements each, 200 of them: past the budget)
  // (~0.15 s in Release, 4.4 s under ASan; building those copies and links: minutes)
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_FALSE(json_schema_to_gbnf(json::parse(R"({"type": "string", "pattern": "^[a-z]{1,10000}$"})")).empty());
}

// format: date (real dates, leap years too), time and date-time (RFC 3339, with a zone), uuid.
TEST(Grammar, JsonSchemaFormats) {
  const auto date = schema_grammar(R"({"type": "string", "format": "date"})");
  for (const char* ok : {"2024-02-29", "2000-02-29", "0400-02-29", "0004-02-29", "2023-12-31", "2023-04-30", "1999-01-01",
                         "0001-01-01", "9999-12-31"})
    EXPECT_TRUE(accepts(date, cat("\"", ok, "\""))) << ok;
  // (year 0: Pydantic refuses it)
  for (const char* bad : {"2023-02-29", "1900-02-29", "2023-04-31", "2023-13-01", "2023-00-10", "2023-1-01", "2023-02-30",
                          "20231-01-01", "0000-02-29", "0000-01-01"})
    EXPECT_FALSE(accepts(date, cat("\"", bad, "\""))) << bad;
  // Times without a zone (Zod's time() refuses one), date-times in UTC (its datetime() refuses offsets).
  const auto time = schema_grammar(R"({"type": "string", "format": "time"})");
  for (const char* ok : {"23:59:59", "00:00:00.123", "12:00:00"}) EXPECT_TRUE(accepts(time, cat("\"", ok, "\""))) << ok;
  for (const char* bad : {"24:00:00", "12:00:00Z", "12:00:00+05:30", "12:60:00", "12:00:00.1"})
    EXPECT_FALSE(accepts(time, cat("\"", bad, "\""))) << bad;
  const auto date_time = schema_grammar(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(accepts(date_time, "\"2024-02-29T12:34:56Z\""));
  EXPECT_TRUE(accepts(date_time, "\"2024-02-29T12:34:56.789Z\""));
  EXPECT_FALSE(accepts(date_time, "\"2024-02-29T12:34:56+01:00\""));
  EXPECT_FALSE(accepts(date_time, "\"2024-02-29 12:34:56Z\""));
  const auto uuid = schema_grammar(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(accepts(uuid, "\"123e4567-e89b-12d3-A456-426614174000\""));
  EXPECT_FALSE(accepts(uuid, "\"123e4567e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(accepts(uuid, "\"123e4567-e89b-12d3-a456-42661417400g\""));
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "string", "format": "email"})"), "\"anything\""));  // (other formats: a string)
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "string", "format": "date", "pattern": "^x$"})"), "\"x\""));  // (the pattern's)
}

// minProperties / maxProperties: of an object of any or typed members (counted as written), and of
// listed properties (counted where the required and listed ones do not imply them).
TEST(Grammar, JsonSchemaPropertyCounts) {
  const auto free = schema_grammar(R"({"type": "object", "minProperties": 1, "maxProperties": 2})");
  EXPECT_FALSE(accepts(free, "{}"));
  EXPECT_TRUE(accepts(free, R"({"a": 1})"));
  EXPECT_TRUE(accepts(free, R"({"a": 1, "b": [2]})"));
  EXPECT_FALSE(accepts(free, R"({"a": 1, "b": 2, "c": 3})"));
  const auto typed = schema_grammar(R"({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2})");
  EXPECT_FALSE(accepts(typed, R"({"a": 1})"));
  EXPECT_TRUE(accepts(typed, R"({"a": 1, "b": 2, "c": 3})"));
  EXPECT_FALSE(accepts(typed, R"({"a": 1, "b": "x"})"));
  const auto some = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
    "c": {"type": "integer"}}, "minProperties": 1, "maxProperties": 2})");
  EXPECT_FALSE(accepts(some, "{}"));
  for (const char* ok : {R"({"b": 1})", R"({"a": 1, "c": 3})", R"({"b": 1, "c": 3})"}) EXPECT_TRUE(accepts(some, ok)) << ok;
  EXPECT_FALSE(accepts(some, R"({"a": 1, "b": 2, "c": 3})"));
  const auto one = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
    "c": {"type": "integer"}}, "required": ["b"], "maxProperties": 1})");
  EXPECT_TRUE(accepts(one, R"({"b": 1})"));
  EXPECT_FALSE(accepts(one, R"({"a": 1, "b": 1})"));
  EXPECT_FALSE(accepts(one, R"({"b": 1, "c": 1})"));
  EXPECT_REFUSED(R"({"properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 1})", "below the number of required");
  EXPECT_REFUSED(R"({"properties": {"a": {}, "b": {}}, "minProperties": 3})", "no object");
  EXPECT_REFUSED(R"({"type": "object", "additionalProperties": false, "minProperties": 1})", "no property is allowed");
  EXPECT_REFUSED(R"({"type": "object", "minProperties": 3, "maxProperties": 2})", "below 'minProperties'");
  // Counting 10,000 optional properties to 5,000 (5e7 states): refused fast, within the budget.
  json props = json::object(), required = json::array();
  for (int k = 0; k < 10000; ++k) {
    props[cat("p", k)] = {{"type", "integer"}};
    if (k % 100 == 0) required.push_back(cat("p", k));
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(json_schema_to_gbnf(json{{"properties", props}, {"required", required}, {"minProperties", 5000}}), Error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);  // (well under 1 s in Release)
}

// The allowed set by definition: token t is allowed iff a matcher in this state accepts it.
// `ref` is a matcher that never masks (its caches stay empty, so copying it is cheap).
std::vector<bool> reference_allowed(const GrammarMatcher& ref, int32_t n_vocab) {
  std::vector<bool> out(static_cast<size_t>(n_vocab));
  for (int32_t t = 0; t < n_vocab; ++t) {
    GrammarMatcher m = ref;
    out[size_t(t)] = m.accept(t);
  }
  return out;
}

std::vector<bool> masked_allowed(GrammarMatcher& m, int32_t n_vocab) {
  std::vector<float> logits(size_t(n_vocab), 0.0f);
  m.mask(logits.data(), n_vocab);
  std::vector<bool> out(static_cast<size_t>(n_vocab));
  for (int32_t t = 0; t < n_vocab; ++t) out[size_t(t)] = std::isfinite(logits[size_t(t)]);
  return out;
}

// The mask (cached walks over the top of each stack, the rest finished below) must allow exactly
// the tokens accept() takes, in every state: random vocabularies of JSON-ish pieces (spanning
// string ends, numbers, whitespace runs, keys), random walks through several grammars.
TEST(Grammar, MaskEqualsReferenceOnRandomWalks) {
  const std::string alphabet = "{}[]\":, \n\t0123456789.-eE+abcdefnlrstu\\\"";
  const std::vector<std::string> grammars = {
      json_object_gbnf(),
      json_schema_to_gbnf(json::parse(R"({"type": "object", "properties": {"a": {"type": "string"},
        "bb": {"type": "array", "items": {"type": "number"}, "maxItems": 3}, "c": {"enum": ["x", "y\"z"]},
        "d": {"anyOf": [{"type": "boolean"}, {"type": "null"}, {"type": "integer"}]}}, "required": ["a", "c"]})")),
      json_schema_to_gbnf(json::parse(R"({"$defs": {"n": {"type": "object", "properties": {"v": {"type": "string", "maxLength": 3},
        "k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}}, "$ref": "#/$defs/n"})")),
      "root ::= (\"ab\" | \"a\" x)* \"!\"\nx ::= \"b\" | \"bc\" x\n",
  };
  size_t checked = 0, leaves_top = 0;
  const uint32_t seeds = test::kSanitized ? 2 : 6;  // (the sanitizers' run: memory, not coverage)
  for (uint32_t seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> pieces{"", ""};  // 0: end of generation; 1: an empty piece (never allowed)
    std::vector<bool> eog{true, false};
    for (int c = 1; c < 128; ++c) pieces.push_back(std::string(1, char(c))), eog.push_back(false);
    for (int k = 0; k < 1500; ++k) {
      std::string p;
      const size_t len = 2 + rng() % 7;
      for (size_t j = 0; j < len; ++j) p += alphabet[rng() % alphabet.size()];
      pieces.push_back(p), eog.push_back(false);
    }
    for (const char* w : {"\n  ", "\n    ", "    ", "\":", "\",", "\", \"", "true", "null", "\"}", "}]", "\n\n"})
      pieces.push_back(w), eog.push_back(false);
    const auto vocab = std::make_shared<GrammarVocab>(pieces, eog);
    const int32_t V = vocab->n_vocab();
    for (const std::string& gbnf : grammars) {
      const auto g = Grammar::parse(gbnf);
      GrammarMatcher m(g, vocab), ref(g, vocab);
      for (int step = 0; step < 60; ++step) {
        const std::vector<bool> got = masked_allowed(m, V), want = reference_allowed(ref, V);
        ASSERT_EQ(got, want) << "seed " << seed << ", step " << step << ", grammar:\n" << gbnf;
        ++checked;
        std::vector<int32_t> next;
        for (int32_t t = 1; t < V; ++t) {
          if (!want[size_t(t)]) continue;
          next.push_back(t);
          const std::string& p = vocab->piece(t);  // a quote inside: it closed a string and went on
          leaves_top += p.size() > 2 && p.find('"', 1) < p.size() - 1;
        }
        if (next.empty()) break;
        const int32_t t = next[rng() % next.size()];
        ASSERT_TRUE(m.accept(t));
        ASSERT_TRUE(ref.accept(t));
      }
    }
  }
  EXPECT_GT(checked, 200u * seeds / 6);
  EXPECT_GT(leaves_top, 100u * seeds / 6);  // allowed tokens that close a string and go on (the finished-below path)
}

// A state whose mask takes more than the matcher's work limit to find is a RequestError (the
// engine fails that request alone, a server answers 400), whether at the start or later in the
// output; under the limit the same states give the reference's masks; a cached state costs nothing.
TEST(Grammar, MaskWorkIsBounded) {
  const auto vocab = small_vocab();
  const int32_t V = vocab->n_vocab();
  // n alternatives, each inside its own [^"]*: n parses walk the whole vocabulary each.
  const auto ambiguous = [](int n, const std::string& before) {
    std::string g = "root ::= " + before + " (a0";
    for (int i = 1; i < n; ++i) g += " | a" + std::to_string(i);
    g += ")\n";
    for (int i = 0; i < n; ++i) g += "a" + std::to_string(i) + " ::= [^\"]* \"" + std::to_string(i) + "\"\n";
    return g;
  };
  const auto g = Grammar::parse(ambiguous(20, "\"{\""));
  GrammarMatcher free(g, vocab), ref(g, vocab);
  ASSERT_EQ(masked_allowed(free, V), reference_allowed(ref, V));  // "{" only: cheap
  ASSERT_TRUE(free.accept_bytes("{") && ref.accept_bytes("{"));
  ASSERT_EQ(masked_allowed(free, V), reference_allowed(ref, V));
  const uint64_t work = free.mask_work();
  EXPECT_GT(work, uint64_t(20 * V)) << "each of the 20 parses walks the vocabulary";
  std::vector<float> logits(static_cast<size_t>(V));
  free.mask(logits.data(), V);
  EXPECT_EQ(free.mask_work(), 0u) << "the state's mask is cached";

  // Copies share the caches (one request's choices); a fork keeps the current state's mask only.
  {
    GrammarMatcher a(g, vocab);
    a.prepare_mask();
    GrammarMatcher copy = a, fork = a.fork();
    ASSERT_TRUE(a.accept_bytes("{") && copy.accept_bytes("{") && fork.accept_bytes("{"));
    a.prepare_mask();
    EXPECT_EQ(a.mask_work(), work);
    copy.prepare_mask();
    EXPECT_EQ(copy.mask_work(), 0u) << "a copy finds its original's masks";
    fork.prepare_mask();
    EXPECT_EQ(fork.mask_work(), work) << "a fork's caches are its own";
    GrammarMatcher late = a.fork();
    late.prepare_mask();
    EXPECT_EQ(late.mask_work(), 0u) << "the state it was forked at is kept";
  }
  // The same grammar under a limit below that work: its start passes, the state after "{" throws.
  GrammarMatcher tight(g, vocab, work / 2);
  tight.prepare_mask();
  ASSERT_TRUE(tight.accept_bytes("{"));
  try {
    tight.prepare_mask();
    ADD_FAILURE() << "no error past the work limit";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  // Parses that multiply with the output (after n a's, 2^n pending orders of b's and c's) pass the
  // parse-time check and exceed the 4,096 parses allowed by the 13th a: a RequestError too.
  GrammarMatcher growing(Grammar::parse("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\""), vocab);
  EXPECT_TRUE(growing.accept_bytes(std::string(10, 'a')));
  EXPECT_THROW(growing.accept_bytes(std::string(3, 'a')), RequestError);
  // At the start: the error comes from the first mask.
  GrammarMatcher start(Grammar::parse(ambiguous(20, "")), vocab, work / 2);
  EXPECT_THROW(start.prepare_mask(), RequestError);
  EXPECT_THROW(start.mask(logits.data(), V), RequestError);

  // Over many tokens the masks take limit / kMaskRefillTokens a token on average. 20 parses, each
  // a run of distinct positions: every byte is a new state as costly as the first.
  std::string runs = "root ::= b0";
  for (int i = 1; i < 20; ++i) runs += " | b" + std::to_string(i);
  for (int i = 0; i < 20; ++i) runs += "\nb" + std::to_string(i) + " ::= [^\"]{60} \"" + std::to_string(i) + "\"";
  const auto rg = Grammar::parse(runs);
  const int32_t x = 'x';  // small_vocab: token c is the byte c
  GrammarMatcher probe(rg, vocab);
  probe.prepare_mask();
  const uint64_t state_work = probe.mask_work();
  ASSERT_GT(state_work, uint64_t(V));
  GrammarMatcher runner(rg, vocab, 2 * state_work);  // each state alone within the limit
  int passed = 0;
  try {
    for (; passed < 40; ++passed) {
      runner.mask(logits.data(), V);
      EXPECT_GE(runner.mask_work(), state_work / 2) << "a new state at " << passed;
      ASSERT_TRUE(runner.accept(x));
    }
    ADD_FAILURE() << "40 costly states in a row were never refused";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("on average"), std::string::npos) << e.what();
  }
  EXPECT_GE(passed, 2);  // the credit holds the limit: two states' work, then ~1/8 of one a token
  EXPECT_LE(passed, 4);
  // A grammar whose states recur (cached masks) takes nothing from the credit past its first.
  GrammarMatcher looping(g, vocab, 2 * work);
  for (int i = 0; i < 200; ++i) {
    looping.mask(logits.data(), V);
    ASSERT_TRUE(looping.accept(i == 0 ? '{' : x));
  }
  EXPECT_GE(looping.mask_credit(), 2 * work - work / 2);
}

// JSON whitespace is bounded (llama.cpp's rule): between two tokens, nothing, one space, or a
// newline then at most 20 spaces or tabs; a model cannot loop on whitespace.
TEST(Grammar, JsonWhitespaceIsBounded) {
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})");
  for (const std::string& gbnf : {json_object_gbnf(), json_schema_to_gbnf(schema)}) {
    const auto doc = [](const std::string& w) { return "{" + w + "\"a\"" + w + ":" + w + "[" + w + "1" + w + "," + w + "2" + w + "]" + w + "}"; };
    EXPECT_TRUE(matches(gbnf, doc("")));
    EXPECT_TRUE(matches(gbnf, doc(" ")));
    EXPECT_TRUE(matches(gbnf, doc("\n")));
    EXPECT_TRUE(matches(gbnf, doc("\n" + std::string(20, ' '))));
    EXPECT_TRUE(matches(gbnf, doc("\n" + std::string(10, '\t') + std::string(10, ' '))));
    EXPECT_FALSE(matches(gbnf, doc("\n" + std::string(21, ' '))));  // beyond the bound
    EXPECT_FALSE(matches(gbnf, doc("  ")));                           // two spaces
    EXPECT_FALSE(matches(gbnf, doc("\n\n")));                         // two newlines
    EXPECT_FALSE(matches(gbnf, doc(" \n")));
    // At the bound, the mask allows no more whitespace.
    GrammarMatcher m(Grammar::parse(gbnf), small_vocab());
    ASSERT_TRUE(m.accept_bytes("{\n" + std::string(20, ' ')));
    const auto vocab = small_vocab();  // ids 1..127: the single bytes
    std::vector<float> logits(size_t(vocab->n_vocab()), 0.0f);
    m.mask(logits.data(), vocab->n_vocab());
    for (const char c : {' ', '\t', '\n'}) EXPECT_FALSE(std::isfinite(logits[size_t(c)])) << int(c);
    EXPECT_TRUE(std::isfinite(logits[size_t('"')]) && std::isfinite(logits[size_t('}')]));
  }
}

// Masking cost per generated token on the Llama 3 vocabulary (128K tokens): a JSON document
// that follows a schema, tokenized by the real tokenizer, is replayed token by token (mask, then
// accept). Printed. Then the masks of states along it are compared with the reference.
TEST(Grammar, MaskCostPerTokenOnLlama3Vocabulary) {
  FT_REQUIRE_SHARED(path, "tokenizer/ggml-vocab-llama-bpe.gguf");
  const auto f = GGUFFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(*f);
  std::vector<std::string> pieces(size_t(tok.n_vocab()));
  std::vector<bool> eog(size_t(tok.n_vocab()));
  for (int32_t t = 0; t < tok.n_vocab(); ++t) pieces[size_t(t)] = tok.token_to_piece(t), eog[size_t(t)] = tok.is_eog(t);
  const auto t0 = std::chrono::steady_clock::now();
  const auto vocab = std::make_shared<GrammarVocab>(pieces, eog);
  const double vocab_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  const json schema = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
    "days": {"type": "array", "items": {"type": "object", "properties": {"date": {"type": "string"},
    "high": {"type": "number"}, "low": {"type": "number"}, "summary": {"type": "string"}},
    "required": ["date", "high", "low", "summary"]}}}, "required": ["city", "days"]})");
  std::string doc = R"({"city": "Paris", "days": [)";
  for (int d = 0; d < 8; ++d)
    doc += std::string(d ? ", " : "") + R"({"date": "2024-06-1)" + std::to_string(d) +
           R"(", "high": 24.5, "low": 13, "summary": "Sunny spells with a light breeze from the west, turning cloudy later."})";
  doc += "]}";
  const std::vector<int32_t> ids = tok.encode(doc, false, false);
  GrammarMatcher m(Grammar::parse(json_schema_to_gbnf(schema)), vocab);
  std::vector<float> logits(size_t(tok.n_vocab()));
  double first_ms = 0, total_ms = 0, later_ms = 0, max_ms = 0;  // later: the second half (days 5-8)
  uint64_t max_work = 0, total_work = 0, min_credit = m.mask_credit();
  for (size_t i = 0; i < ids.size(); ++i) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const auto a = std::chrono::steady_clock::now();
    m.mask(logits.data(), tok.n_vocab());
    max_work = std::max(max_work, m.mask_work());
    total_work += m.mask_work();
    min_credit = std::min(min_credit, m.mask_credit());
    ASSERT_TRUE(std::isfinite(logits[size_t(ids[i])])) << "token " << i << " '" << pieces[size_t(ids[i])] << "' masked";
    ASSERT_TRUE(m.accept(ids[i])) << i;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
    total_ms += ms;
    max_ms = std::max(max_ms, ms);
    if (i >= ids.size() / 2) later_ms += ms;
    if (i == 0) first_ms = ms;
  }
  EXPECT_TRUE(m.done());
  const double per_token = total_ms / double(ids.size());
  std::printf("[grammar] Llama 3 vocabulary (%d tokens): vocabulary index %.1f ms once; %zu tokens, mask+accept "
              "%.3f ms/token on average (first %.1f ms, slowest %.1f ms; second half %.3f ms/token)\n",
              tok.n_vocab(), vocab_ms, ids.size(), per_token, first_ms, max_ms, later_ms / double(ids.size() - ids.size() / 2));
  // (A measurement, printed, not asserted: its time depends on the machine and the build.)
  // The work is a count: a schema's costliest state stays far inside the limit.
  EXPECT_LT(max_work, GrammarMatcher::kMaxMaskWork / 8) << "the work limit would refuse ordinary schemas";
  EXPECT_GT(min_credit, GrammarMatcher::kMaxMaskWork / 2) << "the average limit would refuse ordinary schemas";
  std::printf("[grammar] mask work %.0f a token on average (the average allowed %llu), the credit's low %llu\n",
              double(total_work) / double(ids.size()),
              static_cast<unsigned long long>(GrammarMatcher::kMaxMaskWork / GrammarMatcher::kMaskRefillTokens),
              static_cast<unsigned long long>(min_credit));

  // 1,000 parses each inside its own [^"]*: each walks the 128K vocabulary (3.4 s a token before
  // the limit). The first mask stops at the limit.
  std::string hostile = "root ::= a0";
  for (int i = 1; i < 1000; ++i) hostile += " | a" + std::to_string(i);
  for (int i = 0; i < 1000; ++i) hostile += "\na" + std::to_string(i) + " ::= [^\"]* \"Q" + std::to_string(i) + "\"";
  // Choices that part at 4,000 first characters: 4,000 walks of the vocabulary that reject
  // almost every token at once (2.4 s, uncounted, before each looked-at token counted).
  std::vector<std::string> wide;
  for (int i = 0; i < 4000; ++i) {
    const int cp = 0x4E00 + i;
    wide.push_back(std::string{char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))} + "abcdefgh");
  }
  GrammarMatcher parting(Grammar::parse(choice_grammar(wide)), vocab);
  const auto w0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(parting.prepare_mask());
  const uint64_t parting_work = parting.mask_work();
  EXPECT_LT(parting_work, GrammarMatcher::kMaxMaskWork / 4) << "each walk jumps over the first bytes it rejects";
  std::printf("[grammar] 4,000 choices parting at their first character: mask work %llu, %.0f ms\n",
              static_cast<unsigned long long>(parting_work),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
  // tool_choice "required" over 100 tools: [{"name": "tool_NN", "arguments": {...}}], the 100
  // objects alive together for the first tokens of each call (each walk looked at the whole
  // vocabulary: ~70 tools exhausted the credit).
  {
    json tools = json::array();
    for (int i = 0; i < 100; ++i) {
      json tool = json::object();
      tool["type"] = "object";
      tool["properties"]["name"]["const"] = cat("tool_", i);
      tool["properties"]["arguments"]["type"] = "object";
      tool["properties"]["arguments"]["properties"]["city"]["type"] = "string";
      tool["required"] = {"name", "arguments"};
      tools.push_back(tool);
    }
    const json calls = {{"type", "array"}, {"items", {{"anyOf", tools}}}, {"minItems", 1}};
    GrammarMatcher many(Grammar::parse(json_schema_to_gbnf(calls)), vocab);
    const std::vector<int32_t> call = tok.encode(R"([{"arguments": {"city": "Paris"}, "name": "tool_99"}])", false, false);
    uint64_t most = 0;
    for (const int32_t t : call) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      ASSERT_NO_THROW(many.mask(logits.data(), tok.n_vocab()));
      most = std::max(most, many.mask_work());
      ASSERT_TRUE(many.accept(t)) << pieces[size_t(t)];
    }
    EXPECT_TRUE(many.done());
    std::printf("[grammar] a call among 100 tools: largest mask work %llu\n", static_cast<unsigned long long>(most));
  }
  GrammarMatcher bad(Grammar::parse(hostile), vocab);
  const auto b0 = std::chrono::steady_clock::now();
  EXPECT_THROW(bad.prepare_mask(), RequestError);
  const double refused_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b0).count();
  std::printf("[grammar] largest mask work along the document %llu (limit %llu); 1,000 ambiguous parses refused after %.0f ms\n",
              static_cast<unsigned long long>(max_work), static_cast<unsigned long long>(GrammarMatcher::kMaxMaskWork),
              refused_ms);

  // The real vocabulary's masks equal the definition (accept() of each token) along the document,
  // in states inside strings (tokens like `",` leave them), numbers, keys and between values.
  const auto g = Grammar::parse(json_schema_to_gbnf(schema));
  GrammarMatcher fresh(g, vocab), ref(g, vocab);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 23 == 0 || i + 1 == ids.size()) {
      ASSERT_EQ(masked_allowed(fresh, tok.n_vocab()), reference_allowed(ref, tok.n_vocab())) << "before token " << i;
    }
    ASSERT_TRUE(fresh.accept(ids[i]) && ref.accept(ids[i])) << i;
  }
}

}  // namespace
}  // namespace ft
