#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <optional>
#include <fmt/format.h>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

namespace ts::grammar {
namespace {

// RFC 3339 full-date: each month's own last day, and February 29 only in leap years (divisible by
// 4, centuries only by 400), as validators (ajv-formats) check it.
constexpr const char* kDateRe =
    R"((\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))|)"
    R"((\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";

// Ordered: properties are generated in the schema's order.
using json = nlohmann::ordered_json;

// Whether a listed value (enum / const) satisfies the scalar keywords beside it: type, numeric
// bounds (draft-4 boolean exclusive forms too), multipleOf, string lengths in code points.
bool value_fits(const json& v, const json& s) {
  auto type_ok = [&](const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                       std::floor(v.get<double>()) == v.get<double>());
    return true;  // unknown type names are the type keyword's own error
  };
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string() && !type_ok(t->get<std::string>())) return false;
    if (t->is_array() && std::none_of(t->begin(), t->end(), [&](const json& x) { return x.is_string() && type_ok(x.get<std::string>()); }))
      return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    auto num = [&](const char* k) -> std::optional<double> {
      auto it = s.find(k);
      return it != s.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
    };
    auto flag = [&](const char* k) { return s.contains(k) && s[k].is_boolean() && s[k].get<bool>(); };
    if (auto m = num("minimum"); m && (flag("exclusiveMinimum") ? x <= *m : x < *m)) return false;
    if (auto m = num("maximum"); m && (flag("exclusiveMaximum") ? x >= *m : x > *m)) return false;
    if (auto m = num("exclusiveMinimum"); m && x <= *m) return false;
    if (auto m = num("exclusiveMaximum"); m && x >= *m) return false;
    if (auto m = num("multipleOf"); m && *m > 0) {
      const double q = x / *m;
      if (std::fabs(q - std::round(q)) > 1e-9 * std::max(1.0, std::fabs(q))) return false;
    }
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    const auto n = static_cast<int64_t>(std::count_if(str.begin(), str.end(), [](char c) { return (c & 0xC0) != 0x80; }));
    if (auto it = s.find("minLength"); it != s.end() && it->is_number_integer() && n < it->get<int64_t>()) return false;
    if (auto it = s.find("maxLength"); it != s.end() && it->is_number_integer() && n > it->get<int64_t>()) return false;
  }
  return true;
}

// Keywords beside a $ref that do not constrain the value (annotations, the ref's own context).
const std::set<std::string> kRefAnnotations = {"$ref", "$defs", "definitions", "title", "description", "$schema",
                                               "$id", "$comment", "default", "examples", "deprecated", "readOnly",
                                               "writeOnly", "$anchor"};

// The JSON types a "type" keyword admits (integer within number counted apart).
std::set<std::string> type_set(const json& t) {
  std::set<std::string> out;
  if (t.is_string()) out.insert(t.get<std::string>());
  if (t.is_array())
    for (const auto& x : t)
      if (x.is_string()) out.insert(x.get<std::string>());
  return out;
}

// allOf: one keyword two branches both set, to one value that means both: the tighter bound,
// the common types, the common enum values; anything else (two patterns, two formats) is a 400.
json merge_keyword(const std::string& k, const json& a, const json& b, const std::string& path) {
  auto fail = [&] {
    throw InvalidRequest(fmt::format("json_schema: allOf: conflicting '{}' cannot be merged at {}", k, path), "json_schema");
  };
  static const std::set<std::string> kLower = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"};
  static const std::set<std::string> kUpper = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"};
  if ((kLower.count(k) || kUpper.count(k)) && a.is_number() && b.is_number()) {
    const bool lo = kLower.count(k) > 0;
    return (a.get<double>() < b.get<double>()) == lo ? b : a;
  }
  if (k == "type") {
    std::set<std::string> ta = type_set(a), tb = type_set(b), both;
    for (const auto& t : ta) {
      if (tb.count(t)) both.insert(t);
      else if (t == "integer" && tb.count("number")) both.insert("integer");
    }
    for (const auto& t : tb)
      if (t == "integer" && ta.count("number")) both.insert("integer");
    if (both.empty()) fail();
    if (both.size() == 1) return *both.begin();
    json out = json::array();
    for (const auto& t : both) out.push_back(t);
    return out;
  }
  if (k == "enum" && a.is_array() && b.is_array()) {
    json out = json::array();
    for (const auto& v : a)
      if (std::find(b.begin(), b.end(), v) != b.end()) out.push_back(v);
    if (out.empty()) fail();
    return out;
  }
  if (k == "additionalProperties" && a.is_boolean() && b.is_boolean()) return a.get<bool>() && b.get<bool>();
  fail();
  return a;
}

// Keywords that constrain values in ways this grammar cannot express: rejected, not ignored
// (ignored under JsonSchemaOptions::lenient).
const std::set<std::string> kUnsupported = {"not", "if", "then", "else", "dependentSchemas",
                                            "dependentRequired", "dependencies", "uniqueItems", "contains",
                                            "unevaluatedProperties", "unevaluatedItems",
                                            "minContains", "maxContains", "$dynamicRef"};

// IPv6 text (format "ipv6"), h = 1-4 hex digits.
#define TS_H "[0-9a-fA-F]{1,4}"
#define TS_V4 "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
const char* const kIpv6 = "((" TS_H ":){7}" TS_H "|(" TS_H ":){1,7}:|(" TS_H ":){1,6}:" TS_H "|(" TS_H ":){1,5}(:" TS_H
                          "){1,2}|(" TS_H ":){1,4}(:" TS_H "){1,3}|(" TS_H ":){1,3}(:" TS_H "){1,4}|(" TS_H
                          ":){1,2}(:" TS_H "){1,5}|" TS_H ":(:" TS_H "){1,6}|:((:" TS_H "){1,7}|:)|(" TS_H
                          ":){6}" TS_V4 "|::([fF]{4}:)?" TS_V4 ")";

}  // namespace

const std::string* string_format_regex(std::string_view format) {
  static const std::map<std::string, std::string, std::less<>> kFormats = {
      {"date", kDateRe},
      {"time", R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"date-time",
       std::string("(") + kDateRe + R"()T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"email", R"([a-zA-Z0-9_.+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)+)"},
      {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
      {"uri", R"([a-zA-Z][a-zA-Z0-9+.-]*:[^\s"\\]+)"},
      // RFC 3339 appendix A: P and date parts, or a time part, or weeks; never a bare P / PT.
      {"duration",
       R"(P((\d+D|\d+M(\d+D)?|\d+Y(\d+M(\d+D)?)?)(T(\d+H(\d+M(\d+S)?)?|\d+M(\d+S)?|\d+S))?|T(\d+H(\d+M(\d+S)?)?|\d+M(\d+S)?|\d+S)|\d+W))"},
      // RFC 1123 labels; at most 8 labels of at most 30 characters, so the 253-character limit
      // always holds (a subset: longer valid names are not generated).
      {"hostname", R"([a-zA-Z0-9]([a-zA-Z0-9-]{0,28}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,28}[a-zA-Z0-9])?){0,7})"},
      // RFC 4291 text forms: eight groups, "::" compression, and a trailing IPv4 after six
      // groups or "::" / "::ffff:".
      {"ipv6", kIpv6}};
  auto it = kFormats.find(format);
  return it == kFormats.end() ? nullptr : &it->second;
}

namespace {
#undef TS_H
#undef TS_V4

// Lenient mode: ignored keywords of an object schema that may admit keys beyond its properties
// and additionalProperties (a pattern's keys, keys a conditional or dependent schema defines).
bool adds_keys(const json& s) {
  for (const char* k : {"patternProperties", "dependentSchemas", "dependencies", "if", "then", "else"})
    if (s.contains(k)) return true;
  // (unevaluatedProperties: false admits nothing more)
  return s.contains("unevaluatedProperties") && !(s["unevaluatedProperties"].is_boolean() && !s["unevaluatedProperties"].get<bool>());
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& opt) : root_(root), opt_(opt) {}

  Grammar run() {
    int r = g_.rule("root");
    g_.define(r, schema(root_, "#", 0));
    g_.set_root(r);
    g_.validate();
    return std::move(g_);
  }

  // A string's raw text (no quotes, no escapes): `re` with the lengths as string_schema holds
  // them beside a pattern (lenient: lengths it cannot hold exactly are dropped).
  Grammar raw_string(std::string_view re, int64_t lo, int64_t hi, const Ranges& not_open) {
    int r = g_.rule("root");
    const int e = add_regex(g_, re, false, false, not_open);
    if (lo < 0 || (hi >= 0 && hi < lo)) err("#", "bad minLength/maxLength");
    if (lo > 10000) err("#", "minLength above 10000 is not supported");
    g_.define(r, pattern_with_lengths(e, lo, std::min<int64_t>(hi, 10000), "#"));
    g_.set_root(r);
    g_.validate();
    return std::move(g_);
  }

  Grammar any(bool object_only) {
    int r = g_.rule("root");
    g_.define(r, object_only ? g_.ref(any_object()) : g_.ref(any_value()));
    g_.set_root(r);
    return std::move(g_);
  }

 private:
  [[noreturn]] static void err(const std::string& path, const std::string& what) {
    throw InvalidRequest(fmt::format("json_schema: {} at {}", what, path), "json_schema");
  }

  // Lazily defined shared rules.
  int shared(const char* name, int (SchemaCompiler::*body)()) {
    int r = g_.find_rule(name);
    if (r >= 0) return r;
    r = g_.rule(name);
    g_.define(r, (this->*body)());
    return r;
  }
  int ws_body() {
    if (!opt_.any_whitespace || opt_.max_whitespace == 0) return g_.empty();
    return g_.rep(g_.chars({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}}), 0, opt_.max_whitespace < 0 ? -1 : opt_.max_whitespace);
  }
  int ws() { return g_.ref(shared("ws", &SchemaCompiler::ws_body)); }
  int char_body() {
    int plain = g_.chars({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true);
    int hex = g_.chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    auto cls = [&](const char* s) {  // "0-7" style pairs, both cases
      Ranges r;
      for (const char* p = s; *p; p += 3) r.push_back({uint32_t(p[0]), uint32_t(p[2])});
      return g_.chars(r);
    };
    // \uXXXX outside the surrogates, or a high+low surrogate pair (lone surrogates are not text).
    int d = cls("d-dD-D");
    int bmp = g_.alt({g_.seq({cls("0-9a-cA-Ce-fE-F"), g_.rep(hex, 3, 3)}), g_.seq({d, cls("0-7"), g_.rep(hex, 2, 2)})});
    int pair = g_.seq({d, cls("8-9a-bA-B"), g_.rep(hex, 2, 2), g_.lit("\\u"), d, cls("c-fC-F"), g_.rep(hex, 2, 2)});
    int esc = g_.seq({g_.lit("\\"), g_.alt({g_.chars({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'},
                                                        {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                              g_.seq({g_.lit("u"), g_.alt({bmp, pair})})})});
    return g_.alt({plain, esc});
  }
  int jchar() { return g_.ref(shared("char", &SchemaCompiler::char_body)); }
  int string_body() { return g_.seq({g_.lit("\""), g_.star(jchar()), g_.lit("\"")}); }
  int string() { return g_.ref(shared("string", &SchemaCompiler::string_body)); }
  int digits() { return g_.chars({{'0', '9'}}); }
  int uint_body() { return g_.alt({g_.lit("0"), g_.seq({g_.chars({{'1', '9'}}), g_.star(digits())})}); }
  int uint() { return g_.ref(shared("uint", &SchemaCompiler::uint_body)); }
  int integer_body() { return g_.seq({g_.opt(g_.lit("-")), uint()}); }
  int integer() { return g_.ref(shared("integer", &SchemaCompiler::integer_body)); }
  int frac_exp() {
    return g_.seq({g_.opt(g_.seq({g_.lit("."), g_.plus(digits())})),
                   g_.opt(g_.seq({g_.chars({{'e', 'e'}, {'E', 'E'}}), g_.opt(g_.chars({{'+', '+'}, {'-', '-'}})), g_.plus(digits())}))});
  }
  int number_body() { return g_.seq({g_.opt(g_.lit("-")), uint(), frac_exp()}); }
  int number() { return g_.ref(shared("number", &SchemaCompiler::number_body)); }
  // value, object and array refer to each other: declared together, defined once.
  int any_value() {
    int r = g_.find_rule("value");
    if (r >= 0) return r;
    r = g_.rule("value");
    int o = g_.rule("object"), a = g_.rule("array");
    int member = g_.seq({string(), ws(), g_.lit(":"), ws(), g_.ref(r)});
    g_.define(o, g_.seq({g_.lit("{"), ws(),
                         g_.opt(g_.seq({member, g_.star(g_.seq({ws(), g_.lit(","), ws(), member})), ws()})), g_.lit("}")}));
    g_.define(a, g_.seq({g_.lit("["), ws(),
                         g_.opt(g_.seq({g_.ref(r), g_.star(g_.seq({ws(), g_.lit(","), ws(), g_.ref(r)})), ws()})), g_.lit("]")}));
    g_.define(r, g_.alt({g_.ref(o), g_.ref(a), string(), number(), g_.lit("true"), g_.lit("false"), g_.lit("null")}));
    return r;
  }
  int any_object() {
    any_value();
    return g_.find_rule("object");
  }

  // ---- integers in [lo, hi] (canonical decimal), exact -------------------------------------
  // Patterns over equal-length digit strings lo..hi: each a list of digit ranges.
  using Pat = std::vector<std::pair<char, char>>;
  static void same_len(const std::string& lo, const std::string& hi, Pat prefix, std::vector<Pat>& out) {
    size_t n = lo.size();
    if (n == 0) {
      out.push_back(prefix);
      return;
    }
    if (lo[0] == hi[0] || n == 1) {
      prefix.push_back({lo[0], hi[0]});
      if (n > 1) same_len(lo.substr(1), hi.substr(1), prefix, out);
      else out.push_back(prefix);
      return;
    }
    char start = lo[0], end = hi[0];
    std::string lrest = lo.substr(1), hrest = hi.substr(1);
    if (lrest.find_first_not_of('0') != std::string::npos) {
      Pat p = prefix;
      p.push_back({lo[0], lo[0]});
      same_len(lrest, std::string(n - 1, '9'), p, out);
      ++start;
    }
    bool hi_full = hrest.find_first_not_of('9') == std::string::npos;
    if (!hi_full) --end;
    if (start <= end) {
      Pat p = prefix;
      p.push_back({start, end});
      for (size_t k = 1; k < n; ++k) p.push_back({'0', '9'});
      out.push_back(p);
    }
    if (!hi_full) {
      Pat p = prefix;
      p.push_back({hi[0], hi[0]});
      same_len(std::string(n - 1, '0'), hrest, p, out);
    }
  }
  // Non-negative [a, b]; b < 0 = unbounded above.
  int nonneg_range(int64_t a, int64_t b) {
    std::vector<Pat> pats;
    std::string as = std::to_string(a);
    size_t top = b < 0 ? as.size() : std::to_string(b).size();
    for (size_t len = as.size(); len <= top; ++len) {
      int64_t lo = std::max<int64_t>(a, len == 1 ? 0 : static_cast<int64_t>(std::pow(10.0, double(len - 1))));
      int64_t cap = static_cast<int64_t>(std::pow(10.0, double(len))) - 1;
      int64_t hi = b < 0 ? cap : std::min(b, cap);
      if (lo <= hi) same_len(std::to_string(lo), std::to_string(hi), {}, pats);
    }
    std::vector<int> alts;
    for (const Pat& p : pats) {
      std::vector<int> items;
      for (auto [x, y] : p) items.push_back(g_.chars({{uint32_t(x), uint32_t(y)}}));
      alts.push_back(g_.seq(items));
    }
    if (b < 0)  // and every longer number
      alts.push_back(g_.seq({g_.chars({{'1', '9'}}), g_.rep(digits(), static_cast<int>(top), -1)}));
    return g_.alt(alts);
  }
  static constexpr int64_t kBig = 1'000'000'000'000'000'000;  // 1e18: beyond, bounds are not encoded
  int int_range(std::optional<int64_t> olo, std::optional<int64_t> ohi, const std::string& path) {
    // Plain values + flags (GCC 12 misreads optionals here as maybe-uninitialized).
    bool has_lo = olo.has_value() && std::llabs(*olo) < kBig, has_hi = ohi.has_value() && std::llabs(*ohi) < kBig;
    int64_t lo = has_lo ? *olo : 0, hi = has_hi ? *ohi : 0;
    if (has_lo && has_hi && lo > hi) err(path, fmt::format("minimum {} is above maximum {}", lo, hi));
    if (!has_lo && !has_hi) return integer();
    std::vector<int> alts;
    if (!has_lo || lo < 0) {  // negatives: "-" then a magnitude in [max(1, -hi), -lo]
      int64_t mlo = has_hi ? std::max<int64_t>(1, -hi) : 1;
      int64_t mhi = has_lo ? -lo : -1;
      if (mhi < 0 || mlo <= mhi) alts.push_back(g_.seq({g_.lit("-"), nonneg_range(mlo, mhi)}));
    }
    if (!has_hi || hi >= 0) alts.push_back(nonneg_range(has_lo ? std::max<int64_t>(0, lo) : 0, has_hi ? hi : -1));
    return g_.alt(alts);
  }

  static std::optional<double> num(const json& s, const char* key) {
    auto it = s.find(key);
    if (it == s.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  }

  // multipleOf where this grammar can hold it; lenient (tool parameters): otherwise ignored.
  std::optional<int> multiple_or_lenient(const json& s, bool integer, const std::string& path) {
    if (!s.contains("multipleOf")) return std::nullopt;
    if (!opt_.lenient) return multiple_of(s, integer, path);
    try {
      return multiple_of(s, integer, path);
    } catch (const InvalidRequest&) {  // thrown before any rule is made
      return std::nullopt;
    }
  }

  int integer_schema(const json& s, const std::string& path) {
    if (auto m = multiple_or_lenient(s, true, path)) return *m;
    // The tighter of minimum and exclusiveMinimum where both are given (and of the maxima).
    std::optional<int64_t> lo, hi;
    auto tighten = [](std::optional<int64_t>& cur, int64_t v, bool lower) {
      cur = !cur ? v : lower ? std::max(*cur, v) : std::min(*cur, v);
    };
    const bool x4lo = s.value("exclusiveMinimum", json()).is_boolean() && s["exclusiveMinimum"].get<bool>();  // draft 4
    const bool x4hi = s.value("exclusiveMaximum", json()).is_boolean() && s["exclusiveMaximum"].get<bool>();
    if (auto v = num(s, "minimum")) tighten(lo, int64_t(std::ceil(*v)) + (x4lo && std::ceil(*v) == *v), true);
    if (auto v = num(s, "exclusiveMinimum")) tighten(lo, int64_t(std::floor(*v)) + 1, true);
    if (auto v = num(s, "maximum")) tighten(hi, int64_t(std::floor(*v)) - (x4hi && std::floor(*v) == *v), false);
    if (auto v = num(s, "exclusiveMaximum")) tighten(hi, int64_t(std::ceil(*v)) - 1, false);
    return int_range(lo, hi, path);
  }

  // ---- numbers in a range, exact ------------------------------------------------------------
  // A bounded number is written without an exponent: a canonical integer part, then an optional
  // "." and digits. Its language is built digit by digit against the bounds' decimal digits, so a
  // value is admitted exactly when it lies in the range (0.1 as written, not as a double).
  //
  // A bound as a decimal: |x| = ip.fp (ip canonical, fp without trailing zeros), from the JSON
  // number's shortest text (nlohmann writes doubles round-trip: 0.1 -> "0.1", 1e-05).
  struct Dec {
    bool neg = false;
    std::string ip = "0", fp;
    bool zero() const { return ip == "0" && fp.empty(); }
  };
  // nullopt: a magnitude of 1e18 or more (not encoded, as for integers).
  std::optional<Dec> to_dec(const json& v, const std::string& path) {
    std::string t = v.dump();
    Dec d;
    size_t i = 0;
    if (i < t.size() && t[i] == '-') d.neg = true, ++i;
    std::string digs;
    int64_t point = -1, exp = 0;
    for (; i < t.size() && t[i] != 'e' && t[i] != 'E'; ++i) {
      if (t[i] == '.') point = int64_t(digs.size());
      else digs += t[i];
    }
    if (point < 0) point = int64_t(digs.size());
    if (i < t.size()) exp = std::stoll(t.substr(i + 1));
    point += exp;
    if (point > 18 + int64_t(digs.size())) return std::nullopt;
    std::string ip, fp;
    if (point <= 0) {
      ip = "0";
      fp = std::string(size_t(-point), '0') + digs;
    } else if (point >= int64_t(digs.size())) {
      ip = digs + std::string(size_t(point - int64_t(digs.size())), '0');
    } else {
      ip = digs.substr(0, size_t(point));
      fp = digs.substr(size_t(point));
    }
    ip.erase(0, std::min(ip.find_first_not_of('0'), ip.size() - 1));
    while (!fp.empty() && fp.back() == '0') fp.pop_back();
    if (ip.size() > 18) return std::nullopt;
    if (fp.size() > 64) err(path, fmt::format("a number bound with more than 64 fractional digits ({})", t));
    d.ip = ip;
    d.fp = fp;
    if (d.zero()) d.neg = false;
    return d;
  }
  // Compares magnitudes, then signed values.
  static int cmp_mag(const Dec& a, const Dec& b) {
    if (a.ip.size() != b.ip.size()) return a.ip.size() < b.ip.size() ? -1 : 1;
    if (int c = a.ip.compare(b.ip)) return c < 0 ? -1 : 1;
    if (int c = a.fp.compare(b.fp)) return c < 0 ? -1 : 1;  // trailing zeros stripped: lexicographic
    return 0;
  }
  static int cmp(const Dec& a, const Dec& b) {
    if (a.neg != b.neg) return a.neg ? -1 : 1;
    int c = cmp_mag(a, b);
    return a.neg ? -c : c;
  }

  // Digit strings s compared with a bound's fraction digits as decimal fractions (0.s vs 0.b);
  // `ne` leaves out the empty string (after "." a digit must follow). -1 = no string.
  int any_digits(bool ne) { return ne ? g_.plus(digits()) : g_.star(digits()); }
  int alt_of(std::vector<int> alts) {
    alts.erase(std::remove(alts.begin(), alts.end(), -1), alts.end());
    if (alts.empty()) return -1;
    return alts.size() == 1 ? alts[0] : g_.alt(alts);
  }
  int then(int first, int rest) { return rest < 0 ? -1 : g_.seq({first, rest}); }
  int above(char d) { return d < '9' ? g_.seq({g_.chars({{uint32_t(d + 1), '9'}}), g_.star(digits())}) : -1; }
  int below(char d) { return d > '0' ? g_.seq({g_.chars({{'0', uint32_t(d - 1)}}), g_.star(digits())}) : -1; }
  int frac_ge(const std::string& a, bool ne) {  // s >= a
    if (a.empty()) return any_digits(ne);
    return alt_of({above(a[0]), then(g_.lit(a.substr(0, 1)), frac_ge(a.substr(1), false))});
  }
  int frac_gt(const std::string& a, bool ne) {  // s > a (never empty)
    (void)ne;
    if (a.empty()) return g_.seq({g_.star(g_.lit("0")), g_.chars({{'1', '9'}}), g_.star(digits())});
    return alt_of({above(a[0]), then(g_.lit(a.substr(0, 1)), frac_gt(a.substr(1), false))});
  }
  int frac_le(const std::string& b, bool ne) {  // s <= b
    if (b.empty()) return ne ? g_.plus(g_.lit("0")) : g_.star(g_.lit("0"));
    return alt_of({ne ? -1 : g_.empty(), below(b[0]), then(g_.lit(b.substr(0, 1)), frac_le(b.substr(1), false))});
  }
  int frac_lt(const std::string& b, bool ne) {  // s < b
    if (b.empty()) return -1;
    return alt_of({ne ? -1 : g_.empty(), below(b[0]), then(g_.lit(b.substr(0, 1)), frac_lt(b.substr(1), false))});
  }
  // a < b (as fractions): a <(=) s <(=) b.
  int frac_between(const std::string& a, const std::string& b, bool ax, bool bx, bool ne) {
    const char a0 = a.empty() ? '0' : a[0], b0 = b[0];  // b > a >= 0: b has a digit
    const std::string ar = a.empty() ? "" : a.substr(1), br = b.substr(1);
    int empty = !ne && a.empty() && !ax ? g_.empty() : -1;
    if (a0 == b0) return alt_of({empty, then(g_.lit(std::string(1, a0)), frac_between(ar, br, ax, bx, false))});
    int mid = b0 - a0 > 1 ? g_.seq({g_.chars({{uint32_t(a0 + 1), uint32_t(b0 - 1)}}), g_.star(digits())}) : -1;
    return alt_of({empty, then(g_.lit(std::string(1, a0)), ax ? frac_gt(ar, false) : frac_ge(ar, false)), mid,
                   then(g_.lit(std::string(1, b0)), bx ? frac_lt(br, false) : frac_le(br, false))});
  }
  // The optional fraction part of a language of digit strings: "" (when `empty`) or "." digits.
  int fraction(int nonempty, bool empty) {
    return alt_of({empty ? g_.empty() : -1, nonempty < 0 ? -1 : g_.seq({g_.lit("."), nonempty})});
  }
  // Non-negative m written as above, lo <(=) m <(=) hi (hi nullopt: unbounded). -1 = none.
  int magnitude_range(const Dec& lo, bool lox, const std::optional<Dec>& hi, bool hix) {
    if (hi) {
      int c = cmp_mag(lo, *hi);
      if (c > 0 || (c == 0 && (lox || hix))) return -1;
      if (c == 0)  // exactly lo: its digits, then any zeros
        return g_.seq({g_.lit(lo.ip), lo.fp.empty() ? g_.opt(g_.seq({g_.lit("."), g_.plus(g_.lit("0"))}))
                                                    : g_.seq({g_.lit("." + lo.fp), g_.star(g_.lit("0"))})});
    }
    if (hi && lo.ip == hi->ip)
      return then(g_.lit(lo.ip), fraction(frac_between(lo.fp, hi->fp, lox, hix, true), lo.fp.empty() && !lox));
    const int64_t a = std::stoll(lo.ip), b = hi ? std::stoll(hi->ip) : -1;
    int first = then(g_.lit(lo.ip), fraction(lox ? frac_gt(lo.fp, true) : frac_ge(lo.fp, true), lo.fp.empty() && !lox));
    int mid = -1;
    if (!hi || a + 1 <= b - 1)
      mid = g_.seq({nonneg_range(a + 1, hi ? b - 1 : -1), g_.opt(g_.seq({g_.lit("."), g_.plus(digits())}))});
    // Integer part B: "B" itself is below hi unless hi is exactly B and exclusive.
    int last = hi ? then(g_.lit(hi->ip), fraction(hix ? frac_lt(hi->fp, true) : frac_le(hi->fp, true),
                                                  !hix || !hi->fp.empty()))
                  : -1;
    return alt_of({first, mid, last});
  }

  // The bounds of a number or integer schema as decimals: the tighter of minimum /
  // exclusiveMinimum (and draft 4's boolean exclusive flags), likewise the maxima.
  struct Bounds {
    std::optional<Dec> lo, hi;
    bool lox = false, hix = false;
  };
  Bounds bounds_of(const json& s, const std::string& path) {
    Bounds b;
    auto bound = [&](const char* key, bool exclusive, bool lower) {
      auto it = s.find(key);
      if (it == s.end() || !it->is_number()) return;
      std::optional<Dec> d = to_dec(*it, path);
      if (!d) return;
      std::optional<Dec>& cur = lower ? b.lo : b.hi;
      bool& x = lower ? b.lox : b.hix;
      int c = cur ? cmp(*d, *cur) : (lower ? 1 : -1);
      if (lower ? c > 0 : c < 0) cur = d, x = exclusive;
      else if (c == 0) x = x || exclusive;
    };
    auto draft4 = [&](const char* k) { return s.value(k, json()).is_boolean() && s[k].get<bool>(); };
    bound("minimum", draft4("exclusiveMinimum"), true);
    bound("exclusiveMinimum", true, true);
    bound("maximum", draft4("exclusiveMaximum"), false);
    bound("exclusiveMaximum", true, false);
    return b;
  }

  // ---- multipleOf ---------------------------------------------------------------------------
  // m = P x 10^-k. x is a multiple of m exactly when N = |x| x 10^k is an integer divisible by P:
  // at most k significant fraction digits, and N mod P (a state machine over the digits) ends at
  // 0. Bounds: both finite with at most kMaxEnumerated multiples between them -> the multiples
  // themselves; else what the state machine can add -- no negatives, no zero, no positives
  // (minimum 0 / exclusiveMinimum 0 / maximum 0 ...). Other bounds are refused.
  static constexpr int64_t kMaxEnumerated = 4096;
  static int64_t pow10(int n) {
    int64_t r = 1;
    while (n-- > 0) r *= 10;
    return r;
  }
  // |d| x 10^scale as an integer, signed; nullopt when it does not fit 18 digits or has finer digits.
  static std::optional<int64_t> scaled(const Dec& d, int scale) {
    if (int(d.fp.size()) > scale || d.ip.size() + size_t(scale) > 18) return std::nullopt;
    std::string digits = (d.ip == "0" ? "" : d.ip) + d.fp + std::string(size_t(scale) - d.fp.size(), '0');
    int64_t v = digits.empty() ? 0 : std::stoll(digits);
    return d.neg ? -v : v;
  }
  static std::string decimal_text(int64_t v, int scale) {  // v x 10^-scale, canonical
    std::string sign = v < 0 ? "-" : "";
    std::string d = std::to_string(v < 0 ? -v : v);
    if (scale == 0) return sign + d;
    if (d.size() <= size_t(scale)) d = std::string(size_t(scale) + 1 - d.size(), '0') + d;
    std::string ip = d.substr(0, d.size() - size_t(scale)), fp = d.substr(d.size() - size_t(scale));
    while (!fp.empty() && fp.back() == '0') fp.pop_back();
    return sign + ip + (fp.empty() ? "" : "." + fp);
  }
  static int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
  static int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

  int multiple_of(const json& s, bool integer, const std::string& path) {
    const json& mv = s["multipleOf"];
    if (!mv.is_number() || mv.get<double>() <= 0) err(path, "'multipleOf' must be a positive number");
    std::optional<Dec> md = to_dec(mv, path);
    if (!md) err(path, "'multipleOf' is too large");
    int k = int(md->fp.size());
    std::optional<int64_t> pm = scaled(*md, k);
    if (!pm || *pm <= 0) err(path, "'multipleOf' has too many digits");
    int64_t P = *pm;
    if (integer) {  // integers that are multiples of P x 10^-k: multiples of P / gcd(P, 10^k)
      P /= std::gcd(P, pow10(k));
      k = 0;
    }
    Bounds b = bounds_of(s, path);
    // Both bounds: the multiples between them, when few.
    int scale = k;
    for (const auto* d : {b.lo ? &*b.lo : nullptr, b.hi ? &*b.hi : nullptr})
      if (d) scale = std::max(scale, int(d->fp.size()));
    std::optional<int64_t> L, H;
    if (b.lo) L = scaled(*b.lo, scale);
    if (b.hi) H = scaled(*b.hi, scale);
    if ((b.lo && !L) || (b.hi && !H) || scale > 18 || P > pow10(18 - scale))
      err(path, "'multipleOf' with bounds of these sizes is not supported");
    const int64_t M = P * pow10(scale - k);  // m at `scale`
    std::optional<int64_t> first, last;      // multiples (index i: value i x m) inside the bounds
    if (L) first = *L % M == 0 ? *L / M + (b.lox ? 1 : 0) : ceil_div(*L, M);
    if (H) last = *H % M == 0 ? *H / M - (b.hix ? 1 : 0) : floor_div(*H, M);
    if (first && last && *first > *last) err(path, "no multiple of 'multipleOf' lies within the bounds");
    if (first && last && *last - *first < kMaxEnumerated) {
      std::vector<int> alts;
      for (int64_t i = *first; i <= *last; ++i) alts.push_back(g_.lit(decimal_text(i * P, k)));
      return g_.alt(alts);
    }
    bool neg_ok = true, zero_ok = true, pos_ok = true;
    if (first) {
      if (*first < 0) err(path, "'multipleOf' with a negative minimum and no nearby maximum is not supported");
      neg_ok = false;
      zero_ok = *first == 0;
      if (*first > 1) err(path, "'multipleOf' with a minimum above the first multiple and no nearby maximum is not supported");
    }
    if (last) {
      if (*last > 0) err(path, "'multipleOf' with a positive maximum and no nearby minimum is not supported");
      pos_ok = false;
      zero_ok = zero_ok && *last == 0;
      if (*last < -1) err(path, "'multipleOf' with a maximum below the first negative multiple and no nearby minimum is not supported");
    }
    if (P * int64_t(k + 2) > 20000) err(path, "'multipleOf' is too fine-grained for its grammar (more than 20000 states)");
    int mag = positive_multiples(P, k, integer);
    int zero = integer ? g_.lit("0") : g_.seq({g_.lit("0"), g_.opt(g_.seq({g_.lit("."), g_.plus(g_.lit("0"))}))});
    return alt_of({pos_ok ? mag : -1, zero_ok ? zero : -1, neg_ok ? g_.seq({g_.lit("-"), mag}) : -1});
  }
  // Positive x written without an exponent (integer part canonical; numbers: "." and digits, any
  // zeros past the k-th) with |x| x 10^k an integer divisible by P.
  int positive_multiples(int64_t P, int k, bool integer) {
    // ip[r]: inside the integer part, N mod P = r so far; frac[j][r]: j fraction digits read.
    const size_t np = static_cast<size_t>(P), nk = static_cast<size_t>(k);
    std::vector<int> ip(np);
    std::vector<std::vector<int>> frac(nk + 1, std::vector<int>(np, -1));
    for (auto& r : ip) r = g_.rule(g_.fresh_name("mul-int"));
    auto digit = [&](int d) { return g_.lit(std::string(1, char('0' + d))); };
    // After j fraction digits with state r, the value ends here when r x 10^(k-j) = 0 mod P.
    auto ends_at = [&](int j, int64_t r) {
      int64_t v = r;
      for (int t = j; t < k; ++t) v = v * 10 % P;
      return v == 0;
    };
    // live[j][r]: some continuation ends validly (dead states get no rule and no references).
    std::vector<std::vector<char>> live(nk + 1, std::vector<char>(np, 0));
    for (int j = k; j >= 1; --j)
      for (int64_t r = 0; r < P; ++r) {
        bool l = ends_at(j, r);
        for (int d = 0; d <= 9 && !l && j < k; ++d) l = live[size_t(j + 1)][size_t((r * 10 + d) % P)];
        live[size_t(j)][size_t(r)] = l;
        if (l) frac[size_t(j)][size_t(r)] = g_.rule(g_.fresh_name("mul-frac"));
      }
    auto to_frac = [&](int d, int j, int64_t r) {  // digit d, then fraction state (j, r), or -1
      int t = frac[size_t(j)][size_t(r)];
      return t < 0 ? -1 : g_.seq({digit(d), g_.ref(t)});
    };
    for (int j = 1; j <= k; ++j)
      for (int64_t r = 0; r < P; ++r) {
        if (frac[size_t(j)][size_t(r)] < 0) continue;
        std::vector<int> alts;
        if (ends_at(j, r)) alts.push_back(g_.empty());
        if (j < k)
          for (int d = 0; d <= 9; ++d) alts.push_back(to_frac(d, j + 1, (r * 10 + d) % P));
        else
          alts.push_back(g_.plus(g_.lit("0")));  // past the k-th digit: zeros only (r == 0 here)
        g_.define(frac[size_t(j)][size_t(r)], alt_of(alts));
      }
    // The fraction after an integer part in state r: none, or "." and at least one digit.
    auto fraction_after = [&](int64_t r) {
      std::vector<int> alts;
      if (ends_at(0, r)) alts.push_back(g_.empty());
      if (integer) return alt_of(alts);
      if (k == 0) {
        if (r == 0) alts.push_back(g_.seq({g_.lit("."), g_.plus(g_.lit("0"))}));
      } else {
        std::vector<int> firsts;
        for (int d = 0; d <= 9; ++d) firsts.push_back(to_frac(d, 1, (r * 10 + d) % P));
        int f = alt_of(firsts);
        if (f >= 0) alts.push_back(g_.seq({g_.lit("."), f}));
      }
      return alt_of(alts);
    };
    for (int64_t r = 0; r < P; ++r) {
      std::vector<int> alts;
      for (int d = 0; d <= 9; ++d) alts.push_back(g_.seq({digit(d), g_.ref(ip[size_t((r * 10 + d) % P)])}));
      int f = fraction_after(r);
      if (f >= 0) alts.push_back(f);
      g_.define(ip[size_t(r)], g_.alt(alts));
    }
    // "0." and zeros, then a first nonzero digit within the k places: positive values below 1.
    std::vector<int> below_one;
    if (!integer && k > 0)
      for (int z = 0; z < k; ++z)  // z zeros, then digit d at place z + 1
        for (int d = 1; d <= 9; ++d) {
          int t = to_frac(d, z + 1, d % P);
          if (t >= 0) below_one.push_back(g_.seq({g_.lit("0." + std::string(size_t(z), '0')), t}));
        }
    std::vector<int> alts;
    for (int d = 1; d <= 9; ++d) alts.push_back(g_.seq({digit(d), g_.ref(ip[size_t(d % P)])}));
    alts.insert(alts.end(), below_one.begin(), below_one.end());
    return g_.alt(alts);
  }

  int number_schema(const json& s, const std::string& path) {
    if (auto m = multiple_or_lenient(s, false, path)) return *m;
    const Bounds b = bounds_of(s, path);
    const std::optional<Dec>& lo = b.lo;
    const std::optional<Dec>& hi = b.hi;
    const bool lox = b.lox, hix = b.hix;
    if (!lo && !hi) return number();
    if (lo && hi && (cmp(*lo, *hi) > 0 || (cmp(*lo, *hi) == 0 && (lox || hix))))
      err(path, "no number satisfies the bounds (minimum is above maximum)");
    // x < 0 as "-" and a magnitude in [|hi| or 0, |lo| or unbounded]; x >= 0 as a magnitude.
    int neg = -1, pos = -1;
    if (!lo || lo->neg) {
      Dec mlo;  // 0
      bool mlox = false;
      if (hi && (hi->neg || hi->zero())) mlo = *hi, mlo.neg = false, mlox = hix;
      std::optional<Dec> mhi;
      if (lo) mhi = *lo, mhi->neg = false;
      neg = then(g_.lit("-"), magnitude_range(mlo, mlox, mhi, lo && lox));
    }
    if (!hi || !hi->neg) {
      Dec plo;  // 0
      bool plox = false;
      if (lo && !lo->neg) plo = *lo, plox = lox;
      pos = magnitude_range(plo, plox, hi, hix);
    }
    int r = alt_of({neg, pos});
    if (r < 0) err(path, "no number satisfies the bounds");
    return r;
  }

  // The decoded characters (code points) a JSON-string regex expression spans: [min, max], max
  // -1 = unbounded. Literals are escaped JSON text ("\\n" is one character).
  std::pair<int64_t, int64_t> span(int id, int depth = 0) {
    const Expr& e = g_.expr(id);
    auto add = [](int64_t a, int64_t b) { return a < 0 || b < 0 ? int64_t(-1) : a + b; };
    switch (e.kind) {
      case Expr::kEmpty: return {0, 0};
      case Expr::kChars: return {1, 1};
      case Expr::kLiteral: {
        int64_t n = 0;
        for (size_t i = 0; i < e.bytes.size(); ++n) {
          const unsigned char c = static_cast<unsigned char>(e.bytes[i]);
          if (c == '\\') i += i + 1 < e.bytes.size() && e.bytes[i + 1] == 'u' ? 6 : 2;
          else i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        }
        return {n, n};
      }
      case Expr::kSeq: {
        std::pair<int64_t, int64_t> r{0, 0};
        for (int k : e.kids) {
          auto [a, b] = span(k, depth + 1);
          r = {r.first + a, add(r.second, b)};
        }
        return r;
      }
      case Expr::kAlt: {
        std::pair<int64_t, int64_t> r{INT64_MAX, 0};
        for (int k : e.kids) {
          auto [a, b] = span(k, depth + 1);
          r = {std::min(r.first, a), r.second < 0 || b < 0 ? -1 : std::max(r.second, b)};
        }
        return r;
      }
      case Expr::kRepeat: {
        auto [a, b] = span(e.kids[0], depth + 1);
        return {a * e.min, e.max < 0 ? (b == 0 ? 0 : -1) : (b < 0 ? -1 : b * e.max)};
      }
      case Expr::kRef:
        if (depth > 64) return {0, -1};
        return span(g_.rule_body(e.rule), depth + 1);
    }
    return {0, -1};
  }

  // pattern with minLength / maxLength: exact where the pattern's own length range lies inside the
  // bounds, or the pattern is one repeated class (^[a-z0-9_]+$: the repetition takes the bounds);
  // otherwise refused (lenient: the lengths are ignored).
  int pattern_with_lengths(int re, int64_t lo, int64_t hi, const std::string& path) {
    if (lo == 0 && hi < 0) return re;
    auto [plo, phi] = span(re);
    if (plo >= lo && (hi < 0 || (phi >= 0 && phi <= hi))) return re;
    // Down to the one part that is not empty (anchors and groups leave empty and one-kid sequences).
    int id = re;
    while (g_.expr(id).kind == Expr::kSeq) {
      int only = -1, parts = 0;
      for (int k : g_.expr(id).kids)
        if (g_.expr(k).kind != Expr::kEmpty) only = k, ++parts;
      if (parts != 1) break;
      id = only;
    }
    // A sequence of parts (or one part: ^[a-z0-9_]+$): its repetitions of one character
    // ("elastic") share what the bounds leave after the other parts, evenly, and grow in turn to
    // reach minLength. A subset of the strings both allow (never one outside either).
    {
      const Expr& e = g_.expr(id);
      std::vector<int> parts = e.kind == Expr::kSeq ? e.kids : std::vector<int>{id};
      std::vector<size_t> elastic;
      int64_t fixed_min = 0, fixed_max = 0;
      bool bounded = true;
      for (size_t i = 0; i < parts.size(); ++i) {
        const Expr& pe = g_.expr(parts[i]);
        if (pe.kind == Expr::kRepeat && span(pe.kids[0]) == std::pair<int64_t, int64_t>{1, 1}) {
          elastic.push_back(i);
          continue;
        }
        auto [a, b] = span(parts[i]);
        fixed_min += a;
        if (b < 0) bounded = false;
        else fixed_max += b;
      }
      if (!elastic.empty() && (bounded || hi < 0)) {
        std::vector<int64_t> mins, maxs;
        int64_t sum_min = fixed_min;
        for (size_t i : elastic) {
          const Expr& pe = g_.expr(parts[i]);
          mins.push_back(pe.min);
          maxs.push_back(pe.max);  // -1: unbounded
          sum_min += pe.min;
        }
        const size_t n = elastic.size();
        // minLength first: the missing characters spread over the repetitions (as far as each goes).
        for (int pass = 0; pass < 2 && sum_min < lo; ++pass)
          for (size_t j = 0; j < n && sum_min < lo; ++j) {
            const int64_t want = pass == 0 ? (lo - sum_min + int64_t(n - j) - 1) / int64_t(n - j) : lo - sum_min;
            const int64_t grow = maxs[j] < 0 ? want : std::min(want, maxs[j] - mins[j]);
            mins[j] += grow;
            sum_min += grow;
          }
        if (sum_min < lo) err(path, "no string satisfies 'pattern' and minLength");
        // maxLength: what is left after every minimum, shared evenly.
        if (hi >= 0) {
          int64_t budget = hi - fixed_max;
          for (int64_t m : mins) budget -= m;
          if (budget < 0) err(path, "no string satisfies 'pattern' within minLength / maxLength");
          const int64_t share = budget / int64_t(n);
          for (size_t j = 0; j < n; ++j) maxs[j] = maxs[j] < 0 ? mins[j] + share : std::min(maxs[j], mins[j] + share);
        }
        for (size_t j = 0; j < elastic.size(); ++j)
          parts[elastic[j]] = g_.rep(g_.expr(parts[elastic[j]]).kids[0], int(mins[j]), int(maxs[j]));
        return g_.seq(parts);
      }
    }
    // Any other pattern under a maxLength: each unbounded repetition gets a cap of extra copies,
    // raised in turn (round robin) while the longest string still fits (a subset again).
    if (hi >= 0 && plo >= lo && plo <= hi) {
      std::map<int, int64_t> caps;  // unbounded repetition (expr id) -> extra copies allowed
      if (collect_unbounded(re, caps, 0)) {
        for (bool grew = true; grew;) {
          grew = false;
          for (auto& [id, c] : caps) {
            ++c;
            const std::optional<int64_t> m = capped_max(re, caps, 0);
            if (m && *m <= hi) grew = true;
            else --c;
          }
        }
        const std::optional<int64_t> m = capped_max(re, caps, 0);
        if (m && *m <= hi) return capped(re, caps);
      }
    }
    if (opt_.lenient) return re;
    err(path, "'pattern' together with minLength / maxLength is supported where the pattern's repetitions can "
              "take the bounds (e.g. ^[a-z]+@[a-z]+\\.com$) or its own lengths lie within them");
  }
  // The unbounded repetitions of `id` (false: a rule reference, which is not rewritten).
  bool collect_unbounded(int id, std::map<int, int64_t>& caps, int depth) {
    const Expr& e = g_.expr(id);
    if (depth > 200 || e.kind == Expr::kRef) return false;
    if (e.kind == Expr::kRepeat && e.max < 0) caps[id] = 0;
    for (int k : e.kids)
      if (!collect_unbounded(k, caps, depth + 1)) return false;
    return true;
  }
  // The longest string of `id` with those caps.
  std::optional<int64_t> capped_max(int id, const std::map<int, int64_t>& caps, int depth) {
    const Expr& e = g_.expr(id);
    if (depth > 200) return std::nullopt;
    switch (e.kind) {
      case Expr::kEmpty: return 0;
      case Expr::kChars: case Expr::kLiteral: return span(id).second;
      case Expr::kSeq: case Expr::kAlt: {
        int64_t r = 0;
        for (int k : e.kids) {
          auto m = capped_max(k, caps, depth + 1);
          if (!m) return std::nullopt;
          r = e.kind == Expr::kSeq ? r + *m : std::max(r, *m);
        }
        return r;
      }
      case Expr::kRepeat: {
        auto m = capped_max(e.kids[0], caps, depth + 1);
        if (!m) return std::nullopt;
        auto c = caps.find(id);
        const int64_t copies = e.max >= 0 ? e.max : c == caps.end() ? -1 : e.min + c->second;
        if (copies < 0) return std::nullopt;
        return *m * copies;
      }
      case Expr::kRef: return std::nullopt;
    }
    return std::nullopt;
  }
  int capped(int id, const std::map<int, int64_t>& caps) {  // `id` rebuilt with those caps
    const Expr e = g_.expr(id);  // a copy: adding expressions below may move the table
    switch (e.kind) {
      case Expr::kSeq: case Expr::kAlt: {
        std::vector<int> kids;
        for (int k : e.kids) kids.push_back(capped(k, caps));
        return e.kind == Expr::kSeq ? g_.seq(kids) : g_.alt(kids);
      }
      case Expr::kRepeat: {
        const int kid = capped(e.kids[0], caps);
        auto c = caps.find(id);
        return g_.rep(kid, e.min, e.max >= 0 || c == caps.end() ? e.max : int(e.min + c->second));
      }
      default: return id;
    }
  }

  int string_schema(const json& s, const std::string& path) {
    int64_t len_lo = 0, len_hi = -1;
    if (auto v = num(s, "minLength")) len_lo = static_cast<int64_t>(*v);
    if (auto v = num(s, "maxLength")) len_hi = static_cast<int64_t>(*v);
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) err(path, "'pattern' must be a string");
      std::string p = s["pattern"].get<std::string>();
      int re = -1;
      try {
        re = add_regex(g_, p, true);
      } catch (const InvalidRequest& e) {
        // Lenient (tool parameters): a valid ECMAScript pattern this grammar cannot express
        // (lookaround, backreferences) is ignored like any unexpressible keyword.
        if (!opt_.lenient || !ecma_regex_ok(p)) err(path, fmt::format("bad 'pattern': {}", e.what()));
      }
      if (re < 0) {
        json rest = s;
        rest.erase("pattern");
        return string_schema(rest, path);
      }
      if (len_lo < 0 || (len_hi >= 0 && len_hi < len_lo)) err(path, "bad minLength/maxLength");
      if (len_lo > 10000 || len_hi > 10000) err(path, "minLength/maxLength above 10000 are not supported");
      return g_.seq({g_.lit("\""), pattern_with_lengths(re, len_lo, len_hi, path), g_.lit("\"")});
    }
    if (s.contains("format") && s["format"].is_string()) {
      if (const std::string* fre = string_format_regex(s["format"].get<std::string>())) {
        const int re = add_regex(g_, *fre, true);
        if (len_lo == 0 && len_hi < 0) return g_.seq({g_.lit("\""), re, g_.lit("\"")});
        // minLength / maxLength beside a format bound the format's own strings (as beside a pattern).
        if (len_lo < 0 || (len_hi >= 0 && len_hi < len_lo)) err(path, "bad minLength/maxLength");
        if (len_lo > 10000 || len_hi > 10000) err(path, "minLength/maxLength above 10000 are not supported");
        return g_.seq({g_.lit("\""), pattern_with_lengths(re, len_lo, len_hi, path), g_.lit("\"")});
      }
      // Unknown formats are annotations (as the spec allows).
    }
    int lo = 0, hi = -1;
    if (auto v = num(s, "minLength")) lo = static_cast<int>(*v);
    if (auto v = num(s, "maxLength")) hi = static_cast<int>(*v);
    if (lo < 0 || (hi >= 0 && hi < lo)) err(path, "bad minLength/maxLength");
    if (lo > 10000 || hi > 10000) err(path, "minLength/maxLength above 10000 are not supported");
    if (lo == 0 && hi < 0) return string();
    return g_.seq({g_.lit("\""), g_.rep(jchar(), lo, hi), g_.lit("\"")});
  }

  // uniqueItems over a finite set of scalar items (enum / const / boolean, pydantic's set[Literal]
  // and set[Enum]): the values not used yet, tracked as a subset; at most kMaxUniqueValues values.
  static constexpr int kMaxUniqueValues = 8;
  std::optional<std::vector<std::string>> finite_items(const json& s, const std::string& path) {
    if (!s.contains("items") || !s["items"].is_object() || s.contains("prefixItems")) return std::nullopt;
    json it = s["items"];
    for (int hop = 0; it.is_object() && it.contains("$ref") && it.size() == 1 && hop < 64; ++hop)
      it = resolve(it["$ref"].get<std::string>(), path);
    std::vector<json> vals;
    if (it.contains("enum") && it["enum"].is_array()) vals.assign(it["enum"].begin(), it["enum"].end());
    else if (it.contains("const")) vals = {it["const"]};
    else if (it.value("type", json()) == json("boolean")) vals = {json(false), json(true)};
    else return std::nullopt;
    std::vector<std::string> out;
    for (const json& v : vals) {
      if (v.is_object() || v.is_array()) return std::nullopt;
      std::string d = v.dump();
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    }
    if (int(out.size()) > kMaxUniqueValues) return std::nullopt;
    return out;
  }
  int unique_items(const std::vector<std::string>& vals, int lo, int hi, const std::string& path) {
    const int k = int(vals.size());
    if (hi < 0 || hi > k) hi = k;
    if (lo > hi) err(path, "minItems is above the number of distinct items uniqueItems allows");
    auto sep = [&] { return g_.seq({ws(), g_.lit(","), ws()}); };
    // after[mask]: what may follow once the values in `mask` are used (at least one).
    std::vector<int> after(size_t(1) << k, -1);
    for (int mask = (1 << k) - 1; mask >= 1; --mask) {
      const int used = __builtin_popcount(unsigned(mask));
      if (used > hi) continue;
      std::vector<int> alts;
      if (used >= lo) alts.push_back(g_.empty());
      for (int v = 0; v < k && used < hi; ++v)
        if (!(mask >> v & 1) && after[size_t(mask | 1 << v)] >= 0)
          alts.push_back(g_.seq({sep(), g_.lit(vals[size_t(v)]), g_.ref(after[size_t(mask | 1 << v)])}));
      if (alts.empty()) continue;
      int r = g_.rule(g_.fresh_name("uniq"));
      g_.define(r, alt_of(alts));
      after[size_t(mask)] = r;
    }
    std::vector<int> firsts;
    for (int v = 0; v < k && hi > 0; ++v)
      if (after[size_t(1) << v] >= 0) firsts.push_back(g_.seq({g_.lit(vals[size_t(v)]), g_.ref(after[size_t(1) << v])}));
    int body = alt_of(firsts);
    if (body < 0) return g_.seq({g_.lit("["), ws(), g_.lit("]")});
    body = g_.seq({body, ws()});
    return g_.seq({g_.lit("["), ws(), lo == 0 ? g_.opt(body) : body, g_.lit("]")});
  }

  int array_schema(const json& s, const std::string& path, int depth) {
    int lo = 0, hi = -1;
    if (auto v = num(s, "minItems")) lo = static_cast<int>(*v);
    if (auto v = num(s, "maxItems")) hi = static_cast<int>(*v);
    if (lo < 0 || (hi >= 0 && hi < lo)) err(path, "bad minItems/maxItems");
    if (lo > 10000 || hi > 10000) err(path, "minItems/maxItems above 10000 are not supported");
    if (s.value("uniqueItems", json(false)) == json(true))
      if (auto vals = finite_items(s, path)) return unique_items(*vals, lo, hi, path);
    std::vector<int> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) err(path, "'prefixItems' must be an array");
      for (size_t k = 0; k < s["prefixItems"].size(); ++k)
        prefix.push_back(schema(s["prefixItems"][k], fmt::format("{}/prefixItems/{}", path, k), depth + 1));
    }
    bool items_false = s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>();
    int item = -1;
    if (!items_false) {
      if (s.contains("items") && s["items"].is_array()) {  // draft-4 tuple form
        for (size_t k = 0; k < s["items"].size(); ++k)
          prefix.push_back(schema(s["items"][k], fmt::format("{}/items/{}", path, k), depth + 1));
        items_false = !(s.contains("additionalItems") && !(s["additionalItems"].is_boolean() && !s["additionalItems"].get<bool>()));
        if (!items_false) item = schema(s.value("additionalItems", json(true)), path + "/additionalItems", depth + 1);
      } else {
        item = s.contains("items") ? schema(s["items"], path + "/items", depth + 1) : g_.ref(any_value());
      }
    }
    auto sep = [&] { return g_.seq({ws(), g_.lit(","), ws()}); };
    int n = static_cast<int>(prefix.size());
    if (items_false) {
      if (lo > n) err(path, "minItems is above the number of allowed items");
      hi = hi < 0 ? n : std::min(hi, n);
    }
    // Elements: prefix[0..n) then `item` repeated; length in [lo, hi]. Built from the end: tail(k)
    // = what may follow after k elements.
    std::function<int(int)> tail = [&](int k) -> int {
      if (hi >= 0 && k >= hi) return g_.empty();
      if (k >= n) {
        if (item < 0) return g_.empty();
        int need = std::max(0, lo - k), more = hi < 0 ? -1 : hi - k;
        if (more == 0) return g_.empty();
        return g_.rep(g_.seq({sep(), item}), need, more);
      }
      int next = g_.seq({sep(), prefix[k], tail(k + 1)});
      return k >= lo ? g_.opt(next) : next;
    };
    int first;
    if (hi == 0) {
      first = -1;
    } else if (n > 0) {
      first = g_.seq({prefix[0], tail(1)});
    } else if (item >= 0) {
      first = g_.seq({item, tail(1)});
    } else {
      first = -1;
    }
    if (first < 0) {
      if (lo > 0) err(path, "minItems cannot be met");
      return g_.seq({g_.lit("["), ws(), g_.lit("]")});
    }
    int body = g_.seq({first, ws()});
    return g_.seq({g_.lit("["), ws(), lo > 0 ? body : g_.opt(body), g_.lit("]")});
  }

  static bool ecma_regex_ok(const std::string& p) {
    try {
      std::regex r(p, std::regex::ECMAScript);
      return true;
    } catch (const std::regex_error&) {
      return false;
    }
  }

  // ---- keys: patternProperties / propertyNames ------------------------------------------------
  // JSON Schema's patterns search (unanchored); ECMAScript std::regex decides at compile time
  // whether a declared name matches.
  bool search(const std::string& pattern, const std::string& key, const std::string& path) {
    try {
      return std::regex_search(key, std::regex(pattern, std::regex::ECMAScript));
    } catch (const std::regex_error& e) {
      err(path, fmt::format("bad pattern '{}' ({})", pattern, e.what()));
    }
  }
  // The pattern as the whole of a key: a leading ^ / trailing $ dropped, else .* in their place.
  static std::string whole_match(std::string p) {
    const bool start = !p.empty() && p[0] == '^';
    const bool end = p.size() > (start ? 1u : 0u) && p.back() == '$' && (p.size() < 2 || p[p.size() - 2] != '\\');
    if (start) p.erase(0, 1);
    if (end) p.pop_back();
    return (start ? "" : ".*") + ("(?:" + p + ")") + (end ? "" : ".*");
  }
  // Patterns that cannot match one key: anchored (^) with literal prefixes neither of which
  // starts the other.
  static bool disjoint_patterns(const std::string& a, const std::string& b) {
    auto prefix = [](const std::string& p) {
      std::string r;
      if (p.empty() || p[0] != '^') return std::optional<std::string>();
      for (size_t i = 1; i < p.size(); ++i) {
        const char c = p[i];
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == ' ' || c == ':' || c == '/'))
          break;
        if (i + 1 < p.size() && (p[i + 1] == '*' || p[i + 1] == '?' || p[i + 1] == '{')) break;  // c optional
        r += c;
      }
      return std::optional<std::string>(r);
    };
    auto pa = prefix(a), pb = prefix(b);
    if (!pa || !pb) return false;
    const size_t n = std::min(pa->size(), pb->size());
    return pa->compare(0, n, *pb, 0, n) != 0;
  }
  static json json_with_type(json s, const char* type) {
    if (!s.contains("type")) s["type"] = type;
    return s;
  }
  // propertyNames as this grammar holds it: a string schema of pattern / minLength / maxLength /
  // enum / const / format (annotations allowed).
  void check_property_names(const json& n, const std::string& path) {
    if (n.is_boolean()) {
      if (!n.get<bool>()) err(path, "'propertyNames' false is not supported");
      return;
    }
    if (!n.is_object()) err(path, "'propertyNames' must be a schema");
    for (const auto& [k, v] : n.items()) {
      static const std::set<std::string> ok = {"type", "pattern", "minLength", "maxLength", "enum", "const", "format",
                                               "title", "description", "$comment", "examples"};
      if (!ok.count(k)) err(path, fmt::format("'propertyNames' with '{}' is not supported", k));
      if (k == "type" && !(v.is_string() && v.get<std::string>() == "string"))
        err(path, "'propertyNames' must describe strings");
    }
  }
  // Whether declared name `k` satisfies propertyNames (checked above).
  bool name_allowed(const json& n, const std::string& k, const std::string& path) {
    if (n.is_boolean()) return n.get<bool>();
    size_t len = 0;
    for (unsigned char c : k) len += (c & 0xC0) != 0x80;
    if (n.contains("minLength") && n["minLength"].is_number() && double(len) < n["minLength"].get<double>()) return false;
    if (n.contains("maxLength") && n["maxLength"].is_number() && double(len) > n["maxLength"].get<double>()) return false;
    if (n.contains("const") && n["const"] != json(k)) return false;
    if (n.contains("enum") && n["enum"].is_array() &&
        std::find(n["enum"].begin(), n["enum"].end(), json(k)) == n["enum"].end())
      return false;
    if (n.contains("pattern") && n["pattern"].is_string() && !search(n["pattern"].get<std::string>(), k, path)) return false;
    return true;
  }

  int object_schema(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, int>> props;  // key literal, value expr
    std::vector<bool> req;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) err(path, "'required' must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) err(path, "'required' entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    // patternProperties / propertyNames (lenient mode ignores them: any further keys, below).
    const bool strict_keys = !opt_.lenient;
    std::vector<std::pair<std::string, json>> patterns;  // pattern, its schema
    if (strict_keys && s.contains("patternProperties")) {
      if (!s["patternProperties"].is_object()) err(path, "'patternProperties' must be an object");
      for (const auto& [p, ps] : s["patternProperties"].items()) patterns.push_back({p, ps});
    }
    const json* names = strict_keys && s.contains("propertyNames") ? &s["propertyNames"] : nullptr;
    if (names) check_property_names(*names, path);
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) err(path, "'properties' must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        // A declared name propertyNames refuses can never appear.
        if (names && !name_allowed(*names, k, path)) {
          if (required.count(k)) err(path, fmt::format("required property '{}' fails 'propertyNames'", k));
          continue;
        }
        // A declared name a pattern also matches holds both schemas.
        json eff = v;
        for (const auto& [p, ps] : patterns)
          if (search(p, k, path)) eff = json{{"allOf", json::array({eff, ps})}};
        props.push_back({json(k).dump(), schema(eff, path + "/properties/" + k, depth + 1)});
        req.push_back(required.count(k) > 0);
      }
    }
    bool required_elsewhere = false;  // (lenient: a required key the properties do not define)
    for (const auto& r : required)
      if (!s.contains("properties") || !s["properties"].contains(r)) {
        if (!opt_.lenient) err(path, fmt::format("required property '{}' is not in 'properties'", r));
        required_elsewhere = true;
      }
    int addl = -1;  // value expr of additional properties, -1 = none allowed
    if (!patterns.empty()) {
      // Exact only when no key outside the patterns is admitted and no key can match two of them.
      const bool closed = s.contains("additionalProperties")
                              ? s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>()
                              : opt_.strict;
      if (!closed)
        err(path, "'patternProperties' is supported with additionalProperties false (keys outside the patterns "
                  "cannot be told apart from keys inside them)");
      if (names) err(path, "'patternProperties' together with 'propertyNames' is not supported");
      for (size_t i = 0; i < patterns.size(); ++i)
        for (size_t j = i + 1; j < patterns.size(); ++j)
          if (!disjoint_patterns(patterns[i].first, patterns[j].first))
            err(path, fmt::format("'patternProperties' '{}' and '{}' may match the same key (supported: patterns "
                                  "anchored with distinct literal prefixes, e.g. ^S_ and ^I_)",
                                  patterns[i].first, patterns[j].first));
    } else if (opt_.lenient && (adds_keys(s) || required_elsewhere)) {
      addl = g_.ref(any_value());  // keys the ignored keywords may admit: any (a superset)
    } else if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) addl = schema(a, path + "/additionalProperties", depth + 1);
    } else if (!opt_.strict || props.empty()) {
      addl = g_.ref(any_value());
    }
    // minProperties / maxProperties: members are counted (c), up to the largest bound that still
    // matters (past minProperties with no maximum, the count no longer changes anything).
    int64_t min_p = 0, max_p = -1;
    if (auto v = num(s, "minProperties")) min_p = static_cast<int64_t>(std::ceil(*v));
    if (auto v = num(s, "maxProperties")) max_p = static_cast<int64_t>(std::floor(*v));
    if (min_p < 0 || (max_p >= 0 && max_p < min_p)) err(path, "bad minProperties/maxProperties");
    if (std::max(min_p, max_p) > 256) err(path, "minProperties/maxProperties above 256 are not supported");
    const int64_t cap = max_p >= 0 ? max_p : min_p;
    auto sep = [&] { return g_.seq({ws(), g_.lit(","), ws()}); };
    int n = static_cast<int>(props.size());
    auto item = [&](int i) { return g_.seq({g_.lit(props[i].first), ws(), g_.lit(":"), ws(), props[i].second}); };
    // An additional member: a key (propertyNames' strings, or any) and the additional schema; or
    // a key a pattern matches (as a whole, a subset of JSON Schema's search) and its schema.
    int addl_item = -1;
    if (addl >= 0) {
      int key = names ? schema(json_with_type(*names, "string"), path + "/propertyNames", depth + 1) : string();
      addl_item = g_.seq({key, ws(), g_.lit(":"), ws(), addl});
    }
    if (!patterns.empty()) {
      std::vector<int> alts;
      for (const auto& [p, ps] : patterns) {
        int key;
        try {
          key = g_.seq({g_.lit("\""), add_regex(g_, whole_match(p), true), g_.lit("\"")});
        } catch (const InvalidRequest& e) {
          err(path, fmt::format("bad 'patternProperties' pattern '{}': {}", p, e.what()));
        }
        alts.push_back(g_.seq({key, ws(), g_.lit(":"), ws(), schema(ps, path + "/patternProperties/" + p, depth + 1)}));
      }
      addl_item = alt_of(alts);
    }
    // rest(i, c): after c members (c >= 1), the members from property i on; -1 = none can follow
    // validly. Rules, so the shared suffixes are built once.
    std::map<std::pair<int, int64_t>, int> rest_memo;
    std::function<int(int, int64_t)> rest = [&](int i, int64_t c) -> int {
      auto key = std::pair{i, c};
      if (auto it = rest_memo.find(key); it != rest_memo.end()) return it->second;
      int e;
      if (i == n) {
        const int64_t need = std::max<int64_t>(0, min_p - c), more = max_p < 0 ? -1 : max_p - c;
        if (addl_item < 0) e = need > 0 ? -1 : g_.empty();
        else e = more == 0 ? (need > 0 ? -1 : g_.empty()) : g_.rep(g_.seq({sep(), addl_item}), int(need), int(more));
      } else {
        int after = max_p >= 0 && c + 1 > max_p ? -1 : rest(i + 1, std::min(c + 1, std::max<int64_t>(cap, 1)));
        int take = after < 0 ? -1 : g_.seq({sep(), item(i), after});
        e = alt_of({take, req[i] ? -1 : rest(i + 1, c)});
      }
      if (e >= 0) {
        int r = g_.rule(g_.fresh_name("obj-rest"));
        g_.define(r, e);
        e = g_.ref(r);
      }
      return rest_memo[key] = e;
    };
    // first(i): the first member is at property i or later.
    std::vector<int> first(n + 1, -1);
    if (addl_item >= 0 && max_p != 0) {
      int after = rest(n, std::min<int64_t>(1, std::max<int64_t>(cap, 1)));
      if (after >= 0) first[n] = g_.seq({addl_item, after});
    }
    for (int i = n - 1; i >= 0; --i) {
      int after = max_p == 0 ? -1 : rest(i + 1, std::min<int64_t>(1, std::max<int64_t>(cap, 1)));
      int e = alt_of({after < 0 ? -1 : g_.seq({item(i), after}), req[i] ? -1 : first[i + 1]});
      if (e >= 0) {
        int r = g_.rule(g_.fresh_name("obj-first"));
        g_.define(r, e);
        e = g_.ref(r);
      }
      first[i] = e;
    }
    const bool empty_ok = required.empty() && min_p == 0;
    if (first[0] < 0) {
      if (!empty_ok) err(path, "no object satisfies 'required' / minProperties / maxProperties");
      return g_.seq({g_.lit("{"), ws(), g_.lit("}")});
    }
    int body = g_.seq({first[0], ws()});
    return g_.seq({g_.lit("{"), ws(), empty_ok ? g_.opt(body) : body, g_.lit("}")});
  }

  int typed(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "string") return string_schema(s, path);
    if (t == "integer") return integer_schema(s, path);
    if (t == "number") return number_schema(s, path);
    if (t == "boolean") return g_.alt({g_.lit("true"), g_.lit("false")});
    if (t == "null") return g_.lit("null");
    if (t == "object") return object_schema(s, path, depth);
    if (t == "array") return array_schema(s, path, depth);
    err(path, fmt::format("unknown type '{}'", t));
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') err(path, fmt::format("only local $ref ('#...') is supported, got '{}'", ref));
    const json* cur = &root_;
    size_t i = 1;
    if (i < ref.size() && ref[i] != '/') err(path, fmt::format("bad $ref '{}'", ref));
    while (i < ref.size()) {
      size_t j = ref.find('/', i + 1);
      std::string part = ref.substr(i + 1, j == std::string::npos ? std::string::npos : j - i - 1);
      std::string un;  // JSON pointer escapes: ~1 = '/', ~0 = '~'
      for (size_t q = 0; q < part.size(); ++q) {
        if (part[q] == '~' && q + 1 < part.size() && (part[q + 1] == '0' || part[q + 1] == '1')) {
          un += part[q + 1] == '1' ? '/' : '~';
          ++q;
        } else {
          un += part[q];
        }
      }
      part = un;
      if (cur->is_object() && cur->contains(part)) {
        cur = &(*cur)[part];
      } else if (cur->is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
                 std::stoul(part) < cur->size()) {
        cur = &(*cur)[std::stoul(part)];
      } else {
        err(path, fmt::format("$ref '{}' does not resolve", ref));
      }
      i = j == std::string::npos ? ref.size() : j;
    }
    return *cur;
  }

  int schema(const json& s, const std::string& path, int depth) {
    if (depth > 200) err(path, "schema nested too deeply");
    if (s.is_boolean()) {
      if (!s.get<bool>()) err(path, "schema 'false' matches nothing");
      return g_.ref(any_value());
    }
    if (!s.is_object()) err(path, "a schema must be an object or a boolean");
    if (!opt_.lenient)
      for (const auto& [k, v] : s.items()) {
        if (k == "uniqueItems" && (v == json(false) || finite_items(s, path))) continue;  // held exactly
        if (kUnsupported.count(k)) err(path, fmt::format("unsupported keyword '{}'", k));
      }
    int e = schema_inner(s, path, depth);
    if (s.value("nullable", false)) e = g_.alt({e, g_.lit("null")});
    return e;
  }

  int schema_inner(const json& s, const std::string& path, int depth) {
    if (s.contains("$ref") && s["$ref"].is_string()) {
      // 2020-12: keywords beside a $ref apply too (the referenced schema and them, as allOf).
      json rest = json::object();
      for (const auto& [k, v] : s.items())
        if (!kRefAnnotations.count(k)) rest[k] = v;
      if (!rest.empty()) return schema(json{{"allOf", json::array({json{{"$ref", s["$ref"]}}, rest})}}, path, depth + 1);
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) err(path, "'$ref' must be a string");
      std::string ref = s["$ref"].get<std::string>();
      auto it = refs_.find(ref);
      if (it != refs_.end()) return g_.ref(it->second);
      std::string name = ref == "#" ? "root-ref" : ref.substr(ref.rfind('/') + 1);
      std::string clean;
      for (char c : name) clean += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
      int r = g_.rule(g_.fresh_name("def-" + clean));
      refs_.emplace(ref, r);
      const json& target = resolve(ref, path);
      g_.define(r, schema(target, ref, depth + 1));
      return g_.ref(r);
    }
    if (s.contains("const") || s.contains("enum")) {
      // The listed values that also satisfy the keywords beside them (type, numeric bounds,
      // multipleOf, string lengths; const and enum together: both), as a validator applies all.
      std::vector<json> vals;
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) err(path, "'enum' must be a non-empty array");
        vals.assign(s["enum"].begin(), s["enum"].end());
      }
      if (s.contains("const")) {
        if (s.contains("enum") && std::find(vals.begin(), vals.end(), s["const"]) == vals.end()) vals.clear();
        else vals = {s["const"]};
      }
      std::erase_if(vals, [&](const json& v) { return !value_fits(v, s); });
      if (vals.empty())
        err(path, "no 'enum' / 'const' value satisfies the keywords beside it (type, bounds, lengths)");
      std::vector<int> alts;
      for (const auto& v : vals) alts.push_back(g_.lit(v.dump()));
      return alts.size() == 1 ? alts[0] : g_.alt(alts);
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) {
        if (!s[k].is_array() || s[k].empty()) err(path, fmt::format("'{}' must be a non-empty array", k));
        std::vector<int> alts;
        for (size_t i = 0; i < s[k].size(); ++i) {
          json sub = s[k][i];
          // Sibling keywords (e.g. properties next to oneOf) apply to every branch.
          if (sub.is_object())
            for (const auto& [kk, vv] : s.items())
              if (kk != k && kk != "$defs" && kk != "definitions" && !sub.contains(kk)) sub[kk] = vv;
          alts.push_back(schema(sub, fmt::format("{}/{}/{}", path, k, i), depth + 1));
        }
        return g_.alt(alts);
      }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array() || s["allOf"].empty()) err(path, "'allOf' must be a non-empty array");
      json merged = s;
      merged.erase("allOf");
      for (size_t i = 0; i < s["allOf"].size(); ++i) {
        json sub = s["allOf"][i];
        while (sub.is_object() && sub.contains("$ref") && sub.size() == 1) sub = resolve(sub["$ref"].get<std::string>(), path);
        if (!sub.is_object()) err(path, "allOf entries must be schemas");
        for (const auto& [k, v] : sub.items()) {
          if (k == "properties" && v.is_object()) {
            // A property both branches declare must satisfy both subschemas.
            for (const auto& [pk, pv] : v.items()) {
              json& slot = merged["properties"][pk];
              slot = slot.is_null() || slot == pv ? pv : json{{"allOf", json::array({slot, pv})}};
            }
          } else if (k == "required") {
            for (const auto& r : v) merged["required"].push_back(r);
          } else if (!merged.contains(k)) {
            merged[k] = v;
          } else if (merged[k] != v && k != "title" && k != "description") {
            merged[k] = merge_keyword(k, merged[k], v, path);
          }
        }
      }
      return schema(merged, path, depth + 1);
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) return typed(s, t.get<std::string>(), path, depth);
      if (t.is_array() && !t.empty()) {
        std::vector<int> alts;
        for (const auto& x : t) {
          if (!x.is_string()) err(path, "'type' entries must be strings");
          alts.push_back(typed(s, x.get<std::string>(), path, depth));
        }
        return g_.alt(alts);
      }
      err(path, "'type' must be a string or a non-empty array of strings");
    }
    // No type: infer it from the keywords, else any value.
    for (const char* k : {"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                          "minProperties", "maxProperties"})
      if (s.contains(k)) return object_schema(s, path, depth);
    for (const char* k : {"items", "prefixItems", "minItems", "maxItems"})
      if (s.contains(k)) return array_schema(s, path, depth);
    for (const char* k : {"pattern", "minLength", "maxLength", "format"})
      if (s.contains(k)) return string_schema(s, path);
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
      if (s.contains(k)) return number_schema(s, path);
    return g_.ref(any_value());
  }

  const json& root_;
  JsonSchemaOptions opt_;
  Grammar g_;
  std::map<std::string, int> refs_;
};

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opt) {
  return SchemaCompiler(schema, opt).run();
}

Grammar json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& opt) {
  return SchemaCompiler(json(schema), opt).run();
}

Grammar raw_string_grammar(std::string_view pattern, int64_t min_length, int64_t max_length, const Ranges& not_in_open_classes) {
  static const json kNone = json::object();
  JsonSchemaOptions opt;
  opt.lenient = true;
  return SchemaCompiler(kNone, opt).raw_string(pattern, min_length, max_length, not_in_open_classes);
}

Grammar json_schema_grammar(std::string_view text, const JsonSchemaOptions& opt) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidRequest(fmt::format("json_schema: not valid JSON: {}", e.what()), "json_schema");
  }
  return json_schema_grammar(j, opt);
}

Grammar json_object_grammar(const JsonSchemaOptions& opt) { return SchemaCompiler(json(), opt).any(true); }
Grammar json_value_grammar(const JsonSchemaOptions& opt) { return SchemaCompiler(json(), opt).any(false); }

}  // namespace ts::grammar
