#include "tokenizer/added_vocab.h"

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

// Rust regex `\w` at the end / start of the neighbouring text decides `single_word`.
bool is_word_char_at(std::string_view s, size_t i) {
  size_t len;
  uint32_t cp = unicode::decode(s, i, len);
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == unicode::kInvalid) return false;
  static const Regex word(R"(\A\w)", "added token single_word");
  size_t b, e;
  return word.search(s.substr(i, len), 0, b, e);
}

size_t last_char_start(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && s.size() - i < 4) --i;
  return i;
}

}  // namespace

void AddedMatcher::add(std::string_view pattern, const AddedToken* tok) {
  if (pattern.empty()) return;
  int32_t n = 0;
  for (unsigned char c : pattern) {
    int32_t child = -1;
    for (auto& [b, idx] : nodes_[n].next)
      if (b == c) child = idx;
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_[n].next.emplace_back(c, child);
      nodes_.emplace_back();
    }
    n = child;
  }
  if (!nodes_[n].tok) nodes_[n].tok = tok;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

const AddedToken* AddedMatcher::longest_at(std::string_view text, size_t pos, size_t& len) const {
  const AddedToken* best = nullptr;
  int32_t n = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    int32_t child = -1;
    for (const auto& [b, idx] : nodes_[n].next)
      if (b == static_cast<unsigned char>(text[i])) {
        child = idx;
        break;
      }
    if (child < 0) break;
    n = child;
    if (nodes_[n].tok) best = nodes_[n].tok, len = i + 1 - pos;
  }
  return best;
}

void AddedMatcher::split(std::string_view text, const std::function<void(size_t, size_t, const AddedToken*)>& fn) const {
  size_t start_offset = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const AddedToken* tok = first_byte_[static_cast<unsigned char>(text[pos])] ? longest_at(text, pos, len) : nullptr;
    if (!tok) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search resumes after the raw match, whatever happens to it below
    if (start < start_offset) continue;  // swallowed by the previous token's rstrip
    if (tok->single_word) {
      bool space_before = start == 0 || !is_word_char_at(text, last_char_start(text.substr(0, start)));
      bool space_after = stop == text.size() || !is_word_char_at(text, stop);
      if (!space_before || !space_after) continue;
    }
    if (tok->lstrip) {
      size_t s = start;
      while (s > start_offset) {
        size_t cs = start_offset + last_char_start(text.substr(start_offset, s - start_offset)), clen;
        if (!unicode::is_whitespace(unicode::decode(text, cs, clen)) || cs + clen != s) break;
        s = cs;
      }
      start = s;
    }
    if (tok->rstrip) {
      while (stop < text.size()) {
        size_t clen;
        if (!unicode::is_whitespace(unicode::decode(text, stop, clen))) break;
        stop += clen;
      }
    }
    if (start > start_offset) fn(start_offset, start, nullptr);
    fn(start, stop, tok);
    start_offset = stop;
  }
  if (start_offset < text.size()) fn(start_offset, text.size(), nullptr);
}

}  // namespace ts::tok
