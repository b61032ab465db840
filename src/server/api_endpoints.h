// The endpoints beside /v1/completions and /v1/chat/completions, routed here by HttpServer:
//   POST /tokenize, POST /detokenize (vLLM shapes), GET /version,
//   POST /v1/embeddings (OpenAI; pooled final hidden states of the served model),
//   POST /v1/responses, GET|DELETE /v1/responses/{id} (OpenAI Responses API; previous_response_id
//   from an in-memory LRU store, ResponseStore),
//   POST /v1/messages, POST /v1/messages/count_tokens (Anthropic Messages API; its error shape).
// Threading: handle_inline() on an I/O thread (cheap routes only); prepare() on a worker (JSON,
// chat template, tokenisation, submit); the producers then run on the connection's strand,
// woken by the engine (Stream::set_notify), exactly like the chat/completions producers.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/backend.h"
#include "server/chat_template.h"
#include "server/http/transport.h"
#include "server/metrics.h"
#include "server/output_parsers.h"
#include "server/protocol.h"
#include "server/response_store.h"

namespace ts::server {

// One count of ServerMetrics::queued_requests (what --max-queued-requests bounds), held from
// admission until the request's first token or its end.
class QueueHold {
 public:
  QueueHold() = default;
  explicit QueueHold(std::atomic<int64_t>* q) : q_(q) {}
  QueueHold(QueueHold&& o) noexcept : q_(std::exchange(o.q_, nullptr)) {}
  QueueHold& operator=(QueueHold&& o) noexcept {
    release();
    q_ = std::exchange(o.q_, nullptr);
    return *this;
  }
  ~QueueHold() { release(); }
  void release() {
    if (q_) --*q_;
    q_ = nullptr;
  }

 private:
  std::atomic<int64_t>* q_ = nullptr;
};

// Tools without --tool-call-parser use the hermes syntax (<tool_call>{...}</tool_call>): the
// most common template convention, and with tool_choice required/named the grammar makes the
// model write exactly that, so calls always come back parsed instead of tools being dropped.
ToolCallParser::Kind tool_call_kind(ToolCallParser::Kind configured);

// The request's output constraint from its tool_choice, for every endpoint that takes tools
// (chat completions, /v1/messages, /v1/responses): required / named force tool-call syntax whose
// arguments follow the tool's schema (tool_call_structured, output_parsers.h); auto with tools
// (and `auto_grammar`, --tool-choice-auto-grammar) enforces a call the model starts (a triggered
// grammar). With a reasoning parser the grammar (of any kind) starts after the reasoning block.
// Whatever constraint results (also response_format's) goes into cr.params.structured.
// `special_markers`: the tool-call markers the served tokenizer has as special tokens
// (special_tool_markers): the grammar writes those as that one token.
void apply_tool_choice(ChatRequest& cr, ToolCallParser::Kind configured, ReasoningParser::Kind rk, bool auto_grammar,
                       const std::vector<std::string>& special_markers = {});

// The markers of tool-call parser `configured` (tool_call_kind: none is hermes) that backend `b`'s
// tokenizer encodes as one special token.
std::vector<std::string> special_tool_markers(const Backend& b, ToolCallParser::Kind configured);

// skip_special_tokens for a chat request's text: the request's (default true), and false when the
// request's parsers (reasoning `rk`, tool calls `tk`: none unless it has tools) have a marker that the
// served tokenizer encodes as one special token (parser_markers, output_parsers.h): left out of the
// text, the marker would never reach the parser.
bool chat_skip_special(const Backend& b, const ChatRequest& cr, ReasoningParser::Kind rk, ToolCallParser::Kind tk);

struct ApiEndpointsOptions {
  std::string served_model_name;
  ReasoningParser::Kind rkind = ReasoningParser::Kind::none;
  ToolCallParser::Kind tkind = ToolCallParser::Kind::none;
  bool tool_choice_auto_grammar = true;  // --tool-choice-auto-grammar
  size_t responses_store_size = 1024;  // --responses-store-size
  bool mean_pooling = false;           // --embedding-pooling mean (else last)
};

class ApiEndpoints {
 public:
  ApiEndpoints(ApiEndpointsOptions o, ServerMetrics& m, const ChatTemplates& templates)
      : o_(std::move(o)), metrics_(m), templates_(templates), store_(o_.responses_store_size) {}

  // Routes answered on the I/O thread: GET /version, GET|DELETE /v1/responses/{id}. True when
  // `req` is one of them (`out` filled, 404/405 included).
  bool handle_inline(const http::Request& req, http::Result& out);
  // Routes that need a worker (admitted like generation requests): true for their paths.
  static bool is_prepared_route(const std::string& path);
  // Methods those routes accept ("POST").
  static bool method_ok(const http::Request& req) { return req.method == "POST"; }
  // On a worker; never throws (errors are replies in the route's own shape).
  http::Result prepare(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi, QueueHold hold);
  // The error reply in the route's shape (Anthropic's on /v1/messages, else OpenAI's).
  static http::Reply error_for(const std::string& path, int status, const std::string& msg, const std::string& param = "",
                               const std::string& code = "");
  ResponseStore& store() { return store_; }

 private:
  http::Result tokenize(const http::Request& req, Backend& b, const ModelInfo& mi);
  http::Result detokenize(const http::Request& req, Backend& b, const ModelInfo& mi);
  http::Result embeddings(const http::Request& req, Backend& b, const ModelInfo& mi);
  http::Result messages(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi, QueueHold hold);
  http::Result count_tokens(const http::Request& req, Backend& b, const ModelInfo& mi);
  http::Result responses(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi, QueueHold hold);

  ApiEndpointsOptions o_;
  ServerMetrics& metrics_;
  const ChatTemplates& templates_;
  ResponseStore store_;
};

}  // namespace ts::server
