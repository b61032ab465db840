#include "server/output_parsers.h"

#include <algorithm>

#include "io/json_file.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include <fmt/format.h>
#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "runtime/structured.h"
#include "server/protocol.h"
#include "server/tool_parsers.h"

namespace ts::server {

namespace {
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kKimiSection = "<|tool_calls_section_begin|>";

// Length of the longest suffix of `buf` that is a proper prefix of `tag` (held back: the tag
// may complete in the next piece).
size_t partial_suffix(std::string_view buf, std::string_view tag) {
  size_t max = std::min(buf.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (buf.substr(buf.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// Splits "{...}; {...}" into top-level JSON objects (string-aware); false on anything else.
bool split_objects(std::string_view s, std::vector<std::string_view>& out) {
  size_t i = 0;
  while (true) {
    while (i < s.size() && (is_ws(s[i]) || s[i] == ';')) ++i;
    if (i == s.size()) return !out.empty();
    if (s[i] != '{') return false;
    size_t start = i;
    int depth = 0;
    bool in_str = false, esc = false;
    for (; i < s.size(); ++i) {
      char c = s[i];
      if (in_str) {
        if (esc) esc = false;
        else if (c == '\\') esc = true;
        else if (c == '"') in_str = false;
      } else if (c == '"') {
        in_str = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          ++i;
          break;
        }
      }
    }
    if (depth != 0) return false;
    out.push_back(s.substr(start, i - start));
  }
}
}  // namespace

bool parse_tool_call_json(std::string_view text, ToolCall& call) {
  // Model output nested deeper than requests may be is not a tool call (and would recurse deeply
  // when the response is serialized).
  if (io::json_depth(text, io::kDefaultMaxJsonDepth) > io::kDefaultMaxJsonDepth) return false;
  Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  call.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) call.arguments = "{}";
  else if (args->is_string()) call.arguments = args->get<std::string>();
  else call.arguments = dump(*args);
  return true;
}

ParseContext parse_context(const ChatRequest& cr) {
  ParseContext c;
  if (cr.tools.is_array() && !cr.tools.empty()) c.tools = std::make_shared<const Json>(cr.tools);
  // vLLM's deepseek_v3: thinking or enable_thinking (either true turns it on).
  for (const char* k : {"thinking", "enable_thinking"})
    if (auto it = cr.template_kwargs.find(k); it != cr.template_kwargs.end() && it->is_boolean())
      c.thinking = c.thinking.value_or(false) || it->get<bool>();
  return c;
}

std::vector<std::string> parser_markers(ReasoningParser::Kind r, ToolCallParser::Kind t) {
  std::vector<std::string> m;
  if (r != ReasoningParser::Kind::none) m = {"<think>", "</think>"};
  if (r == ReasoningParser::Kind::kimi_k2) m.emplace_back("<|tool_calls_section_begin|>");
  if (t == ToolCallParser::Kind::hermes) m.insert(m.end(), {"<tool_call>", "</tool_call>"});
  if (t == ToolCallParser::Kind::llama3) m.emplace_back("<|python_tag|>");
  if (auto f = tool_call_format(t)) {
    for (std::string_view s : {f->open(), f->close()})
      if (!s.empty()) m.emplace_back(s);
    for (std::string_view s : f->inner_markers()) m.emplace_back(s);
  }
  return m;
}

// --- reasoning ---------------------------------------------------------------------------------
ReasoningParser::Kind ReasoningParser::kind_from_name(const std::string& name) {
  if (name.empty() || name == "none") return Kind::none;
  if (name == "qwen3") return Kind::qwen3;
  if (name == "deepseek-r1" || name == "deepseek_r1") return Kind::deepseek_r1;
  if (name == "deepseek_v3" || name == "deepseek-v3") return Kind::deepseek_v3;
  if (name == "glm45") return Kind::glm45;
  if (name == "kimi_k2") return Kind::kimi_k2;
  if (name == "minimax_m2") return Kind::minimax_m2;
  if (name == "minimax_m2_append_think") return Kind::minimax_m2_append_think;
  fail("unknown --reasoning-parser '{}' (expected qwen3, deepseek-r1, deepseek_v3, glm45, kimi_k2, minimax_m2 or "
       "minimax_m2_append_think)",
       name);
}

ReasoningParser::ReasoningParser(Kind k, std::optional<bool> thinking) {
  switch (k) {
    case Kind::none: start_ = Start::content; break;
    case Kind::qwen3: start_ = Start::think_tag; break;
    case Kind::deepseek_r1:
    case Kind::minimax_m2: start_ = Start::reasoning; break;
    case Kind::deepseek_v3: start_ = thinking.value_or(false) ? Start::reasoning : Start::content; break;
    case Kind::glm45:
      start_ = Start::think_tag;
      skip_ws_ = true;
      break;
    case Kind::kimi_k2:
      start_ = thinking.value_or(true) ? Start::reasoning : Start::content;
      alt_end_ = kKimiSection;
      break;
    case Kind::minimax_m2_append_think:
      start_ = Start::content;
      prefix_pending_ = true;
      break;
  }
  state_ = start_ == Start::content ? State::content : State::start;
}

void ReasoningParser::feed(std::string_view text, std::string& reasoning, std::string& content) {
  if (prefix_pending_) {
    content += kThinkOpen;
    prefix_pending_ = false;
  }
  buf_.append(text);
  while (true) {
    if (state_ == State::start) {
      size_t i = 0;
      if (skip_ws_)
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
      std::string_view rest = std::string_view(buf_).substr(i);
      if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return;
      if (rest.starts_with(kThinkOpen)) {
        buf_.erase(0, i + kThinkOpen.size());
        state_ = State::reasoning;
      } else {
        state_ = start_ == Start::reasoning ? State::reasoning : State::content;
      }
    } else if (state_ == State::reasoning) {
      size_t pos = buf_.find(kThinkClose);
      size_t alt = alt_end_.empty() ? std::string::npos : buf_.find(alt_end_);
      if (alt != std::string::npos && (pos == std::string::npos || alt < pos)) {
        // kimi_k2: a tool-call section ends the reasoning; the marker is the content's.
        reasoning.append(buf_, 0, alt);
        buf_.erase(0, alt);
        state_ = State::content;
        continue;
      }
      if (pos != std::string::npos) {
        reasoning.append(buf_, 0, pos);
        buf_.erase(0, pos + kThinkClose.size());
        state_ = State::content;
        continue;
      }
      size_t keep = partial_suffix(buf_, kThinkClose);
      if (!alt_end_.empty()) keep = std::max(keep, partial_suffix(buf_, alt_end_));
      reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    } else {
      content += buf_;
      buf_.clear();
      return;
    }
  }
}

void ReasoningParser::finish(std::string& reasoning, std::string& content) {
  if (prefix_pending_) {
    content += kThinkOpen;
    prefix_pending_ = false;
  }
  bool to_reasoning = state_ == State::reasoning || (state_ == State::start && start_ == Start::reasoning);
  (to_reasoning ? reasoning : content) += buf_;
  buf_.clear();
}

// --- tool calls --------------------------------------------------------------------------------
ToolCallParser::Kind ToolCallParser::kind_from_name(const std::string& name) {
  if (name.empty() || name == "none") return Kind::none;
  if (name == "hermes" || name == "qwen" || name == "qwen25" || name == "qwen3") return Kind::hermes;
  if (name == "llama3" || name == "llama3_json" || name == "llama") return Kind::llama3;
  if (name == "mistral") return Kind::mistral;
  if (name == "deepseek_v3") return Kind::deepseek_v3;
  if (name == "deepseek_v31") return Kind::deepseek_v31;
  if (name == "kimi_k2") return Kind::kimi_k2;
  if (name == "qwen3_coder") return Kind::qwen3_coder;
  if (name == "glm45" || name == "glm47") return Kind::glm45;
  if (name == "minimax_m2") return Kind::minimax_m2;
  fail("unknown --tool-call-parser '{}' (expected hermes, qwen, qwen25, llama3, llama3_json, mistral, deepseek_v3, "
       "deepseek_v31, kimi_k2, qwen3_coder, glm45 or minimax_m2)",
       name);
}

ToolCallParser::ToolCallParser(Kind k, std::shared_ptr<const Json> tools)
    : kind_(k), fmt_(tool_call_format(k)), tools_(std::move(tools)), state_(k == Kind::llama3 ? State::start : State::text) {}

void ToolCallParser::emit_text(std::string_view s, std::string& content) {
  if (ncalls_ == 0) {
    content.append(s);
    return;
  }
  // After a call, whitespace between/after calls is dropped; other text is kept.
  ws_.append(s);
  for (char c : ws_)
    if (!is_ws(c)) {
      content += ws_;
      ws_.clear();
      return;
    }
}

void ToolCallParser::close_call(std::string& content, std::vector<ToolCall>& calls, bool closed) {
  ToolCall call;
  // Unclosed (the output ended: max_tokens): a complete call whose close tag was cut
  // (`{...}\n</tool`) is still that call, as the incremental parse (streaming) already took it.
  std::string_view body = buf_;
  if (!closed) body.remove_suffix(partial_suffix(buf_, kCallClose));
  if (parse_tool_call_json(trim(body), call)) {
    call.id = random_id("call_");
    calls.push_back(std::move(call));
    ++ncalls_;
    ws_.clear();
  } else {
    emit_text(std::string(kCallOpen) + buf_ + (closed ? std::string(kCallClose) : ""), content);
  }
  buf_.clear();
}

void ToolCallParser::feed(std::string_view text, std::string& content, std::vector<ToolCall>& calls) {
  if (kind_ == Kind::none) {
    content.append(text);
    return;
  }
  buf_.append(text);
  if (fmt_) return feed_blocks(content, calls);
  while (true) {
    switch (state_) {
      case State::text: {
        if (kind_ == Kind::llama3) {
          content += buf_;
          buf_.clear();
          return;
        }
        size_t pos = buf_.find(kCallOpen);
        if (pos != std::string::npos) {
          emit_text(std::string_view(buf_).substr(0, pos), content);
          ws_.clear();
          buf_.erase(0, pos + kCallOpen.size());
          state_ = State::call;
          continue;
        }
        size_t keep = partial_suffix(buf_, kCallOpen);
        emit_text(std::string_view(buf_).substr(0, buf_.size() - keep), content);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::call: {
        if (incremental_ && !streaming_ && !head_failed_) {
          int h = try_head(calls);
          if (h < 0) head_failed_ = true;
        }
        if (streaming_) {
          stream_args(calls);
          if (!args_done_) return;  // the value is open: a close tag inside it is string text
          size_t pos = buf_.find(kCallClose, args_pos_);
          if (pos == std::string::npos) return;
          std::string rest = buf_.substr(pos + kCallClose.size());
          buf_ = std::move(rest);
          streaming_ = head_failed_ = args_done_ = false;
          ws_.clear();
          state_ = State::text;
          continue;
        }
        size_t pos = buf_.find(kCallClose);
        if (pos == std::string::npos) return;
        std::string rest = buf_.substr(pos + kCallClose.size());
        buf_.resize(pos);
        close_call(content, calls, true);
        buf_ = std::move(rest);
        head_failed_ = false;
        state_ = State::text;
        continue;
      }
      case State::start: {  // llama3: decide from the first non-space characters
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        if (i == buf_.size()) return;
        std::string_view rest = std::string_view(buf_).substr(i);
        if (rest[0] == '{' || rest.starts_with(kPythonTag)) {
          state_ = State::json;
          return;
        }
        if (rest.size() < kPythonTag.size() && kPythonTag.substr(0, rest.size()) == rest) return;
        state_ = State::text;
        continue;
      }
      case State::json:
        return;  // decided at finish()
    }
  }
}

namespace {
// Reads a JSON string at s[i] ('"'): 1 = complete (its value in `out`, i past it), 0 = the
// text ends inside it, -1 = not a string.
int read_json_string(std::string_view s, size_t& i, std::string& out) {
  if (i >= s.size()) return 0;
  if (s[i] != '"') return -1;
  size_t j = i + 1;
  bool esc = false;
  for (; j < s.size(); ++j) {
    if (esc) esc = false;
    else if (s[j] == '\\') esc = true;
    else if (s[j] == '"') break;
  }
  if (j >= s.size()) return 0;
  Json v = Json::parse(s.substr(i, j + 1 - i), nullptr, false);
  if (v.is_discarded() || !v.is_string()) return -1;
  out = v.get<std::string>();
  i = j + 1;
  return 1;
}
}  // namespace

int ToolCallParser::try_head(std::vector<ToolCall>& calls) {
  // {"name": "N", "arguments": {   (any whitespace; "parameters" too)
  std::string_view s = buf_;
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i < s.size();
  };
  auto ch = [&](char c) -> int {
    if (!ws()) return 0;
    if (s[i] != c) return -1;
    ++i;
    return 1;
  };
  std::string key, name;
  int r;
  if ((r = ch('{')) <= 0) return r;
  if (!ws()) return 0;
  if ((r = read_json_string(s, i, key)) <= 0) return r;
  if (key != "name") return -1;
  if ((r = ch(':')) <= 0) return r;
  if (!ws()) return 0;
  if ((r = read_json_string(s, i, name)) <= 0) return r;
  if (name.empty()) return -1;
  if ((r = ch(',')) <= 0) return r;
  if (!ws()) return 0;
  if ((r = read_json_string(s, i, key)) <= 0) return r;
  if (key != "arguments" && key != "parameters") return -1;
  if ((r = ch(':')) <= 0) return r;
  if (!ws()) return 0;
  if (s[i] != '{') return -1;  // only object arguments stream (a string-encoded one waits)
  ToolCall c;
  c.id = random_id("call_");
  c.name = std::move(name);
  c.streaming_head = true;
  calls.push_back(std::move(c));
  ++ncalls_;
  streaming_ = true;
  args_done_ = false;
  args_pos_ = i;
  depth_ = 0;
  in_str_ = esc_ = false;
  return 1;
}

void ToolCallParser::stream_args(std::vector<ToolCall>& calls) {
  size_t i = args_pos_;
  for (; i < buf_.size() && !args_done_; ++i) {
    char c = buf_[i];
    if (in_str_) {
      if (esc_) esc_ = false;
      else if (c == '\\') esc_ = true;
      else if (c == '"') in_str_ = false;
    } else if (c == '"') {
      in_str_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) args_done_ = true;
    }
  }
  if (i == args_pos_) return;
  ToolCall frag;
  frag.continuation = true;
  frag.arguments = buf_.substr(args_pos_, i - args_pos_);
  // Merged into the head when it is in the same delta, so a call's first chunk carries text.
  if (!calls.empty() && calls.back().streaming_head && calls.back().arguments.empty()) calls.back().arguments = frag.arguments;
  else calls.push_back(std::move(frag));
  args_pos_ = i;
}

// --- the block formats (tool_parsers.h) ----------------------------------------------------------
void ToolCallParser::take_block(std::string_view body, std::string_view raw, std::string& content,
                                std::vector<ToolCall>& calls) {
  std::vector<ToolCall> parsed;
  if (fmt_->parse(body, tools_.get(), parsed)) {
    for (auto& c : parsed) {
      c.id = random_id("call_");
      calls.push_back(std::move(c));
      ++ncalls_;
    }
    ws_.clear();
  } else {
    emit_text(std::string(fmt_->open()) + std::string(raw), content);  // not a call: the text, unchanged
  }
}

void ToolCallParser::feed_blocks(std::string& content, std::vector<ToolCall>& calls) {
  const std::string_view open = fmt_->open();
  while (true) {
    if (state_ == State::text) {
      size_t pos = buf_.find(open);
      if (pos != std::string::npos) {
        // Whitespace held after a call stays held: dropped if this block is a call, kept if not.
        emit_text(std::string_view(buf_).substr(0, pos), content);
        buf_.erase(0, pos + open.size());
        state_ = State::call;
        scanned_ = 0;
        continue;
      }
      size_t keep = partial_suffix(buf_, open);
      emit_text(std::string_view(buf_).substr(0, buf_.size() - keep), content);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    // In a block: buf_ is the text after the open marker.
    ToolCallFormat::End e = fmt_->find_end(buf_, scanned_);
    if (e.status == ToolCallFormat::End::more) {
      size_t c = fmt_->close().size();
      scanned_ = c > 0 && buf_.size() >= c ? buf_.size() - c + 1 : 0;
      return;
    }
    if (e.status == ToolCallFormat::End::bad) {  // not a call after all: the marker is text
      emit_text(open, content);
    } else {
      std::string rest = buf_.substr(e.next);
      take_block(std::string_view(buf_).substr(0, e.body), std::string_view(buf_).substr(0, e.next), content, calls);
      buf_ = std::move(rest);
    }
    state_ = State::text;
  }
}

void ToolCallParser::finish_blocks(std::string& content, std::vector<ToolCall>& calls) {
  if (state_ == State::call) {
    // Cut (max_tokens, or the model stopped without the close marker): the calls when the body is
    // complete without it (a cut close marker left out), else the text unchanged.
    std::string_view body = buf_;
    if (!fmt_->close().empty()) body.remove_suffix(partial_suffix(buf_, fmt_->close()));
    take_block(body, buf_, content, calls);
  } else {
    // After calls, a cut start of the next block is not text.
    const std::string_view rest = trim(buf_), open = fmt_->open();
    const bool cut_tag = ncalls_ > 0 && !rest.empty() && rest.size() < open.size() && open.substr(0, rest.size()) == rest;
    if (!cut_tag) emit_text(buf_, content);
  }
  buf_.clear();
  ws_.clear();
  state_ = State::text;
}

void ToolCallParser::finish(std::string& content, std::vector<ToolCall>& calls) {
  if (kind_ == Kind::none) return;
  if (fmt_) return finish_blocks(content, calls);
  switch (state_) {
    case State::call:
      if (streaming_) {  // cut inside the arguments (max_tokens): what streamed stays
        stream_args(calls);
        streaming_ = head_failed_ = args_done_ = false;
        break;
      }
      head_failed_ = false;
      close_call(content, calls, false);
      break;
    case State::json: {
      std::string_view s = trim(buf_);
      if (s.starts_with(kPythonTag)) s.remove_prefix(kPythonTag.size());
      std::vector<std::string_view> objs;
      std::vector<ToolCall> parsed;
      bool ok = split_objects(s, objs);
      for (size_t i = 0; ok && i < objs.size(); ++i) {
        ToolCall c;
        ok = parse_tool_call_json(objs[i], c);
        if (ok) {
          c.id = random_id("call_");
          parsed.push_back(std::move(c));
        }
      }
      if (ok) {
        ncalls_ += static_cast<int>(parsed.size());
        for (auto& c : parsed) calls.push_back(std::move(c));
      } else {
        content += buf_;
      }
      break;
    }
    default: {
      // After calls, a cut start of the next one (`\n<`, `<tool_`: max_tokens) is not text.
      const std::string_view rest = trim(buf_);
      const bool cut_tag = ncalls_ > 0 && !rest.empty() && rest.size() < kCallOpen.size() &&
                           kCallOpen.substr(0, rest.size()) == rest;
      if (!cut_tag) emit_text(buf_, content);
      break;
    }
  }
  buf_.clear();
  ws_.clear();
  state_ = State::text;
}

// --- chained ------------------------------------------------------------------------------------
ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta d;
  std::string content;
  reasoning_.feed(text, d.reasoning, content);
  if (!content.empty()) tools_.feed(content, d.content, d.tool_calls);
  return d;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta d;
  std::string content;
  reasoning_.finish(d.reasoning, content);
  if (!content.empty()) tools_.feed(content, d.content, d.tool_calls);
  tools_.finish(d.content, d.tool_calls);
  return d;
}

// --- tool_choice by grammar -----------------------------------------------------------------------
namespace {
// The alternatives {"name": "N", "arguments"|"parameters": ARGS} of `tools` into `g`; the cache
// key part in `key`. Returns the node of their alternation.
int tool_call_bodies(grammar::Grammar& g, const Json& tools, const std::string& only_name, ToolCallParser::Kind kind,
                     std::string& key) {
  grammar::JsonSchemaOptions opt;
  opt.any_whitespace = false;
  std::vector<int> alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& f = tools[i]["function"];
    std::string name = f["name"].get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    std::string param = fmt::format("tools[{}].function.parameters", i);
    grammar::Grammar args;
    auto pit = f.find("parameters");
    try {
      if (pit == f.end() || pit->is_null()) {
        args = grammar::json_object_grammar(opt);
      } else {
        grammar::JsonSchemaOptions o = opt;
        o.strict = true;  // the call must be parseable against the schema: no invented keys
        // A tool's schema is its author's (MCP servers write uniqueItems, patternProperties, ...):
        // what the grammar cannot express is left unconstrained rather than refusing the request.
        o.lenient = true;
        args = grammar::json_schema_grammar(*pit, o);
      }
    } catch (const InvalidRequest& e) {
      throw ApiError(400, fmt::format("Invalid JSON schema in '{}' (tool '{}'): {}", param, name, e.what()), param);
    }
    int args_root = grammar::embed_grammar(g, args, fmt::format("t{}-", i));
    std::string head = kind == ToolCallParser::Kind::hermes
                           ? fmt::format("{{\"name\": {}, \"arguments\": ", Json(name).dump())
                           : fmt::format("{{\"name\": {}, \"parameters\": ", Json(name).dump());
    alts.push_back(g.seq({g.lit(head), g.ref(args_root), g.lit("}")}));
    key += name + "\n" + (pit == f.end() ? std::string("{}") : pit->dump()) + "\n";
  }
  TS_CHECK(!alts.empty(), "tool_call_structured: no tool named '{}'", only_name);
  return g.alt(alts);
}
}  // namespace

bool has_tool_call_grammar(ToolCallParser::Kind kind) {
  return kind == ToolCallParser::Kind::hermes || kind == ToolCallParser::Kind::llama3;
}

std::shared_ptr<StructuredRequest> tool_call_structured(const Json& tools, const std::string& only_name, bool parallel,
                                                        ToolCallParser::Kind kind) {
  TS_CHECK(has_tool_call_grammar(kind), "tool_call_structured: no grammar for this tool-call parser");
  grammar::Grammar g;
  std::string key = fmt::format("kind={} parallel={}\n", int(kind), parallel);
  int body = tool_call_bodies(g, tools, only_name, kind, key);
  int call_rule = g.rule("tool-call");
  if (kind == ToolCallParser::Kind::hermes) body = g.seq({g.lit("<tool_call>\n"), body, g.lit("\n</tool_call>")});
  g.define(call_rule, body);
  int root = g.rule("root");
  std::string sep = kind == ToolCallParser::Kind::hermes ? "\n" : "; ";
  g.define(root, parallel ? g.seq({g.ref(call_rule), g.star(g.seq({g.lit(sep), g.ref(call_rule)}))}) : g.ref(call_rule));
  g.set_root(root);
  auto out = std::make_shared<StructuredRequest>();
  out->kind = "tool_call";
  out->key = "tool_call\n" + key;
  out->ir = std::make_shared<const grammar::Grammar>(std::move(g));
  return out;
}

}  // namespace ts::server

namespace ts::server {

std::shared_ptr<StructuredRequest> tool_call_triggered(const Json& tools, bool parallel, ToolCallParser::Kind kind) {
  if (kind == ToolCallParser::Kind::llama3) {
    // The whole output is the calls or none is (the parser's rule): a "{" as the output's first
    // byte starts the required-call grammar at that byte; anything else stays free text.
    auto out = tool_call_structured(tools, "", parallel, kind);
    out->kind = "tool_call_auto";
    out->key = "tool_call_auto\n" + out->key;
    out->trigger = "{";
    out->trigger_at_start = out->trigger_in_grammar = true;
    out->trigger_repeat = false;
    return out;
  }
  TS_CHECK(kind == ToolCallParser::Kind::hermes, "tool_call_triggered: no tool-call parser");
  grammar::Grammar g;
  std::string key = fmt::format("triggered parallel={}\n", parallel);
  int body = tool_call_bodies(g, tools, "", ToolCallParser::Kind::hermes, key);
  // What follows the trigger; the end tag is where the grammar ends (can_terminate only there).
  int root = g.rule("root");
  g.define(root, g.seq({g.lit("\n"), body, g.lit("\n"), g.lit(std::string(kCallClose))}));
  g.set_root(root);
  auto out = std::make_shared<StructuredRequest>();
  out->kind = "tool_call_auto";
  out->key = "tool_call_auto\n" + key;
  out->ir = std::make_shared<const grammar::Grammar>(std::move(g));
  out->trigger = std::string(kCallOpen);
  out->trigger_repeat = parallel;
  return out;
}

}  // namespace ts::server
