// PCRE2 (JIT) wrapper for the Oniguruma-flavoured patterns found in tokenizer.json. Compiled
// once, matched from many threads: match data and the JIT stack are thread-local.
#pragma once
#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

struct pcre2_real_code_8;

namespace ts::tok {

class Regex {
 public:
  // `where` names the tokenizer.json field, for the error message of a pattern PCRE2 rejects.
  Regex(const std::string& pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match at or after `from`; lookarounds see all of `s`.
  bool search(std::string_view s, size_t from, size_t& begin, size_t& end) const;

  // Calls fn(begin, end) for every match, left to right, with the iteration rule of the onig
  // crate HF tokenizers uses: an empty match right where the previous match ended is skipped
  // and the search resumes one character later. (Empty matches still split in Split.)
  template <typename F>
  void for_each_match(std::string_view s, F&& fn) const {
    size_t pos = 0, last_end = std::string_view::npos, b, e;
    while (pos <= s.size() && search(s, pos, b, e)) {
      if (b == e && e == last_end) {
        pos = next_char(s, pos);
        continue;
      }
      fn(b, e);
      pos = last_end = e;
    }
  }

  // The pattern as handed to PCRE2 (after the Oniguruma adjustments).
  const std::string& pcre2_pattern() const { return pattern_; }

  // Oniguruma's \s is Unicode White_Space, which includes U+0085; PCRE2's (UCP) does not.
  static std::string from_oniguruma(std::string_view pattern);

 private:
  static size_t next_char(std::string_view s, size_t i);
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string pattern_;
};

// A tokenizer.json "pattern": {"String": "..."} (literal) or {"Regex": "..."}.
class Pattern {
 public:
  // Reads owner["pattern"]; `where` names owner in error messages.
  Pattern(const nlohmann::json& owner, const std::string& where);
  explicit Pattern(std::string literal) : literal_(std::move(literal)) {}

  template <typename F>
  void for_each_match(std::string_view s, F&& fn) const {
    if (re_) return re_->for_each_match(s, fn);
    if (literal_.empty()) return;
    for (size_t p = s.find(literal_); p != std::string_view::npos; p = s.find(literal_, p + literal_.size()))
      fn(p, p + literal_.size());
  }

  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> re_;
};

}  // namespace ts::tok
