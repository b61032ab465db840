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
  // Incremental parsing (ToolCallParser::set_incremental): a call arrives as its head (id, name,
  // arguments so far) and then fragments (continuation: only `arguments`, to append to the
  // last head's); the fragments concatenate to the arguments' JSON text.
  bool continuation = false;
  // A head whose arguments are still streaming (`arguments` is only their first part, not yet
  // JSON); false for a call that arrived complete.
  bool streaming_head = false;
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
  // hermes: a call whose text opens as {"name": "N", "arguments": { is returned as soon as that
  // head is complete and its arguments then stream as continuation fragments (OpenAI's streamed
  // tool_calls shape). The call is then committed: a call that later fails to parse is not
  // turned back into content. Other shapes (keys in another order) wait for the close tag.
  void set_incremental(bool on) { incremental_ = on; }

 private:
  void emit_text(std::string_view s, std::string& content);
  void close_call(std::string& content, std::vector<ToolCall>& calls, bool closed);
  // Incremental: 1 = head parsed (emits it), 0 = need more text, -1 = not this shape.
  int try_head(std::vector<ToolCall>& calls);
  void stream_args(std::vector<ToolCall>& calls);  // emits buf_ from args_pos_ up to the value's end
  enum class State { text, call, start, json };
  Kind kind_;
  State state_;
  std::string buf_, ws_;
  int ncalls_ = 0;
  bool incremental_ = false;
  // The current call (incremental): head emitted, how far buf_ was emitted, the value's scan state.
  bool streaming_ = false, head_failed_ = false, args_done_ = false;
  size_t args_pos_ = 0;
  int depth_ = 0;
  bool in_str_ = false, esc_ = false;
};

// Both parsers chained: reasoning first, the content then goes through the tool parser.
class ChatOutputParser {
 public:
  ChatOutputParser(ReasoningParser::Kind r, ToolCallParser::Kind t) : reasoning_(r), tools_(t) {}
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  bool has_tool_calls() const { return tools_.num_calls() > 0; }
  void set_incremental_tool_calls(bool on) { tools_.set_incremental(on); }

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

// tool_choice auto: a triggered grammar (StructuredRequest::trigger). hermes: free text until the
// model writes <tool_call>, then the call must be "\n" + {"name": N, "arguments": ARGS} (N one of
// `tools`, ARGS following its schema) + "\n</tool_call>"; then free text again (`parallel`) or the
// end. llama3: when the output starts with "{" (after whitespace) the whole output must be the
// calls of tool_call_structured (then only the end); any other start is free text.
std::shared_ptr<StructuredRequest> tool_call_triggered(const nlohmann::ordered_json& tools, bool parallel,
                                                       ToolCallParser::Kind kind = ToolCallParser::Kind::hermes);

// Parses one tool-call JSON object ({"name", "arguments"|"parameters"}) into `call` (id left
// empty); false when it is not one.
bool parse_tool_call_json(std::string_view text, ToolCall& call);

}  // namespace ts::server
