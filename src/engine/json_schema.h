// JSON Schema -> grammar (GBNF text for Grammar::parse), for the subset real clients send
// (OpenAI structured outputs, tool parameters, Zod/Pydantic exports):
//   type (one or a list; "null" included), properties + required (properties in the schema's
//   order; the optional ones may be left out), additionalProperties (false, or a schema when no
//   properties are listed), enum, const, items / prefixItems, minItems / maxItems, minLength /
//   maxLength, anyOf / oneOf, allOf of one schema, $ref to #/$defs/... or #/definitions/...,
//   nullable. Ignored (they constrain nothing we can express or mean nothing here): $schema,
//   $id, title, description, default, examples, format, pattern, minimum / maximum, strict.
// Output is compact JSON-with-optional-whitespace: no whitespace before the first byte or after
// the last, so the grammar ends exactly where the value does.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft {

// Throws ft::Error "json schema: <path>: what" for a construct outside the subset (an unknown
// type, a $ref elsewhere, an unsatisfiable combination) and when nesting exceeds 64 levels.
// The schema as ordered_json: its properties come out in the order its text lists them (OpenAI's,
// llama.cpp's; a "reasoning" before an "answer" is written first). A request's parse (nlohmann::json)
// sorts an object's keys: read the schema's own text with parse_ordered_json (server/api.cpp does).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// JSON text as ordered_json (keys in the text's order; a repeated key's last value, at its first
// place, as nlohmann's parse has it), or a discarded value when it is not JSON. Linear in the
// text: nlohmann's own ordered parse scans an object's keys for each new one (200,000 properties:
// 2e10 comparisons). Nesting is the caller's to bound (core/json_depth.h).
nlohmann::ordered_json parse_ordered_json(std::string_view text);

// tool_choice "required": a JSON array of 1..max_calls (-1: any number) calls, each
// {"name": NAME, "arguments": ARGS} with "name" first (a model names the function before its
// arguments) and ARGS following that tool's parameters schema. tools: (name, parameters schema).
// Throws as above (the path names the tool: "tools[i].parameters#/...").
std::string tool_calls_gbnf(const std::vector<std::pair<std::string, nlohmann::ordered_json>>& tools, int64_t max_calls = -1);

// Any JSON object (response_format json_object).
std::string json_object_gbnf();

// A GBNF literal for the bytes of s ("..." with \, " and control bytes escaped).
std::string gbnf_literal(const std::string& s);

// Exactly one of `choices` (byte strings; duplicates and order do not matter) as a GBNF
// expression, factored as a trie: a literal per edge, a rule per node where choices part. The
// matcher then keeps one parse per distinct prefix however many choices share it (a flat
// alternation of 100,000 literals after a common prefix kept 100,000 parses: "too ambiguous").
// add_rule(body) registers a rule and returns its name. Throws ft::Error when more than
// kMaxChoiceNesting choices are prefixes of one another (each is a level of the trie).
inline constexpr int kMaxChoiceNesting = 1000;
std::string choice_gbnf(std::vector<std::string> choices, const std::function<std::string(const std::string&)>& add_rule);
// A whole grammar (root ::= one of choices): vLLM's guided_choice.
std::string choice_grammar(std::vector<std::string> choices);

}  // namespace ft
