// Chat output parsing: reasoning (<think>…</think>) and tool calls, incrementally.
// Every parser is a push parser: feed() text pieces as the engine streams them (split anywhere,
// even inside a tag), finish() at the end. Streaming and non-streaming use the same code, so the
// concatenated streamed deltas always equal the non-streamed message.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ts {
struct StructuredRequest;
}

namespace ts::server {

struct ToolCall {
  std::string id;         // "call_…"
  std::string name;
  std::string arguments;  // a JSON string
};

// One step of parsed output: any of the three may be empty.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// --reasoning-parser: qwen3 (reasoning only when the output opens with <think>), deepseek-r1
// (the template opens <think>, so the output starts inside the reasoning; a leading <think> is
// dropped). Text after </think> is content.
class ReasoningParser {
 public:
  enum class Kind { none, qwen3, deepseek_r1 };
  static Kind kind_from_name(const std::string& name);  // "", qwen3, deepseek-r1 (throws otherwise)
  explicit ReasoningParser(Kind k = Kind::none);
  void feed(std::string_view text, std::string& reasoning, std::string& content);
  void finish(std::string& reasoning, std::string& content);

 private:
  enum class State { start, reasoning, content };
  Kind kind_;
  State state_;
  std::string buf_;  // held back: a possible prefix of a tag
};

// --tool-call-parser: hermes | qwen | qwen25 (<tool_call>{"name", "arguments"}</tool_call>, any
// number, content around them kept), llama3 | llama3_json (the whole output is one or more
// {"name", "parameters"} objects separated by ';', optionally after <|python_tag|>).
// Text that looks like a call but does not parse is returned as content, unchanged.
class ToolCallParser {
 public:
  enum class Kind { none, hermes, llama3 };
  static Kind kind_from_name(const std::string& name);  // throws on an unknown name
  explicit ToolCallParser(Kind k = Kind::none);
  void feed(std::string_view text, std::string& content, std::vector<ToolCall>& calls);
  void finish(std::string& content, std::vector<ToolCall>& calls);
  int num_calls() const { return ncalls_; }

 private:
  void emit_text(std::string_view s, std::string& content);
  void close_call(std::string& content, std::vector<ToolCall>& calls, bool closed);
  enum class State { text, call, start, json };
  Kind kind_;
  State state_;
  std::string buf_, ws_;
  int ncalls_ = 0;
};

// Both parsers chained: reasoning first, the content then goes through the tool parser.
class ChatOutputParser {
 public:
  ChatOutputParser(ReasoningParser::Kind r, ToolCallParser::Kind t) : reasoning_(r), tools_(t) {}
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  bool has_tool_calls() const { return tools_.num_calls() > 0; }

 private:
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

// tool_choice required / named, enforced by grammar: the output must be the tool-call syntax of
// `kind` (hermes: <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>, one or more
// separated by a newline; llama3: {"name": "N", "parameters": ARGS}, several joined by "; ")
// calling one of `tools` (an OpenAI tools array) -- or only `only_name` when not empty -- with
// ARGS following the tool's parameters schema (compact JSON; any object when it has none).
// `parallel` false: exactly one call. An invalid parameters schema is a 400 naming the tool.
std::shared_ptr<StructuredRequest> tool_call_structured(const nlohmann::ordered_json& tools, const std::string& only_name,
                                                        bool parallel, ToolCallParser::Kind kind);

// Parses one tool-call JSON object ({"name", "arguments"|"parameters"}) into `call` (id left
// empty); false when it is not one.
bool parse_tool_call_json(std::string_view text, ToolCall& call);

}  // namespace ts::server
