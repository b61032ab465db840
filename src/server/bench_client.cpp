#include "server/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "server/protocol.h"

namespace ts::server {

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Sample {
  bool ok = false;
  std::string error;
  double ttft = 0;
  std::vector<double> gaps;
  int64_t tokens = 0;
};

std::string normalize_base(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.compare(url.size() - 3, 3, "/v1") == 0) url.resize(url.size() - 3);
  return url;
}

std::unique_ptr<httplib::Client> make_client(const std::string& base, double timeout_s) {
  auto c = std::make_unique<httplib::Client>(base);
  auto t = static_cast<time_t>(timeout_s);
  c->set_connection_timeout(10);
  c->set_read_timeout(t);
  c->set_write_timeout(t);
  c->set_keep_alive(true);
  return c;
}

// expect_tokens: the completion length every request must have (< 0: at most -expect_tokens,
// for grammar-constrained requests that end where the grammar does).
Sample one_request(httplib::Client& cli, const std::string& body, int expect_tokens, const char* path) {
  Sample s;
  auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  std::string buf;
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // comments / keep-alives
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      Json j = Json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        s.error = j["error"].value("message", "error event");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) s.tokens = j["usage"].value("completion_tokens", 0);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      auto now = Clock::now();
      if (first) {
        s.ttft = secs(now - t0);
        first = false;
      } else {
        s.gaps.push_back(secs(now - last));
      }
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool sent = cli.send(req, res, err);
  if (!sent) {
    s.error = "request failed: " + httplib::to_string(err);
  } else if (res.status != 200) {
    s.error = "HTTP " + std::to_string(res.status) + ": " + res.body.substr(0, 300);
  } else if (!done && s.error.empty()) {
    s.error = "stream ended without [DONE]";
  } else if (s.error.empty() && expect_tokens >= 0 && s.tokens != expect_tokens) {
    s.error = "expected " + std::to_string(expect_tokens) + " completion tokens, got " + std::to_string(s.tokens);
  } else if (s.error.empty() && expect_tokens < 0 && (s.tokens < 1 || s.tokens > -expect_tokens)) {
    s.error = "expected 1.." + std::to_string(-expect_tokens) + " completion tokens, got " + std::to_string(s.tokens);
  }
  s.ok = s.error.empty();
  return s;
}
}  // namespace

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  auto lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

// tokenspeed's /metrics device counters (idle, busy seconds); {-1, -1} when the server has
// none (another server, or a scrape that failed).
std::pair<double, double> device_seconds(const std::string& base) {
  auto cli = make_client(base, 10);
  auto res = cli->Get("/metrics");
  std::pair<double, double> out{-1, -1};
  if (!res || res->status != 200) return out;
  auto read = [&](const std::string& name) {
    size_t at = 0;
    while ((at = res->body.find(name, at)) != std::string::npos) {
      const bool line_start = at == 0 || res->body[at - 1] == '\n';
      at += name.size();
      if (!line_start) continue;
      size_t sp = res->body.find(' ', at);
      if (sp == std::string::npos) return -1.0;
      return std::strtod(res->body.c_str() + sp + 1, nullptr);
    }
    return -1.0;
  };
  out.first = read("tokenspeed_device_idle_seconds_total");
  out.second = read("tokenspeed_device_busy_seconds_total");
  return out;
}

std::vector<BenchServingResult> run_bench_serving(const BenchServingOptions& o) {
  std::string base = normalize_base(o.base_url);
  std::string model = o.model;
  {
    auto cli = make_client(base, 30);
    auto res = cli->Get("/v1/models");
    if (!res) fail("bench serving: cannot reach {} ({})", base, httplib::to_string(res.error()));
    if (res->status != 200) fail("bench serving: GET /v1/models returned {}", res->status);
    if (model.empty()) {
      Json j = Json::parse(res->body, nullptr, false);
      if (j.is_discarded() || !j.contains("data") || j["data"].empty()) fail("bench serving: /v1/models lists no model");
      model = j["data"][0].value("id", "");
    }
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> dist(o.token_id_min, o.token_id_max - 1);
  Json schema;
  if (!o.json_schema.empty()) {
    schema = Json::parse(o.json_schema, nullptr, false);
    if (schema.is_discarded()) fail("bench serving: --json-schema is not valid JSON");
  }
  Json tools;
  if (!o.tools.empty()) {
    tools = Json::parse(o.tools, nullptr, false);
    if (tools.is_discarded() || !tools.is_array() || tools.empty())
      fail("bench serving: --tools must be a non-empty JSON array of tools");
  }
  const bool chat = !tools.is_null();
  const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
  // Tool calls (auto: where the model opens one) and schemas end where their grammar does.
  const int expect = schema.is_null() && !chat ? o.max_tokens : -o.max_tokens;
  static const char* kWords[] = {"the",   "data",  "file",  "value", "list",   "parse", "return", "user",
                                 "time",  "city",  "query", "table", "string", "check", "result", "weather",
                                 "count", "error", "path",  "name",  "number", "find",  "order",  "price"};
  std::uniform_int_distribution<size_t> word(0, sizeof(kWords) / sizeof(kWords[0]) - 1);
  auto make_body = [&](std::mt19937_64& r) {
    Json b = Json::object();
    b["model"] = model;
    if (chat) {
      std::string text;
      for (int i = 0; i < o.prompt_tokens; ++i) {
        if (i) text += ' ';
        text += kWords[word(r)];
      }
      b["messages"] = Json::array({Json{{"role", "user"}, {"content", text}}});
      b["tools"] = tools;
      b["tool_choice"] = o.tool_choice;
    } else {
      Json ids = Json::array();
      for (int i = 0; i < o.prompt_tokens; ++i) ids.push_back(dist(r));
      b["prompt"] = std::move(ids);
    }
    b["max_tokens"] = o.max_tokens;
    b["temperature"] = 0;
    b["ignore_eos"] = true;
    b["stream"] = true;
    b["stream_options"] = Json{{"include_usage", true}};
    if (!schema.is_null()) b["structured_outputs"] = Json{{"json", schema}};
    return dump(b);
  };
  {  // warm-up: one short request (not measured)
    auto cli = make_client(base, o.timeout_s);
    one_request(*cli, make_body(rng), expect, path);
  }

  std::vector<BenchServingResult> out;
  for (int c : o.concurrency) {
    int n = o.num_prompts > 0 ? o.num_prompts : std::max(8, 2 * c);
    std::vector<std::string> bodies;
    for (int i = 0; i < n; ++i) bodies.push_back(make_body(rng));
    std::vector<Sample> samples(n);
    std::atomic<int> next{0};
    const auto dev0 = device_seconds(base);
    auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < std::min(c, n); ++t) {
      threads.emplace_back([&] {
        auto cli = make_client(base, o.timeout_s);
        for (int i; (i = next.fetch_add(1)) < n;) samples[i] = one_request(*cli, bodies[i], expect, path);
      });
    }
    for (auto& t : threads) t.join();
    double dur = secs(Clock::now() - t0);
    const auto dev1 = device_seconds(base);
    BenchServingResult r;
    if (dev0.first >= 0 && dev1.first >= 0 && dev0.second >= 0 && dev1.second >= 0) {
      const double idle = dev1.first - dev0.first, busy = dev1.second - dev0.second;
      if (idle + busy > 0) r.device_idle_pct = 100.0 * idle / (idle + busy);
    }
    r.concurrency = c;
    r.requests = n;
    r.duration_s = dur;
    std::vector<double> ttft, itl;
    for (auto& s : samples) {
      if (!s.ok) {
        ++r.failed;
        if (r.first_error.empty()) r.first_error = s.error;
        continue;
      }
      r.output_tokens += s.tokens;
      ttft.push_back(s.ttft * 1e3);
      for (double g : s.gaps) itl.push_back(g * 1e3);
    }
    r.req_per_s = static_cast<double>(n - r.failed) / dur;
    r.output_tok_per_s = static_cast<double>(r.output_tokens) / dur;
    r.ttft_p50_ms = percentile(ttft, 50);
    r.ttft_p99_ms = percentile(ttft, 99);
    r.itl_p50_ms = percentile(itl, 50);
    r.itl_p99_ms = percentile(itl, 99);
    out.push_back(r);
  }
  return out;
}

std::string format_bench_table(const std::vector<BenchServingResult>& rs) {
  std::string s = fmt::format("{:>11} {:>8} {:>6} {:>9} {:>8} {:>10} {:>11} {:>11} {:>10} {:>10} {:>9}\n", "concurrency",
                              "requests", "failed", "time_s", "req/s", "out_tok/s", "ttft_p50ms", "ttft_p99ms",
                              "itl_p50ms", "itl_p99ms", "dev_idle%");
  for (auto& r : rs)
    s += fmt::format("{:>11} {:>8} {:>6} {:>9.2f} {:>8.2f} {:>10.1f} {:>11.1f} {:>11.1f} {:>10.2f} {:>10.2f} {:>9}\n",
                     r.concurrency, r.requests, r.failed, r.duration_s, r.req_per_s, r.output_tok_per_s, r.ttft_p50_ms,
                     r.ttft_p99_ms, r.itl_p50_ms, r.itl_p99_ms,
                     r.device_idle_pct >= 0 ? fmt::format("{:.2f}", r.device_idle_pct) : std::string("-"));
  for (auto& r : rs)
    if (!r.first_error.empty()) s += fmt::format("concurrency {}: first error: {}\n", r.concurrency, r.first_error);
  return s;
}

}  // namespace ts::server
