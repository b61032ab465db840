#include "server/protocol.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <random>

#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "io/json_file.h"

namespace ts::server {

namespace {
// Set once at startup (serve --max-json-depth) before any request is parsed; read by every
// parse. A policy limit, not engine state: it steers no computation.
std::atomic<int> g_max_json_depth{io::kDefaultMaxJsonDepth};
}  // namespace

void set_max_json_depth(int depth) { g_max_json_depth.store(depth < 1 ? 1 : depth, std::memory_order_relaxed); }
int max_json_depth() { return g_max_json_depth.load(std::memory_order_relaxed); }

Json parse_json_limited(const std::string& text, const char* what) {
  // The nesting pre-scan runs before nlohmann builds anything: a 50k-deep array would otherwise
  // become a 50k-deep Json and then overflow the stack of the recursive Jinja conversion.
  int limit = max_json_depth();
  if (io::json_depth(text, limit) > limit)
    throw ApiError(400, fmt::format("{} is nested deeper than {} levels (--max-json-depth)", what, limit));
  return Json::parse(text);
}

namespace {
const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "invalid_request_error";  // as OpenAI answers model_not_found
    case 405: return "method_not_allowed";
    case 413: return "request_too_large";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

[[noreturn]] void bad(const std::string& msg, const std::string& param = "") {
  throw ApiError(400, msg, param);
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    case Json::value_t::number_float: return "number";
    default: return "integer";
  }
}
}  // namespace

Json error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  Json e = Json::object();
  e["message"] = message;
  e["type"] = error_type(status);
  e["param"] = param.empty() ? Json(nullptr) : Json(param);
  e["code"] = code.empty() ? Json(nullptr) : Json(code);
  Json out = Json::object();
  out["error"] = std::move(e);
  return out;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json parse_body(const std::string& body) {
  Json j;
  try {
    j = parse_json_limited(body, "The request body");
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for a number such as 1e400 (was a 500). nlohmann's text:
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    throw ApiError(400, "Invalid JSON body: " + io::json_error_text(e));
  }
  if (!j.is_object()) throw ApiError(400, std::string("The request body must be a JSON object, got ") + type_name(j));
  return j;
}

std::optional<int64_t> get_int(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e18) return static_cast<int64_t>(d);
  }
  bad(fmt::format("'{}' must be an integer, got {}", key, type_name(*it)), key);
}

std::optional<double> get_number(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_number()) return it->get<double>();
  bad(fmt::format("'{}' must be a number, got {}", key, type_name(*it)), key);
}

std::optional<bool> get_bool(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_boolean()) return it->get<bool>();
  bad(fmt::format("'{}' must be a boolean, got {}", key, type_name(*it)), key);
}

std::optional<std::string> get_string(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  bad(fmt::format("'{}' must be a string, got {}", key, type_name(*it)), key);
}

void check_model(const Json& body, const ModelInfo& info) {
  auto m = get_string(body, "model");
  if (!m || m->empty() || *m == info.served_name || *m == info.model_path) return;
  throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", *m, info.served_name),
                 "model", "model_not_found");
}

void parse_sampling(const Json& body, GenerateParams& p, int64_t vocab_size) {
  if (auto t = get_number(body, "temperature")) {
    if (!(*t >= 0) || !std::isfinite(*t)) bad(fmt::format("'temperature' must be >= 0, got {}", *t), "temperature");
    p.temperature = static_cast<float>(*t);
  }
  if (auto t = get_number(body, "top_p")) {
    if (!(*t > 0 && *t <= 1)) bad(fmt::format("'top_p' must be in (0, 1], got {}", *t), "top_p");
    p.top_p = static_cast<float>(*t);
  }
  if (auto k = get_int(body, "top_k")) {
    if (*k < -1) bad(fmt::format("'top_k' must be -1 (off), 0 (off) or a positive integer, got {}", *k), "top_k");
    p.top_k = *k <= 0 ? 0 : static_cast<int>(std::min<int64_t>(*k, 1 << 30));
  }
  if (auto m = get_number(body, "min_p")) {
    if (!(*m >= 0 && *m <= 1)) bad(fmt::format("'min_p' must be in [0, 1], got {}", *m), "min_p");
    p.min_p = static_cast<float>(*m);
  }
  if (auto s = get_int(body, "seed")) p.seed = static_cast<uint64_t>(*s);
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (auto v = get_number(body, key)) {
      if (!(*v >= -2 && *v <= 2)) bad(fmt::format("'{}' must be in [-2, 2], got {}", key, *v), key);
      (std::string(key) == "presence_penalty" ? p.presence_penalty : p.frequency_penalty) = static_cast<float>(*v);
    }
  }
  if (auto v = get_number(body, "repetition_penalty")) {
    if (!(*v > 0) || !std::isfinite(*v)) bad(fmt::format("'repetition_penalty' must be > 0, got {}", *v), "repetition_penalty");
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      if (!it->get<std::string>().empty()) p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (auto& s : *it) {
        if (!s.is_string()) bad("'stop' must be a string or a list of strings", "stop");
        if (!s.get<std::string>().empty()) p.stop.push_back(s.get<std::string>());
      }
    } else {
      bad(fmt::format("'stop' must be a string or a list of strings, got {}", type_name(*it)), "stop");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) bad("'stop_token_ids' must be a list of integers", "stop_token_ids");
    for (auto& v : *it) {
      if (!v.is_number_integer()) bad("'stop_token_ids' must be a list of integers", "stop_token_ids");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab_size)
        bad(fmt::format("'stop_token_ids' contains {}, outside the vocabulary [0, {})", id, vocab_size), "stop_token_ids");
      p.stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (auto b = get_bool(body, "ignore_eos")) p.ignore_eos = *b;
  // vLLM's bad_words (the engine tokenizes them: GenerateParams::bad_words).
  if (auto it = body.find("bad_words"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) bad("'bad_words' must be a list of strings", "bad_words");
    if (it->size() > 1024) bad(fmt::format("'bad_words' holds {} words; at most 1024", it->size()), "bad_words");
    for (auto& w : *it) {
      if (!w.is_string()) bad("'bad_words' must be a list of strings", "bad_words");
      const std::string& s = w.get_ref<const std::string&>();
      if (s.find_first_not_of(" \t\n\r") == std::string::npos) bad("'bad_words' entries must not be empty", "bad_words");
      if (s.size() > 1024) bad("'bad_words' entries must be at most 1024 bytes", "bad_words");
      p.bad_words.push_back(s);
    }
  }
  parse_logit_constraints(body, p, vocab_size);
}

std::optional<int64_t> parse_max_tokens(const Json& body, const char* alt) {
  const char* key = "max_tokens";
  auto m = get_int(body, key);
  if (alt) {
    if (auto a = get_int(body, alt)) {
      key = alt;
      m = a;
    }
  }
  if (m && *m <= 0) bad(fmt::format("'{}' must be at least 1, got {}", key, *m), key);
  return m;
}

int parse_n(const Json& body) {
  auto n = get_int(body, "n");
  if (!n) return 1;
  if (*n < 1 || *n > 128) bad(fmt::format("'n' must be in [1, 128], got {}", *n), "n");
  return static_cast<int>(*n);
}

void parse_stream(const Json& body, bool& stream, bool& include_usage) {
  stream = get_bool(body, "stream").value_or(false);
  include_usage = false;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("'stream_options' must be an object", "stream_options");
    if (!stream) bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    include_usage = get_bool(*it, "include_usage").value_or(false);
  }
}

void check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context_length, const char* what) {
  if (prompt_tokens + max_tokens > context_length) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                               "({} in the {}, {} for the completion). Please reduce the length of the {} or "
                               "completion.",
                               context_length, prompt_tokens + max_tokens, prompt_tokens,
                               std::string(what) == "prompt" ? "prompt" : "messages", max_tokens,
                               std::string(what) == "prompt" ? "prompt" : "messages"),
                   what);
  }
}

void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const char* param) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab_size)
      bad(fmt::format("Token id {} is outside the vocabulary [0, {})", id, vocab_size), param);
}

// --- completions -----------------------------------------------------------------------------
CompletionRequest parse_completion_request(const Json& body, const ModelInfo& info, const EncodeFn& encode,
                                           const DecodeFn& decode) {
  check_model(body, info);
  CompletionRequest r;
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("'prompt' is required", "prompt");
  auto ids_of = [&](const Json& arr) {
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (auto& v : arr) {
      if (!v.is_number_integer()) bad("'prompt' token lists must contain only integers", "prompt");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= info.vocab_size)
        bad(fmt::format("Token id {} in 'prompt' is outside the vocabulary [0, {})", id, info.vocab_size), "prompt");
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  };
  std::vector<Json> items;
  if (it->is_string()) {
    items.push_back(*it);
  } else if (it->is_array()) {
    if (it->empty()) bad("'prompt' must not be empty", "prompt");
    if ((*it)[0].is_number()) {
      items.push_back(*it);  // one prompt of token ids
    } else {
      for (auto& v : *it) {
        if (!v.is_string() && !v.is_array())
          bad("'prompt' must be a string, a list of token ids, or a list of either", "prompt");
        items.push_back(v);
      }
    }
  } else {
    bad(fmt::format("'prompt' must be a string, a list of token ids, or a list of either, got {}", type_name(*it)),
        "prompt");
  }
  for (auto& v : items) {
    PromptInput pi;
    if (v.is_string()) {
      pi.text = v.get<std::string>();
      pi.from_text = true;
      if (pi.text.empty()) bad("'prompt' must not be empty", "prompt");
      pi.ids = encode(pi.text);
    } else {
      pi.ids = ids_of(v);
    }
    if (pi.ids.empty()) bad("'prompt' must not be empty", "prompt");
    r.prompts.push_back(std::move(pi));
  }

  auto mt = parse_max_tokens(body);
  int64_t max_tokens = mt.value_or(16);
  parse_sampling(body, r.params, info.vocab_size);
  r.n = parse_n(body);
  parse_stream(body, r.stream, r.include_usage);
  r.echo = get_bool(body, "echo").value_or(false);
  if (auto lp = body.find("logprobs"); lp != body.end() && !lp->is_null()) {
    if (lp->is_boolean()) bad("'logprobs' must be an integer (the number of top tokens) for completions", "logprobs");
    auto k = get_int(body, "logprobs");
    if (*k < 0 || *k > 20) bad(fmt::format("'logprobs' must be in [0, 20], got {}", *k), "logprobs");
    r.logprobs = static_cast<int>(*k);
  }
  if (auto bo = get_int(body, "best_of"); bo && *bo != r.n && *bo != 1)
    bad("'best_of' is not supported (only best_of == n)", "best_of");
  if (auto s = get_string(body, "suffix"); s && !s->empty()) bad("'suffix' is not supported", "suffix");

  for (auto& pi : r.prompts) {
    check_context(static_cast<int64_t>(pi.ids.size()), max_tokens, info.context_length, "prompt");
    if (!pi.from_text && r.echo) pi.text = decode(pi.ids);
  }
  r.params.max_tokens = static_cast<int>(max_tokens);
  r.params.logprobs = r.logprobs;
  r.include_stop_str = get_bool(body, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  if (auto k = get_int(body, "prompt_logprobs")) {
    if (*k < 0 || *k > 20) bad(fmt::format("'prompt_logprobs' must be in [0, 20], got {}", *k), "prompt_logprobs");
    r.prompt_logprobs = static_cast<int>(*k);
  }
  r.params.structured = parse_structured(body);
  return r;
}

// --- chat ------------------------------------------------------------------------------------
namespace {
std::string content_to_string(const Json& content, size_t i) {
  std::string param = fmt::format("messages[{}].content", i);
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(fmt::format("'{}' must be a string or a list of content parts", param), param);
  std::string out;
  bool first = true;
  for (auto& part : content) {
    if (!part.is_object()) bad(fmt::format("'{}' parts must be objects", param), param);
    auto type = get_string(part, "type");
    if (!type) bad(fmt::format("'{}' parts need a 'type'", param), param);
    if (*type != "text")
      bad(fmt::format("Content part type '{}' is not supported (only 'text')", *type), param);
    auto text = get_string(part, "text");
    if (!text) bad(fmt::format("'{}' text parts need a 'text' string", param), param);
    if (!first) out += "\n";
    out += *text;
    first = false;
  }
  return out;
}
}  // namespace

ChatRequest parse_chat_request(const Json& body, const ModelInfo& info) {
  check_model(body, info);
  ChatRequest r;
  auto mit = body.find("messages");
  if (mit == body.end() || mit->is_null()) bad("'messages' is required", "messages");
  if (!mit->is_array()) bad("'messages' must be a list", "messages");
  if (mit->empty()) bad("'messages' must not be empty", "messages");
  for (size_t i = 0; i < mit->size(); ++i) {
    const Json& m = (*mit)[i];
    std::string mp = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(fmt::format("'{}' must be an object", mp), mp);
    auto rit = m.find("role");
    if (rit == m.end() || !rit->is_string()) bad(fmt::format("'{}.role' is required (a string)", mp), mp + ".role");
    std::string role = rit->get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
      bad(fmt::format("'{}.role' is '{}'; expected one of system, developer, user, assistant, tool", mp, role),
          mp + ".role");
    Json out = Json::object();
    for (auto& [k, v] : m.items()) out[k] = v;
    if (role == "developer") out["role"] = "system";  // OpenAI's newer name; templates know "system"
    auto cit = m.find("content");
    bool has_tool_calls = false;
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (role != "assistant") bad(fmt::format("'{}.tool_calls' is only allowed for assistant messages", mp), mp + ".tool_calls");
      if (!tc->is_array()) bad(fmt::format("'{}.tool_calls' must be a list", mp), mp + ".tool_calls");
      Json calls = Json::array();
      for (size_t j = 0; j < tc->size(); ++j) {
        const Json& c = (*tc)[j];
        std::string cp = fmt::format("{}.tool_calls[{}]", mp, j);
        if (!c.is_object()) bad(fmt::format("'{}' must be an object", cp), cp);
        auto fit = c.find("function");
        if (fit == c.end() || !fit->is_object()) bad(fmt::format("'{}.function' is required", cp), cp + ".function");
        if (!get_string(*fit, "name")) bad(fmt::format("'{}.function.name' is required", cp), cp + ".function.name");
        Json call = c;
        // Templates expect arguments as a mapping (transformers' convention); OpenAI sends a string.
        if (auto ait = fit->find("arguments"); ait != fit->end() && ait->is_string()) {
          try {
            Json parsed = parse_json_limited(ait->get<std::string>(), (cp + ".function.arguments").c_str());
            if (parsed.is_object()) call["function"]["arguments"] = std::move(parsed);
          } catch (const Json::exception&) {
          }
        }
        calls.push_back(std::move(call));
      }
      out["tool_calls"] = std::move(calls);
      has_tool_calls = !tc->empty();
    }
    if (cit == m.end() || cit->is_null()) {
      if (!(role == "assistant" && has_tool_calls))
        bad(fmt::format("'{}.content' is required for role '{}'", mp, role), mp + ".content");
      out["content"] = nullptr;
    } else {
      out["content"] = content_to_string(*cit, i);
    }
    if (role == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string())
        bad(fmt::format("'{}.tool_call_id' must be a string", mp), mp + ".tool_call_id");
    }
    r.messages.push_back(std::move(out));
  }

  if (auto tit = body.find("tools"); tit != body.end() && !tit->is_null()) {
    if (!tit->is_array()) bad("'tools' must be a list", "tools");
    for (size_t i = 0; i < tit->size(); ++i) {
      const Json& t = (*tit)[i];
      std::string tp = fmt::format("tools[{}]", i);
      if (!t.is_object()) bad(fmt::format("'{}' must be an object", tp), tp);
      auto type = get_string(t, "type");
      if (!type || *type != "function")
        bad(fmt::format("'{}.type' must be \"function\"", tp), tp + ".type");
      auto fit = t.find("function");
      if (fit == t.end() || !fit->is_object()) bad(fmt::format("'{}.function' is required (an object)", tp), tp + ".function");
      auto name = fit->find("name");
      if (name == fit->end() || !name->is_string() || name->get<std::string>().empty())
        bad(fmt::format("'{}.function.name' is required (a non-empty string)", tp), tp + ".function.name");
      if (auto pit = fit->find("parameters"); pit != fit->end() && !pit->is_null() && !pit->is_object())
        bad(fmt::format("'{}.function.parameters' must be an object (a JSON schema)", tp), tp + ".function.parameters");
    }
    if (!tit->empty()) r.tools = *tit;
  }
  if (auto cit = body.find("tool_choice"); cit != body.end() && !cit->is_null()) {
    if (cit->is_string()) {
      std::string c = cit->get<std::string>();
      if (c == "none") r.tool_choice = ToolChoice::none;
      else if (c == "auto") r.tool_choice = ToolChoice::auto_;
      else if (c == "required") r.tool_choice = ToolChoice::required;
      else bad(fmt::format("'tool_choice' must be none, auto, required or a named function, got '{}'", c), "tool_choice");
    } else if (cit->is_object()) {
      auto fit = cit->find("function");
      std::string name;
      if (fit != cit->end() && fit->is_object()) name = get_string(*fit, "name").value_or("");
      if (name.empty()) bad("'tool_choice.function.name' is required", "tool_choice");
      r.tool_choice = ToolChoice::named;
      r.tool_choice_name = name;
    } else {
      bad("'tool_choice' must be a string or an object", "tool_choice");
    }
    if (r.tool_choice != ToolChoice::none && r.tool_choice != ToolChoice::auto_ && r.tools.is_null())
      bad("'tool_choice' requires 'tools'", "tool_choice");
    if (r.tool_choice == ToolChoice::named) {
      bool found = false;
      for (auto& t : r.tools) found |= t["function"]["name"] == r.tool_choice_name;
      if (!found) bad(fmt::format("'tool_choice' names '{}', which is not in 'tools'", r.tool_choice_name), "tool_choice");
    }
  }
  r.structured = parse_structured(body);
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    r.template_kwargs = *kw;
  }
  // vLLM: both at once is a 400; continue_final_message alone implies no generation prompt.
  const std::optional<bool> agp = get_bool(body, "add_generation_prompt");
  r.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
  if (r.continue_final_message && agp.value_or(false))
    bad("Cannot set both 'continue_final_message' and 'add_generation_prompt' to true", "continue_final_message");
  r.add_generation_prompt = agp.value_or(!r.continue_final_message);

  r.max_tokens = parse_max_tokens(body, "max_completion_tokens");
  parse_sampling(body, r.params, info.vocab_size);
  r.n = parse_n(body);
  parse_stream(body, r.stream, r.include_usage);
  r.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto k = get_int(body, "top_logprobs")) {
    if (*k < 0 || *k > 20) bad(fmt::format("'top_logprobs' must be in [0, 20], got {}", *k), "top_logprobs");
    if (!r.logprobs && *k > 0) bad("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    r.top_logprobs = static_cast<int>(*k);
  }
  r.params.logprobs = r.logprobs ? r.top_logprobs : -1;
  r.include_stop_str = get_bool(body, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  return r;
}

// --- structured outputs -----------------------------------------------------------------------
namespace {
// One constraint found in the body: the field that gave it, and the grammar.
struct Found {
  std::string field;
  std::shared_ptr<StructuredRequest> req;
};

// Builds the grammar, turning the engine's InvalidRequest into a 400 naming the field.
template <class F>
std::shared_ptr<StructuredRequest> build(const std::string& field, const std::string& kind, std::string key, F make) {
  auto out = std::make_shared<StructuredRequest>();
  out->kind = kind;
  out->field = field;
  out->key = kind + "\n" + std::move(key);
  try {
    out->ir = std::make_shared<const grammar::Grammar>(make());
  } catch (const InvalidRequest& e) {
    bad(fmt::format("Invalid {} in '{}': {}", kind == "grammar" ? "grammar" : kind, field, e.what()), field);
  }
  return out;
}

// lenient: keywords a grammar cannot express are ignored (a superset; grammar::JsonSchemaOptions)
// instead of a 400 -- OpenAI's non-strict response_format, which promises no enforcement.
std::shared_ptr<StructuredRequest> schema_request(const std::string& field, const Json& schema, bool strict,
                                                  bool lenient = false) {
  Json s = schema;
  if (s.is_string()) {
    try {
      s = parse_json_limited(schema.get<std::string>(), field.c_str());
    } catch (const Json::exception& e) {
      bad(fmt::format("Invalid JSON schema in '{}': {}", field, io::json_error_text(e)), field);
    }
  }
  if (!s.is_object() && !s.is_boolean()) bad(fmt::format("'{}' must be a JSON schema (an object)", field), field);
  grammar::JsonSchemaOptions opt;
  opt.strict = strict;
  opt.any_whitespace = false;
  opt.lenient = lenient;
  std::string key = fmt::format("strict={} lenient={}\n{}", strict, lenient, s.dump());
  return build(field, "json_schema", key, [&] { return grammar::json_schema_grammar(s, opt); });
}

std::shared_ptr<StructuredRequest> json_object_request(const std::string& field) {
  grammar::JsonSchemaOptions opt;
  opt.any_whitespace = false;
  return build(field, "json_object", "", [&] { return grammar::json_object_grammar(opt); });
}

std::shared_ptr<StructuredRequest> regex_request(const std::string& field, const Json& v) {
  if (!v.is_string()) bad(fmt::format("'{}' must be a string (a regular expression)", field), field);
  std::string re = v.get<std::string>();
  return build(field, "regex", re, [&] { return grammar::regex_grammar(re); });
}

std::shared_ptr<StructuredRequest> choice_request(const std::string& field, const Json& v) {
  if (!v.is_array() || v.empty()) bad(fmt::format("'{}' must be a non-empty list of strings", field), field);
  std::vector<std::string> choices;
  std::string key;
  for (auto& c : v) {
    if (!c.is_string()) bad(fmt::format("'{}' must be a non-empty list of strings", field), field);
    choices.push_back(c.get<std::string>());
    key += Json(choices.back()).dump() + "\n";
  }
  return build(field, "choice", key, [&] { return grammar::choice_grammar(choices); });
}

std::shared_ptr<StructuredRequest> grammar_request(const std::string& field, const Json& v) {
  if (!v.is_string()) bad(fmt::format("'{}' must be a string (a GBNF or Lark grammar)", field), field);
  std::string text = v.get<std::string>();
  return build(field, "grammar", text, [&] { return grammar::parse_ebnf(text); });
}

std::shared_ptr<StructuredRequest> response_format_request(const Json& rf) {
  if (!rf.is_object()) bad("'response_format' must be an object", "response_format");
  auto type = get_string(rf, "type").value_or("text");
  if (type == "text") return nullptr;
  if (type == "json_object") return json_object_request("response_format");
  if (type == "json_schema") {
    auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object())
      bad("'response_format.json_schema' is required (an object with 'name' and 'schema')", "response_format.json_schema");
    bool strict = get_bool(*js, "strict").value_or(false);
    auto sc = js->find("schema");
    // OpenAI allows a json_schema without 'schema': any JSON object then.
    if (sc == js->end() || sc->is_null()) return json_object_request("response_format.json_schema");
    return schema_request("response_format.json_schema.schema", *sc, strict, !strict);
  }
  bad(fmt::format("'response_format.type' must be text, json_object or json_schema, got '{}'", type), "response_format");
}
}  // namespace

std::shared_ptr<StructuredRequest> parse_structured(const Json& body) {
  std::vector<Found> found;
  auto has = [&](const Json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && !it->is_null();
  };
  if (has(body, "response_format"))
    if (auto r = response_format_request(body["response_format"])) found.push_back({"response_format", r});
  if (has(body, "structured_outputs")) {
    const Json& so = body["structured_outputs"];
    if (!so.is_object()) bad("'structured_outputs' must be an object", "structured_outputs");
    if (has(so, "json")) found.push_back({"structured_outputs.json", schema_request("structured_outputs.json", so["json"], true)});
    if (has(so, "regex")) found.push_back({"structured_outputs.regex", regex_request("structured_outputs.regex", so["regex"])});
    if (has(so, "choice")) found.push_back({"structured_outputs.choice", choice_request("structured_outputs.choice", so["choice"])});
    if (has(so, "grammar")) found.push_back({"structured_outputs.grammar", grammar_request("structured_outputs.grammar", so["grammar"])});
    if (get_bool(so, "json_object").value_or(false))
      found.push_back({"structured_outputs.json_object", json_object_request("structured_outputs.json_object")});
    for (const char* k : {"structural_tag", "whitespace_pattern"})
      if (has(so, k)) bad(fmt::format("'structured_outputs.{}' is not supported", k), "structured_outputs");
  }
  // vLLM's legacy fields and SGLang's.
  if (has(body, "guided_json")) found.push_back({"guided_json", schema_request("guided_json", body["guided_json"], true)});
  if (has(body, "guided_regex")) found.push_back({"guided_regex", regex_request("guided_regex", body["guided_regex"])});
  if (has(body, "guided_choice")) found.push_back({"guided_choice", choice_request("guided_choice", body["guided_choice"])});
  if (has(body, "guided_grammar")) found.push_back({"guided_grammar", grammar_request("guided_grammar", body["guided_grammar"])});
  if (has(body, "json_schema")) found.push_back({"json_schema", schema_request("json_schema", body["json_schema"], true)});
  if (has(body, "regex")) found.push_back({"regex", regex_request("regex", body["regex"])});
  if (has(body, "ebnf")) found.push_back({"ebnf", grammar_request("ebnf", body["ebnf"])});
  if (found.size() > 1)
    bad(fmt::format("Only one output constraint may be given; got '{}' and '{}'", found[0].field, found[1].field),
        found[1].field);
  return found.empty() ? nullptr : found[0].req;
}

void parse_logit_constraints(const Json& body, GenerateParams& p, int64_t vocab_size) {
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    p.logit_bias.clear();
    for (auto& [k, v] : it->items()) {
      char* end = nullptr;
      long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0') bad(fmt::format("'logit_bias' key '{}' is not a token id", k), "logit_bias");
      if (id < 0 || id >= vocab_size)
        bad(fmt::format("'logit_bias' token id {} is outside the vocabulary [0, {})", id, vocab_size), "logit_bias");
      if (!v.is_number()) bad(fmt::format("'logit_bias[{}]' must be a number", k), "logit_bias");
      double b = v.get<double>();
      if (!(b >= -100 && b <= 100)) bad(fmt::format("'logit_bias[{}]' must be in [-100, 100], got {}", k, b), "logit_bias");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (auto m = get_int(body, "min_tokens")) {
    if (*m < 0) bad(fmt::format("'min_tokens' must be >= 0, got {}", *m), "min_tokens");
    if (auto mt = get_int(body, "max_tokens"); mt && *m > *mt)
      bad(fmt::format("'min_tokens' ({}) must not exceed 'max_tokens' ({})", *m, *mt), "min_tokens");
    p.min_tokens = static_cast<int>(std::min<int64_t>(*m, 1 << 30));
  }
}

// --- responses -------------------------------------------------------------------------------
std::string random_id(const std::string& prefix) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += alphabet[rng() % (sizeof(alphabet) - 1)];
  return s;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* finish_reason_str(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    default: return "";
  }
}

Json usage_json(const Usage& u) {
  Json j = Json::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = Json{{"cached_tokens", u.cached_tokens}};
  return j;
}

size_t text_chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

void CompletionLogprobs::add(const std::vector<TokenLogprob>& lps, const std::function<std::string(int32_t)>& piece,
                             size_t& offset) {
  for (auto& lp : lps) {
    std::string tok = piece(lp.id);
    tokens.push_back(tok);
    token_logprobs.push_back(lp.logprob);
    Json top = Json::object();
    for (auto& [id, l] : lp.top) {
      std::string t = piece(id);
      if (!top.contains(t)) top[t] = l;
    }
    // OpenAI: "the API will always return the logprob of the sampled token, so there may be up
    // to logprobs+1 elements" (vLLM too).
    if (!top.contains(tok)) top[tok] = lp.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += text_chars(tok);
  }
}

void CompletionLogprobs::add_prompt(const std::vector<int32_t>& ids, const std::function<std::string(int32_t)>& piece,
                                    size_t& offset) {
  for (int32_t id : ids) {
    std::string tok = piece(id);
    tokens.push_back(tok);
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    text_offset.push_back(offset);
    offset += text_chars(tok);
  }
}

Json CompletionLogprobs::to_json() const {
  Json j = Json::object();
  j["tokens"] = tokens;
  j["token_logprobs"] = token_logprobs;
  j["top_logprobs"] = top_logprobs;
  j["text_offset"] = text_offset;
  return j;
}

Json chat_logprobs_content(const std::vector<TokenLogprob>& lps, int top,
                           const std::function<std::string(int32_t)>& piece,
                           const std::function<std::string(int32_t)>& raw_bytes) {
  auto bytes_of = [&](int32_t id, const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : raw_bytes ? raw_bytes(id) : s) b.push_back(static_cast<int>(c));
    return b;
  };
  Json out = Json::array();
  for (auto& lp : lps) {
    std::string tok = piece(lp.id);
    Json e = Json::object();
    e["token"] = tok;
    e["logprob"] = lp.logprob;
    e["bytes"] = bytes_of(lp.id, tok);
    Json tl = Json::array();
    for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i) {
      std::string t = piece(lp.top[i].first);
      tl.push_back(Json{{"token", t}, {"logprob", lp.top[i].second}, {"bytes", bytes_of(lp.top[i].first, t)}});
    }
    e["top_logprobs"] = std::move(tl);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ts::server
