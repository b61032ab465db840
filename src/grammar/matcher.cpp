#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>
#include <map>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace ts::grammar {

// ------------------------------------------------------------------------------------------
// Vocab

std::shared_ptr<const Vocab> Vocab::from_tokenizer(const tok::Tokenizer& t, std::vector<int32_t> stop_ids,
                                                   const std::vector<std::string>& special_texts) {
  if (stop_ids.empty())
    if (auto e = t.eos_id()) stop_ids.push_back(*e);
  int32_t n = t.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<bool> excluded(static_cast<size_t>(n), true);
  for (int32_t id = 0; id < n; ++id) {
    if (!t.is_valid_id(id)) continue;
    bytes[id] = t.token_bytes(id);
    excluded[id] = t.is_special(id) || bytes[id].empty();
  }
  if (!special_texts.empty()) {
    for (int32_t id = 0; id < n; ++id)
      if (bytes[id].find(kSpecialTokenByte) != std::string::npos) excluded[id] = true;
    // Special as decode(skip_special_tokens) sees it (the server's special_tool_markers asks the same).
    for (const std::string& text : special_texts)
      if (auto id = t.token_to_id(text); id && !text.empty() && t.is_special(*id)) {
        bytes[*id] = special_token_bytes(text);
        excluded[*id] = false;
      }
  }
  return std::make_shared<const Vocab>(std::move(bytes), std::move(excluded), std::move(stop_ids));
}

std::shared_ptr<const ContextMask> SharedMaskCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  ++hits_;
  return it->second;
}

std::shared_ptr<const ContextMask> SharedMaskCache::insert(const std::string& key, std::shared_ptr<const ContextMask> m) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = map_.find(key); it != map_.end()) return it->second;  // computed meanwhile by another grammar
  const size_t add = m->bytes() + key.size() + 64;
  if (bytes_ + add > max_bytes_) {  // full: start over (grammars keep the masks they hold)
    map_.clear();
    bytes_ = 0;
  }
  bytes_ += add;
  map_.emplace(key, m);
  return m;
}

size_t SharedMaskCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

size_t SharedMaskCache::hits() const {
  std::lock_guard<std::mutex> lk(mu_);
  return hits_;
}

Vocab::Vocab(std::vector<std::string> token_bytes, std::vector<bool> excluded, std::vector<int32_t> stop_ids)
    : bytes_(std::move(token_bytes)), stop_(std::move(stop_ids)) {
  for (int32_t s : stop_)
    if (s < 0 || s >= size()) throw Error(fmt::format("grammar vocab: stop id {} out of range", s));
  if (excluded.size() != bytes_.size()) throw Error("grammar vocab: excluded[] and token bytes differ in size");
  normal_.assign(bytes_.size(), 0);
  for (int32_t id = 0; id < size(); ++id)
    if (!excluded[id] && !bytes_[id].empty() && !is_stop(id)) {
      sorted_.push_back(id), normal_[id] = 1;
      if (bytes_[id][0] == kSpecialTokenByte) marker_ids_.push_back(id);
    }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string &a = bytes_[sorted_[i - 1]], &b = bytes_[sorted_[i]];
    size_t k = 0, m = std::min(a.size(), b.size());
    while (k < m && a[k] == b[k]) ++k;
    lcp_[i] = static_cast<uint16_t>(std::min<size_t>(k, 65535));
  }
  size_t total = 0;
  for (int32_t id : sorted_) total += bytes_[size_t(id)].size();
  if (total > UINT32_MAX) throw Error("grammar vocab: token bytes exceed 4 GiB");
  sorted_bytes_.reserve(total);
  sorted_off_.reserve(sorted_.size() + 1);
  for (int32_t id : sorted_) {
    sorted_off_.push_back(static_cast<uint32_t>(sorted_bytes_.size()));
    sorted_bytes_ += bytes_[size_t(id)];
  }
  sorted_off_.push_back(static_cast<uint32_t>(sorted_bytes_.size()));
  lcp_min64_.assign((lcp_.size() + 63) / 64, 65535);
  lcp_min4k_.assign((lcp_.size() + 4095) / 4096, 65535);
  for (size_t i = 0; i < lcp_.size(); ++i) {
    lcp_min64_[i / 64] = std::min(lcp_min64_[i / 64], lcp_[i]);
    lcp_min4k_[i / 4096] = std::min(lcp_min4k_[i / 4096], lcp_[i]);
  }
}

size_t Vocab::skip_shared(size_t i, size_t j) const {
  const size_t n = lcp_.size();
  while (i < n) {
    if (lcp_[i] < j) return i;
    if (i % 4096 == 0 && lcp_min4k_[i / 4096] >= j) {
      i += 4096;
    } else if (i % 64 == 0 && lcp_min64_[i / 64] >= j) {
      i += 64;
    } else {
      ++i;
    }
  }
  return n;
}

bool Vocab::is_stop(int32_t id) const { return std::find(stop_.begin(), stop_.end(), id) != stop_.end(); }

bool Vocab::extendable(int32_t id) const {
  if (id < 0 || id >= size()) return false;
  const std::string& p = bytes_[size_t(id)];
  // Sorted by bytes, the tokens that start with p follow p (and its equals) directly.
  auto it = std::upper_bound(sorted_.begin(), sorted_.end(), p,
                             [&](const std::string& a, int32_t b) { return a < bytes_[size_t(b)]; });
  return it != sorted_.end() && std::string_view(bytes_[size_t(*it)]).starts_with(p);
}

// ------------------------------------------------------------------------------------------
// Lowering the IR to the flat grammar

namespace {

using Set = std::array<uint64_t, 4>;
using Seq = std::vector<int32_t>;  // set id, or kRefBase - rule

int32_t ref_elem(int32_t rule) { return FlatGrammar::kRefBase - rule; }

// UTF-8 byte-range sequences that together match exactly the code points [lo, hi].
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
  out.push_back(std::move(seq));
}

class Lowerer {
 public:
  Lowerer(const Grammar& g, FlatGrammar& f, size_t max_elems) : g_(g), f_(f), max_(max_elems) {}

  void run() {
    g_.validate();
    rules_.resize(g_.num_rules());
    for (size_t r = 0; r < g_.num_rules(); ++r) f_.names.push_back(g_.rule_name(static_cast<int>(r)));
    for (size_t r = 0; r < g_.num_rules(); ++r) {
      int body = g_.rule_body(static_cast<int>(r));
      const Expr& e = g_.expr(body);
      std::vector<Seq> alts;
      if (e.kind == Expr::kAlt) {
        for (int k : e.kids) alts.push_back(lower(k));
      } else {
        alts.push_back(lower(body));
      }
      rules_[r] = std::move(alts);
    }
    f_.root = g_.root();
    layout();
  }

 private:
  int32_t set_id(const Set& s) {
    auto it = set_index_.find(s);
    if (it != set_index_.end()) return it->second;
    int32_t id = static_cast<int32_t>(f_.sets.size());
    f_.sets.push_back(s);
    set_index_.emplace(s, id);
    return id;
  }
  int32_t byte_set(uint8_t lo, uint8_t hi) {
    Set s{};
    for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
    return set_id(s);
  }
  int32_t helper(const std::string& base, std::vector<Seq> alts) {
    int32_t r = static_cast<int32_t>(rules_.size());
    grow(alts);
    rules_.push_back(std::move(alts));
    f_.names.push_back(fmt::format("{}#{}", base, r));
    return r;
  }
  void grow(const std::vector<Seq>& alts) {
    for (const auto& a : alts) count_ += a.size() + 1;
    if (count_ > max_)
      throw InvalidRequest(fmt::format("grammar: too large after expansion (over {} elements; lower the repetition counts)", max_));
  }

  int32_t chars_elem(const Ranges& r) {
    if (r.back().second < 0x80) {
      Set s{};
      for (auto [lo, hi] : r)
        for (uint32_t b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
      return set_id(s);
    }
    std::string key;
    for (auto [lo, hi] : r) key += fmt::format("{:x}-{:x},", lo, hi);
    auto it = class_rules_.find(key);
    if (it != class_rules_.end()) return ref_elem(it->second);
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : r) utf8_sequences(lo, hi, seqs);
    // One alternative per leading byte range keeps the alternatives few; merging ASCII into one set.
    std::vector<Seq> alts;
    Set ascii{};
    bool has_ascii = false;
    for (const auto& s : seqs) {
      if (s.size() == 1) {
        for (unsigned b = s[0].first; b <= s[0].second; ++b) ascii[b >> 6] |= uint64_t(1) << (b & 63);
        has_ascii = true;
        continue;
      }
      Seq a;
      for (auto [lo, hi] : s) a.push_back(byte_set(lo, hi));
      alts.push_back(std::move(a));
    }
    if (has_ascii) alts.insert(alts.begin(), Seq{set_id(ascii)});
    int32_t rule = helper("class", std::move(alts));
    class_rules_.emplace(key, rule);
    return ref_elem(rule);
  }

  // One element standing for expression `id` (a helper rule unless it already is one element).
  int32_t single(int id) {
    auto it = single_.find(id);
    if (it != single_.end()) return it->second;
    const Expr& e = g_.expr(id);
    int32_t el;
    if (e.kind == Expr::kAlt) {
      std::vector<Seq> alts;
      for (int k : e.kids) alts.push_back(lower(k));
      el = ref_elem(helper("alt", std::move(alts)));
    } else {
      Seq s = lower(id);
      el = s.size() == 1 ? s[0] : ref_elem(helper("group", {std::move(s)}));
    }
    single_.emplace(id, el);
    return el;
  }

  // Rule matching 0..n copies of `el` (shared by every repetition of the same element).
  int32_t upto(int32_t el, int n) {
    auto& chain = chains_[el];
    while (static_cast<int>(chain.size()) < n) {
      Seq more = {el};
      if (!chain.empty()) more.push_back(ref_elem(chain.back()));
      chain.push_back(helper("upto", {std::move(more), Seq{}}));
    }
    return chain[n - 1];
  }

  Seq lower(int id) {
    const Expr& e = g_.expr(id);
    Seq out;
    switch (e.kind) {
      case Expr::kEmpty:
        break;
      case Expr::kLiteral:
        for (unsigned char c : e.bytes) out.push_back(byte_set(c, c));
        break;
      case Expr::kChars:
        out.push_back(chars_elem(e.ranges));
        break;
      case Expr::kSeq:
        for (int k : e.kids) {
          Seq s = lower(k);
          out.insert(out.end(), s.begin(), s.end());
        }
        break;
      case Expr::kAlt:
        out.push_back(single(id));
        break;
      case Expr::kRef:
        out.push_back(ref_elem(e.rule));
        break;
      case Expr::kRepeat: {
        int32_t el = single(e.kids[0]);
        if (e.min > 0) {
          count_ += static_cast<size_t>(e.min);
          if (count_ > max_) throw InvalidRequest(fmt::format("grammar: too large after expansion (over {} elements)", max_));
        }
        for (int k = 0; k < e.min; ++k) out.push_back(el);
        if (e.max < 0) {
          auto it = stars_.find(el);
          int32_t r;
          if (it != stars_.end()) {
            r = it->second;
          } else {
            r = static_cast<int32_t>(rules_.size());
            rules_.push_back({});
            f_.names.push_back(fmt::format("star#{}", r));
            rules_[r] = {Seq{el, ref_elem(r)}, Seq{}};
            stars_.emplace(el, r);
          }
          out.push_back(ref_elem(r));
        } else if (e.max > e.min) {
          out.push_back(ref_elem(upto(el, e.max - e.min)));
        }
        break;
      }
    }
    count_ += out.size();
    if (count_ > max_) throw InvalidRequest(fmt::format("grammar: too large after expansion (over {} elements)", max_));
    return out;
  }

  void layout() {
    f_.alts.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const Seq& a : rules_[r]) {
        f_.alts[r].push_back(static_cast<int32_t>(f_.elems.size()));
        f_.elems.insert(f_.elems.end(), a.begin(), a.end());
        f_.elems.push_back(FlatGrammar::kEnd);
      }
  }

  const Grammar& g_;
  FlatGrammar& f_;
  size_t max_, count_ = 0;
  std::vector<std::vector<Seq>> rules_;
  std::map<Set, int32_t> set_index_;
  std::map<std::string, int32_t> class_rules_;
  std::unordered_map<int, int32_t> single_;
  std::unordered_map<int32_t, std::vector<int32_t>> chains_;
  std::unordered_map<int32_t, int32_t> stars_;
};

// A rule is productive when one of its alternatives derives a finite byte string: all its
// elements are non-empty byte sets or productive rules (a least fixpoint). An unproductive rule
// (one that only refers to itself, as a JSON schema {"$ref": "#"} or a $ref cycle lowers to; a
// character class with no character, as a pattern of lone UTF-16 surrogates) leaves the
// matcher in a state where no byte and no end is allowed, so the mask would allow nothing.
// Its alternatives are dropped (with every alternative that uses it); a grammar whose root is
// unproductive matches nothing: refused.
void prune_unproductive(FlatGrammar& f) {
  const size_t n = f.alts.size();
  std::vector<char> prod(n, 0);
  auto alt_ok = [&](int32_t start) {
    for (int32_t p = start; f.elems[p] != FlatGrammar::kEnd; ++p) {
      const int32_t e = f.elems[p];
      if (e >= 0) {
        const auto& w = f.sets[size_t(e)];
        if ((w[0] | w[1] | w[2] | w[3]) == 0) return false;
      } else if (!prod[size_t(FlatGrammar::kRefBase - e)]) {
        return false;
      }
    }
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      if (!prod[r] && std::any_of(f.alts[r].begin(), f.alts[r].end(), alt_ok)) prod[r] = 1, changed = true;
  }
  if (!prod[size_t(f.root)])
    throw InvalidRequest(
        "grammar: no finite output matches it (a rule that only refers to itself, such as a JSON schema $ref "
        "that resolves to itself, or a character class with no character)");
  for (size_t r = 0; r < n; ++r) std::erase_if(f.alts[r], [&](int32_t a) { return !alt_ok(a); });
}

// Left recursion makes the stacks grow without consuming input: reject it. An edge r -> s means
// s can start r (after nullable elements); it "grows" when it is not a tail call. A growing edge
// inside a strongly connected component is unbounded recursion.
void check_left_recursion(const FlatGrammar& f) {
  size_t n = f.alts.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t s : f.alts[r]) {
        bool all = true;
        for (int32_t p = s; f.elems[p] != FlatGrammar::kEnd; ++p)
          if (f.elems[p] >= 0 || !nullable[FlatGrammar::kRefBase - f.elems[p]]) {
            all = false;
            break;
          }
        if (all) {
          nullable[r] = 1, changed = true;
          break;
        }
      }
    }
  }
  struct Edge {
    int32_t to;
    bool grows;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (size_t r = 0; r < n; ++r)
    for (int32_t s : f.alts[r])
      for (int32_t p = s; f.elems[p] != FlatGrammar::kEnd && f.elems[p] < 0; ++p) {
        int32_t to = FlatGrammar::kRefBase - f.elems[p];
        edges[r].push_back({to, f.elems[p + 1] != FlatGrammar::kEnd});
        if (!nullable[to]) break;
      }
  // Tarjan's SCC, iterative.
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1), stack;
  std::vector<char> on(n, 0);
  int32_t counter = 0, ncomp = 0;
  for (size_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> work = {{static_cast<int32_t>(root), 0}};
    index[root] = low[root] = counter++;
    stack.push_back(static_cast<int32_t>(root));
    on[root] = 1;
    while (!work.empty()) {
      auto& [v, ei] = work.back();
      if (ei < edges[v].size()) {
        int32_t w = edges[v][ei++].to;
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on[w] = 1;
          work.push_back({w, 0});
        } else if (on[w]) {
          low[v] = std::min(low[v], index[w]);
        }
      } else {
        int32_t vv = v;
        if (low[vv] == index[vv]) {
          int32_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on[w] = 0;
            comp[w] = ncomp;
          } while (w != vv);
          ++ncomp;
        }
        work.pop_back();
        if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[vv]);
      }
    }
  }
  for (size_t r = 0; r < n; ++r)
    for (const Edge& e : edges[r])
      if (e.grows && comp[r] == comp[e.to])
        throw InvalidRequest(fmt::format("grammar: rule '{}' is left-recursive (rewrite it with repetition)", f.names[r]));
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Stepping

int32_t NodePool::get(int32_t pos, int32_t parent) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

namespace {
// The (rule, parent) calls already expanded by the current start()/advance(): the closure of a
// configuration depends on nothing else, so a second arrival adds nothing and is cut. This keeps
// one step linear in the grammar (chains of nullable rules with several empty ways through --
// `a ::= b | c`, b and c nullable, repeated n times -- would otherwise be walked 2^n times) and
// also cuts epsilon cycles. Open addressing with generation stamps: clearing is O(1), and after
// warm-up the engine thread's grammar steps allocate nothing here.
class VisitedCalls {
 public:
  void clear() {
    count_ = 0;
    if (++gen_ == 0) {  // wrapped: forget every stamp
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      gen_ = 1;
    }
  }
  size_t size() const { return count_; }
  // True when `key` was not in the set (and is now).
  bool insert(uint64_t key) {
    if ((count_ + 1) * 2 > stamp_.size()) grow();
    size_t mask = stamp_.size() - 1;
    for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (stamp_[i] != gen_) {
        stamp_[i] = gen_;
        key_[i] = key;
        ++count_;
        return true;
      }
      if (key_[i] == key) return false;
    }
  }

 private:
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20); }
  void grow() {
    std::vector<uint64_t> old_keys;
    std::vector<uint32_t> old_stamps;
    old_keys.swap(key_);
    old_stamps.swap(stamp_);
    size_t cap = std::max<size_t>(64, old_stamps.size() * 2);
    key_.assign(cap, 0);
    stamp_.assign(cap, 0u);
    uint32_t live = gen_;
    count_ = 0;
    gen_ = 1;
    for (size_t i = 0; i < old_stamps.size(); ++i)
      if (old_stamps[i] == live) insert(old_keys[i]);
  }
  std::vector<uint64_t> key_;
  std::vector<uint32_t> stamp_;
  uint32_t gen_ = 1;
  size_t count_ = 0;
};
thread_local VisitedCalls t_visited;
// The bound on one step's distinct (rule, parent) calls. Real grammars need few (the JSON Schema,
// GBNF, Lark and regex tests: at most 16; a 300-link chain of nullable rules: 2,100); the stacks
// are not merged (no graph-structured stack), so an ambiguous nesting like ((a+ b?)+ c?)+ doubles
// them per level: past this bound the grammar is refused (at compile time when its first state
// already exceeds it) instead of taking seconds per token.
constexpr size_t kMaxCallsPerStep = size_t(1) << 15;

void finish(ParseState& s) {
  std::sort(s.nodes.begin(), s.nodes.end());
  s.nodes.erase(std::unique(s.nodes.begin(), s.nodes.end()), s.nodes.end());
}
}  // namespace

void Stepper::expand(int32_t pos, int32_t parent, ParseState& out, int depth) {
  int32_t v = g_.elems[pos];
  if (v >= 0) {
    out.nodes.push_back(pool_.get(pos, parent));
    return;
  }
  if (v == FlatGrammar::kEnd) {
    if (parent == NodePool::kRoot) {
      out.accept = true;
    } else if (parent == NodePool::kSentinel) {
      out.sentinel = true;
    } else {
      NodePool::Node n = pool_[parent];
      expand(n.pos, n.parent, out, depth + 1);
    }
    return;
  }
  if (depth > 10000) throw InvalidRequest("grammar: expansion too deep (over 10000 nested rule calls in one step)");
  int32_t rule = FlatGrammar::kRefBase - v;
  int32_t np = g_.elems[pos + 1] == FlatGrammar::kEnd ? parent : pool_.get(pos + 1, parent);  // tail call: no push
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(rule)) << 32) | static_cast<uint32_t>(np);
  if (!t_visited.insert(key)) return;  // expanded already in this step (or an epsilon cycle)
  if (t_visited.size() > kMaxCallsPerStep)
    throw InvalidRequest(fmt::format(
        "grammar: too ambiguous: one step of the matcher expands over {} rule calls (nested repetitions of "
        "items that can match the same text, such as (a+ b?)+, multiply its parse stacks); simplify the grammar",
        kMaxCallsPerStep));
  for (int32_t s : g_.alts[rule]) expand(s, np, out, depth + 1);
}

ParseState Stepper::start(int32_t pos, int32_t parent) {
  ParseState s;
  t_visited.clear();
  expand(pos, parent, s, 0);
  finish(s);
  return s;
}

ParseState Stepper::start_root() {
  ParseState s;
  for (int32_t a : g_.alts[g_.root]) {
    ParseState one = start(a, NodePool::kRoot);
    s.nodes.insert(s.nodes.end(), one.nodes.begin(), one.nodes.end());
    s.accept = s.accept || one.accept;
  }
  finish(s);
  return s;
}

void Stepper::advance(const ParseState& in, uint8_t b, ParseState& out) {
  out.nodes.clear();
  out.accept = out.sentinel = false;
  t_visited.clear();
  for (int32_t id : in.nodes) {
    NodePool::Node n = pool_[id];
    if (g_.has(n.pos, b)) expand(n.pos + 1, n.parent, out, 0);
  }
  finish(out);
}

// ------------------------------------------------------------------------------------------
// CompiledGrammar

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocab> vocab, CompileOptions opt)
    : vocab_(std::move(vocab)) {
  Lowerer(g, flat_, opt.max_elements).run();
  prune_unproductive(flat_);
  check_left_recursion(flat_);
  // The first state and its steps over every byte (what the first mask walks): a grammar too
  // ambiguous to start is refused here (a 400 for its request), not by its first mask.
  NodePool pool;
  Stepper st(flat_, pool);
  const ParseState first = st.start_root();
  ParseState next;
  for (int b = 0; b < 256; ++b) st.advance(first, static_cast<uint8_t>(b), next);
}

namespace {

// Walks `ids` (sorted by bytes, lcp[i] = shared prefix with ids[i-1]) from `init`, sharing the
// work of common prefixes and skipping every token under a dead prefix. classify(i, fate):
// 0 = rejected, 1 = accepted, 2 = depends on what lies below the probe's rule (probes only).
template <class F>
void walk(Stepper& st, const Vocab& v, const std::vector<int32_t>& ids, const std::vector<uint16_t>& lcp,
          ParseState init, std::vector<ParseState>& S, F classify) {
  std::vector<uint8_t> any_sent;
  S.resize(1);
  S[0] = std::move(init);
  any_sent.assign(1, 0);
  size_t depth = 0;
  size_t i = 0;
  while (i < ids.size()) {
    const std::string& t = v.bytes(ids[i]);
    size_t L = t.size();
    if (S.size() < L + 1) S.resize(L + 1), any_sent.resize(L + 1);
    size_t j = std::min<size_t>(i == 0 ? 0 : lcp[i], depth);
    bool alive = !S[j].nodes.empty();
    while (alive && j < L) {
      st.advance(S[j], static_cast<uint8_t>(t[j]), S[j + 1]);
      any_sent[j + 1] = any_sent[j] || S[j + 1].sentinel;
      ++j;
      alive = !S[j].nodes.empty();
    }
    depth = j;
    if (alive) {
      classify(i, 1);
      ++i;
      continue;
    }
    // Dead after j bytes: this token, and every later one sharing those j bytes, has one fate.
    // (Duplicates -- the same bytes under two ids, e.g. "}" and its byte-fallback <0x7D> -- share
    // this token's own fate.)
    int fate = any_sent[j] ? 2 : 0;
    int self = j == L && (S[L].sentinel || S[L].accept) ? 1 : fate;
    classify(i, self);
    ++i;
    for (; i < ids.size() && lcp[i] >= j; ++i) classify(i, v.bytes(ids[i]).size() == j ? self : fate);
  }
}

// The probe walk of a whole vocabulary revisits few distinct states (inside a string: one), so
// states are interned and their byte transitions memoized: after warm-up a byte is one lookup.
class StateTable {
 public:
  explicit StateTable(Stepper& st) : st_(st) {}
  int32_t intern(ParseState s) {
    std::string key(reinterpret_cast<const char*>(s.nodes.data()), s.nodes.size() * 4);
    key += static_cast<char>(s.accept | (s.sentinel << 1));
    auto [it, fresh] = index_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
    if (fresh) {
      flags_.push_back(uint8_t((s.nodes.empty() ? kDead : 0) | (s.sentinel ? kSentinel : 0) |
                               (s.sentinel || s.accept ? kEnds : 0)));
      states_.push_back(std::move(s));
      next_.emplace_back();
      next_.back().fill(-1);
    }
    return it->second;
  }
  // Per-state flags, kept beside the states so the walk's inner loop reads one byte.
  static constexpr uint8_t kDead = 1, kSentinel = 2, kEnds = 4;  // no stack left; ran off the probe; may end here
  uint8_t flags(int32_t sid) const { return flags_[size_t(sid)]; }
  int32_t step(int32_t sid, uint8_t b) {
    int32_t n = next_[sid][b];
    if (n >= 0) return n;
    st_.advance(states_[sid], b, tmp_);
    n = intern(tmp_);
    next_[sid][b] = n;
    return n;
  }
  const ParseState& operator[](int32_t sid) const { return states_[sid]; }

 private:
  Stepper& st_;
  std::vector<ParseState> states_;
  std::vector<std::array<int32_t, 256>> next_;
  std::vector<uint8_t> flags_;
  std::unordered_map<std::string, int32_t> index_;
  ParseState tmp_;
};

// walk() over interned states and the whole sorted vocabulary (the same classification). The
// inner loop is the cost of a cold mask (a string-content top visits nearly every token): the
// token bytes are read from the contiguous sorted copy and a state's liveness from its flags.
// The tokens a walk visits, sorted by bytes with lcp[i] = prefix shared with token i - 1: the
// whole normal vocabulary (bytes read from its contiguous sorted copy), or a sorted subset.
struct SortedVocabList {
  explicit SortedVocabList(const Vocab& v)
      : n(v.sorted().size()), lcp(v.lcp().data()), off(v.sorted_off().data()), bytes(v.sorted_bytes().data()), vocab(v) {}
  size_t n;
  const uint16_t* lcp;
  const uint32_t* off;
  const char* bytes;
  size_t size() const { return n; }
  const char* data(size_t i) const { return bytes + off[i]; }
  size_t len(size_t i) const { return off[i + 1] - off[i]; }
  size_t skip(size_t i, size_t j) const { return vocab.skip_shared(i, j); }
  const Vocab& vocab;
};
struct IdList {
  const Vocab& v;
  const std::vector<int32_t>& ids;
  const uint16_t* lcp;
  size_t size() const { return ids.size(); }
  const char* data(size_t i) const { return v.bytes(ids[i]).data(); }
  size_t len(size_t i) const { return v.bytes(ids[i]).size(); }
  size_t skip(size_t i, size_t j) const {
    while (i < ids.size() && lcp[i] >= j) ++i;
    return i;
  }
};

template <class List, class F>
void walk_table(StateTable& T, const List& list, int32_t init, F classify) {
  const size_t n = list.size();
  const uint16_t* lcp = list.lcp;
  std::vector<int32_t> S(1, init);
  std::vector<uint8_t> any_sent(1, 0);
  size_t depth = 0, i = 0;
  while (i < n) {
    const char* t = list.data(i);
    const size_t L = list.len(i);
    if (S.size() < L + 1) S.resize(L + 1), any_sent.resize(L + 1);
    size_t j = std::min<size_t>(i == 0 ? 0 : lcp[i], depth);
    bool alive = !(T.flags(S[j]) & StateTable::kDead);
    while (alive && j < L) {
      const int32_t nx = T.step(S[j], static_cast<uint8_t>(t[j]));
      const uint8_t f = T.flags(nx);
      S[j + 1] = nx;
      any_sent[j + 1] = any_sent[j] | ((f & StateTable::kSentinel) ? 1 : 0);
      ++j;
      alive = !(f & StateTable::kDead);
    }
    depth = j;
    if (alive) {
      classify(i++, 1);
      continue;
    }
    // Dead after j bytes: this token, and every later one sharing those j bytes, has one fate.
    const int fate = any_sent[j] ? 2 : 0;
    const int self = j == L && (T.flags(S[L]) & StateTable::kEnds) ? 1 : fate;
    classify(i, self);
    ++i;
    // Duplicates of this token's bytes come right after it (sorted), then its extensions.
    for (; i < n && lcp[i] >= j && list.len(i) == j; ++i) classify(i, self);
    if (fate == 0) i = list.skip(i, j);  // rejected: nothing to record, jump over them
    else
      for (; i < n && lcp[i] >= j; ++i) classify(i, fate);
  }
}

}  // namespace

const CompiledGrammar::PosMask& CompiledGrammar::context_mask(const std::vector<int32_t>& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return context_mask_locked(key);
}

namespace {

std::shared_ptr<ContextMask> make_mask(const Vocab& v, std::vector<int32_t>& acc, std::vector<int32_t> uncertain) {
  auto pm = std::make_shared<ContextMask>();
  if (acc.size() > static_cast<size_t>(v.mask_words())) {
    pm->accepted_bits.assign(static_cast<size_t>(v.mask_words()), 0);
    for (int32_t id : acc) pm->accepted_bits[id >> 5] |= 1u << (id & 31);
  } else {
    std::sort(acc.begin(), acc.end());
    pm->accepted_ids = std::move(acc);
  }
  // (uncertain keeps the byte order of the list it came from: the vocabulary or a cut's.)
  pm->uncertain = std::move(uncertain);
  pm->uncertain_lcp.assign(pm->uncertain.size(), 0);
  for (size_t i = 1; i < pm->uncertain.size(); ++i) {
    const std::string &a = v.bytes(pm->uncertain[i - 1]), &b = v.bytes(pm->uncertain[i]);
    size_t n = 0, m = std::min(a.size(), b.size());
    while (n < m && a[n] == b[n]) ++n;
    pm->uncertain_lcp[i] = static_cast<uint16_t>(std::min<size_t>(n, 65535));
  }
  return pm;
}

// Probes `key` (the top position over its frames, on its bottom: kRoot or kSentinel) against
// the tokens of `list` (ids[i]: the id of list entry i): accepted ids into acc, uncertain ones
// (they cross the bottom of a cut probe) into uncertain, in list order.
template <class List>
void probe_tokens(const FlatGrammar& g, const std::vector<int32_t>& key, const List& list, const int32_t* ids,
                  std::vector<int32_t>& acc, std::vector<int32_t>& uncertain) {
  NodePool pool;
  Stepper st(g, pool);
  StateTable table(st);
  ParseState init;
  int32_t parent = key.back();
  for (size_t i = key.size() - 2; i >= 1; --i) parent = pool.get(key[i], parent);
  init.nodes = {pool.get(key[0], parent)};
  walk_table(table, list, table.intern(std::move(init)), [&](size_t i, int fate) {
    if (fate == 1) acc.push_back(ids[i]);
    else if (fate == 2) uncertain.push_back(ids[i]);
  });
}

}  // namespace

std::string CompiledGrammar::structural_key(const std::vector<int32_t>& key) const {
  std::string out;
  std::unordered_map<int32_t, int32_t> ids;  // rule -> canonical id (discovery order)
  std::vector<int32_t> queue;
  auto put32 = [&](int32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto seq = [&](int32_t pos) {
    for (; out.size() <= kMaxStructuralKey; ++pos) {
      const int32_t e = flat_.elems[size_t(pos)];
      if (e == FlatGrammar::kEnd) {
        out += 'E';
        return;
      }
      if (e >= 0) {
        out += 'S';
        out.append(reinterpret_cast<const char*>(flat_.sets[size_t(e)].data()), 32);
      } else {
        const int32_t rule = FlatGrammar::kRefBase - e;
        auto [it, fresh] = ids.try_emplace(rule, int32_t(ids.size()));
        if (fresh) queue.push_back(rule);
        out += 'R';
        put32(it->second);
      }
    }
  };
  for (size_t i = 0; i + 1 < key.size(); ++i) seq(key[i]);  // the top's and the frames' rests
  out += key.back() == NodePool::kRoot ? 'B' : 'C';         // real bottom, or a cut
  for (size_t q = 0; q < queue.size(); ++q) {               // every rule they reach
    const auto& alts = flat_.alts[size_t(queue[q])];
    out += 'U';
    put32(int32_t(alts.size()));
    for (int32_t a : alts) seq(a);
    if (out.size() > kMaxStructuralKey) return {};
  }
  // Too large to be worth sharing (seq stopped part-way: a cut key must never match another).
  if (out.size() > kMaxStructuralKey) return {};
  return out;
}

// key = [top position, return positions of the frames below (up to kContextDepth), kRoot or
// kSentinel].
const CompiledGrammar::PosMask& CompiledGrammar::context_mask_locked(const std::vector<int32_t>& key) const {
  std::string k(reinterpret_cast<const char*>(key.data()), key.size() * 4);
  auto it = masks_.find(k);
  if (it != masks_.end()) return *it->second;
  std::shared_ptr<const PosMask> pm;
  const int frames = int(key.size()) - 2;
  if (frames <= kSharedDepth) {
    // A whole-vocabulary walk: shared with every grammar of this vocabulary whose probe from
    // here walks the same structure.
    SharedMaskCache& shared = vocab_->shared_masks();
    const std::string sk = structural_key(key);
    if (!sk.empty()) pm = shared.find(sk);
    if (!pm) {
      std::vector<int32_t> acc, uncertain;
      probe_tokens(flat_, key, SortedVocabList(*vocab_), vocab_->sorted().data(), acc, uncertain);
      pm = make_mask(*vocab_, acc, std::move(uncertain));
      if (!sk.empty()) pm = shared.insert(sk, std::move(pm));
    }
  } else {
    // The cut's verdicts stand; its uncertain tokens are decided (or left uncertain) here.
    std::vector<int32_t> cut(key.begin(), key.begin() + 1 + kSharedDepth);
    cut.push_back(NodePool::kSentinel);
    const PosMask& base = context_mask_locked(cut);
    std::vector<int32_t> acc, uncertain;
    probe_tokens(flat_, key, IdList{*vocab_, base.uncertain, base.uncertain_lcp.data()}, base.uncertain.data(), acc,
                 uncertain);
    if (!base.accepted_bits.empty()) {
      for (size_t w = 0; w < base.accepted_bits.size(); ++w)
        for (uint32_t bits = base.accepted_bits[w]; bits; bits &= bits - 1)
          acc.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
    } else {
      acc.insert(acc.end(), base.accepted_ids.begin(), base.accepted_ids.end());
    }
    pm = make_mask(*vocab_, acc, std::move(uncertain));
  }
  return *masks_.emplace(std::move(k), std::move(pm)).first->second;
}

size_t CompiledGrammar::num_cached_masks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return masks_.size();
}

size_t CompiledGrammar::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = flat_.elems.size() * 4 + flat_.sets.size() * 32;
  for (const auto& a : flat_.alts) b += a.size() * 4 + 24;
  for (const auto& [p, m] : masks_) b += m->bytes();
  return b;
}

// ------------------------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g, size_t max_rollback)
    : g_(std::move(g)), max_rollback_(max_rollback) {
  reset();
}

void Matcher::reset() {
  state_ = Stepper(g_->flat(), pool_).start_root();
  history_.clear();
  terminated_ = false;
}

bool Matcher::step_bytes(std::string_view bytes, ParseState& out) {
  Stepper st(g_->flat(), pool_);
  ParseState a = state_, b;
  for (size_t k = 0; k < bytes.size(); ++k) {
    st.advance(a, static_cast<uint8_t>(bytes[k]), b);
    if (b.dead()) return false;
    std::swap(a, b);
  }
  out = std::move(a);
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  ParseState next;
  if (!step_bytes(bytes, next)) return false;
  history_.push_back({std::move(state_), terminated_});
  if (history_.size() > max_rollback_) history_.erase(history_.begin());
  state_ = std::move(next);
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const Vocab& v = g_->vocab();
  if (terminated_ || id < 0 || id >= v.size()) return false;
  if (v.is_stop(id)) {
    if (!state_.accept) return false;
    history_.push_back({state_, terminated_});
    if (history_.size() > max_rollback_) history_.erase(history_.begin());
    terminated_ = true;
    return true;
  }
  const std::string& b = v.bytes(id);
  if (b.empty()) return false;
  if (!v.is_normal(id)) return false;  // specials never match a grammar
  return accept_bytes(b);
}

void Matcher::rollback(size_t n) {
  if (n > history_.size()) throw Error(fmt::format("grammar: rollback of {} tokens, only {} kept", n, history_.size()));
  for (size_t k = 0; k < n; ++k) {
    state_ = std::move(history_.back().first);
    terminated_ = history_.back().second;
    history_.pop_back();
  }
}

void Matcher::check_uncertain(int32_t node, const CompiledGrammar::PosMask& pm, uint32_t* row) {
  if (pm.uncertain.empty()) return;
  Stepper st(g_->flat(), pool_);
  ParseState init;
  init.nodes = {node};
  walk(st, g_->vocab(), pm.uncertain, pm.uncertain_lcp, std::move(init), walk_, [&](size_t i, int fate) {
    if (fate == 1) row[pm.uncertain[i] >> 5] |= 1u << (pm.uncertain[i] & 31);
  });
}

void Matcher::fill_bitmask(uint32_t* row) {
  const Vocab& v = g_->vocab();
  size_t words = static_cast<size_t>(v.mask_words());
  if (terminated_) {
    std::memset(row, 0, words * 4);
    return;
  }
  std::string key(reinterpret_cast<const char*>(state_.nodes.data()), state_.nodes.size() * 4);
  key += state_.accept ? '1' : '0';
  if (auto it = mask_cache_.find(key); it != mask_cache_.end()) {
    std::memcpy(row, it->second.data(), words * 4);
    return;
  }
  std::memset(row, 0, words * 4);
  std::vector<const CompiledGrammar::PosMask*> done;
  for (int32_t n : state_.nodes) {
    key_.assign(1, pool_[n].pos);
    int32_t cur = pool_[n].parent;
    for (int k = 0; k < CompiledGrammar::kContextDepth && cur >= 0; ++k) {
      key_.push_back(pool_[cur].pos);
      cur = pool_[cur].parent;
    }
    key_.push_back(cur == NodePool::kRoot ? NodePool::kRoot : NodePool::kSentinel);
    const auto& pm = g_->context_mask(key_);
    if (std::find(done.begin(), done.end(), &pm) == done.end()) {
      done.push_back(&pm);
      if (!pm.accepted_bits.empty())
        for (size_t w = 0; w < words; ++w) row[w] |= pm.accepted_bits[w];
      for (int32_t id : pm.accepted_ids) row[id >> 5] |= 1u << (id & 31);
    }
    check_uncertain(n, pm, row);
  }
  if (state_.accept)
    for (int32_t s : v.stop_ids()) row[s >> 5] |= 1u << (s & 31);
  if (mask_cache_.size() >= 256) mask_cache_.clear();
  mask_cache_.emplace(std::move(key), std::vector<uint32_t>(row, row + words));
}

std::string Matcher::jump_forward() const {
  std::string out;
  if (terminated_) return out;
  auto* self = const_cast<Matcher*>(this);  // the pool only interns nodes; the state is not changed
  Stepper st(g_->flat(), self->pool_);
  ParseState a = state_, b;
  while (!a.accept && out.size() < 1024 && !a.nodes.empty()) {
    Set u{};
    for (int32_t n : a.nodes) {
      const Set& s = g_->flat().sets[g_->flat().elems[pool_[n].pos]];
      for (int k = 0; k < 4; ++k) u[k] |= s[k];
    }
    int count = 0, byte = -1;
    for (int k = 0; k < 4; ++k) {
      count += __builtin_popcountll(u[k]);
      if (u[k]) byte = k * 64 + __builtin_ctzll(u[k]);
    }
    if (count != 1) break;
    st.advance(a, static_cast<uint8_t>(byte), b);
    out += static_cast<char>(byte);
    std::swap(a, b);
  }
  return out;
}

}  // namespace ts::grammar
