#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <atomic>
#include <climits>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace ts::tok {

size_t StringHash::operator()(std::string_view s) const noexcept { return XXH3_64bits(s.data(), s.size()); }

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64;
  for (size_t c = cap; c > 1; c >>= 1) --shift_;
  size_ = 0;
}

void PairMap::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFF), s.rank, s.id);
  }
  uint64_t key = pack(a, b);
  for (size_t i = hash(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.rank = rank, s.id = id;
      return;
    }
    if (s.key == kEmpty) {
      s = {key, rank, id};
      ++size_;
      return;
    }
  }
}

namespace {

constexpr size_t kMaxCachedWord = 256;  // longer words are rare and would crowd the cache

// Word -> ids memo, one per thread and model (encode is const and runs on many threads).
// Open addressing over flat arenas; it starts small, grows to kMaxSlots and is then simply
// emptied when full, which bounds its memory (~2 MB) however much text goes through.
class WordCache {
 public:
  WordCache() : slots_(kMinSlots) {}

  bool get(uint64_t h, std::string_view key, std::vector<int32_t>& out) const {
    const Slot& s = slots_[find(h, key)];
    if (s.hash == 0) return false;
    out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
    return true;
  }

  void put(uint64_t h, std::string_view key, const int32_t* ids, size_t n) {
    if ((count_ + 1) * 2 > slots_.size()) {
      if (slots_.size() < kMaxSlots) grow();
      else clear();
    }
    if (keys_.size() + key.size() > kMaxKeyBytes) clear();
    Slot& s = slots_[find(h, key)];
    if (s.hash != 0) return;
    s = {h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()), static_cast<uint16_t>(key.size()),
          static_cast<uint16_t>(n)};
    keys_.append(key);
    ids_.insert(ids_.end(), ids, ids + n);
    ++count_;
  }

 private:
  static constexpr size_t kMinSlots = 1 << 12, kMaxSlots = 1 << 16, kMaxKeyBytes = 1 << 20;
  struct Slot {
    uint64_t hash = 0;  // 0 marks an empty slot (callers never pass 0)
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, n_ids = 0;
  };
  // The slot holding `key`, or the empty slot where it would go.
  size_t find(uint64_t h, std::string_view key) const {
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return i;
      if (s.hash == h && s.key_len == key.size() && std::string_view(keys_).substr(s.key_off, s.key_len) == key) return i;
    }
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  void clear() {
    slots_.assign(kMinSlots, Slot{});
    keys_.clear();
    ids_.clear();
    count_ = 0;
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t count_ = 0;
};

// A thread keeps caches for the few models it used last; a model is known by a serial number
// (not its address, which a later model could reuse).
WordCache& thread_cache(uint64_t serial) {
  thread_local std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> caches;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i].first == serial) {
      if (i) std::swap(caches[i], caches[0]);
      return *caches[0].second;
    }
  }
  if (caches.size() >= 4) caches.pop_back();
  caches.insert(caches.begin(), {serial, std::make_unique<WordCache>()});
  return *caches[0].second;
}

std::atomic<uint64_t> g_serial{1};

const std::string kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's word marker

}  // namespace

Bpe::Bpe(const nlohmann::json& m, bool byte_level) : byte_level_(byte_level), serial_(g_serial++) {
  auto opt_string = [&](const char* key) -> std::optional<std::string> {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    if (!m[key].is_string()) fail("tokenizer.json: model.{} must be a string", key);
    return m[key].get<std::string>();
  };
  auto opt_bool = [&](const char* key) {
    if (!m.contains(key) || m[key].is_null()) return false;
    if (!m[key].is_boolean()) fail("tokenizer.json: model.{} must be a boolean", key);
    return m[key].get<bool>();
  };
  ignore_merges_ = opt_bool("ignore_merges");
  byte_fallback_ = opt_bool("byte_fallback");
  fuse_unk_ = opt_bool("fuse_unk");
  unk_token_ = opt_string("unk_token");
  prefix_ = opt_string("continuing_subword_prefix").value_or("");
  suffix_ = opt_string("end_of_word_suffix").value_or("");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    spdlog::warn("tokenizer.json: model.dropout={} ignored (encoding is deterministic)", m["dropout"].get<double>());
  if (byte_level_ && (!prefix_.empty() || !suffix_.empty()))
    fail("tokenizer.json: model.continuing_subword_prefix/end_of_word_suffix with a ByteLevel pre-tokenizer is not supported");

  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("tokenizer.json: model.vocab must be an object of token -> id");
  const auto& jv = m["vocab"];
  vocab_.reserve(jv.size());
  int32_t max_id = -1;
  for (auto it = jv.begin(); it != jv.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      fail("tokenizer.json: model.vocab[{:?}] must be a non-negative integer id", it.key());
    // The id tables are sized by the largest id: bound it before anything is allocated.
    if (it.value().get<int64_t>() >= token_id_limit(jv.size()))
      fail("tokenizer.json: model.vocab[{:?}] = {} is outside the vocabulary ({} entries; ids must be below {})",
           it.key(), it.value().get<int64_t>(), jv.size(), token_id_limit(jv.size()));
    int32_t id = it.value().get<int32_t>();
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;

  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  std::fill(std::begin(ascii_id_), std::end(ascii_id_), -1);
  std::fill(std::begin(byte_fallback_id_), std::end(byte_fallback_id_), -1);
  if (byte_level_) {
    raw_vocab_.reserve(vocab_.size());
    for (const auto& [tok, id] : vocab_)
      if (auto raw = byte_level::token_to_bytes(tok)) raw_vocab_.emplace(std::move(*raw), id);
    for (int b = 0; b < 256; ++b) {
      auto it = raw_vocab_.find(std::string(1, static_cast<char>(b)));
      if (it != raw_vocab_.end()) byte_id_[b] = it->second;
    }
  } else {
    bool marker_only_leading = vocab_.count(kMetaspace) > 0;
    for (const auto& [tok, id] : vocab_) {
      size_t len;
      uint32_t cp = tok.empty() ? unicode::kInvalid : unicode::decode(tok, 0, len);
      if (cp != unicode::kInvalid && len == tok.size()) {
        if (cp < 128) ascii_id_[cp] = id;
        else char_id_[cp] = id;
      }
      for (size_t p = tok.find(kMetaspace, 1); p != std::string::npos; p = tok.find(kMetaspace, p + 1))
        if (p < 3 || tok.compare(p - 3, 3, kMetaspace) != 0) marker_only_leading = false;
    }
    split_on_metaspace_ = marker_only_leading && !ignore_merges_ && prefix_.empty() && suffix_.empty();
  }
  for (int b = 0; b < 256; ++b)
    if (auto id = token_to_id(fmt::format("<0x{:02X}>", b))) byte_fallback_id_[b] = *id;
  if (unk_token_) {
    auto it = vocab_.find(*unk_token_);
    if (it != vocab_.end()) unk_id_ = it->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) fail("tokenizer.json: model.merges must be an array");
  const auto& jm = m["merges"];
  merges_.reserve(jm.size());
  std::string a, b;
  for (size_t i = 0; i < jm.size(); ++i) {
    const auto& e = jm[i];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("tokenizer.json: model.merges[{}] {:?} is not two tokens separated by one space", i, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      fail("tokenizer.json: model.merges[{}] must be \"a b\" or [a, b]", i);
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    std::string merged = a + (b.size() >= prefix_.size() ? b.substr(prefix_.size()) : std::string());
    auto im = vocab_.find(merged);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end())
      fail("tokenizer.json: model.merges[{}] ({:?}, {:?}) uses a token missing from model.vocab", i, a, b);
    merges_.insert(ia->second, ib->second, static_cast<int32_t>(i), im->second);
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int32_t Bpe::unk_id() const {
  if (unk_id_ < 0) fail("tokenizer.json: model.unk_token {:?} is not in model.vocab", *unk_token_);
  return unk_id_;
}

void Bpe::initial_symbols(std::string_view w, std::vector<int32_t>& sym) const {
  sym.clear();
  bool unk_pending = false;
  std::string unit_buf;
  const bool plain = prefix_.empty() && suffix_.empty();
  for (size_t i = 0, n = w.size(); i < n;) {
    size_t len = 1;
    int32_t id = -1;
    std::string_view unit;
    auto b = static_cast<unsigned char>(w[i]);
    if (byte_level_) {
      id = byte_id_[b];
    } else if (plain && b < 0x80) {
      id = ascii_id_[b];
    } else {
      uint32_t cp = unicode::decode(w, i, len);
      if (plain) {
        if (cp != unicode::kInvalid) {
          auto it = char_id_.find(cp);
          if (it != char_id_.end()) id = it->second;
        }
      } else {
        unit_buf.assign(i > 0 ? prefix_ : std::string());
        unit_buf.append(w.substr(i, len));
        if (i + len == n) unit_buf += suffix_;
        unit = unit_buf;
        auto it = vocab_.find(unit);
        if (it != vocab_.end()) id = it->second;
      }
    }
    if (id >= 0) {
      if (unk_pending) sym.push_back(unk_id()), unk_pending = false;
      sym.push_back(id);
      i += len;
      continue;
    }
    // Not in the vocab. The unit, as the model sees it, for byte fallback:
    if (unit.empty()) {
      if (byte_level_) {
        unit_buf.clear();
        unicode::append_utf8(unit_buf, byte_level::byte_to_char(b));
        unit = unit_buf;
      } else {
        unit = w.substr(i, len);
      }
    }
    i += len;
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : unit) all = all && byte_fallback_id_[c] >= 0;
      if (all) {
        // As in HF tokenizers, a pending unk is not flushed before byte-fallback tokens.
        for (unsigned char c : unit) sym.push_back(byte_fallback_id_[c]);
        continue;
      }
    }
    if (unk_token_) {
      if (unk_pending && !fuse_unk_) sym.push_back(unk_id());
      unk_pending = true;
    }
    // No unk token: the unit is dropped, as HF tokenizers does.
  }
  if (unk_pending) sym.push_back(unk_id());
}

void Bpe::merge(std::vector<int32_t>& sym) const {
  if (sym.size() < 2) return;
  if (sym.size() <= 48) merge_small(sym);
  else merge_heap(sym);
}

// Few symbols: rescanning a rank array beats a heap. Picks the same merge as merge_heap (lowest
// rank, leftmost), so results are identical.
void Bpe::merge_small(std::vector<int32_t>& sym) const {
  size_t n = sym.size();
  int32_t rank[48], nid[48];
  auto look = [&](size_t i) {
    if (!merges_.find(sym[i], sym[i + 1], rank[i], nid[i])) rank[i] = INT32_MAX;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    sym[best] = nid[best];
    for (size_t j = best + 1; j + 1 < n; ++j) sym[j] = sym[j + 1];
    for (size_t j = best + 1; j + 2 < n; ++j) rank[j] = rank[j + 1], nid[j] = nid[j + 1];
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  sym.resize(n);
}

// Long words (a SentencePiece segment can be a whole paragraph): HF's heap over (rank, position)
// with a linked list of live symbols; stale heap entries are skipped.
void Bpe::merge_heap(std::vector<int32_t>& sym) const {
  struct Cand {
    int32_t rank, pos, id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  std::vector<Cand> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Cand> heap(std::less<Cand>(), std::move(heap_storage));
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  int32_t r, id;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (merges_.find(sym[i], sym[i + 1], r, id)) heap.push({r, i, id});
  while (!heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    int32_t p = top.pos;
    if (!alive[p] || next[p] < 0) continue;
    int32_t q = next[p];
    if (!merges_.find(sym[p], sym[q], r, id) || id != top.id) continue;
    sym[p] = top.id;
    alive[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    if (prev[p] >= 0 && merges_.find(sym[prev[p]], sym[p], r, id)) heap.push({r, prev[p], id});
    if (next[p] >= 0 && merges_.find(sym[p], sym[next[p]], r, id)) heap.push({r, p, id});
  }
  int32_t k = 0;
  for (int32_t i = 0; i < n; ++i)
    if (alive[i]) sym[k++] = sym[i];
  sym.resize(k);
}

void Bpe::encode_uncached(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> sym;
  initial_symbols(word, sym);
  merge(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const StringMap& v = byte_level_ ? raw_vocab_ : vocab_;
    auto it = v.find(word);
    if (it != v.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (byte_level_ && word.size() == 1 && byte_id_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  auto encode_piece = [&](std::string_view piece) {
    if (piece.size() > kMaxCachedWord) return encode_uncached(piece, out);
    WordCache& cache = thread_cache(serial_);
    uint64_t h = XXH3_64bits(piece.data(), piece.size());
    h += h == 0;
    if (cache.get(h, piece, out)) return;
    size_t start = out.size();
    encode_uncached(piece, out);
    cache.put(h, piece, out.data() + start, out.size() - start);
  };
  if (!split_on_metaspace_) return encode_piece(word);
  size_t start = 0;
  for (size_t p = word.find(kMetaspace, 1); p != std::string_view::npos; p = word.find(kMetaspace, p + 1)) {
    if (p >= 3 && word.compare(p - 3, 3, kMetaspace) == 0) continue;  // inside a run of markers
    encode_piece(word.substr(start, p - start));
    start = p;
  }
  encode_piece(word.substr(start));
}

}  // namespace ts::tok
