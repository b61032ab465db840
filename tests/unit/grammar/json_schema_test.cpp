// JSON Schema -> grammar: hand-written schemas (pydantic output, recursion, deep nesting, huge
// enums) and hundreds of generated ones, each checked by a reference validator: sampled
// sentences are valid, and for mutated strings "the grammar accepts" == "the validator accepts".
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <set>

#include "grammar/json_schema.h"
#include "grammar_util.h"

namespace ts::grammar {
namespace {
using json = nlohmann::ordered_json;  // schema key order = property order
using test::matches;

size_t cp_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A validator for the subset the generator emits (and the hand-written tests use).
bool valid(const json& s, const json& v, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    std::string r = s["$ref"];
    return valid(r == "#" ? root : root.at(json::json_pointer(r.substr(1))), v, root);
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) {
    for (const auto& e : s["enum"])
      if (e == v) return true;
    return false;
  }
  if (s.contains("anyOf")) {
    for (const auto& a : s["anyOf"])
      if (valid(a, v, root)) return true;
    return false;
  }
  if (!s.contains("type")) return true;
  if (s["type"].is_array()) {
    for (const auto& t : s["type"]) {
      json one = s;
      one["type"] = t;
      if (valid(one, v, root)) return true;
    }
    return false;
  }
  std::string t = s["type"];
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer" || t == "number") {
    if (t == "integer" ? !(v.is_number_integer()) : !v.is_number()) return false;
    double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    return true;
  }
  if (t == "string") {
    if (!v.is_string()) return false;
    std::string x = v;
    if (s.contains("minLength") && cp_len(x) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && cp_len(x) > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") && !std::regex_match(x, std::regex(s["pattern"].get<std::string>()))) return false;
    return true;
  }
  if (t == "array") {
    if (!v.is_array()) return false;
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    for (const auto& x : v)
      if (!valid(s.value("items", json(true)), x, root)) return false;
    return true;
  }
  if (t == "object") {
    if (!v.is_object()) return false;
    for (const auto& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (!valid(s["properties"][k], x, root)) return false;
      } else if (!s.value("additionalProperties", json(false)).is_object() &&
                 !s.value("additionalProperties", json(false)).get<bool>()) {
        return false;
      }
    }
    return true;
  }
  return false;
}

class SchemaGen {
 public:
  explicit SchemaGen(uint32_t seed) : rng_(seed) {}
  json gen(int depth) {
    int k = static_cast<int>(rng_() % (depth >= 3 ? 6 : 9));
    switch (k) {
      case 0: {
        json s = {{"type", "string"}};
        int r = static_cast<int>(rng_() % 4);
        if (r == 1) s["maxLength"] = 1 + rng_() % 5, s["minLength"] = rng_() % 2;
        if (r == 2) s["pattern"] = pick({"[a-z]+", "[A-Z][a-z]{0,3}", "\\d{2,3}-x?", "(ab|cd)*"});
        if (r == 3) s = {{"enum", {"red", "green", "a b", "x\"y"}}};
        return s;
      }
      case 1: {
        json s = {{"type", "integer"}};
        if (rng_() % 2) s["minimum"] = static_cast<int>(rng_() % 200) - 100;
        if (rng_() % 2) s["maximum"] = static_cast<int>(s.value("minimum", -100) + static_cast<int>(rng_() % 1000));
        return s;
      }
      case 2: {
        json s = {{"type", "number"}};
        if (rng_() % 2) s["minimum"] = rng_() % 2 ? 0.0 : double(int(rng_() % 200) - 100) / 10.0;
        if (rng_() % 3 == 0) s["maximum"] = s.value("minimum", -10.0) + double(rng_() % 300) / 10.0;
        return s;
      }
      case 3: return {{"type", "boolean"}};
      case 4: return {{"type", json::array({pick({"string", "integer", "boolean"}), "null"})}};
      case 5: return {{"const", pick({"fixed", "42"})}};
      case 6: {
        json s = {{"type", "array"}, {"items", gen(depth + 1)}};
        if (rng_() % 2) s["minItems"] = rng_() % 2;
        if (rng_() % 2) s["maxItems"] = 1 + rng_() % 3;
        return s;
      }
      case 7: return {{"anyOf", {gen(depth + 1), gen(depth + 1)}}};
      default: {
        json s = {{"type", "object"}, {"properties", json::object()}};
        int n = static_cast<int>(rng_() % 5);
        json req = json::array();
        for (int i = 0; i < n; ++i) {
          std::string key = std::string(1, static_cast<char>('a' + i)) + pick({"", "_id", "Name"});
          s["properties"][key] = gen(depth + 1);
          if (rng_() % 2) req.push_back(key);
        }
        if (!req.empty()) s["required"] = req;
        s["additionalProperties"] = n == 0 && rng_() % 2 ? json(true) : json(false);
        return s;
      }
    }
  }

 private:
  std::string pick(std::initializer_list<const char*> xs) { return *(xs.begin() + rng_() % xs.size()); }
  std::mt19937 rng_;
};

// 1 = valid JSON that satisfies the schema, 0 = not, -1 = a number nlohmann cannot hold (1e999).
int parse_valid(const json& schema, const std::string& text) {
  try {
    return valid(schema, json::parse(text), schema) ? 1 : 0;
  } catch (const json::out_of_range&) {
    return -1;
  } catch (const json::exception&) {
    return 0;
  }
}

TEST(JsonSchema, GeneratedSchemasAgreeWithTheValidator) {
  std::mt19937 rng(42);
  const std::string alphabet = "{}[]\",: 0123456789-.aenrtulsfxE\n";
  double worst_ms = 0;
  size_t worst_mem = 0;
  int checked = 0;
  for (uint32_t seed = 0; seed < 300; ++seed) {
    json schema = SchemaGen(seed).gen(0);
    auto t0 = std::chrono::steady_clock::now();
    Grammar g = json_schema_grammar(schema);
    auto cg = test::compile(g);
    worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    worst_mem = std::max(worst_mem, cg->memory_bytes());
    test::Sampler sampler(g, seed);
    for (int i = 0; i < 4; ++i) {
      std::string x = sampler.sample();
      ASSERT_TRUE(matches(cg, x)) << schema.dump() << "\n" << x;
      int ok = parse_valid(schema, x);
      if (ok < 0) continue;
      ASSERT_EQ(ok, 1) << schema.dump() << "\n" << x;
      for (int k = 0; k < 6; ++k) {
        std::string y = x;
        int op = static_cast<int>(rng() % 3);
        size_t at = y.empty() ? 0 : rng() % y.size();
        char c = alphabet[rng() % alphabet.size()];
        if (op == 0 && !y.empty()) y[at] = c;
        else if (op == 1) y.insert(y.begin() + static_cast<long>(at), c);
        else if (!y.empty()) y.erase(at, 1);
        if (y.find("-0") != std::string::npos || y.empty() || std::isspace(static_cast<unsigned char>(y.front())) ||
            std::isspace(static_cast<unsigned char>(y.back())))
          continue;
        int want = parse_valid(schema, y);
        if (want < 0) continue;
        // A bounded number is written without an exponent (the grammar's choice, a subset).
        static const std::regex exponent("[0-9][eE][+-]?[0-9]");
        if (want == 1 && schema.dump().find("imum") != std::string::npos && std::regex_search(y, exponent)) continue;
        EXPECT_EQ(matches(cg, y), want == 1) << schema.dump() << "\n" << x << "\n -> " << y;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 3000);
  EXPECT_LT(worst_ms, 100.0);  // a generous bound on a shared 2-core machine
  EXPECT_LT(worst_mem, 4u << 20);
}

TEST(JsonSchema, PydanticOutput) {
  // What pydantic v2 emits for: class Address(BaseModel): street: str; zip: Optional[str] = None
  // class Kind(str, Enum) ...; class User(BaseModel): name: str; age: int = Field(ge=0, le=150);
  //   kind: Kind; addresses: List[Address]; scores: Dict[str, float]; tags: Tuple[str, int]
  json schema = json::parse(R"({
    "$defs": {
      "Address": {"properties": {"street": {"title": "Street", "type": "string"},
                                  "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Zip"}},
                  "required": ["street"], "title": "Address", "type": "object"},
      "Kind": {"enum": ["admin", "user"], "title": "Kind", "type": "string"}},
    "properties": {
      "name": {"title": "Name", "type": "string"},
      "age": {"maximum": 150, "minimum": 0, "title": "Age", "type": "integer"},
      "kind": {"$ref": "#/$defs/Kind"},
      "addresses": {"items": {"$ref": "#/$defs/Address"}, "title": "Addresses", "type": "array"},
      "scores": {"additionalProperties": {"type": "number"}, "title": "Scores", "type": "object"},
      "tags": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "string"}, {"type": "integer"}], "title": "Tags", "type": "array"}},
    "required": ["name", "age", "kind", "addresses", "scores", "tags"], "title": "User", "type": "object"})");
  auto cg = test::compile(json_schema_grammar(schema));
  EXPECT_TRUE(matches(cg, R"({"name": "Ann", "age": 150, "kind": "admin", "addresses": [{"street": "Main", "zip": null}, {"street": "X"}], "scores": {"a": 1.5, "b": -2}, "tags": ["t", 3]})"));
  EXPECT_TRUE(matches(cg, R"({"name":"A","age":0,"kind":"user","addresses":[],"scores":{},"tags":["",0]})"));
  EXPECT_FALSE(matches(cg, R"({"name":"A","age":151,"kind":"user","addresses":[],"scores":{},"tags":["",0]})"));
  EXPECT_FALSE(matches(cg, R"({"name":"A","age":1,"kind":"root","addresses":[],"scores":{},"tags":["",0]})"));
  EXPECT_FALSE(matches(cg, R"({"name":"A","age":1,"kind":"user","addresses":[{}],"scores":{},"tags":["",0]})"));
  EXPECT_FALSE(matches(cg, R"({"name":"A","age":1,"kind":"user","addresses":[],"scores":{},"tags":["",0,1]})"));
  EXPECT_FALSE(matches(cg, R"({"name":"A","age":1,"kind":"user","addresses":[],"scores":{},"tags":["",0],"extra":1})"));
}

TEST(JsonSchema, RecursiveRefs) {
  json tree = json::parse(R"({"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#"}}},"required":["v"]})");
  auto cg = test::compile(json_schema_grammar(tree));
  EXPECT_TRUE(matches(cg, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4,"kids":[]}]})"));
  EXPECT_FALSE(matches(cg, R"({"v":1,"kids":[{"kids":[]}]})"));
  json list = json::parse(R"({"$defs":{"node":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},
      "required":["next"]}},"$ref":"#/$defs/node"})");
  auto cl = test::compile(json_schema_grammar(list));
  EXPECT_TRUE(matches(cl, R"({"next":{"next":{"next":null}}})"));
  EXPECT_FALSE(matches(cl, R"({"next":{"next":{}}})"));
}

TEST(JsonSchema, AdversarialDeepNestingAndHugeEnums) {
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 60; ++i) deep = {{"type", "object"}, {"properties", {{"x", deep}}}, {"required", {"x"}}};
  std::string text = "1";
  for (int i = 0; i < 60; ++i) text = "{\"x\":" + text + "}";
  auto t0 = std::chrono::steady_clock::now();
  auto cg = test::compile(json_schema_grammar(deep));
  EXPECT_TRUE(matches(cg, text));
  json big_enum = json::array();
  for (int i = 0; i < 5000; ++i) big_enum.push_back("value_" + std::to_string(i * 7919 % 100003));
  auto ce = test::compile(json_schema_grammar(json{{"enum", big_enum}}));
  EXPECT_TRUE(matches(ce, "\"value_7919\""));
  EXPECT_FALSE(matches(ce, "\"value_7918\""));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 2000.0);
  EXPECT_LT(ce->memory_bytes(), 16u << 20);
  // Bounds that would explode are refused with a message, not compiled.
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"string","maxLength":1000000})")), InvalidRequest);
}

TEST(JsonSchema, IntegerRangesAreExact) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 9}, {-5, 300}, {7, 7}, {-120, -3}, {10, 1234}, {-1, 0}}) {
    auto cg = test::compile(json_schema_grammar(json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}}));
    for (int x = -1500; x <= 1500; ++x) EXPECT_EQ(matches(cg, std::to_string(x)), x >= lo && x <= hi) << lo << ".." << hi << " " << x;
  }
  auto ge = test::compile(json_schema_grammar(json{{"type", "integer"}, {"minimum", 42}}));
  EXPECT_TRUE(matches(ge, "42"));
  EXPECT_TRUE(matches(ge, "100000000"));
  EXPECT_FALSE(matches(ge, "41"));
  EXPECT_FALSE(matches(ge, "-50"));
  // Both forms given: the tighter holds, whichever comes last; draft 4's flags exclude the bound.
  auto both = test::compile(json_schema_grammar(json{{"type", "integer"}, {"exclusiveMinimum", 5}, {"minimum", 2}}));
  EXPECT_FALSE(matches(both, "5"));
  EXPECT_TRUE(matches(both, "6"));
  auto d4 = test::compile(json_schema_grammar(json{{"type", "integer"}, {"minimum", 1.5}, {"exclusiveMinimum", true},
                                                   {"maximum", 4}, {"exclusiveMaximum", true}}));
  EXPECT_TRUE(matches(d4, "2"));  // > 1.5: 2 is the first
  EXPECT_TRUE(matches(d4, "3"));
  EXPECT_FALSE(matches(d4, "4"));
  auto lt = test::compile(json_schema_grammar(json{{"type", "integer"}, {"exclusiveMaximum", 10}}));
  EXPECT_TRUE(matches(lt, "-99999"));
  EXPECT_TRUE(matches(lt, "9"));
  EXPECT_FALSE(matches(lt, "10"));
}

// Exact decimal comparison for the number-range test (its own parser, not the compiler's):
// a JSON number's text -> sign, integer digits, fraction digits (exponent applied).
struct Decimal {
  bool neg = false;
  std::string ip, fp;
};
std::optional<Decimal> parse_decimal(const std::string& t) {
  static const std::regex re(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  if (!std::regex_match(t, re)) return std::nullopt;
  Decimal d;
  size_t i = 0;
  if (t[0] == '-') d.neg = true, i = 1;
  std::string digs;
  long point = -1, exp = 0;
  for (; i < t.size() && t[i] != 'e' && t[i] != 'E'; ++i) {
    if (t[i] == '.') point = long(digs.size());
    else digs += t[i];
  }
  if (point < 0) point = long(digs.size());
  if (i < t.size()) exp = std::stol(t.substr(i + 1));
  point += exp;
  while (point <= 0) digs.insert(digs.begin(), '0'), ++point;
  while (point > long(digs.size())) digs += '0';
  d.ip = digs.substr(0, size_t(point));
  d.fp = digs.substr(size_t(point));
  d.ip.erase(0, std::min(d.ip.find_first_not_of('0'), d.ip.size() - 1));
  while (!d.fp.empty() && d.fp.back() == '0') d.fp.pop_back();
  if (d.ip == "0" && d.fp.empty()) d.neg = false;
  return d;
}
int compare_decimal(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  int c = a.ip.size() != b.ip.size() ? (a.ip.size() < b.ip.size() ? -1 : 1) : a.ip.compare(b.ip);
  if (c == 0) c = a.fp.compare(b.fp);
  c = c < 0 ? -1 : c > 0 ? 1 : 0;
  return a.neg ? -c : c;
}

// Number bounds are exact: every candidate (integer part, fraction digits, signs, exponents,
// malformed forms) is accepted only if it is a JSON number inside the range, and every
// exponent-free JSON number inside the range is accepted.
TEST(JsonSchema, NumberRangesAreExact) {
  std::vector<std::string> cands = {"-0", "-0.0", "0", "0.", ".5", "01", "+1", "--1", "1e1", "2E-1", "-1.5e0", "1.0e+0"};
  const char* fracs[] = {"", ".0", ".00", ".05", ".09", ".1", ".10", ".25", ".3", ".33", ".333", ".334", ".5", ".75",
                         ".9", ".99", ".999", ".0001"};
  for (int i = -13; i <= 13; ++i)
    for (const char* f : fracs) {
      cands.push_back(std::to_string(i) + f);
      if (i == 0) {
        cands.push_back(std::string("-0") + f);
      }
    }
  for (const char* big : {"100", "100.5", "1000000000000", "-250.25"}) cands.push_back(big);
  std::vector<json> schemas = {
      {{"minimum", 0}, {"maximum", 1}},
      {{"minimum", 0.5}, {"maximum", 2.25}},
      {{"exclusiveMinimum", 0}, {"exclusiveMaximum", 1}},
      {{"minimum", -1.5}, {"maximum", -0.25}},
      {{"minimum", -2}, {"exclusiveMaximum", 0}},
      {{"exclusiveMinimum", -0.1}, {"maximum", 0.1}},
      {{"minimum", 0.05}},
      {{"exclusiveMaximum", 10.5}},
      {{"maximum", -3}},
      {{"minimum", 1}, {"maximum", 1}},
      {{"minimum", 0.3}, {"maximum", 0.333}},
      {{"minimum", 3.25}, {"exclusiveMaximum", 3.75}},
      {{"minimum", 0.1}, {"maximum", 0.1}},
      {{"minimum", 0}, {"exclusiveMinimum", true}, {"maximum", 1}},  // draft 4
      {{"minimum", 1}, {"exclusiveMinimum", 1}},                       // both: the tighter (exclusive)
      {{"minimum", 0.001}, {"maximum", 20.0}},
      {{"minimum", -12.75}, {"maximum", 12.75}},
      {{"exclusiveMinimum", 9}, {"maximum", 13}},
  };
  std::mt19937 rng(7);
  for (int r = 0; r < 40; ++r) {  // random two-digit bounds
    auto rnd = [&] { return double(int(rng() % 2401) - 1200) / 100.0; };
    double a = rnd(), b = rnd();
    if (a > b) std::swap(a, b);
    json s;
    s[rng() % 2 ? "minimum" : "exclusiveMinimum"] = a;
    s[rng() % 2 ? "maximum" : "exclusiveMaximum"] = b;
    if (a == b) s = {{"minimum", a}, {"maximum", b}};
    schemas.push_back(s);
  }
  for (json s : schemas) {
    s["type"] = "number";
    SCOPED_TRACE(s.dump());
    auto cg = test::compile(json_schema_grammar(s));
    auto in = [&](const Decimal& x) {
      auto check = [&](const char* k, bool lower, bool exclusive) {
        if (!s.contains(k) || !s[k].is_number()) return true;
        int c = compare_decimal(x, *parse_decimal(json(s[k]).dump()));
        bool x4 = s.value(lower ? "exclusiveMinimum" : "exclusiveMaximum", json()).is_boolean() &&
                  s[lower ? "exclusiveMinimum" : "exclusiveMaximum"].get<bool>();
        exclusive = exclusive || x4;
        return lower ? (exclusive ? c > 0 : c >= 0) : (exclusive ? c < 0 : c <= 0);
      };
      return check("minimum", true, false) && check("exclusiveMinimum", true, true) && check("maximum", false, false) &&
             check("exclusiveMaximum", false, true);
    };
    // Plus the bounds themselves and their nearest neighbours (the edges are where ranges break).
    std::vector<std::string> edge = cands;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k) || !s[k].is_number()) continue;
      const double v = s[k].get<double>();
      edge.push_back(json(s[k]).dump());
      for (double dv : {-0.01, -0.001, 0.001, 0.01}) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*f", dv == -0.01 || dv == 0.01 ? 2 : 3, v + dv);
        edge.push_back(buf);
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.4f", v);
      edge.push_back(buf);
    }
    int admitted = 0;
    for (const std::string& c : edge) {
      std::optional<Decimal> d = parse_decimal(c);
      const bool ok = d && in(*d);
      const bool got = matches(cg, c);
      admitted += got;
      if (got) {
        EXPECT_TRUE(ok) << c << " accepted outside the range";
      }
      // Complete over the plain forms: no exponent, and zero not written "-0" (refused for x >= 0).
      const bool plain = c.find_first_of("eE") == std::string::npos && !(c[0] == '-' && d && d->ip == "0" && d->fp.empty());
      if (ok && plain) {
        EXPECT_TRUE(got) << c << " refused inside the range";
      }
    }
    EXPECT_GT(admitted, 0);
  }
  // No number at all: an error, as for integers.
  EXPECT_THROW(json_schema_grammar(json{{"type", "number"}, {"minimum", 2}, {"maximum", 1.5}}), InvalidRequest);
  EXPECT_THROW(json_schema_grammar(json{{"type", "number"}, {"exclusiveMinimum", 1}, {"exclusiveMaximum", 1}}),
               InvalidRequest);
  // Typed lists and bounds without a type take the same path.
  auto opt = test::compile(json_schema_grammar(json::parse(R"({"type":["number","null"],"minimum":0,"maximum":1})")));
  EXPECT_TRUE(matches(opt, "0.5"));
  EXPECT_TRUE(matches(opt, "null"));
  EXPECT_FALSE(matches(opt, "1.5"));
}

// minProperties / maxProperties count declared and additional members alike.
TEST(JsonSchema, PropertyCountBounds) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{2, 3}, {0, 1}, {1, -1}, {4, -1}, {3, 3}, {0, 0}}) {
    json s = json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
        "c":{"type":"integer"}},"additionalProperties":{"type":"integer"}})");
    if (lo > 0) s["minProperties"] = lo;
    if (hi >= 0) s["maxProperties"] = hi;
    SCOPED_TRACE(s.dump());
    auto cg = test::compile(json_schema_grammar(s));
    for (int mask = 0; mask < 8; ++mask)
      for (int extra = 0; extra <= 3; ++extra) {
        std::string o = "{";
        int count = 0;
        for (int k = 0; k < 3; ++k)
          if (mask >> k & 1) o += std::string(count++ ? "," : "") + "\"" + char('a' + k) + "\":1";
        for (int e = 0; e < extra; ++e) o += std::string(count++ ? "," : "") + "\"x" + std::to_string(e) + "\":2";
        o += "}";
        EXPECT_EQ(matches(cg, o), count >= lo && (hi < 0 || count <= hi)) << o;
      }
  }
  // A required property counts too; a map with minProperties 1 is never empty.
  auto req = test::compile(json_schema_grammar(json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"integer"}},"required":["a"],"maxProperties":1})")));
  EXPECT_TRUE(matches(req, R"({"a":1})"));
  EXPECT_FALSE(matches(req, R"({"a":1,"b":2})"));
  auto map = test::compile(json_schema_grammar(json::parse(
      R"({"type":"object","additionalProperties":{"type":"string"},"minProperties":1})")));
  EXPECT_FALSE(matches(map, "{}"));
  EXPECT_TRUE(matches(map, R"({"k":"v"})"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],
      "maxProperties":1})")), InvalidRequest);
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"object","minProperties":3,"maxProperties":2})")),
               InvalidRequest);
}

// multipleOf, for integers and numbers, alone, with sign-like bounds and between two bounds; every
// candidate judged exactly (scaled decimal integers). Canonical candidates (no trailing fraction
// zero, no "-0") inside the schema are all accepted.
TEST(JsonSchema, MultipleOfIsExact) {
  std::vector<json> schemas = {
      {{"type", "integer"}, {"multipleOf", 5}},
      {{"type", "integer"}, {"multipleOf", 3}, {"minimum", 0}},
      {{"type", "integer"}, {"multipleOf", 7}, {"exclusiveMinimum", 0}},
      {{"type", "integer"}, {"multipleOf", 4}, {"minimum", 10}, {"maximum", 50}},
      {{"type", "integer"}, {"multipleOf", 1000}, {"maximum", 0}},
      {{"type", "integer"}, {"multipleOf", 0.5}},
      {{"type", "integer"}, {"multipleOf", 2.5}, {"minimum", -40}, {"exclusiveMaximum", 40}},
      {{"type", "number"}, {"multipleOf", 0.01}, {"minimum", 0}},
      {{"type", "number"}, {"multipleOf", 0.25}},
      {{"type", "number"}, {"multipleOf", 0.5}, {"exclusiveMinimum", 0}},
      {{"type", "number"}, {"multipleOf", 3}},
      {{"type", "number"}, {"multipleOf", 0.1}, {"minimum", 0}, {"maximum", 1}},
      {{"type", "number"}, {"multipleOf", 0.05}, {"maximum", 0}},
      {{"type", "number"}, {"multipleOf", 1.5}, {"exclusiveMinimum", -4.5}, {"maximum", 6}},
      {{"multipleOf", 0.2}},
  };
  std::vector<std::string> cands = {"-0", "0.", ".5", "01", "1e1", "3E0"};
  for (int i = -61; i <= 61; ++i)
    for (const char* f : {"", ".0", ".00", ".01", ".05", ".1", ".10", ".2", ".25", ".3", ".4", ".5", ".50", ".6", ".75",
                          ".8", ".9", ".99", ".001", ".125"})
      cands.push_back(std::to_string(i) + f);
  for (const char* f : {"0.00", "0.000", "1000", "2000.0", "-3000", "12.345", "0.07"}) cands.push_back(f);
  for (const json& s : schemas) {
    SCOPED_TRACE(s.dump());
    auto cg = test::compile(json_schema_grammar(s));
    const Decimal m = *parse_decimal(json(s["multipleOf"]).dump());
    auto scaled = [](const Decimal& d, size_t k) {
      std::string digits = d.ip + d.fp + std::string(k - d.fp.size(), '0');
      long long v = std::stoll(digits);
      return d.neg ? -v : v;
    };
    int admitted = 0;
    for (const std::string& c : cands) {
      std::optional<Decimal> d = parse_decimal(c);
      bool ok = d.has_value() && d->ip.size() < 12;
      if (ok && s.value("type", "") == "integer") ok = d->fp.empty() && c.find('.') == std::string::npos && c.find_first_of("eE") == std::string::npos;
      if (ok) {
        size_t k = std::max(m.fp.size(), d->fp.size());
        ok = scaled(*d, k) % scaled(m, k) == 0;
        auto check = [&](const char* key, bool lower, bool exclusive) {
          if (!s.contains(key)) return true;
          int cmpv = compare_decimal(*d, *parse_decimal(json(s[key]).dump()));
          return lower ? (exclusive ? cmpv > 0 : cmpv >= 0) : (exclusive ? cmpv < 0 : cmpv <= 0);
        };
        ok = ok && check("minimum", true, false) && check("exclusiveMinimum", true, true) && check("maximum", false, false) &&
             check("exclusiveMaximum", false, true);
      }
      const bool got = matches(cg, c);
      admitted += got;
      if (got) {
        EXPECT_TRUE(ok) << c << " accepted";
      }
      const bool canonical = c.find_first_of("eE") == std::string::npos && (c.find('.') == std::string::npos || c.back() != '0') &&
                             !(c[0] == '-' && d && d->ip == "0" && d->fp.empty());
      if (ok && canonical) {
        EXPECT_TRUE(got) << c << " refused";
      }
    }
    EXPECT_GE(admitted, 2);
  }
  auto msg = [](const json& s) {
    try {
      json_schema_grammar(s);
    } catch (const InvalidRequest& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(json{{"type", "integer"}, {"multipleOf", 0}}).find("positive"), std::string::npos);
  EXPECT_NE(msg(json{{"type", "integer"}, {"multipleOf", 5}, {"minimum", -7}}).find("not supported"), std::string::npos);
  EXPECT_NE(msg(json{{"type", "integer"}, {"multipleOf", 5}, {"minimum", 6}, {"maximum", 9}}).find("no multiple"),
            std::string::npos);
  EXPECT_NE(msg(json{{"type", "number"}, {"multipleOf", 0.0001}, {"minimum", 0}}).find("not supported") +
                msg(json{{"type", "number"}, {"multipleOf", 123.4567}}).find("20000"),
            2 * std::string::npos);
}

// patternProperties (closed objects, patterns with distinct anchored prefixes) and propertyNames.
TEST(JsonSchema, PatternPropertiesAndPropertyNames) {
  auto pp = test::compile(json_schema_grammar(json::parse(R"({"type":"object",
      "properties":{"score":{"type":"integer","minimum":0},"name":{"type":"string"}},
      "patternProperties":{"^S_":{"type":"string"},"^I_":{"type":"integer"},"^score$":{"type":"integer","maximum":10}},
      "additionalProperties":false,"required":["name"]})")));
  EXPECT_TRUE(matches(pp, R"({"score":5,"name":"a","S_x":"v","I_n":3})"));
  EXPECT_TRUE(matches(pp, R"({"name":"a"})"));
  EXPECT_TRUE(matches(pp, R"({"name":"a","S_":"", "I_long_key":-4})"));
  EXPECT_FALSE(matches(pp, R"({"score":11,"name":"a"})"));  // the pattern ^score$ holds for the declared key too
  EXPECT_FALSE(matches(pp, R"({"score":-1,"name":"a"})"));
  EXPECT_FALSE(matches(pp, R"({"name":"a","S_x":1})"));
  EXPECT_FALSE(matches(pp, R"({"name":"a","I_n":"x"})"));
  EXPECT_FALSE(matches(pp, R"({"name":"a","other":1})"));
  // Unanchored: the key contains it.
  auto un = test::compile(json_schema_grammar(json::parse(
      R"({"type":"object","patternProperties":{"id":{"type":"integer"}},"additionalProperties":false})")));
  EXPECT_TRUE(matches(un, R"({"user_id":1,"id":2,"idx":3})"));
  EXPECT_FALSE(matches(un, R"({"name":1})"));
  // Not expressible exactly: refused in strict mode, ignored leniently.
  for (const char* bad : {R"({"type":"object","patternProperties":{"^a":{}},"additionalProperties":true})",
                          R"({"type":"object","patternProperties":{"^a":{},"^ab":{"type":"integer"}},"additionalProperties":false})",
                          R"({"type":"object","patternProperties":{"a":{},"b":{}},"additionalProperties":false})"}) {
    EXPECT_THROW(json_schema_grammar(std::string_view(bad)), InvalidRequest) << bad;
    EXPECT_NO_THROW(json_schema_grammar(std::string_view(bad), JsonSchemaOptions{.lenient = true})) << bad;
  }
  // propertyNames: the additional keys follow it; a declared name it refuses never appears.
  auto pn = test::compile(json_schema_grammar(json::parse(R"({"type":"object","properties":{"Bad":{"type":"integer"}},
      "propertyNames":{"pattern":"^[a-z_]+$","maxLength":5},"additionalProperties":{"type":"integer"}})")));
  EXPECT_TRUE(matches(pn, R"({"ab":1,"c_d":2})"));
  EXPECT_FALSE(matches(pn, R"({"Bad":1})"));
  EXPECT_FALSE(matches(pn, R"({"abcdef":1})"));
  EXPECT_FALSE(matches(pn, R"({"a1":1})"));
  auto pe = test::compile(json_schema_grammar(json::parse(
      R"({"type":"object","propertyNames":{"enum":["x","y"]},"additionalProperties":{"type":"boolean"}})")));
  EXPECT_TRUE(matches(pe, R"({"x":true,"y":false})"));
  EXPECT_FALSE(matches(pe, R"({"z":true})"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"object","properties":{"A":{}},"required":["A"],
      "propertyNames":{"pattern":"^[a-z]+$"}})")), InvalidRequest);
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"object","propertyNames":{"type":"integer"}})")),
               InvalidRequest);
}

// pattern with minLength / maxLength: both hold (the lengths were ignored beside a pattern).
TEST(JsonSchema, PatternWithLengths) {
  auto cls = test::compile(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^[a-z_]+$","minLength":2,"maxLength":3})")));
  EXPECT_FALSE(matches(cls, R"("a")"));
  EXPECT_TRUE(matches(cls, R"("ab")"));
  EXPECT_TRUE(matches(cls, R"("a_c")"));
  EXPECT_FALSE(matches(cls, R"("abcd")"));
  EXPECT_FALSE(matches(cls, R"("A1")"));
  // Lengths the pattern implies anyway (with escapes counted as one character).
  auto fixed = test::compile(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^\\d{4}-\\\"\\d$","maxLength":7})")));
  EXPECT_TRUE(matches(fixed, R"("2024-\"1")"));
  EXPECT_FALSE(matches(fixed, R"("2024-\"")"));
  // A sequence with repetitions of one character: they share the room, a subset of both.
  auto mail = test::compile(json_schema_grammar(json::parse(
      R"({"type":"string","pattern":"^[a-z]+@[a-z]+\\.com$","minLength":12,"maxLength":14})")));
  EXPECT_TRUE(matches(mail, R"("abcd@efg.com")"));            // 12
  EXPECT_FALSE(matches(mail, R"("ab@cd.com")"));              // 9 < 12
  EXPECT_FALSE(matches(mail, R"("abcdefgh@ijklmnop.com")"));  // > 14
  int in_bounds = 0;
  for (int a = 1; a <= 10; ++a)  // every accepted address is within the bounds (some are refused: a subset)
    for (int b = 1; b <= 10; ++b) {
      std::string v = std::string(size_t(a), 'x') + "@" + std::string(size_t(b), 'y') + ".com";
      if (matches(mail, json(v).dump())) {
        EXPECT_TRUE(v.size() >= 12 && v.size() <= 14) << v;
        ++in_bounds;
      }
    }
  EXPECT_GT(in_bounds, 2);
  // Other shapes under a maxLength: the unbounded repetitions capped alike (a subset).
  auto names = test::compile(json_schema_grammar(json::parse(
      R"({"type":"string","pattern":"^[A-Z][a-z]+( [A-Z][a-z]+)*$","maxLength":12})")));
  EXPECT_TRUE(matches(names, R"("Ada Love")"));
  EXPECT_TRUE(matches(names, R"("Al Bo")"));
  EXPECT_FALSE(matches(names, R"("Ada Lovelacee")"));  // 13
  EXPECT_FALSE(matches(names, R"("ada")"));
  for (const char* t : {"Ada Lovelace", "Al Bo Cy", "Abcdefghijk", "A Bb Cc Dd"})  // a subset: never too long
    if (matches(names, json(std::string(t)).dump())) {
      EXPECT_LE(std::string(t).size(), 12u) << t;
    }
  auto pairs = test::compile(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^(ab)+$","maxLength":5})")));
  EXPECT_TRUE(matches(pairs, R"("abab")"));
  EXPECT_FALSE(matches(pairs, R"("ababab")"));
  // Lengths no string of the pattern meets: refused strictly, ignored leniently.
  const char* hard = R"({"type":"string","pattern":"^(abc)+$","minLength":4,"maxLength":5})";
  EXPECT_THROW(json_schema_grammar(std::string_view(hard)), InvalidRequest);
  auto lenient = test::compile(json_schema_grammar(std::string_view(hard), JsonSchemaOptions{.lenient = true}));
  EXPECT_TRUE(matches(lenient, R"("abcabc")"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^[a-z]{5,}$","maxLength":3})")),
               InvalidRequest);
  // A valid ECMAScript pattern the grammar cannot express (lookahead): refused strictly; leniently
  // the pattern is ignored and the other string keywords still hold. A broken pattern: refused both ways.
  const char* look = R"({"type":"string","pattern":"^(?!x)[a-z]*$","maxLength":3})";
  EXPECT_THROW(json_schema_grammar(std::string_view(look)), InvalidRequest);
  auto ignored = test::compile(json_schema_grammar(std::string_view(look), JsonSchemaOptions{.lenient = true}));
  EXPECT_TRUE(matches(ignored, R"("x1")"));
  EXPECT_FALSE(matches(ignored, R"("abcd")"));
  EXPECT_THROW(json_schema_grammar(std::string_view(R"({"type":"string","pattern":"(ab"})"), JsonSchemaOptions{.lenient = true}),
               InvalidRequest);
}

// A raw string (a text-valued tool parameter): the pattern as a whole, no quotes or escapes, the
// lengths beside it where they hold exactly, and '<' out of the open classes when asked.
TEST(JsonSchema, RawStringGrammar) {
  auto sku = test::compile(raw_string_grammar("^[A-Z]+-\\d+$", 5, 6));
  EXPECT_TRUE(matches(sku, "AB-12"));
  // (the repetitions share what the bounds leave evenly: a subset, as for a JSON string)
  EXPECT_FALSE(matches(sku, "A-1"));      // minLength 5
  EXPECT_FALSE(matches(sku, "ABCD-12"));  // maxLength 6
  EXPECT_FALSE(matches(sku, "\"AB-12\""));
  auto text = test::compile(raw_string_grammar(".+", 0, 4, {{'<', '<'}}));
  EXPECT_TRUE(matches(text, "a\"\\b"));  // raw: a quote and a backslash are characters
  EXPECT_FALSE(matches(text, "a<b"));
  EXPECT_FALSE(matches(text, "abcde"));
  EXPECT_THROW(raw_string_grammar("(?=a).*", 0, -1), InvalidRequest);
}

// uniqueItems over a finite set of scalars (pydantic's set[Literal[...]] / set[Enum]) is held:
// every array of distinct values is accepted, none with a repeat; other items stay a 400.
TEST(JsonSchema, UniqueItemsOverFiniteValues) {
  auto cg = test::compile(json_schema_grammar(json::parse(R"({"$defs":{"Color":{"enum":["red","green","blue"]}},
      "type":"array","items":{"$ref":"#/$defs/Color"},"uniqueItems":true,"minItems":1})")));
  const std::vector<std::string> v = {"\"red\"", "\"green\"", "\"blue\""};
  int accepted = 0;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 4; ++c) {  // 0 = absent
        std::vector<int> xs;
        for (int x : {a, b, c})
          if (x) xs.push_back(x);
        if ((a == 0 && (b || c)) || (b == 0 && c)) continue;
        std::string arr = "[";
        for (size_t i = 0; i < xs.size(); ++i) arr += (i ? "," : "") + v[size_t(xs[i] - 1)];
        arr += "]";
        std::set<int> distinct(xs.begin(), xs.end());
        const bool ok = !xs.empty() && distinct.size() == xs.size();
        EXPECT_EQ(matches(cg, arr), ok) << arr;
        accepted += ok;
      }
  EXPECT_EQ(accepted, 3 + 6 + 6);
  auto bools = test::compile(json_schema_grammar(json::parse(R"({"type":"array","items":{"type":"boolean"},
      "uniqueItems":true,"maxItems":1})")));
  EXPECT_TRUE(matches(bools, "[true]"));
  EXPECT_TRUE(matches(bools, "[]"));
  EXPECT_FALSE(matches(bools, "[true,false]"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"array","items":{"type":"string"},"uniqueItems":true})")),
               InvalidRequest);
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"array","items":{"enum":[1,2]},"uniqueItems":true,
      "minItems":3})")), InvalidRequest);
  auto off = test::compile(json_schema_grammar(json::parse(R"({"type":"array","items":{"type":"integer"},"uniqueItems":false})")));
  EXPECT_TRUE(matches(off, "[1,1]"));
}

TEST(JsonSchema, StringsFormatsAndWhitespace) {
  auto cg = test::compile(json_schema_grammar(json::parse(R"({"type":"object","properties":{
      "d":{"type":"string","format":"date"},"u":{"type":"string","format":"uuid"},
      "p":{"type":"string","pattern":"^[A-Z]{2}-\\d+$"},"s":{"type":"string","minLength":2,"maxLength":3}},
      "required":["d","u","p","s"]})")));
  EXPECT_TRUE(matches(cg, R"({"d":"2024-02-29","u":"123e4567-e89b-12d3-a456-426614174000","p":"AB-12","s":"é\n"})"));
  EXPECT_TRUE(matches(cg, "{ \"d\" : \"2024-12-01\" ,\n\t\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"p\":\"ZZ-0\",\"s\":\"abc\" }"));
  EXPECT_FALSE(matches(cg, R"({"d":"2024-13-01","u":"123e4567-e89b-12d3-a456-426614174000","p":"AB-12","s":"ab"})"));
  EXPECT_FALSE(matches(cg, R"({"d":"2024-12-01","u":"123e4567-e89b-12d3-a456-426614174000","p":"AB-","s":"ab"})"));
  EXPECT_FALSE(matches(cg, R"({"d":"2024-12-01","u":"123e4567-e89b-12d3-a456-426614174000","p":"AB-1","s":"abcd"})"));
  // The formats OpenAI strict mode lists: duration, hostname, ipv6 besides the above.
  auto fmt_ok = [](const char* f, const std::string& v) {
    return matches(test::compile(json_schema_grammar(json{{"type", "string"}, {"format", f}})), json(v).dump());
  };
  for (const char* v : {"P1D", "P3Y6M4DT12H30M5S", "PT20M", "PT1H0M30S", "P2W", "P1M", "PT36H", "P1Y2M"})
    EXPECT_TRUE(fmt_ok("duration", v)) << v;
  for (const char* v : {"P", "PT", "P1H", "1D", "P1DT", "PT1D", "P1W2D", "P1S"}) EXPECT_FALSE(fmt_ok("duration", v)) << v;
  for (const char* v : {"localhost", "example.com", "a-b.c-d.example", "x1.y2", "xn--bcher-kva.example"})
    EXPECT_TRUE(fmt_ok("hostname", v)) << v;
  for (const char* v : {"-a.com", "a-.com", "a..b", ".a", "a_b.com", "", "a b"}) EXPECT_FALSE(fmt_ok("hostname", v)) << v;
  for (const char* v : {"::", "::1", "2001:db8::ff00:42:8329", "2001:0db8:0000:0000:0000:ff00:0042:8329", "fe80::",
                        "1:2:3:4:5:6:7::", "::ffff:192.0.2.128", "1:2:3:4:5:6:1.2.3.4", "a::b:c"})
    EXPECT_TRUE(fmt_ok("ipv6", v)) << v;
  for (const char* v : {":", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "g::1", "1:2:3:4:5:6:7", "::1.2.3.256"})
    EXPECT_FALSE(fmt_ok("ipv6", v)) << v;
  auto compact = test::compile(json_schema_grammar(json{{"type", "array"}, {"items", {{"type", "integer"}}}},
                                                   JsonSchemaOptions{.strict = true, .any_whitespace = false}));
  EXPECT_TRUE(matches(compact, "[1,2,3]"));
  EXPECT_FALSE(matches(compact, "[1, 2]"));
}

TEST(JsonSchema, JsonObjectIsAnyObject) {
  auto cg = test::compile(json_object_grammar());
  EXPECT_TRUE(matches(cg, R"({"a": [1, -2.5e+3, "x\u00e9\n", {"b": null}], "c": true})"));
  EXPECT_TRUE(matches(cg, "{}"));
  EXPECT_FALSE(matches(cg, "[1]"));
  EXPECT_FALSE(matches(cg, R"({"a": 01})"));
  EXPECT_FALSE(matches(cg, R"({"a": "\x"})"));
  EXPECT_TRUE(matches(json_value_grammar(), "[1, \"2\"]"));
}

// Lenient mode (tool parameters): what a grammar cannot express is ignored and the grammar admits
// a superset of the schema -- never a value the schema allows refused, while what it can express
// (types, required keys, enums) still holds.
TEST(JsonSchema, LenientAdmitsASupersetOfWhatItCannotExpress) {
  const JsonSchemaOptions lenient{.strict = true, .any_whitespace = true, .lenient = true};
  const char* tagged = R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true},
    "n":{"type":"integer","multipleOf":5},"s":{"type":"string","not":{"const":"x"}}},"required":["tags"]})";
  EXPECT_THROW(json_schema_grammar(std::string_view(tagged)), InvalidRequest);
  auto cg = test::compile(json_schema_grammar(std::string_view(tagged), lenient));
  EXPECT_TRUE(matches(cg, R"({"tags": ["a", "a"], "n": 5, "s": "x"})"));
  EXPECT_FALSE(matches(cg, R"({"tags": ["a"], "n": 3})"));  // multipleOf is expressed, so it holds
  // A multipleOf it cannot express with these bounds is ignored there (strict: refused).
  const char* far = R"({"type":"integer","multipleOf":5,"minimum":-7})";
  EXPECT_THROW(json_schema_grammar(std::string_view(far)), InvalidRequest);
  EXPECT_TRUE(matches(test::compile(json_schema_grammar(std::string_view(far), lenient)), "3"));
  EXPECT_FALSE(matches(cg, R"({"n": 5})"));          // required
  EXPECT_FALSE(matches(cg, R"({"tags": [1]})"));     // item type
  EXPECT_FALSE(matches(cg, R"({"tags": [], "m": 1})"));  // no other keys (strict)
  // Keywords that may admit more keys: any further key is admitted.
  const char* patterned = R"({"type":"object","properties":{"a":{"type":"integer"}},
    "patternProperties":{"^x_":{"type":"string"}},"additionalProperties":false})";
  auto pg = test::compile(json_schema_grammar(std::string_view(patterned), lenient));
  EXPECT_TRUE(matches(pg, R"({"a": 1, "x_k": "v"})"));
  EXPECT_TRUE(matches(pg, R"({"x_k": "v", "zz": 5})"));
  EXPECT_FALSE(matches(pg, R"(["a", 1])"));  // (further keys take any name, a declared one too, as with additionalProperties)
  auto ug = test::compile(json_schema_grammar(
      std::string_view(R"({"type":"object","properties":{"a":{"type":"integer"}},"unevaluatedProperties":false})"), lenient));
  EXPECT_FALSE(matches(ug, R"({"a": 1, "b": 2})"));  // unevaluatedProperties: false admits nothing more
  // A required key the properties do not define (JSON Schema allows it): admitted, not refused.
  const char* elsewhere = R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["b"]})";
  EXPECT_THROW(json_schema_grammar(std::string_view(elsewhere)), InvalidRequest);
  auto eg = test::compile(json_schema_grammar(std::string_view(elsewhere), lenient));
  EXPECT_TRUE(matches(eg, R"({"b": [1]})"));
  EXPECT_TRUE(matches(eg, R"({"a": 2, "b": null})"));
}

TEST(JsonSchema, InvalidSchemasNameTheProblem) {
  auto msg = [](const char* s) {
    try {
      json_schema_grammar(std::string_view(s));
    } catch (const InvalidRequest& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(msg(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(msg(R"({"not":{"type":"string"}})").find("unsupported keyword 'not'"), std::string::npos);
  EXPECT_NE(msg(R"({"type":"string","pattern":"(ab"})").find("bad 'pattern'"), std::string::npos);
  EXPECT_NE(msg(R"({"type":"object","properties":{},"required":["x"]})").find("required property 'x'"), std::string::npos);
  EXPECT_NE(msg(R"({"type":"integer","minimum":5,"maximum":1})").find("above maximum"), std::string::npos);
  EXPECT_NE(msg(R"({"type":"object",)").find("not valid JSON"), std::string::npos);
  EXPECT_NE(msg("false").find("matches nothing"), std::string::npos);
  EXPECT_NE(msg(R"({"$ref":"https://example.com/s.json"})").find("only local $ref"), std::string::npos);
}

// A $ref that only resolves to itself (directly, through a cycle of $defs, or as a required
// property's value) has no instance: a 400, not a grammar whose mask allows nothing (the sampler
// then emitted an arbitrary id with finish_reason stop). An optional property of that kind is
// simply never written; so is a pattern class with no character (lone UTF-16 surrogates).
TEST(JsonSchema, SchemasWithoutAFiniteInstanceAreRefused) {
  for (const char* s : {R"({"$ref":"#"})",
                        R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
                        R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]})"})
    EXPECT_THROW(test::compile(json_schema_grammar(json::parse(s))), InvalidRequest) << s;
  auto cg = test::compile(json_schema_grammar(json::parse(
      R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"},"y":{"type":"integer"}},"additionalProperties":false})")));
  EXPECT_TRUE(matches(cg, R"({"y":1})"));
  EXPECT_TRUE(matches(cg, R"({})"));
  Matcher m(cg);
  EXPECT_TRUE(m.accept_bytes(R"({)"));
  EXPECT_FALSE(m.accept_bytes(R"("x")"));  // no value can follow "x": the key is not offered
  // A recursive schema with a base case stays fine.
  auto tree = test::compile(json_schema_grammar(json::parse(
      R"({"$defs":{"t":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["k"],"additionalProperties":false}},"$ref":"#/$defs/t"})")));
  EXPECT_TRUE(matches(tree, R"({"k":[{"k":[]}]})"));
  // Patterns: a \uD83D\uDE00 surrogate pair is the one character U+1F600; a class of lone
  // surrogates matches nothing (a required value of it: refused); a lone surrogate: refused.
  auto emoji = test::compile(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^\\uD83D\\uDE00$"})")));
  EXPECT_TRUE(matches(emoji, "\"\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(matches(emoji, "\"\xED\xA0\xBD\xED\xB8\x80\""));
  EXPECT_THROW(test::compile(json_schema_grammar(json::parse(
                   R"({"type":"object","properties":{"s":{"type":"string","pattern":"^[\\uD800-\\uDFFF]$"}},"required":["s"]})"))),
               InvalidRequest);
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"string","pattern":"^\\uD83D$"})")), InvalidRequest);
}

// enum / const keep only the values that satisfy the keywords beside them (a validator applies
// all of them); none left is a 400. format date: each month's last day, Feb 29 in leap years.
TEST(JsonSchema, EnumAndConstMeetTheirSiblingKeywordsAndDatesAreReal) {
  auto m = [](const char* schema, const char* v) { return matches(test::compile(json_schema_grammar(json::parse(schema))), v); };
  EXPECT_TRUE(m(R"({"enum":[1,5,10],"minimum":4})", "5"));
  EXPECT_FALSE(m(R"({"enum":[1,5,10],"minimum":4})", "1"));
  EXPECT_TRUE(m(R"({"type":"integer","enum":[1,1.5,"2",3]})", "3"));
  EXPECT_FALSE(m(R"({"type":"integer","enum":[1,1.5,"2",3]})", "1.5"));
  EXPECT_FALSE(m(R"({"type":"integer","enum":[1,1.5,"2",3]})", "\"2\""));
  EXPECT_TRUE(m(R"({"type":"integer","enum":[2.0]})", "2.0"));
  EXPECT_TRUE(m(R"({"type":"string","enum":["a","bbb","cccc"],"minLength":3,"maxLength":3})", "\"bbb\""));
  EXPECT_FALSE(m(R"({"type":"string","enum":["a","bbb","cccc"],"minLength":3,"maxLength":3})", "\"cccc\""));
  EXPECT_TRUE(m(R"({"enum":[0.3,0.5],"multipleOf":0.1,"exclusiveMaximum":0.5})", "0.3"));
  EXPECT_FALSE(m(R"({"enum":[0.3,0.5],"multipleOf":0.1,"exclusiveMaximum":0.5})", "0.5"));
  EXPECT_TRUE(m(R"({"const":"x","enum":["x","y"]})", "\"x\""));
  for (const char* bad : {R"({"const":10,"maximum":5})", R"({"const":"abc","maxLength":2})", R"({"const":1,"enum":[2,3]})",
                          R"({"type":"string","enum":[1,null]})"})
    EXPECT_THROW(json_schema_grammar(json::parse(bad)), InvalidRequest) << bad;
  const char* date = R"({"type":"string","format":"date"})";
  for (const char* ok : {"\"2024-02-29\"", "\"2000-02-29\"", "\"1990-10-31\"", "\"1990-09-30\"", "\"0001-01-01\""})
    EXPECT_TRUE(m(date, ok)) << ok;
  for (const char* no : {"\"2023-02-29\"", "\"1900-02-29\"", "\"1990-09-31\"", "\"1990-02-30\"", "\"1990-13-01\""})
    EXPECT_FALSE(m(date, no)) << no;
  EXPECT_FALSE(m(R"({"type":"string","format":"date-time"})", "\"5173-11-31T07:32:33Z\""));
  EXPECT_TRUE(m(R"({"type":"string","format":"date-time"})", "\"2024-02-29T07:32:33Z\""));
}

// allOf: a property both branches declare satisfies both; the same keyword twice takes the tighter
// bound / the common types / the common enum values; keywords beside a $ref apply with it.
TEST(JsonSchema, AllOfMergesBothBranchesAndRefSiblingsApply) {
  auto m = [](const char* schema, const char* v) { return matches(test::compile(json_schema_grammar(json::parse(schema))), v); };
  const char* both = R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer","minimum":10}},"required":["a"]},)"
                     R"({"type":"object","properties":{"a":{"type":"integer","maximum":12}}}],"additionalProperties":false})";
  EXPECT_TRUE(m(both, R"({"a":11})"));
  EXPECT_FALSE(m(both, R"({"a":2})"));
  EXPECT_FALSE(m(both, R"({"a":13})"));
  EXPECT_TRUE(m(R"({"allOf":[{"type":["string","null"]},{"type":"string"}]})", "\"x\""));
  EXPECT_FALSE(m(R"({"allOf":[{"type":["string","null"]},{"type":"string"}]})", "null"));
  EXPECT_TRUE(m(R"({"allOf":[{"type":"number"},{"type":"integer"}]})", "4"));
  EXPECT_FALSE(m(R"({"allOf":[{"type":"number"},{"type":"integer"}]})", "4.5"));
  EXPECT_FALSE(m(R"({"type":"integer","allOf":[{"minimum":1},{"minimum":5}]})", "3"));
  EXPECT_TRUE(m(R"({"type":"integer","allOf":[{"minimum":1},{"minimum":5}]})", "5"));
  EXPECT_TRUE(m(R"({"allOf":[{"enum":[1,2,3]},{"enum":[2,3,4]}]})", "2"));
  EXPECT_FALSE(m(R"({"allOf":[{"enum":[1,2,3]},{"enum":[2,3,4]}]})", "1"));
  for (const char* bad : {R"({"allOf":[{"const":1},{"const":2}]})", R"({"allOf":[{"type":"string"},{"type":"integer"}]})",
                          R"({"allOf":[{"enum":[1]},{"enum":[2]}]})"})
    EXPECT_THROW(json_schema_grammar(json::parse(bad)), InvalidRequest) << bad;
  const char* ref = R"({"$defs":{"S":{"type":"string"}},"type":"object","properties":{"a":{"$ref":"#/$defs/S","maxLength":3,)"
                    R"("description":"d"}},"required":["a"],"additionalProperties":false})";
  EXPECT_TRUE(m(ref, R"({"a":"abc"})"));
  EXPECT_FALSE(m(ref, R"({"a":"abcd"})"));
  // minLength / maxLength beside a format bound its strings.
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"string","format":"uuid","maxLength":10})")), InvalidRequest);
  EXPECT_TRUE(m(R"({"type":"string","format":"email","maxLength":8})", "\"a@b.co\""));
  EXPECT_FALSE(m(R"({"type":"string","format":"email","maxLength":8})", "\"abcd@efgh.com\""));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type":"string","format":"date","minLength":11})")), InvalidRequest);
  // A recursive $ref with only annotations beside it stays a reference.
  EXPECT_TRUE(m(R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n","description":"x"}},)"
                R"("additionalProperties":false}},"$ref":"#/$defs/n"})",
                R"({"next":{"next":{}}})"));
}

}  // namespace
}  // namespace ts::grammar
