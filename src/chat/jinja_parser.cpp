// Recursive-descent parser following jinja2's grammar and operator precedence (lowest first):
// `a if c else b`, or, and, not, comparisons (chained) / in / not in, + -, ~, * / // %, **,
// unary - +, then postfix .attr [item] [a:b:c] (call) and filters `|f(...)` / tests `is t` which
// bind tighter than any binary operator (so `a + b | trim` trims b only).
#include <fmt/format.h>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace ts::chat::jinja {
namespace {

// Nesting limit for expressions and blocks: keeps a hostile template from overflowing the stack
// (parsing and evaluation both recurse once per level).
constexpr int kMaxDepth = 256;

class Parser {
 public:
  Parser(std::vector<Token> toks, Program& prog) : toks_(std::move(toks)), prog_(prog) {
    for (const char* s : {"loop", "caller", "varargs", "kwargs"}) intern(s);
  }

  void run() { prog_.body = parse_body({}); }

 private:
  std::vector<Token> toks_;
  size_t i_ = 0;
  Program& prog_;
  int loop_depth_ = 0;
  int depth_ = 0;
  std::vector<MacroDef*> macros_;  // macro bodies being parsed: they note uses of caller/varargs/kwargs

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& x) : p(x) {
      if (++p.depth_ > kMaxDepth) p.fail(p.cur(), "template nesting too deep");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(i_ + n, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  static Pos pos_of(const Token& t) { return {t.line, t.col}; }
  Pos pos() const { return pos_of(cur()); }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().value == n; }
  static bool tok_is_name(const Token& t, const char* n) { return t.type == Tok::Name && t.value == n; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "template data";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return fmt::format("'{}'", t.value);
      case Tok::String: return "string";
      case Tok::Int: return "integer";
      case Tok::Float: return "float";
      case Tok::Op: return fmt::format("'{}'", t.value);
      case Tok::Eof: return "end of template";
    }
    return "token";
  }

  [[noreturn]] void fail(const Token& t, const std::string& msg) const {
    throw TemplateError("TemplateSyntaxError", msg, t.line, t.col);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur(), fmt::format("expected token '{}', got {}", op, describe(cur())));
    next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(cur(), fmt::format("expected {}, got {}", what, describe(cur())));
    next();
  }
  void expect_block_end() { expect(Tok::BlockEnd, "end of statement block"); }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(cur(), fmt::format("expected name, got {}", describe(cur())));
    return next().value;
  }

  int intern(const std::string& name) {
    auto [it, added] = prog_.sym_ids.emplace(name, int(prog_.symbols.size()));
    if (added) prog_.symbols.push_back(name);
    return it->second;
  }

  // --- statements ----------------------------------------------------------------------------------

  // Parses until a block tag named in `ends`; leaves that name as the current token.
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    for (;;) {
      const Token& t = cur();
      switch (t.type) {
        case Tok::Text:
          body.push_back(std::make_unique<TextStmt>(pos_of(t), t.value));
          next();
          break;
        case Tok::VarBegin: {
          Pos p = pos_of(next());
          auto e = parse_tuple(true, {}, false);
          expect(Tok::VarEnd, "end of print statement");
          body.push_back(std::make_unique<EmitStmt>(p, std::move(e)));
          break;
        }
        case Tok::BlockBegin: {
          const Token& name = peek();
          for (const char* e : ends)
            if (tok_is_name(name, e)) {
              next();
              return body;
            }
          next();
          body.push_back(parse_statement(ends));
          break;
        }
        case Tok::Eof:
          if (ends.size()) {
            std::string want;
            for (const char* e : ends) want += fmt::format("{}'{}'", want.empty() ? "" : " or ", e);
            fail(t, fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}.", want));
          }
          return body;
        default: fail(t, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  StmtPtr parse_statement(std::initializer_list<const char*> ends) {
    DepthGuard guard(*this);
    const Token& t = cur();
    if (t.type != Tok::Name) fail(t, "tag name expected");
    const std::string& n = t.value;
    if (n == "if") return parse_if();
    if (n == "for") return parse_for();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "with") return parse_with();
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail(t, fmt::format("'{}' is only allowed inside a loop", n));
      Pos p = pos_of(next());
      expect_block_end();
      return std::make_unique<Stmt>(n == "break" ? SK::Break : SK::Continue, p);
    }
    if (n == "generation" || n == "block") return parse_scope(n == "block");
    std::string msg = fmt::format("Encountered unknown tag '{}'.", n);
    if (ends.size()) {
      std::string want;
      for (const char* e : ends) want += fmt::format("{}'{}'", want.empty() ? "" : " or ", e);
      msg += fmt::format(" Jinja was looking for the following tags: {}.", want);
    } else if (n == "include" || n == "import" || n == "from" || n == "extends" || n == "do" || n == "autoescape") {
      msg += " (this interpreter does not support it)";
    }
    fail(t, msg);
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(pos_of(next()));
    for (;;) {
      auto cond = parse_tuple(false, {}, false);
      expect_block_end();
      Body b = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(b));
      const Token& t = next();
      if (t.value == "elif") continue;
      if (t.value == "else") {
        expect_block_end();
        s->otherwise = parse_body({"endif"});
        next();
      }
      break;
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(pos_of(next()));
    s->target = parse_target(false, "in");
    if (!is_name("in")) fail(cur(), fmt::format("expected 'in', got {}", describe(cur())));
    next();
    s->iter = parse_tuple(false, {"recursive"}, false);
    if (is_name("if")) {
      next();
      s->filter = parse_expression(true);
    }
    if (is_name("recursive")) {
      next();
      s->recursive = true;
    }
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      s->otherwise = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    Pos p = pos_of(next());
    Target target = parse_target(true, nullptr);
    if (is_op("=")) {
      next();
      auto s = std::make_unique<SetStmt>(p);
      s->target = std::move(target);
      s->value = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    if (target.kind == Target::Tuple) fail(cur(), "a block set needs a single name");
    auto s = std::make_unique<SetBlockStmt>(p);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(std::make_unique<Expr>(EK::Captured, pos()), false);
    expect_block_end();
    s->body = parse_body({"endset"});
    next();
    expect_block_end();
    return s;
  }

  void parse_params(MacroDef& def) {
    expect_op("(");
    while (!is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param prm;
      prm.name = expect_name();
      prm.sym = intern(prm.name);
      if (is_op("=")) {
        next();
        prm.def = parse_expression(true);
      } else if (!def.params.empty() && def.params.back().def) {
        fail(cur(), "non-default argument follows default argument");
      }
      def.params.push_back(std::move(prm));
    }
    next();
  }

  void parse_macro_body(MacroDef& def, const char* end) {
    int saved_loops = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition does not make break legal inside it
    macros_.push_back(&def);
    def.body = parse_body({end});
    macros_.pop_back();
    loop_depth_ = saved_loops;
    next();
    expect_block_end();
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>(pos_of(next()));
    s->def.name = expect_name();
    s->sym = intern(s->def.name);
    parse_params(s->def);
    expect_block_end();
    parse_macro_body(s->def, "endmacro");
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlockStmt>(pos_of(next()));
    s->caller.name = "caller";
    if (is_op("(")) parse_params(s->caller);
    const Token& at = cur();
    s->call = parse_expression(true);
    if (s->call->kind != EK::Call) fail(at, "expected call");
    expect_block_end();
    parse_macro_body(s->caller, "endcall");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<FilterBlockStmt>(pos_of(next()));
    s->filter = parse_filter(std::make_unique<Expr>(EK::Captured, pos()), true);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(pos_of(next()));
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target t = parse_target(false, nullptr);
      expect_op("=");
      s->assigns.emplace_back(std::move(t), parse_expression(true));
    }
    next();
    s->body = parse_body({"endwith"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_scope(bool block) {
    auto s = std::make_unique<ScopeStmt>(pos_of(next()));
    if (block) {
      expect_name();
      while (is_name("scoped") || is_name("required")) next();
    }
    expect_block_end();
    s->body = parse_body({block ? "endblock" : "endgeneration"});
    next();
    if (block && cur().type == Tok::Name) next();
    expect_block_end();
    return s;
  }

  // Assignment targets: `x`, `a, b`, `(a, (b, c))`, and with `ns_ok` also `ns.attr`.
  Target parse_target(bool ns_ok, const char* end_name) {
    Target t = parse_target_item(ns_ok);
    if (!is_op(",")) return t;
    Target tup;
    tup.kind = Target::Tuple;
    tup.pos = t.pos;
    tup.items.push_back(std::move(t));
    while (is_op(",")) {
      next();
      if ((end_name && is_name(end_name)) || is_op("=") || cur().type == Tok::BlockEnd) break;
      tup.items.push_back(parse_target_item(false));
    }
    return tup;
  }

  Target parse_target_item(bool ns_ok) {
    Target t;
    t.pos = pos();
    if (is_op("(")) {
      next();
      t.kind = Target::Tuple;
      while (!is_op(")")) {
        if (!t.items.empty()) expect_op(",");
        if (is_op(")")) break;
        t.items.push_back(parse_target_item(false));
      }
      next();
      return t;
    }
    if (cur().type != Tok::Name) fail(cur(), fmt::format("can't assign to {}", describe(cur())));
    t.name = next().value;
    t.sym = intern(t.name);
    if (ns_ok && is_op(".")) {
      next();
      t.kind = Target::NsAttr;
      t.attr = expect_name();
    }
    return t;
  }

  // --- expressions -----------------------------------------------------------------------------

  bool tuple_end(std::initializer_list<const char*> extra) const {
    Tok ty = cur().type;
    if (ty == Tok::VarEnd || ty == Tok::BlockEnd || ty == Tok::Eof || is_op(")")) return true;
    for (const char* e : extra)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra, bool explicit_parens) {
    Pos p = pos();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(cur(), fmt::format("Expected an expression, got {}", describe(cur())));
    }
    auto t = std::make_unique<ListExpr>(p, true);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    auto e = parse_or();
    while (is_name("if")) {
      auto c = std::make_unique<CondExpr>(pos_of(next()));
      c->test = parse_or();
      if (is_name("else")) {
        next();
        c->otherwise = parse_condexpr();
      }
      c->then = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      Pos p = pos_of(next());
      e = std::make_unique<BinExpr>(EK::Or, p, BinOp::Add, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      Pos p = pos_of(next());
      e = std::make_unique<BinExpr>(EK::And, p, BinOp::Add, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      Pos p = pos_of(next());
      return std::make_unique<UnaryExpr>(EK::Not, p, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    auto first = parse_math1();
    std::unique_ptr<CompareExpr> c;
    for (;;) {
      CmpOp op;
      Pos p = pos();
      if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                    cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        const std::string& v = cur().value;
        op = v == "=="   ? CmpOp::Eq
             : v == "!=" ? CmpOp::Ne
             : v == "<"  ? CmpOp::Lt
             : v == "<=" ? CmpOp::Le
             : v == ">"  ? CmpOp::Gt
                         : CmpOp::Ge;
        next();
      } else if (is_name("in")) {
        op = CmpOp::In;
        next();
      } else if (is_name("not") && tok_is_name(peek(), "in")) {
        op = CmpOp::NotIn;
        next();
        next();
      } else {
        break;
      }
      if (!c) c = std::make_unique<CompareExpr>(p, std::move(first));
      c->rest.emplace_back(op, parse_math1());
    }
    if (!c) return first;
    return c;
  }

  ExprPtr bin(BinOp op, Pos p, ExprPtr a, ExprPtr b) {
    return std::make_unique<BinExpr>(EK::Bin, p, op, std::move(a), std::move(b));
  }

  ExprPtr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      BinOp op = cur().value == "+" ? BinOp::Add : BinOp::Sub;
      Pos p = pos_of(next());
      e = bin(op, p, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) {
      Pos p = pos_of(next());
      e = bin(BinOp::Concat, p, std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& v = cur().value;
      BinOp op = v == "*" ? BinOp::Mul : v == "/" ? BinOp::Div : v == "//" ? BinOp::FloorDiv : BinOp::Mod;
      Pos p = pos_of(next());
      e = bin(op, p, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) {  // left-associative in jinja2, unlike Python
      Pos p = pos_of(next());
      e = bin(BinOp::Pow, p, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      EK k = cur().value == "-" ? EK::Neg : EK::Plus;
      Pos p = pos_of(next());
      e = std::make_unique<UnaryExpr>(k, p, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    Pos p = pos_of(t);
    switch (t.type) {
      case Tok::Name: {
        const std::string& n = t.value;
        if (n == "true" || n == "True" || n == "false" || n == "False") {
          next();
          return std::make_unique<ConstExpr>(p, Value::boolean(n[0] == 't' || n[0] == 'T'));
        }
        if (n == "none" || n == "None") {
          next();
          return std::make_unique<ConstExpr>(p, Value::none());
        }
        int sym = intern(n);
        if (!macros_.empty()) {
          if (sym == kSymCaller) macros_.back()->catch_caller = true;
          if (sym == kSymVarargs) macros_.back()->catch_varargs = true;
          if (sym == kSymKwargs) macros_.back()->catch_kwargs = true;
        }
        next();
        return std::make_unique<NameExpr>(p, n, sym);
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) s += next().value;  // adjacent literals concatenate
        return std::make_unique<ConstExpr>(p, Value::string(std::move(s)));
      }
      case Tok::Int: next(); return std::make_unique<ConstExpr>(p, Value::integer(t.ival));
      case Tok::Float: next(); return std::make_unique<ConstExpr>(p, Value::number(t.fval));
      case Tok::Op:
        if (t.value == "(") {
          next();
          auto e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          auto l = std::make_unique<ListExpr>(p, false);
          while (!is_op("]")) {
            if (!l->items.empty()) expect_op(",");
            if (is_op("]")) break;
            l->items.push_back(parse_expression(true));
          }
          next();
          return l;
        }
        if (t.value == "{") {
          next();
          auto d = std::make_unique<DictExpr>(p);
          while (!is_op("}")) {
            if (!d->items.empty()) expect_op(",");
            if (is_op("}")) break;
            auto k = parse_expression(true);
            expect_op(":");
            d->items.emplace_back(std::move(k), parse_expression(true));
          }
          next();
          return d;
        }
        break;
      default: break;
    }
    fail(t, fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        Pos p = pos_of(next());
        if (cur().type == Tok::Name) {
          e = std::make_unique<AttrExpr>(p, std::move(e), next().value);
        } else if (cur().type == Tok::Int) {
          auto idx = std::make_unique<ConstExpr>(p, Value::integer(next().ival));
          e = std::make_unique<ItemExpr>(p, std::move(e), std::move(idx));
        } else {
          fail(cur(), "expected name or number");
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    Pos p = pos_of(next());
    ExprPtr a, b, c;
    bool slice = false;
    if (!is_op(":")) a = parse_expression(true);
    if (is_op(":")) {
      slice = true;
      next();
      if (!is_op("]") && !is_op(":")) b = parse_expression(true);
      if (is_op(":")) {
        next();
        if (!is_op("]")) c = parse_expression(true);
      }
    }
    if (is_op(",")) fail(cur(), "multi-dimensional subscripts are not supported");
    expect_op("]");
    if (!slice) return std::make_unique<ItemExpr>(p, std::move(obj), std::move(a));
    auto s = std::make_unique<SliceExpr>(p);
    s->obj = std::move(obj);
    s->start = std::move(a);
    s->stop = std::move(b);
    s->step = std::move(c);
    return s;
  }

  void parse_call_args(CallArgs& args) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*")) {
        next();
        args.star = parse_expression(true);
      } else if (is_op("**")) {
        next();
        args.dstar = parse_expression(true);
      } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        std::string key = next().value;
        next();
        args.kw.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.kw.empty() || args.star || args.dstar) fail(cur(), "positional argument follows keyword argument");
        args.pos.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = std::make_unique<CallExpr>(pos(), std::move(callee));
    parse_call_args(c->args);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|"))
        e = parse_filter(std::move(e), false);
      else if (is_name("is"))
        e = parse_test(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      next();
      n += '.';  // two appends: `"." + name` trips GCC 12's -Wrestrict false positive
      n += expect_name();
    }
    return n;
  }

  ExprPtr parse_filter(ExprPtr e, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      Pos p = pos();
      auto f = std::make_unique<FilterExpr>(p, std::move(e), dotted_name());
      f->fn = find_filter(f->name);
      if (is_op("(")) parse_call_args(f->args);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    Pos p = pos_of(next());
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    auto t = std::make_unique<TestExpr>(p, std::move(e), dotted_name());
    t->fn = find_test(t->name);
    t->negated = negated;
    const Token& c = cur();
    bool arg_start = c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                     is_op("[") || is_op("{");
    if (is_op("(")) {
      parse_call_args(t->args);
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      // jinja2 allows one argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
      if (is_name("is")) fail(c, "You cannot chain multiple tests with is");
      t->args.pos.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source) {
  auto prog = std::make_unique<Program>();
  Parser(tokenize(source), *prog).run();
  return prog;
}

}  // namespace ts::chat::jinja
