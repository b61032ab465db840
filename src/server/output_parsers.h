// Chat output parsing: reasoning (<think>…</think>) and tool calls, incrementally.
// Every parser is a push parser: feed() text pieces as the engine streams them (split anywhere,
// even inside a tag), finish() at the end. Streaming and non-streaming use the same code, so the
// concatenated streamed deltas always equal the non-streamed message.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ts {
struct StructuredRequest;
}

namespace ts::server {

struct ChatRequest;
class ToolCallFormat;  // tool_parsers.h

// What a parser may know of the request: its tools (the XML-style formats -- qwen3_coder, glm45,
// minimax_m2 -- carry argument values as text and type them by the tool's parameter schema; without
// it a value that parses as JSON is that JSON, any other a string) and chat_template_kwargs'
// thinking / enable_thinking (deepseek_v3, kimi_k2 and glm45 reasoning follow it, as vLLM's do).
struct ParseContext {
  std::shared_ptr<const nlohmann::ordered_json> tools;  // an OpenAI tools array, or null
  std::optional<bool> thinking;                         // unset: not given
};
ParseContext parse_context(const ChatRequest& cr);

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

// --reasoning-parser (vLLM's names):
//   qwen3         reasoning only when the output opens with <think>;
//   deepseek-r1 | deepseek_r1 | minimax_m2
//                 the template opened <think>: the output starts inside the reasoning (a leading
//                 <think> is dropped);
//   deepseek_v3   deepseek_r1 when chat_template_kwargs thinking / enable_thinking is true, else
//                 no reasoning (all content), as vLLM decides;
//   glm45         qwen3's rule, leading whitespace allowed before <think>;
//   kimi_k2       deepseek_r1's rule (unless thinking is false: all content); the reasoning also
//                 ends where <|tool_calls_section_begin|> starts (that marker stays content);
//   minimax_m2_append_think
//                 no reasoning: all content, "<think>" put back in front of it.
// Text after </think> is content.
class ReasoningParser {
 public:
  enum class Kind { none, qwen3, deepseek_r1, deepseek_v3, glm45, kimi_k2, minimax_m2, minimax_m2_append_think };
  static Kind kind_from_name(const std::string& name);  // throws on an unknown name
  explicit ReasoningParser(Kind k = Kind::none, std::optional<bool> thinking = std::nullopt);
  void feed(std::string_view text, std::string& reasoning, std::string& content);
  void finish(std::string& reasoning, std::string& content);
  // How the output starts (grammars skip the reasoning): content (no reasoning), think_tag (reasoning
  // only when the output opens with <think>), reasoning (inside it until </think>).
  enum class Start { content, think_tag, reasoning };
  Start start() const { return start_; }

 private:
  enum class State { start, reasoning, content };
  Start start_;
  State state_;
  bool skip_ws_ = false;          // glm45: whitespace may precede <think>
  bool prefix_pending_ = false;   // minimax_m2_append_think: "<think>" not yet put out
  std::string_view alt_end_;      // kimi_k2: a marker that also ends the reasoning (kept as content)
  std::string buf_;  // held back: a possible prefix of a tag
};

// --tool-call-parser (vLLM's names). Any number of calls, content around them kept; text that looks
// like a call but does not parse is returned as content, unchanged. Arguments are a JSON string.
//   hermes | qwen | qwen25   <tool_call>{"name": N, "arguments": {...}}</tool_call>
//   llama3 | llama3_json     the whole output is one or more {"name", "parameters"} objects
//                            separated by ';', optionally after <|python_tag|>
//   mistral        [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]  (tokenizers < v11), or
//                  [TOOL_CALLS]N{...}[TOOL_CALLS]N2{...}  (v11+, also N[ARGS]{...})
//   deepseek_v3    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v31   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   kimi_k2        <|tool_calls_section_begin|><|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
//   qwen3_coder    <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
//   glm45          <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>
//   minimax_m2     <minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>
// (qwen3_coder, glm45, minimax_m2: V is text, typed by the tool's schema: ParseContext.)
class ToolCallParser {
 public:
  enum class Kind { none, hermes, llama3, mistral, deepseek_v3, deepseek_v31, kimi_k2, qwen3_coder, glm45, minimax_m2 };
  static Kind kind_from_name(const std::string& name);  // throws on an unknown name
  explicit ToolCallParser(Kind k = Kind::none, std::shared_ptr<const nlohmann::ordered_json> tools = nullptr);
  void feed(std::string_view text, std::string& content, std::vector<ToolCall>& calls);
  void finish(std::string& content, std::vector<ToolCall>& calls);
  int num_calls() const { return ncalls_; }
  // hermes: a call whose text opens as {"name": "N", "arguments": { is returned as soon as that
  // head is complete and its arguments then stream as continuation fragments (OpenAI's streamed
  // tool_calls shape). The call is then committed: a call that later fails to parse is not
  // turned back into content. Other shapes (keys in another order) wait for the close tag.
  // The block formats likewise (ToolCallFormat::scan): a call's head once its name is complete,
  // then its arguments -- the JSON formats' object text as the model writes it, the text
  // formats' parameters one by one as each value closes ({"K": V, ...}); a block in a shape that
  // does not stream is returned whole at its end.
  void set_incremental(bool on) { incremental_ = on; }

 private:
  void emit_text(std::string_view s, std::string& content);
  // The block formats (fmt_): every kind but hermes and llama3.
  void feed_blocks(std::string& content, std::vector<ToolCall>& calls);
  void finish_blocks(std::string& content, std::vector<ToolCall>& calls);
  void take_block(std::string_view body, std::string_view raw, std::string& content, std::vector<ToolCall>& calls);
  void close_call(std::string& content, std::vector<ToolCall>& calls, bool closed);
  // Incremental block formats: emits what ToolCallFormat::scan finds in `body` beyond what this
  // block already emitted (new heads, argument fragments); false when scan fails.
  bool stream_block(std::string_view body, bool complete, std::vector<ToolCall>& calls);
  // The end of a block (`complete`: its close marker; else the output ended) that streamed calls.
  void end_streamed_block(std::string_view body, bool complete, std::vector<ToolCall>& calls);
  // Incremental: 1 = head parsed (emits it), 0 = need more text, -1 = not this shape.
  int try_head(std::vector<ToolCall>& calls);
  void stream_args(std::vector<ToolCall>& calls);  // emits buf_ from args_pos_ up to the value's end
  enum class State { text, call, start, json };
  Kind kind_;
  std::shared_ptr<const ToolCallFormat> fmt_;
  std::shared_ptr<const nlohmann::ordered_json> tools_;
  State state_;
  std::string buf_, ws_;
  size_t scanned_ = 0;  // block formats: buf_ searched for the close marker up to here
  // Block formats, incremental: the arguments text emitted so far of each call of this block;
  // scan_off_: this block does not stream (taken whole at its end, after the calls it streamed).
  std::vector<std::string> block_sent_;
  bool scan_off_ = false;
  int ncalls_ = 0;
  bool incremental_ = false;
  // The current call (incremental): head emitted, how far buf_ was emitted, the value's scan state.
  bool streaming_ = false, head_failed_ = false, args_done_ = false;
  size_t args_pos_ = 0;
  int depth_ = 0;
  bool in_str_ = false, esc_ = false;
};

// Every marker of the two kinds' syntaxes. Where the served tokenizer has one of them as a special
// token, the default skip_special_tokens would drop it from the text before the parser saw it
// (Mistral's [TOOL_CALLS], Kimi-K2's <|tool_calls_section_begin|>, GLM's <arg_key>): the server then
// keeps special tokens in that request's text (chat_skip_special, api_endpoints.h), as vLLM's
// mistral parser turns skip_special_tokens off for requests with tools.
std::vector<std::string> parser_markers(ReasoningParser::Kind r, ToolCallParser::Kind t);

// Both parsers chained: reasoning first, the content then goes through the tool parser.
class ChatOutputParser {
 public:
  ChatOutputParser(ReasoningParser::Kind r, ToolCallParser::Kind t, const ParseContext& ctx = {})
      : reasoning_(r, ctx.thinking), tools_(t, ctx.tools) {}
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  bool has_tool_calls() const { return tools_.num_calls() > 0; }
  void set_incremental_tool_calls(bool on) { tools_.set_incremental(on); }

 private:
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

// Whether tool_call_structured / tool_call_triggered have `kind`'s syntax: every kind but none.
bool has_tool_call_grammar(ToolCallParser::Kind kind);

// tool_choice required / named, enforced by grammar: the output must be the tool-call syntax of
// `kind` calling one of `tools` (an OpenAI tools array) -- or only `only_name` when not empty.
// `parallel` false: exactly one call; true: one or more, in the format's own repetition.
//   hermes        <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>, joined by "\n"
//   llama3        {"name": "N", "parameters": ARGS}, joined by "; "
//   mistral       [TOOL_CALLS][{"name": "N", "arguments": ARGS}, ...]  (a space may follow the marker;
//                 each object may end with the templates' , "id": "<9 alphanumerics>")
//   deepseek_v3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nARGS\n```<｜tool▁call▁end｜>
//                 ... (optionally "\n" between calls) <｜tool▁calls▁end｜>
//   deepseek_v31  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   kimi_k2       <|tool_calls_section_begin|><|tool_call_begin|>functions.N:IDX<|tool_call_argument_begin|>ARGS
//                 <|tool_call_end|>...<|tool_calls_section_end|>  (IDX 1-6 digits)
//   qwen3_coder   <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>, joined by "\n"
//   glm45         <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>, joined by "\n"
//   minimax_m2    <minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V</parameter>\n...</invoke>\n...
//                 </minimax:tool_call>
// ARGS follows the tool's parameters schema (any object when it has none): compact JSON for hermes
// and llama3, one optional space between tokens for the others (their templates write json.dumps'
// ", " / ": ").
// qwen3_coder, glm45, minimax_m2: the schema's properties in its order, required ones always,
// optional ones maybe, no others unless it admits them; each V such that the parser's typing
// (typed_param_value, tool_parsers.h) gives a value of the property's schema: string-typed ones any
// text without the format's closing tags (an enum's strings exactly; minLength / maxLength: that
// many characters, no '<'), the others the JSON grammar of the property's schema; a schema without
// "properties" admits any parameters with text values. JSON has at most one whitespace character
// between tokens (compact or json.dumps' style) in every format.
// An invalid parameters schema is a 400 naming the tool.
// `special_markers`: the format's markers that the served tokenizer has as one special token
// (special_tool_markers, api_endpoints.h): written as that token (grammar::special_token_bytes),
// which the model writes as one id; the others as text.
std::shared_ptr<StructuredRequest> tool_call_structured(const nlohmann::ordered_json& tools, const std::string& only_name,
                                                        bool parallel, ToolCallParser::Kind kind,
                                                        const std::vector<std::string>& special_markers = {});

// tool_choice auto: a triggered grammar (StructuredRequest::trigger). hermes: free text until the
// model writes <tool_call>, then the call must be "\n" + {"name": N, "arguments": ARGS} (N one of
// `tools`, ARGS following its schema) + "\n</tool_call>"; then free text again (`parallel`) or the
// end. llama3: when the output starts with "{" (after whitespace) the whole output must be the
// calls of tool_call_structured (then only the end); any other start is free text. The other
// kinds: the trigger is the block's open marker ([TOOL_CALLS], <｜tool▁calls▁begin｜>,
// <|tool_calls_section_begin|>, <minimax:tool_call>; <tool_call> for qwen3_coder and glm45, whose
// block is one call); the rest of that block is then tool_call_structured's (one call, or with
// `parallel` one or more), and after its close free text again (`parallel`) or the end.
std::shared_ptr<StructuredRequest> tool_call_triggered(const nlohmann::ordered_json& tools, bool parallel,
                                                       ToolCallParser::Kind kind = ToolCallParser::Kind::hermes,
                                                       const std::vector<std::string>& special_markers = {});

// Parses one tool-call JSON object ({"name", "arguments"|"parameters"}) into `call` (id left
// empty); false when it is not one.
bool parse_tool_call_json(std::string_view text, ToolCall& call);

}  // namespace ts::server
