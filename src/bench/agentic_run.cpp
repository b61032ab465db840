// The agentic benchmark's client: endpoint discovery, calibration, users (one thread and one
// HTTP connection each) replaying growing multi-turn conversations, level by level.
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

#include "bench/agentic.h"
#include "core/error.h"

namespace ts::bench {

namespace {

double now_ms() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch).count();
}

struct Endpoint {
  std::string host;  // scheme://host:port
  std::string api;   // path prefix of the OpenAI routes, e.g. "/v1"
  std::string root;  // path prefix of /metrics, e.g. ""
};

Endpoint parse_base_url(std::string url) {
  size_t scheme = url.rfind("http://", 0) == 0 ? 7 : url.rfind("https://", 0) == 0 ? 8 : 0;
  TS_CHECK(scheme, "--base-url must start with http:// or https:// (got '{}')", url);
  while (!url.empty() && url.back() == '/') url.pop_back();
  size_t slash = url.find('/', scheme);
  Endpoint e;
  e.host = url.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : url.substr(slash);
  TS_CHECK(e.host.size() > scheme, "--base-url '{}' has no host", url);
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) {
    e.api = path;
    e.root = path.substr(0, path.size() - 3);
  } else {
    e.api = path + "/v1";
    e.root = path;
  }
  return e;
}

struct Shared {
  AgenticConfig cfg;
  Endpoint ep;
  CodeTextGen gen;
  int64_t ctx = 0;
  double cpt = 4.0;
  std::mutex warn_mu;
  std::vector<std::string> warnings;
};

std::unique_ptr<httplib::Client> make_client(const Shared& s) {
  auto c = std::make_unique<httplib::Client>(s.ep.host);
  c->set_connection_timeout(std::chrono::seconds(10));
  auto t = std::chrono::milliseconds(int64_t(std::max(1.0, s.cfg.timeout_s) * 1000));
  c->set_read_timeout(t);
  c->set_write_timeout(t);
  c->set_keep_alive(true);
  // No Accept-Encoding: a compressing server (httplib's gzip among them) buffers the stream and
  // releases chunks in bursts, which would corrupt every latency we measure.
  c->set_decompress(false);
  c->set_tcp_nodelay(true);
  if (!s.cfg.api_key.empty()) c->set_bearer_token_auth(s.cfg.api_key.c_str());
  return c;
}

nlohmann::json request_body(const Shared& s, bool stream, int64_t max_tokens) {
  nlohmann::json b;
  b["model"] = s.cfg.model;
  b["max_tokens"] = max_tokens;
  b["temperature"] = 0;
  b["stream"] = stream;
  if (stream) b["stream_options"] = {{"include_usage", true}};
  if (s.cfg.ignore_eos) b["ignore_eos"] = true;
  return b;
}

const char* route(Api api) { return api == Api::chat ? "/chat/completions" : "/completions"; }

// One streamed request; fills timing, chunks, usage and text of `rec`.
void stream_request(const Shared& s, httplib::Client& cli, const nlohmann::json& body, RequestRecord& rec) {
  httplib::Request req;
  req.method = "POST";
  req.path = s.ep.api + route(s.cfg.api);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  int status = 0;
  bool done = false;
  std::string err_body;
  SseParser parser([&](std::string_view payload, double t) {
    if (!done && !apply_stream_payload(rec, payload, t)) done = true;
  });
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    double t = now_ms();
    if (status != 200) {
      if (err_body.size() < 2000) err_body.append(d, std::min<size_t>(n, 2000));
    } else {
      parser.feed(std::string_view(d, n), t);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  rec.t_start_ms = now_ms();
  bool ok = cli.send(req, res, err);
  rec.t_end_ms = now_ms();
  if (ok && status == 200) parser.finish(rec.t_end_ms);
  if (!ok) {
    rec.error = "HTTP request failed: " + httplib::to_string(err);
  } else if (status != 200) {
    if (err_body.empty()) err_body = res.body;
    rec.error = fmt::format("HTTP {}: {}", status, err_body.substr(0, 300));
  } else if (rec.error.empty() && !done && rec.finish_reason.empty()) {
    rec.error = "stream ended without a finish_reason or [DONE]";
  }
}

// Non-streamed request (calibration): returns usage.prompt_tokens or -1.
int64_t prompt_tokens_of(const Shared& s, httplib::Client& cli, const std::string& text, std::string& why) {
  nlohmann::json b = request_body(s, false, 1);
  if (s.cfg.api == Api::chat)
    b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
  else
    b["prompt"] = text;
  auto res = cli.Post((s.ep.api + route(s.cfg.api)).c_str(), b.dump(), "application/json");
  if (!res) {
    why = httplib::to_string(res.error());
    return -1;
  }
  if (res->status != 200) {
    why = fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 300));
    return -1;
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("usage") || !j["usage"].is_object() || !j["usage"].contains("prompt_tokens") ||
      !j["usage"]["prompt_tokens"].is_number()) {
    why = "no usage.prompt_tokens in the response";
    return -1;
  }
  return j["usage"]["prompt_tokens"].get<int64_t>();
}

void warn(Shared& s, std::string w) {
  std::lock_guard<std::mutex> lk(s.warn_mu);
  std::fprintf(stderr, "warning: %s\n", w.c_str());
  s.warnings.push_back(std::move(w));
}

std::map<std::string, double> scrape(const Shared& s, httplib::Client& cli) {
  auto res = cli.Get((s.ep.root + "/metrics").c_str());
  if (!res || res->status != 200) return {};
  return parse_prometheus(res->body);
}

struct ConvPlan {
  int id = 0;
  uint64_t seed = 0;
  int turns = 0;
};

std::vector<ConvPlan> make_plans(const AgenticConfig& cfg, uint64_t stream, int n) {
  std::vector<ConvPlan> p;
  for (int i = 0; i < n; ++i) {
    ConvPlan c;
    c.id = i;
    c.seed = mix_seed(mix_seed(cfg.seed, stream), uint64_t(i));
    Rng r(c.seed ^ 0x7475726e73ull);  // "turns"
    c.turns = cfg.turns_min + int(r.below(uint64_t(cfg.turns_max - cfg.turns_min + 1)));
    p.push_back(c);
  }
  return p;
}

struct Progress {
  std::atomic<int64_t> done{0}, planned{0};
};

// Runs one conversation's turns in order on this user's connection.
void run_conversation(Shared& s, httplib::Client& cli, const ConvPlan& plan, std::vector<RequestRecord>& out,
                      Progress& prog, std::atomic<int64_t>& truncated) {
  const AgenticConfig& c = s.cfg;
  Rng rng(plan.seed);
  std::string prompt;
  nlohmann::json messages = nlohmann::json::array();
  int64_t prev_tokens = 0;  // prompt + completion tokens of the previous turn
  for (int t = 0; t < plan.turns; ++t) {
    int64_t want = t == 0 ? c.first_turn_tokens : c.turn_tokens;
    std::string u = s.gen.user_turn(rng, size_t(std::max<double>(1, double(want) * s.cpt)), t == 0);
    int64_t est = prev_tokens + int64_t(double(u.size()) / s.cpt) + 16;
    if (s.ctx > 0 && t > 0 && est + c.max_tokens > s.ctx) {
      truncated.fetch_add(1);
      prog.planned.fetch_sub(plan.turns - t);
      return;
    }
    nlohmann::json body = request_body(s, true, c.max_tokens);
    if (c.api == Api::chat) {
      messages.push_back({{"role", "user"}, {"content", u}});
      body["messages"] = messages;
    } else {
      prompt += "### User\n" + u + "\n### Assistant\n";
      body["prompt"] = prompt;
    }
    RequestRecord rec;
    rec.conversation = plan.id;
    rec.turn = t;
    stream_request(s, cli, body, rec);
    prog.done.fetch_add(1);
    bool ok = rec.ok();
    if (ok) {
      if (c.api == Api::chat)
        messages.push_back({{"role", "assistant"}, {"content", rec.text}});
      else
        prompt += rec.text + "\n";
      prev_tokens = rec.prompt_tokens.value_or(est) + rec.output_tokens();
    }
    out.push_back(std::move(rec));
    if (!ok) {  // the conversation cannot continue without the answer
      prog.planned.fetch_sub(plan.turns - t - 1);
      return;
    }
  }
}

struct LevelRun {
  std::vector<RequestRecord> recs;
  double t0 = 0, t1 = 0;
  int64_t truncated = 0;
};

LevelRun run_users(Shared& s, int users, const std::vector<ConvPlan>& plans, const std::string& label) {
  LevelRun lr;
  Progress prog;
  for (auto& p : plans) prog.planned += p.turns;
  users = std::max(1, std::min<int>(users, int(plans.size())));
  std::atomic<size_t> next{0};
  std::atomic<int> running{users};
  std::atomic<int64_t> truncated{0};
  std::vector<std::vector<RequestRecord>> per_user(static_cast<size_t>(users));
  std::vector<std::thread> threads;
  lr.t0 = now_ms();
  for (int u = 0; u < users; ++u) {
    threads.emplace_back([&, u] {
      auto cli = make_client(s);
      for (size_t i; (i = next.fetch_add(1)) < plans.size();)
        run_conversation(s, *cli, plans[i], per_user[size_t(u)], prog, truncated);
      running.fetch_sub(1);
    });
  }
  bool tty = s.cfg.progress && isatty(2);
  auto draw = [&](bool final) {
    int64_t d = prog.done.load(), p = std::max<int64_t>(1, prog.planned.load());
    const int W = 30;
    int fill = int(std::min<int64_t>(W, d * W / p));
    std::string bar(size_t(fill), '#');
    bar.resize(W, '.');
    std::fprintf(stderr, "%s%-10s [%s] %lld/%lld requests  %.1fs%s", tty ? "\r" : "", label.c_str(), bar.c_str(),
                 (long long)d, (long long)p, (now_ms() - lr.t0) / 1000.0, final || !tty ? "\n" : "");
    std::fflush(stderr);
  };
  // On a terminal the bar redraws in place; in a log (CI) a line every 10 s.
  double last_line = now_ms();
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (tty) {
      draw(false);
    } else if (s.cfg.progress && now_ms() - last_line >= 10000) {
      draw(false);
      last_line = now_ms();
    }
  }
  for (auto& t : threads) t.join();
  lr.t1 = now_ms();
  if (s.cfg.progress) draw(true);
  for (auto& v : per_user)
    for (auto& r : v) lr.recs.push_back(std::move(r));
  std::sort(lr.recs.begin(), lr.recs.end(), [](const RequestRecord& a, const RequestRecord& b) {
    return a.t_start_ms < b.t_start_ms;
  });
  lr.truncated = truncated.load();
  return lr;
}

int64_t context_from_model_entry(const nlohmann::json& m) {
  for (const char* k : {"max_model_len", "context_length", "max_context_length", "context_window"})
    if (auto it = m.find(k); it != m.end() && it->is_number_integer() && it->get<int64_t>() > 0)
      return it->get<int64_t>();
  return 0;
}

}  // namespace

AgenticRun run_agentic(const AgenticConfig& cfg_in) {
  auto sp = std::make_unique<Shared>();
  Shared& s = *sp;
  s.cfg = cfg_in;
  AgenticConfig& c = s.cfg;
  TS_CHECK(!c.concurrency.empty(), "--concurrency: no levels");
  for (int x : c.concurrency) TS_CHECK(x >= 1, "--concurrency: levels must be >= 1 (got {})", x);
  TS_CHECK(c.turns_min >= 1 && c.turns_max >= c.turns_min, "--turns: need 1 <= min <= max");
  TS_CHECK(c.first_turn_tokens >= 1 && c.turn_tokens >= 1 && c.max_tokens >= 1,
           "--first-turn-tokens, --turn-tokens and --max-tokens must be >= 1");
  TS_CHECK(c.num_gpus >= 1, "--num-gpus must be >= 1");
  TS_CHECK(c.warmup >= 0 && c.conversations >= 0, "--warmup and --conversations must be >= 0");
  s.ep = parse_base_url(c.base_url);
  if (!c.tokenizer_dir.empty()) {
    auto pool = identifier_pool_from_tokenizer(c.tokenizer_dir);
    if (pool.size() < 50)
      warn(s, fmt::format("--tokenizer: only {} identifier-like tokens, using the built-in word list", pool.size()));
    s.gen = CodeTextGen(std::move(pool));
  }
  auto cli = make_client(s);

  // Model and context length from GET /v1/models.
  {
    auto res = cli->Get((s.ep.api + "/models").c_str());
    TS_CHECK(res, "cannot reach {} (GET {}/models: {} error)", s.ep.host, s.ep.api, httplib::to_string(res.error()));
    nlohmann::json j;
    if (res && res->status == 200) j = nlohmann::json::parse(res->body, nullptr, false);
    const nlohmann::json* entry = nullptr;
    if (j.is_object() && j.contains("data") && j["data"].is_array()) {
      for (auto& m : j["data"])
        if (m.is_object() && (c.model.empty() || (m.contains("id") && m["id"] == c.model))) {
          entry = &m;
          break;
        }
    }
    if (c.model.empty()) {
      TS_CHECK(entry && entry->contains("id") && (*entry)["id"].is_string(),
               "GET {}{}/models: {}; pass --model", s.ep.host, s.ep.api,
               res->status != 200 ? fmt::format("HTTP {}", res->status) : std::string("no model listed"));
      c.model = (*entry)["id"].get<std::string>();
    }
    if (entry) s.ctx = context_from_model_entry(*entry);
    if (s.ctx == 0) s.ctx = c.context_length;
    if (s.ctx == 0) warn(s, "context length unknown (no max_model_len in /v1/models, no --context-length)");
  }

  // Characters per token, measured on the server's tokenizer.
  if (c.chars_per_token > 0) {
    s.cpt = c.chars_per_token;
  } else {
    Rng r(mix_seed(c.seed, 0xCA11B4A7Eull));
    size_t n1 = size_t(std::clamp<int64_t>(c.first_turn_tokens * 2, 400, 3000));
    if (s.ctx > 0) n1 = std::min(n1, size_t(std::max<int64_t>(100, s.ctx / 2)));  // 2 n1 chars fit at >= 1 char/token
    std::string a = s.gen.code(r, n1), b = s.gen.code(r, 2 * n1), why;
    int64_t pa = prompt_tokens_of(s, *cli, a, why), pb = pa >= 0 ? prompt_tokens_of(s, *cli, b, why) : -1;
    if (pa > 0 && pb > pa)
      s.cpt = double(b.size() - a.size()) / double(pb - pa);
    else if (pb > 0)
      s.cpt = double(b.size()) / double(pb);
    else
      warn(s, "calibration failed (" + why + "); assuming 4 characters per token");
    s.cpt = std::clamp(s.cpt, 1.0, 16.0);
  }

  // Fit the conversations into the context.
  if (s.ctx > 0) {
    int64_t growth = int64_t(c.turns_max - 1) * (c.turn_tokens + c.max_tokens) + c.max_tokens;
    int64_t budget = s.ctx - growth - 64 - s.ctx / 20;
    int64_t fit = budget >= 64 ? budget : std::max<int64_t>(1, s.ctx / 4);
    if (c.first_turn_tokens > fit) {
      warn(s, fmt::format("--first-turn-tokens {} clipped to {} to fit the context of {} tokens{}",
                          c.first_turn_tokens, fit, s.ctx,
                          budget >= 64 ? "" : " (later turns will be cut when the context is full)"));
      c.first_turn_tokens = fit;
    }
  }

  AgenticRun run;
  run.context_length = s.ctx;
  run.chars_per_token = s.cpt;
  std::fprintf(stderr, "bench agentic: %s model=%s api=%s context=%lld chars/token=%.2f first-turn=%lld turns=%d-%d\n",
               c.base_url.c_str(), c.model.c_str(), c.api == Api::chat ? "chat" : "completions", (long long)s.ctx,
               s.cpt, (long long)c.first_turn_tokens, c.turns_min, c.turns_max);

  if (c.warmup > 0) {
    auto plans = make_plans(c, 0x5741524dull, c.warmup);  // "WARM"
    int users = std::min(c.warmup, *std::max_element(c.concurrency.begin(), c.concurrency.end()));
    auto lr = run_users(s, users, plans, "warmup");
    int64_t errs = std::count_if(lr.recs.begin(), lr.recs.end(), [](auto& r) { return !r.ok(); });
    if (errs) {
      auto it = std::find_if(lr.recs.begin(), lr.recs.end(), [](auto& r) { return !r.ok(); });
      warn(s, fmt::format("warmup: {} of {} requests failed: {}", errs, lr.recs.size(), it->error));
    }
  }

  for (size_t li = 0; li < c.concurrency.size(); ++li) {
    int conc = c.concurrency[li];
    int n = c.conversations > 0 ? c.conversations : 2 * conc;
    if (n < conc) warn(s, fmt::format("c={}: only {} conversations, so only {} users run at once", conc, n, n));
    auto plans = make_plans(c, 0x4c56000000ull + li, n);
    auto before = scrape(s, *cli);
    auto lr = run_users(s, conc, plans, fmt::format("c={}", conc));
    auto after = scrape(s, *cli);
    LevelResult L = compute_level(lr.recs, conc, n, c.num_gpus, lr.t0, lr.t1);
    L.truncated_conversations = lr.truncated;
    L.accept_length = accept_length_between(before, after);
    tier_stats_between(before, after, L);
    if (L.errors) warn(s, fmt::format("c={}: {} of {} requests failed; first: {}", conc, L.errors, L.requests, L.first_error));
    run.levels.push_back(std::move(L));
  }
  run.config = c;
  run.warnings = s.warnings;
  return run;
}

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    tok.erase(0, tok.find_first_not_of(' '));
    tok.erase(tok.find_last_not_of(' ') + 1);
    TS_CHECK(!tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos && tok.size() < 9,
             "'{}' is not a comma-separated list of positive integers", s);
    v.push_back(std::stoi(tok));
    i = j + 1;
  }
  return v;
}

std::pair<int, int> parse_range(const std::string& s) {
  size_t dash = s.find('-');
  auto num = [&](const std::string& t) {
    TS_CHECK(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 9,
             "'{}' is not a count (12) or a range (10-15)", s);
    return std::stoi(t);
  };
  if (dash == std::string::npos) {
    int n = num(s);
    return {n, n};
  }
  int a = num(s.substr(0, dash)), b = num(s.substr(dash + 1));
  TS_CHECK(a <= b, "range '{}': the lower end is larger", s);
  return {a, b};
}

}  // namespace ts::bench
