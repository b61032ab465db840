// Python operators, str/dict/list methods, and the filters, tests and globals that chat templates
// use, each following the behaviour (and error text) of CPython / jinja2 3.1 as closely as the
// rendered prompt can observe.
#include <wctype.h>

#include <algorithm>
#include <charconv>
#include <clocale>
#include <cmath>
#include <cstring>
#include <locale.h>
#include <unordered_map>

#include <fmt/format.h>

#include "chat/jinja_interp.h"

namespace ts::chat::jinja {
namespace {

[[noreturn]] void value_error(std::string msg) { throw JinjaError("ValueError", std::move(msg)); }

bool int_like(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Bool; }
int64_t ival(const Value& v) { return v.kind == Kind::Bool ? int64_t(v.b) : v.i; }

int64_t need_int(const Value* v, const char* what, int64_t dflt) {
  if (!v || v->is_none()) return dflt;
  if (v->is_undefined()) undefined_error(*v);
  if (!int_like(*v))
    type_error(fmt::format("'{}' object cannot be interpreted as an integer ({})", type_name(*v), what));
  return ival(*v);
}

// --- Unicode case mapping and classes -----------------------------------------------------------------

locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
    if (!l) l = newlocale(LC_CTYPE_MASK, "en_US.UTF-8", locale_t(0));
    return l;
  }();
  return loc;
}
bool escaped_byte(uint32_t c) { return c >= 0xdc80 && c <= 0xdcff; }
uint32_t cp_upper(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  locale_t l = utf8_locale();
  return l && !escaped_byte(c) ? uint32_t(towupper_l(wint_t(c), l)) : c;
}
uint32_t cp_lower(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  locale_t l = utf8_locale();
  return l && !escaped_byte(c) ? uint32_t(towlower_l(wint_t(c), l)) : c;
}
bool cp_alpha(uint32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  locale_t l = utf8_locale();
  return l && !escaped_byte(c) && iswalpha_l(wint_t(c), l);
}
bool cp_digit(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  locale_t l = utf8_locale();
  return l && !escaped_byte(c) && iswdigit_l(wint_t(c), l);
}
bool cp_alnum(uint32_t c) { return cp_alpha(c) || cp_digit(c); }
bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c; }

// Python applies Unicode's full case mappings, where one character can become several
// (SpecialCasing.txt); towupper() only knows the one-to-one ones. These are the unconditional
// multi-character mappings of the Latin, Greek and Armenian letters and ligatures.
const char* special_upper(uint32_t c, bool title) {
  switch (c) {
    case 0xdf: return title ? "Ss" : "SS";
    case 0x149: return "\u02bcN";
    case 0x1f0: return title ? "J\u030c" : "J\u030c";
    case 0x390: return "\u0399\u0308\u0301";
    case 0x3b0: return "\u03a5\u0308\u0301";
    case 0x587: return title ? "\u0535\u0582" : "\u0535\u0552";
    case 0xfb00: return title ? "Ff" : "FF";
    case 0xfb01: return title ? "Fi" : "FI";
    case 0xfb02: return title ? "Fl" : "FL";
    case 0xfb03: return title ? "Ffi" : "FFI";
    case 0xfb04: return title ? "Ffl" : "FFL";
    case 0xfb05:
    case 0xfb06: return title ? "St" : "ST";
    default: return nullptr;
  }
}
void put_upper(std::string& out, uint32_t c) {
  if (const char* s = c >= 0xdf ? special_upper(c, false) : nullptr)
    out += s;
  else
    encode_utf8(out, cp_upper(c));
}
void put_lower(std::string& out, uint32_t c) {
  if (c == 0x130)
    out += "i\u0307";  // İ lowers to i + combining dot above
  else
    encode_utf8(out, cp_lower(c));
}
// Titlecase: like upper except for ligatures and the DŽ/LJ/NJ/DZ digraphs, which have title forms.
void put_title(std::string& out, uint32_t c) {
  if (c >= 0x1c4 && c <= 0x1cc) {
    encode_utf8(out, 0x1c5 + 3 * ((c - 0x1c4) / 3));
  } else if (c >= 0x1f1 && c <= 0x1f3) {
    encode_utf8(out, 0x1f2);
  } else if (const char* s = c >= 0xdf ? special_upper(c, true) : nullptr) {
    out += s;
  } else {
    encode_utf8(out, cp_upper(c));
  }
}
template <class F>
std::string map_cps(std::string_view s, F put) {
  std::string out;
  out.reserve(s.size());
  for (size_t p = 0; p < s.size();) put(out, decode_utf8(s, p));
  return out;
}
std::string str_upper(std::string_view s) { return map_cps(s, put_upper); }
std::string str_lower(std::string_view s) { return map_cps(s, put_lower); }

// str.islower()/isupper(): at least one cased character, and all cased characters in that case.
bool py_iscase(std::string_view s, bool upper) {
  bool any_cased = false;
  for (size_t p = 0; p < s.size();) {
    uint32_t c = decode_utf8(s, p);
    if (!cp_cased(c)) continue;
    any_cased = true;
    if ((upper ? cp_upper(c) : cp_lower(c)) != c) return false;
  }
  return any_cased;
}

std::string encode(const std::vector<uint32_t>& cps, size_t from = 0, size_t to = std::string::npos) {
  std::string out;
  to = std::min(to, cps.size());
  for (size_t k = from; k < to; ++k) encode_utf8(out, cps[k]);
  return out;
}

// Python str.capitalize(): first character upper, the rest lower.
std::string str_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (size_t p = 0; p < s.size();) {
    uint32_t c = decode_utf8(s, p);
    if (first)
      put_title(out, c);
    else
      put_lower(out, c);
    first = false;
  }
  return out;
}

// Python str.title(): a letter following a cased letter is lowered, any other letter is raised.
std::string str_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t p = 0; p < s.size();) {
    uint32_t c = decode_utf8(s, p);
    bool cased = cp_cased(c);
    if (!cased)
      encode_utf8(out, c);
    else if (prev_cased)
      put_lower(out, c);
    else
      put_title(out, c);
    prev_cased = cased;
  }
  return out;
}

// --- str helpers ----------------------------------------------------------------------------------

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (size_t p = 0; p < s.size(); ++n) decode_utf8(s, p);
  return n;
}

std::string strip(std::string_view s, const Value* chars, bool left, bool right) {
  auto cps = to_codepoints(s);
  std::vector<uint32_t> set;
  bool ws = !chars || chars->is_none();
  if (!ws) {
    if (chars->is_undefined()) undefined_error(*chars);
    if (!chars->is_string()) type_error("strip arg must be None or str");
    set = to_codepoints(chars->str());
  }
  auto drop = [&](uint32_t c) { return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && drop(cps[a])) ++a;
  if (right)
    while (b > a && drop(cps[b - 1])) --b;
  if (a == 0 && b == cps.size()) return std::string(s);
  return encode(cps, a, b);
}

std::vector<Value> split_ws(std::string_view s, int64_t maxsplit) {
  auto cps = to_codepoints(s);
  std::vector<Value> out;
  size_t k = 0, n = cps.size();
  while (true) {
    while (k < n && is_py_space(cps[k])) ++k;
    if (k == n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = n;
      out.push_back(Value::string(encode(cps, k, e)));
      break;
    }
    size_t e = k;
    while (e < n && !is_py_space(cps[e])) ++e;
    out.push_back(Value::string(encode(cps, k, e)));
    k = e;
  }
  return out;
}

std::vector<Value> rsplit_ws(std::string_view s, int64_t maxsplit) {
  auto cps = to_codepoints(s);
  std::vector<Value> out;
  size_t k = cps.size();
  while (true) {
    while (k > 0 && is_py_space(cps[k - 1])) --k;
    if (k == 0) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.push_back(Value::string(encode(cps, 0, k)));
      break;
    }
    size_t b = k;
    while (b > 0 && !is_py_space(cps[b - 1])) --b;
    out.push_back(Value::string(encode(cps, b, k)));
    k = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<Value> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) value_error("empty separator");
  std::vector<Value> out;
  size_t start = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    size_t at = s.find(sep, start);
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(start, at - start)));
    start = at + sep.size();
  }
  out.push_back(Value::string(s.substr(start)));
  return out;
}

std::vector<Value> rsplit_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) value_error("empty separator");
  std::vector<Value> out;
  size_t end = s.size();
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(at + sep.size(), end - at - sep.size())));
    end = at;
  }
  out.push_back(Value::string(s.substr(0, end)));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement around every character.
    auto cps = to_codepoints(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (k < cps.size()) encode_utf8(out, cps[k]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += rep;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::string line;
  for (size_t p = 0; p < s.size();) {
    size_t start = p;
    uint32_t c = decode_utf8(s, p);
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
               c == 0x2028 || c == 0x2029;
    if (!brk) {
      line.append(s.substr(start, p - start));
      continue;
    }
    std::string end(s.substr(start, p - start));
    if (c == '\r' && p < s.size() && s[p] == '\n') {
      end += '\n';
      ++p;
    }
    if (keepends) line += end;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

// Python's str.center/ljust/rjust padding (center puts the odd space on the left when width is odd).
// 'c' is format()'s centering ('{:^7}'), which always puts the odd space on the right.
std::string pad(const std::string& s, int64_t width, char align, const std::string& fill = " ") {
  int64_t len = int64_t(cp_count(s));
  if (width <= len) return s;
  check_size(uint64_t(width) * fill.size());
  int64_t marg = width - len, left = 0;
  if (align == '^')
    left = marg / 2 + (marg & width & 1);
  else if (align == 'c')
    left = marg / 2;
  else if (align == '>')
    left = marg;
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

// Byte offset -> code point index, for find()/index() results.
int64_t cp_index(const std::string& s, size_t byte) { return int64_t(cp_count(std::string_view(s).substr(0, byte))); }

// Python's optional start/end arguments of find/count/startswith, as a byte range of s.
std::pair<size_t, size_t> sub_range(const std::string& s, const Value* start, const Value* end) {
  if ((!start || start->is_none()) && (!end || end->is_none())) return {0, s.size()};
  auto cps = to_codepoints(s);
  int64_t n = int64_t(cps.size());
  auto norm = [&](const Value* v, int64_t d) {
    if (!v || v->is_none()) return d;
    int64_t x = need_int(v, "slice index", d);
    if (x < 0) x += n;
    return std::clamp<int64_t>(x, 0, n);
  };
  int64_t a = norm(start, 0), b = norm(end, n);
  size_t ba = encode(cps, 0, size_t(a)).size();
  size_t bb = b < a ? ba : encode(cps, 0, size_t(b)).size();
  return {ba, bb};
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// --- printf-style `%` and str.format ------------------------------------------------------------------

int64_t to_int_for_format(const Value& v, char conv) {
  if (int_like(v)) return ival(v);
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f)) throw JinjaError("OverflowError", "cannot convert float infinity to integer");
    return int64_t(v.f);
  }
  if (v.is_undefined()) undefined_error(v);
  type_error(fmt::format("%{} format: a real number is required, not {}", conv, type_name(v)));
}

double to_float_for_format(const Value& v, char conv) {
  if (v.is_number()) return v.as_double();
  if (v.is_undefined()) undefined_error(v);
  type_error(fmt::format("%{} format: a real number is required, not {}", conv, type_name(v)));
}

template <class T>
std::string cformat(const std::string& spec, T x) {
  int n = std::snprintf(nullptr, 0, spec.c_str(), x);
  if (n < 0) value_error("invalid format");
  check_size(uint64_t(n));
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec.c_str(), x);
  out.resize(size_t(n));
  return out;
}

Value percent_format(const std::string& f, const Value& args) {
  std::vector<Value> list;
  const DictObj* mapping = args.is_dict() ? &args.dct() : nullptr;
  // Python treats any non-tuple argument with __getitem__ (dict, list, jinja2's Undefined) as a
  // possible mapping and then does not complain about unused arguments.
  bool mapping_like = args.is_dict() || args.is_undefined() || (args.is_list() && !args.lst().tuple);
  if (args.is_list() && args.lst().tuple)
    list = args.lst().items;
  else
    list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] != '%') {
      out += f[k];
      continue;
    }
    if (++k >= f.size()) value_error("incomplete format");
    const Value* arg = nullptr;
    if (f[k] == '(') {
      size_t close = f.find(')', k);
      if (close == std::string::npos) value_error("incomplete format key");
      if (!mapping) type_error("format requires a mapping");
      arg = mapping->find(std::string_view(f).substr(k + 1, close - k - 1));
      if (!arg) throw JinjaError("KeyError", py_str_repr(f.substr(k + 1, close - k - 1)));
      k = close + 1;
    }
    std::string flags;
    while (k < f.size() && std::strchr("-+ #0", f[k])) flags += f[k++];
    std::string width, prec;
    while (k < f.size() && f[k] >= '0' && f[k] <= '9') width += f[k++];
    bool has_prec = false;
    if (k < f.size() && f[k] == '.') {
      has_prec = true;
      ++k;
      while (k < f.size() && f[k] >= '0' && f[k] <= '9') prec += f[k++];
    }
    while (k < f.size() && std::strchr("hlL", f[k])) ++k;
    if (k >= f.size()) value_error("incomplete format");
    char conv = f[k];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (next >= list.size()) type_error("not enough arguments for format string");
      arg = &list[next++];
    }
    std::string spec = "%" + flags + width + (has_prec ? "." + (prec.empty() ? std::string("0") : prec) : "");
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s;
        if (conv == 's')
          append_str(s, *arg);
        else
          append_repr(s, *arg);
        if (has_prec) {
          auto cps = to_codepoints(s);
          size_t n = prec.empty() ? 0 : size_t(std::stoul(prec));
          if (n < cps.size()) s = encode(cps, 0, n);
        }
        int64_t w = width.empty() ? 0 : std::stoll(width);
        out += pad(s, w, flags.find('-') != std::string::npos ? '<' : '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u': out += cformat(spec + "lld", (long long)to_int_for_format(*arg, conv)); break;
      case 'x':
      case 'X':
      case 'o': out += cformat(spec + "ll" + conv, (long long)to_int_for_format(*arg, conv)); break;
      case 'c': {
        if (arg->is_string() && cp_count(arg->str()) == 1) {
          out += arg->str();
        } else {
          std::string s;
          encode_utf8(s, uint32_t(to_int_for_format(*arg, conv)));
          out += s;
        }
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': out += cformat(spec + conv, to_float_for_format(*arg, conv)); break;
      default: value_error(fmt::format("unsupported format character '{}'", conv));
    }
  }
  if (!mapping_like && next < list.size()) type_error("not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

// format(value, spec) for str.format: [[fill]align][sign][#][0][width][,_][.precision][type].
std::string format_value(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  auto cps = to_codepoints(spec);
  size_t k = 0;
  std::string fill = " ";
  char align = 0;
  auto is_align = [](uint32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    fill.clear();
    encode_utf8(fill, cps[0]);
    align = char(cps[1]);
    k = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    align = char(cps[0]);
    k = 1;
  }
  if (align == '^') align = 'c';
  char sign = '-';
  if (k < cps.size() && (cps[k] == '+' || cps[k] == '-' || cps[k] == ' ')) sign = char(cps[k++]);
  bool alt = false;
  if (k < cps.size() && cps[k] == '#') alt = true, ++k;
  if (k < cps.size() && cps[k] == '0') {
    if (!align) fill = "0", align = '=';
    ++k;
  }
  int64_t width = 0;
  while (k < cps.size() && cps[k] >= '0' && cps[k] <= '9') {
    width = width * 10 + (cps[k++] - '0');
    check_size(uint64_t(width));
  }
  char group = 0;
  if (k < cps.size() && (cps[k] == ',' || cps[k] == '_')) group = char(cps[k++]);
  int prec = -1;
  if (k < cps.size() && cps[k] == '.') {
    prec = 0;
    ++k;
    while (k < cps.size() && cps[k] >= '0' && cps[k] <= '9') prec = prec * 10 + int(cps[k++] - '0');
  }
  char type = k < cps.size() ? char(cps[k++]) : 0;
  if (k != cps.size()) value_error("Invalid format specifier");

  std::string body, prefix;
  if (v.is_string() || (!v.is_number() && !type)) {
    if (type && type != 's') value_error(fmt::format("Unknown format code '{}' for object of type 'str'", type));
    if (v.is_list() || v.is_dict() || v.is_none())  // object.__format__ accepts only an empty spec
      type_error(fmt::format("unsupported format string passed to {}.__format__", type_name(v)));
    body = to_str(v);
    if (prec >= 0) {
      auto b = to_codepoints(body);
      if (size_t(prec) < b.size()) body = encode(b, 0, size_t(prec));
    }
    return pad(body, width, align ? align : '<', fill);
  }
  bool is_float = v.kind == Kind::Float || (type && std::strchr("eEfFgG%", type));
  double d = v.as_double();
  bool neg;
  if (!is_float) {
    if (type && !std::strchr("dbxXoc", type)) value_error(fmt::format("Unknown format code '{}' for int", type));
    if (!type && v.kind == Kind::Bool) return pad(to_str(v), width, align ? align : '<', fill);
    int64_t x = ival(v);
    neg = x < 0;
    uint64_t u = neg ? uint64_t(0) - uint64_t(x) : uint64_t(x);
    switch (type) {
      case 'b':
        body = fmt::format("{:b}", u);
        prefix = alt ? "0b" : "";
        break;
      case 'o':
        body = fmt::format("{:o}", u);
        prefix = alt ? "0o" : "";
        break;
      case 'x':
        body = fmt::format("{:x}", u);
        prefix = alt ? "0x" : "";
        break;
      case 'X':
        body = fmt::format("{:X}", u);
        prefix = alt ? "0X" : "";
        break;
      case 'c': encode_utf8(body, uint32_t(u)); break;
      default: body = fmt::format("{}", u);
    }
  } else {
    neg = std::signbit(d) && !std::isnan(d);
    double a = std::fabs(d);
    if (type == '%') a *= 100;
    if (!type) {
      body = prec < 0 ? py_float_repr(a) : cformat(fmt::format("%.{}g", std::max(prec, 1)), a);
    } else {
      char t = type == '%' ? 'f' : type;
      body = cformat(fmt::format("%{}.{}{}", alt ? "#" : "", prec < 0 ? 6 : prec, t), a);
      if (type == '%') body += '%';
    }
  }
  if (group) {
    size_t dot = body.find_first_not_of("0123456789");
    std::string ip = body.substr(0, dot), rest = dot == std::string::npos ? "" : body.substr(dot);
    std::string g;
    for (size_t n = 0; n < ip.size(); ++n) {
      if (n && (ip.size() - n) % 3 == 0) g += group;
      g += ip[n];
    }
    body = g + rest;
  }
  std::string sgn = neg ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
  if (align == '=') {
    int64_t len = int64_t(cp_count(sgn + prefix + body));
    std::string padding;
    for (int64_t n = len; n < width; ++n) padding += fill;
    return sgn + prefix + padding + body;
  }
  return pad(sgn + prefix + body, width, align ? align : '>', fill);
}

Value str_format(Interp& in, const std::string& f, const Args& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    char c = f[k];
    if (c == '}') {
      if (k + 1 < f.size() && f[k + 1] == '}') {
        out += '}';
        ++k;
        continue;
      }
      value_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < f.size() && f[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t close = k + 1;
    int nest = 0;
    while (close < f.size() && !(f[close] == '}' && nest == 0)) {
      if (f[close] == '{') ++nest;
      if (f[close] == '}') --nest;
      ++close;
    }
    if (close >= f.size()) value_error("expected '}' before end of string");
    std::string field = f.substr(k + 1, close - k - 1);
    k = close;
    std::string spec, conv;
    size_t colon = field.find(':');
    if (colon != std::string::npos) spec = field.substr(colon + 1), field.resize(colon);
    size_t bang = field.find('!');
    if (bang != std::string::npos) conv = field.substr(bang + 1), field.resize(bang);
    size_t e = field.find_first_of(".[");
    std::string head = field.substr(0, e);
    Value v;
    if (head.empty()) {
      if (auto_idx >= args.pos.size())
        throw JinjaError("IndexError",
                         fmt::format("Replacement index {} out of range for positional args tuple", auto_idx));
      v = args.pos[auto_idx++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      size_t i = std::stoul(head);
      if (i >= args.pos.size())
        throw JinjaError("IndexError", fmt::format("Replacement index {} out of range for positional args tuple", i));
      v = args.pos[i];
    } else {
      const Value* kv = args.kwarg(head);
      if (!kv) throw JinjaError("KeyError", py_str_repr(head));
      v = *kv;
    }
    while (e != std::string::npos && e < field.size()) {
      if (field[e] == '.') {
        size_t n = field.find_first_of(".[", e + 1);
        v = in.getattr(v, field.substr(e + 1, n == std::string::npos ? std::string::npos : n - e - 1));
        e = n;
      } else {
        size_t n = field.find(']', e);
        if (n == std::string::npos) value_error("Missing ']' in format string");
        std::string key = field.substr(e + 1, n - e - 1);
        bool num = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = in.getitem(v, num ? Value::integer(std::stoll(key)) : Value::string(key));
        e = n + 1;
        if (e >= field.size()) break;
      }
    }
    if (v.is_undefined()) undefined_error(v);
    if (conv == "r" || conv == "a") {
      std::string r;
      append_repr(r, v);
      v = Value::string(std::move(r));
    } else if (conv == "s") {
      v = Value::string(to_str(v));
    } else if (!conv.empty()) {
      value_error("Unknown conversion specifier " + conv);
    }
    out += format_value(v, spec);
  }
  return Value::string(std::move(out));
}

// --- bound methods and small callables ------------------------------------------------------------

struct BoundMethod : Callable {
  BoundMethod(Value s, std::string_view n) : self(std::move(s)), name(n) {}
  const char* py_type() const override { return "builtin_function_or_method"; }
  void repr(std::string& out) const override {
    out += fmt::format("<built-in method {} of {} object>", name, type_name(self));
  }
  Value call(Interp& in, const Args& args) override { return call_method(in, self, name, args); }
  Value self;
  std::string name;
};

using GlobalFn = Value (*)(Interp&, const Args&);
struct BuiltinFn : Callable {
  BuiltinFn(const char* n, GlobalFn f) : name(n), fn(f) {}
  const char* py_type() const override { return "function"; }
  void repr(std::string& out) const override { out += fmt::format("<function {}>", name); }
  Value call(Interp& in, const Args& args) override { return fn(in, args); }
  const char* name;
  GlobalFn fn;
};

struct JoinerObj : Callable {
  explicit JoinerObj(std::string s) : sep(std::move(s)) {}
  const char* py_type() const override { return "Joiner"; }
  const char* py_module() const override { return "jinja2.utils"; }
  void repr(std::string& out) const override { out += "<jinja2.utils.Joiner object>"; }
  Value call(Interp&, const Args&) override {
    if (!used) {
      used = true;
      return Value::string("");
    }
    return Value::string(sep);
  }
  std::string sep;
  bool used = false;
};

Value dict_items(const Value& d) {
  std::vector<Value> items;
  items.reserve(d.dct().items.size());
  for (auto& [k, v] : d.dct().items) items.push_back(Value::list({k, v}, true));
  return Value::list(std::move(items));
}

const std::string_view kStrMethods[] = {
    "capitalize", "casefold",   "center",    "count",    "endswith",   "find",      "format",       "index",
    "isalnum",    "isalpha",    "isdecimal", "isdigit",  "islower",    "isnumeric", "isspace",      "istitle",
    "isupper",    "join",       "ljust",     "lower",    "lstrip",     "partition", "removeprefix", "removesuffix",
    "replace",    "rfind",      "rindex",    "rjust",    "rpartition", "rsplit",    "rstrip",       "split",
    "splitlines", "startswith", "strip",     "swapcase", "title",      "upper",     "zfill"};

bool prefix_match(const Value& self, const Args& args, bool ends) {
  auto b = bind_args(args, {"prefix", "start", "end"}, ends ? "endswith" : "startswith");
  if (!b[0]) type_error(fmt::format("{}() takes at least 1 argument (0 given)", ends ? "endswith" : "startswith"));
  const std::string& s = self.str();
  auto [lo, hi] = sub_range(s, b[1], b[2]);
  std::string_view view = std::string_view(s).substr(lo, hi - lo);
  auto test = [&](const Value& p) {
    if (p.is_undefined()) undefined_error(p);
    if (!p.is_string())
      type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", ends ? "endswith" : "startswith",
                             type_name(p)));
    const std::string& x = p.str();
    if (x.size() > view.size()) return false;
    return ends ? view.compare(view.size() - x.size(), x.size(), x) == 0 : view.compare(0, x.size(), x) == 0;
  };
  if (b[0]->is_list() && b[0]->lst().tuple) {
    for (auto& p : b[0]->lst().items)
      if (test(p)) return true;
    return false;
  }
  return test(*b[0]);
}

const std::string& need_str(const Value* v, const char* fname) {
  if (!v) type_error(fmt::format("{}() missing required argument", fname));
  if (v->is_undefined()) undefined_error(*v);
  if (!v->is_string()) type_error(fmt::format("must be str, not {}", type_name(*v)));
  return v->str();
}

Value str_method(Interp& in, const Value& self, std::string_view name, const Args& args) {
  const std::string& s = self.str();
  // Most str methods are positional-only in CPython: 'a'.strip(chars='a') is a TypeError.
  if (!args.kw.empty() && name != "split" && name != "rsplit" && name != "splitlines" && name != "format")
    type_error(fmt::format("str.{}() takes no keyword arguments", name));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto b = bind_args(args, {"chars"}, "strip");
    return Value::string(strip(s, b[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto b = bind_args(args, {"sep", "maxsplit"}, "split");
    int64_t maxsplit = need_int(b[1], "maxsplit", -1);
    bool ws = !b[0] || b[0]->is_none();
    if (name == "split")
      return Value::list(ws ? split_ws(s, maxsplit) : split_sep(s, need_str(b[0], "split"), maxsplit));
    return Value::list(ws ? rsplit_ws(s, maxsplit) : rsplit_sep(s, need_str(b[0], "rsplit"), maxsplit));
  }
  if (name == "startswith") return Value::boolean(prefix_match(self, args, false));
  if (name == "endswith") return Value::boolean(prefix_match(self, args, true));
  if (name == "upper") return Value::string(str_upper(s));
  if (name == "lower" || name == "casefold") return Value::string(str_lower(s));
  if (name == "title") return Value::string(str_title(s));
  if (name == "capitalize") return Value::string(str_capitalize(s));
  if (name == "swapcase")
    return Value::string(map_cps(s, [](std::string& out, uint32_t c) {
      if (cp_lower(c) != c)
        put_lower(out, c);
      else
        put_upper(out, c);
    }));
  if (name == "replace") {
    auto b = bind_args(args, {"old", "new", "count"}, "replace");
    return Value::string(replace(s, need_str(b[0], "replace"), need_str(b[1], "replace"), need_int(b[2], "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    auto b = bind_args(args, {"sub", "start", "end"}, std::string(name).c_str());
    const std::string& sub = need_str(b[0], "find");
    auto [lo, hi] = sub_range(s, b[1], b[2]);
    std::string_view view = std::string_view(s).substr(0, hi);
    if (name == "count") {
      if (sub.empty()) return Value::integer(int64_t(cp_count(view.substr(lo))) + 1);
      int64_t n = 0;
      for (size_t at = view.find(sub, lo); at != std::string_view::npos; at = view.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    size_t at = name[0] == 'r' ? view.rfind(sub) : view.find(sub, lo);
    if (at != std::string_view::npos && at < lo) at = std::string_view::npos;
    if (at == std::string_view::npos) {
      if (name == "index" || name == "rindex") value_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, at));
  }
  if (name == "join") {
    auto b = bind_args(args, {"iterable"}, "join");
    if (!b[0]) type_error("join() takes exactly one argument (0 given)");
    Value items = iterate(*b[0]);
    std::string out;
    size_t k = 0;
    for (auto& x : items.lst().items) {
      if (!x.is_string()) type_error(fmt::format("sequence item {}: expected str instance, {} found", k, type_name(x)));
      if (k++) out += s;
      out += x.str();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return str_format(in, s, args);
  if (name == "center" || name == "ljust" || name == "rjust") {
    auto b = bind_args(args, {"width", "fillchar"}, std::string(name).c_str());
    std::string fill = b[1] ? need_str(b[1], "center") : " ";
    if (cp_count(fill) != 1) type_error("The fill character must be exactly one character long");
    return Value::string(pad(s, need_int(b[0], "width", 0),
                             name == "center"  ? '^'
                             : name == "ljust" ? '<'
                                               : '>',
                             fill));
  }
  if (name == "zfill") {
    auto b = bind_args(args, {"width"}, "zfill");
    int64_t w = need_int(b[0], "width", 0), len = int64_t(cp_count(s));
    if (w <= len) return self;
    check_size(uint64_t(w));
    size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    return Value::string(s.substr(0, sign) + std::string(size_t(w - len), '0') + s.substr(sign));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto b = bind_args(args, {"affix"}, std::string(name).c_str());
    const std::string& a = need_str(b[0], "removeprefix");
    if (name == "removeprefix" && s.compare(0, a.size(), a) == 0) return Value::string(s.substr(a.size()));
    if (name == "removesuffix" && !a.empty() && s.size() >= a.size() &&
        s.compare(s.size() - a.size(), a.size(), a) == 0)
      return Value::string(s.substr(0, s.size() - a.size()));
    return self;
  }
  if (name == "partition" || name == "rpartition") {
    auto b = bind_args(args, {"sep"}, std::string(name).c_str());
    const std::string& sep = need_str(b[0], "partition");
    if (sep.empty()) value_error("empty separator");
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition" ? Value::list({self, Value::string(""), Value::string("")}, true)
                                 : Value::list({Value::string(""), Value::string(""), self}, true);
    }
    return Value::list({Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))},
                       true);
  }
  if (name == "splitlines") {
    auto b = bind_args(args, {"keepends"}, "splitlines");
    std::vector<Value> out;
    for (auto& l : splitlines(s, b[0] && truthy(*b[0]))) out.push_back(Value::string(std::move(l)));
    return Value::list(std::move(out));
  }
  bind_args(args, {}, std::string(name).c_str());
  auto cps = to_codepoints(s);
  auto all = [&](auto pred) { return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred)); };
  if (name == "isalnum") return all(cp_alnum);
  if (name == "isalpha") return all(cp_alpha);
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return all(cp_digit);
  if (name == "isspace") return all(is_py_space);
  if (name == "islower" || name == "isupper") return Value::boolean(py_iscase(s, name == "isupper"));
  if (name == "istitle")
    return Value::boolean(!cps.empty() && str_title(s) == s && cp_count(s) &&
                          std::any_of(cps.begin(), cps.end(), cp_cased));
  type_error(fmt::format("'str' object has no attribute '{}'", name));
}

}  // namespace

// --- shared helpers declared in jinja_interp.h ------------------------------------------------------

std::vector<const Value*> bind_args(const Args& args, std::initializer_list<const char*> params, const char* fname) {
  std::vector<const Value*> out(params.size(), nullptr);
  auto names = params.begin();
  if (args.pos.size() > params.size())
    type_error(fmt::format("{}() takes at most {} argument(s) ({} given)", fname, params.size(), args.pos.size()));
  for (size_t k = 0; k < args.pos.size(); ++k) out[k] = &args.pos[k];
  for (auto& [key, v] : args.kw) {
    size_t k = 0;
    while (k < params.size() && key != names[k]) ++k;
    if (k == params.size()) type_error(fmt::format("{}() got an unexpected keyword argument '{}'", fname, key));
    if (out[k]) type_error(fmt::format("{}() got multiple values for argument '{}'", fname, key));
    out[k] = &v;
  }
  return out;
}

Value iterate(const Value& v) {
  switch (v.kind) {
    case Kind::List: return v;
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dct().items.size());
      for (auto& [k, x] : v.dct().items) keys.push_back(k);
      return Value::list(std::move(keys));
    }
    case Kind::String: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      chars.reserve(s.size());
      for (size_t p = 0; p < s.size();) {
        size_t start = p;
        decode_utf8(s, p);
        chars.push_back(Value::string(s.substr(start, p - start)));
      }
      return Value::list(std::move(chars));
    }
    case Kind::Undefined: return Value::list({});
    default: type_error(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

bool contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Kind::String:
      if (!item.is_string())
        type_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return c.str().find(item.str()) != std::string::npos;
    case Kind::List:
      for (auto& x : c.lst().items)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict:
      if (item.is_list() && !item.lst().tuple) type_error("unhashable type: 'list'");
      if (item.is_dict()) type_error("unhashable type: 'dict'");
      return c.dct().find(item) != nullptr;
    case Kind::Undefined: return false;
    default: type_error(fmt::format("argument of type '{}' is not iterable", type_name(c)));
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto idx = [](const Value& v, bool* present) -> int64_t {
    *present = !v.is_none();
    if (!*present) return 0;
    if (!int_like(v)) type_error("slice indices must be integers or None or have an __index__ method");
    return ival(v);
  };
  bool has_a, has_b, has_c;
  int64_t a = idx(start, &has_a), b = idx(stop, &has_b), c = idx(step, &has_c);
  if (!has_c) c = 1;
  if (c == 0) value_error("slice step cannot be zero");
  std::vector<uint32_t> cps;
  bool str = obj.is_string();
  bool ascii = str && obj.sobj().ascii;
  if (str && !ascii) cps = to_codepoints(obj.str());
  int64_t n = str ? (ascii ? int64_t(obj.str().size()) : int64_t(cps.size())) : int64_t(obj.lst().items.size());
  auto adjust = [&](int64_t x, bool has, int64_t dflt, int64_t lo, int64_t hi) {
    if (!has) return dflt;
    if (x < 0) x += n;
    return std::clamp(x, lo, hi);
  };
  int64_t lo = c > 0 ? 0 : -1, hi = c > 0 ? n : n - 1;
  a = adjust(a, has_a, c > 0 ? lo : hi, lo, hi);
  b = adjust(b, has_b, c > 0 ? hi : lo, lo, hi);
  if (str) {
    const std::string& s = obj.str();
    if (ascii && c == 1) return Value::string(a < b ? s.substr(size_t(a), size_t(b - a)) : std::string());
    std::string out;
    for (int64_t k = a; c > 0 ? k < b : k > b; k += c) {
      if (ascii)
        out += s[size_t(k)];
      else
        encode_utf8(out, cps[size_t(k)]);
    }
    return Value::string(std::move(out));
  }
  auto& items = obj.lst().items;
  std::vector<Value> out;
  for (int64_t k = a; c > 0 ? k < b : k > b; k += c) out.push_back(items[size_t(k)]);
  return Value::list(std::move(out), obj.lst().tuple);
}

Value binary_op(BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  // str.__mod__ runs first and accepts an Undefined argument (it only fails if a %d converts it).
  if (op == BinOp::Mod && a.is_string()) return percent_format(a.str(), b);
  if (b.is_undefined()) undefined_error(b);
  static const char* syms[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
  const char* sym = syms[int(op)];
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && a.kind != Kind::Float && b.kind != Kind::Float;
  auto unsupported = [&]() -> Value {
    type_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", sym, type_name(a), type_name(b)));
  };
  auto overflow = []() -> Value {
    throw JinjaError("OverflowError", "integer overflow (only 64-bit integers are supported)");
  };
  int64_t r;
  switch (op) {
    case BinOp::Add:
      if (ints) return __builtin_add_overflow(ival(a), ival(b), &r) ? overflow() : Value::integer(r);
      if (nums) return Value::number(a.as_double() + b.as_double());
      if (a.is_string()) {
        if (!b.is_string()) type_error(fmt::format("can only concatenate str (not \"{}\") to str", type_name(b)));
        if (a.sobj().markup || b.sobj().markup)  // Markup + str escapes the str (either order)
          return Value::markup((a.sobj().markup ? a.str() : html_escape(a.str())) +
                               (b.sobj().markup ? b.str() : html_escape(b.str())));
        std::string s;
        s.reserve(a.str().size() + b.str().size());
        s += a.str();
        s += b.str();
        return Value::string(std::move(s), a.sobj().ascii && b.sobj().ascii);
      }
      if (a.is_list() && a.lst().plain()) {
        const char* tn = a.lst().tuple ? "tuple" : "list";
        if (!b.is_list() || !b.lst().plain() || b.lst().tuple != a.lst().tuple)
          type_error(fmt::format("can only concatenate {} (not \"{}\") to {}", tn, type_name(b), tn));
        std::vector<Value> items = a.lst().items;
        items.insert(items.end(), b.lst().items.begin(), b.lst().items.end());
        return Value::list(std::move(items), a.lst().tuple);
      }
      return unsupported();
    case BinOp::Sub:
      if (ints) return __builtin_sub_overflow(ival(a), ival(b), &r) ? overflow() : Value::integer(r);
      if (nums) return Value::number(a.as_double() - b.as_double());
      return unsupported();
    case BinOp::Mul: {
      if (ints) return __builtin_mul_overflow(ival(a), ival(b), &r) ? overflow() : Value::integer(r);
      if (nums) return Value::number(a.as_double() * b.as_double());
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* n = seq == &a ? &b : &a;
      if (!seq || (seq->is_list() && !seq->lst().plain())) return unsupported();
      if (!int_like(*n)) type_error(fmt::format("can't multiply sequence by non-int of type '{}'", type_name(*n)));
      int64_t times = std::max<int64_t>(0, ival(*n));
      size_t unit = seq->is_string() ? seq->str().size() : seq->lst().items.size();
      if (unit) check_size(uint64_t(times) * unit * (seq->is_string() ? 1 : sizeof(Value)));
      if (seq->is_string()) {
        std::string s;
        s.reserve(unit * size_t(times));
        for (int64_t k = 0; k < times; ++k) s += seq->str();
        return seq->sobj().markup ? Value::markup(std::move(s)) : Value::string(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq->lst().items.begin(), seq->lst().items.end());
      return Value::list(std::move(items), seq->lst().tuple);
    }
    case BinOp::Div:
      if (!nums) return unsupported();
      if (b.as_double() == 0) throw JinjaError("ZeroDivisionError", "division by zero");
      return Value::number(a.as_double() / b.as_double());
    case BinOp::FloorDiv:
      if (!nums) return unsupported();
      if (ints) {
        int64_t x = ival(a), y = ival(b);
        if (y == 0) throw JinjaError("ZeroDivisionError", "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return overflow();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (b.as_double() == 0) throw JinjaError("ZeroDivisionError", "float floor division by zero");
      return Value::number(std::floor(a.as_double() / b.as_double()));
    case BinOp::Mod:
      if (a.is_string()) return percent_format(a.str(), b);
      if (!nums) return unsupported();
      if (ints) {
        int64_t x = ival(a), y = ival(b);
        if (y == 0) throw JinjaError("ZeroDivisionError", "integer modulo by zero");
        if (y == -1) return Value::integer(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      } else {
        double x = a.as_double(), y = b.as_double();
        if (y == 0) throw JinjaError("ZeroDivisionError", "float modulo");
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (m == 0) m = std::copysign(0.0, y);
        return Value::number(m);
      }
    case BinOp::Pow:
      if (!nums) return unsupported();
      if (ints && ival(b) >= 0) {
        int64_t base = ival(a), e = ival(b), acc = 1;
        while (e > 0) {
          if (e & 1)
            if (__builtin_mul_overflow(acc, base, &acc)) return overflow();
          e >>= 1;
          if (e && __builtin_mul_overflow(base, base, &base)) return overflow();
        }
        return Value::integer(acc);
      }
      if (a.as_double() == 0 && b.as_double() < 0)
        throw JinjaError("ZeroDivisionError", "0.0 cannot be raised to a negative power");
      return Value::number(std::pow(a.as_double(), b.as_double()));
    case BinOp::Concat: {
      std::string s = to_str(a);
      append_str(s, b);
      return Value::string(std::move(s));
    }
  }
  return unsupported();
}

bool has_method(const Value& v, std::string_view name) {
  switch (v.kind) {
    case Kind::String:
      for (auto m : kStrMethods)
        if (m == name) return true;
      return false;
    case Kind::Dict: return name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy";
    case Kind::List: return v.lst().plain() && (name == "index" || name == "count" || name == "copy");
    case Kind::Object:
      if (v.obj().type == ObjType::Cycler) return name == "next" || name == "reset";
      return v.obj().type == ObjType::Loop && (name == "cycle" || name == "changed");
    default: return false;
  }
}

Value bound_method(const Value& self, std::string_view name) {
  return Value::object(std::make_shared<BoundMethod>(self, name));
}

Value call_method(Interp& in, const Value& self, std::string_view name, const Args& args) {
  switch (self.kind) {
    case Kind::String: return str_method(in, self, name, args);
    case Kind::Dict: {
      if (name == "get") {
        if (!args.kw.empty()) type_error("dict.get() takes no keyword arguments");  // positional-only in CPython
        auto b = bind_args(args, {"key", "default"}, "get");
        if (!b[0]) type_error("get expected at least 1 argument, got 0");
        const Value* v = self.dct().find(*b[0]);
        return v ? *v : b[1] ? *b[1] : Value::none();
      }
      bind_args(args, {}, std::string(name).c_str());
      if (name == "copy") return Value::dict(self.dct().items);
      Value out;
      if (name == "items") {
        out = dict_items(self);
      } else {
        std::vector<Value> items;
        for (auto& [k, v] : self.dct().items) items.push_back(name == "keys" ? k : v);
        out = Value::list(std::move(items));
      }
      out.as<ListObj>().view = name == "items" ? "dict_items" : name == "keys" ? "dict_keys" : "dict_values";
      return out;
    }
    case Kind::List: {
      auto& items = self.lst().items;
      if (name == "copy") return Value::list(items, self.lst().tuple);
      if (!args.kw.empty()) type_error(fmt::format("list.{}() takes no keyword arguments", name));
      auto b = bind_args(args, {"value"}, std::string(name).c_str());
      if (!b[0]) type_error(fmt::format("{}() takes exactly one argument (0 given)", name));
      if (name == "count")
        return Value::integer(
            std::count_if(items.begin(), items.end(), [&](const Value& x) { return equals(x, *b[0]); }));
      for (size_t k = 0; k < items.size(); ++k)
        if (equals(items[k], *b[0])) return Value::integer(int64_t(k));
      std::string r;
      append_repr(r, *b[0]);
      value_error(r + " is not in list");
    }
    case Kind::Object: {
      if (self.obj().type == ObjType::Cycler) {
        auto& c = self.as<CyclerObj>();
        bind_args(args, {}, std::string(name).c_str());
        if (name == "reset") {
          c.pos = 0;
          return Value::none();
        }
        Value cur = c.items[c.pos];
        c.pos = (c.pos + 1) % c.items.size();
        return cur;
      }
      auto& l = self.as<LoopObj>();
      if (name == "cycle") {
        if (!args.kw.empty()) type_error("cycle() takes no keyword arguments");
        if (args.pos.empty()) type_error("no items for cycling given");
        return args.pos[l.index % args.pos.size()];
      }
      Value val = Value::list(args.pos, true);
      if (!l.changed_called || !equals(val, l.last_changed)) {
        l.changed_called = true;
        l.last_changed = val;
        return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    default: break;
  }
  type_error(fmt::format("'{}' object has no attribute '{}'", type_name(self), name));
}

// --- filters ----------------------------------------------------------------------------------------
namespace {

std::string soft_str(const Value& v) { return to_str(v); }

// jinja2's make_attrgetter: "a.b.0" walks items (then attributes) of each element.
Value attr_path(Interp& in, const Value& v, const Value& attr) {
  if (int_like(attr)) return in.getitem(v, attr);
  std::string path = to_str(attr);
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool num = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.getitem(cur, num ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(str_lower(v.str())) : v; }

// Sort keys for sort/dictsort/unique/min/max: the attribute (comma-separated paths allowed for
// sort), lower-cased unless case_sensitive.
Value sort_key(Interp& in, const Value& item, const Value* attribute, bool case_sensitive) {
  Value k = item;
  if (attribute && !attribute->is_none()) {
    std::string a = to_str(*attribute);
    if (a.find(',') != std::string::npos) {
      std::vector<Value> parts;
      size_t start = 0;
      while (true) {
        size_t comma = a.find(',', start);
        Value p = attr_path(
            in, item, Value::string(a.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
        parts.push_back(case_sensitive ? p : lower_if_str(p));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return Value::list(std::move(parts));
    }
    k = attr_path(in, item, *attribute);
  }
  return case_sensitive ? k : lower_if_str(k);
}

const std::vector<Value>& seq_items(const Value& v, Value& holder) {
  holder = iterate(v);
  return holder.lst().items;
}

Value f_abs(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "abs");
  if (v.kind == Kind::Int) {
    if (v.i == INT64_MIN) throw JinjaError("OverflowError", "integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.kind == Kind::Bool) return Value::integer(v.b);
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  type_error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));  // Undefined too: no __abs__
}

Value f_attr(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"name"}, "attr");
  if (!b[0]) type_error("attr() missing required argument 'name'");
  std::string name = to_str(*b[0]);
  if (v.is_dict()) {  // attributes only, never keys
    if (has_method(v, name)) return bound_method(v, name);
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return in.getattr(v, name);
}

Value f_batch(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"linecount", "fill_with"}, "batch");
  int64_t n = need_int(b[0], "linecount", 0);
  if (n <= 0) value_error("batch size must be positive");
  Value h;
  auto& items = seq_items(v, h);
  std::vector<Value> out, cur;
  for (auto& x : items) {
    cur.push_back(x);
    if (int64_t(cur.size()) == n) out.push_back(Value::list(std::move(cur))), cur.clear();
  }
  if (!cur.empty()) {
    if (b[1] && !b[1]->is_none())
      while (int64_t(cur.size()) < n) cur.push_back(*b[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}

Value f_capitalize(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "capitalize");
  return Value::string(str_capitalize(soft_str(v)));
}

Value f_center(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"width"}, "center");
  return Value::string(pad(soft_str(v), need_int(b[0], "width", 80), '^'));
}

Value f_default(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"default_value", "boolean"}, "default");
  if (v.is_undefined() || (b[1] && truthy(*b[1]) && !truthy(v))) return b[0] ? *b[0] : Value::string("");
  return v;
}

Value f_dictsort(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_dict())
    throw JinjaError("AttributeError", fmt::format("'{}' object has no attribute 'items'", type_name(v)));
  bool cs = b[0] && truthy(*b[0]), rev = b[2] && truthy(*b[2]);
  std::string by = b[1] ? to_str(*b[1]) : "key";
  if (by != "key" && by != "value")
    throw JinjaError("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  int pos = by == "key" ? 0 : 1;
  std::vector<Value> items = dict_items(v).lst().items;
  std::vector<Value> keys;
  for (auto& it : items) keys.push_back(sort_key(in, it.lst().items[size_t(pos)], nullptr, cs));
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return rev ? compare(keys[y], keys[x]) < 0 : compare(keys[x], keys[y]) < 0;
  });
  std::vector<Value> out;
  for (size_t k : order) out.push_back(items[k]);
  return Value::list(std::move(out));
}

Value f_escape(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "escape");
  if (v.is_string() && v.sobj().markup) return v;  // already safe: not escaped twice
  return Value::markup(html_escape(soft_str(v)));
}

Value f_forceescape(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "forceescape");
  return Value::markup(html_escape(soft_str(v)));
}

Value f_first(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "first");
  Value h;
  auto& items = seq_items(v, h);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "last");
  if (v.is_list() && v.lst().generator) type_error("'generator' object is not reversible");
  Value h;
  auto& items = seq_items(v, h);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): surrounding whitespace, underscores between digits, inf/nan.
bool parse_py_float(const std::string& in, double& out) {
  std::string s = strip(in, nullptr, true, true), t;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_') {
      if (k == 0 || k + 1 == s.size() || !isdigit((unsigned char)s[k - 1]) || !isdigit((unsigned char)s[k + 1]))
        return false;
      continue;
    }
    t += s[k];
  }
  if (t.empty()) return false;
  size_t p = t[0] == '+' || t[0] == '-' ? 1 : 0;
  bool neg = t[0] == '-';
  std::string body = str_lower(t.substr(p));
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
  } else {
    if (body.empty() || !(isdigit((unsigned char)body[0]) || body[0] == '.')) return false;
    auto r = std::from_chars(t.data() + p, t.data() + t.size(), out);
    if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return false;
  }
  if (neg) out = -out;
  return true;
}

bool parse_py_int(std::string s, int base, int64_t& out) {
  s = strip(s, nullptr, true, true);
  std::string t;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_') {
      if (k == 0 || k + 1 == s.size() || s[k - 1] == '_' || s[k + 1] == '_') return false;
      continue;
    }
    t += s[k];
  }
  bool neg = false;
  size_t p = 0;
  if (p < t.size() && (t[p] == '+' || t[p] == '-')) neg = t[p++] == '-';
  if (base == 16 || base == 8 || base == 2 || base == 0) {
    if (t.size() > p + 1 && t[p] == '0') {
      char c = char(t[p + 1] | 0x20);
      int b = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
      if (b && (base == 0 || base == b)) {
        base = b;
        p += 2;
      }
    }
    if (base == 0) base = 10;
  }
  if (p >= t.size()) return false;
  uint64_t u = 0;
  auto r = std::from_chars(t.data() + p, t.data() + t.size(), u, base);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size() || u > uint64_t(INT64_MAX) + (neg ? 1 : 0)) return false;
  out = neg ? int64_t(0 - u) : int64_t(u);
  return true;
}

Value f_float(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"default"}, "float");
  Value dflt = b[0] ? *b[0] : Value::number(0.0);
  if (v.is_undefined()) undefined_error(v);
  if (v.is_number()) return Value::number(v.as_double());
  double d;
  if (v.is_string() && parse_py_float(v.str(), d)) return Value::number(d);
  return dflt;
}

Value f_int(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"default", "base"}, "int");
  Value dflt = b[0] ? *b[0] : Value::integer(0);
  int base = int(need_int(b[1], "base", 10));
  if (v.is_undefined()) undefined_error(v);
  if (int_like(v)) return Value::integer(ival(v));
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f))
      throw JinjaError(std::isnan(v.f) ? "ValueError" : "OverflowError", "cannot convert float to integer");
    return Value::integer(int64_t(v.f));
  }
  if (v.is_string()) {
    int64_t i;
    if (parse_py_int(v.str(), base, i)) return Value::integer(i);
    double d;  // "42.23"|int is 42, as in jinja2
    if (parse_py_float(v.str(), d)) {
      if (!std::isfinite(d))
        throw JinjaError(std::isnan(d) ? "ValueError" : "OverflowError", "cannot convert float to integer");
      return Value::integer(int64_t(d));
    }
  }
  return dflt;
}

Value f_format(Interp&, const Value& v, const Args& a) {
  if (!a.pos.empty() && !a.kw.empty())
    throw JinjaError("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    std::vector<std::pair<Value, Value>> items;
    for (auto& [k, x] : a.kw) items.emplace_back(Value::string(k), x);
    return percent_format(soft_str(v), Value::dict(std::move(items)));
  }
  return percent_format(soft_str(v), Value::list(a.pos, true));
}

Value f_indent(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"width", "first", "blank"}, "indent");
  std::string ind;
  if (b[0] && b[0]->is_string())
    ind = b[0]->str();
  else {
    int64_t w = std::max<int64_t>(0, need_int(b[0], "width", 4));
    check_size(uint64_t(w));
    ind = std::string(size_t(w), ' ');
  }
  bool first = b[1] && truthy(*b[1]), blank = b[2] && truthy(*b[2]);
  // jinja2 appends a newline so splitlines() sees the last line; it does so with `s += "\n"`,
  // which only works on strings.
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_string()) type_error(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  std::string s = v.str() + "\n";
  auto lines = splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k];
    }
  } else {
    if (!lines.empty()) rv = lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += "\n";
      if (!lines[k].empty()) rv += ind;
      rv += lines[k];
    }
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv));
}

Value f_items(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "items");
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  Value items = dict_items(v);
  items.as<ListObj>().generator = true;
  return items;
}

Value f_join(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"d", "attribute"}, "join");
  std::string sep = b[0] ? soft_str(*b[0]) : "";
  Value h;
  auto& items = seq_items(v, h);
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    append_str(out, b[1] && !b[1]->is_none() ? attr_path(in, items[k], *b[1]) : items[k]);
  }
  return Value::string(std::move(out));
}

Value f_length(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "length");
  switch (v.kind) {
    case Kind::String: return Value::integer(int64_t(cp_length(v.sobj())));
    case Kind::List:
      if (v.lst().generator) break;
      return Value::integer(int64_t(v.lst().items.size()));
    case Kind::Dict: return Value::integer(int64_t(v.dct().items.size()));
    case Kind::Undefined: return Value::integer(0);
    case Kind::Object:
      if (v.is_object(ObjType::Loop)) return Value::integer(int64_t(v.as<LoopObj>().length()));
      break;
    default: break;
  }
  type_error(fmt::format("object of type '{}' has no len()", type_name(v)));
}

Value f_list(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "list");
  Value it = iterate(v);
  return Value::list(it.lst().items);
}

Value f_lower(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "lower");
  return Value::string(str_lower(soft_str(v)));
}

Value f_upper(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "upper");
  return Value::string(str_upper(soft_str(v)));
}

Value f_map(Interp& in, const Value& v, const Args& a) {
  if (!truthy(v)) return Value::generator({});  // jinja2 guards with `if value:`, so none|map(...) is empty
  Value h;
  auto& items = seq_items(v, h);
  std::vector<Value> out;
  out.reserve(items.size());
  if (a.pos.empty()) {
    const Value* attr = a.kwarg("attribute");
    const Value* dflt = a.kwarg("default");
    for (auto& [k, x] : a.kw)
      if (k != "attribute" && k != "default")
        throw JinjaError("FilterArgumentError", fmt::format("Unexpected keyword argument '{}'", k));
    if (!attr) throw JinjaError("FilterArgumentError", "map requires a filter argument");
    for (auto& x : items) {
      Value r = attr_path(in, x, *attr);
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return Value::generator(std::move(out));
  }
  std::string name = to_str(a.pos[0]);
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (auto& x : items) out.push_back(in.apply_filter(name, x, rest));
  return Value::generator(std::move(out));
}

Value select_impl(Interp& in, const Value& v, const Args& a, bool attr, bool select) {
  if (!truthy(v)) return Value::generator({});  // `if value:` in jinja2, as for map
  Value h;
  auto& items = seq_items(v, h);
  size_t k = 0;
  Value attribute;
  if (attr) {
    if (a.pos.empty()) type_error("selectattr() missing required argument 'attr'");
    attribute = a.pos[k++];
  }
  std::string test;
  bool has_test = k < a.pos.size();
  if (has_test) test = to_str(a.pos[k++]);
  Args targs;
  targs.pos.assign(a.pos.begin() + long(k), a.pos.end());
  targs.kw = a.kw;
  std::vector<Value> out;
  for (auto& x : items) {
    Value subject = attr ? attr_path(in, x, attribute) : x;
    bool ok = has_test ? in.apply_test(test, subject, targs) : truthy(subject);
    if (ok == select) out.push_back(x);
  }
  return Value::generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, const Args& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, const Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, const Args& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, const Args& a) { return select_impl(in, v, a, true, false); }

Value minmax(Interp& in, const Value& v, const Args& a, bool want_max) {
  auto b = bind_args(a, {"case_sensitive", "attribute"}, want_max ? "max" : "min");
  bool cs = b[0] && truthy(*b[0]);
  Value h;
  auto& items = seq_items(v, h);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value bk = sort_key(in, items[0], b[1], cs);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = sort_key(in, items[k], b[1], cs);
    int c = compare(kk, bk);
    if (want_max ? c > 0 : c < 0) best = k, bk = kk;
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, const Args& a) { return minmax(in, v, a, true); }
Value f_min(Interp& in, const Value& v, const Args& a) { return minmax(in, v, a, false); }

Value f_replace(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"old", "new", "count"}, "replace");
  if (!b[0] || !b[1]) type_error("replace() missing required arguments");
  return Value::string(replace(soft_str(v), soft_str(*b[0]), soft_str(*b[1]), need_int(b[2], "count", -1)));
}

Value f_reverse(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "reverse");
  if (v.is_string()) {
    auto cps = to_codepoints(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode(cps));
  }
  if (!v.is_list() && !v.is_dict() && !v.is_undefined())
    throw JinjaError("FilterArgumentError", "argument must be iterable");
  Value it = iterate(v);
  std::vector<Value> items = it.lst().items;
  std::reverse(items.begin(), items.end());
  // reversed() of a list is an iterator (always truthy, no len); of a generator, jinja2 builds a list.
  if (v.is_list() && v.lst().generator) return Value::list(std::move(items));
  return Value::generator(std::move(items));
}

Value f_round(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"precision", "method"}, "round");
  int64_t prec = need_int(b[0], "precision", 0);
  std::string method = b[1] ? to_str(*b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    throw JinjaError("FilterArgumentError", "method must be common, ceil or floor");
  // Undefined has no __round__, so this is a TypeError rather than an UndefinedError.
  if (!v.is_number()) type_error(fmt::format("type {} doesn't define __round__ method", type_name(v)));
  if (method == "common") {
    if (int_like(v)) {
      if (prec >= 0) return Value::integer(ival(v));
      double m = std::pow(10.0, double(-prec));
      return Value::integer(int64_t(std::nearbyint(double(ival(v)) / m) * m));
    }
    if (!std::isfinite(v.f)) return v;
    if (prec >= 0 && prec < 300) {
      // printf rounds the exact binary value half-to-even, as Python's round() does.
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", int(prec), v.f);
      return Value::number(std::strtod(buf, nullptr));
    }
    double m = std::pow(10.0, double(-prec));
    return Value::number(std::nearbyint(v.f / m) * m);
  }
  double m = std::pow(10.0, double(prec));
  double x = v.as_double() * m;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / m);
}

Value f_safe(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "safe");
  return v.is_string() && v.sobj().markup ? v : Value::markup(soft_str(v));
}

Value f_sort(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"reverse", "case_sensitive", "attribute"}, "sort");
  bool rev = b[0] && truthy(*b[0]), cs = b[1] && truthy(*b[1]);
  Value h;
  auto& items = seq_items(v, h);
  std::vector<Value> keys;
  for (auto& x : items) keys.push_back(sort_key(in, x, b[2], cs));
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return rev ? compare(keys[y], keys[x]) < 0 : compare(keys[x], keys[y]) < 0;
  });
  std::vector<Value> out;
  for (size_t k : order) out.push_back(items[k]);
  return Value::list(std::move(out));
}

Value f_string(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "string");
  return v.is_string() ? v : Value::string(soft_str(v));
}

Value f_sum(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"attribute", "start"}, "sum");
  Value acc = b[1] ? *b[1] : Value::integer(0);
  Value h;
  for (auto& x : seq_items(v, h))
    acc = binary_op(BinOp::Add, acc, b[0] && !b[0]->is_none() ? attr_path(in, x, *b[0]) : x);
  return acc;
}

Value f_title(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "title");
  // jinja2's title(): words start after whitespace or one of -({[< ; each word is capitalized.
  std::string s = soft_str(v), out;
  bool word_start = true;
  for (size_t p = 0; p < s.size();) {
    uint32_t c = decode_utf8(s, p);
    bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      encode_utf8(out, c);
      word_start = true;
    } else {
      if (word_start)
        put_upper(out, c);
      else
        put_lower(out, c);
      word_start = false;
    }
  }
  return Value::string(std::move(out));
}

Value f_tojson(Interp&, const Value& v, const Args& a) {
  // transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  auto b = bind_args(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonOptions o;
  o.ensure_ascii = b[0] && truthy(*b[0]);
  o.sort_keys = b[3] && truthy(*b[3]);
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_string()) {
      o.indent_is_str = true;
      o.indent_str = b[1]->str();
    } else {
      o.indent = int(std::max<int64_t>(0, need_int(b[1], "indent", 0)));
    }
    o.item_sep = ",";
  }
  if (b[2] && !b[2]->is_none()) {
    if (!b[2]->is_list() || b[2]->lst().items.size() != 2) value_error("separators must be a pair of strings");
    o.item_sep = to_str(b[2]->lst().items[0]);
    o.key_sep = to_str(b[2]->lst().items[1]);
  }
  std::string out;
  dump_json(out, v, o);
  return Value::string(std::move(out));
}

Value f_trim(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"chars"}, "trim");
  return Value::string(strip(soft_str(v), b[0], true, true));
}

Value f_truncate(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"length", "killwords", "end", "leeway"}, "truncate");
  int64_t length = need_int(b[0], "length", 255), leeway = need_int(b[3], "leeway", 5);
  bool kill = b[1] && truthy(*b[1]);
  std::string end = b[2] ? soft_str(*b[2]) : "...";
  int64_t end_len = int64_t(cp_count(end));
  if (length < end_len)
    throw JinjaError("AssertionError", fmt::format("expected length >= {}, got {}", end_len, length));
  if (leeway < 0) throw JinjaError("AssertionError", fmt::format("expected leeway >= 0, got {}", leeway));
  auto cps = to_codepoints(soft_str(v));
  if (int64_t(cps.size()) <= length + leeway) return Value::string(soft_str(v));
  std::string head = encode(cps, 0, size_t(length - end_len));
  if (kill) return Value::string(head + end);
  size_t sp = head.rfind(' ');
  if (sp != std::string::npos) head.resize(sp);
  return Value::string(head + end);
}

Value f_unique(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"case_sensitive", "attribute"}, "unique");
  bool cs = b[0] && truthy(*b[0]);
  Value h;
  std::vector<Value> seen, out;
  for (auto& x : seq_items(v, h)) {
    Value k = sort_key(in, x, b[1], cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(x);
    }
  }
  return Value::generator(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "wordcount");
  std::string s = soft_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t p = 0; p < s.size();) {
    uint32_t c = decode_utf8(s, p);
    bool w = cp_alnum(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

// groupby(attribute, default, case_sensitive): sorts by the attribute, then groups runs of equal
// keys into (grouper, list) pairs. Without case_sensitive, keys compare lower-cased but the
// grouper shown is the first item's own value.
Value f_groupby(Interp& in, const Value& v, const Args& a) {
  auto b = bind_args(a, {"attribute", "default", "case_sensitive"}, "groupby");
  if (!b[0]) type_error("do_groupby() missing 1 required positional argument: 'attribute'");
  bool cs = b[2] && truthy(*b[2]);
  auto key_of = [&](const Value& x) {
    Value k = attr_path(in, x, *b[0]);
    return k.is_undefined() && b[1] && !b[1]->is_none() ? *b[1] : k;
  };
  Value h;
  auto& items = seq_items(v, h);
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (auto& x : items) keys.push_back(cs ? key_of(x) : lower_if_str(key_of(x)));
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return compare(keys[x], keys[y]) < 0; });
  std::vector<Value> out;
  for (size_t k = 0; k < order.size();) {
    size_t e = k + 1;
    while (e < order.size() && equals(keys[order[e]], keys[order[k]])) ++e;
    std::vector<Value> members;
    for (size_t j = k; j < e; ++j) members.push_back(items[order[j]]);
    Value grouper = cs ? keys[order[k]] : key_of(members[0]);
    Value g = Value::list({std::move(grouper), Value::list(std::move(members))}, true);
    g.as<ListObj>().group = true;
    out.push_back(std::move(g));
    k = e;
  }
  return Value::list(std::move(out));
}

// slice(n, fill_with): n consecutive columns; the first len % n get one item more, and with
// fill_with the shorter ones are padded by one.
Value f_slice(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"slices", "fill_with"}, "slice");
  if (!b[0]) type_error("do_slice() missing 1 required positional argument: 'slices'");
  int64_t n = need_int(b[0], "slices", 0);
  if (n == 0) throw JinjaError("ZeroDivisionError", "integer division or modulo by zero");
  Value h;
  auto& items = seq_items(v, h);
  int64_t len = int64_t(items.size());
  // Python's floor division and modulo (n may be negative; then there are no slices at all).
  int64_t per = len / n - ((len % n != 0) && ((len < 0) != (n < 0)) ? 1 : 0);
  int64_t extra = len - per * n;
  std::vector<Value> out;
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t start = offset + k * per;
    if (k < extra) ++offset;
    int64_t end = offset + (k + 1) * per;
    std::vector<Value> part;
    for (int64_t j = std::max<int64_t>(start, 0); j < std::min(end, len); ++j) part.push_back(items[size_t(j)]);
    if (b[1] && !b[1]->is_none() && k >= extra) part.push_back(*b[1]);
    out.push_back(Value::list(std::move(part)));
  }
  return Value::generator(std::move(out));
}

// The HTML entities striptags decodes: numeric ones and the few named ones text actually carries.
// (Python decodes all of HTML5's named entities; others are left as written.)
std::string html_unescape(const std::string& s) {
  static const std::pair<const char*, const char*> named[] = {
      {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"apos", "'"}, {"nbsp", "\u00a0"}};
  std::string out;
  for (size_t p = 0; p < s.size();) {
    size_t semi = s[p] == '&' ? s.find(';', p) : std::string::npos;
    if (semi == std::string::npos || semi - p > 10) {
      out += s[p++];
      continue;
    }
    std::string ent = s.substr(p + 1, semi - p - 1);
    bool done = false;
    if (ent.size() > 1 && ent[0] == '#') {
      bool hex = (ent[1] | 0x20) == 'x';
      std::string digits = ent.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      auto r = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (!digits.empty() && r.ec == std::errc() && r.ptr == digits.data() + digits.size() && cp > 0 &&
          cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff)) {
        encode_utf8(out, cp);
        done = true;
      }
    } else {
      for (auto& [name, text] : named)
        if (ent == name) {
          out += text;
          done = true;
        }
    }
    if (done)
      p = semi + 1;
    else
      out += s[p++];
  }
  return out;
}

// Markup.striptags(): drop <!-- comments --> and <tags>, collapse whitespace, decode entities.
Value f_striptags(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "striptags");
  std::string s = soft_str(v);
  for (const char *open : {"<!--", "<"}) {
    const char* close = open[1] ? "-->" : ">";
    for (size_t start; (start = s.find(open)) != std::string::npos;) {
      size_t end = s.find(close, start);
      if (end == std::string::npos) break;
      s.erase(start, end + std::strlen(close) - start);
    }
  }
  std::string joined;
  for (auto& w : split_ws(s, -1)) {
    if (!joined.empty()) joined += ' ';
    joined += w.str();
  }
  return Value::string(html_unescape(joined));  // unescape() hands back a plain str
}

// urllib.parse.quote over UTF-8 bytes: letters, digits and _.-~ stay, "/" too outside queries.
std::string url_quote(const Value& v, bool for_qs) {
  std::string s = soft_str(v), out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (c == '/' && !for_qs))
      out += char(c);
    else if (c == ' ' && for_qs)
      out += '+';
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// A string (or any non-iterable) is quoted as a path; a dict or list of pairs becomes a query.
Value f_urlencode(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "urlencode");
  if (v.is_string() || !(v.is_list() || v.is_dict())) return Value::string(url_quote(v, false));
  Value h;
  std::vector<std::pair<Value, Value>> pairs;
  if (v.is_dict()) {
    pairs = v.dct().items;
  } else {
    for (auto& item : seq_items(v, h)) {
      Value p = iterate(item);
      if (p.lst().items.size() != 2)
        value_error(fmt::format("{} values to unpack (expected 2)",
                                p.lst().items.size() < 2 ? "not enough" : "too many"));
      pairs.emplace_back(p.lst().items[0], p.lst().items[1]);
    }
  }
  std::string out;
  for (auto& [k, x] : pairs) {
    if (!out.empty()) out += '&';
    out += url_quote(k, true) + "=" + url_quote(x, true);
  }
  return Value::string(std::move(out));
}

Value f_filesizeformat(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"binary"}, "filesizeformat");
  bool binary = b[0] && truthy(*b[0]);
  double bytes;
  if (v.is_number()) {
    bytes = v.as_double();
  } else if (v.is_string()) {
    if (!parse_py_float(v.str(), bytes)) value_error("could not convert string to float: " + py_str_repr(v.str()));
  } else {
    if (v.is_undefined()) undefined_error(v);
    type_error(fmt::format("float() argument must be a string or a real number, not '{}'", type_name(v)));
  }
  static const char* const dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  static const char* const bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  const double base = binary ? 1024 : 1000;
  if (bytes == 1) return Value::string("1 Byte");
  if (bytes < base) {
    if (!std::isfinite(bytes)) throw JinjaError("OverflowError", "cannot convert float infinity to integer");
    return Value::string(fmt::format("{} Bytes", int64_t(bytes)));
  }
  double unit = base;
  for (int k = 0; k < 8; ++k) {
    unit *= base;  // base ** (k + 2)
    if (bytes < unit || k == 7)
      return Value::string(fmt::format("{:.1f} {}", base * bytes / unit, (binary ? bin : dec)[k]));
  }
  return Value::string("");  // unreachable
}

// xmlattr: ` key="value"` for each item that is neither none nor undefined, both HTML-escaped.
Value f_xmlattr(Interp&, const Value& v, const Args& a) {
  auto b = bind_args(a, {"autospace"}, "xmlattr");
  bool autospace = !b[0] || truthy(*b[0]);
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_dict())
    throw JinjaError("AttributeError", fmt::format("'{}' object has no attribute 'items'", type_name(v)));
  std::string out;
  for (auto& [k, x] : v.dct().items) {
    if (x.is_none() || x.is_undefined()) continue;
    std::string key = soft_str(k);
    for (char c : key)
      if (c == ' ' || (c >= '\t' && c <= '\r') || c == '/' || c == '>' || c == '=')
        value_error("Invalid character in attribute name: " + py_str_repr(key));
    if (!out.empty()) out += ' ';
    bool safe = x.is_string() && x.sobj().markup;
    out += html_escape(key) + "=\"" + (safe ? x.str() : html_escape(soft_str(x))) + "\"";
  }
  if (autospace && !out.empty()) out = " " + out;
  return Value::string(std::move(out));  // Markup only under autoescape, which transformers leaves off
}

// pprint: Python's pprint.pformat (width 80, dict keys sorted): the repr when it fits, else dicts,
// lists and tuples one item per line and long strings split into adjacent literals.
struct PrettyPrinter {
  static constexpr int64_t kWidth = 80;
  std::string out;

  static std::vector<std::pair<Value, Value>> sorted_items(const Value& d) {
    auto items = d.dct().items;
    // Keys Python cannot order (1 < 'x') fall back to comparing their type names, as pprint does.
    auto less = [](const std::pair<Value, Value>& x, const std::pair<Value, Value>& y) {
      try {
        return compare(x.first, y.first) < 0;
      } catch (const JinjaError&) {
        return std::strcmp(type_name(x.first), type_name(y.first)) < 0;
      }
    };
    std::stable_sort(items.begin(), items.end(), less);
    return items;
  }
  static void repr(std::string& s, const Value& v) {
    if (v.is_dict()) {
      s += '{';
      bool first = true;
      for (auto& [k, x] : sorted_items(v)) {
        if (!first) s += ", ";
        first = false;
        repr(s, k);
        s += ": ";
        repr(s, x);
      }
      s += '}';
    } else if (v.is_list() && v.lst().plain()) {
      auto& items = v.lst().items;
      s += v.lst().tuple ? '(' : '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) s += ", ";
        repr(s, items[k]);
      }
      s += v.lst().tuple ? (items.size() == 1 ? ",)" : ")") : "]";
    } else {
      append_repr(s, v);
    }
  }
  static int64_t width(const std::string& s) { return int64_t(cp_count(s)); }

  void format(const Value& v, int64_t indent, int64_t allowance, int level) {
    std::string rep;
    repr(rep, v);
    if (width(rep) > kWidth - indent - allowance) {
      if (v.is_dict() && !v.dct().items.empty()) return format_dict(v, indent, allowance, level + 1);
      if (v.is_list() && v.lst().plain() && !v.lst().items.empty()) {
        bool tuple = v.lst().tuple;
        const char* end = tuple ? (v.lst().items.size() == 1 ? ",)" : ")") : "]";
        out += tuple ? '(' : '[';
        format_items(v.lst().items, indent, allowance + int64_t(std::strlen(end)), level + 1);
        out += end;
        return;
      }
      if (v.is_string() && !v.str().empty()) return format_str(v.str(), indent, allowance, level + 1);
    }
    out += rep;
  }
  void format_dict(const Value& d, int64_t indent, int64_t allowance, int level) {
    out += '{';
    auto items = sorted_items(d);
    indent += 1;
    for (size_t k = 0; k < items.size(); ++k) {
      bool last = k + 1 == items.size();
      std::string key;
      repr(key, items[k].first);
      out += key + ": ";
      format(items[k].second, indent + width(key) + 2, last ? allowance + 1 : 1, level);
      if (!last) out += ",\n" + std::string(size_t(indent), ' ');
    }
    out += '}';
  }
  void format_items(const std::vector<Value>& items, int64_t indent, int64_t allowance, int level) {
    indent += 1;
    for (size_t k = 0; k < items.size(); ++k) {
      bool last = k + 1 == items.size();
      if (k) out += ",\n" + std::string(size_t(indent), ' ');
      format(items[k], indent, last ? allowance : 1, level);
    }
  }
  // Each line is one literal if it fits, else split after runs of whitespace into literals that do.
  void format_str(const std::string& s, int64_t indent, int64_t allowance, int level) {
    auto lines = splitlines(s, true);
    if (level == 1) indent += 1, allowance += 1;
    const int64_t max_width = kWidth - indent;
    std::vector<std::string> chunks;
    for (size_t i = 0; i < lines.size(); ++i) {
      bool last_line = i + 1 == lines.size();
      std::string rep = py_str_repr(lines[i]);
      if (width(rep) <= max_width - (last_line ? allowance : 0)) {
        chunks.push_back(rep);
        continue;
      }
      std::vector<std::string> parts;  // runs of non-space then space, as re.findall(r'\S*\s*')
      const std::string& line = lines[i];
      for (size_t p = 0; p < line.size();) {
        size_t start = p;
        for (bool space : {false, true})
          while (p < line.size()) {
            size_t q = p;
            if (is_py_space(decode_utf8(line, q)) != space) break;
            p = q;
          }
        parts.push_back(line.substr(start, p - start));
      }
      std::string current;
      for (size_t j = 0; j < parts.size(); ++j) {
        std::string candidate = current + parts[j];
        int64_t limit = max_width - (j + 1 == parts.size() && last_line ? allowance : 0);
        if (width(py_str_repr(candidate)) > limit) {
          if (!current.empty()) chunks.push_back(py_str_repr(current));
          current = parts[j];
        } else {
          current = std::move(candidate);
        }
      }
      if (!current.empty()) chunks.push_back(py_str_repr(current));
    }
    if (chunks.size() == 1) {
      out += chunks[0];
      return;
    }
    if (level == 1) out += '(';
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (k) out += "\n" + std::string(size_t(indent), ' ');
      out += chunks[k];
    }
    if (level == 1) out += ')';
  }
};

Value f_pprint(Interp&, const Value& v, const Args& a) {
  bind_args(a, {}, "pprint");
  PrettyPrinter pp;
  pp.format(v, 0, 0, 0);
  return Value::string(std::move(pp.out));
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> m = {
      {"abs", f_abs},           {"attr", f_attr},
      {"batch", f_batch},       {"capitalize", f_capitalize},
      {"center", f_center},     {"count", f_length},
      {"d", f_default},         {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_forceescape},
      {"format", f_format},     {"indent", f_indent},
      {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},
      {"length", f_length},     {"list", f_list},
      {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},
      {"reject", f_reject},     {"rejectattr", f_rejectattr},
      {"replace", f_replace},   {"reverse", f_reverse},
      {"round", f_round},       {"safe", f_safe},
      {"select", f_select},     {"selectattr", f_selectattr},
      {"sort", f_sort},         {"string", f_string},
      {"sum", f_sum},           {"title", f_title},
      {"tojson", f_tojson},     {"trim", f_trim},
      {"truncate", f_truncate}, {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount},
      {"groupby", f_groupby},   {"slice", f_slice},
      {"striptags", f_striptags}, {"urlencode", f_urlencode},
      {"filesizeformat", f_filesizeformat}, {"xmlattr", f_xmlattr},
      {"pprint", f_pprint},
  };
  return m;
}

// --- tests ------------------------------------------------------------------------------------------

const Value& one_arg(const Args& a, const char* name) {
  if (a.pos.size() != 1 || !a.kw.empty()) type_error(fmt::format("test '{}' takes exactly one argument", name));
  return a.pos[0];
}
void no_args(const Args& a, const char* name) {
  if (!a.pos.empty() || !a.kw.empty()) type_error(fmt::format("test '{}' takes no arguments", name));
}

bool t_boolean(Interp&, const Value& v, const Args& a) { return no_args(a, "boolean"), v.kind == Kind::Bool; }
bool t_callable(Interp&, const Value& v, const Args& a) {
  no_args(a, "callable");
  // jinja2's Undefined defines __call__ (to raise), so callable() is true for it.
  return v.is_undefined() || v.is_object(ObjType::Callable) || v.is_object(ObjType::Loop);
}
bool t_defined(Interp&, const Value& v, const Args& a) { return no_args(a, "defined"), !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, const Args& a) { return no_args(a, "undefined"), v.is_undefined(); }
bool t_none(Interp&, const Value& v, const Args& a) { return no_args(a, "none"), v.is_none(); }
bool t_true(Interp&, const Value& v, const Args& a) { return no_args(a, "true"), v.kind == Kind::Bool && v.b; }
bool t_false(Interp&, const Value& v, const Args& a) { return no_args(a, "false"), v.kind == Kind::Bool && !v.b; }
bool t_string(Interp&, const Value& v, const Args& a) { return no_args(a, "string"), v.is_string(); }
bool t_mapping(Interp&, const Value& v, const Args& a) { return no_args(a, "mapping"), v.is_dict(); }
bool t_number(Interp&, const Value& v, const Args& a) { return no_args(a, "number"), v.is_number(); }
bool t_integer(Interp&, const Value& v, const Args& a) { return no_args(a, "integer"), v.kind == Kind::Int; }
bool t_float(Interp&, const Value& v, const Args& a) { return no_args(a, "float"), v.kind == Kind::Float; }
bool t_iterable(Interp&, const Value& v, const Args& a) {
  no_args(a, "iterable");
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_object(ObjType::Loop);
}
bool t_sequence(Interp&, const Value& v, const Args& a) {
  no_args(a, "sequence");
  return v.is_string() || (v.is_list() && v.lst().plain()) || v.is_dict() || v.is_undefined();
}
// Markup strings (from |e, |safe) have __html__, which is all the test looks for.
bool t_escaped(Interp&, const Value& v, const Args& a) {
  return no_args(a, "escaped"), v.is_string() && v.sobj().markup;
}
bool need_int_test(const Value& v, const char* name) {
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_number()) type_error(fmt::format("test '{}' needs a number, got {}", name, type_name(v)));
  return true;
}
bool t_odd(Interp&, const Value& v, const Args& a) {
  no_args(a, "odd");
  need_int_test(v, "odd");
  Value m = binary_op(BinOp::Mod, v, Value::integer(2));
  return equals(m, Value::integer(1));
}
bool t_even(Interp&, const Value& v, const Args& a) {
  no_args(a, "even");
  need_int_test(v, "even");
  Value m = binary_op(BinOp::Mod, v, Value::integer(2));
  return equals(m, Value::integer(0));
}
bool t_divisibleby(Interp&, const Value& v, const Args& a) {
  Value m = binary_op(BinOp::Mod, v, one_arg(a, "divisibleby"));
  return equals(m, Value::integer(0));
}
bool t_eq(Interp&, const Value& v, const Args& a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, const Args& a) { return !equals(v, one_arg(a, "ne")); }
bool t_lt(Interp&, const Value& v, const Args& a) { return compare(v, one_arg(a, "lt"), "<") < 0; }
bool t_le(Interp&, const Value& v, const Args& a) { return compare(v, one_arg(a, "le"), "<=") <= 0; }
bool t_gt(Interp&, const Value& v, const Args& a) { return compare(v, one_arg(a, "gt"), ">") > 0; }
bool t_ge(Interp&, const Value& v, const Args& a) { return compare(v, one_arg(a, "ge"), ">=") >= 0; }
bool t_in(Interp&, const Value& v, const Args& a) { return contains(one_arg(a, "in"), v); }
bool t_sameas(Interp&, const Value& v, const Args& a) {
  const Value& o = one_arg(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None:
    case Kind::Undefined: return true;
    case Kind::Bool: return v.b == o.b;
    case Kind::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython caches small ints only
    case Kind::Float: return false;
    default: return v.p == o.p;
  }
}
bool t_lower(Interp&, const Value& v, const Args& a) { return no_args(a, "lower"), py_iscase(to_str(v), false); }
bool t_upper(Interp&, const Value& v, const Args& a) { return no_args(a, "upper"), py_iscase(to_str(v), true); }
bool t_filter(Interp&, const Value& v, const Args& a) {
  no_args(a, "filter");
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Interp&, const Value& v, const Args& a) {
  no_args(a, "test");
  return v.is_string() && find_test(v.str()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> m = {
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"true", t_true},
      {"false", t_false},
      {"string", t_string},
      {"mapping", t_mapping},
      {"number", t_number},
      {"integer", t_integer},
      {"float", t_float},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"escaped", t_escaped},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"lower", t_lower},
      {"upper", t_upper},
      {"filter", t_filter},
      {"test", t_test},
  };
  return m;
}

// --- globals ----------------------------------------------------------------------------------------

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses longer ranges

Value g_range(Interp&, const Args& a) {
  if (!a.kw.empty()) type_error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    type_error(fmt::format("range expected 1 to 3 arguments, got {}", a.pos.size()));
  for (auto& v : a.pos) {
    if (v.is_undefined()) undefined_error(v);
    if (!int_like(v)) type_error(fmt::format("'{}' object cannot be interpreted as an integer", type_name(v)));
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = ival(a.pos[0]);
  } else {
    start = ival(a.pos[0]);
    stop = ival(a.pos[1]);
    if (a.pos.size() == 3) step = ival(a.pos[2]);
  }
  if (step == 0) value_error("range() arg 3 must not be zero");
  int64_t n = 0;
  if (step > 0 && start < stop) n = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) n = (start - stop - step - 1) / -step;
  if (n > kMaxRange)
    throw JinjaError("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  out.reserve(size_t(n));
  for (int64_t k = 0; k < n; ++k) out.push_back(Value::integer(start + k * step));
  return Value::list(std::move(out));
}

std::vector<std::pair<Value, Value>> dict_args(const Args& a, const char* fname) {
  std::vector<std::pair<Value, Value>> items;
  if (a.pos.size() > 1) type_error(fmt::format("{} expected at most 1 argument, got {}", fname, a.pos.size()));
  auto put = [&](Value k, Value v) {
    for (auto& [ok, ov] : items)
      if (equals(ok, k)) {
        ov = std::move(v);
        return;
      }
    items.emplace_back(std::move(k), std::move(v));
  };
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (auto& [k, v] : src.dct().items) put(k, v);
    } else if (src.is_object(ObjType::Namespace)) {
      for (auto& [k, v] : src.as<NamespaceObj>().attrs) put(Value::string(k), v);
    } else {
      Value it = iterate(src);
      for (auto& pair : it.lst().items) {
        Value p = iterate(pair);
        if (p.lst().items.size() != 2)
          value_error("dictionary update sequence element has wrong length; 2 is required");
        put(p.lst().items[0], p.lst().items[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) put(Value::string(k), v);
  return items;
}

Value g_dict(Interp&, const Args& a) { return Value::dict(dict_args(a, "dict")); }

Value g_namespace(Interp& in, const Args& a) {
  auto ns = std::make_shared<NamespaceObj>();
  for (auto& [k, v] : dict_args(a, "namespace")) ns->attrs.emplace_back(to_str(k), v);
  in.track(ns);
  return Value::object(std::move(ns));
}

Value g_raise_exception(Interp&, const Args& a) {
  auto b = bind_args(a, {"message"}, "raise_exception");
  throw JinjaError("TemplateError", b[0] ? to_str(*b[0]) : "");
}

Value g_strftime_now(Interp& in, const Args& a) {
  auto b = bind_args(a, {"format"}, "strftime_now");
  if (!b[0]) type_error("strftime_now() missing 1 required positional argument: 'format'");
  std::string f = to_str(*b[0]);
  if (f.empty()) return Value::string("");
  std::vector<char> buf(256 + f.size() * 16);
  size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &in.now());
  return Value::string(std::string(buf.data(), n));
}

Value g_cycler(Interp&, const Args& a) {
  if (!a.kw.empty()) type_error("cycler() got an unexpected keyword argument");
  if (a.pos.empty()) throw JinjaError("RuntimeError", "at least one item has to be provided");
  auto c = std::make_shared<CyclerObj>();
  c->items = a.pos;
  return Value::object(std::move(c));
}

Value g_joiner(Interp&, const Args& a) {
  auto b = bind_args(a, {"sep"}, "joiner");
  return Value::object(std::make_shared<JoinerObj>(b[0] ? to_str(*b[0]) : ", "));
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

bool builtin_global(std::string_view name, Value& out) {
  static const std::pair<const char*, GlobalFn> table[] = {
      {"range", g_range},
      {"dict", g_dict},
      {"namespace", g_namespace},
      {"raise_exception", g_raise_exception},
      {"strftime_now", g_strftime_now},
      {"joiner", g_joiner},
      {"cycler", g_cycler},
  };
  for (auto& [n, fn] : table)
    if (name == n) {
      out = Value::object(std::make_shared<BuiltinFn>(n, fn));
      return true;
    }
  return false;
}

}  // namespace ts::chat::jinja
