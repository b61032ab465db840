// Helpers for grammar tests: a byte vocabulary (ids 0..255 = one byte, 256 = stop), whole-string
// matching, and a sampler that walks the IR to produce strings the grammar must accept.
#pragma once
#include "ts_source_dir.h"
#include <climits>
#include <map>
#include <random>
#include <string>

#include "grammar/ir.h"
#include "grammar/matcher.h"

namespace ts::grammar::test {

inline std::string repo(const std::string& rel) { return std::string(TS_SOURCE_DIR) + "/" + rel; }

inline std::shared_ptr<const Vocab> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> b(257);
    for (int i = 0; i < 256; ++i) b[i] = std::string(1, static_cast<char>(i));
    b[256] = "</s>";
    return std::make_shared<const Vocab>(b, std::vector<bool>(257, false), std::vector<int32_t>{256});
  }();
  return v;
}

inline std::shared_ptr<const CompiledGrammar> compile(const Grammar& g) {
  return std::make_shared<const CompiledGrammar>(g, byte_vocab());
}

// The whole string is a sentence of the grammar.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& cg, std::string_view s) {
  Matcher m(cg);
  return m.accept_bytes(s) && m.can_terminate();
}
inline bool matches(const Grammar& g, std::string_view s) { return matches(compile(g), s); }

// Random sentences: walks expressions, and past `soft_depth` takes the cheapest way out.
class Sampler {
 public:
  Sampler(const Grammar& g, uint32_t seed) : g_(g), rng_(seed) { min_costs(); }

  std::string sample(int soft_depth = 6) {
    std::string out;
    gen(g_.rule_body(g_.root()), 0, soft_depth, out);
    return out;
  }

 private:
  static constexpr int kInf = INT_MAX / 4;
  int cost(int id) {
    const Expr& e = g_.expr(id);
    switch (e.kind) {
      case Expr::kEmpty: return 0;
      case Expr::kLiteral: case Expr::kChars: return 1;
      case Expr::kSeq: {
        long c = 0;
        for (int k : e.kids) c += cost(k);
        return static_cast<int>(std::min<long>(c, kInf));
      }
      case Expr::kAlt: {
        int c = kInf;
        for (int k : e.kids) c = std::min(c, cost(k));
        return c;
      }
      case Expr::kRef: return rule_cost_[e.rule];
      case Expr::kRepeat: return e.min == 0 ? 0 : static_cast<int>(std::min<long>(long(e.min) * cost(e.kids[0]), kInf));
    }
    return kInf;
  }
  void min_costs() {
    rule_cost_.assign(g_.num_rules(), kInf);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < g_.num_rules(); ++r) {
        int c = std::min(kInf, cost(g_.rule_body(static_cast<int>(r))) + 1);
        if (c < rule_cost_[r]) rule_cost_[r] = c, changed = true;
      }
    }
  }
  uint32_t pick_cp(const Ranges& r) {
    // Mostly ASCII when the class has it, so samples stay readable.
    for (int tries = 0; tries < 8; ++tries) {
      const auto& [lo, hi] = r[rng_() % r.size()];
      uint32_t top = (rng_() % 4) ? std::min<uint32_t>(hi, std::max<uint32_t>(lo, 0x7E)) : hi;
      uint32_t cp = lo + static_cast<uint32_t>(rng_() % (uint64_t(top - lo) + 1));
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      return cp;
    }
    return r[0].first >= 0xD800 && r[0].first <= 0xDFFF ? 0xE000 : r[0].first;
  }
  void gen(int id, int depth, int soft, std::string& out) {
    const Expr& e = g_.expr(id);
    bool cheap = depth > soft;
    switch (e.kind) {
      case Expr::kEmpty: return;
      case Expr::kLiteral: out += e.bytes; return;
      case Expr::kChars: append_utf8(out, pick_cp(e.ranges)); return;
      case Expr::kSeq:
        for (int k : e.kids) gen(k, depth, soft, out);
        return;
      case Expr::kAlt: {
        int pick = e.kids[rng_() % e.kids.size()];
        if (cheap || cost(pick) >= kInf) {
          int best = kInf;
          for (int k : e.kids)
            if (cost(k) < best) best = cost(k), pick = k;
        }
        gen(pick, depth, soft, out);
        return;
      }
      case Expr::kRef: gen(g_.rule_body(e.rule), depth + 1, soft, out); return;
      case Expr::kRepeat: {
        int span = e.max < 0 ? 3 : std::min(e.max - e.min, 3);
        int n = e.min + (cheap ? 0 : static_cast<int>(rng_() % (span + 1)));
        for (int k = 0; k < n; ++k) gen(e.kids[0], depth + 1, soft, out);
        return;
      }
    }
  }
  const Grammar& g_;
  std::mt19937 rng_;
  std::vector<int> rule_cost_;
};

}  // namespace ts::grammar::test
