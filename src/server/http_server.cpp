#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/sse.h"

namespace ts::server {

namespace {
using Clock = std::chrono::steady_clock;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One choice being generated: its stream plus what has arrived so far.
struct Job {
  int index = 0, prompt_idx = 0;
  std::shared_ptr<Stream> stream;
  Clock::time_point t0, last;
  bool finished = false, got_first = false;
  std::string text;                 // non-streaming: the whole text
  std::vector<TokenLogprob> lps;    // non-streaming: all logprobs
  int64_t ntokens = 0;
  FinishReason reason = FinishReason::none;
  std::string error;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// Folds one event into the job's counters and the latency histograms.
void account(Job& j, const StreamEvent& ev, ServerMetrics& m) {
  auto now = Clock::now();
  int64_t k = static_cast<int64_t>(ev.tokens.size());
  if (k > 0) {
    if (!j.got_first) {
      m.ttft.observe(ev.ttft_s > 0 ? ev.ttft_s : secs(now - j.t0));
      j.got_first = true;
    } else {
      m.itl.observe(secs(now - j.last) / static_cast<double>(k), k);
    }
    j.last = now;
    j.ntokens += k;
  }
  if (ev.prompt_tokens > 0) j.prompt_tokens = ev.prompt_tokens;
  if (ev.completion_tokens > 0) j.completion_tokens = ev.completion_tokens;
  if (ev.cached_tokens > 0) j.cached_tokens = ev.cached_tokens;
  if (ev.finished) {
    j.finished = true;
    j.reason = ev.reason;
    j.error = ev.error;
    if (j.completion_tokens == 0) j.completion_tokens = static_cast<int>(j.ntokens);
    m.e2e.observe(secs(now - j.t0));
  }
}

// Waits up to timeout_ms for an event from any unfinished job; returns its index or -1.
int wait_any(std::vector<Job>& jobs, StreamEvent& ev, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int first = -1, active = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].finished) continue;
      ++active;
      if (first < 0) first = static_cast<int>(i);
    }
    if (first < 0) return -1;
    if (active == 1) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      return jobs[first].stream->pop(ev, std::max(left, 0)) ? first : -1;
    }
    for (size_t i = 0; i < jobs.size(); ++i)
      if (!jobs[i].finished && jobs[i].stream->pop(ev, 0)) return static_cast<int>(i);
    if (Clock::now() >= deadline) return -1;
    if (jobs[first].stream->pop(ev, 2)) return first;
  }
}

bool all_finished(const std::vector<Job>& jobs) {
  for (auto& j : jobs)
    if (!j.finished) return false;
  return true;
}

void cancel_all(std::vector<Job>& jobs) {
  for (auto& j : jobs)
    if (!j.finished) j.stream->cancel();
}

Usage total_usage(const std::vector<Job>& jobs, const std::vector<size_t>& prompt_sizes) {
  Usage u;
  std::vector<bool> counted(prompt_sizes.size(), false);
  for (auto& j : jobs) {
    u.completion_tokens += j.completion_tokens;
    if (!counted[j.prompt_idx]) {
      counted[j.prompt_idx] = true;
      u.prompt_tokens += j.prompt_tokens > 0 ? j.prompt_tokens : static_cast<int64_t>(prompt_sizes[j.prompt_idx]);
      u.cached_tokens += j.cached_tokens;
    }
  }
  return u;
}

Json finish_json(FinishReason r) {
  const char* s = finish_reason_str(r);
  return *s ? Json(s) : Json(nullptr);
}

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& param = "",
                const std::string& code = "") {
  res.status = status;
  res.set_content(dump(error_body(status, msg, param, code)), "application/json");
}
}  // namespace

// httplib's compiled listen backlog is 5: a burst of new connections (64 clients at once)
// overflows it and some clients fail. listen() again on the bound socket raises it.
class ListenServer : public httplib::Server {
 public:
  void raise_backlog(int n) {
    socket_t s = svr_sock_;
    if (s != INVALID_SOCKET) ::listen(s, n);
  }
};

struct HttpServer::Impl {
  ListenServer svr;
  ChatTemplates templates;
  ReasoningParser::Kind rkind = ReasoningParser::Kind::none;
  ToolCallParser::Kind tkind = ToolCallParser::Kind::none;
  mutable std::mutex mu;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<std::atomic<bool>> stopping = std::make_shared<std::atomic<bool>>(false);
  int64_t created = unix_time();
  ModelInfo info;

  std::shared_ptr<Backend> get_backend() const {
    std::lock_guard<std::mutex> lk(mu);
    return backend;
  }
  ModelInfo model_info() const {
    std::lock_guard<std::mutex> lk(mu);
    return info;
  }
};

HttpServer::HttpServer(ServerOptions opts) : impl_(std::make_unique<Impl>()), opts_(std::move(opts)) {
  if (opts_.served_model_name.empty()) opts_.served_model_name = opts_.model_path;
  impl_->rkind = ReasoningParser::kind_from_name(opts_.reasoning_parser);
  impl_->tkind = ToolCallParser::kind_from_name(opts_.tool_call_parser);
  impl_->templates = ChatTemplates::load(opts_.model_path, opts_.chat_template_file);
  if (impl_->templates.available()) spdlog::info("chat template: {}", impl_->templates.origin());
  else spdlog::warn("no chat template found for {}: /v1/chat/completions will answer 400 (use --chat-template)",
                    opts_.model_path);
  impl_->info.served_name = opts_.served_model_name;
  impl_->info.model_path = opts_.model_path;

  auto& svr = impl_->svr;
  int threads = std::max(opts_.http_threads, 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(opts_.max_request_bytes);
  svr.set_keep_alive_max_count(100000);
  svr.set_tcp_nodelay(true);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  Impl* im = impl_.get();
  ServerMetrics* metrics = &metrics_;
  const ServerOptions* o = &opts_;

  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) {
      if (res.status == 404)
        res.set_content(dump(error_body(404, "Route " + req.method + " " + req.path + " not found")), "application/json");
      else if (res.status == 413)
        res.set_content(dump(error_body(413, fmt::format("The request body is larger than the limit of {} bytes "
                                                         "(--max-request-bytes)",
                                                         opts_.max_request_bytes))),
                        "application/json");
      else if (res.status == 405)
        res.set_content(dump(error_body(405, "Method " + req.method + " not allowed for " + req.path)), "application/json");
      else
        res.set_content(dump(error_body(res.status, fmt::format("HTTP error {}", res.status))), "application/json");
    }
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, 500, msg);
  });
  svr.set_logger([metrics](const httplib::Request& req, const httplib::Response& res) {
    metrics->count_http(res.status);
    spdlog::debug("{} {} -> {}", req.method, req.path, res.status);
  });

  // Wraps a handler: JSON errors for ApiError / InvalidRequest / anything else.
  auto guarded = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status, e.what(), e.param, e.code);
      } catch (const InvalidRequest& e) {
        send_error(res, e.status(), e.what(), e.param());
      } catch (const std::exception& e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        send_error(res, 500, e.what());
      }
    };
  };
  auto need_backend = [im]() {
    auto b = im->get_backend();
    if (!b) throw ApiError(503, "The model is still loading; retry when GET /health returns 200");
    return b;
  };

  // --- health / models / metrics ---------------------------------------------------------------
  svr.Get("/health", [im](const httplib::Request&, httplib::Response& res) {
    if (im->get_backend()) {
      res.status = 200;
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      res.status = 503;
      res.set_content(dump(error_body(503, "The model is loading")), "application/json");
    }
  });
  auto model_card = [im, o]() {
    ModelInfo info = im->model_info();
    Json m = Json::object();
    m["id"] = o->served_model_name;
    m["object"] = "model";
    m["created"] = im->created;
    m["owned_by"] = "tokenspeed";
    m["root"] = o->model_path;
    m["max_model_len"] = info.context_length > 0 ? Json(info.context_length) : Json(nullptr);
    return m;
  };
  svr.Get("/v1/models", guarded([model_card](const httplib::Request&, httplib::Response& res) {
            Json out = Json::object();
            out["object"] = "list";
            out["data"] = Json::array({model_card()});
            res.set_content(dump(out), "application/json");
          }));
  svr.Get(R"(/v1/models/(.+))", guarded([model_card, im](const httplib::Request& req, httplib::Response& res) {
            std::string id = req.matches[1];
            ModelInfo info = im->model_info();
            if (id != info.served_name && id != info.model_path)
              throw ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found");
            res.set_content(dump(model_card()), "application/json");
          }));
  svr.Get("/metrics", [im, metrics, o](const httplib::Request&, httplib::Response& res) {
    auto b = im->get_backend();
    std::string text;
    if (b) {
      EngineMetrics em = b->metrics();
      text = render_prometheus(&em, *metrics, o->served_model_name);
    } else {
      text = render_prometheus(nullptr, *metrics, o->served_model_name);
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });

  // --- generation ----------------------------------------------------------------------------
  svr.Post("/v1/completions", guarded([this, need_backend](const httplib::Request& req, httplib::Response& res) {
             handle_completions(need_backend(), req, res);
           }));
  svr.Post("/v1/chat/completions", guarded([this, need_backend](const httplib::Request& req, httplib::Response& res) {
             handle_chat(need_backend(), req, res);
           }));

  // --- 405 for known routes with the wrong method ------------------------------------------------
  auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    send_error(res, 405, "Method " + req.method + " not allowed for " + req.path);
  };
  for (const char* p : {"/v1/completions", "/v1/chat/completions"}) {
    svr.Get(p, not_allowed);
    svr.Put(p, not_allowed);
    svr.Delete(p, not_allowed);
    svr.Patch(p, not_allowed);
  }
  for (const char* p : {"/health", "/metrics", "/v1/models", R"(/v1/models/(.+))"}) {
    svr.Post(p, not_allowed);
    svr.Put(p, not_allowed);
    svr.Delete(p, not_allowed);
    svr.Patch(p, not_allowed);
  }
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
  auto& svr = impl_->svr;
  if (opts_.port == 0) {
    port_ = svr.bind_to_any_port(opts_.host);
    if (port_ <= 0) fail("cannot bind {} (any port)", opts_.host);
  } else {
    if (!svr.bind_to_port(opts_.host, opts_.port)) fail("cannot bind {}:{} (in use?)", opts_.host, opts_.port);
    port_ = opts_.port;
  }
  svr.raise_backlog(4096);
}

void HttpServer::run() {
  if (!impl_->stopping->load()) impl_->svr.listen_after_bind();
}

bool HttpServer::running() const { return impl_->svr.is_running(); }

void HttpServer::stop() {
  impl_->stopping->store(true);
  impl_->svr.stop();
}

void HttpServer::set_backend(std::shared_ptr<Backend> backend) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->info.context_length = backend->context_length();
  impl_->info.vocab_size = backend->vocab_size();
  impl_->backend = std::move(backend);
}

bool HttpServer::ready() const { return impl_->get_backend() != nullptr; }

// --- shared by both generation routes ---------------------------------------------------------------
namespace {
// Submits one stream per (prompt, n); on failure cancels what was already submitted.
std::vector<Job> submit_jobs(Backend& b, const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& base,
                             int n) {
  std::vector<Job> jobs;
  try {
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (int k = 0; k < n; ++k) {
        GenerateParams gp = base;
        gp.prompt = prompts[p];
        if (gp.seed && k > 0) *gp.seed += static_cast<uint64_t>(k);  // n samples differ, reproducibly
        Job j;
        j.index = static_cast<int>(p) * n + k;
        j.prompt_idx = static_cast<int>(p);
        j.t0 = Clock::now();
        j.stream = b.submit(std::move(gp));
        jobs.push_back(std::move(j));
      }
    }
  } catch (...) {
    cancel_all(jobs);
    throw;
  }
  return jobs;
}

// Non-streaming: waits for every job, accumulating text and logprobs.
void collect(std::vector<Job>& jobs, ServerMetrics& m, const std::atomic<bool>& stopping) {
  while (!all_finished(jobs)) {
    StreamEvent ev;
    int i = wait_any(jobs, ev, 200);
    if (stopping.load()) {
      cancel_all(jobs);
      throw ApiError(503, "The server is shutting down");
    }
    if (i < 0) continue;
    Job& j = jobs[i];
    j.text += ev.text;
    for (auto& lp : ev.logprobs) j.lps.push_back(std::move(lp));
    account(j, ev, m);
  }
  for (auto& j : jobs)
    if (!j.error.empty()) throw ApiError(500, "Generation failed: " + j.error);
}

struct StreamState {
  std::vector<Job> jobs;
  std::vector<size_t> prompt_sizes;
  std::string id, model, object;
  int64_t created = 0;
  bool include_usage = false, done = false;
  Clock::time_point last_write = Clock::now();
  std::vector<bool> started;
  std::vector<size_t> offsets;
};

// One call of an SSE content provider: waits for the next event. Returns false when the client is
// gone (its streams are cancelled) or the server stops. `on_event` writes the chunk(s) for one event
// and returns false when a write fails; `on_all_done` writes the trailer.
template <class OnEvent>
bool pump(StreamState& st, httplib::DataSink& sink, ServerMetrics& m, const std::atomic<bool>& stopping,
          OnEvent&& on_event) {
  SseWriter w(sink);
  if (st.done) return false;
  StreamEvent ev;
  int i = wait_any(st.jobs, ev, 500);
  if (stopping.load()) {
    cancel_all(st.jobs);
    return false;
  }
  if (i < 0) {
    if (Clock::now() - st.last_write > std::chrono::seconds(2)) {
      if (!w.send_raw(kSseKeepAlive)) {
        cancel_all(st.jobs);
        return false;
      }
      st.last_write = Clock::now();
    }
    return true;
  }
  Job& j = st.jobs[i];
  account(j, ev, m);
  if (!ev.error.empty()) {
    w.send(error_body(500, "Generation failed: " + ev.error));
    cancel_all(st.jobs);
    w.done();
    st.done = true;
    return true;
  }
  if (!on_event(w, i, ev)) {
    cancel_all(st.jobs);
    return false;
  }
  st.last_write = Clock::now();
  if (all_finished(st.jobs)) {
    if (st.include_usage) {
      Json u = Json::object();
      u["id"] = st.id;
      u["object"] = st.object;
      u["created"] = st.created;
      u["model"] = st.model;
      u["choices"] = Json::array();
      u["usage"] = usage_json(total_usage(st.jobs, st.prompt_sizes));
      if (!w.send(u)) return false;
    }
    w.done();
    st.done = true;
  }
  return true;
}

void start_sse(httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
}
}  // namespace

// --- /v1/completions ---------------------------------------------------------------------------------
void HttpServer::handle_completions(std::shared_ptr<Backend> b, const httplib::Request& req, httplib::Response& res) {
  Json body = parse_body(req.body);
  ModelInfo info = impl_->model_info();
  CompletionRequest cr = parse_completion_request(
      body, info, [&](const std::string& s) { return b->encode(s, true); },
      [&](const std::vector<int32_t>& ids) { return b->decode(ids, false); });
  metrics_.generate_requests++;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> sizes;
  for (auto& p : cr.prompts) {
    prompts.push_back(p.ids);
    sizes.push_back(p.ids.size());
  }
  auto piece = [b](int32_t id) { return b->decode({id}, false); };
  std::string id = random_id("cmpl-");
  int64_t created = unix_time();

  if (!cr.stream) {
    std::vector<Job> jobs = submit_jobs(*b, prompts, cr.params, cr.n);
    collect(jobs, metrics_, *impl_->stopping);
    Json choices = Json::array();
    for (auto& j : jobs) {
      const PromptInput& p = cr.prompts[j.prompt_idx];
      Json c = Json::object();
      c["index"] = j.index;
      c["text"] = cr.echo ? p.text + j.text : j.text;
      if (cr.logprobs >= 0) {
        CompletionLogprobs L;
        size_t off = 0;
        if (cr.echo) L.add_prompt(p.ids, piece, off);
        L.add(j.lps, piece, off);
        c["logprobs"] = L.to_json();
      } else {
        c["logprobs"] = nullptr;
      }
      c["finish_reason"] = finish_json(j.reason);
      choices.push_back(std::move(c));
    }
    Json out = Json::object();
    out["id"] = id;
    out["object"] = "text_completion";
    out["created"] = created;
    out["model"] = opts_.served_model_name;
    out["choices"] = std::move(choices);
    out["usage"] = usage_json(total_usage(jobs, sizes));
    res.set_content(dump(out), "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->jobs = submit_jobs(*b, prompts, cr.params, cr.n);
  st->prompt_sizes = sizes;
  st->id = id;
  st->model = opts_.served_model_name;
  st->object = "text_completion";
  st->created = created;
  st->include_usage = cr.include_usage;
  st->started.assign(st->jobs.size(), false);
  st->offsets.assign(st->jobs.size(), 0);
  auto crp = std::make_shared<CompletionRequest>(std::move(cr));
  auto stopping = impl_->stopping;
  ServerMetrics* m = &metrics_;
  start_sse(res);
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, crp, stopping, m, piece](size_t, httplib::DataSink& sink) {
        return pump(*st, sink, *m, *stopping, [&](SseWriter& w, int i, const StreamEvent& ev) {
          Job& j = st->jobs[i];
          const PromptInput& p = crp->prompts[j.prompt_idx];
          std::string text = ev.text;
          Json lp = nullptr;
          bool first = !st->started[i];
          st->started[i] = true;
          if (first && crp->echo) text = p.text + text;
          if (crp->logprobs >= 0) {
            CompletionLogprobs L;
            if (first && crp->echo) L.add_prompt(p.ids, piece, st->offsets[i]);
            L.add(ev.logprobs, piece, st->offsets[i]);
            lp = L.to_json();
          }
          if (text.empty() && !ev.finished && ev.logprobs.empty()) return true;
          Json c = Json::object();
          c["index"] = j.index;
          c["text"] = text;
          c["logprobs"] = lp;
          c["finish_reason"] = ev.finished ? finish_json(ev.reason) : Json(nullptr);
          Json out = Json::object();
          out["id"] = st->id;
          out["object"] = "text_completion";
          out["created"] = st->created;
          out["model"] = st->model;
          out["choices"] = Json::array({std::move(c)});
          return w.send(out);
        });
      },
      [st](bool) { cancel_all(st->jobs); });
}

// --- /v1/chat/completions ----------------------------------------------------------------------------
namespace {
Json delta_json(const ChatDelta& d, int& tool_index) {
  Json o = Json::object();
  if (!d.reasoning.empty()) o["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) o["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (auto& c : d.tool_calls) {
      Json tc = Json::object();
      tc["index"] = tool_index++;
      tc["id"] = c.id;
      tc["type"] = "function";
      tc["function"] = Json{{"name", c.name}, {"arguments", c.arguments}};
      calls.push_back(std::move(tc));
    }
    o["tool_calls"] = std::move(calls);
  }
  return o;
}

Json chat_finish(FinishReason r, bool tool_calls) {
  if (tool_calls && r == FinishReason::stop) return "tool_calls";
  return finish_json(r);
}
}  // namespace

void HttpServer::handle_chat(std::shared_ptr<Backend> b, const httplib::Request& req, httplib::Response& res) {
  Json body = parse_body(req.body);
  ModelInfo info = impl_->model_info();
  ChatRequest cr = parse_chat_request(body, info);
  std::string prompt = impl_->templates.render(cr.messages, cr.tools, cr.template_kwargs);
  std::vector<int32_t> ids = b->encode(prompt, false);
  if (ids.empty()) throw ApiError(400, "The chat template rendered an empty prompt", "messages");
  auto np = static_cast<int64_t>(ids.size());
  if (cr.max_tokens) {
    check_context(np, *cr.max_tokens, info.context_length, "messages");
    cr.params.max_tokens = static_cast<int>(*cr.max_tokens);
  } else {
    if (np >= info.context_length)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, your messages resulted "
                                 "in {} tokens. Please reduce the length of the messages.",
                                 info.context_length, np),
                     "messages");
    cr.params.max_tokens = static_cast<int>(info.context_length - np);
  }
  metrics_.generate_requests++;
  bool parse_tools = !cr.tools.is_null() && cr.tool_choice != ToolChoice::none;
  ToolCallParser::Kind tkind = parse_tools ? impl_->tkind : ToolCallParser::Kind::none;
  ReasoningParser::Kind rkind = impl_->rkind;
  auto piece = [b](int32_t id) { return b->decode({id}, false); };
  std::string id = random_id("chatcmpl-");
  int64_t created = unix_time();
  bool want_lp = cr.logprobs;
  int top = cr.top_logprobs;

  if (!cr.stream) {
    std::vector<Job> jobs = submit_jobs(*b, {ids}, cr.params, cr.n);
    collect(jobs, metrics_, *impl_->stopping);
    Json choices = Json::array();
    for (auto& j : jobs) {
      ChatOutputParser parser(rkind, tkind);
      ChatDelta all = parser.feed(j.text);
      ChatDelta end = parser.finish();
      all.reasoning += end.reasoning;
      all.content += end.content;
      for (auto& c : end.tool_calls) all.tool_calls.push_back(std::move(c));
      Json msg = Json::object();
      msg["role"] = "assistant";
      bool has_calls = !all.tool_calls.empty();
      msg["content"] = (has_calls && all.content.empty()) ? Json(nullptr) : Json(all.content);
      if (rkind != ReasoningParser::Kind::none)
        msg["reasoning_content"] = all.reasoning.empty() ? Json(nullptr) : Json(all.reasoning);
      if (has_calls) {
        int ti = 0;
        msg["tool_calls"] = delta_json(ChatDelta{"", "", all.tool_calls}, ti)["tool_calls"];
        for (auto& tc : msg["tool_calls"]) tc.erase("index");
      }
      Json c = Json::object();
      c["index"] = j.index;
      c["message"] = std::move(msg);
      c["logprobs"] = want_lp ? Json{{"content", chat_logprobs_content(j.lps, top, piece)}} : Json(nullptr);
      c["finish_reason"] = chat_finish(j.reason, has_calls);
      choices.push_back(std::move(c));
    }
    Json out = Json::object();
    out["id"] = id;
    out["object"] = "chat.completion";
    out["created"] = created;
    out["model"] = opts_.served_model_name;
    out["choices"] = std::move(choices);
    out["usage"] = usage_json(total_usage(jobs, {ids.size()}));
    res.set_content(dump(out), "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->jobs = submit_jobs(*b, {ids}, cr.params, cr.n);
  st->prompt_sizes = {ids.size()};
  st->id = id;
  st->model = opts_.served_model_name;
  st->object = "chat.completion.chunk";
  st->created = created;
  st->include_usage = cr.include_usage;
  st->started.assign(st->jobs.size(), false);
  auto parsers = std::make_shared<std::vector<ChatOutputParser>>();
  auto tool_idx = std::make_shared<std::vector<int>>(st->jobs.size(), 0);
  for (size_t i = 0; i < st->jobs.size(); ++i) parsers->emplace_back(rkind, tkind);
  auto stopping = impl_->stopping;
  ServerMetrics* m = &metrics_;
  start_sse(res);
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, parsers, tool_idx, stopping, m, piece, want_lp, top](size_t, httplib::DataSink& sink) {
        return pump(*st, sink, *m, *stopping, [&](SseWriter& w, int i, const StreamEvent& ev) {
          Job& j = st->jobs[i];
          auto chunk = [&](Json delta, Json lp, Json finish) {
            Json c = Json::object();
            c["index"] = j.index;
            c["delta"] = std::move(delta);
            c["logprobs"] = std::move(lp);
            c["finish_reason"] = std::move(finish);
            Json out = Json::object();
            out["id"] = st->id;
            out["object"] = "chat.completion.chunk";
            out["created"] = st->created;
            out["model"] = st->model;
            out["choices"] = Json::array({std::move(c)});
            return w.send(out);
          };
          if (!st->started[i]) {
            st->started[i] = true;
            if (!chunk(Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) return false;
          }
          auto& parser = (*parsers)[i];
          ChatDelta d = parser.feed(ev.text);
          if (ev.finished) {
            ChatDelta end = parser.finish();
            d.reasoning += end.reasoning;
            d.content += end.content;
            for (auto& c : end.tool_calls) d.tool_calls.push_back(std::move(c));
          }
          Json lp = nullptr;
          if (want_lp && !ev.logprobs.empty()) lp = Json{{"content", chat_logprobs_content(ev.logprobs, top, piece)}};
          if (d.empty() && lp.is_null() && !ev.finished) return true;
          Json finish = ev.finished ? chat_finish(ev.reason, parser.has_tool_calls()) : Json(nullptr);
          return chunk(delta_json(d, (*tool_idx)[i]), std::move(lp), std::move(finish));
        });
      },
      [st](bool) { cancel_all(st->jobs); });
}

}  // namespace ts::server
