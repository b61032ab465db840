#include "server/api_protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include "server/sse.h"

namespace ts::server {

namespace {
[[noreturn]] void bad(const std::string& msg, const std::string& param = "") { throw ApiError(400, msg, param); }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Copies the listed keys of `from` into `to` when present and not null.
void copy_keys(const Json& from, Json& to, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (auto it = from.find(k); it != from.end() && !it->is_null()) to[k] = *it;
}

std::vector<int32_t> ids_of(const Json& arr, const ModelInfo& info, const char* param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (auto& v : arr) {
    if (!v.is_number_integer()) bad(fmt::format("'{}' token lists must contain only integers", param), param);
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= info.vocab_size)
      bad(fmt::format("Token id {} in '{}' is outside the vocabulary [0, {})", id, param, info.vocab_size), param);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}
}  // namespace

// --- --api-key -------------------------------------------------------------------------------------
bool api_key_ok(const std::vector<std::pair<std::string, std::string>>& headers, const std::string& key) {
  if (key.empty()) return true;
  for (auto& [k, v] : headers) {
    std::string name = lower(k);
    if (name == "authorization") {
      if (v.size() > 7 && lower(v.substr(0, 7)) == "bearer ") {
        std::string tok = v.substr(7);
        while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
        if (tok == key) return true;
      }
    } else if (name == "x-api-key" && v == key) {
      return true;
    }
  }
  return false;
}

bool api_key_exempt(const std::string& path) { return path == "/health" || path == "/metrics"; }

// --- tokenize ---------------------------------------------------------------------------------------
TokenizeRequest parse_tokenize_request(const Json& body, const ModelInfo& info) {
  check_model(body, info);
  TokenizeRequest r;
  bool has_prompt = body.contains("prompt") && !body["prompt"].is_null();
  bool has_messages = body.contains("messages") && !body["messages"].is_null();
  if (has_prompt == has_messages) bad("Exactly one of 'prompt' or 'messages' is required", has_prompt ? "messages" : "prompt");
  r.chat = has_messages;
  if (r.chat) {
    Json cb = Json::object();
    copy_keys(body, cb, {"messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"});
    r.chat_body = std::move(cb);
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
  } else {
    r.prompt = *get_string(body, "prompt");
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  }
  r.return_token_strs = get_bool(body, "return_token_strs").value_or(false);
  return r;
}

Json tokenize_response(const std::vector<int32_t>& ids, int64_t max_model_len, const std::vector<std::string>* strs) {
  Json o = Json::object();
  o["count"] = ids.size();
  o["max_model_len"] = max_model_len;
  o["tokens"] = ids;
  o["token_strs"] = strs ? Json(*strs) : Json(nullptr);
  return o;
}

std::vector<int32_t> parse_detokenize_request(const Json& body, const ModelInfo& info) {
  check_model(body, info);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) bad("'tokens' is required (a list of token ids)", "tokens");
  return ids_of(*it, info, "tokens");
}

// --- embeddings --------------------------------------------------------------------------------------
EmbeddingsRequest parse_embeddings_request(const Json& body, const ModelInfo& info, const EncodeFn& encode) {
  check_model(body, info);
  EmbeddingsRequest r;
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) bad("'input' is required", "input");
  std::vector<Json> items;
  if (it->is_string()) {
    items.push_back(*it);
  } else if (it->is_array()) {
    if (it->empty()) bad("'input' must not be empty", "input");
    if ((*it)[0].is_number()) items.push_back(*it);
    else
      for (auto& v : *it) {
        if (!v.is_string() && !v.is_array())
          bad("'input' must be a string, a list of strings, a list of token ids, or a list of token-id lists", "input");
        items.push_back(v);
      }
  } else {
    bad("'input' must be a string, a list of strings, a list of token ids, or a list of token-id lists", "input");
  }
  if (items.size() > 2048) bad(fmt::format("'input' has {} items; at most 2048 are allowed", items.size()), "input");
  for (auto& v : items) {
    if (v.is_string() && v.get<std::string>().empty()) bad("'input' must not contain empty strings or lists", "input");
    std::vector<int32_t> ids = v.is_string() ? encode(v.get<std::string>()) : ids_of(v, info, "input");
    if (ids.empty()) bad("'input' must not contain empty strings or lists", "input");
    if (static_cast<int64_t>(ids.size()) > info.context_length)
      bad(fmt::format("This model's maximum context length is {} tokens, however an input has {} tokens",
                      info.context_length, ids.size()),
          "input");
    r.inputs.push_back(std::move(ids));
  }
  std::string fmt_ = get_string(body, "encoding_format").value_or("float");
  if (fmt_ != "float" && fmt_ != "base64")
    bad(fmt::format("'encoding_format' must be float or base64, got '{}'", fmt_), "encoding_format");
  r.base64 = fmt_ == "base64";
  if (auto d = get_int(body, "dimensions")) {
    if (*d < 1) bad(fmt::format("'dimensions' must be at least 1, got {}", *d), "dimensions");
    r.dimensions = *d;
  }
  return r;
}

void finish_embedding(std::vector<float>& v, std::optional<int64_t> dims) {
  if (dims) {
    if (*dims > static_cast<int64_t>(v.size()))
      bad(fmt::format("'dimensions' is {}, larger than the model's embedding size {}", *dims, v.size()), "dimensions");
    v.resize(static_cast<size_t>(*dims));
  }
  double ss = 0;
  for (float x : v) ss += double(x) * double(x);
  if (ss > 0) {
    float inv = static_cast<float>(1.0 / std::sqrt(ss));
    for (float& x : v) x *= inv;
  }
}

std::string base64_encode(const void* data, size_t n) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t w = (uint32_t(p[i]) << 16) | (uint32_t(p[i + 1]) << 8) | p[i + 2];
    out += tbl[w >> 18];
    out += tbl[(w >> 12) & 63];
    out += tbl[(w >> 6) & 63];
    out += tbl[w & 63];
  }
  if (i < n) {
    uint32_t w = uint32_t(p[i]) << 16;
    if (i + 1 < n) w |= uint32_t(p[i + 1]) << 8;
    out += tbl[w >> 18];
    out += tbl[(w >> 12) & 63];
    out += i + 1 < n ? tbl[(w >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Json embedding_value(const std::vector<float>& v, bool base64) {
  if (!base64) {
    Json a = Json::array();
    for (float x : v) a.push_back(x);
    return a;
  }
  // Little-endian f32 bytes, as OpenAI's clients decode them (Float32Array over the buffer).
  std::vector<unsigned char> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t w;
    std::memcpy(&w, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = static_cast<unsigned char>(w >> (8 * b));
  }
  return base64_encode(bytes.data(), bytes.size());
}

// --- prompt logprobs -------------------------------------------------------------------------------------
void add_prompt_logprobs(CompletionLogprobs& L, const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps,
                         int top, const std::function<std::string(int32_t)>& piece, size_t& offset) {
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string tok = piece(ids[i]);
    L.tokens.push_back(tok);
    L.text_offset.push_back(offset);
    offset += text_chars(tok);
    if (i == 0 || i - 1 >= lps.size()) {
      L.token_logprobs.push_back(nullptr);
      L.top_logprobs.push_back(nullptr);
      continue;
    }
    const TokenLogprob& lp = lps[i - 1];
    L.token_logprobs.push_back(lp.logprob);
    Json t = Json::object();
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < top; ++k) {
      std::string s = piece(lp.top[k].first);
      if (!t.contains(s)) t[s] = lp.top[k].second;
    }
    if (!t.contains(tok)) t[tok] = lp.logprob;  // the prompt token's own, always (OpenAI: up to logprobs + 1)
    L.top_logprobs.push_back(std::move(t));
  }
}

Json vllm_prompt_logprobs(const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps,
                          const std::vector<int32_t>& ranks, int top, const std::function<std::string(int32_t)>& piece) {
  Json out = Json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 0 || i - 1 >= lps.size()) {
      out.push_back(nullptr);
      continue;
    }
    const TokenLogprob& lp = lps[i - 1];
    Json e = Json::object();
    e[std::to_string(ids[i])] = Json{{"logprob", lp.logprob},
                                     {"rank", i - 1 < ranks.size() ? Json(ranks[i - 1]) : Json(nullptr)},
                                     {"decoded_token", piece(ids[i])}};
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < top; ++k) {
      std::string key = std::to_string(lp.top[k].first);
      if (!e.contains(key))
        e[key] = Json{{"logprob", lp.top[k].second}, {"rank", k + 1}, {"decoded_token", piece(lp.top[k].first)}};
    }
    out.push_back(std::move(e));
  }
  return out;
}

// --- Anthropic Messages ------------------------------------------------------------------------------
namespace {
// Text of a string or a list of text blocks (tool_result content, system).
std::string blocks_text(const Json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(fmt::format("'{}' must be a string or a list of content blocks", param), param);
  std::string out;
  for (auto& b : c) {
    if (!b.is_object()) bad(fmt::format("'{}' blocks must be objects", param), param);
    std::string type = get_string(b, "type").value_or("");
    if (type != "text") bad(fmt::format("Content block type '{}' is not supported in '{}' (only text)", type, param), param);
    if (!out.empty()) out += "\n";
    out += get_string(b, "text").value_or("");
  }
  return out;
}
}  // namespace

Json anthropic_to_chat(const Json& body) {
  Json chat = Json::object();
  copy_keys(body, chat, {"model", "temperature", "top_p", "top_k", "stream"});
  auto mt = get_int(body, "max_tokens");
  if (!mt) bad("'max_tokens' is required", "max_tokens");
  chat["max_tokens"] = *mt;
  Json msgs = Json::array();
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    std::string text = blocks_text(*s, "system");
    if (!text.empty()) msgs.push_back(Json{{"role", "system"}, {"content", text}});
  }
  auto mit = body.find("messages");
  if (mit == body.end() || !mit->is_array() || mit->empty()) bad("'messages' is required (a non-empty list)", "messages");
  for (size_t i = 0; i < mit->size(); ++i) {
    const Json& m = (*mit)[i];
    std::string mp = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(fmt::format("'{}' must be an object", mp), mp);
    std::string role = get_string(m, "role").value_or("");
    if (role != "user" && role != "assistant")
      bad(fmt::format("'{}.role' must be user or assistant, got '{}'", mp, role), mp + ".role");
    auto cit = m.find("content");
    if (cit == m.end() || cit->is_null()) bad(fmt::format("'{}.content' is required", mp), mp + ".content");
    if (cit->is_string()) {
      msgs.push_back(Json{{"role", role}, {"content", *cit}});
      continue;
    }
    if (!cit->is_array()) bad(fmt::format("'{}.content' must be a string or a list of blocks", mp), mp + ".content");
    std::string text;
    Json calls = Json::array();
    for (size_t j = 0; j < cit->size(); ++j) {
      const Json& b = (*cit)[j];
      std::string bp = fmt::format("{}.content[{}]", mp, j);
      if (!b.is_object()) bad(fmt::format("'{}' must be an object", bp), bp);
      std::string type = get_string(b, "type").value_or("");
      if (type == "text") {
        if (!text.empty()) text += "\n";
        text += get_string(b, "text").value_or("");
      } else if (type == "tool_use") {
        if (role != "assistant") bad(fmt::format("'{}': tool_use blocks belong to assistant messages", bp), bp);
        auto name = get_string(b, "name");
        if (!name || name->empty()) bad(fmt::format("'{}.name' is required", bp), bp + ".name");
        Json input = b.contains("input") && b["input"].is_object() ? b["input"] : Json::object();
        calls.push_back(Json{{"id", get_string(b, "id").value_or("")},
                             {"type", "function"},
                             {"function", Json{{"name", *name}, {"arguments", dump(input)}}}});
      } else if (type == "tool_result") {
        if (role != "user") bad(fmt::format("'{}': tool_result blocks belong to user messages", bp), bp);
        std::string out = blocks_text(b.contains("content") ? b["content"] : Json(""), bp + ".content");
        if (get_bool(b, "is_error").value_or(false)) out = "Error: " + out;
        // Tool results answer the previous assistant turn: they come before this turn's text.
        msgs.push_back(Json{{"role", "tool"}, {"tool_call_id", get_string(b, "tool_use_id").value_or("")}, {"content", out}});
      } else if (type == "thinking" || type == "redacted_thinking") {
        // Earlier turns' reasoning is not replayed (as chat templates drop it).
      } else {
        bad(fmt::format("Content block type '{}' is not supported (text, tool_use, tool_result, thinking)", type), bp);
      }
    }
    if (role == "assistant") {
      Json a = Json{{"role", "assistant"}, {"content", calls.empty() || !text.empty() ? Json(text) : Json(nullptr)}};
      if (!calls.empty()) a["tool_calls"] = std::move(calls);
      msgs.push_back(std::move(a));
    } else if (!text.empty()) {
      msgs.push_back(Json{{"role", "user"}, {"content", text}});
    }
  }
  // Anthropic's prefill: a final assistant message (text, no tool calls) is continued, not closed
  // (an empty one is a fresh turn: ChatTemplates::render drops it).
  if (!msgs.empty() && msgs.back()["role"] == "assistant" && !msgs.back().contains("tool_calls"))
    chat["continue_final_message"] = true;
  chat["messages"] = std::move(msgs);
  if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    if (!s->is_array()) bad("'stop_sequences' must be a list of strings", "stop_sequences");
    chat["stop"] = *s;
  }
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("'tools' must be a list", "tools");
    Json tools = Json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tl = (*t)[i];
      std::string tp = fmt::format("tools[{}]", i);
      if (!tl.is_object()) bad(fmt::format("'{}' must be an object", tp), tp);
      auto name = get_string(tl, "name");
      if (!name || name->empty()) bad(fmt::format("'{}.name' is required", tp), tp + ".name");
      Json f = Json{{"name", *name}};
      if (auto d = get_string(tl, "description")) f["description"] = *d;
      f["parameters"] = tl.contains("input_schema") && tl["input_schema"].is_object() ? tl["input_schema"] : Json::object();
      tools.push_back(Json{{"type", "function"}, {"function", std::move(f)}});
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (!c->is_object()) bad("'tool_choice' must be an object {type: auto|any|tool|none}", "tool_choice");
    std::string type = get_string(*c, "type").value_or("");
    if (type == "auto") chat["tool_choice"] = "auto";
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "none") chat["tool_choice"] = "none";
    else if (type == "tool")
      chat["tool_choice"] = Json{{"type", "function"}, {"function", Json{{"name", get_string(*c, "name").value_or("")}}}};
    else bad(fmt::format("'tool_choice.type' must be auto, any, tool or none, got '{}'", type), "tool_choice");
    if (auto p = get_bool(*c, "disable_parallel_tool_use"); p && *p) chat["parallel_tool_calls"] = false;
  }
  return chat;
}

Json anthropic_error(int status, const std::string& message) {
  const char* type = "api_error";
  switch (status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: break;
  }
  return Json{{"type", "error"}, {"error", Json{{"type", type}, {"message", message}}}};
}

const char* anthropic_stop_reason(FinishReason r, bool tool_calls, bool stop_sequence) {
  if (r == FinishReason::length) return "max_tokens";
  if (tool_calls) return "tool_use";
  if (stop_sequence) return "stop_sequence";
  return "end_turn";
}

Json arguments_object(const std::string& arguments) {
  try {
    Json j = parse_json_limited(arguments, "tool-call arguments");
    if (j.is_object()) return j;
  } catch (const std::exception&) {
  }
  return Json::object();
}

Json anthropic_content(const ChatDelta& all, const std::string& tool_id_prefix) {
  Json out = Json::array();
  if (!all.reasoning.empty()) out.push_back(Json{{"type", "thinking"}, {"thinking", all.reasoning}, {"signature", ""}});
  if (!all.content.empty() || all.tool_calls.empty()) out.push_back(Json{{"type", "text"}, {"text", all.content}});
  for (auto& c : all.tool_calls)
    out.push_back(Json{{"type", "tool_use"},
                       {"id", random_id(tool_id_prefix)},
                       {"name", c.name},
                       {"input", arguments_object(c.arguments)}});
  return out;
}

// --- Responses API -------------------------------------------------------------------------------------
namespace {
std::string parts_text(const Json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(fmt::format("'{}' must be a string or a list of content parts", param), param);
  std::string out;
  for (auto& p : c) {
    if (!p.is_object()) bad(fmt::format("'{}' parts must be objects", param), param);
    std::string type = get_string(p, "type").value_or("");
    if (type != "input_text" && type != "output_text" && type != "text")
      bad(fmt::format("Content part type '{}' is not supported (input_text, output_text)", type), param);
    if (!out.empty()) out += "\n";
    out += get_string(p, "text").value_or("");
  }
  return out;
}
}  // namespace

Json responses_to_chat(const Json& body, const Json& history, Json& conversation) {
  Json chat = Json::object();
  copy_keys(body, chat, {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed", "top_k",
                         "stop", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty"});
  if (auto m = get_int(body, "max_output_tokens")) {
    if (*m < 1) bad(fmt::format("'max_output_tokens' must be at least 1, got {}", *m), "max_output_tokens");
    chat["max_tokens"] = *m;
  }
  conversation = history.is_array() ? history : Json::array();
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) bad("'input' is required", "input");
  if (it->is_string()) {
    conversation.push_back(Json{{"role", "user"}, {"content", *it}});
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& item = (*it)[i];
      std::string ip = fmt::format("input[{}]", i);
      if (!item.is_object()) bad(fmt::format("'{}' must be an object", ip), ip);
      std::string type = get_string(item, "type").value_or(item.contains("role") ? "message" : "");
      if (type == "message") {
        std::string role = get_string(item, "role").value_or("");
        if (role != "user" && role != "assistant" && role != "system" && role != "developer")
          bad(fmt::format("'{}.role' must be user, assistant, system or developer, got '{}'", ip, role), ip + ".role");
        auto cit = item.find("content");
        if (cit == item.end() || cit->is_null()) bad(fmt::format("'{}.content' is required", ip), ip + ".content");
        conversation.push_back(Json{{"role", role == "developer" ? "system" : role},
                                    {"content", parts_text(*cit, ip + ".content")}});
      } else if (type == "function_call") {
        auto name = get_string(item, "name");
        if (!name || name->empty()) bad(fmt::format("'{}.name' is required", ip), ip + ".name");
        Json call = Json{{"id", get_string(item, "call_id").value_or("")},
                         {"type", "function"},
                         {"function", Json{{"name", *name}, {"arguments", get_string(item, "arguments").value_or("{}")}}}};
        // Consecutive calls are one assistant turn (parallel tool calls).
        if (!conversation.empty() && conversation.back()["role"] == "assistant" &&
            conversation.back().contains("tool_calls"))
          conversation.back()["tool_calls"].push_back(std::move(call));
        else
          conversation.push_back(Json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array({call})}});
      } else if (type == "function_call_output") {
        auto out = item.find("output");
        std::string text = out == item.end() || out->is_null() ? "" : out->is_string() ? out->get<std::string>() : dump(*out);
        conversation.push_back(
            Json{{"role", "tool"}, {"tool_call_id", get_string(item, "call_id").value_or("")}, {"content", text}});
      } else if (type == "reasoning") {
        // Not replayed (chat templates drop earlier reasoning).
      } else {
        bad(fmt::format("Input item type '{}' is not supported (message, function_call, function_call_output, reasoning)",
                        type),
            ip + ".type");
      }
    }
  } else {
    bad("'input' must be a string or a list of items", "input");
  }
  Json msgs = Json::array();
  if (auto ins = get_string(body, "instructions"); ins && !ins->empty())
    msgs.push_back(Json{{"role", "system"}, {"content", *ins}});
  for (auto& m : conversation) msgs.push_back(m);
  if (msgs.empty()) bad("'input' must not be empty", "input");
  chat["messages"] = std::move(msgs);
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("'tools' must be a list", "tools");
    Json tools = Json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tl = (*t)[i];
      std::string tp = fmt::format("tools[{}]", i);
      if (!tl.is_object()) bad(fmt::format("'{}' must be an object", tp), tp);
      std::string type = get_string(tl, "type").value_or("");
      if (type != "function") bad(fmt::format("'{}.type' '{}' is not supported (only function tools)", tp, type), tp + ".type");
      auto name = get_string(tl, "name");
      if (!name || name->empty()) bad(fmt::format("'{}.name' is required", tp), tp + ".name");
      Json f = Json{{"name", *name}};
      if (auto d = get_string(tl, "description")) f["description"] = *d;
      f["parameters"] = tl.contains("parameters") && tl["parameters"].is_object() ? tl["parameters"] : Json::object();
      if (auto s = get_bool(tl, "strict")) f["strict"] = *s;
      tools.push_back(Json{{"type", "function"}, {"function", std::move(f)}});
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) chat["tool_choice"] = *c;
    else if (c->is_object() && get_string(*c, "type").value_or("") == "function")
      chat["tool_choice"] = Json{{"type", "function"}, {"function", Json{{"name", get_string(*c, "name").value_or("")}}}};
    else bad("'tool_choice' must be none, auto, required or {type: function, name}", "tool_choice");
  }
  if (auto t = body.find("text"); t != body.end() && t->is_object()) {
    if (auto f = t->find("format"); f != t->end() && f->is_object()) {
      std::string type = get_string(*f, "type").value_or("text");
      if (type == "json_schema") {
        Json js = Json::object();
        copy_keys(*f, js, {"name", "schema", "strict", "description"});
        chat["response_format"] = Json{{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (type != "text") {
        chat["response_format"] = Json{{"type", type}};
      }
    }
  }
  return chat;
}

ResponsesOutput responses_output(const ChatDelta& all) {
  ResponsesOutput r;
  if (!all.reasoning.empty())
    r.items.push_back(Json{{"type", "reasoning"},
                           {"id", random_id("rs_")},
                           {"summary", Json::array()},
                           {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", all.reasoning}}})}});
  if (!all.content.empty() || all.tool_calls.empty())
    r.items.push_back(Json{{"type", "message"},
                           {"id", random_id("msg_")},
                           {"status", "completed"},
                           {"role", "assistant"},
                           {"content", Json::array({Json{{"type", "output_text"},
                                                         {"text", all.content},
                                                         {"annotations", Json::array()},
                                                         {"logprobs", Json::array()}}})}});
  Json calls = Json::array();
  for (auto& c : all.tool_calls) {
    std::string call_id = c.id.empty() ? random_id("call_") : c.id;
    r.items.push_back(Json{{"type", "function_call"},
                           {"id", random_id("fc_")},
                           {"call_id", call_id},
                           {"name", c.name},
                           {"arguments", c.arguments},
                           {"status", "completed"}});
    calls.push_back(Json{{"id", call_id}, {"type", "function"}, {"function", Json{{"name", c.name}, {"arguments", c.arguments}}}});
  }
  Json a = Json{{"role", "assistant"}, {"content", all.content.empty() && !calls.empty() ? Json(nullptr) : Json(all.content)}};
  if (!calls.empty()) a["tool_calls"] = std::move(calls);
  r.messages.push_back(std::move(a));
  return r;
}

Json response_object(const std::string& id, int64_t created, const std::string& model, const Json& body,
                     const Json& output, const std::string& status, const Usage* usage) {
  auto field = [&](const char* k, Json dflt) {
    auto it = body.find(k);
    return it == body.end() || it->is_null() ? dflt : *it;
  };
  Json o = Json::object();
  o["id"] = id;
  o["object"] = "response";
  o["created_at"] = created;
  o["status"] = status;
  o["error"] = nullptr;
  o["incomplete_details"] = status == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  o["instructions"] = field("instructions", nullptr);
  o["max_output_tokens"] = field("max_output_tokens", nullptr);
  o["model"] = model;
  o["output"] = output;
  o["parallel_tool_calls"] = field("parallel_tool_calls", true);
  o["previous_response_id"] = field("previous_response_id", nullptr);
  o["reasoning"] = Json{{"effort", nullptr}, {"summary", nullptr}};
  o["store"] = field("store", true);
  o["temperature"] = field("temperature", 1.0);
  o["text"] = field("text", Json{{"format", Json{{"type", "text"}}}});
  o["tool_choice"] = field("tool_choice", "auto");
  o["tools"] = field("tools", Json::array());
  o["top_p"] = field("top_p", 1.0);
  o["truncation"] = "disabled";
  if (usage) {
    Json u = Json::object();
    u["input_tokens"] = usage->prompt_tokens;
    u["input_tokens_details"] = Json{{"cached_tokens", usage->cached_tokens}};
    u["output_tokens"] = usage->completion_tokens;
    u["output_tokens_details"] = Json{{"reasoning_tokens", 0}};
    u["total_tokens"] = usage->prompt_tokens + usage->completion_tokens;
    o["usage"] = std::move(u);
  } else {
    o["usage"] = nullptr;
  }
  o["user"] = field("user", nullptr);
  o["metadata"] = field("metadata", Json::object());
  return o;
}

std::string sse_event(const std::string& name, const Json& j) { return "event: " + name + "\n" + sse_data(j); }

}  // namespace ts::server
