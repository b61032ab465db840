// Regex front end: the subset that response_format patterns, vLLM's `regex` and JSON Schema's
// `pattern` use in practice. Classes ([a-z], [^...], \d\w\s and negations, `.`), escapes (\n \t
// \xHH \uHHHH, escaped metacharacters), groups ((...), (?:...), (?<name>...)), alternation,
// quantifiers * + ? {m} {m,} {m,n} (lazy/possessive suffixes are accepted and mean the same for a
// grammar). The whole input must match; ^ and $ are accepted as no-ops. Backreferences and
// lookaround cannot be expressed in a context-free grammar and are rejected.
#include <cctype>
#include <tuple>
#include <fmt/format.h>

#include "grammar/ir.h"

namespace ts::grammar {
namespace {

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view p, bool json, bool icase, Ranges not_open)
      : g_(g), p_(p), json_(json), icase_(icase), not_open_(normalize(std::move(not_open))) {}

  int parse() {
    int e = parse_alt();
    if (i_ < p_.size()) err(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  [[noreturn]] void err(const std::string& what) const {
    throw InvalidRequest(fmt::format("regex: {} at offset {} in /{}/", what, i_, p_));
  }
  bool eof() const { return i_ >= p_.size(); }
  char peek() const { return eof() ? '\0' : p_[i_]; }

  uint32_t next_cp() {
    unsigned char c = static_cast<unsigned char>(p_[i_++]);
    if (c < 0x80) return c;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = c & (0x3F >> n);
    for (int k = 0; k < n; ++k) {
      if (eof()) err("truncated UTF-8");
      cp = (cp << 6) | (static_cast<unsigned char>(p_[i_++]) & 0x3F);
    }
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (eof() || !std::isxdigit(static_cast<unsigned char>(peek()))) err("bad hex escape");
      char c = p_[i_++];
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return v;
  }

  // Class-like escapes (\d \w \s and negations) fill `r` and return true; others give one code point.
  bool escape(uint32_t& cp, Ranges& r) {
    if (eof()) err("trailing backslash");
    char c = p_[i_++];
    switch (c) {
      case 'd': r = kDigit; return true;
      case 'w': r = kWord; return true;
      case 's': r = kSpace; return true;
      case 'D': r = complement(kDigit), open_escape_ = true; return true;
      case 'W': r = complement(kWord), open_escape_ = true; return true;
      case 'S': r = complement(kSpace), open_escape_ = true; return true;
      case 'n': cp = '\n'; return false;
      case 't': cp = '\t'; return false;
      case 'r': cp = '\r'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0': cp = 0; return false;
      case 'x':
        if (peek() == '{') {
          ++i_;
          cp = 0;
          while (!eof() && peek() != '}') cp = cp * 16 + hex(1);
          if (eof()) err("unterminated \\x{...}");
          ++i_;
          return false;
        }
        cp = hex(2);
        return false;
      case 'u':
        // JavaScript / JSON write a character past U+FFFF as a \uD8xx\uDCxx surrogate pair:
        // one code point. A lone surrogate is not a character (a class of them matches nothing).
        cp = hex(4);
        if (cp >= 0xD800 && cp <= 0xDBFF && i_ + 6 <= p_.size() && p_[i_] == '\\' && p_[i_ + 1] == 'u') {
          const size_t save = i_;
          i_ += 2;
          const uint32_t lo = hex(4);
          if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          else i_ = save;
        }
        return false;
      case 'b': case 'B': case 'A': case 'z': case 'Z':
        err(fmt::format("unsupported assertion \\{}", c));
      default:
        if (std::isdigit(static_cast<unsigned char>(c))) err("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) err(fmt::format("unknown escape \\{}", c));
        cp = static_cast<unsigned char>(c);
        return false;
    }
  }

  // In JSON-string mode a class never admits characters that would need escaping.
  // Case-insensitive patterns (Lark's /re/i): ASCII letters match both cases.
  static Ranges fold_case(Ranges r) {
    Ranges out = r;
    for (auto [lo, hi] : r)
      for (auto [a, z, delta] : {std::tuple<uint32_t, uint32_t, int>{'a', 'z', -32}, {'A', 'Z', 32}}) {
        const uint32_t x = std::max(lo, a), y = std::min(hi, z);
        if (x <= y) out.push_back({uint32_t(int(x) + delta), uint32_t(int(y) + delta)});
      }
    return normalize(std::move(out));
  }

  // `open`: the class is defined by what it excludes (`.`, [^...], \D \W \S): not_open_ is dropped.
  int make_chars(Ranges r, bool negated, bool open = false) {
    if (icase_) r = fold_case(std::move(r));
    Ranges n = negated ? complement(r) : normalize(std::move(r));
    if ((negated || open) && !not_open_.empty()) {
      n = subtract(n, not_open_);
      if (n.empty()) err("class matches no character allowed here");
    }
    if (json_) {
      n = subtract(n, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
      if (n.empty()) err("class matches no character allowed in a JSON string");
    }
    return g_.chars(std::move(n));
  }

  int make_char(uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) err(fmt::format("\\u{:04X} is a lone UTF-16 surrogate, not a character", cp));
    if (icase_ && cp < 0x80 && std::isalpha(static_cast<int>(cp))) return make_chars({{cp, cp}}, false);
    std::string s;
    if (json_ && (cp == '"' || cp == '\\')) {
      s = std::string("\\") + static_cast<char>(cp);
    } else if (json_ && cp < 0x20) {
      s = cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : fmt::format("\\u{:04x}", cp);
    } else {
      append_utf8(s, cp);
    }
    return g_.lit(s);
  }

  int parse_class() {  // after '['
    bool neg = false;
    if (peek() == '^') neg = true, ++i_;
    open_escape_ = false;
    Ranges r;
    bool first = true;
    while (true) {
      if (eof()) err("unterminated character class");
      if (peek() == ']' && !first) break;
      first = false;
      uint32_t lo;
      Ranges cls;
      if (peek() == '\\') {
        ++i_;
        if (escape(lo, cls)) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
      } else if (peek() == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        err("POSIX classes [:...:] are not supported");
      } else {
        lo = next_cp();
      }
      uint32_t hi = lo;
      if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (peek() == '\\') {
          ++i_;
          if (escape(hi, cls)) err("a class escape cannot end a range");
        } else {
          hi = next_cp();
        }
        if (hi < lo) err("range out of order in character class");
      }
      r.push_back({lo, hi});
    }
    ++i_;  // ']'
    return make_chars(std::move(r), neg, open_escape_);
  }

  int parse_atom() {
    char c = peek();
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        ++i_;
        if (peek() == ':') {
          ++i_;
        } else if (peek() == '<' || peek() == 'P') {
          if (peek() == 'P') ++i_;
          if (peek() == '=' || peek() == '!') err("lookbehind is not supported");
          if (peek() != '<') err("bad group");
          while (!eof() && peek() != '>') ++i_;
          if (eof()) err("unterminated group name");
          ++i_;
        } else {
          err("lookaround and inline flags are not supported");
        }
      }
      int e = parse_alt();
      if (peek() != ')') err("missing ')'");
      ++i_;
      return e;
    }
    if (c == '[') {
      ++i_;
      return parse_class();
    }
    if (c == '.') {
      ++i_;
      return make_chars({{'\n', '\n'}}, true);
    }
    if (c == '\\') {
      ++i_;
      uint32_t cp;
      Ranges r;
      open_escape_ = false;
      if (escape(cp, r)) return make_chars(std::move(r), false, open_escape_);
      return make_char(cp);
    }
    if (c == '^' || c == '$') {  // anchors are implicit: the grammar matches the whole output
      ++i_;
      return g_.empty();
    }
    if (c == '*' || c == '+' || c == '?' ) err("nothing to repeat");
    return make_char(next_cp());
  }

  bool parse_int(int& v) {
    size_t s = i_;
    v = 0;
    while (!eof() && std::isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > 100000) err("repetition count too large");
    }
    return i_ > s;
  }

  int parse_quant(int atom) {
    while (true) {
      char c = peek();
      int lo, hi;
      if (c == '*') lo = 0, hi = -1, ++i_;
      else if (c == '+') lo = 1, hi = -1, ++i_;
      else if (c == '?') lo = 0, hi = 1, ++i_;
      else if (c == '{') {
        size_t save = i_++;
        if (!parse_int(lo)) {  // a literal '{'
          i_ = save;
          return atom;
        }
        hi = lo;
        if (peek() == ',') {
          ++i_;
          if (!parse_int(hi)) hi = -1;
        }
        if (peek() != '}') err("bad {m,n} quantifier");
        ++i_;
        if (hi >= 0 && hi < lo) err("{m,n} with n < m");
      } else {
        return atom;
      }
      if (peek() == '?' || peek() == '+') ++i_;  // lazy / possessive
      atom = g_.rep(atom, lo, hi);
    }
  }

  int parse_seq() {
    std::vector<int> items;
    while (!eof() && peek() != '|' && peek() != ')') {
      if (peek() == '{') {  // a '{' that does not start a quantifier is literal
        ++i_;
        items.push_back(parse_quant(g_.lit("{")));
        continue;
      }
      items.push_back(parse_quant(parse_atom()));
    }
    return g_.seq(std::move(items));
  }

  int parse_alt() {
    std::vector<int> alts = {parse_seq()};
    while (peek() == '|') {
      ++i_;
      alts.push_back(parse_seq());
    }
    return g_.alt(std::move(alts));
  }

  Grammar& g_;
  std::string_view p_;
  bool json_;
  bool icase_;
  Ranges not_open_;
  bool open_escape_ = false;  // the class being parsed holds a negated escape (\D \W \S)
  size_t i_ = 0;
  // r without s (both normalized).
  static Ranges subtract(const Ranges& r, const Ranges& s) {
    Ranges keep;
    for (auto [lo, hi] : complement(s))
      for (auto [a, b] : r)
        if (std::max(lo, a) <= std::min(hi, b)) keep.push_back({std::max(lo, a), std::min(hi, b)});
    return normalize(std::move(keep));
  }
};

}  // namespace

int add_regex(Grammar& g, std::string_view pattern, bool json_string, bool ignore_case, const Ranges& not_in_open_classes) {
  return RegexParser(g, pattern, json_string, ignore_case, not_in_open_classes).parse();
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  int root = g.rule("root");
  g.define(root, add_regex(g, pattern));
  g.set_root(root);
  return g;
}

}  // namespace ts::grammar
