// EBNF front ends. GBNF (llama.cpp's grammar format, also vLLM's `grammar`):
//   root ::= item ("," item)*        # comment
//   item ::= "lit" | [a-z0-9_] | name | (group) | . ; postfix * + ? {m} {m,} {m,n}
// Lark (as vLLM/llguidance accept): `start: a b | c`, terminals NAME: "x"i | /re/, [optional],
// item~n, item~m..n, "a".."z" ranges, /re/flags (i), ?rule / !rule prefixes, `// comments`,
// `%import common.X` / `%import common (X, Y)` for the usual terminals, and `%ignore X`: what a
// Lark lexer would skip between tokens may stand between the items of every rule (lowercase
// names; terminals, UPPERCASE, stay as written), between repetitions, and around the start.
// A rule body runs until the next `name ::=` (`name:`) definition, so rules may span lines.
#include <cctype>
#include <fmt/format.h>

#include "grammar/ir.h"

namespace ts::grammar {
namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

class EbnfParser {
 public:
  EbnfParser(std::string_view t, bool lark) : t_(t), lark_(lark) {}

  Grammar parse() {
    if (lark_) collect_ignores();
    skip_ws();
    while (!eof()) {
      std::string name;
      if (!at_definition(&name)) err("expected a rule definition (name " + std::string(lark_ ? ":" : "::=") + ")");
      if (g_.find_rule(name) >= 0 && g_.rule_body(g_.find_rule(name)) >= 0) err("rule '" + name + "' is defined twice");
      int r = g_.rule(name);
      interleave_ = ignore_ >= 0 && !is_terminal(name);
      g_.define(r, parse_alt(0));
      interleave_ = false;
      skip_ws();
    }
    const char* root = lark_ ? "start" : "root";
    int r = g_.find_rule(root);
    if (r < 0) throw InvalidRequest(fmt::format("grammar: no '{}' rule", root));
    if (ignore_ >= 0) {  // the ignored text may also lead and trail the whole input
      int w = g_.rule(g_.fresh_name("ignore-start"));
      g_.define(w, g_.seq({ignore_, g_.ref(r), ignore_}));
      r = w;
    }
    g_.set_root(r);
    g_.validate();
    return std::move(g_);
  }

 private:
  [[noreturn]] void err(const std::string& what) const {
    int line = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) line += t_[k] == '\n';
    throw InvalidRequest(fmt::format("grammar: {} at line {}", what, line));
  }
  bool eof() const { return i_ >= t_.size(); }
  char peek(size_t k = 0) const { return i_ + k < t_.size() ? t_[i_ + k] : '\0'; }

  void skip_ws() {
    while (!eof()) {
      char c = peek();
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i_;
      } else if ((!lark_ && c == '#') || (lark_ && c == '/' && peek(1) == '/')) {
        while (!eof() && peek() != '\n') ++i_;
      } else if (lark_ && c == '%' && line_start()) {
        directive();
      } else {
        break;
      }
    }
  }
  bool line_start() const {
    for (size_t k = i_; k-- > 0;) {
      if (t_[k] == '\n') return true;
      if (!std::isspace(static_cast<unsigned char>(t_[k]))) return false;
    }
    return true;
  }

  // Lark terminals are UPPERCASE names (after any leading '_'); rules are lowercase.
  static bool is_terminal(const std::string& name) {
    for (char c : name)
      if (std::isalpha(static_cast<unsigned char>(c))) return std::isupper(static_cast<unsigned char>(c));
    return false;
  }

  // %ignore X (a terminal name, "literal" or /regex/), every one in the text, before the rules are
  // read: ignore_ = (X | Y ...)*.
  void collect_ignores() {
    std::vector<int> alts;
    size_t pos = 0;
    while (pos < t_.size()) {
      size_t e = t_.find('\n', pos);
      std::string_view line = t_.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos);
      const size_t line_at = pos;
      pos = e == std::string_view::npos ? t_.size() : e + 1;
      size_t f = line.find_first_not_of(" \t");
      if (f == std::string_view::npos || line.substr(f, 7) != "%ignore") continue;
      // Parse the operand as an item of a rule (a name, a literal, a regex, a group).
      const size_t save = i_;
      i_ = line_at + f + 7;
      while (peek() == ' ' || peek() == '\t') ++i_;
      alts.push_back(parse_postfix(parse_atom(1)));
      i_ = save;
    }
    if (!alts.empty()) ignore_ = g_.star(alts.size() == 1 ? alts[0] : g_.alt(alts));
  }

  // %import common.NAME [-> ALIAS] / %import common (A, B); %ignore (read by collect_ignores).
  void directive() {
    size_t e = t_.find('\n', i_);
    std::string line(t_.substr(i_, e == std::string_view::npos ? std::string_view::npos : e - i_));
    if (line.rfind("%ignore", 0) == 0) {
      i_ = e == std::string_view::npos ? t_.size() : e;
      return;
    }
    if (line.rfind("%import", 0) != 0) err("unknown directive " + line.substr(0, line.find(' ')));
    std::string rest = line.substr(7);
    if (size_t open = rest.find("common"); open != std::string::npos && rest.find('(', open) != std::string::npos &&
                                           rest.find("common.") == std::string::npos) {
      size_t a = rest.find('(', open), b = rest.find(')', a);
      if (b == std::string::npos) err("%import common (...) without ')'");
      std::string list = rest.substr(a + 1, b - a - 1), item;
      for (size_t k = 0; k <= list.size(); ++k) {
        if (k == list.size() || list[k] == ',') {
          while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
          size_t sp = item.find_first_not_of(" \t");
          if (sp != std::string::npos) define_common(item.substr(sp), item.substr(sp));
          item.clear();
        } else {
          item += list[k];
        }
      }
      i_ = e == std::string_view::npos ? t_.size() : e;
      return;
    }
    size_t dot = rest.find("common.");
    if (dot == std::string::npos) err("only %import common.NAME and %import common (NAME, ...) are supported");
    std::string name = rest.substr(dot + 7);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    std::string alias = name;
    if (size_t a = name.find("->"); a != std::string::npos) {
      alias = name.substr(a + 2);
      name = name.substr(0, a);
      auto trim = [](std::string& s) {
        while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
        while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
      };
      trim(name), trim(alias);
    }
    define_common(name, alias);
    i_ = e == std::string_view::npos ? t_.size() : e;
  }

  void define_common(const std::string& name, const std::string& alias) {
    static const std::pair<const char*, const char*> kCommon[] = {
        {"DIGIT", "[0-9]"}, {"HEXDIGIT", "[0-9a-fA-F]"}, {"INT", "[0-9]+"}, {"SIGNED_INT", "[+-]?[0-9]+"},
        // lark/grammars/common.lark: DECIMAL: INT "." INT? | "." INT; FLOAT: INT _EXP | DECIMAL _EXP?;
        // NUMBER: FLOAT | INT.
        {"DECIMAL", "[0-9]+\\.[0-9]*|\\.[0-9]+"},
        {"FLOAT", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?"},
        {"SIGNED_FLOAT", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?)"},
        {"NUMBER", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+"},
        {"SIGNED_NUMBER", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+)"},
        {"LETTER", "[a-zA-Z]"}, {"LCASE_LETTER", "[a-z]"}, {"UCASE_LETTER", "[A-Z]"}, {"WORD", "[a-zA-Z]+"},
        {"CNAME", "[a-zA-Z_][a-zA-Z0-9_]*"}, {"WS", "[ \\t\\f\\r\\n]+"}, {"WS_INLINE", "[ \\t]+"},
        {"NEWLINE", "(\\r?\\n)+"}, {"CR", "\\r"}, {"LF", "\\n"},
        // ESCAPED_STRING: "\"" /.*?/ /(?<!\\)(\\\\)*?/ "\"": no raw newline (Lark's . excludes it),
        // no unescaped quote inside.
        {"ESCAPED_STRING", "\"([^\"\\\\\\n]|\\\\[^\\n])*\""}, {"SH_COMMENT", "#[^\\n]*"},
        {"CPP_COMMENT", "//[^\\n]*"}, {"C_COMMENT", "/\\*([^*]|\\*+[^*/])*\\*+/"}};
    for (auto [n, re] : kCommon)
      if (name == n) {
        g_.define(g_.rule(alias), add_regex(g_, re));
        return;
      }
    err("unknown terminal common." + name);
  }

  // At `name ::=` (GBNF) or `[?!]name[.N]:` (Lark)? Consumes it when so.
  bool at_definition(std::string* name) {
    size_t k = i_;
    if (lark_ && k < t_.size() && (t_[k] == '?' || t_[k] == '!')) ++k;
    size_t s = k;
    while (k < t_.size() && name_char(t_[k]) && t_[k] != '.') ++k;
    if (k == s) return false;
    std::string n(t_.substr(s, k - s));
    if (lark_ && k < t_.size() && t_[k] == '.') {  // priority NAME.2
      ++k;
      while (k < t_.size() && std::isdigit(static_cast<unsigned char>(t_[k]))) ++k;
    }
    while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t')) ++k;
    if (lark_) {
      if (k >= t_.size() || t_[k] != ':' || (k + 1 < t_.size() && t_[k + 1] == ':')) return false;
      k += 1;
    } else {
      if (t_.substr(k, 3) != "::=") return false;
      k += 3;
    }
    if (name) *name = n, i_ = k;
    return true;
  }

  // Groups nest at most this deep: the parser recurses per level (20,000 levels overflowed a
  // server thread's stack), and no real grammar comes near.
  static constexpr int kMaxDepth = 1000;

  int parse_alt(int depth) {
    if (depth > kMaxDepth) err(fmt::format("groups nested more than {} deep", kMaxDepth));
    std::vector<int> alts = {parse_seq(depth)};
    while (true) {
      skip_ws();
      if (peek() != '|') break;
      ++i_;
      alts.push_back(parse_seq(depth));
    }
    return g_.alt(std::move(alts));
  }

  int parse_seq(int depth) {
    std::vector<int> items;
    while (true) {
      skip_ws();
      if (eof()) break;
      char c = peek();
      if (c == '|' || c == ')' || (lark_ && c == ']')) break;
      if (depth == 0 && at_definition(nullptr)) break;
      if (lark_ && c == '-' && peek(1) == '>') {  // alias: ignored
        i_ += 2;
        skip_ws();
        while (!eof() && name_char(peek())) ++i_;
        continue;
      }
      int item = parse_postfix(parse_atom(depth));
      if (interleave_ && !items.empty()) items.push_back(ignore_);
      items.push_back(item);
    }
    return g_.seq(std::move(items));
  }

  uint32_t hexval(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      char c = peek();
      if (!std::isxdigit(static_cast<unsigned char>(c))) err("bad hex escape");
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
      ++i_;
    }
    return v;
  }

  uint32_t read_char() {  // one code point, escapes resolved
    if (eof()) err("unexpected end of grammar");
    unsigned char c = static_cast<unsigned char>(t_[i_++]);
    if (c == '\\') {
      if (eof()) err("trailing backslash");
      char e = t_[i_++];
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case 'f': return '\f';
        case '0': return 0;
        case 'x': return hexval(2);
        case 'u': return hexval(4);
        case 'U': return hexval(8);
        default: return static_cast<unsigned char>(e);
      }
    }
    if (c < 0x80) return c;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = c & (0x3F >> n);
    for (int k = 0; k < n && !eof(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(t_[i_++]) & 0x3F);
    return cp;
  }

  int parse_atom(int depth) {
    char c = peek();
    if (c == '"' || (lark_ && c == '\'')) {
      char q = c;
      ++i_;
      std::string s;
      std::vector<uint32_t> cps;
      while (true) {
        if (eof() || peek() == '\n') err("unterminated string literal");
        if (peek() == q) break;
        uint32_t cp = read_char();
        cps.push_back(cp);
        append_utf8(s, cp);
      }
      ++i_;
      if (lark_ && peek() == '.' && peek(1) == '.' && (peek(2) == '"' || peek(2) == '\'')) {  // "a".."z"
        i_ += 2;
        const char q2 = peek();
        ++i_;
        uint32_t hi = read_char();
        if (peek() != q2) err("a range's ends must be single characters (\"a\"..\"z\")");
        ++i_;
        if (cps.size() != 1 || hi < cps[0]) err("bad character range");
        return g_.chars({{cps[0], hi}});
      }
      if (lark_ && peek() == 'i') {  // case-insensitive literal
        ++i_;
        std::vector<int> items;
        for (uint32_t cp : cps) {
          if (cp < 0x80 && std::isalpha(static_cast<int>(cp)))
            items.push_back(g_.chars({{uint32_t(std::tolower(int(cp))), uint32_t(std::tolower(int(cp)))},
                                      {uint32_t(std::toupper(int(cp))), uint32_t(std::toupper(int(cp)))}}));
          else {
            std::string one;
            append_utf8(one, cp);
            items.push_back(g_.lit(one));
          }
        }
        return g_.seq(std::move(items));
      }
      return g_.lit(s);
    }
    if (c == '[' && !lark_) {
      ++i_;
      bool neg = false;
      if (peek() == '^') neg = true, ++i_;
      Ranges r;
      while (true) {
        if (eof()) err("unterminated character class");
        if (peek() == ']') break;
        uint32_t lo = read_char(), hi = lo;
        if (peek() == '-' && peek(1) != ']') {
          ++i_;
          hi = read_char();
          if (hi < lo) err("range out of order in character class");
        }
        r.push_back({lo, hi});
      }
      ++i_;
      if (r.empty() && !neg) err("empty character class");
      return g_.chars(std::move(r), neg);
    }
    if (c == '[' && lark_) {  // [optional]
      ++i_;
      int e = parse_alt(depth + 1);
      skip_ws();
      if (peek() != ']') err("missing ']'");
      ++i_;
      return g_.opt(e);
    }
    if (c == '/' && lark_) {
      ++i_;
      std::string re;
      while (true) {
        if (eof() || peek() == '\n') err("unterminated /regex/");
        if (peek() == '/') break;
        if (peek() == '\\' && peek(1) == '/') {
          re += '/';
          i_ += 2;
          continue;
        }
        if (peek() == '\\') re += t_[i_++];
        re += t_[i_++];
      }
      ++i_;
      bool icase = false;
      while (std::isalpha(static_cast<unsigned char>(peek()))) {
        if (peek() == 'i') icase = true;
        else if (peek() != 'x' && peek() != 's' && peek() != 'u') err(fmt::format("unsupported regex flag '{}'", peek()));
        ++i_;
      }
      return add_regex(g_, re, false, icase);
    }
    if (c == '(') {
      ++i_;
      int e = parse_alt(depth + 1);
      skip_ws();
      if (peek() != ')') err("missing ')'");
      ++i_;
      return e;
    }
    if (c == '.' && !lark_) {  // llama.cpp: any character, newlines included
      ++i_;
      return g_.chars({{0, kMaxCodePoint}});
    }
    if (name_char(c)) {
      size_t s = i_;
      while (!eof() && name_char(peek()) && !(lark_ && peek() == '.')) ++i_;
      return g_.ref(g_.rule(std::string(t_.substr(s, i_ - s))));
    }
    err(fmt::format("unexpected '{}'", c));
  }

  // e{lo,hi}; with %ignore in a rule, the ignored text may stand between the copies.
  int repeat(int e, int lo, int hi) {
    if (!interleave_) return g_.rep(e, lo, hi);
    if (hi == 0) return g_.empty();
    int more = g_.rep(g_.seq({ignore_, e}), std::max(lo - 1, 0), hi < 0 ? -1 : hi - 1);
    int some = g_.seq({e, more});
    return lo == 0 ? g_.opt(some) : some;
  }

  int read_int() {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) err("expected a number");
    int v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (t_[i_++] - '0');
      if (v > 100000) err("repetition count too large");
    }
    return v;
  }

  // Blanks before an operator: llama.cpp and Lark allow them ("a" *, "a"{ 2, 3 }).
  void skip_blanks() {
    while (peek() == ' ' || peek() == '\t') ++i_;
  }

  int parse_postfix(int e) {
    while (true) {
      const size_t before = i_;
      skip_blanks();
      char c = peek();
      if (c == '*') ++i_, e = repeat(e, 0, -1);
      else if (c == '+') ++i_, e = repeat(e, 1, -1);
      else if (c == '?') ++i_, e = g_.opt(e);
      else if (c == '{' && !lark_) {
        ++i_;
        skip_blanks();
        int lo = read_int(), hi = lo;
        skip_blanks();
        if (peek() == ',') {
          ++i_;
          skip_blanks();
          hi = std::isdigit(static_cast<unsigned char>(peek())) ? read_int() : -1;
          skip_blanks();
        }
        if (peek() != '}') err("bad {m,n}");
        ++i_;
        if (hi >= 0 && hi < lo) err("{m,n} with n < m");
        e = repeat(e, lo, hi);
      } else if (c == '~' && lark_) {
        ++i_;
        int lo = read_int(), hi = lo;
        if (peek() == '.' && peek(1) == '.') {
          i_ += 2;
          hi = read_int();
        }
        if (hi < lo) err("~m..n with n < m");
        e = repeat(e, lo, hi);
      } else {
        i_ = before;  // the blanks belong to what follows
        return e;
      }
    }
  }

  std::string_view t_;
  bool lark_;
  size_t i_ = 0;
  Grammar g_;
  int ignore_ = -1;          // (%ignore X | Y ...)*, or -1
  bool interleave_ = false;  // inside a Lark rule (not a terminal) with %ignore
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return EbnfParser(text, false).parse(); }
Grammar parse_lark(std::string_view text) { return EbnfParser(text, true).parse(); }

Grammar parse_ebnf(std::string_view text) {
  // The first definition decides: `::=` is GBNF, a lone `:` Lark. Comment lines (# or //) and
  // directives (%import) before it do not count (`# note: ...` above a GBNF grammar).
  size_t pos = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    std::string_view line = text.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos);
    pos = e == std::string_view::npos ? text.size() : e + 1;
    size_t f = line.find_first_not_of(" \t\r");
    if (f == std::string_view::npos) continue;
    line.remove_prefix(f);
    if (line[0] == '#' || line[0] == '%' || line.substr(0, 2) == "//") continue;
    size_t d = line.find("::="), c = line.find(':');
    if (d != std::string_view::npos && d <= c) return parse_gbnf(text);
    if (c != std::string_view::npos) return parse_lark(text);
  }
  throw InvalidRequest("grammar: no rule definition found (expected `root ::= ...` or `start: ...`)");
}

}  // namespace ts::grammar
