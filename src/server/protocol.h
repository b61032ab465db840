// OpenAI wire protocol: request validation (JSON -> GenerateParams) and response builders.
// Pure functions, no HTTP and no model: everything here is unit-tested without a model
// (tests/unit/server). Requests are parsed as ordered_json so that key order survives into chat
// templates (tojson) and responses keep OpenAI's field order.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "runtime/structured.h"

namespace ts::server {

using Json = nlohmann::ordered_json;

// An error the client sees as {"error": {"message", "type", "param", "code"}} with `status`.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param, code;
};

// {"error": {...}}; type is derived from the status (invalid_request_error, not_found_error, ...).
Json error_body(int status, const std::string& message, const std::string& param = "",
                const std::string& code = "");
// Serializes for the wire: compact, invalid UTF-8 replaced (never throws).
std::string dump(const Json& j);

// Parses a request body: malformed JSON or invalid UTF-8 -> 400; a non-object body -> 400;
// nesting deeper than max_json_depth() -> 400 (checked before parsing).
Json parse_body(const std::string& body);

// The nesting limit for request JSON (bodies and tool-call arguments); serve --max-json-depth.
void set_max_json_depth(int depth);
int max_json_depth();
// Json::parse after the depth pre-scan; a too-deep text -> ApiError 400 naming `what`.
Json parse_json_limited(const std::string& text, const char* what);

// Typed optional getters: absent or null -> nullopt; a wrong type -> ApiError 400 naming `key`.
std::optional<int64_t> get_int(const Json& o, const char* key);
std::optional<double> get_number(const Json& o, const char* key);
std::optional<bool> get_bool(const Json& o, const char* key);
std::optional<std::string> get_string(const Json& o, const char* key);

// What the server knows about the served model (fixed after load).
struct ModelInfo {
  std::string served_name;   // the name clients send as "model"
  std::string model_path;    // also accepted as "model"
  int64_t context_length = 0;
  int64_t vocab_size = 0;
};

// "model" absent/empty -> ok (the served model); a known name -> ok; otherwise 404 model_not_found.
void check_model(const Json& body, const ModelInfo& info);

// Sampling fields shared by /v1/completions and /v1/chat/completions (not max_tokens/n/logprobs):
// temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, presence_penalty,
// frequency_penalty, repetition_penalty. Range errors -> 400 naming the field.
void parse_sampling(const Json& body, GenerateParams& p, int64_t vocab_size);

// --- structured outputs and logits constraints (#18 item 3) ----------------------------------
// The output-constraining fields, at most one of: response_format {type: json_object |
// json_schema {schema, strict} | text}; vLLM's structured_outputs {json | regex | choice |
// grammar | json_object} and the legacy guided_json / guided_regex / guided_choice /
// guided_grammar; SGLang's json_schema / regex / ebnf. Null when none is given. The grammar is
// built (validated) here: an invalid schema, regex or grammar is a 400 naming the field.
// JSON is generated compact (no whitespace between tokens: small models otherwise loop on it).
std::shared_ptr<StructuredRequest> parse_structured(const Json& body);
// logit_bias {"<token id>": bias in [-100, 100]} (ids checked against the vocabulary) and
// min_tokens (>= 0): into p.logit_bias / p.min_tokens. Called by parse_sampling.
void parse_logit_constraints(const Json& body, GenerateParams& p, int64_t vocab_size);

// max_tokens, or `alt` (max_completion_tokens), which wins when both are present (OpenAI deprecates
// max_tokens for it); must be > 0 when present.
std::optional<int64_t> parse_max_tokens(const Json& body, const char* alt = nullptr);
// n >= 1 (and <= 128).
int parse_n(const Json& body);
// stream + stream_options.include_usage.
void parse_stream(const Json& body, bool& stream, bool& include_usage);

// prompt + max_tokens must fit: 400 "This model's maximum context length is C tokens. However,
// you requested T tokens (P in the prompt, M for the completion). ..."
void check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context_length,
                   const char* what = "prompt");

// Token ids must lie in [0, vocab).
void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const char* param);

// --- /v1/completions ---------------------------------------------------------------------
struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;   // the prompt text (decoded from ids when the client sent ids)
  bool from_text = false;
};

struct CompletionRequest {
  std::vector<PromptInput> prompts;  // batch: one choice group per prompt
  GenerateParams params;             // prompt left empty: one copy per prompt and n
  int n = 1;
  bool echo = false, stream = false, include_usage = false;
  int logprobs = -1;                 // -1: none
  bool include_stop_str = false;     // include_stop_str_in_output (vLLM)
  bool skip_special_tokens = true;   // skip_special_tokens (vLLM): special tokens' text left out
  int prompt_logprobs = -1;          // prompt_logprobs (vLLM; -1: none); echo + logprobs also needs them
};

using EncodeFn = std::function<std::vector<int32_t>(const std::string&)>;
using DecodeFn = std::function<std::string(const std::vector<int32_t>&)>;

// Validates everything, tokenizes string prompts with `encode` and decodes id prompts with
// `decode` (for echo), checks the context and the vocabulary.
CompletionRequest parse_completion_request(const Json& body, const ModelInfo& info,
                                           const EncodeFn& encode, const DecodeFn& decode);

// --- /v1/chat/completions ------------------------------------------------------------------
enum class ToolChoice { none, auto_, required, named };

struct ChatRequest {
  Json messages = Json::array();   // normalized: content parts joined to strings, arguments as objects
  Json tools;                      // null or array (validated)
  ToolChoice tool_choice = ToolChoice::auto_;
  std::string tool_choice_name;    // for ToolChoice::named
  Json template_kwargs = Json::object();
  // vLLM's add_generation_prompt (default true) and continue_final_message (the final message
  // left open for the model to continue: ChatTemplates::render; /v1/messages sets it when the
  // last message is the assistant's, Anthropic's prefill).
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  GenerateParams params;
  std::optional<int64_t> max_tokens;
  int n = 1;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool include_stop_str = false;   // include_stop_str_in_output (vLLM)
  // skip_special_tokens (vLLM): special tokens' text left out; the server also keeps them where a
  // parser's markers are special tokens (chat_skip_special, api_endpoints.h).
  bool skip_special_tokens = true;
  bool parallel_tool_calls = true;
  // response_format / structured_outputs / ...; tool_choice required|named (made by the HTTP
  // layer, which knows the tool-call parser: tool_call_structured in output_parsers.h).
  std::shared_ptr<StructuredRequest> structured;
};

// Validates messages (roles, content), tools, tool_choice, parallel_tool_calls,
// response_format and the other structured-output fields (parse_structured),
// chat_template_kwargs and the sampling fields. Tokenization happens later.
ChatRequest parse_chat_request(const Json& body, const ModelInfo& info);

// --- responses -----------------------------------------------------------------------------
// "cmpl-…", "chatcmpl-…", "call_…": prefix + 24 random alphanumerics.
std::string random_id(const std::string& prefix);
int64_t unix_time();
const char* finish_reason_str(FinishReason r);  // null-able: none -> "" (caller writes null)

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
Json usage_json(const Usage& u);

// Characters (Unicode code points) in UTF-8 text: the unit of text_offset (OpenAI's and vLLM's
// offsets are Python string indices).
size_t text_chars(std::string_view s);

// Legacy completions logprobs object built incrementally (one per choice).
struct CompletionLogprobs {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       text_offset = Json::array();
  // Appends tokens; `offset` is the character offset of the first one in the choice text, advanced.
  void add(const std::vector<TokenLogprob>& lps, const std::function<std::string(int32_t)>& piece,
           size_t& offset);
  // Prompt tokens (echo): null logprobs.
  void add_prompt(const std::vector<int32_t>& ids, const std::function<std::string(int32_t)>& piece,
                  size_t& offset);
  Json to_json() const;
};

// Chat logprobs content entries [{token, logprob, bytes, top_logprobs: [...]}]; `bytes` from
// raw_bytes (the token's own bytes: Backend::token_bytes) where given, else the piece's UTF-8.
Json chat_logprobs_content(const std::vector<TokenLogprob>& lps, int top,
                           const std::function<std::string(int32_t)>& piece,
                           const std::function<std::string(int32_t)>& raw_bytes = nullptr);

}  // namespace ts::server
