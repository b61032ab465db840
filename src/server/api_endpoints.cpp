#include "server/api_endpoints.h"

#include <chrono>
#include <functional>

#include "core/log.h"
#include "server/api_protocol.h"
#include "server/sse.h"

namespace ts::server {

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

http::Reply json_reply(int status, const Json& j) {
  http::Reply r;
  r.status = status;
  r.body = dump(j);
  return r;
}

bool is_messages(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

// What one finished generation left: its text, why it ended and its token counts.
struct GenResult {
  std::string text;
  FinishReason reason = FinishReason::none;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  Usage usage() const { return Usage{prompt_tokens, completion_tokens, cached_tokens}; }
};

// One engine stream answered as SSE (on_event per event, the final one included) or as one
// buffered reply (build, once finished). Latencies go to the same histograms as chat's.
class OneStream final : public http::Producer {
 public:
  OneStream(ServerMetrics& m, QueueHold hold, std::shared_ptr<Stream> st, bool streaming, int prompt_tokens)
      : m_(m), hold_(std::move(hold)), st_(std::move(st)), streaming_(streaming), t0_(Clock::now()) {
    res_.prompt_tokens = prompt_tokens;
  }
  ~OneStream() override {
    if (!finished_) st_->cancel();
  }
  std::string preamble;                                          // streaming: sent first
  std::function<void(const StreamEvent&, std::string&)> on_event;  // streaming
  std::function<void(const GenResult&, std::string&)> on_finish;  // streaming: after the final event
  std::function<http::Reply(const GenResult&)> build;             // buffered
  std::function<std::string(int, const std::string&)> stream_error;  // streaming: final error bytes
  std::function<http::Reply(int, const std::string&)> reply_error;

  bool streaming() const override { return streaming_; }
  void start(const std::shared_ptr<StreamWaker>& waker, uint64_t tag) override { st_->set_waker(waker, tag); }
  bool poll(std::string& out) override {
    if (done_) return true;
    if (streaming_ && !preamble.empty()) out += std::exchange(preamble, {});
    StreamEvent ev;
    while (!finished_ && st_->try_pop(ev)) {
      hold_.release();
      account(ev);
      if (!ev.error.empty()) {
        error_ = ev.error;
        if (streaming_) out += stream_error(500, "Generation failed: " + ev.error);
        return done_ = true;
      }
      if (streaming_) {
        on_event(ev, out);
      } else {
        res_.text += ev.text;
      }
    }
    if (!finished_) return false;
    if (streaming_ && on_finish) on_finish(res_, out);
    return done_ = true;
  }
  http::Reply reply() override {
    if (shut_) return reply_error(503, "The server is shutting down");
    if (!error_.empty()) return reply_error(500, "Generation failed: " + error_);
    try {
      return build(res_);
    } catch (const ApiError& e) {
      return reply_error(e.status, e.what());
    } catch (const std::exception& e) {
      return reply_error(500, e.what());
    }
  }
  void cancel() override { st_->cancel(); }
  std::string keepalive() override { return kSseKeepAlive; }
  void shutdown(std::string& out) override {
    st_->cancel();
    shut_ = done_ = true;
    if (streaming_) out += stream_error(503, "The server is shutting down");
  }

 private:
  void account(const StreamEvent& ev) {
    auto now = Clock::now();
    auto k = static_cast<int64_t>(ev.tokens.size());
    if (k > 0) {
      if (!got_first_) m_.ttft.observe(ev.ttft_s > 0 ? ev.ttft_s : secs(now - t0_));
      else m_.itl.observe(secs(now - last_) / static_cast<double>(k), k);
      got_first_ = true;
      last_ = now;
      ntokens_ += k;
    }
    if (ev.prompt_tokens > 0) res_.prompt_tokens = ev.prompt_tokens;
    if (ev.completion_tokens > 0) res_.completion_tokens = ev.completion_tokens;
    if (ev.cached_tokens > 0) res_.cached_tokens = ev.cached_tokens;
    if (ev.finished) {
      finished_ = true;
      res_.reason = ev.reason;
      if (res_.completion_tokens == 0) res_.completion_tokens = static_cast<int>(ntokens_);
      m_.e2e.observe(secs(now - t0_));
    }
  }

  ServerMetrics& m_;
  QueueHold hold_;
  std::shared_ptr<Stream> st_;
  bool streaming_, finished_ = false, done_ = false, shut_ = false, got_first_ = false;
  Clock::time_point t0_, last_;
  int64_t ntokens_ = 0;
  GenResult res_;
  std::string error_;
};

http::Result sse(std::unique_ptr<OneStream> p) {
  http::Result r;
  r.reply.content_type = "text/event-stream";
  r.reply.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  r.producer = std::move(p);
  return r;
}

// A chat body rendered and tokenised, with max_tokens resolved against the context (as chat does).
struct ChatRun {
  ChatRequest cr;
  std::vector<int32_t> ids;
};
ChatRun prepare_chat(const Json& chat_body, Backend& b, const ModelInfo& mi, const ChatTemplates& templates,
                     const ApiEndpointsOptions& o) {
  ChatRun run;
  run.cr = parse_chat_request(chat_body, mi);
  apply_tool_choice(run.cr, o.tkind, o.rkind, o.tool_choice_auto_grammar,
                    run.cr.tools.empty() ? std::vector<std::string>{} : special_tool_markers(b, o.tkind));
  std::string prompt = templates.render(run.cr);
  run.ids = b.encode(prompt, false);
  if (run.ids.empty()) throw ApiError(400, "The chat template rendered an empty prompt", "messages");
  auto np = static_cast<int64_t>(run.ids.size());
  if (run.cr.max_tokens) {
    check_context(np, *run.cr.max_tokens, mi.context_length, "messages");
    run.cr.params.max_tokens = static_cast<int>(*run.cr.max_tokens);
  } else {
    if (np >= mi.context_length)
      throw ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, your messages resulted in "
                                      "{} tokens. Please reduce the length of the messages.",
                                      mi.context_length, np),
                     "messages");
    run.cr.params.max_tokens = static_cast<int>(mi.context_length - np);
  }
  run.cr.params.prompt = run.ids;
  return run;
}

void merge(ChatDelta& all, ChatDelta d) {
  all.reasoning += d.reasoning;
  all.content += d.content;
  for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
}
}  // namespace

namespace {
// Where the output's reasoning is, for a grammar to skip it (ReasoningParser::start).
StructuredRequest::Reasoning structured_reasoning(ReasoningParser::Kind rk, const ChatRequest& cr) {
  switch (ReasoningParser(rk, parse_context(cr).thinking).start()) {
    case ReasoningParser::Start::think_tag: return StructuredRequest::Reasoning::qwen3;
    case ReasoningParser::Start::reasoning: return StructuredRequest::Reasoning::deepseek_r1;
    default: return StructuredRequest::Reasoning::none;
  }
}
}  // namespace

namespace {
// `m` is one special token of b's tokenizer (dropped from text that skips special tokens).
bool is_special_token(const Backend& b, const std::string& m) {
  const std::vector<int32_t> ids = b.encode(m, false);
  return ids.size() == 1 && b.decode(ids, true).empty() && !b.decode(ids, false).empty();
}
}  // namespace

bool chat_skip_special(const Backend& b, const ChatRequest& cr, ReasoningParser::Kind rk, ToolCallParser::Kind tk) {
  if (!cr.skip_special_tokens) return false;
  for (const std::string& m : parser_markers(rk, tk))
    if (is_special_token(b, m)) return false;
  return true;
}

std::vector<std::string> special_tool_markers(const Backend& b, ToolCallParser::Kind configured) {
  std::vector<std::string> out;
  for (const std::string& m : parser_markers(ReasoningParser::Kind::none, tool_call_kind(configured)))
    if (is_special_token(b, m)) out.push_back(m);
  return out;
}

ToolCallParser::Kind tool_call_kind(ToolCallParser::Kind configured) {
  return configured == ToolCallParser::Kind::none ? ToolCallParser::Kind::hermes : configured;
}

void apply_tool_choice(ChatRequest& cr, ToolCallParser::Kind configured, ReasoningParser::Kind rk, bool auto_grammar,
                       const std::vector<std::string>& special_markers) {
  const ToolCallParser::Kind tk = tool_call_kind(configured);
  // Every parser kind has its forced-call grammar (tool_call_structured / tool_call_triggered in
  // output_parsers.h give each format's syntax; no parser configured: hermes').
  if (cr.tool_choice == ToolChoice::required || cr.tool_choice == ToolChoice::named) {
    if (cr.structured)
      throw ApiError(400, "'tool_choice' required or named cannot be combined with 'response_format' or another "
                          "output constraint", "tool_choice");
    cr.structured = tool_call_structured(cr.tools, cr.tool_choice == ToolChoice::named ? cr.tool_choice_name : "",
                                         cr.parallel_tool_calls, tk, special_markers);
  } else if (cr.tool_choice == ToolChoice::auto_ && !cr.structured && auto_grammar && cr.tools.is_array() &&
             !cr.tools.empty()) {
    cr.structured = tool_call_triggered(cr.tools, cr.parallel_tool_calls, tk, special_markers);
  }
  if (cr.structured) {
    cr.structured->reasoning = structured_reasoning(rk, cr);
    cr.params.structured = cr.structured;
  }
}

http::Reply ApiEndpoints::error_for(const std::string& path, int status, const std::string& msg, const std::string& param,
                                    const std::string& code) {
  return json_reply(status, is_messages(path) ? anthropic_error(status, msg) : error_body(status, msg, param, code));
}

bool ApiEndpoints::is_prepared_route(const std::string& p) {
  return p == "/tokenize" || p == "/detokenize" || p == "/v1/embeddings" || p == "/v1/responses" ||
         p == "/v1/messages" || p == "/v1/messages/count_tokens";
}

bool ApiEndpoints::handle_inline(const http::Request& req, http::Result& out) {
  const std::string& p = req.path;
  if (p == "/version") {
    if (req.method != "GET") out.reply = error_for(p, 405, "Method " + req.method + " not allowed for " + p);
    else out.reply = json_reply(200, Json{{"version", kTokenspeedVersion}});
    return true;
  }
  const std::string prefix = "/v1/responses/";
  if (p.rfind(prefix, 0) == 0 && p.size() > prefix.size()) {
    std::string id = p.substr(prefix.size());
    if (req.method == "GET") {
      auto e = store_.get(id);
      out.reply = e ? json_reply(200, e->response)
                    : error_for(p, 404, fmt::format("Response with id '{}' not found.", id), "response_id");
    } else if (req.method == "DELETE") {
      out.reply = store_.erase(id) ? json_reply(200, Json{{"id", id}, {"object", "response"}, {"deleted", true}})
                                   : error_for(p, 404, fmt::format("Response with id '{}' not found.", id), "response_id");
    } else {
      out.reply = error_for(p, 405, "Method " + req.method + " not allowed for " + p);
    }
    return true;
  }
  return false;
}

http::Result ApiEndpoints::prepare(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi,
                                   QueueHold hold) {
  const std::string& p = req.path;
  try {
    if (p == "/tokenize") return tokenize(req, *b, mi);
    if (p == "/detokenize") return detokenize(req, *b, mi);
    if (p == "/v1/embeddings") return embeddings(req, *b, mi);
    if (p == "/v1/messages") return messages(req, b, mi, std::move(hold));
    if (p == "/v1/messages/count_tokens") return count_tokens(req, *b, mi);
    if (p == "/v1/responses") return responses(req, b, mi, std::move(hold));
    return {error_for(p, 404, "Route " + req.method + " " + p + " not found"), nullptr};
  } catch (const ApiError& e) {
    return {error_for(p, e.status, e.what(), e.param, e.code), nullptr};
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", req.method, p, e.what());
    return {error_for(p, 500, e.what()), nullptr};
  }
}

// --- /tokenize, /detokenize ----------------------------------------------------------------------------
http::Result ApiEndpoints::tokenize(const http::Request& req, Backend& b, const ModelInfo& mi) {
  TokenizeRequest tr = parse_tokenize_request(parse_body(req.body), mi);
  std::vector<int32_t> ids;
  if (tr.chat) {
    ChatRequest cr = parse_chat_request(tr.chat_body, mi);
    std::string prompt = templates_.render(cr);
    ids = b.encode(prompt, tr.add_special_tokens);
  } else {
    ids = b.encode(tr.prompt, tr.add_special_tokens);
  }
  std::vector<std::string> strs;
  if (tr.return_token_strs)
    for (int32_t id : ids) strs.push_back(b.decode({id}, false));
  return {json_reply(200, tokenize_response(ids, mi.context_length, tr.return_token_strs ? &strs : nullptr)), nullptr};
}

http::Result ApiEndpoints::detokenize(const http::Request& req, Backend& b, const ModelInfo& mi) {
  std::vector<int32_t> ids = parse_detokenize_request(parse_body(req.body), mi);
  return {json_reply(200, Json{{"prompt", b.decode(ids, false)}}), nullptr};
}

// --- /v1/embeddings ----------------------------------------------------------------------------------
http::Result ApiEndpoints::embeddings(const http::Request& req, Backend& b, const ModelInfo& mi) {
  EmbeddingsRequest er =
      parse_embeddings_request(parse_body(req.body), mi, [&](const std::string& s) { return b.encode(s, true); });
  Json data = Json::array();
  int64_t tokens = 0;
  for (size_t i = 0; i < er.inputs.size(); ++i) {
    std::vector<float> v = b.embed(er.inputs[i], o_.mean_pooling);
    finish_embedding(v, er.dimensions);
    tokens += static_cast<int64_t>(er.inputs[i].size());
    Json e = Json::object();
    e["object"] = "embedding";
    e["index"] = i;
    e["embedding"] = embedding_value(v, er.base64);
    data.push_back(std::move(e));
  }
  Json out = Json::object();
  out["object"] = "list";
  out["data"] = std::move(data);
  out["model"] = o_.served_model_name;
  out["usage"] = Json{{"prompt_tokens", tokens}, {"total_tokens", tokens}};
  return {json_reply(200, out), nullptr};
}

// --- /v1/messages --------------------------------------------------------------------------------------
http::Result ApiEndpoints::count_tokens(const http::Request& req, Backend& b, const ModelInfo& mi) {
  Json body = parse_body(req.body);
  if (!body.contains("max_tokens")) body["max_tokens"] = 1;  // not needed to count
  Json chat = anthropic_to_chat(body);
  ChatRequest cr = parse_chat_request(chat, mi);
  std::string prompt = templates_.render(cr);
  return {json_reply(200, Json{{"input_tokens", b.encode(prompt, false).size()}}), nullptr};
}

http::Result ApiEndpoints::messages(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi,
                                    QueueHold hold) {
  Json body = parse_body(req.body);
  ChatRun run = prepare_chat(anthropic_to_chat(body), *b, mi, templates_, o_);
  metrics_.generate_requests++;
  bool tools = !run.cr.tools.is_null() && run.cr.tool_choice != ToolChoice::none;
  ToolCallParser::Kind tk = tools ? tool_call_kind(o_.tkind) : ToolCallParser::Kind::none;
  ReasoningParser::Kind rk = o_.rkind;
  const ParseContext pctx = parse_context(run.cr);
  SubmitOptions so;
  so.stop_info = std::make_shared<StopInfo>();
  so.skip_special = chat_skip_special(*b, run.cr, rk, tk);
  auto stop = so.stop_info;
  int np = static_cast<int>(run.ids.size());
  auto st = b->submit(run.cr.params, so);
  auto prod = std::make_unique<OneStream>(metrics_, std::move(hold), st, run.cr.stream, np);
  std::string id = random_id("msg_"), model = o_.served_model_name;
  prod->reply_error = [](int status, const std::string& m) { return json_reply(status, anthropic_error(status, m)); };
  prod->stream_error = [](int status, const std::string& m) { return sse_event("error", anthropic_error(status, m)); };
  auto usage_of = [](const GenResult& r) {
    Json u = Json::object();
    u["input_tokens"] = r.prompt_tokens - r.cached_tokens;  // Anthropic: cache reads are counted apart
    u["cache_creation_input_tokens"] = 0;
    u["cache_read_input_tokens"] = r.cached_tokens;
    u["output_tokens"] = r.completion_tokens;
    return u;
  };
  if (!run.cr.stream) {
    prod->build = [rk, tk, pctx, stop, id, model, usage_of](const GenResult& r) {
      ChatOutputParser parser(rk, tk, pctx);
      ChatDelta all = parser.feed(r.text);
      merge(all, parser.finish());
      Json m = Json::object();
      m["id"] = id;
      m["type"] = "message";
      m["role"] = "assistant";
      m["model"] = model;
      m["content"] = anthropic_content(all);
      m["stop_reason"] = anthropic_stop_reason(r.reason, !all.tool_calls.empty(), !stop->stop_str.empty());
      m["stop_sequence"] = stop->stop_str.empty() ? Json(nullptr) : Json(stop->stop_str);
      m["usage"] = usage_of(r);
      return json_reply(200, m);
    };
    return {http::Reply{}, std::move(prod)};
  }

  // Streaming: message_start, then content blocks (thinking / text / tool_use) opened and
  // closed as the parsed output moves between them, message_delta (stop reason, usage), message_stop.
  Json start = Json::object();
  start["id"] = id;
  start["type"] = "message";
  start["role"] = "assistant";
  start["model"] = model;
  start["content"] = Json::array();
  start["stop_reason"] = nullptr;
  start["stop_sequence"] = nullptr;
  struct State {
    explicit State(ChatOutputParser p) : parser(std::move(p)) {}
    ChatOutputParser parser;
    int index = -1;        // current block
    std::string open;      // its type ("" none)
    bool any_block = false, tool_calls = false;
    bool started = false;  // message_start sent
  };
  auto s = std::make_shared<State>(ChatOutputParser(rk, tk, pctx));
  // message_start goes out with the first engine event, which knows the prefix-cache hit: its
  // usage splits input_tokens from cache_read_input_tokens as the buffered reply does (streaming
  // clients take usage from message_start).
  auto begin = [s, start, usage_of](const GenResult& r, std::string& w) {
    if (s->started) return;
    s->started = true;
    Json m = start;
    Json u = usage_of(r);
    u["output_tokens"] = 0;
    m["usage"] = std::move(u);
    w += sse_event("message_start", Json{{"type", "message_start"}, {"message", std::move(m)}});
  };
  s->parser.set_incremental_tool_calls(true);  // arguments stream as they are generated
  auto close = [s](std::string& w) {
    if (s->open.empty()) return;
    w += sse_event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", s->index}});
    s->open.clear();
  };
  auto open = [s, close](const std::string& type, Json block, std::string& w) {
    if (s->open == type) return;
    close(w);
    s->open = type;
    s->any_block = true;
    w += sse_event("content_block_start",
                   Json{{"type", "content_block_start"}, {"index", ++s->index}, {"content_block", std::move(block)}});
  };
  // A tool call is a tool_use block: a streaming head opens it and its argument fragments are
  // input_json_delta events as they are generated (they concatenate to the input object's JSON);
  // a call that arrived complete is one delta. The block closes when the next one opens.
  auto tool_fragment = [s](const std::string& part, std::string& w) {
    if (s->open != "tool_use" || part.empty()) return;  // fragments only follow their head
    w += sse_event("content_block_delta", Json{{"type", "content_block_delta"},
                                               {"index", s->index},
                                               {"delta", Json{{"type", "input_json_delta"}, {"partial_json", part}}}});
  };
  auto emit = [s, open, close, tool_fragment](const ChatDelta& d, std::string& w) {
    // Fragments that lead the delta belong to the call already open: they precede any text
    // after it (the parser returns text and calls separately, not interleaved).
    size_t k = 0;
    for (; k < d.tool_calls.size() && d.tool_calls[k].continuation; ++k) tool_fragment(d.tool_calls[k].arguments, w);
    if (!d.reasoning.empty()) {
      open("thinking", Json{{"type", "thinking"}, {"thinking", ""}}, w);
      w += sse_event("content_block_delta", Json{{"type", "content_block_delta"},
                                                 {"index", s->index},
                                                 {"delta", Json{{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.content.empty()) {
      open("text", Json{{"type", "text"}, {"text", ""}}, w);
      w += sse_event("content_block_delta", Json{{"type", "content_block_delta"},
                                                 {"index", s->index},
                                                 {"delta", Json{{"type", "text_delta"}, {"text", d.content}}}});
    }
    for (; k < d.tool_calls.size(); ++k) {
      const ToolCall& c = d.tool_calls[k];
      if (c.continuation) {
        tool_fragment(c.arguments, w);
        continue;
      }
      close(w);
      s->tool_calls = true;
      s->any_block = true;
      s->open = "tool_use";
      w += sse_event("content_block_start",
                     Json{{"type", "content_block_start"},
                          {"index", ++s->index},
                          {"content_block", Json{{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", c.name},
                                                 {"input", Json::object()}}}});
      tool_fragment(c.streaming_head ? c.arguments : dump(arguments_object(c.arguments)), w);
    }
  };
  prod->on_event = [s, emit, begin, np](const StreamEvent& ev, std::string& w) {
    GenResult head;
    head.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : np;
    head.cached_tokens = ev.cached_tokens;
    begin(head, w);
    ChatDelta d = s->parser.feed(ev.text);
    if (ev.finished) merge(d, s->parser.finish());
    emit(d, w);
  };
  prod->on_finish = [s, open, close, stop, begin, usage_of](const GenResult& r, std::string& w) {
    begin(r, w);
    if (!s->any_block) open("text", Json{{"type", "text"}, {"text", ""}}, w);
    close(w);
    Json delta = Json{{"stop_reason", anthropic_stop_reason(r.reason, s->tool_calls, !stop->stop_str.empty())},
                      {"stop_sequence", stop->stop_str.empty() ? Json(nullptr) : Json(stop->stop_str)}};
    // Cumulative, as Anthropic's message_delta usage is.
    w += sse_event("message_delta", Json{{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", usage_of(r)}});
    w += sse_event("message_stop", Json{{"type", "message_stop"}});
  };
  return sse(std::move(prod));
}

// --- /v1/responses -------------------------------------------------------------------------------------
http::Result ApiEndpoints::responses(const http::Request& req, const std::shared_ptr<Backend>& b, const ModelInfo& mi,
                                     QueueHold hold) {
  Json body = parse_body(req.body);
  Json history = Json::array();
  if (auto prev = get_string(body, "previous_response_id"); prev && !prev->empty()) {
    auto e = store_.get(*prev);
    if (!e)
      throw ApiError(404, fmt::format("Previous response with id '{}' not found.", *prev), "previous_response_id",
                     "previous_response_not_found");
    history = e->conversation;
  }
  auto conversation = std::make_shared<Json>();
  ChatRun run = prepare_chat(responses_to_chat(body, history, *conversation), *b, mi, templates_, o_);
  metrics_.generate_requests++;
  bool tools = !run.cr.tools.is_null() && run.cr.tool_choice != ToolChoice::none;
  ToolCallParser::Kind tk = tools ? tool_call_kind(o_.tkind) : ToolCallParser::Kind::none;
  ReasoningParser::Kind rk = o_.rkind;
  const ParseContext pctx = parse_context(run.cr);
  int np = static_cast<int>(run.ids.size());
  SubmitOptions so;
  so.skip_special = chat_skip_special(*b, run.cr, rk, tk);
  auto st = b->submit(run.cr.params, so);
  auto prod = std::make_unique<OneStream>(metrics_, std::move(hold), st, run.cr.stream, np);
  std::string id = random_id("resp_"), model = o_.served_model_name;
  int64_t created = unix_time();
  bool store = get_bool(body, "store").value_or(true);
  auto bodyp = std::make_shared<Json>(std::move(body));
  ResponseStore* rs = &store_;
  // The finished response: its object, and (store) the conversation a follow-up continues.
  // `streamed`: the items as streamed (their ids), else minted from the parsed text.
  auto finish = [rk, tk, pctx, id, model, created, bodyp, conversation, store, rs](const GenResult& r, const Json* streamed) {
    ChatOutputParser parser(rk, tk, pctx);
    ChatDelta all = parser.feed(r.text);
    merge(all, parser.finish());
    ResponsesOutput out = responses_output(all);
    // Cut at max_output_tokens: the last item is incomplete (as OpenAI marks it).
    if (!streamed && r.reason == FinishReason::length && !out.items.empty() && out.items.back().contains("status"))
      out.items.back()["status"] = "incomplete";
    if (streamed) out.items = *streamed;
    Usage u = r.usage();
    Json obj = response_object(id, created, model, *bodyp, out.items,
                               r.reason == FinishReason::length ? "incomplete" : "completed", &u);
    if (store) {
      Json conv = *conversation;
      for (auto& m : out.messages) conv.push_back(m);
      rs->put(id, ResponseStore::Entry{std::move(conv), obj});
    }
    return obj;
  };
  if (!run.cr.stream) {
    prod->reply_error = [](int status, const std::string& m) { return json_reply(status, error_body(status, m)); };
    prod->stream_error = [](int, const std::string&) { return std::string(); };
    prod->build = [finish](const GenResult& r) { return json_reply(200, finish(r, nullptr)); };
    return {http::Reply{}, std::move(prod)};
  }

  // Streaming: response.created / in_progress, then per output item (reasoning, message,
  // function_call) its added / delta / done events, then response.completed (or .incomplete).
  struct State {
    explicit State(ChatOutputParser p) : parser(std::move(p)) {}
    ChatOutputParser parser;
    int seq = 0, output_index = -1;
    std::string open, item_id, text;  // the open item: type, id, text (or arguments) so far
    std::string call_id, call_name;   // the open function_call item's
    Json done_items = Json::array();
    bool cut = false;                 // the output ended at max_output_tokens: the last item is incomplete
  };
  auto s = std::make_shared<State>(ChatOutputParser(rk, tk, pctx));
  s->parser.set_incremental_tool_calls(true);  // arguments stream as they are generated
  auto ev = [s](const std::string& type, Json j) {
    Json o = Json::object();
    o["type"] = type;
    o["sequence_number"] = s->seq++;
    for (auto& [k, v] : j.items()) o[k] = v;
    return sse_event(type, o);
  };
  prod->reply_error = [](int status, const std::string& m) { return json_reply(status, error_body(status, m)); };
  prod->stream_error = [ev](int status, const std::string& m) {
    return ev("error", Json{{"code", status == 503 ? "server_shutting_down" : "server_error"}, {"message", m}, {"param", nullptr}});
  };
  Json initial = response_object(id, created, model, *bodyp, Json::array(), "in_progress", nullptr);
  prod->preamble = ev("response.created", Json{{"response", initial}});
  prod->preamble += ev("response.in_progress", Json{{"response", initial}});  // after: sequence numbers in order
  auto close = [s, ev](std::string& w) {
    if (s->open.empty()) return;
    Json item;
    if (s->open == "function_call") {
      w += ev("response.function_call_arguments.done", Json{{"item_id", s->item_id}, {"output_index", s->output_index},
                                                            {"name", s->call_name}, {"arguments", s->text}});
      item = Json{{"id", s->item_id}, {"type", "function_call"}, {"status", s->cut ? "incomplete" : "completed"},
                  {"arguments", s->text}, {"call_id", s->call_id}, {"name", s->call_name}};
    } else if (s->open == "message") {
      Json part = Json{{"type", "output_text"}, {"text", s->text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
      w += ev("response.output_text.done", Json{{"item_id", s->item_id}, {"output_index", s->output_index},
                                                {"content_index", 0}, {"text", s->text}, {"logprobs", Json::array()}});
      w += ev("response.content_part.done",
              Json{{"item_id", s->item_id}, {"output_index", s->output_index}, {"content_index", 0}, {"part", part}});
      item = Json{{"id", s->item_id}, {"type", "message"}, {"status", s->cut ? "incomplete" : "completed"},
                  {"role", "assistant"}, {"content", Json::array({part})}};
    } else {  // reasoning
      w += ev("response.reasoning_text.done",
              Json{{"item_id", s->item_id}, {"output_index", s->output_index}, {"content_index", 0}, {"text", s->text}});
      item = Json{{"id", s->item_id}, {"type", "reasoning"}, {"summary", Json::array()},
                  {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", s->text}}})}};
    }
    w += ev("response.output_item.done", Json{{"output_index", s->output_index}, {"item", item}});
    s->done_items.push_back(std::move(item));
    s->open.clear();
  };
  auto open = [s, ev, close](const std::string& type, std::string& w) {
    if (s->open == type) return;
    close(w);
    s->open = type;
    s->text.clear();
    ++s->output_index;
    if (type == "message") {
      s->item_id = random_id("msg_");
      w += ev("response.output_item.added",
              Json{{"output_index", s->output_index},
                   {"item", Json{{"id", s->item_id}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"},
                                 {"content", Json::array()}}}});
      w += ev("response.content_part.added",
              Json{{"item_id", s->item_id}, {"output_index", s->output_index}, {"content_index", 0},
                   {"part", Json{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}, {"logprobs", Json::array()}}}});
    } else {
      s->item_id = random_id("rs_");
      w += ev("response.output_item.added",
              Json{{"output_index", s->output_index},
                   {"item", Json{{"id", s->item_id}, {"type", "reasoning"}, {"summary", Json::array()}, {"content", Json::array()}}}});
    }
  };
  // A function_call item: a streaming head adds it and its argument fragments are
  // function_call_arguments.delta events as they are generated; a call that arrived complete is
  // one delta. The item is done when the next one opens (close).
  auto call_fragment = [s, ev](const std::string& part, std::string& w) {
    if (s->open != "function_call" || part.empty()) return;  // fragments only follow their head
    s->text += part;
    w += ev("response.function_call_arguments.delta", Json{{"item_id", s->item_id}, {"output_index", s->output_index}, {"delta", part}});
  };
  auto emit = [s, ev, open, close, call_fragment](const ChatDelta& d, std::string& w) {
    // Fragments that lead the delta belong to the call already open (see the Messages stream).
    size_t k = 0;
    for (; k < d.tool_calls.size() && d.tool_calls[k].continuation; ++k) call_fragment(d.tool_calls[k].arguments, w);
    if (!d.reasoning.empty()) {
      open("reasoning", w);
      s->text += d.reasoning;
      w += ev("response.reasoning_text.delta",
              Json{{"item_id", s->item_id}, {"output_index", s->output_index}, {"content_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      open("message", w);
      s->text += d.content;
      w += ev("response.output_text.delta", Json{{"item_id", s->item_id}, {"output_index", s->output_index},
                                                 {"content_index", 0}, {"delta", d.content}, {"logprobs", Json::array()}});
    }
    for (; k < d.tool_calls.size(); ++k) {
      const ToolCall& c = d.tool_calls[k];
      if (c.continuation) {
        call_fragment(c.arguments, w);
        continue;
      }
      close(w);
      s->open = "function_call";
      s->text.clear();
      s->item_id = random_id("fc_");
      s->call_id = c.id.empty() ? random_id("call_") : c.id;
      s->call_name = c.name;
      Json item = Json{{"id", s->item_id}, {"type", "function_call"}, {"status", "in_progress"}, {"arguments", ""},
                       {"call_id", s->call_id}, {"name", c.name}};
      w += ev("response.output_item.added", Json{{"output_index", ++s->output_index}, {"item", item}});
      call_fragment(c.arguments, w);
    }
  };
  prod->on_event = [s, emit](const StreamEvent& e, std::string& w) {
    ChatDelta d = s->parser.feed(e.text);
    if (e.finished) merge(d, s->parser.finish());
    emit(d, w);
  };
  prod->on_finish = [s, ev, open, close, finish](const GenResult& r, std::string& w) {
    if (s->output_index < 0) open("message", w);  // an empty answer is still one message
    s->cut = r.reason == FinishReason::length;     // only the item still open was cut
    close(w);
    Json obj = finish(r, &s->done_items);
    const std::string type = obj["status"] == "incomplete" ? "response.incomplete" : "response.completed";
    w += ev(type, Json{{"response", obj}});
  };
  return sse(std::move(prod));
}

}  // namespace ts::server
