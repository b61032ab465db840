// JSON Schema -> grammar, for response_format json_schema, vLLM's structured_outputs.json and
// tool arguments; plus the any-JSON grammars (response_format json_object).
//
// Supported: type (one or a list, incl. "null" unions and OpenAPI `nullable`), properties /
// required / additionalProperties (properties come in schema order, as xgrammar and OpenAI strict
// mode emit them), enum / const, anyOf / oneOf (oneOf's exclusivity is not enforced), allOf of
// objects (merged), items / prefixItems / minItems / maxItems, minProperties / maxProperties,
// minLength / maxLength / pattern / format (date, time, date-time, duration, uuid, email,
// hostname, ipv4, ipv6, uri), integer and number bounds (exact: integers up to 18 digits; bounded
// numbers are written without an exponent), multipleOf (integers and decimals, exact: |x| x 10^k
// divisible by P as a digit state machine; with two bounds the multiples between them, else with
// sign-like bounds only), uniqueItems over at most 8 scalar item values (enum / const / boolean),
// patternProperties on closed objects with patterns that cannot share a
// key, propertyNames (a string schema), pattern with lengths where exact (docs/GRAMMAR.md), $ref
// to #, #/$defs/... and #/definitions/... incl. recursion. Annotations (title, description,
// default, examples, ...) are ignored. Keywords that constrain but cannot be expressed (not,
// if/then/else, dependentSchemas, uniqueItems, the inexact cases above, ...) are rejected with a message naming them, or, with JsonSchemaOptions::lenient (tool
// parameters), ignored so that the grammar admits a superset of the schema.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "grammar/ir.h"

namespace ts::grammar {

struct JsonSchemaOptions {
  // Objects without an explicit additionalProperties admit no other keys (OpenAI/xgrammar
  // strict mode); an object schema with no properties at all still admits any keys.
  bool strict = true;
  // Whitespace between tokens: any run of [ \t\n] when true, none when false (compact JSON).
  bool any_whitespace = true;
  // With any_whitespace: at most this many whitespace characters between two tokens (-1: no
  // bound). 1 admits compact JSON and json.dumps' ", " / ": " but not a run a small model can
  // loop in until max_tokens (xgrammar's max_whitespace_cnt).
  int max_whitespace = -1;
  // The keywords that constrain in ways a grammar cannot express (not, if/then/else, uniqueItems,
  // patternProperties, a multipleOf with far bounds, ...) are ignored instead of refused: the grammar then admits
  // a superset of the schema's values, never fewer -- an object with keywords that may admit more
  // keys (patternProperties, unevaluatedProperties, dependentSchemas, dependencies, if/then/else)
  // admits any further keys. For tool parameters (the tools' schemas come from their authors,
  // e.g. MCP servers, and the grammar only guides the call), not for a response_format the
  // client asked to be held to.
  bool lenient = false;
};

// Properties are generated in the schema's key order: pass the text or an ordered_json (a plain
// nlohmann::json has already sorted its keys).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opt = {});
Grammar json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& opt = {});
// Parses the schema text first (a syntax error is an InvalidRequest too).
Grammar json_schema_grammar(std::string_view schema_json, const JsonSchemaOptions& opt = {});
// The regex (add_regex's subset, whole-string) of a string `format` this grammar enforces (date,
// time, date-time, duration, uuid, email, hostname, ipv4, ipv6, uri); nullptr for any other
// (an annotation). Shared with the tool grammars' raw text values.
const std::string* string_format_regex(std::string_view format);
// A string's raw text (not a JSON string: no quotes, no escapes) matching `pattern` as a whole,
// with minLength / maxLength (-1: none) held as beside a JSON string's pattern where exact and
// dropped where not (lenient); `not_in_open_classes` as in add_regex. For text-valued tool
// parameters (the XML-style tool-call formats). Throws InvalidRequest for a pattern the regex
// subset cannot express.
Grammar raw_string_grammar(std::string_view pattern, int64_t min_length, int64_t max_length,
                           const Ranges& not_in_open_classes = {});
// Any JSON object (response_format: json_object) / any JSON value.
Grammar json_object_grammar(const JsonSchemaOptions& opt = {});
Grammar json_value_grammar(const JsonSchemaOptions& opt = {});

}  // namespace ts::grammar
