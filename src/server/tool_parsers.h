// Tool-call syntaxes of the block formats (ToolCallParser kinds other than hermes and llama3), one
// small class per model family. A format is stateless: it names the marker that opens a block,
// finds where the block ends, and parses a complete block into calls. The push machine that feeds
// text through them (split anywhere, content around blocks, malformed blocks kept as content) is
// ToolCallParser's (output_parsers.cpp).
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "server/output_parsers.h"

namespace ts::server {

class ToolCallFormat {
 public:
  virtual ~ToolCallFormat() = default;
  // The marker that opens a block (dropped from the content).
  virtual std::string_view open() const = 0;
  // The marker that closes a block; empty when the block ends where its JSON does (mistral).
  virtual std::string_view close() const = 0;
  struct End {
    enum Status { more, found, bad } status = more;  // bad: not this syntax (the open marker is text)
    size_t body = 0;  // found: the body's length
    size_t next = 0;  // found: where the text after the block starts
  };
  // `text`: everything after the open marker so far; `from`: no close marker starts before it (the
  // text up to there was searched already). The default finds close().
  virtual End find_end(std::string_view text, size_t from) const;
  // A block's body (between the markers) into calls, ids left empty; false when it does not parse.
  // `tools`: the request's tools (null: unknown), for formats whose argument values are text.
  virtual bool parse(std::string_view body, const nlohmann::ordered_json* tools, std::vector<ToolCall>& out) const = 0;
  // Markers inside a block besides open() / close() (parser_markers, output_parsers.h).
  virtual std::vector<std::string_view> inner_markers() const { return {}; }

  // Incremental parsing (streamed tool calls). The calls of a block whose body so far is `body`
  // (`complete`: its close marker was found, or the output ended), in order, each from the moment
  // its name is complete, with a prefix of its arguments' final JSON text -- all of it when `done`.
  // Scanning a longer body gives each call's arguments as an extension of the shorter body's.
  // JSON formats: the model's object text as it is written; text formats: {"K": V, ...} built from
  // the parameters complete so far (typed as parse() types them), "}" when the call closes. False
  // when the text is not this syntax, or not in a shape that streams (a string-encoded arguments
  // value, mistral's keys in another order): the block is then taken whole at its end.
  struct PartialCall {
    std::string name, args;
    bool done = false;
  };
  virtual bool scan(std::string_view body, bool complete, const nlohmann::ordered_json* tools,
                    std::vector<PartialCall>& out) const = 0;
};

// Index past the JSON object or array that opens at s[i] ('{' or '['), string-aware; npos when the
// text ends first.
size_t json_value_end(std::string_view s, size_t i);

// The format of `kind`; null for none, hermes and llama3 (ToolCallParser's own code).
std::shared_ptr<const ToolCallFormat> tool_call_format(ToolCallParser::Kind kind);

// A parameter value written as text (qwen3_coder, glm45, minimax_m2) as JSON: typed by the tool's
// parameter schema when `tools` has it (string, integer, number, boolean, object / array, null),
// else JSON when it parses as JSON, else a string. Exposed for tests.
nlohmann::ordered_json typed_param_value(std::string_view text, const nlohmann::ordered_json* tools,
                                         std::string_view tool, std::string_view param);

// How typed_param_value types the text of a parameter whose property schema is `schema` (the forced-call
// grammars of those formats follow it): text -- the text itself is the (string) value (string-like
// types and typeless enums); json -- the trimmed text read as a number / boolean / JSON value
// (integer, number, boolean, object, array, ...); any -- no type named: JSON when it parses, else
// the text.
enum class ParamTyping { text, json, any };
ParamTyping param_typing(const nlohmann::ordered_json& schema);

}  // namespace ts::server
