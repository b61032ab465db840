// /v1/messages and /v1/responses end to end against a scripted backend (no model): tool calls
// the demo model never makes (hermes parser on a canned reply), previous_response_id carrying
// the tool turn into the next prompt, SSE event order, --api-key, and 501 for a backend
// without prefill-only passes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "server/api_endpoints.h"
#include "server/http_server.h"
#include "server/protocol.h"
#include "byte_backend.h"

using namespace ts;
using namespace ts::server;
using namespace std::chrono_literals;

namespace {

// Tokens are bytes + 1; answers `reply` in 4-byte events and records the last prompt.
class ScriptedBackend : public fake::ByteBackend {
 public:
  std::string reply;
  ~ScriptedBackend() override {
    for (auto& t : threads_) t.join();
  }
  std::shared_ptr<Stream> submit(GenerateParams p) override {
    auto s = std::make_shared<Stream>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      last_prompt_ = decode(p.prompt, false);
    }
    std::string text = reply.substr(0, std::min<size_t>(reply.size(), size_t(p.max_tokens)));
    int np = int(p.prompt.size());
    threads_.emplace_back([s, text, np] {
      for (size_t i = 0; i < text.size(); i += 4) {
        StreamEvent ev;
        std::string piece = text.substr(i, 4);
        for (unsigned char c : piece) ev.tokens.push_back(c + 1);
        ev.text = piece;
        if (i + 4 >= text.size()) {
          ev.finished = true;
          ev.reason = FinishReason::stop;
          ev.prompt_tokens = np;
          ev.completion_tokens = int(text.size());
        }
        s->push(ev);
      }
    });
    return s;
  }
  std::string last_prompt() {
    std::lock_guard<std::mutex> lk(mu_);
    return last_prompt_;
  }
  EngineMetrics metrics() const override { return EngineMetrics(); }
  int64_t context_length() const override { return 4096; }

 private:
  std::mutex mu_;
  std::string last_prompt_;
  std::vector<std::thread> threads_;
};

Json J(const std::string& s) { return Json::parse(s); }

// Splits an SSE body into (event name, data json) pairs.
std::vector<std::pair<std::string, Json>> events(const std::string& body) {
  std::vector<std::pair<std::string, Json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    std::string name, data;
    size_t ls = 0;
    while (ls < ev.size()) {
      size_t le = ev.find('\n', ls);
      if (le == std::string::npos) le = ev.size();
      std::string line = ev.substr(ls, le - ls);
      if (line.rfind("event: ", 0) == 0) name = line.substr(7);
      if (line.rfind("data: ", 0) == 0) data = line.substr(6);
      ls = le + 1;
    }
    if (!data.empty()) out.emplace_back(name, Json::parse(data));
  }
  return out;
}

struct ApiFixture : ::testing::Test {
  std::filesystem::path dir;
  std::unique_ptr<HttpServer> server;
  std::shared_ptr<ScriptedBackend> backend = std::make_shared<ScriptedBackend>();
  std::thread th;
  int port = 0;

  void start(const std::string& api_key = "") {
    dir = std::filesystem::temp_directory_path() / ("ts_api_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}<{{ m.role }}>{{ m.content if m.content else '' }}"
           "{% for c in m.tool_calls or [] %}[call {{ c.function.name }}]{% endfor %}{% endfor %}"
           "{% if tools %}[tools]{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}";
    ServerOptions o;
    o.port = 0;
    o.model_path = dir.string();
    o.served_model_name = "fake";
    o.tool_call_parser = "hermes";
    o.api_key = api_key;
    o.responses_store_size = 4;
    server = std::make_unique<HttpServer>(o);
    server->bind();
    port = server->port();
    server->set_backend(backend);
    th = std::thread([this] { server->run(); });
    for (int i = 0; i < 200 && !server->running(); ++i) std::this_thread::sleep_for(5ms);
  }
  void TearDown() override {
    if (server) server->stop();
    if (th.joinable()) th.join();
    std::filesystem::remove_all(dir);
  }
  httplib::Result post(const std::string& path, const std::string& body, httplib::Headers h = {}) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10);
    return c.Post(path.c_str(), h, body, "application/json");
  }
};

const char* kCall = R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)";
const char* kTools = R"([{"name": "get_weather", "input_schema": {"type": "object"}}])";
const char* kFnTools = R"([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])";

}  // namespace

TEST_F(ApiFixture, MessagesToolUse) {
  NEED_JINJA();
  backend->reply = std::string("Checking. ") + kCall;
  start();
  std::string body = std::string(R"({"max_tokens": 200, "tools": )") + kTools +
                     R"(, "messages": [{"role": "user", "content": "Weather?"}]})";
  auto r = post("/v1/messages", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  ASSERT_EQ(j["content"].size(), 2u) << r->body;
  EXPECT_EQ(j["content"][0], J(R"({"type": "text", "text": "Checking. "})"));
  EXPECT_EQ(j["content"][1]["type"], "tool_use");
  EXPECT_EQ(j["content"][1]["name"], "get_weather");
  EXPECT_EQ(j["content"][1]["input"], J(R"({"city": "Paris"})"));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_NE(backend->last_prompt().find("[tools]"), std::string::npos);

  body.insert(1, R"("stream": true, )");
  r = post("/v1/messages", body);
  ASSERT_EQ(r->status, 200);
  auto ev = events(r->body);
  ASSERT_GE(ev.size(), 8u) << r->body;
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.back().first, "message_stop");
  bool tool_start = false;
  int json_deltas = 0, tool_index = -1;
  std::string text, partial;
  for (auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);  // Anthropic repeats the event name as "type"
    if (name == "content_block_start" && d["content_block"]["type"] == "tool_use") {
      tool_start = true;
      tool_index = d["index"];
    }
    if (name == "content_block_delta" && d["delta"]["type"] == "input_json_delta") {
      ++json_deltas;
      EXPECT_EQ(d["index"], tool_index);
      partial += d["delta"]["partial_json"].get<std::string>();
    }
    if (name == "content_block_delta" && d["delta"]["type"] == "text_delta") text += d["delta"]["text"].get<std::string>();
    if (name == "message_delta") {
      EXPECT_EQ(d["delta"]["stop_reason"], "tool_use");
    }
  }
  EXPECT_TRUE(tool_start);
  // The arguments stream as they are generated (4-byte events): several fragments that
  // concatenate to the input object.
  EXPECT_GT(json_deltas, 1) << r->body;
  EXPECT_EQ(J(partial), J(R"({"city": "Paris"})")) << partial;
  EXPECT_EQ(text, "Checking. ");
}

// A call whose keys come in another order (or string-encoded arguments) cannot stream: it
// arrives complete, as one delta holding the whole input object; text after a streamed call
// opens a new block after the tool_use block is closed.
TEST_F(ApiFixture, MessagesToolUseCompleteAndTextAfter) {
  NEED_JINJA();
  backend->reply = std::string(R"(<tool_call>{"arguments": "{\"city\": \"Oslo\"}", "name": "get_weather"}</tool_call>)") +
                   kCall + " Done.";
  start();
  std::string body = std::string(R"({"stream": true, "max_tokens": 400, "tools": )") + kTools +
                     R"(, "messages": [{"role": "user", "content": "Weather?"}]})";
  auto r = post("/v1/messages", body);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<std::string> inputs;  // per tool_use block, its concatenated partial_json
  std::vector<std::string> order;   // block types in order
  int open = -1;
  for (auto& [name, d] : events(r->body)) {
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block opened before the previous one stopped";
      open = d["index"];
      order.push_back(d["content_block"]["type"]);
      if (order.back() == "tool_use") inputs.emplace_back();
    }
    if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      open = -1;
    }
    if (name == "content_block_delta" && d["delta"]["type"] == "input_json_delta") {
      EXPECT_EQ(order.back(), "tool_use");
      inputs.back() += d["delta"]["partial_json"].get<std::string>();
    }
  }
  ASSERT_EQ(order, (std::vector<std::string>{"tool_use", "tool_use", "text"})) << r->body;
  EXPECT_EQ(J(inputs[0]), J(R"({"city": "Oslo"})"));
  EXPECT_EQ(J(inputs[1]), J(R"({"city": "Paris"})"));
}

TEST_F(ApiFixture, ResponsesFunctionCallRoundTrip) {
  NEED_JINJA();
  backend->reply = kCall;
  start();
  auto r = post("/v1/responses", std::string(R"({"input": "Weather?", "tools": )") + kFnTools + "}");
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = J(r->body);
  ASSERT_EQ(j["output"].size(), 1u) << r->body;
  const Json& call = j["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(J(call["arguments"].get<std::string>()), J(R"({"city": "Paris"})"));
  std::string call_id = call["call_id"];

  // The follow-up carries the call and its output into the prompt.
  backend->reply = "It is 21 C.";
  std::string follow = R"({"previous_response_id": ")" + j["id"].get<std::string>() +
                       R"(", "input": [{"type": "function_call_output", "call_id": ")" + call_id +
                       R"(", "output": "21 C"}], "tools": )" + kFnTools + "}";
  r = post("/v1/responses", follow);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(J(r->body)["output"][0]["content"][0]["text"], "It is 21 C.");
  EXPECT_NE(backend->last_prompt().find("<user>Weather?<assistant>[call get_weather]<tool>21 C"), std::string::npos)
      << backend->last_prompt();

  // Streaming: the call as added / arguments delta / done / item done, then response.completed.
  backend->reply = std::string("Sure. ") + kCall;
  r = post("/v1/responses", std::string(R"({"stream": true, "input": "Weather?", "tools": )") + kFnTools + "}");
  ASSERT_EQ(r->status, 200);
  auto ev = events(r->body);
  std::vector<std::string> names;
  for (auto& e : ev) names.push_back(e.first);
  ASSERT_GE(names.size(), 10u);
  EXPECT_EQ(names[0], "response.created");
  EXPECT_EQ(names.back(), "response.completed");
  auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  EXPECT_LT(at("response.output_text.delta"), at("response.output_text.done"));
  EXPECT_LT(at("response.output_text.done"), at("response.function_call_arguments.delta"));
  EXPECT_LT(at("response.function_call_arguments.delta"), at("response.function_call_arguments.done"));
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i].second["sequence_number"], int(i));
  // The arguments stream in fragments (4-byte events) that concatenate to the done arguments.
  int arg_deltas = 0;
  std::string args;
  for (auto& [name, d] : ev)
    if (name == "response.function_call_arguments.delta") {
      ++arg_deltas;
      args += d["delta"].get<std::string>();
    } else if (name == "response.function_call_arguments.done") {
      EXPECT_EQ(d["arguments"].get<std::string>(), args);
      EXPECT_EQ(d["name"], "get_weather");
    }
  EXPECT_GT(arg_deltas, 1) << r->body;
  EXPECT_EQ(J(args), J(R"({"city": "Paris"})"));
  const Json& done = ev.back().second["response"];
  ASSERT_EQ(done["output"].size(), 2u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Sure. ");
  EXPECT_EQ(done["output"][1]["name"], "get_weather");
  // GET returns it with the streamed ids
  httplib::Client c("127.0.0.1", port);
  auto g = c.Get(("/v1/responses/" + done["id"].get<std::string>()).c_str());
  ASSERT_EQ(g->status, 200);
  EXPECT_EQ(J(g->body)["output"][1]["id"], done["output"][1]["id"]);
  EXPECT_EQ(c.Delete(("/v1/responses/" + done["id"].get<std::string>()).c_str())->status, 200);
  EXPECT_EQ(c.Get(("/v1/responses/" + done["id"].get<std::string>()).c_str())->status, 404);
}

TEST_F(ApiFixture, ApiKeyAndUnsupportedPasses) {
  NEED_JINJA();
  backend->reply = "ok";
  start("k1");
  httplib::Client c("127.0.0.1", port);
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  auto r = c.Get("/v1/models");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(J(r->body)["error"]["type"], "authentication_error");
  r = post("/v1/messages", R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(J(r->body)["type"], "error");
  r = post("/v1/messages", R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})", {{"x-api-key", "k1"}});
  EXPECT_EQ(r->status, 200) << r->body;
  httplib::Headers bearer = {{"Authorization", "Bearer k1"}};
  EXPECT_EQ(post("/v1/embeddings", R"({"input": "x"})", bearer)->status, 501);
  EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "prompt_logprobs": 1})", bearer)->status, 501);
  EXPECT_EQ(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", bearer)->status, 200);
}

// A tokenizer with Mistral's [TOOL_CALLS] as one special token (id 300): skip_special_tokens (the
// default) would drop it from the text, so a request the mistral parser reads keeps special tokens;
// other parsers' markers are ordinary text here, and skip_special_tokens: false always keeps them.
class SpecialMarkerBackend : public fake::ByteBackend {
 public:
  std::vector<int32_t> encode(const std::string& text, bool add) const override {
    if (text == "[TOOL_CALLS]") return {300};
    return fake::ByteBackend::encode(text, add);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id == 300) s += skip_special ? "" : "[TOOL_CALLS]";
      else s += static_cast<char>(id - 1);
    }
    return s;
  }
  std::shared_ptr<Stream> submit(GenerateParams) override { return nullptr; }
  EngineMetrics metrics() const override { return EngineMetrics(); }
  int64_t context_length() const override { return 4096; }
};

TEST(ChatSkipSpecial, OffWhereAParserMarkerIsASpecialToken) {
  SpecialMarkerBackend b;
  ChatRequest cr;
  using R = ReasoningParser::Kind;
  using T = ToolCallParser::Kind;
  EXPECT_FALSE(chat_skip_special(b, cr, R::none, T::mistral));
  EXPECT_TRUE(chat_skip_special(b, cr, R::none, T::hermes));
  EXPECT_TRUE(chat_skip_special(b, cr, R::qwen3, T::none));
  EXPECT_TRUE(chat_skip_special(b, cr, R::none, T::none));
  cr.skip_special_tokens = false;
  EXPECT_FALSE(chat_skip_special(b, cr, R::none, T::none));
  // The request field (vLLM's name), on chat and completions.
  ModelInfo mi;
  mi.context_length = 4096;
  mi.vocab_size = 257;
  Json body = {{"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}, {"skip_special_tokens", false}};
  EXPECT_FALSE(parse_chat_request(body, mi).skip_special_tokens);
  body.erase("skip_special_tokens");
  EXPECT_TRUE(parse_chat_request(body, mi).skip_special_tokens);
}
