// JSON Schema -> grammar (GBNF text for Grammar::parse), for the subset real clients send
// (OpenAI structured outputs, tool parameters, Zod/Pydantic exports):
//   type (one or a list; "null" included), properties + required (properties in key order: a
//   request's JSON objects are read unordered; the optional ones may be left out), additionalProperties (false, or a schema when no
//   properties are listed), enum, const, items / prefixItems, minItems / maxItems, minLength /
//   maxLength, anyOf / oneOf, allOf of one schema, $ref to #/$defs/... or #/definitions/...,
//   nullable. Ignored (they constrain nothing we can express or mean nothing here): $schema,
//   $id, title, description, default, examples, format, pattern, minimum / maximum, strict.
// Output is compact JSON-with-optional-whitespace: no whitespace before the first byte or after
// the last, so the grammar ends exactly where the value does.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft {

// Throws ft::Error "json schema: <path>: what" for a construct outside the subset (an unknown
// type, a $ref elsewhere, an unsatisfiable combination) and when nesting exceeds 64 levels.
std::string json_schema_to_gbnf(const nlohmann::json& schema);

// tool_choice "required": a JSON array of 1..max_calls (-1: any number) calls, each
// {"name": NAME, "arguments": ARGS} with "name" first (a model names the function before its
// arguments; a schema's properties would come out in key order, "arguments" first) and ARGS
// following that tool's parameters schema. tools: (name, parameters schema). Throws as above
// (the path names the tool: "tools[i].parameters#/...").
std::string tool_calls_gbnf(const std::vector<std::pair<std::string, nlohmann::json>>& tools, int64_t max_calls = -1);

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
