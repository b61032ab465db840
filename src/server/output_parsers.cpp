#include "server/output_parsers.h"

#include <algorithm>
#include <map>
#include <set>

#include "grammar/matcher.h"
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
    const size_t start = i;
    i = json_value_end(s, i);
    if (i == std::string_view::npos) return false;
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

bool ToolCallParser::stream_block(std::string_view body, bool complete, std::vector<ToolCall>& calls) {
  std::vector<ToolCallFormat::PartialCall> found;
  if (!fmt_->scan(body, complete, tools_.get(), found)) return false;
  // This delta's entry of the call being written (its head, or its first fragment): later text of
  // the same call joins it rather than making one fragment per scan.
  size_t open_entry = calls.size();
  for (size_t k = 0; k < found.size(); ++k) {
    const std::string& args = found[k].args;
    if (k < block_sent_.size()) {
      std::string& sent = block_sent_[k];
      // Only the last call can take fragments (they append to the latest head), and only text
      // that extends what was sent.
      if (k + 1 != block_sent_.size() || args.size() <= sent.size() || !args.starts_with(sent)) continue;
      const std::string more = args.substr(sent.size());
      sent = args;
      if (open_entry < calls.size()) {
        calls[open_entry].arguments += more;
      } else {
        ToolCall frag;
        frag.continuation = true;
        frag.arguments = more;
        open_entry = calls.size();
        calls.push_back(std::move(frag));
      }
      continue;
    }
    ToolCall c;
    c.id = random_id("call_");
    c.name = found[k].name;
    c.arguments = args;
    c.streaming_head = true;
    open_entry = calls.size();
    calls.push_back(std::move(c));
    block_sent_.push_back(args);
    ++ncalls_;
  }
  return true;
}

void ToolCallParser::end_streamed_block(std::string_view body, bool complete, std::vector<ToolCall>& calls) {
  const size_t streamed = block_sent_.size();
  if (!stream_block(body, complete, calls) && complete) {
    // The rest of the block is not in a streaming shape: the calls after those it streamed, whole.
    std::vector<ToolCall> parsed;
    if (fmt_->parse(body, tools_.get(), parsed))
      for (size_t k = streamed; k < parsed.size(); ++k) {
        parsed[k].id = random_id("call_");
        calls.push_back(std::move(parsed[k]));
        ++ncalls_;
      }
  }
  ws_.clear();
  block_sent_.clear();
  scan_off_ = false;
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
        block_sent_.clear();
        scan_off_ = false;
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
      if (incremental_ && !scan_off_) {
        // The close marker may be arriving: its partial start is not the body's.
        std::string_view body = buf_;
        if (c > 0) body.remove_suffix(partial_suffix(buf_, fmt_->close()));
        scan_off_ = !stream_block(body, false, calls);
      }
      return;
    }
    if (e.status == ToolCallFormat::End::bad && block_sent_.empty()) {  // not a call after all: the marker is text
      emit_text(open, content);
    } else if (e.status == ToolCallFormat::End::bad) {  // calls streamed: they stand (committed)
      end_streamed_block(buf_, false, calls);
      buf_.clear();
    } else {
      std::string rest = buf_.substr(e.next);
      if (block_sent_.empty())
        take_block(std::string_view(buf_).substr(0, e.body), std::string_view(buf_).substr(0, e.next), content, calls);
      else
        end_streamed_block(std::string_view(buf_).substr(0, e.body), true, calls);
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
    if (block_sent_.empty()) take_block(body, buf_, content, calls);
    else end_streamed_block(body, true, calls);  // what streamed stays; the rest if complete
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
using K = ToolCallParser::Kind;

// tools[i]'s arguments as JSON: its parameters schema (strict: the call must be parseable against
// it, no invented keys; lenient: a tool's schema is its author's -- MCP servers write uniqueItems,
// patternProperties, ... -- and what the grammar cannot express is left unconstrained rather than
// refusing the request), any object when it has none. An invalid schema is a 400 naming the tool.
// `spaced`: a space may follow ':' and ',' (json.dumps' style, as the block formats' templates
// write arguments) -- one whitespace character between tokens at most: an unbounded run is where
// a small model loops until max_tokens. Else compact.
grammar::Grammar tool_args_grammar(const Json& tools, size_t i, bool spaced) {
  const Json& f = tools[i]["function"];
  grammar::JsonSchemaOptions opt;
  opt.any_whitespace = spaced;
  opt.max_whitespace = 1;
  auto pit = f.find("parameters");
  try {
    if (pit == f.end() || pit->is_null()) return grammar::json_object_grammar(opt);
    opt.strict = true;
    opt.lenient = true;
    return grammar::json_schema_grammar(*pit, opt);
  } catch (const InvalidRequest& e) {
    std::string param = fmt::format("tools[{}].function.parameters", i);
    throw ApiError(400, fmt::format("Invalid JSON schema in '{}' (tool '{}'): {}", param, f["name"].get<std::string>(), e.what()),
                   param);
  }
}

// The cache key part of tools[i].
std::string tool_key(const Json& tools, size_t i) {
  const Json& f = tools[i]["function"];
  auto pit = f.find("parameters");
  return f["name"].get<std::string>() + "\n" + (pit == f.end() ? std::string("{}") : pit->dump()) + "\n";
}

// The alternatives {"name": "N", "arguments"|"parameters": ARGS} of `tools` into `g`; the cache
// key part in `key`. Returns the node of their alternation. (hermes, llama3)
int tool_call_bodies(grammar::Grammar& g, const Json& tools, const std::string& only_name, ToolCallParser::Kind kind,
                     std::string& key) {
  std::vector<int> alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string name = tools[i]["function"]["name"].get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    grammar::Grammar args = tool_args_grammar(tools, i, false);
    int args_root = grammar::embed_grammar(g, args, fmt::format("t{}-", i));
    std::string head = kind == ToolCallParser::Kind::hermes
                           ? fmt::format("{{\"name\": {}, \"arguments\": ", Json(name).dump())
                           : fmt::format("{{\"name\": {}, \"parameters\": ", Json(name).dump());
    alts.push_back(g.seq({g.lit(head), g.ref(args_root), g.lit("}")}));
    key += tool_key(tools, i);
  }
  TS_CHECK(!alts.empty(), "tool_call_structured: no tool named '{}'", only_name);
  return g.alt(alts);
}

// Any text (of code points) in which none of `stops` occurs: the automaton that tracks the longest
// suffix of the text so far that is a proper prefix of a stop, one rule per such prefix (right
// recursion: the matcher's stacks stay flat). The stops are ASCII; a stop's text followed by its
// stop then has the stop first where it was written, as the parsers find it, because the stops
// these formats use are tags that start with their only '<' and so cannot overlap themselves.
int text_without(grammar::Grammar& g, const std::vector<std::string>& stops) {
  std::vector<std::string> states{""};
  std::map<std::string, size_t> index{{"", 0}};
  std::string alphabet;
  for (const std::string& s : stops) {
    for (size_t n = 1; n < s.size(); ++n)
      if (index.emplace(s.substr(0, n), states.size()).second) states.push_back(s.substr(0, n));
    for (char c : s) {
      TS_CHECK(static_cast<unsigned char>(c) < 0x80, "text_without: stops must be ASCII");
      if (alphabet.find(c) == std::string::npos) alphabet += c;
    }
  }
  std::vector<int> rules;
  for (size_t k = 0; k < states.size(); ++k) rules.push_back(g.rule(g.fresh_name("text-without")));
  grammar::Ranges letters;
  for (char c : alphabet) letters.push_back({uint32_t(c), uint32_t(c)});
  for (size_t k = 0; k < states.size(); ++k) {
    std::map<size_t, grammar::Ranges> by_next;
    for (char c : alphabet) {
      const std::string t = states[k] + c;
      bool dead = false;
      for (const std::string& s : stops) dead = dead || t.ends_with(s);
      if (dead) continue;  // the text would contain a stop
      for (size_t n = t.size();; --n)
        if (auto it = index.find(t.substr(t.size() - n)); it != index.end()) {
          by_next[it->second].push_back({uint32_t(c), uint32_t(c)});
          break;
        }
    }
    grammar::Ranges other = grammar::complement(grammar::normalize(letters));
    by_next[0].insert(by_next[0].end(), other.begin(), other.end());
    std::vector<int> alts{g.empty()};
    for (auto& [next, ranges] : by_next) alts.push_back(g.seq({g.chars(ranges), g.ref(rules[next])}));
    g.define(rules[k], g.alt(alts));
  }
  return rules[0];
}

// A property schema that constrains a value (more than annotations).
bool constrains(const Json& s) {
  static const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$comment",
                                                     "deprecated", "readOnly", "writeOnly"};
  if (!s.is_object()) return false;
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!kAnnotations.count(it.key())) return true;
  return false;
}

bool text_valued(K k) { return k == K::qwen3_coder || k == K::glm45 || k == K::minimax_m2; }

// How a format's markers are written in its grammars: as text, or -- a marker the served tokenizer
// has as one special token (`specials`: Mistral's [TOOL_CALLS], DeepSeek's <｜tool▁call▁begin｜>,
// Kimi's <|tool_call_begin|>, ...) -- as that token (grammar::special_token_bytes), which the model
// writes as one id: the grammar then takes that id there and only there.
class MarkerText {
 public:
  MarkerText(K kind, std::vector<std::string> specials)
      : markers_(parser_markers(ReasoningParser::Kind::none, kind)), specials_(std::move(specials)) {}
  // `text` as a sequence of literals, each of its markers as above.
  int operator()(grammar::Grammar& g, std::string_view text) const {
    std::vector<int> parts;
    size_t from = 0;
    while (from < text.size()) {
      size_t best = std::string_view::npos, len = 0;
      for (const std::string& m : markers_)
        if (size_t at = text.find(m, from); at != std::string_view::npos && (at < best || (at == best && m.size() > len)))
          best = at, len = m.size();
      if (best == std::string_view::npos) break;
      if (best > from) parts.push_back(g.lit(text.substr(from, best - from)));
      const std::string_view m = text.substr(best, len);
      const bool special = std::find(specials_.begin(), specials_.end(), m) != specials_.end();
      parts.push_back(g.lit(special ? grammar::special_token_bytes(m) : std::string(m)));
      from = best + len;
    }
    if (from < text.size()) parts.push_back(g.lit(text.substr(from)));
    if (parts.empty()) return g.empty();
    return parts.size() == 1 ? parts[0] : g.seq(parts);
  }
  // The cache key part: which markers are tokens.
  std::string key() const {
    std::string k = "specials:";
    for (const std::string& m : specials_) k += m + "\x1f";
    return k + "\n";
  }

 private:
  std::vector<std::string> markers_, specials_;
};
// The marker that opens a block of calls (the auto trigger), and the one call of the formats whose
// block holds one call (qwen3_coder, glm45: "<tool_call>").
std::string open_marker(K k) {
  switch (k) {
    case K::mistral: return "[TOOL_CALLS]";
    case K::deepseek_v3: case K::deepseek_v31: return "<｜tool▁calls▁begin｜>";
    case K::kimi_k2: return "<|tool_calls_section_begin|>";
    case K::minimax_m2: return "<minimax:tool_call>";
    default: return std::string(kCallOpen);
  }
}

// One call of tools[i] in a block format's syntax (qwen3_coder, glm45: what follows "<tool_call>").
// JSON formats: ARGS is tool_args_grammar with any whitespace (the templates write the arguments
// as json.dumps / tojson does, `{"a": 1, "b": 2}`). Text formats: the parameters one by one, each
// value what typed_param_value turns into a value of the property's schema.
class BlockCallGrammar {
 public:
  BlockCallGrammar(grammar::Grammar& g, K kind, const Json& tools, const MarkerText& mt)
      : g_(g), kind_(kind), tools_(tools), mt_(mt) {
    switch (kind) {
      case K::qwen3_coder: syn_ = {"<parameter=", ">\n", "\n</parameter>\n", {"</parameter>", "</tool_call>"}}; break;
      case K::glm45: syn_ = {"<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n", {"</arg_value>", "</tool_call>"}}; break;
      default: syn_ = {"<parameter name=\"", "\">", "</parameter>\n", {"</parameter>", "</minimax:tool_call>"}}; break;
    }
  }

  int call(size_t i) {
    const std::string name = tools_[i]["function"]["name"].get<std::string>();
    switch (kind_) {
      case K::mistral: {
        // The template's form: {"name": N, "arguments": ARGS, "id": "<9 alphanumerics>"}; the id
        // (which the parser ignores) may be left out.
        int alnum = g_.chars({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}});
        int id = g_.opt(g_.seq({lit(", \"id\": \""), g_.rep(alnum, 9, 9), lit("\"")}));
        return g_.seq({lit(fmt::format("{{\"name\": {}, \"arguments\": ", Json(name).dump())), json_args(i), id, lit("}")});
      }
      case K::deepseek_v3:
        return g_.seq({lit("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"), json_args(i),
                       lit("\n```<｜tool▁call▁end｜>")});
      case K::deepseek_v31:
        return g_.seq({lit("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>"), json_args(i), lit("<｜tool▁call▁end｜>")});
      case K::kimi_k2:
        return g_.seq({lit("<|tool_call_begin|>functions." + name + ":"), g_.rep(g_.chars({{'0', '9'}}), 1, 6),
                       lit("<|tool_call_argument_begin|>"), json_args(i), lit("<|tool_call_end|>")});
      case K::qwen3_coder:
        return g_.seq({lit("\n<function=" + name + ">\n"), text_params(i), lit("</function>\n</tool_call>")});
      case K::glm45: return g_.seq({lit(name + "\n"), text_params(i), lit("</tool_call>")});
      case K::minimax_m2: return g_.seq({lit("<invoke name=\"" + name + "\">\n"), text_params(i), lit("</invoke>\n")});
      default: TS_CHECK(false, "BlockCallGrammar: not a block format"); return -1;
    }
  }

 private:
  struct Syntax {
    std::string key_open, key_close, value_close;  // a parameter: key_open K key_close V value_close
    std::vector<std::string> stops;                // what a text V may not contain
  };

  int lit(std::string_view text) { return mt_(g_, text); }

  int json_args(size_t i) {
    grammar::Grammar args = tool_args_grammar(tools_, i, true);
    return g_.ref(grammar::embed_grammar(g_, args, fmt::format("t{}-", i)));
  }

  int free_text() {
    if (free_text_ < 0) free_text_ = text_without(g_, syn_.stops);
    return g_.ref(free_text_);
  }

  // A key the parsers read back as written: not empty, no whitespace at its ends (they trim it),
  // none of the characters that end it ('>' for qwen3_coder, '"' for minimax_m2, "</arg_key>").
  static bool key_ok(std::string_view k) {
    if (k.empty() || is_ws(k.front()) || is_ws(k.back())) return false;
    return k.find_first_of("<>\"") == std::string_view::npos;
  }

  // Any parameter: a key as key_ok, any text value (typed as the parser types an unknown key).
  int free_param() {
    int key = g_.plus(g_.chars({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}, {'<', '<'}, {'>', '>'}, {'"', '"'}}, true));
    return g_.seq({lit(syn_.key_open), key, lit(syn_.key_close), free_text(), lit(syn_.value_close)});
  }

  // The parameters of tools[i]: its schema's properties in schema order (as the JSON grammar orders
  // an object's keys), the required ones always, the others optional, no other keys unless the
  // schema admits them (additionalProperties, or keywords that may add keys -- then any further
  // keys with text values). A schema this cannot follow (no "properties": a $ref, anyOf, ... at
  // the top, or none at all) admits any parameters with text values; minProperties /
  // maxProperties are not enforced.
  int text_params(size_t i) {
    const std::string prefix = fmt::format("t{}-", i);
    (void)tool_args_grammar(tools_, i, true);  // a bad schema is the same 400 as for the JSON formats
    const Json& f = tools_[i]["function"];
    auto any = [&] { return g_.star(free_param()); };
    auto pit = f.find("parameters");
    if (pit == f.end() || !pit->is_object()) return any();
    const Json& ps = *pit;
    auto props = ps.find("properties");
    auto addl = ps.find("additionalProperties");
    const bool closed = addl != ps.end() && addl->is_boolean() && !addl->get<bool>();
    if (props == ps.end() || !props->is_object() || props->empty()) return closed && props != ps.end() ? g_.empty() : any();
    std::set<std::string> required;
    if (auto r = ps.find("required"); r != ps.end() && r->is_array())
      for (const Json& k : *r)
        if (k.is_string()) required.insert(k.get<std::string>());
    bool extra = addl != ps.end() && !closed;
    for (const char* k : {"patternProperties", "unevaluatedProperties", "dependentSchemas", "dependencies", "if"})
      extra = extra || ps.contains(k);
    for (const std::string& r : required) extra = extra || !props->contains(r);
    std::vector<int> items;
    size_t n = 0;
    for (auto it = props->begin(); it != props->end(); ++it, ++n) {
      if (!key_ok(it.key())) {
        if (required.count(it.key())) return any();  // a required key this syntax cannot carry
        continue;
      }
      int p = g_.seq({lit(syn_.key_open + it.key() + syn_.key_close), value(it.value(), ps, fmt::format("{}p{}-", prefix, n)),
                      lit(syn_.value_close)});
      items.push_back(required.count(it.key()) ? p : g_.opt(p));
    }
    if (extra) items.push_back(any());
    return g_.seq(items);
  }

  // A parameter's value text, by how typed_param_value types it (tool_parsers.h ParamTyping):
  //   text: the text is the string: an enum's / const's strings exactly; else a pattern's (or a
  //         known format's) whole matches, within minLength / maxLength where exact; with only
  //         minLength / maxLength that many characters, none of them '<'; else any text without
  //         the format's closing tags;
  //   json: the JSON grammar of the property's schema (with the root's $defs for its $refs);
  //   any:  the JSON grammar when the schema constrains the value, else any text.
  // (A JSON value's strings may still hold a closing tag verbatim; the parser would cut there.)
  int value(const Json& s, const Json& root, const std::string& prefix) {
    const ParamTyping t = param_typing(s);
    if (t == ParamTyping::text) {
      std::vector<int> lits;
      auto add = [&](const Json& v) {
        if (!v.is_string()) return;  // typed as text, a non-string member can never be the value
        const std::string str = v.get<std::string>();
        for (const std::string& stop : syn_.stops)
          if (str.find(stop) != std::string::npos) return;
        lits.push_back(g_.lit(str));
      };
      if (auto e = s.find("enum"); e != s.end() && e->is_array())
        for (const Json& v : *e) add(v);
      if (auto c = s.find("const"); c != s.end()) add(*c);
      if (!lits.empty()) return g_.alt(lits);
      auto bound = [&](const char* k) -> int64_t {
        auto it = s.find(k);
        return it != s.end() && it->is_number_integer() && it->get<int64_t>() >= 0 ? it->get<int64_t>() : -1;
      };
      const int64_t lo = bound("minLength"), hi = bound("maxLength");
      // pattern (else a known format): the raw text matches it as a whole (JSON Schema's pattern
      // searches; the JSON grammar generates whole matches too), with '<' out of the pattern's
      // open classes (`.`, [^...], \S) so a value cannot run into the closing tag, and the
      // lengths beside it where they can be held exactly (as for a JSON string). A pattern this
      // grammar cannot express (lookaround, backreferences) falls through to the text rules
      // below, as an unexpressible keyword in a lenient tool schema does.
      const std::string* re = nullptr;
      std::string pattern;
      if (auto p = s.find("pattern"); p != s.end() && p->is_string()) re = &(pattern = p->get<std::string>());
      else if (auto f = s.find("format"); f != s.end() && f->is_string()) re = grammar::string_format_regex(f->get<std::string>());
      if (re) {
        try {
          return g_.ref(pattern_rule(*re, std::max<int64_t>(lo, 0), hi));
        } catch (const InvalidRequest&) {
        }
      }
      // minLength / maxLength bound the text (in characters, as JSON Schema counts them): text
      // without '<' then, which cannot hold a closing tag. Unbounded text is where a small model
      // writes until max_tokens.
      if (hi < 0 && lo < 0) return free_text();
      if (hi > kMaxBoundedText || lo > kMaxBoundedText) return free_text();
      int ch = g_.chars({{'<', '<'}}, true);
      return g_.rep(ch, int(std::max<int64_t>(lo, 0)), hi < 0 ? -1 : int(std::max(hi, lo)));
    }
    if (t == ParamTyping::any && !constrains(s)) return free_text();
    Json sub = s;
    for (const char* k : {"$defs", "definitions"})
      if (root.contains(k) && !sub.contains(k)) sub[k] = root[k];
    grammar::JsonSchemaOptions opt;
    opt.strict = opt.lenient = opt.any_whitespace = true;
    opt.max_whitespace = 1;
    try {
      grammar::Grammar vg = grammar::json_schema_grammar(sub, opt);
      return g_.ref(grammar::embed_grammar(g_, vg, prefix));
    } catch (const InvalidRequest&) {
      return free_text();  // a $ref this subschema cannot resolve on its own: any text
    }
  }

  // A rule holding the pattern with the lengths (built as a grammar of its own first: a pattern
  // that fails half way leaves nothing behind in g_).
  int pattern_rule(const std::string& re, int64_t lo, int64_t hi) {
    grammar::Grammar pg = grammar::raw_string_grammar(re, lo, hi, {{'<', '<'}});
    return grammar::embed_grammar(g_, pg, fmt::format("re{}-", patterns_++));
  }

  static constexpr int64_t kMaxBoundedText = 1 << 16;  // longer bounds: the unbounded text rule
  grammar::Grammar& g_;
  K kind_;
  const Json& tools_;
  const MarkerText& mt_;
  Syntax syn_;
  int free_text_ = -1;  // the rule, built once
  int patterns_ = 0;     // pattern rules embedded so far (their rule-name prefixes)
};

// The calls (call_rule: one call of any offered tool) after the block's open marker, to its end:
// one call (parallel false), else one or more in the format's own repetition. For qwen3_coder and
// glm45 a block is one call (what follows "<tool_call>").
int block_after_open(grammar::Grammar& g, K kind, int call_rule, bool parallel, const MarkerText& mt) {
  auto calls = [&](std::string_view sep, bool sep_optional = false) {
    if (!parallel) return g.ref(call_rule);
    int s = sep.empty() ? -1 : (sep_optional ? g.opt(mt(g, sep)) : mt(g, sep));
    int next = s < 0 ? g.ref(call_rule) : g.seq({s, g.ref(call_rule)});
    return g.seq({g.ref(call_rule), g.star(next)});
  };
  switch (kind) {
    // "[TOOL_CALLS] [" (mistral-7b-instruct-v0.3) or "[TOOL_CALLS][" (mistral-nemo).
    case K::mistral: return g.seq({g.opt(mt(g, " ")), mt(g, "["), calls(", "), mt(g, "]")});
    case K::deepseek_v3: return g.seq({calls("\n", true), mt(g, "<｜tool▁calls▁end｜>")});
    case K::deepseek_v31: return g.seq({calls(""), mt(g, "<｜tool▁calls▁end｜>")});
    case K::kimi_k2: return g.seq({calls(""), mt(g, "<|tool_calls_section_end|>")});
    case K::minimax_m2: return g.seq({mt(g, "\n"), calls(""), mt(g, "</minimax:tool_call>")});
    default: return g.ref(call_rule);
  }
}

// The block formats' grammar: `triggered` false -- the whole output is the calls (required /
// named); true -- what follows the open marker (auto).
std::shared_ptr<StructuredRequest> block_tool_calls(const Json& tools, const std::string& only_name, bool parallel, K kind,
                                                    const MarkerText& mt, bool triggered) {
  grammar::Grammar g;
  std::string key = fmt::format("kind={} parallel={}\n", int(kind), parallel) + mt.key();
  BlockCallGrammar calls(g, kind, tools, mt);
  std::vector<int> alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!only_name.empty() && tools[i]["function"]["name"].get<std::string>() != only_name) continue;
    alts.push_back(calls.call(i));
    key += tool_key(tools, i);
  }
  TS_CHECK(!alts.empty(), "tool_call_structured: no tool named '{}'", only_name);
  int call_rule = g.rule("tool-call");
  g.define(call_rule, g.alt(alts));
  const std::string open = open_marker(kind);
  int root = g.rule("root");
  if (triggered) {
    g.define(root, block_after_open(g, kind, call_rule, parallel, mt));
  } else if (text_valued(kind) && kind != K::minimax_m2) {  // qwen3_coder, glm45: "<tool_call>" each, joined by "\n"
    int one = g.rule("tool-call-block");
    g.define(one, g.seq({mt(g, open), g.ref(call_rule)}));
    g.define(root, parallel ? g.seq({g.ref(one), g.star(g.seq({mt(g, "\n"), g.ref(one)}))}) : g.ref(one));
  } else {
    g.define(root, g.seq({mt(g, open), block_after_open(g, kind, call_rule, parallel, mt)}));
  }
  g.set_root(root);
  auto out = std::make_shared<StructuredRequest>();
  out->kind = triggered ? "tool_call_auto" : "tool_call";
  out->key = triggered ? "tool_call_auto\ntriggered " + key : "tool_call\n" + key;
  out->ir = std::make_shared<const grammar::Grammar>(std::move(g));
  if (triggered) {
    out->trigger = open;
    out->trigger_repeat = parallel;
  }
  return out;
}
}  // namespace

bool has_tool_call_grammar(ToolCallParser::Kind kind) { return kind != ToolCallParser::Kind::none; }

std::shared_ptr<StructuredRequest> tool_call_structured(const Json& tools, const std::string& only_name, bool parallel,
                                                        ToolCallParser::Kind kind, const std::vector<std::string>& special_markers) {
  TS_CHECK(has_tool_call_grammar(kind), "tool_call_structured: no grammar for this tool-call parser");
  const MarkerText mt(kind, special_markers);
  if (kind != K::hermes && kind != K::llama3) return block_tool_calls(tools, only_name, parallel, kind, mt, false);
  grammar::Grammar g;
  std::string key = fmt::format("kind={} parallel={}\n", int(kind), parallel) + mt.key();
  int body = tool_call_bodies(g, tools, only_name, kind, key);
  int call_rule = g.rule("tool-call");
  if (kind == K::hermes) body = g.seq({mt(g, "<tool_call>\n"), body, mt(g, "\n</tool_call>")});
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

std::shared_ptr<StructuredRequest> tool_call_triggered(const Json& tools, bool parallel, ToolCallParser::Kind kind,
                                                       const std::vector<std::string>& special_markers) {
  if (kind == ToolCallParser::Kind::llama3) {
    // The whole output is the calls or none is (the parser's rule): a "{" as the output's first
    // byte starts the required-call grammar at that byte; anything else stays free text.
    auto out = tool_call_structured(tools, "", parallel, kind, special_markers);
    out->kind = "tool_call_auto";
    out->key = "tool_call_auto\n" + out->key;
    out->trigger = "{";
    out->trigger_at_start = out->trigger_in_grammar = true;
    out->trigger_repeat = false;
    return out;
  }
  TS_CHECK(has_tool_call_grammar(kind), "tool_call_triggered: no tool-call parser");
  const MarkerText mt(kind, special_markers);
  if (kind != K::hermes) return block_tool_calls(tools, "", parallel, kind, mt, true);
  grammar::Grammar g;
  std::string key = fmt::format("triggered parallel={}\n", parallel) + mt.key();
  int body = tool_call_bodies(g, tools, "", ToolCallParser::Kind::hermes, key);
  // What follows the trigger; the end tag is where the grammar ends (can_terminate only there).
  int root = g.rule("root");
  g.define(root, g.seq({g.lit("\n"), body, g.lit("\n"), mt(g, kCallClose)}));
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
