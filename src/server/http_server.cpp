#include "server/http_server.h"

#include <chrono>
#include <functional>
#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "server/api_endpoints.h"
#include "server/api_protocol.h"
#include "server/http/transport.h"
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
  std::shared_ptr<StopInfo> stop = std::make_shared<StopInfo>();  // filled by the stream's filter
};

// vLLM's stop_reason: the stop string or stop_token_ids entry that ended the choice, else null.
Json stop_reason_json(const StopInfo& s) {
  if (!s.stop_str.empty()) return s.stop_str;
  if (s.stop_token >= 0) return s.stop_token;
  return nullptr;
}

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

bool all_finished(const std::vector<Job>& jobs) {
  for (auto& j : jobs)
    if (!j.finished) return false;
  return true;
}

void cancel_all(std::vector<Job>& jobs) {
  for (auto& j : jobs)
    if (!j.finished && j.stream) j.stream->cancel();
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

// The envelope every completion response and chunk shares (OpenAI field order); callers add
// "usage" where it belongs.
Json completion_json(const std::string& id, const std::string& object, int64_t created, const std::string& model,
                     Json choices) {
  Json out = Json::object();
  out["id"] = id;
  out["object"] = object;
  out["created"] = created;
  out["model"] = model;
  out["choices"] = std::move(choices);
  return out;
}

http::Reply json_reply(int status, std::string body) {
  http::Reply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

http::Reply error_reply(int status, const std::string& msg, const std::string& param = "",
                        const std::string& code = "") {
  return json_reply(status, dump(error_body(status, msg, param, code)));
}

// One admitted generation request, counted in ServerMetrics::queued_requests until its first
// token arrives (or it ends): what --max-queued-requests bounds.
class Ticket {
 public:
  Ticket() = default;
  explicit Ticket(std::atomic<int64_t>* q) : q_(q) {}
  Ticket(Ticket&& o) noexcept : q_(std::exchange(o.q_, nullptr)) {}
  Ticket& operator=(Ticket&& o) noexcept {
    release();
    q_ = std::exchange(o.q_, nullptr);
    return *this;
  }
  ~Ticket() { release(); }
  void release() {
    if (q_) --*q_;
    q_ = nullptr;
  }

 private:
  std::atomic<int64_t>* q_ = nullptr;
};

// The engine streams of one HTTP request, drained on its connection's strand whenever one of
// them notifies. Streaming: every event becomes SSE chunk(s) via `on_event`; buffered: the
// events are accumulated and `build` makes the reply once all have finished.
class GenProducer final : public http::Producer {
 public:
  using OnEvent = std::function<void(int, const StreamEvent&, std::string&)>;
  using Build = std::function<http::Reply(std::vector<Job>&)>;

  GenProducer(ServerMetrics& m, Ticket t, std::vector<Job> jobs, bool stream)
      : m_(m), ticket_(std::move(t)), jobs_(std::move(jobs)), stream_(stream) {}
  ~GenProducer() override { cancel_all(jobs_); }  // unfinished here: client gone or shutdown

  OnEvent on_event;
  Build build;
  std::vector<size_t> prompt_sizes;
  std::string id, model, object;
  int64_t created = 0;
  bool include_usage = false;

  const Job& job(size_t i) const { return jobs_[i]; }
  bool streaming() const override { return stream_; }
  void start(const std::shared_ptr<StreamWaker>& waker, uint64_t tag) override {
    for (auto& j : jobs_) j.stream->set_waker(waker, tag);
  }
  bool poll(std::string& out) override {
    if (done_) return true;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Job& j = jobs_[i];
      StreamEvent ev;
      while (!j.finished && j.stream->try_pop(ev)) {
        ticket_.release();
        account(j, ev, m_);
        if (!stream_) {
          j.text += ev.text;
          for (auto& lp : ev.logprobs) j.lps.push_back(std::move(lp));
          continue;
        }
        if (!ev.error.empty()) {
          out += sse_data(error_body(500, "Generation failed: " + ev.error));
          out += kSseDone;
          cancel_all(jobs_);
          return done_ = true;
        }
        on_event(static_cast<int>(i), ev, out);
      }
    }
    if (!all_finished(jobs_)) return false;
    if (stream_) {
      if (include_usage) {
        Json u = completion_json(id, object, created, model, Json::array());
        u["usage"] = usage_json(total_usage(jobs_, prompt_sizes));
        out += sse_data(u);
      }
      out += kSseDone;
    }
    return done_ = true;
  }
  http::Reply reply() override {
    if (shut_) return error_reply(503, "The server is shutting down", "", "server_shutting_down");
    for (auto& j : jobs_)
      if (!j.error.empty()) return error_reply(500, "Generation failed: " + j.error);
    try {
      return build(jobs_);
    } catch (const std::exception& e) {
      return error_reply(500, e.what());
    }
  }
  void cancel() override { cancel_all(jobs_); }
  std::string keepalive() override { return kSseKeepAlive; }
  void shutdown(std::string& out) override {
    cancel_all(jobs_);
    shut_ = done_ = true;
    if (stream_) {
      out += sse_data(error_body(503, "The server is shutting down", "", "server_shutting_down"));
      out += kSseDone;
    }
  }

 private:
  ServerMetrics& m_;
  Ticket ticket_;
  std::vector<Job> jobs_;
  bool stream_, done_ = false, shut_ = false;
};

// Submits one stream per (prompt, n); on failure cancels what was already submitted.
std::vector<Job> submit_jobs(Backend& b, const std::vector<std::vector<int32_t>>& prompts, const GenerateParams& base,
                             int n, const SubmitOptions& text = {}) {
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
        SubmitOptions so = text;
        so.stop_info = j.stop;
        j.stream = b.submit(std::move(gp), so);
        jobs.push_back(std::move(j));
      }
    }
  } catch (...) {
    cancel_all(jobs);
    throw;
  }
  return jobs;
}

http::Result sse_result(std::unique_ptr<GenProducer> p) {
  http::Result r;
  r.reply.content_type = "text/event-stream";
  r.reply.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  r.producer = std::move(p);
  return r;
}

Json delta_json(const ChatDelta& d, int& tool_index) {
  Json o = Json::object();
  if (!d.reasoning.empty()) o["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) o["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (auto& c : d.tool_calls) {
      Json tc = Json::object();
      if (c.continuation) {  // streamed arguments: a fragment of the last call's
        tc["index"] = tool_index - 1;
        tc["function"] = Json{{"arguments", c.arguments}};
      } else {
        tc["index"] = tool_index++;
        tc["id"] = c.id;
        tc["type"] = "function";
        tc["function"] = Json{{"name", c.name}, {"arguments", c.arguments}};
      }
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

struct HttpServer::Impl final : http::Handler {
  const ServerOptions& opts;
  ServerMetrics& metrics;
  ChatTemplates templates;
  ReasoningParser::Kind rkind = ReasoningParser::Kind::none;
  ToolCallParser::Kind tkind = ToolCallParser::Kind::none;
  mutable std::mutex mu;
  std::shared_ptr<Backend> backend;
  int64_t created = unix_time();
  ModelInfo info;
  std::unique_ptr<http::Transport> transport;
  std::unique_ptr<ApiEndpoints> api;  // the routes of server/api_endpoints.h

  Impl(const ServerOptions& o, ServerMetrics& m) : opts(o), metrics(m) {}

  std::shared_ptr<Backend> get_backend() const {
    std::lock_guard<std::mutex> lk(mu);
    return backend;
  }
  ModelInfo model_info() const {
    std::lock_guard<std::mutex> lk(mu);
    return info;
  }

  http::Reply error_reply(int status, const std::string& msg) override { return server::error_reply(status, msg); }

  Json model_card() const {
    ModelInfo mi = model_info();
    Json m = Json::object();
    m["id"] = opts.served_model_name;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "tokenspeed";
    m["root"] = opts.model_path;
    m["max_model_len"] = mi.context_length > 0 ? Json(mi.context_length) : Json(nullptr);
    return m;
  }

  // Routing and everything cheap, on an I/O thread; generation requests are admitted here and
  // prepared on a worker.
  bool handle_inline(const http::Request& req, http::Result& out) override {
    const std::string& p = req.path;
    auto not_allowed = [&] {
      out.reply = server::error_reply(405, "Method " + req.method + " not allowed for " + p);
      return true;
    };
    bool get = req.method == "GET";
    if (!opts.api_key.empty() && !api_key_exempt(p) && !api_key_ok(req.headers, opts.api_key)) {
      out.reply = ApiEndpoints::error_for(p, 401, "Invalid or missing API key (send 'Authorization: Bearer KEY')", "",
                                          "invalid_api_key");
      out.reply.headers.push_back({"WWW-Authenticate", "Bearer"});
      return true;
    }
    if (api && api->handle_inline(req, out)) return true;
    bool api_route = ApiEndpoints::is_prepared_route(p);
    if (p == "/health") {
      if (!get) return not_allowed();
      out.reply = get_backend() ? json_reply(200, "{\"status\":\"ok\"}") : server::error_reply(503, "The model is loading");
      return true;
    }
    if (p == "/metrics") {
      if (!get) return not_allowed();
      auto b = get_backend();
      EngineMetrics em;
      if (b) em = b->metrics();
      out.reply.body = render_prometheus(b ? &em : nullptr, metrics, opts.served_model_name);
      out.reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
      return true;
    }
    if (p == "/v1/models") {
      if (!get) return not_allowed();
      Json o = Json::object();
      o["object"] = "list";
      o["data"] = Json::array({model_card()});
      out.reply = json_reply(200, dump(o));
      return true;
    }
    if (p.rfind("/v1/models/", 0) == 0 && p.size() > 11) {
      if (!get) return not_allowed();
      std::string id = p.substr(11);
      ModelInfo mi = model_info();
      if (id != mi.served_name && id != mi.model_path)
        out.reply = server::error_reply(404, "The model '" + id + "' does not exist", "model", "model_not_found");
      else
        out.reply = json_reply(200, dump(model_card()));
      return true;
    }
    if (p == "/v1/completions" || p == "/v1/chat/completions" || api_route) {
      if (req.method != "POST") {
        if (!api_route) return not_allowed();
        out.reply = ApiEndpoints::error_for(p, 405, "Method " + req.method + " not allowed for " + p);
        return true;
      }
      if (!get_backend()) {
        out.reply = ApiEndpoints::error_for(p, 503, "The model is still loading; retry when GET /health returns 200");
        return true;
      }
      int64_t cap = opts.limits.max_queued_requests;
      if (cap > 0 && metrics.queued_requests.load() >= cap) {
        metrics.count_limit("queue_full");
        out.reply = ApiEndpoints::error_for(p, 
            503, fmt::format("The server is overloaded: {} requests are already waiting (--max-queued-requests); retry later",
                             cap),
            "", "server_overloaded");
        return true;
      }
      ++metrics.queued_requests;
      return false;
    }
    out.reply = server::error_reply(404, "Route " + req.method + " " + p + " not found");
    return true;
  }

  http::Result prepare(http::Request& req) override {
    if (ApiEndpoints::is_prepared_route(req.path)) {
      QueueHold hold(&metrics.queued_requests);
      auto b = get_backend();
      if (!b) return {ApiEndpoints::error_for(req.path, 503, "The model is still loading"), nullptr};
      return api->prepare(req, b, model_info(), std::move(hold));
    }
    Ticket t(&metrics.queued_requests);
    try {
      auto b = get_backend();
      if (!b) throw ApiError(503, "The model is still loading; retry when GET /health returns 200");
      if (req.path == "/v1/completions") return completions(b, req, std::move(t));
      return chat(b, req, std::move(t));
    } catch (const ApiError& e) {
      return {server::error_reply(e.status, e.what(), e.param, e.code), nullptr};
    } catch (const InvalidRequest& e) {
      return {server::error_reply(e.status(), e.what(), e.param()), nullptr};
    } catch (const std::exception& e) {
      spdlog::error("{} {}: {}", req.method, req.path, e.what());
      return {server::error_reply(500, e.what()), nullptr};
    }
  }

  http::Result completions(std::shared_ptr<Backend> b, const http::Request& req, Ticket ticket);
  http::Result chat(std::shared_ptr<Backend> b, const http::Request& req, Ticket ticket);

  // Tools without --tool-call-parser use the hermes syntax (tool_call_kind, api_endpoints.h).
  ToolCallParser::Kind tool_kind() const { return tool_call_kind(tkind); }
  void apply_tool_choice(ChatRequest& cr, const Backend& b) const {
    server::apply_tool_choice(cr, tkind, rkind, opts.tool_choice_auto_grammar,
                              cr.tools.empty() ? std::vector<std::string>{} : special_tool_markers(b, tkind));
  }
};

HttpServer::HttpServer(ServerOptions opts) : opts_(std::move(opts)) {
  if (opts_.served_model_name.empty()) opts_.served_model_name = opts_.model_path;
  opts_.limits.max_body_bytes = opts_.max_request_bytes;
  impl_ = std::make_unique<Impl>(opts_, metrics_);
  impl_->rkind = ReasoningParser::kind_from_name(opts_.reasoning_parser);
  impl_->tkind = ToolCallParser::kind_from_name(opts_.tool_call_parser);
  impl_->templates = ChatTemplates::load(opts_.model_path, opts_.chat_template_file);
  if (impl_->templates.available()) spdlog::info("chat template: {}", impl_->templates.origin());
  else spdlog::warn("no chat template found for {}: /v1/chat/completions will answer 400 (use --chat-template)",
                    opts_.model_path);
  ApiEndpointsOptions ao;
  ao.served_model_name = opts_.served_model_name;
  ao.rkind = impl_->rkind;
  ao.tkind = impl_->tkind;
  ao.responses_store_size = opts_.responses_store_size;
  ao.tool_choice_auto_grammar = opts_.tool_choice_auto_grammar;
  TS_CHECK(opts_.embedding_pooling == "last" || opts_.embedding_pooling == "mean",
           "--embedding-pooling must be last or mean (got '{}')", opts_.embedding_pooling);
  ao.mean_pooling = opts_.embedding_pooling == "mean";
  impl_->api = std::make_unique<ApiEndpoints>(std::move(ao), metrics_, impl_->templates);
  impl_->info.served_name = opts_.served_model_name;
  impl_->info.model_path = opts_.model_path;
  impl_->transport = std::make_unique<http::Transport>(*impl_, metrics_, opts_.limits, opts_.http_threads,
                                                       opts_.http_workers, opts_.drain_timeout_s);
}

HttpServer::~HttpServer() {
  stop();
  impl_->transport.reset();  // joins the workers while the handler (impl_) is alive
}

void HttpServer::bind() { port_ = impl_->transport->bind(opts_.host, opts_.port); }
void HttpServer::run() { impl_->transport->run(); }
bool HttpServer::running() const { return impl_->transport->running(); }
void HttpServer::stop() {
  if (impl_->transport) impl_->transport->stop();
}

void HttpServer::set_backend(std::shared_ptr<Backend> backend) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->info.context_length = backend->context_length();
  impl_->info.vocab_size = backend->vocab_size();
  impl_->backend = std::move(backend);
}

bool HttpServer::ready() const { return impl_->get_backend() != nullptr; }

// --- /v1/completions ---------------------------------------------------------------------------------
http::Result HttpServer::Impl::completions(std::shared_ptr<Backend> b, const http::Request& req, Ticket ticket) {
  Json body = parse_body(req.body);
  ModelInfo mi = model_info();
  CompletionRequest cr = parse_completion_request(
      body, mi, [&](const std::string& s) { return b->encode(s, true); },
      [&](const std::vector<int32_t>& ids) { return b->decode(ids, false); });
  metrics.generate_requests++;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<size_t> sizes;
  for (auto& p : cr.prompts) {
    prompts.push_back(p.ids);
    sizes.push_back(p.ids.size());
  }
  auto piece = [b](int32_t id) { return b->decode({id}, false); };
  // Prompt logprobs (prompt_logprobs, echo + logprobs): a prefill-only pass per prompt, before
  // the generation is submitted (blocking this worker; the engine runs it between steps).
  std::vector<Backend::PromptLogprobs> plps;
  int ptop = std::max(cr.prompt_logprobs, cr.echo ? cr.logprobs : -1);
  if (ptop >= 0)
    for (auto& p : cr.prompts) plps.push_back(b->prompt_logprobs(p.ids, ptop));
  auto crp = std::make_shared<CompletionRequest>(std::move(cr));
  auto prod = std::make_unique<GenProducer>(
      metrics, std::move(ticket), submit_jobs(*b, prompts, crp->params, crp->n,
                                SubmitOptions{.include_stop_str = crp->include_stop_str, .skip_special = crp->skip_special_tokens,
                                              .stop_info = nullptr}), crp->stream);
  prod->prompt_sizes = sizes;
  prod->id = random_id("cmpl-");
  prod->model = opts.served_model_name;
  prod->object = "text_completion";
  prod->created = unix_time();
  prod->include_usage = crp->include_usage;

  if (!crp->stream) {
    prod->build = [crp, piece, sizes, plps, id = prod->id, created = prod->created,
                   model = prod->model](std::vector<Job>& jobs) {
      Json choices = Json::array();
      for (auto& j : jobs) {
        const PromptInput& p = crp->prompts[j.prompt_idx];
        Json c = Json::object();
        c["index"] = j.index;
        c["text"] = crp->echo ? p.text + j.text : j.text;
        if (crp->logprobs >= 0) {
          CompletionLogprobs L;
          size_t off = 0;
          if (crp->echo) add_prompt_logprobs(L, p.ids, plps.at(size_t(j.prompt_idx)).lps, crp->logprobs, piece, off);
          L.add(j.lps, piece, off);
          c["logprobs"] = L.to_json();
        } else {
          c["logprobs"] = nullptr;
        }
        c["finish_reason"] = finish_json(j.reason);
        c["stop_reason"] = stop_reason_json(*j.stop);
        if (crp->prompt_logprobs >= 0) {
          const auto& pl = plps.at(size_t(j.prompt_idx));
          c["prompt_logprobs"] = vllm_prompt_logprobs(p.ids, pl.lps, pl.ranks, crp->prompt_logprobs, piece);
        }
        choices.push_back(std::move(c));
      }
      Json out = completion_json(id, "text_completion", created, model, std::move(choices));
      out["usage"] = usage_json(total_usage(jobs, sizes));
      return json_reply(200, dump(out));
    };
    return {http::Reply{}, std::move(prod)};
  }

  // Per choice: whether its first chunk went out (echo), and its logprob text offset.
  size_t njobs = crp->prompts.size() * static_cast<size_t>(crp->n);
  auto started = std::make_shared<std::vector<bool>>(njobs, false);
  auto offsets = std::make_shared<std::vector<size_t>>(njobs, 0);
  GenProducer* self = prod.get();
  prod->on_event = [crp, piece, started, offsets, self, plps](int i, const StreamEvent& ev, std::string& w) {
    const PromptInput& p = crp->prompts[static_cast<size_t>(i) / static_cast<size_t>(crp->n)];
    std::string text = ev.text;
    Json lp = nullptr;
    bool first = !(*started)[i];
    (*started)[i] = true;
    if (first && crp->echo) text = p.text + text;
    if (crp->logprobs >= 0) {
      CompletionLogprobs L;
      if (first && crp->echo)
        add_prompt_logprobs(L, p.ids, plps.at(size_t(i) / size_t(crp->n)).lps, crp->logprobs, piece, (*offsets)[i]);
      L.add(ev.logprobs, piece, (*offsets)[i]);
      lp = L.to_json();
    }
    if (text.empty() && !ev.finished && ev.logprobs.empty() && !(first && crp->prompt_logprobs >= 0)) return;
    Json c = Json::object();
    c["index"] = i;
    c["text"] = text;
    c["logprobs"] = lp;
    c["finish_reason"] = ev.finished ? finish_json(ev.reason) : Json(nullptr);
    c["stop_reason"] = ev.finished ? stop_reason_json(*self->job(size_t(i)).stop) : Json(nullptr);
    if (first && crp->prompt_logprobs >= 0) {
      const auto& pl = plps.at(size_t(i) / size_t(crp->n));
      c["prompt_logprobs"] = vllm_prompt_logprobs(p.ids, pl.lps, pl.ranks, crp->prompt_logprobs, piece);
    }
    w += sse_data(completion_json(self->id, "text_completion", self->created, self->model, Json::array({std::move(c)})));
  };
  return sse_result(std::move(prod));
}

// --- /v1/chat/completions ----------------------------------------------------------------------------
http::Result HttpServer::Impl::chat(std::shared_ptr<Backend> b, const http::Request& req, Ticket ticket) {
  Json body = parse_body(req.body);
  ModelInfo mi = model_info();
  ChatRequest cr = parse_chat_request(body, mi);
  apply_tool_choice(cr, *b);
  std::string prompt = templates.render(cr);
  std::vector<int32_t> ids = b->encode(prompt, false);
  if (ids.empty()) throw ApiError(400, "The chat template rendered an empty prompt", "messages");
  auto np = static_cast<int64_t>(ids.size());
  if (cr.max_tokens) {
    check_context(np, *cr.max_tokens, mi.context_length, "messages");
    cr.params.max_tokens = static_cast<int>(*cr.max_tokens);
  } else {
    if (np >= mi.context_length)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, your messages resulted "
                                 "in {} tokens. Please reduce the length of the messages.",
                                 mi.context_length, np),
                     "messages");
    cr.params.max_tokens = static_cast<int>(mi.context_length - np);
  }
  metrics.generate_requests++;
  bool parse_tools = !cr.tools.is_null() && cr.tool_choice != ToolChoice::none;
  ToolCallParser::Kind tk = parse_tools ? tool_kind() : ToolCallParser::Kind::none;
  ReasoningParser::Kind rk = rkind;
  auto piece = [b](int32_t id) { return b->decode({id}, false); };
  auto raw = [b](int32_t id) { return b->token_bytes(id); };
  bool want_lp = cr.logprobs;
  int top = cr.top_logprobs;
  const bool parallel = cr.parallel_tool_calls;
  const ParseContext pctx = parse_context(cr);
  const SubmitOptions text{.include_stop_str = cr.include_stop_str, .skip_special = chat_skip_special(*b, cr, rk, tk),
                           .stop_info = nullptr};
  auto prod = std::make_unique<GenProducer>(metrics, std::move(ticket), submit_jobs(*b, {ids}, cr.params, cr.n, text),
                                            cr.stream);
  prod->prompt_sizes = {ids.size()};
  prod->id = random_id("chatcmpl-");
  prod->model = opts.served_model_name;
  prod->object = "chat.completion.chunk";
  prod->created = unix_time();
  prod->include_usage = cr.include_usage;

  if (!cr.stream) {
    size_t nprompt = ids.size();
    prod->build = [rk, tk, pctx, want_lp, top, piece, raw, nprompt, parallel, id = prod->id, created = prod->created,
                   model = prod->model](std::vector<Job>& jobs) {
      Json choices = Json::array();
      for (auto& j : jobs) {
        ChatOutputParser parser(rk, tk, pctx);
        ChatDelta all = parser.feed(j.text);
        ChatDelta end = parser.finish();
        all.reasoning += end.reasoning;
        all.content += end.content;
        for (auto& c : end.tool_calls) all.tool_calls.push_back(std::move(c));
        if (!parallel && all.tool_calls.size() > 1) all.tool_calls.resize(1);  // parallel_tool_calls: false
        Json msg = Json::object();
        msg["role"] = "assistant";
        bool has_calls = !all.tool_calls.empty();
        msg["content"] = (has_calls && all.content.empty()) ? Json(nullptr) : Json(all.content);
        if (rk != ReasoningParser::Kind::none)
          msg["reasoning_content"] = all.reasoning.empty() ? Json(nullptr) : Json(all.reasoning);
        if (has_calls) {
          int ti = 0;
          msg["tool_calls"] = delta_json(ChatDelta{"", "", all.tool_calls}, ti)["tool_calls"];
          for (auto& tc : msg["tool_calls"]) tc.erase("index");
        }
        Json c = Json::object();
        c["index"] = j.index;
        c["message"] = std::move(msg);
        c["logprobs"] = want_lp ? Json{{"content", chat_logprobs_content(j.lps, top, piece, raw)}} : Json(nullptr);
        c["finish_reason"] = chat_finish(j.reason, has_calls);
        c["stop_reason"] = stop_reason_json(*j.stop);
        choices.push_back(std::move(c));
      }
      Json out = completion_json(id, "chat.completion", created, model, std::move(choices));
      out["usage"] = usage_json(total_usage(jobs, {nprompt}));
      return json_reply(200, dump(out));
    };
    return {http::Reply{}, std::move(prod)};
  }

  size_t njobs = static_cast<size_t>(cr.n);
  auto started = std::make_shared<std::vector<bool>>(njobs, false);
  auto parsers = std::make_shared<std::vector<ChatOutputParser>>();
  auto tool_idx = std::make_shared<std::vector<int>>(njobs, 0);
  auto heads_seen = std::make_shared<std::vector<int>>(njobs, 0);  // parallel_tool_calls false: kept + dropped
  for (size_t i = 0; i < njobs; ++i) {
    parsers->emplace_back(rk, tk, pctx);
    parsers->back().set_incremental_tool_calls(true);  // arguments stream as they are generated
  }
  GenProducer* self = prod.get();
  prod->on_event = [started, parsers, tool_idx, heads_seen, piece, raw, want_lp, top, parallel, self](int i, const StreamEvent& ev,
                                                                                      std::string& w) {
    auto chunk = [&](Json delta, Json lp, Json finish) {
      Json c = Json::object();
      c["index"] = i;
      c["delta"] = std::move(delta);
      c["logprobs"] = std::move(lp);
      bool last = !finish.is_null();
      c["finish_reason"] = std::move(finish);
      c["stop_reason"] = last ? stop_reason_json(*self->job(size_t(i)).stop) : Json(nullptr);
      w += sse_data(completion_json(self->id, "chat.completion.chunk", self->created, self->model,
                                    Json::array({std::move(c)})));
    };
    if (!(*started)[i]) {
      (*started)[i] = true;
      chunk(Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    }
    auto& parser = (*parsers)[i];
    ChatDelta d = parser.feed(ev.text);
    if (ev.finished) {
      ChatDelta end = parser.finish();
      d.reasoning += end.reasoning;
      d.content += end.content;
      for (auto& c : end.tool_calls) d.tool_calls.push_back(std::move(c));
    }
    if (!parallel) {  // parallel_tool_calls: false -- at most one call per choice (and its fragments)
      int& heads = (*heads_seen)[size_t(i)];
      std::vector<ToolCall> keep;
      for (auto& c : d.tool_calls) {
        if (!c.continuation) ++heads;
        if (heads <= 1) keep.push_back(std::move(c));
      }
      d.tool_calls = std::move(keep);
    }
    Json lp = nullptr;
    if (want_lp && !ev.logprobs.empty()) lp = Json{{"content", chat_logprobs_content(ev.logprobs, top, piece, raw)}};
    if (d.empty() && lp.is_null() && !ev.finished) return;
    Json finish = ev.finished ? chat_finish(ev.reason, parser.has_tool_calls()) : Json(nullptr);
    chunk(delta_json(d, (*tool_idx)[i]), std::move(lp), std::move(finish));
  };
  return sse_result(std::move(prod));
}

}  // namespace ts::server
