// JSON Schema -> grammar (GBNF text for Grammar::parse), for the subset real clients send
// (OpenAI structured outputs, tool parameters, Zod/Pydantic exports):
//   type (one or a list; "null" included), properties + required (properties in the schema's
//   order; the optional ones may be left out), additionalProperties (false, or a schema when no
//   properties are listed), minProperties / maxProperties (listed properties counted where the
//   required and listed ones do not imply the counts; an object of any members counts them as
//   written, a key written twice twice), enum, const, items / prefixItems, minItems / maxItems,
//   minLength / maxLength, anyOf / oneOf, allOf of one schema, $ref to #/$defs/... or
//   #/definitions/..., nullable, and exactly:
//   - integer minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, or draft 4's
//     booleans): a digit grammar of the range, O(digits^2); at most 16 digits, as every integer.
//   - number ones too, the number then written without an exponent, within the bounds as a
//     client's double reads it back (an exclusive bound: the next double inside it).
//   - pattern (ECMAScript, unanchored unless ^...$ as JSON Schema's): literals, escapes (\d \w \s
//     and their negations, \t \n \xHH \uHHHH, escaped punctuation), classes (ranges, negated),
//     '.', groups ((?:, (?<name>, (?P<name> too), alternation, ? * + {m} {m,} {m,n} (lazy ones
//     alike), ^ at the start and $ at the end of each alternative. Its characters as JSON escapes
//     them; '.', negated classes and \D \S \W admit ASCII characters only, a class lists at most
//     256 non-ASCII ones (matching is over bytes: a byte class would count a byte as a character).
//     Lookaround, backreferences, \b, \p{...}, flags: an error naming them. With minLength /
//     maxLength the characters are counted where the pattern does not imply them.
//   - format date (real dates), time and date-time (RFC 3339, with a zone; milliseconds at most),
//     uuid, as patterns (llama.cpp's formats); a pattern wins over a format; other formats: any
//     string.
//   A pattern's automaton (each copy of a repeated part a position), counts' states and property
//   counts spend Grammar::kMaxElems grammar elements at most, the schema's all together: past them,
//   an error saying so (a hostile (a{1000}){1000} is refused at once, not compiled).
//   Ignored (they constrain nothing we can express exactly, or mean nothing here): multipleOf,
//   not, uniqueItems, contains / minContains / maxContains, patternProperties, propertyNames,
//   dependentRequired / dependentSchemas, if / then / else, unevaluated*, other formats, $schema,
//   $id, title, description, default, examples, strict.
// Output is compact JSON-with-optional-whitespace: no whitespace before the first byte or after
// the last, so the grammar ends exactly where the value does.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_ordered.h"  // parse_ordered_json

namespace ft {

// Throws ft::Error "json schema: <path>: what" for a construct outside the subset (an unknown
// type, a $ref elsewhere, an unsatisfiable combination) and when nesting exceeds 64 levels.
// The schema as ordered_json: its properties come out in the order its text lists them (OpenAI's,
// llama.cpp's; a "reasoning" before an "answer" is written first). A request's parse (nlohmann::json)
// sorts an object's keys: read the schema's own text with parse_ordered_json (server/api.cpp does).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

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
