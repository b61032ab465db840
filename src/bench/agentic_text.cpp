// Deterministic synthetic Python-like code for the agentic benchmark's conversations.
#include <algorithm>
#include <fstream>
#include <functional>

#include "bench/agentic.h"
#include "core/error.h"

namespace ts::bench {

uint64_t Rng::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xd6e8feb86659fd93ull + 0x632be59bd9b4e019ull));
  r.next();
  return r.next();
}

namespace {

const char* const kWords[] = {
    "user",    "request", "cache",   "token",   "buffer",  "config",  "result",  "index",   "value",   "item",
    "node",    "tree",    "parse",   "load",    "save",    "update",  "compute", "handle",  "batch",   "stream",
    "model",   "layer",   "weight",  "score",   "path",    "file",    "data",    "queue",   "worker",  "session",
    "block",   "page",    "count",   "offset",  "length",  "size",    "name",    "key",     "state",   "event",
    "message", "client",  "server",  "route",   "query",   "record",  "field",   "schema",  "table",   "row",
    "column",  "metric",  "span",    "trace",   "logger",  "handler", "reader",  "writer",  "encoder", "decoder",
    "matrix",  "vector",  "graph",   "edge",    "vertex",  "kernel",  "stride",  "shape",   "dtype",   "device",
    "tensor",  "prompt",  "context", "window",  "prefix",  "suffix",  "hash",    "seed",    "sample",  "filter",
    "mapper",  "reduce",  "merge",   "split",   "sort",    "search",  "insert",  "delete",  "remove",  "append",
    "extend",  "clear",   "reset",   "start",   "stop",    "open",    "close",   "read",    "write",   "send",
    "recv",    "flush",   "sync",    "lock",    "wait",    "notify",  "retry",   "timeout", "limit",   "budget",
    "total",   "delta",   "mask",    "slot",    "entry",   "bucket",  "shard",   "rank",    "group",   "step",
    "epoch",   "loss",    "grad",    "param",   "option",  "flag",    "mode",    "level",   "parent",  "child",
    "first",   "last",    "next",    "prev",    "head",    "tail",    "min",     "max",     "mean",    "norm",
    "scale",   "bias",    "input",   "output",  "source",  "target",  "local",   "remote",  "global",  "default",
    "valid",   "error",   "status",  "code",    "text",    "line",    "word",    "char",    "byte",    "format",
};

const char* const kModules[] = {"os",     "sys",     "json", "re",      "math",    "time",   "typing",
                                "pathlib", "logging", "dataclasses", "collections", "itertools", "functools",
                                "asyncio", "random",  "hashlib"};
const char* const kBases[] = {"object", "Exception", "dict", "list", "ABC", "Protocol"};
const char* const kOps[] = {"==", "!=", "<", "<=", ">", ">=", "is", "is not", "in", "not in"};
const char* const kBinOps[] = {"+", "-", "*", "//", "%", "and", "or"};
const char* const kBuiltins[] = {"len", "min", "max", "sum", "sorted", "list", "dict", "set", "tuple", "str",
                                 "int", "float", "isinstance", "enumerate", "zip", "range", "any", "all"};
const char* const kAsks[] = {
    "Refactor {} so that it no longer copies the whole {} on every call.",
    "The test for {} fails with KeyError: '{}'. Find the bug and fix it.",
    "Add type hints to {} and make {} handle an empty input.",
    "Write unit tests for {} covering the {} edge cases.",
    "Explain what {} does and why {} is needed here, then simplify it.",
    "Make {} thread-safe; {} is shared between workers.",
    "Speed up {}: profile shows most time spent in {}.",
    "Rename {} to something clearer and update every use of {}.",
};
const char* const kFollow[] = {
    "That did not work, the traceback still points at {}. Updated file:",
    "Good. Now apply the same change to {} in this module:",
    "CI fails on the lint step for {}; here is the current diff:",
    "Also handle the case where {} is None. The caller looks like this:",
    "Here is the output of the failing test and the module that defines {}:",
};

template <size_t N>
const char* pick(Rng& rng, const char* const (&a)[N]) {
  return a[rng.below(N)];
}

std::string fill(std::string fmt, const std::string& a, const std::string& b = "") {
  size_t p = fmt.find("{}");
  if (p != std::string::npos) fmt.replace(p, 2, a);
  p = fmt.find("{}");
  if (p != std::string::npos) fmt.replace(p, 2, b);
  return fmt;
}

}  // namespace

CodeTextGen::CodeTextGen(std::vector<std::string> pool) : words_(std::move(pool)) {
  if (words_.size() < 50) words_.assign(std::begin(kWords), std::end(kWords));
}

// Every piece of text is built with `Cat() << a << b`: C++17 sequences the operands of << left
// to right, so the random draws happen in the same order with every compiler (`a + b` and
// function arguments have no such guarantee).
struct Cat {
  std::string s;
  Cat& operator<<(const std::string& x) {
    s += x;
    return *this;
  }
  Cat& operator<<(const char* x) {
    s += x;
    return *this;
  }
  operator std::string() const { return s; }
};

std::string CodeTextGen::ident(Rng& rng) const {
  std::string s = words_[rng.below(words_.size())];
  int extra = int(rng.below(3));  // 0..2 more words
  for (int i = 0; i < extra; ++i) s += "_" + words_[rng.below(words_.size())];
  return s;
}

std::string CodeTextGen::class_name(Rng& rng) const {
  std::string s;
  int n = 1 + int(rng.below(2));
  for (int i = 0; i < n; ++i) {
    std::string w = words_[rng.below(words_.size())];
    w[0] = char(std::toupper(static_cast<unsigned char>(w[0])));
    s += w;
  }
  return s;
}

std::string CodeTextGen::expr(Rng& rng, int depth) const {
  auto word = [&] { return words_[rng.below(words_.size())]; };
  auto num = [&](uint64_t n) { return std::to_string(rng.below(n)); };
  auto sub = [&] { return expr(rng, depth + 1); };
  switch (rng.below(depth > 1 ? 4 : 10)) {
    case 0: return num(4096);
    case 1: return ident(rng);
    case 2: return Cat() << "self." << ident(rng);
    case 3: return Cat() << "\"" << word() << "_" << word() << "\"";
    case 4: return Cat() << pick(rng, kBuiltins) << "(" << sub() << ")";
    case 5: return Cat() << sub() << " " << pick(rng, kBinOps) << " " << sub();
    case 6: return Cat() << ident(rng) << "(" << sub() << ", " << ident(rng) << "=" << sub() << ")";
    case 7: return Cat() << "[" << sub() << ", " << sub() << "]";
    case 8: return Cat() << "{\"" << word() << "\": " << sub() << "}";
    default: return Cat() << ident(rng) << "[" << num(16) << "]";
  }
}

std::string CodeTextGen::code(Rng& rng, size_t chars) const {
  std::string out;
  auto ind = [](int d) { return std::string(size_t(d) * 4, ' '); };
  auto word = [&] { return words_[rng.below(words_.size())]; };
  auto num = [&](uint64_t n) { return std::to_string(rng.below(n)); };
  auto comment = [&](int d) {
    std::string c = ind(d);
    c += '#';
    int n = 3 + int(rng.below(8));
    for (int i = 0; i < n; ++i) {
      c += ' ';
      c += word();
    }
    c += '\n';
    return c;
  };
  // A statement (possibly compound) at indent d.
  std::function<void(int, int)> stmt = [&](int d, int depth) {
    auto body = [&](int n) {
      for (int i = 0; i < n; ++i) stmt(d + 1, depth + 1);
    };
    switch (rng.below(depth >= 2 ? 5 : 9)) {
      case 0:
      case 1: out += Cat() << ind(d) << ident(rng) << " = " << expr(rng) << "\n"; break;
      case 2: out += Cat() << ind(d) << ident(rng) << " += " << num(64) << "\n"; break;
      case 3: out += Cat() << ind(d) << "self." << ident(rng) << "." << ident(rng) << "(" << expr(rng, 1) << ")\n"; break;
      case 4: out += comment(d); break;
      case 5:
        if (rng.chance(50))
          out += Cat() << ind(d) << "for " << word() << " in range(" << num(512) << "):\n";
        else
          out += Cat() << ind(d) << "for i, " << word() << " in enumerate(" << ident(rng) << "):\n";
        body(1 + int(rng.below(3)));
        break;
      case 6:
        out += Cat() << ind(d) << "if " << ident(rng) << " " << pick(rng, kOps) << " " << expr(rng, 1) << ":\n";
        body(1 + int(rng.below(3)));
        if (rng.chance(40)) {
          out += ind(d) + "else:\n";
          body(1);
        }
        break;
      case 7:
        out += ind(d) + "try:\n";
        body(1);
        out += Cat() << ind(d) << "except " << class_name(rng) << "Error as exc:\n";
        out += Cat() << ind(d + 1) << "logger.warning(\"" << ident(rng) << " failed: %s\", exc)\n";
        break;
      default:
        out += Cat() << ind(d) << "with open(" << ident(rng) << ") as f:\n";
        body(1);
        break;
    }
  };
  auto function = [&](int d, bool method) {
    out += Cat() << ind(d) << "def " << ident(rng) << "(" << (method ? "self, " : "") << ident(rng) << ", "
                 << ident(rng) << "=" << num(100) << "):\n";
    if (rng.chance(50))
      out += Cat() << ind(d + 1) << "\"\"\"Return the " << ident(rng) << " of " << ident(rng) << ".\"\"\"\n";
    int n = 2 + int(rng.below(7));
    for (int i = 0; i < n; ++i) stmt(d + 1, 0);
    out += Cat() << ind(d + 1) << "return " << expr(rng) << "\n\n";
  };
  while (out.size() < chars) {
    uint64_t k = rng.below(10);
    if (k == 0) {
      if (rng.chance(50))
        out += Cat() << "import " << pick(rng, kModules) << "\n";
      else
        out += Cat() << "from " << pick(rng, kModules) << " import " << ident(rng) << ", " << class_name(rng) << "\n";
    } else if (k == 1) {
      std::string u = ident(rng);
      std::transform(u.begin(), u.end(), u.begin(), [](char c) { return char(std::toupper((unsigned char)c)); });
      out += Cat() << u << " = " << num(65536) << "\n";
    } else if (k <= 4) {
      out += '\n';
      out += comment(0);
      function(0, false);
    } else {
      out += Cat() << "\nclass " << class_name(rng) << "(" << pick(rng, kBases) << "):\n";
      out += Cat() << "    \"\"\"Keeps the " << ident(rng) << " for each " << ident(rng) << ".\"\"\"\n\n";
      int n = 1 + int(rng.below(3));
      for (int i = 0; i < n; ++i) function(1, true);
    }
  }
  // Cut at the first line end at or after `chars`.
  size_t eol = out.find('\n', chars > 0 ? chars - 1 : 0);
  if (eol != std::string::npos) out.resize(eol + 1);
  return out;
}

std::string CodeTextGen::user_turn(Rng& rng, size_t chars, bool first) const {
  std::string head;
  if (first) {
    std::string ask = pick(rng, kAsks);
    std::string a = ident(rng);
    std::string b = ident(rng);
    head = Cat() << fill(ask, a, b) << "\n\n# file: src/" << ident(rng) << ".py\n";
  } else {
    std::string f = pick(rng, kFollow);
    head = fill(f, ident(rng)) + "\n\n";
  }
  return head + code(rng, chars > head.size() ? chars - head.size() : 1);
}

std::vector<std::string> identifier_pool_from_tokenizer(const std::string& dir) {
  std::string path = dir + "/tokenizer.json";
  std::ifstream f(path);
  TS_CHECK(f.good(), "--tokenizer: cannot open {}", path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  TS_CHECK(!j.is_discarded() && j.is_object(), "{}: not valid JSON", path);
  std::vector<std::string> pool;
  auto consider = [&](std::string t) {
    for (const char* pre : {"\xC4\xA0", "\xE2\x96\x81"})  // 'Ġ' (byte-level BPE), '▁' (sentencepiece)
      if (t.rfind(pre, 0) == 0) t = t.substr(std::string(pre).size());
    if (t.size() < 3 || t.size() > 12) return;
    for (char c : t)
      if (c < 'a' || c > 'z') return;
    pool.push_back(t);
  };
  auto m = j.find("model");
  if (m != j.end() && m->is_object()) {
    auto v = m->find("vocab");
    if (v != m->end() && v->is_object())
      for (auto it = v->begin(); it != v->end(); ++it) consider(it.key());
    else if (v != m->end() && v->is_array())  // Unigram: [[piece, score], ...]
      for (auto& e : *v)
        if (e.is_array() && !e.empty() && e[0].is_string()) consider(e[0].get<std::string>());
  }
  std::sort(pool.begin(), pool.end());
  pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
  return pool;
}

}  // namespace ts::bench
