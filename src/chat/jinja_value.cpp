#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace ts::chat::jinja {

void type_error(std::string msg) { throw JinjaError("TypeError", std::move(msg)); }

void undefined_error(const Value& v) {
  std::string msg = v.undefined_message();
  throw JinjaError(msg.rfind("access to attribute", 0) == 0 ? "SecurityError" : "UndefinedError", msg);
}

void check_size(uint64_t bytes) {
  if (bytes > kMaxGeneratedString)
    throw JinjaError("MemoryError",
                     fmt::format("string of {} bytes exceeds the {} MiB limit", bytes, kMaxGeneratedString >> 20));
}

// --- construction -------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) {
    auto u = std::make_shared<UndefinedInfo>();
    u->text = std::move(hint);
    v.p = std::move(u);
  }
  return v;
}

Value Value::missing(const Value& obj, const Value& key) {
  Value v;
  auto u = std::make_shared<UndefinedInfo>();
  u->form = UndefinedInfo::Missing;
  u->obj_kind = obj.kind;
  u->obj = obj.p;
  u->key = key;
  v.p = std::move(u);
  return v;
}

Value Value::missing_name(const Value& name) {
  Value v;
  auto u = std::make_shared<UndefinedInfo>();
  u->form = UndefinedInfo::Name;
  u->key = name;
  v.p = std::move(u);
  return v;
}

Value Value::string(std::string s) {
  bool ascii = is_ascii(s);
  return string(std::move(s), ascii);
}

Value Value::string(std::string s, bool ascii) {
  Value v;
  v.kind = Kind::String;
  v.p = std::make_shared<StrObj>(StrObj{std::move(s), ascii});
  return v;
}

Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  std::static_pointer_cast<StrObj>(v.p)->markup = true;
  return v;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->tuple = tuple;
  v.p = std::move(l);
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.as<ListObj>().generator = true;
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  Value v;
  v.kind = Kind::Dict;
  auto d = std::make_shared<DictObj>();
  d->items = std::move(items);
  v.p = std::move(d);
  return v;
}

std::string Value::undefined_message() const {
  if (!p) return "value is undefined";
  auto& u = as<UndefinedInfo>();
  switch (u.form) {
    case UndefinedInfo::Text: return u.text;
    case UndefinedInfo::Name: return fmt::format("{} is undefined", py_str_repr(u.key.str()));
    case UndefinedInfo::Missing: break;
  }
  // jinja2's wording: "'dict object' has no attribute 'x'", "list object has no element 3".
  Value obj;
  obj.kind = u.obj_kind;
  obj.p = u.obj.lock();
  const bool gone = !obj.p && (obj.kind == Kind::List || obj.kind == Kind::Object);
  const std::string type = gone ? (obj.kind == Kind::List ? "list object" : "object") : type_repr(obj);
  if (u.key.is_string()) return fmt::format("{} has no attribute {}", py_str_repr(type), py_str_repr(u.key.str()));
  std::string k;
  append_repr(k, u.key);
  return fmt::format("{} has no element {}", type, k);
}

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

Value* NamespaceObj::find(std::string_view name) {
  for (auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

void NamespaceObj::repr(std::string& out) const {
  out += "<Namespace {";
  bool first = true;
  for (auto& [k, v] : attrs) {
    if (!first) out += ", ";
    first = false;
    out += py_str_repr(k);
    out += ": ";
    append_repr(out, v);
  }
  out += "}>";
}

// --- Python semantics -----------------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: return v.lst().generator || !v.lst().items.empty();
    case Kind::Dict: return !v.dct().items.empty();
    case Kind::Object: return true;
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List:
      return v.lst().generator ? "generator" : v.lst().view ? v.lst().view : v.lst().tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Object: return v.obj().py_type();
  }
  return "object";
}

std::string type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.kind == Kind::Object) return fmt::format("{}.{} object", v.obj().py_module(), v.obj().py_type());
  return fmt::format("{} object", type_name(v));
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional when the decimal exponent is in
  // [-4, 16), scientific with a signed two-digit exponent otherwise.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, r.ptr - buf);
  bool neg = sci[0] == '-';
  if (neg) sci.remove_prefix(1);
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp10 = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exp10);
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (size_t(decpt) >= digits.size()) {
      out += digits;
      out.append(size_t(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(decpt));
      out += '.';
      out += digits.substr(size_t(decpt));
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    int x = decpt - 1;
    out += fmt::format("e{}{:02d}", x < 0 ? '-' : '+', x < 0 ? -x : x);
  }
  return out;
}

// Python's str.isprintable() decides which characters repr() escapes. The full rule needs the
// Unicode database; this covers controls, separators, format characters and private use.
static bool py_printable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c < 0x600) return true;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x8e2 || c == 0x1680 || c == 0x180e)
    return false;
  if ((c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x206f) || c == 0x3000)
    return false;
  if ((c >= 0xd800 && c <= 0xf8ff) || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) || c == 0xfffe || c == 0xffff)
    return false;
  if (c == 0xe0001 || (c >= 0xe0020 && c <= 0xe007f) || c >= 0xf0000) return false;
  return true;
}

std::string py_str_repr(std::string_view s) {
  char q = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) q = '"';
  std::string out(1, q);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t c = decode_utf8(s, pos);
    if (c == uint32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xdc80 && c <= 0xdcff && pos - start == 1) {
      out += fmt::format("\\udc{:02x}", c & 0xff);  // an undecodable byte, as surrogateescape shows it
    } else if (!py_printable(c)) {
      if (c <= 0xff)
        out += fmt::format("\\x{:02x}", c);
      else if (c <= 0xffff)
        out += fmt::format("\\u{:04x}", c);
      else
        out += fmt::format("\\U{:08x}", c);
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += q;
  return out;
}

void append_repr(std::string& out, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::String: out += py_str_repr(v.str()); return;
    case Kind::List: {
      auto& l = v.lst();
      if (l.generator) {
        out += "<generator object>";
        return;
      }
      if (l.view) {
        out += l.view;
        out += '(';
        append_repr(out, Value::list(l.items));
        out += ')';
        return;
      }
      out += l.tuple ? '(' : '[';
      for (size_t k = 0; k < l.items.size(); ++k) {
        if (k) out += ", ";
        append_repr(out, l.items[k]);
      }
      if (l.tuple && l.items.size() == 1) out += ',';
      out += l.tuple ? ')' : ']';
      return;
    }
    case Kind::Dict: {
      out += '{';
      bool first = true;
      for (auto& [k, x] : v.dct().items) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, k);
        out += ": ";
        append_repr(out, x);
      }
      out += '}';
      return;
    }
    default: append_str(out, v);
  }
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.b ? "True" : "False"; return;
    case Kind::Int: {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof buf, v.i);
      out.append(buf, r.ptr);
      return;
    }
    case Kind::Float: out += py_float_repr(v.f); return;
    case Kind::String: out += v.str(); return;
    case Kind::List:
    case Kind::Dict: append_repr(out, v); return;
    case Kind::Object: v.obj().repr(out); return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string s;
  append_str(s, v);
  return s;
}

namespace {
// int vs float, exactly as Python compares them: 2**53 + 1 != 2**53 + 1.0, although converting the
// int to a double would make them equal. NaN is unordered: 2 (nothing is equal to or less than it).
int cmp_int_float(int64_t i, double d) {
  if (std::isnan(d)) return 2;
  if (d >= 9223372036854775808.0) return -1;  // 2**63: beyond every int64
  if (d < -9223372036854775808.0) return 1;
  int64_t t = int64_t(d);  // exact: |d| < 2**63, truncated toward zero
  if (i != t) return i < t ? -1 : 1;
  double frac = d - double(t);  // exact as well
  return frac > 0 ? -1 : frac < 0 ? 1 : 0;
}
// -1/0/1, or 2 when a NaN makes the pair unordered.
int cmp_numbers(const Value& a, const Value& b) {
  auto ival = [](const Value& v) { return v.kind == Kind::Bool ? int64_t(v.b) : v.i; };
  if (a.kind == Kind::Float && b.kind == Kind::Float) {
    if (std::isnan(a.f) || std::isnan(b.f)) return 2;
    return a.f < b.f ? -1 : a.f > b.f ? 1 : 0;
  }
  if (a.kind == Kind::Float) {
    int c = cmp_int_float(ival(b), a.f);
    return c == 2 ? 2 : -c;
  }
  if (b.kind == Kind::Float) return cmp_int_float(ival(a), b.f);
  int64_t x = ival(a), y = ival(b);
  return x < y ? -1 : x > y ? 1 : 0;
}
}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return cmp_numbers(a, b) == 0;
    return (a.kind == Kind::Bool ? int64_t(a.b) : a.i) == (b.kind == Kind::Bool ? int64_t(b.b) : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.p == b.p || a.str() == b.str();
    case Kind::List: {
      auto &x = a.lst(), &y = b.lst();
      if (a.p == b.p) return true;
      if (x.generator || y.generator || x.view != y.view || x.tuple != y.tuple || x.items.size() != y.items.size())
        return false;
      for (size_t k = 0; k < x.items.size(); ++k)
        if (!equals(x.items[k], y.items[k])) return false;
      return true;
    }
    case Kind::Dict: {
      auto &x = a.dct(), &y = b.dct();
      if (a.p == b.p) return true;
      if (x.items.size() != y.items.size()) return false;
      for (auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Kind::Object: return a.p == b.p;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) throw JinjaError("UndefinedError", a.undefined_message());
  if (b.is_undefined()) throw JinjaError("UndefinedError", b.undefined_message());
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      int c = cmp_numbers(a, b);
      return c == 2 ? 0 : c;  // NaN: neither < nor >, as before
    }
    int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is how Python compares str.
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.lst().tuple == b.lst().tuple && a.lst().plain() && b.lst().plain()) {
    auto &x = a.lst().items, &y = b.lst().items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equals(x[k], y[k])) return compare(x[k], y[k], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  type_error(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

// --- UTF-8 ---------------------------------------------------------------------------------------

bool is_ascii(std::string_view s) {
  // Eight bytes at a time: every string the interpreter creates goes through here.
  size_t k = 0;
  for (; k + 8 <= s.size(); k += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + k, 8);
    if (w & 0x8080808080808080ull) return false;
  }
  for (; k < s.size(); ++k)
    if (static_cast<unsigned char>(s[k]) >= 0x80) return false;
  return true;
}

// Invalid bytes decode to U+DC80..U+DCFF (Python's surrogateescape) so that slicing and reversing
// keep them intact: encode_utf8 writes such code points back as the original byte.
uint32_t decode_utf8(std::string_view s, size_t& pos) {
  unsigned char c = s[pos];
  if (c < 0x80) {
    ++pos;
    return c;
  }
  int n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 1;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 2;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 3;
    cp = c & 0x07;
  }
  bool ok = n > 0 && pos + n < s.size();
  for (int k = 1; ok && k <= n; ++k) {
    unsigned char d = s[pos + k];
    ok = (d & 0xc0) == 0x80;
    cp = (cp << 6) | (d & 0x3f);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF, as a strict decoder does.
  if (ok && ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff))))
    ok = false;
  if (!ok) {
    ++pos;
    return 0xdc00 + c;
  }
  pos += n + 1;
  return cp;
}

void encode_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp >= 0xdc80 && cp <= 0xdcff) {
    out += char(cp & 0xff);
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

size_t cp_length(const StrObj& s) {
  if (s.ascii) return s.s.size();
  size_t n = 0;
  for (size_t pos = 0; pos < s.s.size(); ++n) decode_utf8(s.s, pos);
  return n;
}

std::vector<uint32_t> to_codepoints(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) cps.push_back(decode_utf8(s, pos));
  return cps;
}

bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// --- JSON ----------------------------------------------------------------------------------------

Value from_json(const nlohmann::ordered_json& j, int depth) {
  using T = nlohmann::ordered_json::value_t;
  if (depth > kMaxContextDepth)
    throw JinjaError("RecursionError", fmt::format("template context nested deeper than {} levels", kMaxContextDepth));
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      // Python ints are unbounded; past int64 we keep the magnitude as a float.
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case T::number_float: return Value::number(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::list(std::move(items));
    }
    case T::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(Value::string(it.key()), from_json(it.value(), depth + 1));
      return Value::dict(std::move(items));
    }
    default: type_error("unsupported JSON value in template context");
  }
}

nlohmann::ordered_json to_json(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return nullptr;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i;
    case Kind::Float: return v.f;
    case Kind::String: return v.str();
    case Kind::List: {
      auto a = nlohmann::ordered_json::array();
      for (auto& x : v.lst().items) a.push_back(to_json(x));
      return a;
    }
    case Kind::Dict: {
      auto o = nlohmann::ordered_json::object();
      for (auto& [k, x] : v.dct().items) o[to_str(k)] = to_json(x);
      return o;
    }
    case Kind::Object: {
      if (v.is_object(ObjType::Namespace)) {
        auto o = nlohmann::ordered_json::object();
        for (auto& [k, x] : v.as<NamespaceObj>().attrs) o[k] = to_json(x);
        return o;
      }
      return to_str(v);
    }
  }
  return nullptr;
}

static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    unsigned char c = s[pos];
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x7f) {
      out += char(c);
      ++pos;
      continue;
    }
    uint32_t cp = decode_utf8(s, pos);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            uint32_t x = cp - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (x >> 10), 0xdc00 + (x & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", cp);
          }
        } else {
          out.append(s.substr(start, pos - start));
        }
    }
  }
  out += '"';
}

static void json_newline(std::string& out, const JsonOptions& o, int level) {
  out += '\n';
  for (int k = 0; k < level; ++k) {
    if (o.indent_is_str)
      out += o.indent_str;
    else
      out.append(size_t(std::max(o.indent, 0)), ' ');
  }
}

static void json_float(std::string& out, double d) {
  if (std::isnan(d))
    out += "NaN";
  else if (std::isinf(d))
    out += d > 0 ? "Infinity" : "-Infinity";
  else
    out += py_float_repr(d);
}

void dump_json(std::string& out, const Value& v, const JsonOptions& o, int level) {
  bool pretty = o.indent >= 0 || o.indent_is_str;
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: append_str(out, v); return;
    case Kind::Float: json_float(out, v.f); return;
    case Kind::String: json_string(out, v.str(), o.ensure_ascii); return;
    case Kind::List: {
      if (!v.lst().plain()) break;
      auto& items = v.lst().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (pretty) json_newline(out, o, level + 1);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) {
          out += o.item_sep;
          if (pretty) json_newline(out, o, level + 1);
        }
        dump_json(out, items[k], o, level + 1);
      }
      if (pretty) json_newline(out, o, level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      auto& items = v.dct().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> kv;
      kv.reserve(items.size());
      for (auto& [k, x] : items) {
        std::string key;
        switch (k.kind) {
          case Kind::String: key = k.str(); break;
          case Kind::Bool: key = k.b ? "true" : "false"; break;
          case Kind::None: key = "null"; break;
          case Kind::Int: key = to_str(k); break;
          case Kind::Float: json_float(key, k.f); break;
          default: type_error(fmt::format("keys must be str, int, float, bool or None, not {}", type_name(k)));
        }
        kv.emplace_back(std::move(key), &x);
      }
      if (o.sort_keys) std::stable_sort(kv.begin(), kv.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += '{';
      if (pretty) json_newline(out, o, level + 1);
      for (size_t k = 0; k < kv.size(); ++k) {
        if (k) {
          out += o.item_sep;
          if (pretty) json_newline(out, o, level + 1);
        }
        json_string(out, kv[k].first, o.ensure_ascii);
        out += o.key_sep;
        dump_json(out, *kv[k].second, o, level + 1);
      }
      if (pretty) json_newline(out, o, level);
      out += '}';
      return;
    }
    default: break;
  }
  type_error(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
}

}  // namespace ts::chat::jinja
