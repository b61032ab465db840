#include "chat/jinja_lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <locale.h>

#include <fmt/format.h>

#include "chat/jinja.h"
#include "chat/jinja_value.h"

namespace ts::chat::jinja {
namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 splits on \r\n, \r and \n, drops one trailing empty line and rejoins with "\n".
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      char kind = src_[start + 1];
      char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      if (kind == '{' && sign == '+') sign = 0;  // `{{+` is a unary plus, not whitespace control
      size_t raw_end = kind == '%' ? match_raw_begin(start + 2 + (sign ? 1 : 0)) : std::string::npos;
      std::string text = src_.substr(pos_, start - pos_);
      if (sign == '-')
        rstrip(text);
      else if (sign != '+' && kind != '{')
        lstrip_line(text);
      emit_text(std::move(text), pos_);
      size_t after_open = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        comment(start, after_open);
      } else if (raw_end != std::string::npos) {
        raw(start, raw_end);
      } else {
        tag(start, after_open, kind == '%');
      }
    }
    add(Tok::Eof, "", src_.size());
    return std::move(toks_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  // Whether the last consumed piece ended with a newline: lstrip_blocks also strips indentation
  // before a tag when the text in front of it starts a line without containing a newline itself.
  bool line_starting_ = true;
  std::vector<size_t> line_starts_;
  std::vector<Token> toks_;

  [[noreturn]] void fail(size_t at, const std::string& msg) {
    auto [line, col] = position(at);
    throw TemplateError("TemplateSyntaxError", msg, line, col);
  }

  std::pair<int, int> position(size_t at) {
    at = std::min(at, src_.size());
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at) - 1;
    size_t ls = *it;
    int col = 1;
    for (size_t p = ls; p < at;) {
      decode_utf8(src_, p);
      ++col;
    }
    return {int(it - line_starts_.begin()) + 1, col};
  }

  Token& add(Tok t, std::string value, size_t at) {
    auto [line, col] = position(at);
    Token tok;
    tok.type = t;
    tok.value = std::move(value);
    tok.line = line;
    tok.col = col;
    toks_.push_back(std::move(tok));
    return toks_.back();
  }

  void emit_text(std::string text, size_t at) {
    if (!text.empty()) add(Tok::Text, std::move(text), at);
  }

  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos && k + 1 < src_.size(); k = src_.find('{', k + 1)) {
      char c = src_[k + 1];
      if (c == '{' || c == '%' || c == '#') return k;
    }
    return std::string::npos;
  }

  // Python's \s: ASCII and Unicode whitespace.
  bool space_at(size_t p, size_t* len) const {
    size_t q = p;
    uint32_t cp = decode_utf8(src_, q);
    *len = q - p;
    return is_py_space(cp);
  }
  size_t skip_space(size_t p) const {
    size_t len;
    while (p < src_.size() && space_at(p, &len)) p += len;
    return p;
  }

  static void rstrip(std::string& s) {
    // Python's str.rstrip(): walk back over whole code points.
    size_t end = s.size();
    while (end > 0) {
      size_t b = end - 1;
      while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
      size_t q = b;
      if (!is_py_space(decode_utf8(s, q)) || q != end) break;
      end = b;
    }
    s.resize(end);
  }

  void lstrip_line(std::string& text) const {
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if (l_pos == 0 && !line_starting_) return;
    for (size_t p = l_pos; p < text.size();) {
      if (!is_py_space(decode_utf8(text, p))) return;
    }
    text.resize(l_pos);
  }

  // `{% raw %}` (after the opening `{%` and sign): returns the offset just past the tag, or npos.
  size_t match_raw_begin(size_t p) const {
    p = skip_space(p);
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p = skip_space(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  void comment(size_t start, size_t from) {
    size_t end = src_.find("#}", from);
    if (end == std::string::npos) fail(start, "Missing end of comment tag");
    size_t next = end + 2;
    if (end > from && src_[end - 1] == '-')
      next = skip_space(next);
    else if (!(end > from && src_[end - 1] == '+') && next < src_.size() && src_[next] == '\n')
      ++next;
    line_starting_ = src_[next - 1] == '\n';
    pos_ = next;
  }

  void raw(size_t start, size_t body) {
    line_starting_ = src_[body - 1] == '\n';
    for (size_t k = src_.find("{%", body); k != std::string::npos; k = src_.find("{%", k + 2)) {
      size_t p = k + 2;
      char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign) ++p;
      p = skip_space(p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = skip_space(p + 6);
      size_t next;
      if (src_.compare(p, 3, "+%}") == 0) {
        next = p + 3;
      } else if (src_.compare(p, 3, "-%}") == 0) {
        next = skip_space(p + 3);
      } else if (src_.compare(p, 2, "%}") == 0) {
        next = p + 2;
        if (next < src_.size() && src_[next] == '\n') ++next;
      } else {
        continue;
      }
      std::string text = src_.substr(body, k - body);
      if (sign == '-')
        rstrip(text);
      else if (sign != '+')
        lstrip_line(text);
      emit_text(std::move(text), body);
      line_starting_ = src_[next - 1] == '\n';
      pos_ = next;
      return;
    }
    fail(start, "Missing end of raw directive");
  }

  void tag(size_t start, size_t p, bool block) {
    add(block ? Tok::BlockBegin : Tok::VarBegin, "", start);
    std::vector<char> balance;
    for (;;) {
      p = skip_space(p);
      if (p >= src_.size())
        fail(start, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (balance.empty()) {
        size_t next = std::string::npos;
        if (block) {
          if (src_.compare(p, 3, "+%}") == 0) {
            next = p + 3;
          } else if (src_.compare(p, 3, "-%}") == 0) {
            next = skip_space(p + 3);
          } else if (src_.compare(p, 2, "%}") == 0) {
            next = p + 2;
            if (next < src_.size() && src_[next] == '\n') ++next;
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0)
            next = skip_space(p + 3);
          else if (src_.compare(p, 2, "}}") == 0)
            next = p + 2;
        }
        if (next != std::string::npos) {
          add(block ? Tok::BlockEnd : Tok::VarEnd, "", p);
          line_starting_ = src_[next - 1] == '\n';
          pos_ = next;
          return;
        }
      }
      p = token(p, balance);
    }
  }

  size_t token(size_t p, std::vector<char>& balance) {
    char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p + 1;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      add(Tok::Name, src_.substr(p, e - p), p);
      return e;
    }
    if (c == '\'' || c == '"') return string(p);
    if (is_digit(c)) return number(p);
    static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : ops2)
      if (src_.compare(p, 2, op) == 0) {
        add(Tok::Op, op, p);
        return p + 2;
      }
    if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos)
      fail(p, fmt::format("unexpected char '{}'", c));
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(p, fmt::format("unexpected '{}'", c));
      if (balance.back() != c) fail(p, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    add(Tok::Op, std::string(1, c), p);
    return p + 1;
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // String literals decode Python escapes, as jinja2 does with the "unicode-escape" codec.
  size_t string(size_t p) {
    char q = src_[p];
    std::string out;
    size_t k = p + 1;
    for (;; ++k) {
      if (k >= src_.size()) fail(p, "unexpected end of string literal");
      char c = src_[k];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++k >= src_.size()) fail(p, "unexpected end of string literal");
      char e = src_[k];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int d = 1; d <= n; ++d) {
            int h = k + d < src_.size() ? hexval(src_[k + d]) : -1;
            if (h < 0) fail(k - 1, fmt::format("truncated \\{} escape in string literal", e));
            cp = cp * 16 + uint32_t(h);
          }
          if (cp > 0x10ffff) fail(k - 1, "illegal Unicode character in string literal");
          encode_utf8(out, cp);
          k += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int d = 0; d < 2 && k + 1 < src_.size() && src_[k + 1] >= '0' && src_[k + 1] <= '7'; ++d)
              cp = cp * 8 + uint32_t(src_[++k] - '0');
            encode_utf8(out, cp);
          } else {
            out += '\\';  // unknown escapes stay as written
            out += e;
          }
      }
    }
    add(Tok::String, std::move(out), p);
    return k + 1;
  }

  size_t digits(size_t p, bool (*ok)(char)) const {
    // digits with single underscores between them, as Python allows
    while (p < src_.size() && (ok(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && ok(src_[p + 1])))) ++p;
    return p;
  }

  size_t number(size_t p) {
    auto strip = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    char c1 = p + 1 < src_.size() ? char(src_[p + 1] | 0x20) : 0;
    if (src_[p] == '0' && (c1 == 'x' || c1 == 'o' || c1 == 'b')) {
      int base = c1 == 'x' ? 16 : c1 == 'o' ? 8 : 2;
      size_t e = p + 2;
      while (e < src_.size() && (src_[e] == '_' || (hexval(src_[e]) >= 0 && hexval(src_[e]) < base))) ++e;
      std::string d = strip(src_.substr(p + 2, e - p - 2));
      int64_t v = 0;
      auto r = std::from_chars(d.data(), d.data() + d.size(), v, base);
      if (d.empty() || r.ec != std::errc()) fail(p, "invalid integer literal");
      add(Tok::Int, "", p).ival = v;
      return e;
    }
    size_t e = digits(p, is_digit);
    bool after_dot = p > 0 && src_[p - 1] == '.';  // `x.0.1` is two subscripts, not a float
    bool is_float = false;
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      e = digits(e + 1, is_digit);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] | 0x20) == 'e') {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        e = digits(q, is_digit);
        is_float = true;
      }
    }
    std::string text = strip(src_.substr(p, e - p));
    if (is_float) {
      double v = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      // Out of range: Python reads 1e400 as inf and 1e-400 as 0.0 (from_chars leaves v unset);
      // strtod rounds the same way, in the C locale whatever the process's decimal point.
      if (r.ec == std::errc::result_out_of_range) {
        static locale_t c_locale = newlocale(LC_NUMERIC_MASK, "C", locale_t(0));
        v = strtod_l(text.c_str(), nullptr, c_locale);
      }
      add(Tok::Float, "", p).fval = v;
    } else {
      int64_t v = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec != std::errc()) fail(p, "integer literal too large (only 64-bit integers are supported)");
      add(Tok::Int, "", p).ival = v;
    }
    return e;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace ts::chat::jinja
