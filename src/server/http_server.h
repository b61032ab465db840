// The OpenAI-compatible HTTP server (cpp-httplib). It listens before the model is loaded:
// /health answers 503 until set_backend() is called, then 200. Routes:
//   POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
//   GET /health, GET /metrics. Unknown route -> 404, wrong method -> 405, body over
//   max_request_bytes -> 413; every error body is OpenAI-shaped.
// Each generation request holds one HTTP worker thread while it waits on its Stream(s); a
// streaming client that goes away cancels its streams so the engine frees their KV blocks.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/backend.h"
#include "server/chat_template.h"
#include "server/metrics.h"
#include "server/output_parsers.h"
#include "server/protocol.h"

namespace httplib {
struct Request;
struct Response;
}

namespace ts::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                 // 0: any free port (see HttpServer::port())
  std::string model_path;           // the model directory (for chat templates)
  std::string served_model_name;    // defaults to model_path
  std::string chat_template_file;   // --chat-template
  std::string tool_call_parser;     // --tool-call-parser
  std::string reasoning_parser;     // --reasoning-parser
  size_t max_request_bytes = 32u << 20;
  int http_threads = 256;           // connections beyond this queue (never rejected)
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
  void run();                  // serves until stop(); call after bind()
  void stop();                 // thread-safe; makes run() return, cancels in-flight streams
  bool running() const;        // run() is accepting connections
  void set_backend(std::shared_ptr<Backend> backend);  // the model is ready
  bool ready() const;
  ServerMetrics& metrics() { return metrics_; }

 private:
  void handle_completions(std::shared_ptr<Backend> b, const httplib::Request& req, httplib::Response& res);
  void handle_chat(std::shared_ptr<Backend> b, const httplib::Request& req, httplib::Response& res);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerOptions opts_;
  int port_ = 0;
  ServerMetrics metrics_;
};

}  // namespace ts::server
