#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

// Match data and JIT stack are per thread: a compiled pattern is shared by all HTTP threads.
struct Scratch {
  pcre2_match_data* md;
  pcre2_match_context* mc;
  pcre2_jit_stack* stack;
  Scratch() {
    md = pcre2_match_data_create(64, nullptr);
    mc = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (!md || !mc || !stack) throw Error("pcre2: out of memory creating match data");
    pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~Scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<char*>(buf);
}

}  // namespace

std::string Regex::from_oniguruma(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, std::string_view where) : pattern_(from_oniguruma(pattern)) {
  int err = 0;
  PCRE2_SIZE off = 0;
  // MATCH_INVALID_UTF: input may be arbitrary bytes; invalid sequences simply never match.
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), opts, &err, &off, nullptr);
  if (!code_) fail("{}: regex {:?} rejected at offset {}: {}", where, pattern, off, pcre2_message(err));
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::search(std::string_view s, size_t from, size_t& begin, size_t& end) const {
  Scratch& sc = scratch();
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), from, 0, sc.md, sc.mc)
                : pcre2_match(code_, subject, s.size(), from, 0, sc.md, sc.mc);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("regex {:?}: match failed: {}", pattern_, pcre2_message(rc));
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
  begin = ov[0];
  end = ov[1];
  return true;
}

size_t Regex::next_char(std::string_view s, size_t i) {
  if (i >= s.size()) return s.size() + 1;
  size_t len;
  unicode::decode(s, i, len);
  return i + len;
}

Pattern::Pattern(const nlohmann::json& owner, const std::string& where) {
  if (!owner.contains("pattern") || !owner["pattern"].is_object()) fail("tokenizer.json: {}.pattern must be an object", where);
  const auto& p = owner["pattern"];
  if (p.contains("String") && p["String"].is_string()) {
    literal_ = p["String"].get<std::string>();
  } else if (p.contains("Regex") && p["Regex"].is_string()) {
    re_ = std::make_shared<Regex>(p["Regex"].get<std::string>(), where + ".pattern.Regex");
  } else {
    fail("tokenizer.json: {}.pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  out.reserve(s.size());
  size_t last = 0;
  for_each_match(s, [&](size_t b, size_t e) {
    out.append(s.substr(last, b - last));
    out.append(content);
    last = e;
  });
  out.append(s.substr(last));
  return out;
}

}  // namespace ts::tok
