#include "grammar/ir.h"

#include <algorithm>
#include <fmt/format.h>

namespace ts::grammar {

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalize(r), out;
  uint32_t next = 0;
  for (auto [lo, hi] : n) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int Grammar::add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<int>(exprs_.size() - 1);
}

int Grammar::empty() { return add(Expr{}); }

int Grammar::lit(std::string_view bytes) {
  if (bytes.empty()) return empty();
  Expr e;
  e.kind = Expr::kLiteral;
  e.bytes = std::string(bytes);
  return add(std::move(e));
}

int Grammar::chars(Ranges r, bool negated) {
  Expr e;
  e.kind = Expr::kChars;
  e.ranges = negated ? complement(r) : normalize(std::move(r));
  if (e.ranges.empty()) throw InvalidRequest("grammar: empty character class (matches nothing)");
  return add(std::move(e));
}

int Grammar::seq(std::vector<int> kids) {
  if (kids.empty()) return empty();
  if (kids.size() == 1) return kids[0];
  Expr e;
  e.kind = Expr::kSeq;
  e.kids = std::move(kids);
  return add(std::move(e));
}

int Grammar::alt(std::vector<int> kids) {
  if (kids.empty()) throw InvalidRequest("grammar: empty alternation");
  if (kids.size() == 1) return kids[0];
  Expr e;
  e.kind = Expr::kAlt;
  e.kids = std::move(kids);
  return add(std::move(e));
}

int Grammar::ref(int rule) {
  Expr e;
  e.kind = Expr::kRef;
  e.rule = rule;
  return add(std::move(e));
}

int Grammar::rep(int kid, int min, int max) {
  if (min < 0 || (max >= 0 && max < min))
    throw InvalidRequest(fmt::format("grammar: invalid repetition {{{},{}}}", min, max));
  if (min == 1 && max == 1) return kid;
  if (max == 0) return empty();
  // A repetition of a repetition whose language is a plain repetition is written as one:
  // (x*){c,d} = x*, (x+){c,d} = x{c,} (c >= 1) or x* (c = 0), (x?){c,d} = x{0,d} (d >= 1 here).
  // Same sentences, one parse each: nested, every split of a run of x between the levels is a
  // parse, and the matcher (which does not merge stacks) would carry them all -- (x+)+ nested
  // ten deep, or a regex's stacked a+++, take 2^depth stacks per step.
  if (const Expr& k = exprs_[size_t(kid)]; k.kind == Expr::kRepeat) {
    const int x = k.kids[0];
    if (k.max < 0 && k.min == 0) return kid;
    if (k.max < 0 && k.min == 1) return rep(x, min >= 1 ? min : 0, -1);
    if (k.max == 1 && k.min == 0) return rep(x, 0, max);
  }
  Expr e;
  e.kind = Expr::kRepeat;
  e.kids = {kid};
  e.min = min;
  e.max = max;
  return add(std::move(e));
}

int Grammar::rule(const std::string& name) {
  int r = find_rule(name);
  if (r >= 0) return r;
  rules_.push_back({name, -1});
  return static_cast<int>(rules_.size() - 1);
}

int Grammar::find_rule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return static_cast<int>(i);
  return -1;
}

void Grammar::define(int r, int body) { rules_[r].body = body; }

std::string Grammar::fresh_name(const std::string& base) const {
  if (find_rule(base) < 0) return base;
  for (int i = 1;; ++i) {
    std::string n = fmt::format("{}-{}", base, i);
    if (find_rule(n) < 0) return n;
  }
}

void Grammar::validate() const {
  if (root_ < 0 || root_ >= static_cast<int>(rules_.size())) throw InvalidRequest("grammar: no root rule");
  for (const auto& r : rules_)
    if (r.body < 0) throw InvalidRequest(fmt::format("grammar: rule '{}' is used but never defined", r.name));
}

namespace {
std::string esc_cp(uint32_t c, bool in_class) {
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (c == '\r') return "\\r";
  if (c == '\\' || (in_class ? (c == ']' || c == '^' || c == '-') : c == '"')) return std::string("\\") + char(c);
  if (c < 0x20 || c == 0x7F) return fmt::format("\\x{:02X}", c);
  if (c > 0xFFFF) return fmt::format("\\U{:08X}", c);
  if (c > 0x7F) return fmt::format("\\u{:04X}", c);
  return std::string(1, static_cast<char>(c));
}
}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  auto print = [&](auto&& self, int id) -> std::string {
    const Expr& e = exprs_[id];
    switch (e.kind) {
      case Expr::kEmpty:
        return "\"\"";
      case Expr::kLiteral: {
        std::string s = "\"";
        for (unsigned char c : e.bytes) s += c >= 0x80 ? std::string(1, char(c)) : esc_cp(c, false);
        return s + "\"";
      }
      case Expr::kChars: {
        std::string s = "[";
        for (auto [lo, hi] : e.ranges) s += lo == hi ? esc_cp(lo, true) : esc_cp(lo, true) + "-" + esc_cp(hi, true);
        return s + "]";
      }
      case Expr::kSeq:
      case Expr::kAlt: {
        std::string s = "(";
        for (size_t i = 0; i < e.kids.size(); ++i) s += (i ? (e.kind == Expr::kSeq ? " " : " | ") : "") + self(self, e.kids[i]);
        return s + ")";
      }
      case Expr::kRef:
        return rules_[e.rule].name;
      case Expr::kRepeat: {
        std::string k = self(self, e.kids[0]);
        if (e.min == 0 && e.max == 1) return k + "?";
        if (e.min == 0 && e.max < 0) return k + "*";
        if (e.min == 1 && e.max < 0) return k + "+";
        return e.max < 0 ? fmt::format("{}{{{},}}", k, e.min) : fmt::format("{}{{{},{}}}", k, e.min, e.max);
      }
    }
    return "";
  };
  for (const auto& r : rules_) out += r.name + " ::= " + (r.body < 0 ? "<undefined>" : print(print, r.body)) + "\n";
  return out;
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw InvalidRequest("choice: the list of choices is empty");
  Grammar g;
  std::vector<int> alts;
  for (const auto& c : choices) alts.push_back(g.lit(c));
  int root = g.rule("root");
  g.define(root, g.alt(alts));
  g.set_root(root);
  return g;
}

int embed_grammar(Grammar& dst, const Grammar& src, const std::string& prefix) {
  std::vector<int> rule_map(src.num_rules());
  for (size_t r = 0; r < src.num_rules(); ++r) {
    std::string name = prefix + src.rule_name(static_cast<int>(r));
    if (dst.find_rule(name) >= 0) throw InvalidRequest(fmt::format("grammar: rule '{}' already exists", name));
    rule_map[r] = dst.rule(name);
  }
  // Expressions are created after their kids (every builder takes kid ids), so one pass in id
  // order maps them.
  std::vector<int> ex(src.num_exprs());
  for (size_t i = 0; i < src.num_exprs(); ++i) {
    const Expr& e = src.expr(static_cast<int>(i));
    std::vector<int> kids;
    for (int k : e.kids) kids.push_back(ex[static_cast<size_t>(k)]);
    switch (e.kind) {
      case Expr::kEmpty: ex[i] = dst.empty(); break;
      case Expr::kLiteral: ex[i] = dst.lit(e.bytes); break;
      case Expr::kChars: ex[i] = dst.chars(e.ranges); break;
      case Expr::kSeq: ex[i] = dst.seq(std::move(kids)); break;
      case Expr::kAlt: ex[i] = dst.alt(std::move(kids)); break;
      case Expr::kRef: ex[i] = dst.ref(rule_map[static_cast<size_t>(e.rule)]); break;
      case Expr::kRepeat: ex[i] = dst.rep(kids[0], e.min, e.max); break;
    }
  }
  for (size_t r = 0; r < src.num_rules(); ++r)
    if (src.rule_body(static_cast<int>(r)) >= 0) dst.define(rule_map[r], ex[static_cast<size_t>(src.rule_body(static_cast<int>(r)))]);
  return rule_map[static_cast<size_t>(src.root())];
}

}  // namespace ts::grammar
