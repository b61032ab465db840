// The API surfaces beside OpenAI's chat/completions: vLLM's /tokenize and /detokenize, the
// OpenAI Responses API (/v1/responses), the Anthropic Messages API (/v1/messages), /v1/embeddings,
// and the --api-key check. Pure functions (no HTTP, no model), unit-tested in
// tests/unit/server/api_protocol_test.cpp.
//
// Responses and Messages run through the chat pipeline: their bodies are translated into an
// OpenAI chat-completions body (messages, tools, tool_choice, sampling fields) that
// parse_chat_request() validates like any chat request, and the parsed output (ChatDelta:
// reasoning, content, tool calls) is written back in the API's own shapes here.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/output_parsers.h"
#include "server/protocol.h"

namespace ts::server {

inline constexpr const char* kTokenspeedVersion = "0.1.0";

// --- --api-key -------------------------------------------------------------------------------------
// True when `headers` carry the key: "Authorization: Bearer KEY" (any case of the scheme and the
// header name) or "x-api-key: KEY" (Anthropic clients). An empty key accepts everything.
bool api_key_ok(const std::vector<std::pair<std::string, std::string>>& headers, const std::string& key);
// Routes that stay open with --api-key (probes and scrapers): /health, /metrics.
bool api_key_exempt(const std::string& path);

// --- /tokenize, /detokenize (vLLM) -------------------------------------------------------------------
struct TokenizeRequest {
  bool chat = false;            // messages (rendered with the chat template) instead of prompt
  std::string prompt;           // !chat
  // chat: an OpenAI chat body (messages, tools, chat_template_kwargs, add_generation_prompt,
  // continue_final_message)
  Json chat_body;
  bool add_special_tokens = true;  // prompt: default true; messages: default false (vLLM)
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize_request(const Json& body, const ModelInfo& info);
// {"count", "max_model_len", "tokens", "token_strs"}.
Json tokenize_response(const std::vector<int32_t>& ids, int64_t max_model_len, const std::vector<std::string>* strs);
// "tokens": a list of ids in the vocabulary.
std::vector<int32_t> parse_detokenize_request(const Json& body, const ModelInfo& info);

// --- /v1/embeddings ------------------------------------------------------------------------------------
struct EmbeddingsRequest {
  std::vector<std::vector<int32_t>> inputs;  // one token list per input
  bool base64 = false;                       // encoding_format
  std::optional<int64_t> dimensions;         // keep the first `dimensions` values (then renormalize)
};
// input: a string, a list of strings, a list of ids, or a list of id lists; each non-empty and
// within the context. encoding_format: float | base64. dimensions >= 1.
EmbeddingsRequest parse_embeddings_request(const Json& body, const ModelInfo& info, const EncodeFn& encode);
// Truncates to `dims` (when set; larger than the vector: 400) and L2-normalizes in place.
void finish_embedding(std::vector<float>& v, std::optional<int64_t> dims);
// A float list, or base64 of the little-endian f32 bytes (OpenAI's encoding_format=base64).
Json embedding_value(const std::vector<float>& v, bool base64);
std::string base64_encode(const void* data, size_t n);

// --- prompt logprobs (/v1/completions) ---------------------------------------------------------------
// echo with logprobs: the prompt's tokens with their real logprobs (the first token has none:
// null, as OpenAI answers) and `top` alternatives. lps[i] scores ids[i + 1].
void add_prompt_logprobs(CompletionLogprobs& L, const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps,
                         int top, const std::function<std::string(int32_t)>& piece, size_t& offset);
// vLLM's prompt_logprobs: one entry per prompt token, null for the first, else
// {"<id>": {"logprob", "rank", "decoded_token"}} for the prompt token and the top `top`.
Json vllm_prompt_logprobs(const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps,
                          const std::vector<int32_t>& ranks, int top, const std::function<std::string(int32_t)>& piece);

// --- /v1/messages (Anthropic) ------------------------------------------------------------------------
// The Messages body as an OpenAI chat body: system -> a system message; user content blocks
// (text, tool_result -> tool messages), assistant blocks (text, tool_use -> tool_calls, thinking
// dropped); tools {name, description, input_schema} -> function tools; tool_choice auto|any|tool|none;
// stop_sequences -> stop; max_tokens (required), temperature, top_p, top_k, stream.
Json anthropic_to_chat(const Json& body);
// {"type": "error", "error": {"type", "message"}}.
Json anthropic_error(int status, const std::string& message);
// end_turn | max_tokens | stop_sequence | tool_use.
const char* anthropic_stop_reason(FinishReason r, bool tool_calls, bool stop_sequence);
// Content blocks of a finished output: thinking, text, tool_use (input parsed from the arguments).
Json anthropic_content(const ChatDelta& all, const std::string& tool_id_prefix = "toolu_");
// The tool-call arguments (a JSON text) as an object; text that does not parse -> {}.
Json arguments_object(const std::string& arguments);

// --- /v1/responses (OpenAI Responses API) --------------------------------------------------------------
// Translates a Responses body into an OpenAI chat body. `history`: the conversation before this
// request (previous_response_id's stored messages, chat form; empty array: none). `input` is a
// string (one user message) or items: messages {role, content: string | input_text/output_text
// parts}, function_call {call_id, name, arguments}, function_call_output {call_id, output};
// reasoning items are dropped. instructions -> a leading system message (not carried over);
// tools [{type: function, name, description, parameters}] -> chat tools; max_output_tokens ->
// max_tokens; text.format -> response_format.
// `conversation` receives the messages without the instructions (what a follow-up continues).
Json responses_to_chat(const Json& body, const Json& history, Json& conversation);
// The output items of a finished response (reasoning, message, function calls; ids minted) and
// the assistant messages (chat form) that continue the conversation.
struct ResponsesOutput {
  Json items = Json::array();
  Json messages = Json::array();
};
ResponsesOutput responses_output(const ChatDelta& all);
// The response object (status completed | incomplete | in_progress), echoing the request's
// settings (instructions, tools, tool_choice, temperature, top_p, max_output_tokens, store...).
Json response_object(const std::string& id, int64_t created, const std::string& model, const Json& body,
                     const Json& output, const std::string& status, const Usage* usage);

// "event: NAME\ndata: {json}\n\n" (the Responses and Messages APIs name every event).
std::string sse_event(const std::string& name, const Json& j);

}  // namespace ts::server
