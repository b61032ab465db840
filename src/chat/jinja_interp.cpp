#include "chat/jinja_interp.h"

#include <fmt/format.h>

namespace ts::chat::jinja {
namespace {

// Macro recursion limit: deep enough for recursive schema renderers (gpt-oss walks JSON schemas
// with a recursive macro), shallow enough that a runaway template cannot exhaust a thread's stack.
constexpr int kMaxCallDepth = 200;
// Render budgets, so no template (or context) can hang a server thread or fill its memory:
// loop iterations over the whole render (nested range(100000) loops would run 10^10 times) and
// the rendered text (and every captured buffer: filter blocks, block sets, loop(...) calls).
constexpr size_t kMaxLoopIterations = 5'000'000;
constexpr size_t kMaxRenderOutput = kMaxGeneratedString;

void check_output(const std::string& out) {
  if (out.size() > kMaxRenderOutput)
    throw JinjaError("MemoryError", fmt::format("the rendered text exceeds the {} MiB limit", kMaxRenderOutput >> 20));
}

struct MacroObj : Callable {
  MacroObj(const MacroDef& d, Frame* c, std::shared_ptr<Frame> h) : def(d), closure(c), holder(std::move(h)) {}
  const char* py_type() const override { return "Macro"; }
  void repr(std::string& out) const override { out += fmt::format("<Macro '{}'>", def.name); }
  Value call(Interp& in, const Args& args) override { return in.call_macro(def, closure, args); }
  const MacroDef& def;
  Frame* closure;
  std::shared_ptr<Frame> holder;  // owns `closure` when it is a snapshot (see closure_frame)
};

struct HostFn : Callable {
  HostFn(std::string n, const TemplateFunction& f) : name(std::move(n)), fn(f) {}
  const char* py_type() const override { return "function"; }
  void repr(std::string& out) const override { out += fmt::format("<function {}>", name); }
  Value call(Interp&, const Args& args) override {
    auto pos = nlohmann::ordered_json::array();
    auto kw = nlohmann::ordered_json::object();
    for (auto& v : args.pos) pos.push_back(to_json(v));
    for (auto& [k, v] : args.kw) kw[k] = to_json(v);
    nlohmann::ordered_json r;
    try {
      r = fn(pos, kw);
    } catch (const TemplateError&) {
      throw;
    } catch (const std::exception& e) {
      throw JinjaError("Error", fmt::format("{}(): {}", name, e.what()));
    }
    return from_json(r);
  }
  std::string name;
  const TemplateFunction& fn;
};

// RAII for the interpreter's current frame and output buffer.
template <class T>
struct Swap {
  T& slot;
  T saved;
  Swap(T& s, T v) : slot(s), saved(s) { slot = v; }
  ~Swap() { slot = saved; }
};

Value missing_attr(const Value& obj, std::string_view name, const Value* key) {
  return Value::missing(obj, key ? *key : Value::string(std::string(name)));
}

bool unsafe_method(const Value& obj, std::string_view name) {
  static const std::string_view list_m[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
  static const std::string_view dict_m[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (obj.is_list()) {
    for (auto m : list_m)
      if (m == name) return true;
  } else if (obj.is_dict()) {
    for (auto m : dict_m)
      if (m == name) return true;
  }
  return false;
}

Value unsafe_undefined(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

Value loop_attr(const Value& obj, std::string_view name, const Value* key) {
  auto& l = obj.as<LoopObj>();
  int64_t i = int64_t(l.index), n = int64_t(l.length());
  auto& items = l.items.lst().items;
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(l.depth0 + 1);
  if (name == "depth0") return Value::integer(l.depth0);
  if (name == "previtem") return i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? items[size_t(i + 1)] : Value::undefined("there is no next item");
  return missing_attr(obj, name, key);
}

}  // namespace

void LoopObj::repr(std::string& out) const { out += fmt::format("<LoopContext {}/{}>", index + 1, length()); }

Interp::Interp(const Program& prog, const RenderOptions& opts) : prog_(prog), opts_(opts) {}

const std::tm& Interp::now() {
  if (opts_.now) return *opts_.now;
  if (!now_set_) {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &now_);
    now_set_ = true;
  }
  return now_;
}

void Interp::rethrow(const JinjaError& e) {
  Pos p = cur_ ? cur_->pos : stmt_pos_;
  throw TemplateError(e.kind, e.msg, p.line, p.col);
}

std::string Interp::render(const nlohmann::ordered_json& context) {
  if (!context.is_object() && !context.is_null())
    throw TemplateError("TypeError", "the template context must be a JSON object", 0, 0);
  size_t n = prog_.symbols.size();
  globals_.assign(n, Value());
  has_global_.assign(n, 0);
  for (size_t s = kSymFirstFree; s < n; ++s) {
    const std::string& name = prog_.symbols[s];
    auto f = opts_.functions.find(name);
    if (f != opts_.functions.end()) {
      globals_[s] = Value::object(std::make_shared<HostFn>(name, f->second));
      has_global_[s] = 1;
    } else if (builtin_global(name, globals_[s])) {
      has_global_[s] = 1;
    }
  }
  if (context.is_object()) {
    // Only names the template mentions can be read, so only those are converted.
    for (auto it = context.begin(); it != context.end(); ++it) {
      auto s = prog_.sym_ids.find(it.key());
      if (s == prog_.sym_ids.end()) continue;
      try {
        globals_[size_t(s->second)] = from_json(it.value());
      } catch (const JinjaError& e) {
        throw TemplateError(e.kind, fmt::format("{} ('{}')", e.msg, it.key()), 0, 0);
      }
      has_global_[size_t(s->second)] = 1;
    }
  }
  struct ClearNamespaces {  // on every way out (a namespace may hold itself)
    std::vector<std::weak_ptr<NamespaceObj>>& all;
    ~ClearNamespaces() {
      for (auto& w : all)
        if (auto ns = w.lock()) ns->attrs.clear();
      all.clear();
    }
  } clear_namespaces{namespaces_};
  Frame top;
  top.top = true;
  top_ = frame_ = &top;
  std::string out;
  out_ = &out;
  try {
    exec(prog_.body);
  } catch (const TemplateError&) {
    throw;
  } catch (const JinjaError& e) {
    rethrow(e);
  } catch (const std::bad_alloc&) {
    rethrow(JinjaError("MemoryError", "out of memory"));
  } catch (const std::exception& e) {
    // e.g. a numeric conversion on an absurd format width: still a template error with a position.
    rethrow(JinjaError("Error", e.what()));
  }
  return out;
}

// --- statements -------------------------------------------------------------------------------------

Flow Interp::exec(const Body& body) {
  for (auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interp::capture(const Body& body) {
  std::string buf;
  Swap<std::string*> o(out_, &buf);
  exec(body);
  return buf;
}

Frame* Interp::closure_frame(std::shared_ptr<Frame>& holder) {
  if (frame_->top) return frame_;
  // Macros and callers defined inside a loop, macro or with block may outlive that frame (stored
  // in a namespace, say), so they keep a snapshot of the enclosing locals on top of the template's
  // top-level frame, which lives for the whole render.
  holder = std::make_shared<Frame>();
  for (Frame* f = frame_; f && !f->top; f = f->parent)
    for (auto& [s, v] : f->vars)
      if (!holder->find(s)) holder->vars.emplace_back(s, v);
  holder->parent = top_;
  return holder.get();
}

Flow Interp::exec(const Stmt& s) {
  cur_ = nullptr;
  stmt_pos_ = s.pos;
  switch (s.kind) {
    case SK::Text:
      out_->append(static_cast<const TextStmt&>(s).text);
      check_output(*out_);
      break;
    case SK::Emit: {
      Value v = eval(*static_cast<const EmitStmt&>(s).expr);
      if (v.is_string())
        out_->append(v.str());
      else
        append_str(*out_, v);
      check_output(*out_);
      break;
    }
    case SK::If: {
      auto& st = static_cast<const IfStmt&>(s);
      for (auto& [cond, body] : st.branches)
        if (truthy(eval(*cond))) return exec(body);
      return exec(st.otherwise);
    }
    case SK::For: {
      auto& st = static_cast<const ForStmt&>(s);
      run_loop(st, frame_, eval(*st.iter), 0, false);
      break;
    }
    case SK::Set: exec_set(static_cast<const SetStmt&>(s)); break;
    case SK::SetBlock: {
      auto& st = static_cast<const SetBlockStmt&>(s);
      Value v = Value::string(capture(st.body));
      if (st.filter) {
        Swap<Value> c(captured_, v);
        v = eval(*st.filter);
      }
      assign(st.target, v);
      break;
    }
    case SK::Macro: {
      auto& st = static_cast<const MacroStmt&>(s);
      std::shared_ptr<Frame> holder;
      Frame* c = closure_frame(holder);
      frame_->set(st.sym, Value::object(std::make_shared<MacroObj>(st.def, c, std::move(holder))));
      break;
    }
    case SK::CallBlock: {
      auto& st = static_cast<const CallBlockStmt&>(s);
      auto& call = static_cast<const CallExpr&>(*st.call);
      std::shared_ptr<Frame> holder;
      Frame* c = closure_frame(holder);
      Value fn = eval(*call.callee);
      Args args;
      eval_args(call.args, args);
      args.kw.emplace_back("caller", Value::object(std::make_shared<MacroObj>(st.caller, c, std::move(holder))));
      cur_ = &call;
      append_str(*out_, this->call(fn, args));
      break;
    }
    case SK::FilterBlock: {
      auto& st = static_cast<const FilterBlockStmt&>(s);
      Swap<Value> c(captured_, Value::string(capture(st.body)));
      append_str(*out_, eval(*st.filter));
      break;
    }
    case SK::With: {
      auto& st = static_cast<const WithStmt&>(s);
      Frame f;
      f.parent = frame_;
      std::vector<Value> vals;
      for (auto& [t, e] : st.assigns) vals.push_back(eval(*e));
      Swap<Frame*> fr(frame_, &f);
      for (size_t k = 0; k < vals.size(); ++k) assign(st.assigns[k].first, vals[k]);
      return exec(st.body);
    }
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
    case SK::Scope: {
      Frame f;
      f.parent = frame_;
      Swap<Frame*> fr(frame_, &f);
      return exec(static_cast<const ScopeStmt&>(s).body);
    }
  }
  return Flow::Normal;
}

void Interp::exec_set(const SetStmt& s) {
  Value v = eval(*s.value);
  assign(s.target, v);
}

void Interp::assign(const Target& t, const Value& v) {
  switch (t.kind) {
    case Target::Name: frame_->set(t.sym, v); return;
    case Target::NsAttr: {
      const Value* ns = find_var(t.sym);
      if (!ns || !ns->is_object(ObjType::Namespace))
        throw JinjaError("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
      auto& obj = ns->as<NamespaceObj>();
      if (Value* slot = obj.find(t.attr))
        *slot = v;
      else
        obj.attrs.emplace_back(t.attr, v);
      return;
    }
    case Target::Tuple: {
      Value seq = iterate(v);
      auto& items = seq.lst().items;
      if (items.size() > t.items.size())
        throw JinjaError("ValueError", fmt::format("too many values to unpack (expected {})", t.items.size()));
      if (items.size() < t.items.size())
        throw JinjaError("ValueError", fmt::format("not enough values to unpack (expected {}, got {})", t.items.size(),
                                                   items.size()));
      for (size_t k = 0; k < items.size(); ++k) assign(t.items[k], items[k]);
      return;
    }
  }
}

Value Interp::run_loop(const ForStmt& s, Frame* frame, const Value& iterable, int depth0, bool capture_out) {
  Value items = iterate(iterable);
  Frame f;
  f.parent = frame;
  Swap<Frame*> fr(frame_, &f);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items.lst().items) {
      f.vars.clear();
      assign(s.target, item);
      if (truthy(eval(*s.filter))) kept.push_back(item);
    }
    items = Value::list(std::move(kept));
  }
  auto loop = std::make_shared<LoopObj>();
  loop->items = items;
  loop->depth0 = depth0;
  loop->stmt = &s;
  loop->frame = frame;
  Swap<bool> running(loop->running, true);
  Value loopv = Value::object(loop);
  std::string buf;
  Swap<std::string*> o(out_, capture_out ? &buf : out_);
  const auto& list = items.lst().items;
  for (size_t k = 0; k < list.size(); ++k) {
    if (++loop_iterations_ > kMaxLoopIterations)
      throw JinjaError("SecurityError", fmt::format("the template ran more than {} loop iterations (sandbox limit)",
                                                    kMaxLoopIterations));
    f.vars.clear();
    assign(s.target, list[k]);
    f.vars.emplace_back(kSymLoop, loopv);
    loop->index = k;
    if (exec(s.body) == Flow::Break) break;
  }
  if (list.empty()) {
    f.vars.clear();
    exec(s.otherwise);
  }
  return capture_out ? Value::string(std::move(buf)) : Value();
}

Value Interp::call_macro(const MacroDef& def, Frame* closure, const Args& args) {
  if (call_depth_ >= kMaxCallDepth) throw JinjaError("RecursionError", "maximum recursion depth exceeded");
  Swap<int> depth(call_depth_, call_depth_ + 1);
  Frame f;
  f.parent = closure;
  Swap<Frame*> fr(frame_, &f);
  size_t np = def.params.size();
  if (args.pos.size() > np && !def.catch_varargs)
    type_error(fmt::format("macro '{}' takes not more than {} argument(s)", def.name, np));
  std::vector<uint8_t> bound(np, 0);
  for (size_t k = 0; k < np && k < args.pos.size(); ++k) {
    f.vars.emplace_back(def.params[k].sym, args.pos[k]);
    bound[k] = 1;
  }
  std::vector<std::pair<Value, Value>> extra_kw;
  bool have_caller = false;
  for (auto& [key, v] : args.kw) {
    size_t k = 0;
    while (k < np && def.params[k].name != key) ++k;
    if (k < np) {
      if (bound[k]) type_error(fmt::format("macro '{}' got multiple values for argument '{}'", def.name, key));
      f.vars.emplace_back(def.params[k].sym, v);
      bound[k] = 1;
    } else if (key == "caller" && def.catch_caller) {
      f.set(kSymCaller, v);
      have_caller = true;
    } else if (def.catch_kwargs) {
      extra_kw.emplace_back(Value::string(key), v);
    } else {
      type_error(fmt::format("macro '{}' takes no keyword argument '{}'", def.name, key));
    }
  }
  for (size_t k = 0; k < np; ++k) {
    if (bound[k]) continue;
    const Param& p = def.params[k];
    // Defaults are evaluated at call time inside the macro frame, so they can use earlier arguments.
    f.vars.emplace_back(p.sym, p.def ? eval(*p.def) : Value::undefined(fmt::format("'{}' is undefined", p.name)));
  }
  if (def.catch_varargs) {
    std::vector<Value> rest;
    for (size_t k = np; k < args.pos.size(); ++k) rest.push_back(args.pos[k]);
    f.set(kSymVarargs, Value::list(std::move(rest), true));
  }
  if (def.catch_kwargs) f.set(kSymKwargs, Value::dict(std::move(extra_kw)));
  if (def.catch_caller && !have_caller) f.set(kSymCaller, Value::undefined("'caller' is undefined"));
  return Value::string(capture(def.body));
}

// --- expressions ------------------------------------------------------------------------------------

const Value* Interp::find_var(int sym) const {
  for (Frame* f = frame_; f; f = f->parent)
    if (const Value* v = f->find(sym)) return v;
  return has_global_[size_t(sym)] ? &globals_[size_t(sym)] : nullptr;
}

Value Interp::lookup(const NameExpr& n) {
  const Value* v = find_var(n.sym);
  return v ? *v : Value::missing_name(n.key);
}

void Interp::eval_args(const CallArgs& a, Args& out) {
  out.pos.reserve(a.pos.size());
  for (auto& e : a.pos) out.pos.push_back(eval(*e));
  for (auto& [k, e] : a.kw) out.kw.emplace_back(k, eval(*e));
  if (a.star) {
    Value v = iterate(eval(*a.star));
    for (auto& x : v.lst().items) out.pos.push_back(x);
  }
  if (a.dstar) {
    Value v = eval(*a.dstar);
    if (!v.is_dict()) type_error("argument after ** must be a mapping");
    for (auto& [k, x] : v.dct().items) out.kw.emplace_back(to_str(k), x);
  }
}

Value Interp::call(const Value& callee, const Args& args) {
  if (callee.kind == Kind::Object) {
    if (callee.obj().type == ObjType::Callable) return callee.as<Callable>().call(*this, args);
    if (callee.obj().type == ObjType::Loop) {
      auto& l = callee.as<LoopObj>();
      if (!l.stmt->recursive)
        type_error("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
      if (!l.running) throw JinjaError("TemplateRuntimeError", "loop() called after its loop ended");
      if (args.pos.size() != 1) type_error("loop() takes exactly one argument");
      return run_loop(*l.stmt, l.frame, args.pos[0], l.depth0 + 1, true);
    }
  }
  if (callee.is_undefined()) undefined_error(callee);
  type_error(fmt::format("'{}' object is not callable", type_name(callee)));
}

Value Interp::eval_call(const CallExpr& c) {
  Value fn;
  if (c.callee->kind == EK::Attr) {
    auto& a = static_cast<const AttrExpr&>(*c.callee);
    Value obj = eval(*a.obj);
    if (has_method(obj, a.name)) {
      Args args;
      eval_args(c.args, args);
      cur_ = &c;
      return call_method(*this, obj, a.name, args);
    }
    cur_ = &a;
    fn = getattr(obj, a.name, &a.key);
  } else {
    fn = eval(*c.callee);
  }
  Args args;
  eval_args(c.args, args);
  cur_ = &c;
  return call(fn, args);
}

Value Interp::getattr(const Value& obj, std::string_view name, const Value* key) {
  switch (obj.kind) {
    case Kind::Undefined: undefined_error(obj);
    case Kind::Dict: {
      // A Python attribute wins over a key: `d.items` is the method even if d has an "items" key.
      if (has_method(obj, name)) return bound_method(obj, name);
      if (unsafe_method(obj, name)) return unsafe_undefined(obj, name);
      if (const Value* v = obj.dct().find(name)) return *v;
      break;
    }
    case Kind::List:
      if (obj.lst().group) {  // groupby's namedtuple fields
        if (name == "grouper") return obj.lst().items[0];
        if (name == "list") return obj.lst().items[1];
      }
      [[fallthrough]];
    case Kind::String:
      if (has_method(obj, name)) return bound_method(obj, name);
      if (unsafe_method(obj, name)) return unsafe_undefined(obj, name);
      break;
    case Kind::Object:
      if (obj.obj().type == ObjType::Namespace) {
        if (Value* v = obj.as<NamespaceObj>().find(name)) return *v;
      } else if (obj.obj().type == ObjType::Loop) {
        if (has_method(obj, name)) return bound_method(obj, name);
        return loop_attr(obj, name, key);
      } else if (obj.obj().type == ObjType::Cycler) {
        if (has_method(obj, name)) return bound_method(obj, name);
        auto& c = obj.as<CyclerObj>();
        if (name == "current") return c.items[c.pos];
        if (name == "items") return Value::list(c.items, true);
      }
      break;
    default: break;
  }
  return missing_attr(obj, name, key);
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Undefined: undefined_error(obj);
    case Kind::Dict:
      if (const Value* v = obj.dct().find(key)) return *v;
      break;
    case Kind::List: {
      auto& l = obj.lst();
      if (l.plain() && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
        int64_t n = int64_t(l.items.size()), i = key.kind == Kind::Bool ? key.b : key.i;
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l.items[size_t(i)];
      }
      break;
    }
    case Kind::String:
      if (key.kind == Kind::Int || key.kind == Kind::Bool) {
        int64_t i = key.kind == Kind::Bool ? key.b : key.i;
        const StrObj& s = obj.sobj();
        if (s.ascii) {
          int64_t n = int64_t(s.s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(std::string(1, s.s[size_t(i)]));
        } else {
          auto cps = to_codepoints(s.s);
          int64_t n = int64_t(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) {
            std::string out;
            encode_utf8(out, cps[size_t(i)]);
            return Value::string(std::move(out));
          }
        }
      }
      break;
    default: break;
  }
  // Like jinja2: when the item lookup fails, a string key falls back to the attribute.
  if (key.is_string() && obj.kind != Kind::Dict) return getattr(obj, key.str(), &key);
  if (key.is_string() && obj.is_dict()) {
    if (has_method(obj, key.str())) return bound_method(obj, key.str());
  }
  return Value::missing(obj, key);
}

Value Interp::apply_filter(const std::string& name, const Value& v, const Args& args) {
  FilterFn fn = find_filter(name);
  // Only map() names a filter at render time; jinja2 reports that as a runtime error (a filter
  // written in the template is checked when it compiles: TemplateAssertionError, below).
  if (!fn) throw JinjaError("TemplateRuntimeError", fmt::format("No filter named '{}'.", name));
  return fn(*this, v, args);
}

bool Interp::apply_test(const std::string& name, const Value& v, const Args& args) {
  TestFn fn = find_test(name);
  if (!fn) throw JinjaError("TemplateRuntimeError", fmt::format("No test named '{}'.", name));  // select(), as above
  return fn(*this, v, args);
}

Value Interp::eval_compare(const CompareExpr& c) {
  Value left = eval(*c.first);
  for (auto& [op, e] : c.rest) {
    Value right = eval(*e);
    cur_ = &c;
    bool r;
    switch (op) {
      case CmpOp::Eq: r = equals(left, right); break;
      case CmpOp::Ne: r = !equals(left, right); break;
      case CmpOp::Lt: r = compare(left, right, "<") < 0; break;
      case CmpOp::Le: r = compare(left, right, "<=") <= 0; break;
      case CmpOp::Gt: r = compare(left, right, ">") > 0; break;
      case CmpOp::Ge: r = compare(left, right, ">=") >= 0; break;
      case CmpOp::In: r = contains(right, left); break;
      case CmpOp::NotIn: r = !contains(right, left); break;
      default: r = false;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interp::eval(const Expr& e) {
  cur_ = &e;
  switch (e.kind) {
    case EK::Const: return static_cast<const ConstExpr&>(e).value;
    case EK::Name: return lookup(static_cast<const NameExpr&>(e));
    case EK::Captured: return captured_;
    case EK::List: {
      auto& l = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      items.reserve(l.items.size());
      for (auto& x : l.items) items.push_back(eval(*x));
      return Value::list(std::move(items), l.tuple);
    }
    case EK::Dict: {
      auto& d = static_cast<const DictExpr&>(e);
      std::vector<std::pair<Value, Value>> items;
      items.reserve(d.items.size());
      for (auto& [k, x] : d.items) {
        Value key = eval(*k), val = eval(*x);
        bool replaced = false;
        for (auto& [ok, ov] : items)
          if (equals(ok, key)) {
            ov = val;
            replaced = true;
          }
        if (!replaced) items.emplace_back(std::move(key), std::move(val));
      }
      return Value::dict(std::move(items));
    }
    case EK::Attr: {
      auto& a = static_cast<const AttrExpr&>(e);
      Value obj = eval(*a.obj);
      cur_ = &e;
      return getattr(obj, a.name, &a.key);
    }
    case EK::Item: {
      auto& it = static_cast<const ItemExpr&>(e);
      Value obj = eval(*it.obj);
      Value key = eval(*it.index);
      cur_ = &e;
      return getitem(obj, key);
    }
    case EK::Slice: {
      auto& s = static_cast<const SliceExpr&>(e);
      Value obj = eval(*s.obj);
      Value a = s.start ? eval(*s.start) : Value::none();
      Value b = s.stop ? eval(*s.stop) : Value::none();
      Value c = s.step ? eval(*s.step) : Value::none();
      cur_ = &e;
      // jinja2 compiles slices to a plain Python subscript, bypassing its lenient getitem, so a
      // bad slice raises instead of producing an undefined value.
      if (obj.is_undefined()) undefined_error(obj);
      if (obj.is_dict()) type_error("unhashable type: 'slice'");
      if (!obj.is_string() && !(obj.is_list() && obj.lst().plain()))
        type_error(fmt::format("'{}' object is not subscriptable", type_name(obj)));
      return slice(obj, a, b, c);
    }
    case EK::Call: return eval_call(static_cast<const CallExpr&>(e));
    case EK::Filter: {
      auto& f = static_cast<const FilterExpr&>(e);
      Value v = eval(*f.operand);
      Args args;
      eval_args(f.args, args);
      cur_ = &e;
      if (!f.fn) throw JinjaError("TemplateAssertionError", fmt::format("No filter named '{}'.", f.name));
      return f.fn(*this, v, args);
    }
    case EK::Test: {
      auto& t = static_cast<const TestExpr&>(e);
      Value v = eval(*t.operand);
      Args args;
      eval_args(t.args, args);
      cur_ = &e;
      if (!t.fn) throw JinjaError("TemplateAssertionError", fmt::format("No test named '{}'.", t.name));
      return Value::boolean(t.fn(*this, v, args) != t.negated);
    }
    case EK::Neg:
    case EK::Plus: {
      Value v = eval(*static_cast<const UnaryExpr&>(e).operand);
      cur_ = &e;
      bool neg = e.kind == EK::Neg;
      switch (v.kind) {
        case Kind::Int:
          if (neg && v.i == INT64_MIN) throw JinjaError("OverflowError", "integer overflow");
          return Value::integer(neg ? -v.i : v.i);
        case Kind::Bool: return Value::integer(neg ? -int64_t(v.b) : int64_t(v.b));
        case Kind::Float: return Value::number(neg ? -v.f : v.f);
        case Kind::Undefined: undefined_error(v);
        default: type_error(fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
      }
    }
    case EK::Not: return Value::boolean(!truthy(eval(*static_cast<const UnaryExpr&>(e).operand)));
    case EK::And: {
      auto& b = static_cast<const BinExpr&>(e);
      Value l = eval(*b.l);
      return truthy(l) ? eval(*b.r) : l;
    }
    case EK::Or: {
      auto& b = static_cast<const BinExpr&>(e);
      Value l = eval(*b.l);
      return truthy(l) ? l : eval(*b.r);
    }
    case EK::Bin: {
      auto& b = static_cast<const BinExpr&>(e);
      Value l = eval(*b.l);
      Value r = eval(*b.r);
      cur_ = &e;
      if (b.op == BinOp::Concat) {
        std::string s = to_str(l);
        append_str(s, r);
        bool ascii = l.is_string() && r.is_string() && l.sobj().ascii && r.sobj().ascii;
        return ascii ? Value::string(std::move(s), true) : Value::string(std::move(s));
      }
      return binary_op(b.op, l, r);
    }
    case EK::Compare: return eval_compare(static_cast<const CompareExpr&>(e));
    case EK::Cond: {
      auto& c = static_cast<const CondExpr&>(e);
      if (truthy(eval(*c.test))) return eval(*c.then);
      if (c.otherwise) return eval(*c.otherwise);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

}  // namespace ts::chat::jinja
