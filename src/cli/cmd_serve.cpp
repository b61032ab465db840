// tokenspeed serve: the OpenAI-compatible HTTP server. It listens at once (GET /health is 503
// while the model loads, 200 once it serves) and stops cleanly on SIGINT/SIGTERM.
#include <sys/resource.h>

#include <csignal>
#include <pthread.h>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "server/api_endpoints.h"
#include "server/kv_events.h"
#include "server/output_parsers.h"
#include "core/log.h"
#include "server/http_server.h"
#include "server/protocol.h"

namespace {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"tokenspeed serve: OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, "
               "/v1/responses, /v1/messages, /v1/embeddings, /tokenize, /detokenize, /version, /health, /metrics)"};
  std::string model;
  ts::server::ServerOptions so;
  ts::EngineOptions eo;
  size_t max_request_bytes = so.max_request_bytes;
  ts::cli::add_model_arg(app, model);
  app.add_option("--host", so.host, "address to listen on")->capture_default_str();
  app.add_option("--port", so.port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  app.add_option("--served-model-name", so.served_model_name, "the model name clients use (default: MODEL as given, or pycoder)");
  app.add_option("--chat-template", so.chat_template_file, "Jinja chat template file (overrides the model's)");
  app.add_option("--tool-call-parser", so.tool_call_parser,
                 "hermes | qwen | qwen25 | llama3 | llama3_json | mistral | deepseek_v3 | deepseek_v31 | kimi_k2 | "
                 "qwen3_coder | glm45 | minimax_m2 (tool_choice required/named is grammar-enforced in each "
                 "format's syntax)");
  app.add_option("--reasoning-parser", so.reasoning_parser,
                 "qwen3 | deepseek-r1 | deepseek_v3 | glm45 | kimi_k2 | minimax_m2 | minimax_m2_append_think");
  app.add_option("--tool-choice-auto-grammar", so.tool_choice_auto_grammar,
                 "tool_choice auto: a call the model starts is grammar-enforced (a listed name, arguments following "
                 "its schema): hermes from <tool_call> to </tool_call>, llama3 when the output starts with '{', the "
                 "others from their block's open marker ([TOOL_CALLS], <tool_call>, ...) to its end; false: parsed "
                 "only")
      ->capture_default_str();
  // HTTP limits (ts::server::http::HttpLimits): every breach is an OpenAI-shaped 4xx or a closed
  // connection, counted in tokenspeed_http_limit_rejections_total{reason=...}.
  auto& lim = so.limits;
  app.add_option("--max-request-bytes", max_request_bytes, "largest request body, any transfer encoding (larger: 413)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  int max_json_depth = ts::server::max_json_depth();
  app.add_option("--max-json-depth", max_json_depth, "deepest JSON nesting accepted in a request (deeper: 400)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--max-header-bytes", lim.max_header_bytes, "largest request line + headers (larger: 431)")
      ->check(CLI::Range(size_t{256}, size_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-uri-bytes", lim.max_uri_bytes, "longest request target (longer: 414)")
      ->check(CLI::Range(size_t{16}, size_t{1} << 24))
      ->capture_default_str();
  app.add_option("--http-header-timeout", lim.header_timeout_s,
                 "seconds from a request's first byte to the end of its headers (slower: 408, closed)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--http-body-timeout", lim.body_timeout_s, "seconds to receive a request body (slower: 408, closed)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--http-idle-timeout", lim.idle_timeout_s, "seconds a keep-alive connection may wait for a request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connections", lim.max_connections, "open connections (beyond: 503, closed; 0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-connections-per-ip", lim.max_connections_per_ip,
                 "open connections per client address (beyond: 429, closed; 0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-queued-requests", lim.max_queued_requests,
                 "generation requests admitted and waiting for their first token (beyond: 503; 0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--drain-timeout", so.drain_timeout_s,
                 "on SIGTERM/SIGINT: seconds in-flight requests get to finish before they are ended")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--http-threads", so.http_threads, "HTTP I/O threads (they serve every connection)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--http-workers", so.http_workers,
                 "request preparation threads (JSON, chat template, tokenisation)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  std::string kv_events_json;
  app.add_option("--kv-events-config", kv_events_json,
                 "KV cache events for prefix-aware routers, vLLM's JSON, e.g. '{\"enable_kv_cache_events\": true, "
                 "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}' "
                 "(msgpack over ZMQ PUB; docs/DEPLOY.md)");
  app.add_option("--api-key", so.api_key,
                 "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /health and /metrics "
                 "(401 otherwise); default: $TOKENSPEED_API_KEY")
      ->envname("TOKENSPEED_API_KEY");
  app.add_option("--responses-store-size", so.responses_store_size,
                 "/v1/responses kept in memory for previous_response_id and GET /v1/responses/{id} (LRU; 0: none)")
      ->capture_default_str();
  app.add_option("--embedding-pooling", so.embedding_pooling, "/v1/embeddings: pool the final hidden states: last | mean")
      ->check(CLI::IsMember({"last", "mean"}))
      ->capture_default_str();
  ts::cli::add_engine_flags(app, eo);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ts::server::KvEventsConfig kv_events;
  if (!kv_events_json.empty()) {
    try {
      kv_events = ts::server::KvEventsConfig::parse(kv_events_json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
  }
  so.max_request_bytes = max_request_bytes;
  ts::server::set_max_json_depth(max_json_depth);
  ts::cli::resolve_model(model, eo);
  if (ts::cli::run_if_worker_node(eo)) return 0;  // --node-rank > 0: worker ranks, no HTTP
  so.model_path = eo.model_dir;
  if (so.served_model_name.empty()) so.served_model_name = model.empty() ? "pycoder" : model;

  // Thousands of client connections need as many descriptors: raise the soft limit to the hard one.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Signals: handled by one thread (sigwait), never asynchronously; a dead client never kills us.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  ts::server::HttpServer server(so);
  server.bind();
  spdlog::info("listening on http://{}:{} (model '{}' loading from {})", so.host, server.port(), so.served_model_name,
               eo.model_dir);

  std::thread([&server, set] {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("signal {}: shutting down", sig);
    server.stop();
  }).detach();

  std::shared_ptr<ts::server::Backend> backend;
  std::string load_error;
  std::thread loader([&] {
    try {
      auto t0 = std::chrono::steady_clock::now();
      // A forced tool call writes its format's markers; where the tokenizer has one as a special
      // token (Mistral's [TOOL_CALLS], DeepSeek's and Kimi's section markers) the grammar takes it.
      const auto markers = ts::server::parser_markers(
          ts::server::ReasoningParser::Kind::none,
          ts::server::tool_call_kind(ts::server::ToolCallParser::kind_from_name(so.tool_call_parser)));
      backend = ts::server::make_engine_backend(eo, kv_events, markers);
      server.set_backend(backend);
      spdlog::info("model ready in {:.2f}s: context {} tokens, vocab {}",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   backend->context_length(), backend->vocab_size());
    } catch (const std::exception& e) {
      load_error = e.what();
      spdlog::error("model load failed: {}", load_error);
      for (int i = 0; i < 1000 && !server.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      server.stop();
    }
  });
  server.run();
  loader.join();
  if (backend) backend->stop();
  if (!load_error.empty()) {
    std::fprintf(stderr, "error: %s\n", load_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
TS_COMMAND("serve", "OpenAI-compatible HTTP server", cmd_serve);
