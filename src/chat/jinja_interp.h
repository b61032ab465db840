// The tree-walking interpreter. One Interp per render call holds all mutable state (frames,
// namespaces, output buffers), which is what makes Template::render thread-safe.
//
// Scoping follows what jinja2's compiler produces: `for` bodies, macro calls and `with` blocks
// open a frame, `if` does not; every loop iteration starts from a fresh frame (assignments made in
// one iteration are gone in the next), a `set` writes to the innermost frame, and a macro body sees
// its parameters plus the template's top-level variables at call time — not its caller's locals.
#pragma once
#include <ctime>
#include <string>
#include <vector>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace ts::chat::jinja {

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const {
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

// Binds call arguments to a builtin's parameter list (Python's positional-or-keyword rules).
// Missing parameters come back as nullptr.
std::vector<const Value*> bind_args(const Args& args, std::initializer_list<const char*> params, const char* fname);

struct Callable : Object {
  Callable() : Object(ObjType::Callable) {}
  virtual Value call(Interp& in, const Args& args) = 0;
};

struct Frame {
  Frame* parent = nullptr;
  bool top = false;  // the template's top-level frame: what macros see besides their arguments
  std::vector<std::pair<int, Value>> vars;
  const Value* find(int sym) const {
    for (auto& [s, v] : vars)
      if (s == sym) return &v;
    return nullptr;
  }
  void set(int sym, Value v) {
    for (auto& [s, x] : vars)
      if (s == sym) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(sym, std::move(v));
  }
};

struct LoopObj : Object {
  LoopObj() : Object(ObjType::Loop) {}
  const char* py_type() const override { return "LoopContext"; }
  void repr(std::string& out) const override;
  Value items;  // the list being iterated
  size_t index = 0;
  int depth0 = 0;
  Value last_changed;  // state of loop.changed()
  bool changed_called = false;
  const ForStmt* stmt = nullptr;  // for recursive loops: loop(x) re-enters the body
  Frame* frame = nullptr;         // the frame the for statement runs in; valid only while `running`
  bool running = false;           // a loop object kept past its loop (in a namespace) cannot recurse
  size_t length() const { return items.lst().items.size(); }
};

// cycler(...): the only other stateful global; next() advances, reset() rewinds, .current peeks.
struct CyclerObj : Object {
  CyclerObj() : Object(ObjType::Cycler) {}
  const char* py_type() const override { return "Cycler"; }
  const char* py_module() const override { return "jinja2.utils"; }
  void repr(std::string& out) const override { out += "<jinja2.utils.Cycler object>"; }
  std::vector<Value> items;  // never empty
  size_t pos = 0;
};

enum class Flow : uint8_t { Normal, Break, Continue };

class Interp {
 public:
  Interp(const Program& prog, const RenderOptions& opts);
  std::string render(const nlohmann::ordered_json& context);

  // jinja2's environment.getattr / getitem, sandboxed: attribute first, then item (or the reverse).
  // `key` (optional) is `name` as a value, saving an allocation when the result is undefined.
  Value getattr(const Value& obj, std::string_view name, const Value* key = nullptr);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, const Args& args);
  Value apply_filter(const std::string& name, const Value& v, const Args& args);
  bool apply_test(const std::string& name, const Value& v, const Args& args);
  const std::tm& now();

  Value call_macro(const MacroDef& def, Frame* closure, const Args& args);
  // Every namespace() this render makes. Namespaces are the sandbox's only mutable values, so
  // the only way to a reference cycle (`{% set ns.me = ns %}`): their attributes are cleared when
  // the render ends, which frees such cycles with the rest.
  void track(const std::shared_ptr<NamespaceObj>& ns) { namespaces_.push_back(ns); }
  Value run_loop(const ForStmt& s, Frame* frame, const Value& iterable, int depth0, bool capture);

 private:
  const Program& prog_;
  const RenderOptions& opts_;
  std::string* out_ = nullptr;
  Frame* frame_ = nullptr;
  Frame* top_ = nullptr;
  std::vector<Value> globals_;  // by symbol id: context variables and builtin globals
  std::vector<uint8_t> has_global_;
  const Expr* cur_ = nullptr;  // the node being evaluated, for error positions
  Pos stmt_pos_;
  Value captured_;  // output of the filter block / block set being filtered
  int call_depth_ = 0;
  size_t loop_iterations_ = 0;  // over the whole render, against kMaxLoopIterations
  std::vector<std::weak_ptr<NamespaceObj>> namespaces_;
  std::tm now_{};
  bool now_set_ = false;

  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  void exec_set(const SetStmt& s);
  void assign(const Target& t, const Value& v);
  Value eval(const Expr& e);
  Value eval_call(const CallExpr& c);
  void eval_args(const CallArgs& a, Args& out);
  Value eval_bin(const BinExpr& b);
  Value eval_compare(const CompareExpr& c);
  Value lookup(const NameExpr& n);
  const Value* find_var(int sym) const;
  std::string capture(const Body& body);
  Frame* closure_frame(std::shared_ptr<Frame>& holder);
  [[noreturn]] void rethrow(const JinjaError& e);
};

// Python operations the interpreter and the builtins share.
Value binary_op(BinOp op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Iterates like Python's iter(): list items, dict keys, string characters; Undefined is empty.
Value iterate(const Value& v);
// str methods, dict.get/items/keys/values, list.index/count; false if `name` is not a method of v.
bool has_method(const Value& v, std::string_view name);
Value call_method(Interp& in, const Value& self, std::string_view name, const Args& args);
// Builtin globals (range, namespace, dict, raise_exception, strftime_now, ...).
bool builtin_global(std::string_view name, Value& out);
// A Callable that invokes obj.name(...) later, for `x.method` used without calling it right away.
Value bound_method(const Value& self, std::string_view name);

}  // namespace ts::chat::jinja
