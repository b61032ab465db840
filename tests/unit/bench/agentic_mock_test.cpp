// The whole client (discovery, calibration, users, SSE over HTTP, /metrics, outputs) against a
// tiny mock OpenAI server: httplib::Server streaming fixed chunks with controlled delays, 4 chars
// per token, a prefix cache over the prompts it has seen, and speculative-decoding counters.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "bench/agentic.h"
#include "core/error.h"

using namespace ts::bench;
using nlohmann::json;

namespace {

class MockServer {
 public:
  int chunk_delay_ms = 2;
  int fail_after = -1;  // streamed requests after this many get HTTP 500 (-1: never)
  int tokens_per_chunk = 1;

  MockServer() {
    svr_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"mock-model","object":"model","max_model_len":8192}]})",
                      "application/json");
    });
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lk(mu_);
      res.set_content(fmt::format("# TYPE tokenspeed_spec_decode_verify_steps_total counter\n"
                                  "tokenspeed_spec_decode_verify_steps_total{{model_name=\"mock\"}} {}\n"
                                  "tokenspeed_spec_decode_accepted_tokens_total{{model_name=\"mock\"}} {}\n",
                                  steps_, accepted_),
                      "text/plain");
    });
    auto handler = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res) { complete(req, res, chat); };
    };
    svr_.Post("/v1/completions", handler(false));
    svr_.Post("/v1/chat/completions", handler(true));
    svr_.set_tcp_nodelay(true);  // without it Nagle's algorithm bunches the small SSE chunks
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~MockServer() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::mutex mu_;
  std::vector<json> bodies;  // every streamed request body, in arrival order
  int64_t steps_ = 0, accepted_ = 0;

 private:
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::vector<std::string> seen_;
  int streamed_ = 0;

  static std::string flatten(const json& b, bool chat) {
    if (!chat) return b.at("prompt").get<std::string>();
    std::string s;
    for (auto& m : b.at("messages")) s += m.at("role").get<std::string>() + ":" + m.at("content").get<std::string>() + "\n";
    return s;
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    json b = json::parse(req.body);
    std::string prompt = flatten(b, chat);
    int64_t prompt_tokens = int64_t((prompt.size() + 3) / 4), cached = 0;
    int n = b.value("max_tokens", 16);
    bool stream = b.value("stream", false);
    {
      std::lock_guard<std::mutex> lk(mu_);
      size_t best = 0;
      for (auto& s : seen_) {
        size_t k = 0;
        while (k < s.size() && k < prompt.size() && s[k] == prompt[k]) ++k;
        best = std::max(best, k);
      }
      cached = int64_t(best / 4);
      seen_.push_back(prompt);
      if (stream) {
        bodies.push_back(b);
        if (fail_after >= 0 && streamed_++ >= fail_after) {
          res.status = 500;
          res.set_content(R"({"error":{"message":"mock failure","type":"server_error"}})", "application/json");
          return;
        }
        steps_ += n;
        accepted_ += 2 * n;
      }
    }
    json usage = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", n},
                  {"total_tokens", prompt_tokens + n},
                  {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    if (!stream) {
      json out = {{"object", chat ? "chat.completion" : "text_completion"}, {"usage", usage}};
      out["choices"] = json::array({chat ? json{{"message", {{"role", "assistant"}, {"content", "x"}}}} : json{{"text", "x"}}});
      res.set_content(out.dump(), "application/json");
      return;
    }
    int delay = chunk_delay_ms, per = tokens_per_chunk;
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      auto send = [&](const json& j) {
        std::string s = "data: " + j.dump() + "\n\n";
        sink.write(s.data(), s.size());
      };
      if (chat) send({{"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}}})}});
      for (int i = 0; i < n; i += per) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        std::string text;
        for (int k = i; k < std::min(n, i + per); ++k) text += " tok" + std::to_string(k);
        json c = chat ? json{{"index", 0}, {"delta", {{"content", text}}}} : json{{"index", 0}, {"text", text}};
        send({{"choices", json::array({c})}});
      }
      json fin = chat ? json{{"index", 0}, {"delta", json::object()}, {"finish_reason", "length"}}
                      : json{{"index", 0}, {"text", ""}, {"finish_reason", "length"}};
      send({{"choices", json::array({fin})}});
      send({{"choices", json::array()}, {"usage", usage}});
      std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  }
};

AgenticConfig small_config(const std::string& url) {
  AgenticConfig c;
  c.base_url = url;
  c.concurrency = {1, 2};
  c.conversations = 2;
  c.turns_min = 2;
  c.turns_max = 3;
  c.first_turn_tokens = 200;
  c.turn_tokens = 50;
  c.max_tokens = 8;
  c.warmup = 1;
  c.ignore_eos = true;
  c.seed = 7;
  c.num_gpus = 2;
  c.progress = false;
  c.timeout_s = 30;
  return c;
}

}  // namespace

TEST(AgenticMock, CompletionsEndToEnd) {
  MockServer mock;
  AgenticConfig cfg = small_config(mock.url());
  AgenticRun run = run_agentic(cfg);
  EXPECT_EQ(run.config.model, "mock-model");
  EXPECT_EQ(run.context_length, 8192);
  EXPECT_NEAR(run.chars_per_token, 4.0, 0.05);  // the mock counts 4 characters per token
  ASSERT_EQ(run.levels.size(), 2u);
  for (auto& L : run.levels) {
    SCOPED_TRACE(L.concurrency);
    EXPECT_EQ(L.errors, 0);
    EXPECT_EQ(L.conversations, 2);
    EXPECT_GE(L.requests, 4);  // 2 conversations x 2..3 turns
    EXPECT_LE(L.requests, 6);
    EXPECT_EQ(L.completion_tokens, L.requests * 8);
    ASSERT_TRUE(L.per_user_tps && L.per_gpu_tpm && L.output_tps);
    // Chunks are >= 2 ms apart: at most ~500 tokens/s per user.
    EXPECT_GT(*L.per_user_tps, 0);
    EXPECT_LT(*L.per_user_tps, 520);
    EXPECT_NEAR(*L.per_gpu_tpm, *L.output_tps * 60 / 2, 1e-6);
    EXPECT_NEAR(*L.output_tps, double(L.completion_tokens) / L.duration_s, 1e-6);
    ASSERT_TRUE(L.ttft_first_p50_ms && L.ttft_first_p99_ms && L.ttft_later_p50_ms && L.ttft_later_p99_ms);
    EXPECT_GE(*L.ttft_first_p99_ms, *L.ttft_first_p50_ms);
    EXPECT_GE(*L.ttft_first_p50_ms, 1.5);  // the first chunk comes after one 2 ms delay
    // Later turns re-send the whole history: the mock's prefix cache hits most of it.
    ASSERT_TRUE(L.cache_hit_rate && L.cache_hit_rate_later);
    EXPECT_GT(*L.cache_hit_rate_later, 0.6);
    EXPECT_LT(*L.cache_hit_rate, *L.cache_hit_rate_later);  // first turns are misses
    ASSERT_TRUE(L.accept_length);
    EXPECT_DOUBLE_EQ(*L.accept_length, 2.0);  // the mock accepts 2 tokens per verify step
    EXPECT_TRUE(L.itl_p50_ms && L.itl_p99_ms);
  }
  // The requests: greedy, streamed with usage, ignore_eos, and each turn extends the previous prompt.
  std::lock_guard<std::mutex> lk(mock.mu_);
  ASSERT_FALSE(mock.bodies.empty());
  for (auto& b : mock.bodies) {
    EXPECT_EQ(b["model"], "mock-model");
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["max_tokens"], 8);
  }
  int extended = 0;
  for (size_t i = 0; i < mock.bodies.size(); ++i)
    for (size_t k = 0; k < i; ++k) {
      std::string a = mock.bodies[k]["prompt"], b = mock.bodies[i]["prompt"];
      if (b.size() > a.size() && b.compare(0, a.size(), a) == 0) {
        // The previous answer follows the previous prompt verbatim.
        EXPECT_EQ(b.compare(a.size(), 5, " tok0"), 0);
        ++extended;
        break;
      }
    }
  EXPECT_GE(extended, 2 * 2 + 1);  // >= 1 later turn per conversation: 2 levels x 2 + warmup
  // First-turn prompts are about first_turn_tokens long (4 chars/token).
  std::string first = mock.bodies[0]["prompt"];
  EXPECT_NEAR(double(first.size()) / 4.0, 200, 40);

  // Outputs.
  auto dir = std::filesystem::temp_directory_path() / ("ts_agentic_mock_" + std::to_string(::getpid()));
  write_outputs(run, dir.string());
  auto j = json::parse(std::ifstream((dir / "results.json").string()));
  EXPECT_EQ(j["levels"].size(), 2u);
  EXPECT_GT(j["levels"][1]["per_gpu_tpm"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir / "results.csv"));
  EXPECT_TRUE(std::filesystem::exists(dir / "pareto.svg"));
  std::filesystem::remove_all(dir);
}

TEST(AgenticMock, ChatApiAndMultiTokenChunks) {
  MockServer mock;
  mock.tokens_per_chunk = 4;  // like speculative decoding: 8 tokens in 2 chunks
  mock.chunk_delay_ms = 8;
  AgenticConfig cfg = small_config(mock.url() + "/v1/");
  cfg.api = Api::chat;
  cfg.concurrency = {2};
  cfg.warmup = 0;
  AgenticRun run = run_agentic(cfg);
  ASSERT_EQ(run.levels.size(), 1u);
  auto& L = run.levels[0];
  EXPECT_EQ(L.errors, 0);
  ASSERT_TRUE(L.per_user_tps);
  // 8 ms per chunk of 4 tokens: the 7 tokens after the first chunk take ~8 ms -> ~875 tok/s,
  // far above the 125 chunks/s that counting 1 token per chunk would give.
  EXPECT_GT(*L.per_user_tps, 300);
  ASSERT_TRUE(L.cache_hit_rate_later);
  EXPECT_GT(*L.cache_hit_rate_later, 0.5);
  std::lock_guard<std::mutex> lk(mock.mu_);
  bool saw_history = false;
  for (auto& b : mock.bodies) {
    ASSERT_TRUE(b.contains("messages"));
    auto& m = b["messages"];
    EXPECT_EQ(m.size() % 2, 1u);  // user, (assistant, user)*
    EXPECT_EQ(m.back()["role"], "user");
    if (m.size() >= 3) {
      saw_history = true;
      EXPECT_EQ(m[1]["role"], "assistant");
      EXPECT_EQ(m[1]["content"].get<std::string>().rfind(" tok0 tok1 tok2 tok3", 0), 0u);
    }
  }
  EXPECT_TRUE(saw_history);
}

TEST(AgenticMock, ErrorsAreCountedAndConversationsStop) {
  MockServer mock;
  mock.fail_after = 3;  // the 4th streamed request on fails
  AgenticConfig cfg = small_config(mock.url());
  cfg.concurrency = {1};
  cfg.warmup = 0;
  cfg.chars_per_token = 4;
  AgenticRun run = run_agentic(cfg);
  auto& L = run.levels[0];
  EXPECT_EQ(L.requests, 4);  // 3 ok; the 4th fails and ends its conversation
  EXPECT_EQ(L.errors, 1);
  EXPECT_NE(L.first_error.find("HTTP 500"), std::string::npos);
  EXPECT_EQ(L.completion_tokens, 3 * 8);
  EXPECT_FALSE(run.warnings.empty());
}

TEST(AgenticMock, ContextClipping) {
  MockServer mock;  // max_model_len 8192
  AgenticConfig cfg = small_config(mock.url());
  cfg.first_turn_tokens = 50000;
  cfg.turns_min = cfg.turns_max = 3;
  cfg.max_tokens = 8;
  cfg.concurrency = {1};
  cfg.conversations = 1;
  cfg.warmup = 0;
  cfg.chars_per_token = 4;
  AgenticRun run = run_agentic(cfg);
  // 8192 - (2 x (50 + 8) + 8) - 64 - 409 = 7595
  EXPECT_EQ(run.config.first_turn_tokens, 7595);
  EXPECT_EQ(run.levels[0].errors, 0);
  EXPECT_EQ(run.levels[0].requests, 3);
  EXPECT_EQ(run.levels[0].truncated_conversations, 0);
  ASSERT_FALSE(run.warnings.empty());
  EXPECT_NE(run.warnings[0].find("clipped"), std::string::npos);
}

TEST(AgenticMock, UnreachableEndpointIsAClearError) {
  AgenticConfig cfg = small_config("http://127.0.0.1:1");
  try {
    run_agentic(cfg);
    FAIL() << "expected an error";
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/v1/models"), std::string::npos) << e.what();
  }
  cfg.base_url = "ftp://x";
  EXPECT_THROW(run_agentic(cfg), ts::Error);
}
