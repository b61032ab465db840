// The grammar IR every front end (EBNF/GBNF, Lark, regex, choice lists, JSON Schema) produces and
// the matcher compiles: named rules whose bodies are expressions over Unicode code points.
//
//   expr := Empty | Literal(bytes) | Chars(code-point ranges) | Seq(expr...) | Alt(expr...)
//         | Ref(rule) | Repeat(expr, min, max | unbounded)
//
// Literals are UTF-8 bytes; character classes are code-point ranges (lowered to UTF-8 byte
// sequences when compiled), so the matcher works on bytes while front ends think in characters.
// Errors in any front end throw ts::InvalidRequest naming the problem (the API answers 400).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ts::grammar {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code-point ranges

struct Expr {
  enum Kind : uint8_t { kEmpty, kLiteral, kChars, kSeq, kAlt, kRef, kRepeat };
  Kind kind = kEmpty;
  std::string bytes;       // kLiteral
  Ranges ranges;           // kChars: sorted, merged, non-empty
  std::vector<int> kids;   // kSeq, kAlt: expression ids; kRepeat: one kid
  int rule = -1;           // kRef
  int min = 0, max = -1;   // kRepeat; max -1 = unbounded
};

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Ranges helpers: normalize (sort+merge), complement over [0, kMaxCodePoint].
Ranges normalize(Ranges r);
Ranges complement(const Ranges& r);

class Grammar {
 public:
  // Expressions (return ids into this grammar).
  int empty();
  int lit(std::string_view bytes);
  int chars(Ranges r, bool negated = false);
  int seq(std::vector<int> kids);
  int alt(std::vector<int> kids);
  int ref(int rule);
  int rep(int kid, int min, int max);  // max -1 = unbounded
  int opt(int kid) { return rep(kid, 0, 1); }
  int star(int kid) { return rep(kid, 0, -1); }
  int plus(int kid) { return rep(kid, 1, -1); }

  // Rules: declare (forward references allowed), then define. Names are unique.
  int rule(const std::string& name);  // id of `name`, declared if new
  int find_rule(std::string_view name) const;  // -1 when absent
  void define(int rule, int body);
  // A name not yet used, from `base` (for rules the front ends generate).
  std::string fresh_name(const std::string& base) const;
  void set_root(int rule) { root_ = rule; }

  int root() const { return root_; }
  size_t num_rules() const { return rules_.size(); }
  const std::string& rule_name(int r) const { return rules_[r].name; }
  int rule_body(int r) const { return rules_[r].body; }
  const Expr& expr(int id) const { return exprs_[id]; }
  size_t num_exprs() const { return exprs_.size(); }
  // Throws when a referenced rule is never defined or the root is missing.
  void validate() const;
  // GBNF text (for debugging and error messages).
  std::string to_string() const;

 private:
  int add(Expr e);
  struct Rule {
    std::string name;
    int body = -1;
  };
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  int root_ = -1;
};

// Front ends. All throw ts::InvalidRequest with a message naming the problem.
// GBNF (llama.cpp): `name ::= ...`, root rule `root`. Lark (vLLM): `name: ...`, root `start`,
// /regex/ terminals. parse_ebnf picks by the first definition's operator.
Grammar parse_gbnf(std::string_view text);
Grammar parse_lark(std::string_view text);
Grammar parse_ebnf(std::string_view text);

// Regex, the common subset (classes, escapes, quantifiers incl. {m,n}, groups, alternation);
// the whole string must match (anchors ^/$ at the ends are accepted and implicit).
Grammar regex_grammar(std::string_view pattern);
// Adds the pattern as an expression of `g`; `json_string` drops `"`, `\` and control characters
// from every class (the pattern then describes a JSON string's raw content); `ignore_case` lets
// ASCII letters match either case (Lark's /re/i). `not_in_open_classes` is removed from the classes
// that name what they exclude rather than what they admit (`.`, `[^...]`, \D \W \S): a raw text
// value that must not run into a closing tag drops '<' from those, while a `<` the pattern writes
// out (a literal or `[<>]`) stays.
int add_regex(Grammar& g, std::string_view pattern, bool json_string = false, bool ignore_case = false,
              const Ranges& not_in_open_classes = {});

// Exactly one of the choices.
Grammar choice_grammar(const std::vector<std::string>& choices);

// Copies every rule of `src` into `dst` under names prefixed with `prefix` (which must be unused
// there) and returns the id in `dst` of src's root rule: front ends compose grammars this way
// (a tool call's fixed syntax around its arguments' JSON-schema grammar).
int embed_grammar(Grammar& dst, const Grammar& src, const std::string& prefix);

// UTF-8 encode one code point.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace ts::grammar
