// Syntax tree of a parsed chat template. Nodes are immutable after parsing and shared by every
// render (possibly on several threads at once); names are interned to symbol ids at parse time so
// that variable lookup compares integers.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace ts::chat::jinja {

class Interp;
struct Args;
using FilterFn = Value (*)(Interp&, const Value&, const Args&);
using TestFn = bool (*)(Interp&, const Value&, const Args&);
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

struct Pos {
  int line = 0;
  int col = 0;
};

enum class EK : uint8_t {
  Const,
  Name,
  List,
  Dict,
  Attr,
  Item,
  Slice,
  Call,
  Filter,
  Test,
  Neg,
  Plus,
  Not,
  Bin,
  And,
  Or,
  Compare,
  Cond,
  Captured,  // the output captured by a filter block or block set, fed to its filter chain
};
enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat };
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Expr {
  Expr(EK k, Pos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  EK kind;
  Pos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Pos p, Value v) : Expr(EK::Const, p), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(Pos p, std::string n, int s) : Expr(EK::Name, p), name(std::move(n)), sym(s), key(Value::string(name)) {}
  std::string name;
  int sym;
  Value key;  // the name as a value, for undefined hints without allocating
};
struct ListExpr : Expr {
  ListExpr(Pos p, bool t) : Expr(EK::List, p), tuple(t) {}
  std::vector<ExprPtr> items;
  bool tuple;
};
struct DictExpr : Expr {
  explicit DictExpr(Pos p) : Expr(EK::Dict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct AttrExpr : Expr {
  AttrExpr(Pos p, ExprPtr o, std::string n)
      : Expr(EK::Attr, p), obj(std::move(o)), name(std::move(n)), key(Value::string(name)) {}
  ExprPtr obj;
  std::string name;
  Value key;
};
struct ItemExpr : Expr {
  ItemExpr(Pos p, ExprPtr o, ExprPtr i) : Expr(EK::Item, p), obj(std::move(o)), index(std::move(i)) {}
  ExprPtr obj, index;
};
struct SliceExpr : Expr {
  explicit SliceExpr(Pos p) : Expr(EK::Slice, p) {}
  ExprPtr obj, start, stop, step;  // absent bounds are null
};
struct CallArgs {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
  ExprPtr star, dstar;  // *args, **kwargs
};
struct CallExpr : Expr {
  CallExpr(Pos p, ExprPtr c) : Expr(EK::Call, p), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgs args;
};
struct FilterExpr : Expr {
  FilterExpr(Pos p, ExprPtr o, std::string n) : Expr(EK::Filter, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  FilterFn fn = nullptr;  // null: unknown, an error only if evaluated (as in jinja2 for untaken branches)
  CallArgs args;
};
struct TestExpr : Expr {
  TestExpr(Pos p, ExprPtr o, std::string n) : Expr(EK::Test, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  TestFn fn = nullptr;
  CallArgs args;
  bool negated = false;
};
struct UnaryExpr : Expr {
  UnaryExpr(EK k, Pos p, ExprPtr o) : Expr(k, p), operand(std::move(o)) {}
  ExprPtr operand;
};
struct BinExpr : Expr {  // Bin (arithmetic, ~), And, Or
  BinExpr(EK k, Pos p, BinOp o, ExprPtr a, ExprPtr b) : Expr(k, p), op(o), l(std::move(a)), r(std::move(b)) {}
  BinOp op;
  ExprPtr l, r;
};
struct CompareExpr : Expr {
  CompareExpr(Pos p, ExprPtr f) : Expr(EK::Compare, p), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> rest;
};
struct CondExpr : Expr {
  explicit CondExpr(Pos p) : Expr(EK::Cond, p) {}
  ExprPtr test, then, otherwise;  // otherwise may be null
};

// --- statements -------------------------------------------------------------------------------------

enum class SK : uint8_t {
  Text,
  Emit,
  If,
  For,
  Set,
  SetBlock,
  Macro,
  CallBlock,
  FilterBlock,
  With,
  Break,
  Continue,
  Scope
};

struct Stmt {
  Stmt(SK k, Pos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  SK kind;
  Pos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: a name, `ns.attr`, or a (possibly nested) tuple of names.
struct Target {
  enum Kind : uint8_t { Name, NsAttr, Tuple } kind = Name;
  Pos pos;
  int sym = -1;
  std::string name, attr;
  std::vector<Target> items;
};

struct TextStmt : Stmt {
  TextStmt(Pos p, std::string t) : Stmt(SK::Text, p), text(std::move(t)) {}
  std::string text;
};
struct EmitStmt : Stmt {
  EmitStmt(Pos p, ExprPtr e) : Stmt(SK::Emit, p), expr(std::move(e)) {}
  ExprPtr expr;
};
struct IfStmt : Stmt {
  explicit IfStmt(Pos p) : Stmt(SK::If, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
};
struct ForStmt : Stmt {
  explicit ForStmt(Pos p) : Stmt(SK::For, p) {}
  Target target;
  ExprPtr iter, filter;
  Body body, otherwise;
  bool recursive = false;
};
struct SetStmt : Stmt {
  explicit SetStmt(Pos p) : Stmt(SK::Set, p) {}
  Target target;
  ExprPtr value;
};
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(Pos p) : Stmt(SK::SetBlock, p) {}
  Target target;
  ExprPtr filter;  // filter chain over a Captured node, or null
  Body body;
};
struct Param {
  std::string name;
  int sym;
  ExprPtr def;
};
// Macros and call-block callers share the calling convention.
struct MacroDef {
  std::string name;
  std::vector<Param> params;
  Body body;
  bool catch_varargs = false, catch_kwargs = false, catch_caller = false;
};
struct MacroStmt : Stmt {
  explicit MacroStmt(Pos p) : Stmt(SK::Macro, p) {}
  int sym = -1;
  MacroDef def;
};
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(Pos p) : Stmt(SK::CallBlock, p) {}
  MacroDef caller;
  ExprPtr call;  // a CallExpr
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(Pos p) : Stmt(SK::FilterBlock, p) {}
  ExprPtr filter;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(Pos p) : Stmt(SK::With, p) {}
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body;
};
// `{% generation %}` (transformers' assistant-mask tag) and `{% block %}`: render the body in place.
struct ScopeStmt : Stmt {
  explicit ScopeStmt(Pos p) : Stmt(SK::Scope, p) {}
  Body body;
};

// Well-known symbols get fixed ids so the interpreter needs no lookup for them.
enum Sym : int { kSymLoop = 0, kSymCaller, kSymVarargs, kSymKwargs, kSymFirstFree };

struct Program {
  Body body;
  std::vector<std::string> symbols;  // id -> name
  std::unordered_map<std::string, int> sym_ids;
};

// Throws TemplateError (TemplateSyntaxError).
std::unique_ptr<Program> parse_program(std::string_view source);

}  // namespace ts::chat::jinja
