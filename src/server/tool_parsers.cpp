#include "server/tool_parsers.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "server/protocol.h"

namespace ts::server {

namespace {
bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

void skip_ws(std::string_view s, size_t& i) {
  while (i < s.size() && is_ws(s[i])) ++i;
}

// s[i...] starts with `tag`: i moves past it.
bool eat(std::string_view s, size_t& i, std::string_view tag) {
  if (s.substr(i).starts_with(tag)) {
    i += tag.size();
    return true;
  }
  return false;
}

// One leading and one trailing newline dropped (the XML formats put the value on its own lines).
std::string_view strip_newlines(std::string_view v) {
  if (v.starts_with("\r\n")) v.remove_prefix(2);
  else if (v.starts_with('\n')) v.remove_prefix(1);
  if (v.ends_with("\r\n")) v.remove_suffix(2);
  else if (v.ends_with('\n')) v.remove_suffix(1);
  return v;
}

// JSON text as a value; discarded when it is not JSON (or nests deeper than requests may).
Json parse_json(std::string_view text) {
  if (io::json_depth(text, io::kDefaultMaxJsonDepth) > io::kDefaultMaxJsonDepth) return Json(Json::value_t::discarded);
  return Json::parse(text.begin(), text.end(), nullptr, false);
}

// Arguments written as JSON: an object (re-serialised compactly, key order kept), or a string that
// holds one (a template that wrote the client's argument string through tojson). False otherwise.
bool json_arguments(std::string_view text, std::string& out) {
  Json j = parse_json(trim(text));
  if (j.is_string()) j = parse_json(j.get<std::string>());
  if (j.is_discarded() || !j.is_object()) return false;
  out = dump(j);
  return true;
}


// Index past the JSON string that opens at s[i] ('"'); npos when the text ends first.
size_t json_value_end_string(std::string_view s, size_t i) {
  bool esc = false;
  for (++i; i < s.size(); ++i) {
    if (esc) esc = false;
    else if (s[i] == '\\') esc = true;
    else if (s[i] == '"') return i + 1;
  }
  return std::string_view::npos;
}

// A function name as the model writes it: no whitespace or markup.
bool plain_name(std::string_view n) {
  if (n.empty()) return false;
  for (char c : n)
    if (is_ws(c) || c == '<' || c == '>' || c == '{' || c == '}' || c == '"') return false;
  return true;
}

ToolCall make_call(std::string_view name, std::string arguments) {
  ToolCall c;
  c.name = std::string(name);
  c.arguments = std::move(arguments);
  return c;
}

using PartialCall = ToolCallFormat::PartialCall;

// s[i...] against `tag`: 1 = it starts with tag (i moves past it), 0 = the text ends inside a
// prefix of tag (more text may complete it), -1 = not this tag.
int expect(std::string_view s, size_t& i, std::string_view tag) {
  const std::string_view r = s.substr(i);
  if (r.starts_with(tag)) {
    i += tag.size();
    return 1;
  }
  return tag.starts_with(r) ? 0 : -1;
}

// The JSON-format arguments that open at s[i] (after whitespace): 1 = an object, its text so far
// in c.args, done when it closed (i past it); 0 = nothing yet (the call is not out until its
// arguments are seen to be an object: a string-encoded value does not stream); -1 = not an object.
int scan_json_args(std::string_view s, size_t& i, PartialCall& c) {
  skip_ws(s, i);
  if (i == s.size()) return 0;
  if (s[i] != '{') return -1;
  const size_t e = json_value_end(s, i);
  c.done = e != std::string_view::npos;
  c.args = std::string(s.substr(i, c.done ? e - i : std::string_view::npos));
  i = c.done ? e : s.size();
  return 1;
}

// The text formats' arguments so far: {"K": V, ... as parse() builds them (typed_param_value).
class ArgsText {
 public:
  void add(std::string_view key, const Json& value) {
    text_ += text_.size() > 1 ? ", " : "";
    text_ += dump(Json(std::string(key))) + ": " + dump(value);
  }
  std::string open() const { return text_; }
  std::string closed() const { return text_ + "}"; }

 private:
  std::string text_ = "{";
};

// --- deepseek_v3 / deepseek_v31 ----------------------------------------------------------------
// v3 (DeepSeek-V3, R1): <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
// v31 (DeepSeek-V3.1):  <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>
// both inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>, calls optionally separated by whitespace.
class DeepSeekFormat final : public ToolCallFormat {
 public:
  explicit DeepSeekFormat(bool v31) : v31_(v31) {}
  std::string_view open() const override { return "<｜tool▁calls▁begin｜>"; }
  std::string_view close() const override { return "<｜tool▁calls▁end｜>"; }
  std::vector<std::string_view> inner_markers() const override { return {kBegin, kEnd, kSep}; }
  bool parse(std::string_view body, const Json*, std::vector<ToolCall>& out) const override {
    size_t i = 0, n = 0;
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) return n > 0;
      if (!eat(body, i, kBegin)) return false;
      size_t end = body.find(kEnd, i);
      if (end == std::string_view::npos) return false;
      std::string_view inner = body.substr(i, end - i);
      i = end + kEnd.size();
      size_t sep = inner.find(kSep);
      if (sep == std::string_view::npos) return false;
      std::string_view name, args, rest = inner.substr(sep + kSep.size());
      if (v31_) {
        name = trim(inner.substr(0, sep));
        args = rest;
      } else {  // inner.substr(0, sep) is the call's type ("function")
        size_t nl = rest.find('\n');
        if (nl == std::string_view::npos) return false;
        name = trim(rest.substr(0, nl));
        args = trim(rest.substr(nl + 1));
        if (args.starts_with("```json")) args.remove_prefix(7);
        else if (args.starts_with("```")) args.remove_prefix(3);
        if (args.ends_with("```")) args.remove_suffix(3);
      }
      std::string a;
      if (!plain_name(name) || !json_arguments(args, a)) return false;
      out.push_back(make_call(name, std::move(a)));
      ++n;
    }
  }

  bool scan(std::string_view body, bool, const Json*, std::vector<PartialCall>& out) const override {
    size_t i = 0;
    while (true) {
      skip_ws(body, i);
      if (int r = expect(body, i, kBegin); r <= 0) return r == 0;
      const size_t sep = body.find(kSep, i);
      if (sep == std::string_view::npos) return body.find(kEnd, i) == std::string_view::npos;
      PartialCall c;
      if (v31_) {
        c.name = std::string(trim(body.substr(i, sep - i)));
        i = sep + kSep.size();
      } else {
        const size_t nl = body.find('\n', sep + kSep.size());
        if (nl == std::string_view::npos) return body.find(kEnd, sep) == std::string_view::npos;
        c.name = std::string(trim(body.substr(sep + kSep.size(), nl - sep - kSep.size())));
        i = nl + 1;
      }
      if (!plain_name(c.name)) return false;
      if (!v31_) {  // ```json (or ```) before the object
        skip_ws(body, i);
        int r = expect(body, i, "```json");
        if (r < 0) r = expect(body, i, "```");
        if (r <= 0) return r == 0;
      }
      if (int r = scan_json_args(body, i, c); r <= 0) return r == 0;
      const bool done = c.done;
      out.push_back(std::move(c));
      if (!done) return true;
      skip_ws(body, i);
      if (!v31_ && i < body.size() && body[i] == '`') {
        if (int r = expect(body, i, "```"); r <= 0) return r == 0;
        skip_ws(body, i);
      }
      if (int r = expect(body, i, kEnd); r <= 0) return r == 0;
    }
  }

 private:
  static constexpr std::string_view kBegin = "<｜tool▁call▁begin｜>", kEnd = "<｜tool▁call▁end｜>", kSep = "<｜tool▁sep｜>";
  bool v31_;
};

// --- kimi_k2 -------------------------------------------------------------------------------------
// <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
class KimiK2Format final : public ToolCallFormat {
 public:
  std::string_view open() const override { return "<|tool_calls_section_begin|>"; }
  std::string_view close() const override { return "<|tool_calls_section_end|>"; }
  std::vector<std::string_view> inner_markers() const override { return {kBegin, kArgs, kEnd}; }
  bool parse(std::string_view body, const Json*, std::vector<ToolCall>& out) const override {
    size_t i = 0, n = 0;
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) return n > 0;
      if (!eat(body, i, kBegin)) return false;
      size_t end = body.find(kEnd, i);
      if (end == std::string_view::npos) return false;
      std::string_view inner = body.substr(i, end - i);
      i = end + kEnd.size();
      size_t a = inner.find(kArgs);
      if (a == std::string_view::npos) return false;
      // The id is functions.NAME:IDX (vLLM: [^<]+:\d+); the name is what precedes the first ':',
      // after its last '.'.
      std::string_view id = trim(inner.substr(0, a));
      size_t colon = id.find(':');
      if (colon == std::string_view::npos || colon + 1 == id.size()) return false;
      for (char c : id.substr(colon + 1))
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      std::string_view name = id.substr(0, colon);
      if (size_t dot = name.rfind('.'); dot != std::string_view::npos) name.remove_prefix(dot + 1);
      std::string args;
      if (!plain_name(name) || !json_arguments(inner.substr(a + kArgs.size()), args)) return false;
      out.push_back(make_call(name, std::move(args)));
      ++n;
    }
  }

  bool scan(std::string_view body, bool, const Json*, std::vector<PartialCall>& out) const override {
    size_t i = 0;
    while (true) {
      skip_ws(body, i);
      if (int r = expect(body, i, kBegin); r <= 0) return r == 0;
      const size_t a = body.find(kArgs, i);
      if (a == std::string_view::npos) return body.find(kEnd, i) == std::string_view::npos;
      std::string_view id = trim(body.substr(i, a - i));
      const size_t colon = id.find(':');
      if (colon == std::string_view::npos || colon + 1 == id.size()) return false;
      for (char ch : id.substr(colon + 1))
        if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
      std::string_view name = id.substr(0, colon);
      if (size_t dot = name.rfind('.'); dot != std::string_view::npos) name.remove_prefix(dot + 1);
      if (!plain_name(name)) return false;
      PartialCall c;
      c.name = std::string(name);
      i = a + kArgs.size();
      if (int r = scan_json_args(body, i, c); r <= 0) return r == 0;
      const bool done = c.done;
      out.push_back(std::move(c));
      if (!done) return true;
      skip_ws(body, i);
      if (int r = expect(body, i, kEnd); r <= 0) return r == 0;
    }
  }

 private:
  static constexpr std::string_view kBegin = "<|tool_call_begin|>", kArgs = "<|tool_call_argument_begin|>",
                                    kEnd = "<|tool_call_end|>";
};

// --- mistral -------------------------------------------------------------------------------------
// Tokenizers < v11: [TOOL_CALLS] [{"name": N, "arguments": {...}, "id": "..."}, ...]
// v11+:             [TOOL_CALLS]N{...}  (N may carry [ARGS] / [CALL_ID]... markers), one per marker.
// No close marker: the block ends where its JSON does.
class MistralFormat final : public ToolCallFormat {
 public:
  std::string_view open() const override { return "[TOOL_CALLS]"; }
  std::string_view close() const override { return {}; }
  std::vector<std::string_view> inner_markers() const override { return {"[ARGS]", "[CALL_ID]"}; }
  End find_end(std::string_view text, size_t) const override {
    size_t i = 0;
    skip_ws(text, i);
    if (i == text.size()) return {};
    size_t j = i;
    if (text[i] != '[' || text.substr(i).starts_with("[ARGS]") || text.substr(i).starts_with("[CALL_ID]")) {
      // v11: the name runs to the arguments' '{'.
      for (; j < text.size() && text[j] != '{'; ++j)
        if (is_ws(text[j]) || text[j] == '"' || text[j] == '<' || j - i > 256) return {End::bad};
      if (j == text.size()) return {};
      if (j == i) return {End::bad};
    }
    size_t e = json_value_end(text, j);
    if (e == std::string_view::npos) return {};
    return {End::found, e, e};
  }
  bool parse(std::string_view body, const Json*, std::vector<ToolCall>& out) const override {
    body = trim(body);
    if (body.starts_with('[') && !body.starts_with("[ARGS]") && !body.starts_with("[CALL_ID]")) {
      Json arr = parse_json(body);
      if (!arr.is_array() || arr.empty()) return false;
      for (const Json& c : arr) {
        if (!c.is_object()) return false;
        auto name = c.find("name");
        if (name == c.end() || !name->is_string() || !plain_name(name->get<std::string>())) return false;
        auto args = c.find("arguments");
        std::string a = "{}";
        if (args != c.end() && args->is_object()) a = dump(*args);
        else if (args != c.end() && args->is_string()) {
          if (!json_arguments(args->get<std::string>(), a)) return false;
        } else if (args != c.end() && !args->is_null()) {
          return false;
        }
        out.push_back(make_call(name->get<std::string>(), std::move(a)));
      }
      return true;
    }
    size_t brace = body.find('{');
    if (brace == std::string_view::npos) return false;
    std::string_view name = trim(body.substr(0, std::min(brace, body.find('['))));
    std::string args;
    if (!plain_name(name) || !json_arguments(body.substr(brace), args)) return false;
    out.push_back(make_call(name, std::move(args)));
    return true;
  }
  // The array form streams when each object opens {"name": N, "arguments": {...} (the templates'
  // order; an "id" may follow); v11's N{...} streams its object.
  bool scan(std::string_view body, bool, const Json*, std::vector<PartialCall>& out) const override {
    size_t i = 0;
    skip_ws(body, i);
    if (i == body.size()) return true;
    const std::string_view rest = body.substr(i);
    if (rest[0] != '[' || rest.starts_with("[ARGS]") || rest.starts_with("[CALL_ID]")) {  // v11
      const size_t brace = body.find('{', i);
      if (brace == std::string_view::npos) return true;
      PartialCall c;
      c.name = std::string(trim(body.substr(i, std::min(brace, body.find('[', i)) - i)));
      if (!plain_name(c.name)) return false;
      i = brace;
      if (int r = scan_json_args(body, i, c); r <= 0) return r == 0;
      out.push_back(std::move(c));
      return true;
    }
    ++i;
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) return true;
      const size_t obj = i;
      if (body[i++] != '{') return false;
      std::string key, name;
      auto string_at = [&](std::string& v) {  // 1 read, 0 more text needed, -1 not a string
        skip_ws(body, i);
        if (i == body.size()) return 0;
        if (body[i] != '"') return -1;
        const size_t e = json_value_end_string(body, i);
        if (e == std::string_view::npos) return 0;
        Json j = parse_json(body.substr(i, e - i));
        if (!j.is_string()) return -1;
        v = j.get<std::string>();
        i = e;
        return 1;
      };
      auto punct = [&](char ch) {
        skip_ws(body, i);
        if (i == body.size()) return 0;
        return body[i++] == ch ? 1 : -1;
      };
      int r;
      if ((r = string_at(key)) <= 0 || key != "name") return r == 0;
      if ((r = punct(':')) <= 0 || (r = string_at(name)) <= 0) return r == 0;
      if (!plain_name(name)) return false;
      if ((r = punct(',')) <= 0 || (r = string_at(key)) <= 0) return r == 0;
      if (key != "arguments" || (r = punct(':')) <= 0) return key == "arguments" && r == 0;
      PartialCall c;
      c.name = std::move(name);
      if (int r = scan_json_args(body, i, c); r <= 0) return r == 0;
      const bool done = c.done;
      out.push_back(std::move(c));
      if (!done) return true;
      const size_t e = json_value_end(body, obj);  // past the object: an "id" may come first
      if (e == std::string_view::npos) return true;
      i = e;
      if ((r = punct(',')) <= 0) return r == 0 || body[i - 1] == ']';
    }
  }
};

// --- qwen3_coder -----------------------------------------------------------------------------------
// <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
class Qwen3CoderFormat final : public ToolCallFormat {
 public:
  std::string_view open() const override { return "<tool_call>"; }
  std::string_view close() const override { return "</tool_call>"; }
  bool parse(std::string_view body, const Json* tools, std::vector<ToolCall>& out) const override {
    size_t i = 0;
    skip_ws(body, i);
    if (!eat(body, i, "<function=")) return false;
    size_t gt = body.find('>', i);
    if (gt == std::string_view::npos) return false;
    std::string_view name = trim(body.substr(i, gt - i));
    if (!plain_name(name)) return false;
    i = gt + 1;
    Json args = Json::object();
    // A call cut before </function> (max_tokens) is not one.
    if (body.find("</function>", i) == std::string_view::npos) return false;
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) return false;
      if (eat(body, i, "</function>")) {
        skip_ws(body, i);
        if (i != body.size()) return false;
        break;
      }
      if (!eat(body, i, "<parameter=")) return false;
      gt = body.find('>', i);
      if (gt == std::string_view::npos) return false;
      std::string_view key = trim(body.substr(i, gt - i));
      if (key.empty()) return false;
      i = gt + 1;
      // The value ends at </parameter>; when that was left out, at the next parameter or </function>.
      size_t end = body.find("</parameter>", i), next = i;
      if (end != std::string_view::npos) {
        next = end + 12;
      } else {
        end = std::min(body.find("<parameter=", i), body.rfind("</function>"));
        next = end;
      }
      args[std::string(key)] = typed_param_value(strip_newlines(body.substr(i, end - i)), tools, name, key);
      i = next;
    }
    out.push_back(make_call(name, dump(args)));
    return true;
  }
  bool scan(std::string_view body, bool, const Json* tools, std::vector<PartialCall>& out) const override {
    size_t i = 0;
    skip_ws(body, i);
    if (int r = expect(body, i, "<function="); r <= 0) return r == 0;
    size_t gt = body.find('>', i);
    if (gt == std::string_view::npos) return true;
    PartialCall c;
    c.name = std::string(trim(body.substr(i, gt - i)));
    if (!plain_name(c.name)) return false;
    i = gt + 1;
    ArgsText args;
    while (true) {
      c.args = args.open();
      skip_ws(body, i);
      int r = expect(body, i, "</function>");
      if (r == 1) {
        c.args = args.closed();
        c.done = true;
        break;
      }
      if (r == 0 && i < body.size()) break;  // "</fun...": more text decides
      if ((r = expect(body, i, "<parameter=")) <= 0) {
        if (r < 0 && i < body.size()) return false;
        break;
      }
      gt = body.find('>', i);
      const size_t end = body.find("</parameter>", i);
      if (gt == std::string_view::npos || end == std::string_view::npos) break;  // the value is being written
      std::string_view key = trim(body.substr(i, gt - i));
      if (key.empty() || gt > end) return false;
      args.add(key, typed_param_value(strip_newlines(body.substr(gt + 1, end - gt - 1)), tools, c.name, key));
      i = end + 12;
    }
    out.push_back(std::move(c));
    return true;
  }
};

// --- glm45 -------------------------------------------------------------------------------------------
// <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>  (GLM-4.5 .. 4.7:
// the newline after NAME may be absent)
class Glm45Format final : public ToolCallFormat {
 public:
  std::string_view open() const override { return "<tool_call>"; }
  std::string_view close() const override { return "</tool_call>"; }
  std::vector<std::string_view> inner_markers() const override {
    return {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
  }
  bool parse(std::string_view body, const Json* tools, std::vector<ToolCall>& out) const override {
    size_t i = body.find("<arg_key>");
    if (i == std::string_view::npos) i = body.size();
    std::string_view name = trim(body.substr(0, i));
    if (!plain_name(name)) return false;
    Json args = Json::object();
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) break;
      if (!eat(body, i, "<arg_key>")) return false;
      size_t e = body.find("</arg_key>", i);
      if (e == std::string_view::npos) return false;
      std::string_view key = trim(body.substr(i, e - i));
      i = e + 10;
      skip_ws(body, i);
      if (key.empty() || !eat(body, i, "<arg_value>")) return false;
      e = body.find("</arg_value>", i);
      if (e == std::string_view::npos) return false;
      args[std::string(key)] = typed_param_value(body.substr(i, e - i), tools, name, key);
      i = e + 12;
    }
    out.push_back(make_call(name, dump(args)));
    return true;
  }
  // The name is complete at the newline after it, at the first <arg_key>, or at the block's end.
  bool scan(std::string_view body, bool complete, const Json* tools, std::vector<PartialCall>& out) const override {
    size_t i = body.find("<arg_key>");
    size_t name_end = std::min(i, body.find('\n'));
    if (name_end == std::string_view::npos && !complete) return true;
    if (name_end == std::string_view::npos) name_end = body.size();
    if (i == std::string_view::npos) i = name_end;
    PartialCall c;
    c.name = std::string(trim(body.substr(0, name_end)));
    if (!plain_name(c.name)) return c.name.empty() && !complete;  // "\n" before the name: wait
    ArgsText args;
    while (true) {
      c.args = args.open();
      skip_ws(body, i);
      if (i == body.size()) {
        if (complete) c.args = args.closed(), c.done = true;
        break;
      }
      if (int r = expect(body, i, "<arg_key>"); r <= 0) {
        if (r < 0) return false;
        break;
      }
      const size_t ke = body.find("</arg_key>", i);
      const size_t ve = ke == std::string_view::npos ? ke : body.find("</arg_value>", ke);
      if (ve == std::string_view::npos) break;  // the pair is being written
      std::string_view key = trim(body.substr(i, ke - i));
      size_t v = ke + 10;
      skip_ws(body, v);
      if (key.empty() || expect(body, v, "<arg_value>") != 1 || v > ve) return false;
      args.add(key, typed_param_value(body.substr(v, ve - v), tools, c.name, key));
      i = ve + 12;
    }
    out.push_back(std::move(c));
    return true;
  }
};

// --- minimax_m2 --------------------------------------------------------------------------------------
// <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n...</minimax:tool_call>
class MiniMaxM2Format final : public ToolCallFormat {
 public:
  std::string_view open() const override { return "<minimax:tool_call>"; }
  std::string_view close() const override { return "</minimax:tool_call>"; }
  bool parse(std::string_view body, const Json* tools, std::vector<ToolCall>& out) const override {
    size_t i = 0, n = 0;
    while (true) {
      skip_ws(body, i);
      if (i == body.size()) return n > 0;
      std::string_view name;
      if (!eat(body, i, "<invoke") || !attr_name(body, i, name) || !plain_name(name)) return false;
      Json args = Json::object();
      while (true) {
        skip_ws(body, i);
        if (eat(body, i, "</invoke>")) break;
        std::string_view key;
        if (!eat(body, i, "<parameter") || !attr_name(body, i, key) || key.empty()) return false;
        size_t e = body.find("</parameter>", i);
        if (e == std::string_view::npos) return false;
        args[std::string(key)] = typed_param_value(strip_newlines(body.substr(i, e - i)), tools, name, key);
        i = e + 12;
      }
      out.push_back(make_call(name, dump(args)));
      ++n;
    }
  }
  bool scan(std::string_view body, bool, const Json* tools, std::vector<PartialCall>& out) const override {
    size_t i = 0;
    while (true) {
      skip_ws(body, i);
      if (int r = expect(body, i, "<invoke"); r <= 0) return r == 0;
      if (body.find('>', i) == std::string_view::npos) return true;
      std::string_view name;
      if (!attr_name(body, i, name) || !plain_name(name)) return false;
      PartialCall c;
      c.name = std::string(name);
      ArgsText args;
      while (true) {
        c.args = args.open();
        skip_ws(body, i);
        int r = expect(body, i, "</invoke>");
        if (r == 1) {
          c.args = args.closed();
          c.done = true;
          break;
        }
        if (r == 0 && i < body.size()) break;
        if ((r = expect(body, i, "<parameter")) <= 0) {
          if (r < 0 && i < body.size()) return false;
          break;
        }
        const size_t e = body.find("</parameter>", i);
        if (e == std::string_view::npos) break;  // the value is being written
        std::string_view key;
        if (!attr_name(body, i, key) || key.empty() || i > e) return false;
        args.add(key, typed_param_value(strip_newlines(body.substr(i, e - i)), tools, c.name, key));
        i = e + 12;
      }
      const bool done = c.done;
      out.push_back(std::move(c));
      if (!done) return true;
    }
  }

 private:
  // ` name="X">` (or 'X', or unquoted): X, i past the '>'.
  static bool attr_name(std::string_view s, size_t& i, std::string_view& out) {
    skip_ws(s, i);
    if (!eat(s, i, "name=")) return false;
    if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
      char q = s[i++];
      size_t e = s.find(q, i);
      if (e == std::string_view::npos) return false;
      out = s.substr(i, e - i);
      i = e + 1;
      skip_ws(s, i);
      return eat(s, i, ">");
    }
    size_t e = s.find('>', i);
    if (e == std::string_view::npos) return false;
    out = trim(s.substr(i, e - i));
    i = e + 1;
    return true;
  }
};

// The schema of tools[].function (name `tool`).parameters.properties[`param`], or null.
const Json* param_schema(const Json* tools, std::string_view tool, std::string_view param) {
  if (!tools || !tools->is_array()) return nullptr;
  for (const Json& t : *tools) {
    const Json* f = &t;
    if (auto it = t.find("function"); it != t.end() && it->is_object()) f = &*it;
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>() != tool) continue;
    auto params = f->find("parameters");
    if (params == f->end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    auto p = props->find(std::string(param));
    return p == props->end() ? nullptr : &*p;
  }
  return nullptr;
}

// The schema's type, lower case ("" when it names none): the first non-null one of a list, or of
// anyOf / oneOf alternatives.
std::string schema_type(const Json& s) {
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  if (!s.is_object()) return "";
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) return lower(t->get<std::string>());
    if (t->is_array())
      for (const Json& x : *t)
        if (x.is_string() && x.get<std::string>() != "null") return lower(x.get<std::string>());
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto a = s.find(k); a != s.end() && a->is_array())
      for (const Json& x : *a) {
        std::string t = schema_type(x);
        if (!t.empty() && t != "null") return t;
      }
  if (s.contains("enum")) return "enum";
  return "";
}
}  // namespace

size_t json_value_end(std::string_view s, size_t i) {
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
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

ToolCallFormat::End ToolCallFormat::find_end(std::string_view text, size_t from) const {
  size_t pos = text.find(close(), from);
  if (pos == std::string_view::npos) return {};
  return {End::found, pos, pos + close().size()};
}

namespace {
bool string_type(const std::string& type) {
  return type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" || type == "enum";
}
}  // namespace

ParamTyping param_typing(const Json& schema) {
  std::string type = schema_type(schema);
  if (type.empty()) return ParamTyping::any;
  return string_type(type) ? ParamTyping::text : ParamTyping::json;
}

Json typed_param_value(std::string_view text, const Json* tools, std::string_view tool, std::string_view param) {
  const Json* schema = param_schema(tools, tool, param);
  std::string type = schema ? schema_type(*schema) : "";
  std::string_view t = trim(text);
  auto string = [&] { return Json(std::string(text)); };
  if (type.empty()) {  // no schema: JSON when it is JSON, else the text
    Json j = parse_json(t);
    return j.is_discarded() || t.empty() ? string() : j;
  }
  if (string_type(type)) return string();
  if (t == "null" || t == "None") return nullptr;
  if (type == "integer" || type == "int" || type == "long" || type == "short" || type.starts_with("uint") ||
      type.starts_with("int") || type == "unsigned") {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec == std::errc() && p == t.data() + t.size() && !t.empty()) return v;
    Json j = parse_json(t);  // 3.0
    return j.is_number() ? j : string();
  }
  if (type == "number" || type == "float" || type == "double" || type == "num") {
    Json j = parse_json(t);
    return j.is_number() ? j : string();
  }
  if (type == "boolean" || type == "bool" || type == "binary") {
    std::string l(t);
    for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (l == "true") return true;
    if (l == "false") return false;
    return string();
  }
  // object, array, anything else: JSON when it parses.
  Json j = parse_json(t);
  return j.is_discarded() ? string() : j;
}

std::shared_ptr<const ToolCallFormat> tool_call_format(ToolCallParser::Kind kind) {
  using K = ToolCallParser::Kind;
  switch (kind) {
    case K::mistral: return std::make_shared<MistralFormat>();
    case K::deepseek_v3: return std::make_shared<DeepSeekFormat>(false);
    case K::deepseek_v31: return std::make_shared<DeepSeekFormat>(true);
    case K::kimi_k2: return std::make_shared<KimiK2Format>();
    case K::qwen3_coder: return std::make_shared<Qwen3CoderFormat>();
    case K::glm45: return std::make_shared<Glm45Format>();
    case K::minimax_m2: return std::make_shared<MiniMaxM2Format>();
    default: return nullptr;
  }
}

}  // namespace ts::server
