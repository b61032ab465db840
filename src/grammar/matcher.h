// Byte-level pushdown matcher over a compiled grammar, and token bitmasks over a vocabulary.
//
// Compilation flattens the IR into rules of alternatives, each a sequence of elements (a 256-bit
// byte set, a rule reference, or the end of the alternative). A parse state is a set of stacks;
// a stack is an interned node chain (position, parent), its top always a byte-set element. A byte
// advances every stack whose top set contains it; calls in tail position do not push (so `x*`
// and right recursion keep stacks flat). Left recursion is rejected at compile time.
//
// Masks follow xgrammar's idea: for each stack top -- its position plus the return positions of
// up to kContextDepth frames below it -- the vocabulary splits into tokens accepted or rejected
// whatever lies deeper (context-independent, computed once per CompiledGrammar by a pruned walk
// over the byte-sorted vocabulary, lazily and thread-safely), and the few whose fate depends on
// the deeper stack (they run past the cut). Only those are checked at runtime, again by a pruned
// sorted walk from the real stack. A matcher also remembers the masks of its recent states.
//
// For a sampler: fill_bitmask writes [vocab.mask_words()] uint32 per row, bit (id & 31) of word
// (id >> 5) set = allowed; a model vocabulary padded past the tokenizer's is masked by the caller.
// For the API layer: compile a request's response_format / tool schema once (CompiledGrammar is
// immutable and shareable: cache it by schema text), then one Matcher per request (and per n).
//
// Threading: Vocab and CompiledGrammar are immutable after construction (the per-position cache
// fills under a mutex) and shared by many requests; a Matcher belongs to one request/thread.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/ir.h"

namespace ts::tok {
class Tokenizer;
}

namespace ts::grammar {

// The context-independent split of the vocabulary for one stack top (CompiledGrammar::
// context_mask): tokens accepted whatever lies below the probe, and the uncertain ones.
struct ContextMask {
  std::vector<uint32_t> accepted_bits;  // [mask_words] when dense, else empty
  std::vector<int32_t> accepted_ids;    // when sparse
  std::vector<int32_t> uncertain;       // sorted by bytes
  std::vector<uint16_t> uncertain_lcp;
  size_t bytes() const {
    return (accepted_bits.size() + accepted_ids.size() + uncertain.size()) * 4 + uncertain_lcp.size() * 2 + 96;
  }
};

// Context masks shared by every grammar compiled against one vocabulary, keyed by the
// structure of the grammar the probe can reach (CompiledGrammar::structural_key), not by its
// positions: the JSON rules every schema lowers the same way (string contents, numbers,
// whitespace) are walked once per tokenizer, not once per schema. Bounded by bytes (cleared
// when full: the entries are rebuilt on demand). Thread-safe.
class SharedMaskCache {
 public:
  explicit SharedMaskCache(size_t max_bytes = size_t(256) << 20) : max_bytes_(max_bytes) {}
  std::shared_ptr<const ContextMask> find(const std::string& key) const;
  // Keeps `m` unless the key is already held (then returns the held one).
  std::shared_ptr<const ContextMask> insert(const std::string& key, std::shared_ptr<const ContextMask> m);
  size_t size() const;
  size_t hits() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const ContextMask>> map_;
  size_t bytes_ = 0, max_bytes_;
  mutable size_t hits_ = 0;
};

// The decoded bytes of every token id; special/invalid ids are excluded from masks, except the
// stop ids (allowed exactly when the grammar can end).
// The bytes a special token of text `content` has in a Vocab that admits it (from_tokenizer's
// special_texts): a 0xFF byte, which UTF-8 text never holds (so no character class, JSON string
// or free-text rule of a grammar takes it), then the content. A grammar that writes a marker as
// this literal (the tool-call grammars, for the served tokenizer's special markers) allows that
// one id exactly where the marker is, never inside a value. Normal tokens holding a 0xFF byte are
// excluded from such a Vocab, so nothing else spells the sentinel.
inline constexpr char kSpecialTokenByte = '\xFF';
inline std::string special_token_bytes(std::string_view content) { return kSpecialTokenByte + std::string(content); }

class Vocab {
 public:
  // `stop_ids` default to the tokenizer's eos when empty. `special_texts`: special tokens whose
  // text is one of these are normal tokens of that text (a tool-call parser's markers, such as
  // DeepSeek's <｜tool▁calls▁begin｜> or Mistral's [TOOL_CALLS], are special tokens the model
  // writes as one id: a forced-call grammar that spells the marker must be able to take that id).
  static std::shared_ptr<const Vocab> from_tokenizer(const tok::Tokenizer& t, std::vector<int32_t> stop_ids = {},
                                                     const std::vector<std::string>& special_texts = {});
  // token_bytes[id]; excluded[id] = never allowed (specials, holes).
  Vocab(std::vector<std::string> token_bytes, std::vector<bool> excluded, std::vector<int32_t> stop_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t mask_words() const { return (size() + 31) / 32; }  // a bitmask row: [mask_words] uint32
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  // The text id stands for: bytes(id), without the sentinel of an admitted special token.
  std::string_view text(int32_t id) const {
    const std::string& b = bytes_[id];
    return !b.empty() && b[0] == kSpecialTokenByte ? std::string_view(b).substr(1) : std::string_view(b);
  }
  bool is_stop(int32_t id) const;
  bool is_normal(int32_t id) const { return id >= 0 && id < size() && normal_[id]; }  // in sorted()
  // The admitted special tokens (bytes special_token_bytes(text)).
  const std::vector<int32_t>& marker_ids() const { return marker_ids_; }
  const std::vector<int32_t>& stop_ids() const { return stop_; }
  // Normal (not excluded, non-empty) ids sorted by bytes, and lcp[i] = common prefix of sorted[i-1], sorted[i].
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  // The bytes of sorted()[i], laid out one after another in sorted order: sorted_off()[i] ..
  // sorted_off()[i + 1] in sorted_bytes(). The mask walks read the vocabulary in this order,
  // sequentially, instead of chasing a string per token.
  const std::string& sorted_bytes() const { return sorted_bytes_; }
  const std::vector<uint32_t>& sorted_off() const { return sorted_off_; }
  // The first index k >= i of sorted() with lcp()[k] < j (or sorted().size()): the end of the
  // run of tokens that share the first j bytes of token i - 1. O(64) steps via block minima,
  // so a walk skips a dead prefix's tokens without visiting them.
  size_t skip_shared(size_t i, size_t j) const;
  // Some other normal token's bytes start with this token's (and are longer): text that follows
  // this token could merge with it into one token.
  bool extendable(int32_t id) const;
  // Context masks shared across the grammars compiled against this vocabulary.
  SharedMaskCache& shared_masks() const { return shared_masks_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_;
  std::vector<uint8_t> normal_;
  std::vector<int32_t> marker_ids_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::string sorted_bytes_;
  std::vector<uint32_t> sorted_off_;  // [sorted_.size() + 1]
  std::vector<uint16_t> lcp_min64_, lcp_min4k_;  // min of lcp_ over blocks of 64 / 4096 entries
  mutable SharedMaskCache shared_masks_;
};

// The flat grammar: elems[pos] >= 0 is a byte-set id, kEnd ends an alternative, <= kRefBase a
// reference to rule (kRefBase - v).
struct FlatGrammar {
  static constexpr int32_t kEnd = -1;
  static constexpr int32_t kRefBase = -2;
  std::vector<int32_t> elems;
  std::vector<std::array<uint64_t, 4>> sets;
  std::vector<std::vector<int32_t>> alts;  // rule -> start positions of its alternatives
  std::vector<std::string> names;
  int32_t root = 0;
  bool has(int32_t pos, uint8_t b) const { return (sets[elems[pos]][b >> 6] >> (b & 63)) & 1; }
};

struct CompileOptions {
  size_t max_elements = 4'000'000;  // a guard against grammars that explode (huge {m,n})
};

class CompiledGrammar {
 public:
  // Throws InvalidRequest for invalid grammars (undefined rules, left recursion, too large).
  CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocab> vocab, CompileOptions opt = {});
  const FlatGrammar& flat() const { return flat_; }
  const Vocab& vocab() const { return *vocab_; }
  const std::shared_ptr<const Vocab>& vocab_ptr() const { return vocab_; }

  // The context-independent split for a stack top, keyed by its position and the return
  // positions of up to kContextDepth frames below it, then kRoot (the real bottom: nothing is
  // uncertain) or kSentinel (cut there). Tiny helper rules (a character class, a repetition
  // step) end after a byte or two; looking a few frames down keeps the uncertain set small
  // (Llama-3.1 JSON schemas: warm p99 95 µs with 3 frames, 18 µs with 6; docs/GRAMMAR.md).
  static constexpr int kContextDepth = 6;
  using PosMask = ContextMask;
  const PosMask& context_mask(const std::vector<int32_t>& key) const;
  // A key deeper than this many frames is computed from its cut at this depth (shared by every
  // key with the same top frames: e.g. the string values of all properties): the cut's accepted
  // and rejected tokens stand (they never reach below the cut), and only its uncertain ones
  // (tokens that cross the cut, e.g. those holding a closing quote) are walked with the deeper
  // context. A new key then costs a walk over a few thousand tokens, not the vocabulary.
  static constexpr int kSharedDepth = 2;
  // A structural key past this many bytes (the reachable grammar of a long x{0,n} chain: O(n)
  // per new state) is not built: that context's mask is this grammar's own, not shared. The
  // suite's JSON Schema / GBNF / regex grammars need at most 4.5 KB; a chain's every state is a
  // new context, so each byte of the bound is paid per token there.
  static constexpr size_t kMaxStructuralKey = size_t(1) << 14;
  size_t num_cached_masks() const;
  size_t memory_bytes() const;

 private:
  FlatGrammar flat_;
  std::shared_ptr<const Vocab> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const PosMask>> masks_;  // key bytes -> split
  const PosMask& context_mask_locked(const std::vector<int32_t>& key) const;  // mu_ held
  // The grammar reachable from the key's positions (what a probe from it can step through),
  // serialized with rules renumbered in discovery order, plus the key's bottom (kRoot or
  // kSentinel): equal for two keys exactly when their probes walk isomorphic grammars.
  std::string structural_key(const std::vector<int32_t>& key) const;
};

// Interned stack nodes: (pos, parent). Parents kRoot (bottom of the real stack) and kSentinel
// (bottom of a context-free probe) are not nodes.
class NodePool {
 public:
  static constexpr int32_t kRoot = -1;
  static constexpr int32_t kSentinel = -2;
  struct Node {
    int32_t pos, parent;
  };
  int32_t get(int32_t pos, int32_t parent);
  const Node& operator[](int32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }

 private:
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
};

struct ParseState {
  std::vector<int32_t> nodes;  // sorted, unique stack tops
  bool accept = false;         // the grammar may end here
  bool sentinel = false;       // a probe ran off the bottom of its rule (probes only)
  bool dead() const { return nodes.empty() && !accept; }
};

// Steps states over bytes (shared by the matcher and the compile-time probes).
class Stepper {
 public:
  Stepper(const FlatGrammar& g, NodePool& pool) : g_(g), pool_(pool) {}
  // The state whose stacks are the expansions of (pos, parent).
  ParseState start(int32_t pos, int32_t parent);
  // The grammar's first state: every alternative of the root rule, from the real bottom.
  ParseState start_root();
  // out = in after byte b (out.accept/sentinel describe only this step).
  void advance(const ParseState& in, uint8_t b, ParseState& out);

 private:
  void expand(int32_t pos, int32_t parent, ParseState& out, int depth);
  const FlatGrammar& g_;
  NodePool& pool_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g, size_t max_rollback = 64);

  // False (and no change) when the grammar does not allow the token/bytes. A stop token is
  // accepted only where the grammar can end, and terminates the matcher.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);
  // Undo the last n accepted tokens (accept_bytes counts as one); n <= num_rollback().
  void rollback(size_t n);
  size_t num_rollback() const { return history_.size(); }
  void reset();

  bool can_terminate() const { return state_.accept; }  // the grammar may end here
  bool is_terminated() const { return terminated_; }     // a stop token was accepted

  // row[mask_words()]: bit id set = token allowed next. After termination nothing is allowed.
  void fill_bitmask(uint32_t* row);
  // Bytes the grammar forces next (empty when there is a choice or the grammar may end).
  std::string jump_forward() const;

  const CompiledGrammar& grammar() const { return *g_; }

 private:
  bool step_bytes(std::string_view bytes, ParseState& out);
  void check_uncertain(int32_t node, const CompiledGrammar::PosMask& pm, uint32_t* row);

  std::shared_ptr<const CompiledGrammar> g_;
  NodePool pool_;
  ParseState state_;
  std::vector<std::pair<ParseState, bool>> history_;  // before each accepted token: (state, terminated)
  size_t max_rollback_;
  bool terminated_ = false;
  // Masks of recent states (a JSON string's content repeats one state): key = state nodes.
  std::unordered_map<std::string, std::vector<uint32_t>> mask_cache_;
  std::vector<ParseState> walk_;  // scratch for check_uncertain
  std::vector<int32_t> key_;
};

}  // namespace ts::grammar
