// The OpenAI-compatible HTTP server on the event-driven front door (server/http/transport.h).
// It listens before the model is loaded: /health answers 503 until set_backend() is called,
// then 200. Routes:
//   POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
//   GET /health, GET /metrics; and (server/api_endpoints.h) /tokenize, /detokenize, /version,
//   /v1/embeddings, /v1/responses, /v1/messages. With an API key every route but /health and
//   /metrics needs it (401). Unknown route -> 404, wrong method -> 405, limits
//   (http::HttpLimits) -> 4xx; every error body is OpenAI-shaped.
// /health, /metrics and /v1/models answer on the I/O threads; generation requests are admitted
// there (--max-queued-requests, else 503), prepared (JSON, chat template, tokenisation, submit)
// on a small worker pool, then streamed from the engine's Streams without any waiting thread.
// A client that goes away, streaming or not, cancels its streams (the engine aborts them).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/backend.h"
#include "server/chat_template.h"
#include "server/metrics.h"
#include "server/output_parsers.h"
#include "server/http/limits.h"
#include "server/protocol.h"

namespace ts::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                 // 0: any free port (see HttpServer::port())
  std::string model_path;           // the model directory (for chat templates)
  std::string served_model_name;    // defaults to model_path
  std::string chat_template_file;   // --chat-template
  std::string tool_call_parser;     // --tool-call-parser
  // --tool-choice-auto-grammar: tool_choice auto (hermes syntax) enforces the call's grammar
  // from the model's <tool_call> on (free text before and after).
  bool tool_choice_auto_grammar = true;
  std::string reasoning_parser;     // --reasoning-parser
  size_t max_request_bytes = 32u << 20;  // -> limits.max_body_bytes
  int http_threads = 2;             // I/O threads (every connection is served by these)
  int http_workers = 2;             // request preparation (template, tokenisation) threads
  double drain_timeout_s = 30;      // stop(): in-flight requests get this long to finish
  http::HttpLimits limits;          // max_body_bytes is taken from max_request_bytes
  std::string api_key;              // --api-key / TOKENSPEED_API_KEY: required on every route but /health, /metrics
  size_t responses_store_size = 1024;  // --responses-store-size: stored /v1/responses (LRU; 0: none)
  std::string embedding_pooling = "last";  // --embedding-pooling last | mean
};

class HttpServer {
 public:
  // Validates the parser names and loads the chat template (throws ts::Error).
  explicit HttpServer(ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void bind();                 // throws ts::Error when host:port cannot be bound
  int port() const { return port_; }
  void run();                  // serves until stop() has drained; call after bind()
  // Thread-safe: stops accepting, closes idle connections, lets in-flight requests finish for
  // drain_timeout_s, then ends the rest (streams get an error event and [DONE], others 503).
  void stop();
  bool running() const;        // run() is accepting connections
  void set_backend(std::shared_ptr<Backend> backend);  // the model is ready
  bool ready() const;
  ServerMetrics& metrics() { return metrics_; }

 private:
  struct Impl;
  ServerMetrics metrics_;  // before impl_: the transport counts into it until it is gone
  ServerOptions opts_;
  int port_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::server
