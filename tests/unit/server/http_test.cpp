// The HTTP layer end to end against a scripted fake backend (no model): routes, SSE framing,
// error bodies, client disconnect -> cancel, tool calls and reasoning on canned outputs.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/http_server.h"
#include "byte_backend.h"

using namespace ts;
using namespace ts::server;
using namespace std::chrono_literals;

namespace {

// Tokens are bytes + 1 (vocab 257); the "model" answers with a canned text, one token per byte,
// `delay` apart, and honours Stream::cancel().
class FakeBackend : public fake::ByteBackend {
 public:
  std::string reply = "hello world";
  std::chrono::milliseconds delay{1};
  std::atomic<int> running{0}, cancelled{0}, submitted{0};

  ~FakeBackend() override {
    for (auto& t : threads_) t.join();
  }
  std::shared_ptr<Stream> submit(GenerateParams p) override {
    auto s = std::make_shared<Stream>();
    ++submitted;
    ++running;
    std::string text = reply;
    threads_.emplace_back([this, s, p, text] {
      int n = std::min<int>(p.max_tokens, static_cast<int>(text.size()));
      bool first = true;
      for (int i = 0; i < n; ++i) {
        std::this_thread::sleep_for(delay);
        if (s->cancelled()) {
          ++cancelled;
          --running;
          StreamEvent ev;
          ev.finished = true;
          ev.reason = FinishReason::abort;
          s->push(ev);
          return;
        }
        StreamEvent ev;
        ev.tokens = {static_cast<unsigned char>(text[i]) + 1};
        ev.text = text.substr(i, 1);
        if (p.logprobs >= 0) ev.logprobs.push_back(TokenLogprob{ev.tokens[0], -0.25f, {{ev.tokens[0], -0.25f}}});
        if (first) ev.ttft_s = 0.001;
        first = false;
        if (i == n - 1) {
          ev.finished = true;
          ev.reason = n < static_cast<int>(text.size()) ? FinishReason::length : FinishReason::stop;
          ev.prompt_tokens = static_cast<int>(p.prompt.size());
          ev.completion_tokens = n;
          ev.cached_tokens = 3;
        }
        s->push(ev);
      }
      --running;
    });
    return s;
  }
  EngineMetrics metrics() const override {
    EngineMetrics m;
    m.running = running.load();
    return m;
  }
  int64_t context_length() const override { return 256; }

 private:
  std::vector<std::thread> threads_;
};

struct Fixture : ::testing::Test {
  std::filesystem::path dir;
  std::unique_ptr<HttpServer> server;
  std::shared_ptr<FakeBackend> backend = std::make_shared<FakeBackend>();
  std::thread th;
  int port = 0;
  double drain_timeout_s = 30;

  void start(const std::string& tool_parser = "hermes", const std::string& reasoning = "", bool with_backend = true) {
    dir = std::filesystem::temp_directory_path() / ("ts_http_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if tools %}[tools]{% endif %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}";
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_path = dir.string();
    o.served_model_name = "fake";
    o.tool_call_parser = tool_parser;
    o.reasoning_parser = reasoning;
    o.max_request_bytes = 4096;
    o.http_threads = 16;
    o.drain_timeout_s = drain_timeout_s;
    o.limits.stream_keepalive_s = 1;
    server = std::make_unique<HttpServer>(o);
    server->bind();
    port = server->port();
    if (with_backend) server->set_backend(backend);
    th = std::thread([this] { server->run(); });
    for (int i = 0; i < 200 && !server->running(); ++i) std::this_thread::sleep_for(5ms);
  }
  void TearDown() override {
    if (server) server->stop();
    if (th.joinable()) th.join();
    std::filesystem::remove_all(dir);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client().Post(path.c_str(), body, "application/json");
  }
  // Streams `body` and returns the SSE data payloads (without "data: ").
  std::vector<std::string> stream(const std::string& path, const std::string& body) {
    std::vector<std::string> events;
    std::string buf;
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        std::string ev = buf.substr(0, pos);
        buf.erase(0, pos + 2);
        if (ev.rfind("data: ", 0) == 0) events.push_back(ev.substr(6));
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err;
    EXPECT_TRUE(c.send(req, res, err));
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(res.get_header_value("Content-Type"), "text/event-stream");
    return events;
  }
};

Json J(const std::string& s) { return Json::parse(s); }

void expect_error(const httplib::Result& r, int status, const std::string& needle) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  Json j = Json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code")) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
}

}  // namespace

TEST_F(Fixture, HealthBeforeAndAfterLoad) {
  start("hermes", "", false);
  auto c = client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  expect_error(post("/v1/completions", R"({"prompt": "x"})"), 503, "loading");
  server->set_backend(backend);
  r = c.Get("/health");
  EXPECT_EQ(r->status, 200);
}

TEST_F(Fixture, CompletionAndModels) {
  start();
  auto r = post("/v1/completions", R"({"model": "fake", "prompt": "abc", "max_tokens": 5, "logprobs": 1})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "fake");
  EXPECT_EQ(j["choices"][0]["text"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 5u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 3);

  auto m = client().Get("/v1/models");
  Json mj = J(m->body);
  EXPECT_EQ(mj["data"][0]["id"], "fake");
  EXPECT_EQ(mj["data"][0]["owned_by"], "tokenspeed");
  EXPECT_EQ(mj["data"][0]["max_model_len"], 256);
  EXPECT_EQ(client().Get("/v1/models/fake")->status, 200);
  expect_error(client().Get("/v1/models/other"), 404, "other");
}

TEST_F(Fixture, BatchNAndEcho) {
  start();
  auto r = post("/v1/completions", R"({"prompt": ["ab", [66, 67]], "n": 2, "max_tokens": 2, "echo": true})");
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["choices"][0]["text"], "abhe");
  EXPECT_EQ(j["choices"][3]["text"], "ABhe");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);  // each prompt once
}

TEST_F(Fixture, StreamingCompletion) {
  start();
  auto ev = stream("/v1/completions",
                   R"({"prompt": "x", "max_tokens": 50, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  int finishes = 0;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    Json c = J(ev[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(text, "hello world");
  EXPECT_EQ(finishes, 1);
  Json usage = J(ev[ev.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 11);
}

TEST_F(Fixture, DisconnectCancels) {
  start();
  backend->reply = std::string(2000, 'a');
  backend->delay = 5ms;
  {
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt": "x", "max_tokens": 200, "stream": true})";
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // then hang up
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
  }
  for (int i = 0; i < 400 && backend->running.load() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(backend->running.load(), 0);
  EXPECT_EQ(backend->cancelled.load(), 1);
}

TEST_F(Fixture, ParallelToolCallsFalseKeepsOneCall) {
  NEED_JINJA();
  start("hermes");
  backend->reply = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                   "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n</tool_call>";
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  for (bool stream : {false, true}) {
    for (bool parallel : {true, false}) {
      std::string body = R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 200, )" + tools +
                         ", \"parallel_tool_calls\": " + (parallel ? "true" : "false") + ", \"stream\": " + (stream ? "true" : "false") + "}";
      auto r = post("/v1/chat/completions", body);
      ASSERT_EQ(r->status, 200) << r->body;
      size_t calls = 0;
      if (!stream) {
        calls = J(r->body)["choices"][0]["message"]["tool_calls"].size();
      } else {
        // Every streamed call carries "type":"function" once.
        for (size_t p = r->body.find("\"type\":\"function\""); p != std::string::npos;
             p = r->body.find("\"type\":\"function\"", p + 1))
          ++calls;
      }
      EXPECT_EQ(calls, parallel ? 2u : 1u) << (stream ? "stream " : "") << r->body;
    }
  }
}

TEST_F(Fixture, ChatToolCalls) {
  NEED_JINJA();
  start("hermes");
  backend->reply = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string body = R"({"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 200,
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})";
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  auto& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(J(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Paris");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  // The prompt went through the template: "<user>weather?[tools]<assistant>".
  EXPECT_EQ(j["usage"]["prompt_tokens"], 32);

  // Streaming: role first, then deltas that add up to the same message.
  auto ev = stream("/v1/chat/completions", body.substr(0, body.size() - 1) + R"(, "stream": true})");
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  Json first = J(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content, name, args, finish;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    Json c = J(ev[i]);
    auto& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      EXPECT_EQ(d["tool_calls"][0]["index"], 0);
      if (d["tool_calls"][0]["function"].contains("name")) name += d["tool_calls"][0]["function"]["name"].get<std::string>();
      args += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(J(args)["city"], "Paris");
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(Fixture, ChatReasoning) {
  NEED_JINJA();
  start("", "qwen3");
  backend->reply = "<think>hmm</think>answer";
  auto r = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}], "max_tokens": 100})");
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "hmm");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "answer");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(Fixture, ErrorsKeepServing) {
  start();
  expect_error(post("/v1/completions", "{not json"), 400, "Invalid JSON");
  expect_error(post("/v1/completions", "{\"prompt\": \"\xff\"}"), 400, "Invalid JSON");
  expect_error(post("/v1/completions", R"({"prompt": "x", "model": "nope"})"), 404, "nope");
  expect_error(post("/v1/completions", R"({"prompt": "x", "max_tokens": 0})"), 400, "max_tokens");
  expect_error(post("/v1/completions", R"({"prompt": "x", "max_tokens": 300})"), 400, "maximum context length is 256");
  expect_error(post("/v1/completions", R"({"prompt": [999]})"), 400, "vocabulary");
  expect_error(post("/v1/completions", "{\"prompt\": \"" + std::string(5000, 'a') + "\"}"), 413, "larger than");
  expect_error(post("/v1/nothing", "{}"), 404, "not found");
  expect_error(client().Get("/v1/completions"), 405, "not allowed");
  expect_error(post("/health", "{}"), 405, "not allowed");
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "bot", "content": "x"}]})"), 400, "bot");
  auto ok = post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(ok->status, 200);
  auto metrics = client().Get("/metrics");
  EXPECT_NE(metrics->body.find("tokenspeed_http_requests_total{code=\"400\"}"), std::string::npos);
}

TEST_F(Fixture, NoChatTemplate) {
  start();
  std::filesystem::remove(dir / "chat_template.jinja");
  // Templates are loaded at startup, so restart the server on the now template-less directory.
  server->stop();
  th.join();
  ServerOptions o;
  o.port = 0;
  o.model_path = dir.string();
  server = std::make_unique<HttpServer>(o);
  server->bind();
  port = server->port();
  server->set_backend(backend);
  th = std::thread([this] { server->run(); });
  for (int i = 0; i < 200 && !server->running(); ++i) std::this_thread::sleep_for(5ms);
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}]})"), 400,
               "--chat-template");
}

// stop() drains: a stream in flight finishes normally (finish_reason, [DONE]) and run() returns.
TEST_F(Fixture, StopDrainsStreams) {
  start();
  backend->reply = std::string(100, 'a');
  backend->delay = 5ms;
  std::vector<std::string> ev;
  std::thread client([&] { ev = stream("/v1/completions", R"({"prompt": "x", "max_tokens": 100, "stream": true})"); });
  std::this_thread::sleep_for(100ms);
  server->stop();
  th.join();
  client.join();
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(J(ev[ev.size() - 2])["choices"][0]["finish_reason"], "stop");
}

// Past the drain timeout a stream ends with an error event and [DONE], never a silent cut.
TEST_F(Fixture, StopPastDrainTimeoutEndsStreams) {
  drain_timeout_s = 0.2;
  start();
  backend->reply = std::string(2000, 'a');
  backend->delay = 5ms;
  std::vector<std::string> ev;
  std::thread client([&] { ev = stream("/v1/completions", R"({"prompt": "x", "max_tokens": 200, "stream": true})"); });
  std::this_thread::sleep_for(100ms);
  auto t0 = std::chrono::steady_clock::now();
  server->stop();
  th.join();
  client.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(J(ev[ev.size() - 2])["error"]["code"], "server_shutting_down");
}

// A stream that stays silent (a long queue, a long prefill) gets SSE keep-alive comments.
TEST_F(Fixture, SilentStreamGetsKeepAlive) {
  start();
  backend->reply = "ab";
  backend->delay = 1500ms;
  auto c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "x", "max_tokens": 2, "stream": true})";
  req.set_header("Content-Type", "application/json");
  std::string raw;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  ASSERT_TRUE(c.send(req, res, err));
  EXPECT_NE(raw.find(": keep-alive\n\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos);
}
