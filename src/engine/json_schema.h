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
#include <string>

#include <nlohmann/json.hpp>

namespace ft {

// Throws ft::Error "json schema: <path>: what" for a construct outside the subset (an unknown
// type, a $ref elsewhere, an unsatisfiable combination) and when nesting exceeds 64 levels.
std::string json_schema_to_gbnf(const nlohmann::json& schema);

// Any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace ft
