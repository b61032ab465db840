// The values a chat template computes with. They mirror the Python objects jinja2 works on —
// None, bool, int, float, str, list/tuple, dict (insertion-ordered), Undefined, namespace, callables —
// because templates print them with Python's str()/repr() and the prompt must match byte for byte.
// Strings are UTF-8; length, indexing and slicing count code points as Python does.
// Lists and dicts are shared and never mutated (the sandbox is immutable); only namespaces and loop
// objects change in place, through the interpreter.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ts::chat::jinja {

// Raised by value operations and builtins; the interpreter adds the position of the node it was
// evaluating and turns it into a TemplateError. `kind` is the Python exception name.
struct JinjaError : std::exception {
  JinjaError(std::string k, std::string m) : kind(std::move(k)), msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string kind;
  std::string msg;
};
[[noreturn]] void type_error(std::string msg);
struct Value;
// Using an undefined value raises UndefinedError (SecurityError for sandbox-blocked attributes).
[[noreturn]] void undefined_error(const Value& v);
// Strings a template builds by repetition or padding are capped (MemoryError) so that a template
// cannot make the server allocate gigabytes; prompts are nowhere near this.
constexpr size_t kMaxGeneratedString = size_t(64) << 20;
void check_size(uint64_t bytes);

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

struct Value;
struct StrObj {
  std::string s;
  bool ascii;  // lets indexing and length skip UTF-8 decoding, the common case
  // markupsafe.Markup (from |safe, |escape): jinja2 HTML-escapes a plain string added to one, even
  // with autoescape off as transformers renders (functionary-v3.1's tool lines rely on it).
  bool markup = false;
};
struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
  // jinja2's map/select/... return generators: always truthy, no len(), not subscriptable.
  bool generator = false;
  // dict.keys()/values()/items() views: "dict_keys" etc. Printed as such, sized, not subscriptable.
  const char* view = nullptr;
  // groupby's (grouper, list) pairs: tuples that also answer .grouper and .list.
  bool group = false;
  bool plain() const { return !generator && !view; }  // a real list or tuple
};
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

enum class ObjType : uint8_t { Namespace, Loop, Callable, Cycler };
struct Object {
  explicit Object(ObjType t) : type(t) {}
  virtual ~Object() = default;
  virtual const char* py_type() const = 0;  // type(x).__name__
  virtual const char* py_module() const { return "jinja2.runtime"; }
  virtual void repr(std::string& out) const = 0;  // repr(x), also what str(x) prints
  ObjType type;
};

struct Value {
  Kind kind = Kind::Undefined;
  union {
    bool b;
    int64_t i;
    double f;
  };
  // StrObj for String, ListObj, DictObj, Object; for Undefined an optional UndefinedInfo (the hint
  // jinja2 reports when the undefined value is used).
  std::shared_ptr<void> p;

  Value() : i(0) {}
  static Value undefined(std::string hint = {});
  // `obj.key` / `obj[key]` found nothing; the message is only formatted if the value is used.
  static Value missing(const Value& obj, const Value& key);
  static Value missing_name(const Value& name);  // "'name' is undefined"
  static Value none() {
    Value v;
    v.kind = Kind::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::Int;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.kind = Kind::Float;
    v.f = x;
    return v;
  }
  static Value string(std::string s);
  static Value string(std::string s, bool ascii);  // when the caller already knows
  static Value markup(std::string s);              // a Markup string (StrObj::markup)
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value generator(std::vector<Value> items);
  static Value dict(std::vector<std::pair<Value, Value>> items);
  static Value object(std::shared_ptr<Object> o) {
    Value v;
    v.kind = Kind::Object;
    v.p = std::move(o);
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }  // list, tuple or generator
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_object(ObjType t) const { return kind == Kind::Object && obj().type == t; }

  const StrObj& sobj() const { return *static_cast<const StrObj*>(p.get()); }
  const std::string& str() const { return sobj().s; }
  const ListObj& lst() const { return *static_cast<const ListObj*>(p.get()); }
  const DictObj& dct() const { return *static_cast<const DictObj*>(p.get()); }
  Object& obj() const { return *static_cast<Object*>(p.get()); }
  template <class T>
  T& as() const {
    return *static_cast<T*>(p.get());
  }
  // The message jinja2's Undefined raises with when it is used.
  std::string undefined_message() const;
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? double(b) : double(i); }
};

struct UndefinedInfo {
  enum Form : uint8_t { Text, Name, Missing } form = Text;
  std::string text;
  Value key;
  // Missing: the object searched, for its type in the message. Not owned: `{% set ns.x = ns.y %}`
  // stores an undefined in the namespace it names, and an owning reference would be a cycle
  // (a leak per render). Gone by the time the message is formatted: its kind's generic name.
  Kind obj_kind = Kind::Undefined;
  std::weak_ptr<void> obj;
};

struct NamespaceObj : Object {
  NamespaceObj() : Object(ObjType::Namespace) {}
  const char* py_type() const override { return "Namespace"; }
  const char* py_module() const override { return "jinja2.utils"; }
  void repr(std::string& out) const override;
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view name);
};

// --- Python semantics -------------------------------------------------------------------------
bool truthy(const Value& v);
const char* type_name(const Value& v);              // Python's type(x).__name__
std::string type_repr(const Value& v);              // "'dict object'", as jinja2 writes it in undefined hints
void append_str(std::string& out, const Value& v);  // str(v)
std::string to_str(const Value& v);
void append_repr(std::string& out, const Value& v);  // repr(v)
std::string py_float_repr(double d);
std::string py_str_repr(std::string_view s);
bool equals(const Value& a, const Value& b);
// Ordering for <, <=, >, >= and sorting: -1/0/1; TypeError when Python refuses to compare.
int compare(const Value& a, const Value& b, const char* op = "<");

// --- UTF-8 -------------------------------------------------------------------------------------
bool is_ascii(std::string_view s);
size_t cp_length(const StrObj& s);
uint32_t decode_utf8(std::string_view s, size_t& pos);  // advances pos; invalid bytes decode as themselves
void encode_utf8(std::string& out, uint32_t cp);
std::vector<uint32_t> to_codepoints(std::string_view s);
bool is_py_space(uint32_t cp);  // str.isspace()

// --- JSON ----------------------------------------------------------------------------------------
// Recursive: the context's nesting is capped (RecursionError) so that a deep JSON value cannot
// overflow the stack; the server already refuses request bodies deeper than --max-json-depth.
constexpr int kMaxContextDepth = 256;
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
nlohmann::ordered_json to_json(const Value& v);
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;         // -1: none
  std::string indent_str;  // used when indent_is_str
  bool indent_is_str = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as Python writes it (float repr, ensure_ascii escapes, indent layout).
void dump_json(std::string& out, const Value& v, const JsonOptions& o, int level = 0);

}  // namespace ts::chat::jinja
