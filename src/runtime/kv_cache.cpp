#include "runtime/kv_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace ts {

KvCache::KvCache(int64_t num_blocks, int block_size, bool enable_prefix_cache, int groups)
    : block_size_(block_size), prefix_(enable_prefix_cache), blocks_(size_t(std::max<int64_t>(num_blocks, 0))),
      nodes_(NodeArena::bytes_for_blocks(num_blocks)), by_hash_(nodes_.resource()) {
  TS_CHECK(num_blocks > 0 && block_size > 0, "KvCache: bad pool {} x {}", num_blocks, block_size);
  TS_CHECK(groups >= 1 && num_blocks % groups == 0, "KvCache: {} blocks do not split into {} groups", num_blocks, groups);
  if (prefix_) by_hash_.reserve(size_t(num_blocks));  // one entry per block at most: never rehashed
  parts_.reserve(size_t(groups));
  for (int g = 0; g < groups; ++g) parts_.emplace_back(nodes_.resource());
  const int64_t per = num_blocks / groups;
  for (int g = 0; g < groups; ++g) {
    std::vector<int32_t>& f = parts_[size_t(g)].free;
    f.reserve(size_t(per));
    for (int64_t i = (g + 1) * per - 1; i >= g * per; --i) f.push_back(int32_t(i));  // pop_back gives the lowest first
  }
}

int64_t KvCache::available_blocks() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += int64_t(p.free.size() + p.lru.size());
  return n;
}

uint64_t KvCache::hash_block(const int32_t* tokens, int n, uint64_t parent) {
  return XXH64(tokens, size_t(n) * sizeof(int32_t), parent);
}

int32_t KvCache::take_block(int group) {
  Part& part = parts_[size_t(group)];
  int32_t id;
  if (!part.free.empty()) {
    id = part.free.back();
    part.free.pop_back();
  } else {
    id = part.lru.front();  // evict the least recently used cached block
    part.lru.pop_front();
    Block& b = blocks_[size_t(id)];
    b.in_lru = false;
    if (b.hashed) {
      auto it = by_hash_.find(b.hash);
      if (it != by_hash_.end() && it->second == id) {
        by_hash_.erase(it);
        // The only device copy of this prefix block: the host tier keeps it.
        const int32_t* toks = events_on_ ? block_tokens_.data() + size_t(id) * size_t(block_size_) : nullptr;
        if (store_) store_->offer(id, b.hash, b.parent, b.has_parent, toks);
        if (events_on_) events_.push_back({KvCacheEvent::Kind::removed, KvCacheEvent::Medium::gpu, b.hash, 0, false, {}});
      }
      b.hashed = false;
    }
  }
  blocks_[size_t(id)].ref = 1;
  return id;
}

void KvCache::unref(int32_t id) {
  Block& b = blocks_[size_t(id)];
  // A second release of the same reference would put the block on the free list twice.
  TS_CHECK(b.ref > 0, "KvCache: block {} released with no reference held (double free)", id);
  if (--b.ref > 0) return;
  Part& part = parts_[size_t(group_of(id))];
  if (b.hashed && prefix_) {
    b.lru_it = part.lru.insert(part.lru.end(), id);
    b.in_lru = true;
  } else {
    b.hashed = false;
    part.free.push_back(id);
  }
}

void KvCache::set_store(KvStore* store) {
  TS_CHECK(!store || store->block_size() == block_size_, "KvCache: host tier block size {} != {}",
           store ? store->block_size() : 0, block_size_);
  TS_CHECK(!store || groups() == 1, "KvCache: the host tier does not support {} data-parallel groups", groups());
  store_ = store;
  if (store_ && events_on_) store_->set_events(&events_);
}

void KvCache::enable_events() {
  events_on_ = true;
  block_tokens_.assign(blocks_.size() * size_t(block_size_), 0);
  if (store_) store_->set_events(&events_);
}

void KvCache::drain_events(std::vector<KvCacheEvent>& out) {
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
}

void KvCache::begin_plan() {
  if (!store_) return;
  store_->begin_plan();
  for (int32_t id : store_->retired_blocks()) {
    blocks_[size_t(id)].load_seq = 0;
    unref(id);  // the batch's reference: the block is free or cached now unless a sequence holds it
  }
  store_->clear_retired();
}

void KvCache::take_ops(KvBlockOps& out) {
  if (store_) store_->take_ops(out);
  else out.clear();
}

// Block `id` now holds full block `pos` of a sequence whose chained hashes are `hashes`
// (hashes[pos] == h already pushed): index it (first writer wins) and report it.
void KvCache::index_block(int32_t id, uint64_t h, size_t pos, const int32_t* block_tokens,
                          const std::vector<uint64_t>& hashes) {
  Block& b = blocks_[size_t(id)];
  if (b.hashed) return;
  b.hash = h;
  b.hashed = true;
  b.has_parent = pos > 0;
  b.parent = pos > 0 ? hashes[pos - 1] : 0;
  // A duplicate block (same prefix computed twice) simply is not indexed.
  if (!by_hash_.emplace(h, id).second) return;
  if (events_on_) {
    std::copy(block_tokens, block_tokens + block_size_, block_tokens_.begin() + long(size_t(id) * size_t(block_size_)));
    events_.push_back({KvCacheEvent::Kind::stored, KvCacheEvent::Medium::gpu, h, b.parent, b.has_parent,
                       std::vector<int32_t>(block_tokens, block_tokens + block_size_)});
  }
  // Write-through: after the device tier's event, so a router sees GPU before CPU.
  if (store_ && store_->write_through()) store_->offer_through(id, h, b.parent, b.has_parent, block_tokens);
}

int KvCache::cached_tokens(const int32_t* tokens, int max_tokens, int group) const {
  if (!prefix_) return 0;
  uint64_t h = group_seed(group);
  int n = 0;
  for (; n + block_size_ <= max_tokens; n += block_size_) {
    h = hash_block(tokens + n, block_size_, h);
    if (!by_hash_.count(h)) break;
  }
  return n;
}

int KvCache::pick_group(const int32_t* tokens, int max_tokens) const {
  if (groups() == 1) return 0;
  int best = 0, best_tokens = -1;
  int64_t best_avail = -1;
  for (int g = 0; g < groups(); ++g) {
    const int n = cached_tokens(tokens, max_tokens, g);
    const int64_t a = available_blocks(g);
    if (n > best_tokens || (n == best_tokens && a > best_avail)) {
      best = g;
      best_tokens = n;
      best_avail = a;
    }
  }
  return best;
}

// A sequence's reference on cached device block `id` (off the LRU if it was there).
void KvCache::ref_cached(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (b.in_lru) {
    parts_[size_t(group_of(id))].lru.erase(b.lru_it);
    b.in_lru = false;
  }
  ++b.ref;
  last_wait_seq_ = std::max(last_wait_seq_, b.load_seq);  // a block another lookup is loading
}

// A fresh device block of `group` for full block `pos` of a sequence (hash hashes[pos]) that
// host block `host` holds: indexed, its load queued in this plan's batch, which holds a
// reference until the copy has completed; the sequence's reference is the one taken here.
// (Taking the block may evict another cached device block: that one is written back.)
int32_t KvCache::load_host_block(int32_t host, size_t pos, const int32_t* block_tokens,
                                 const std::vector<uint64_t>& hashes, int group) {
  const int32_t id = take_block(group);
  index_block(id, hashes[pos], pos, block_tokens, hashes);
  store_->queue_load(host, id);
  Block& nb = blocks_[size_t(id)];
  nb.load_seq = store_->plan_seq();
  ++nb.ref;  // the batch's
  last_wait_seq_ = nb.load_seq;
  ++host_hits_;
  last_host_tokens_ += block_size_;
  return id;
}

// Window release, lookup only: the longest hit end (whole blocks, at most max_tokens) whose
// blocks a query there reads are all cached -- on the device (WindowHit::device), or on the
// device or in the host tier (WindowHit::any, with the host blocks it would load). The chain's
// hashes need the tokens, not the blocks: they are left in window_hashes_ (all full blocks).
KvCache::WindowHit KvCache::window_hit(const int32_t* tokens, int max_tokens, int group) {
  const int nb = max_tokens / block_size_;
  window_hashes_.clear();
  window_host_.assign(size_t(nb) + 1, 0);  // prefix counts of host-only blocks
  WindowHit w;
  uint64_t h = group_seed(group);
  int run_dev = 0, run_any = 0;  // consecutive hits ending at block i
  for (int i = 0; i < nb; ++i) {
    h = hash_block(tokens + size_t(i) * size_t(block_size_), block_size_, h);
    window_hashes_.push_back(h);
    const bool dev = by_hash_.count(h) > 0, host = !dev && store_ && store_->contains(h);
    run_dev = dev ? run_dev + 1 : 0;
    run_any = dev || host ? run_any + 1 : 0;
    window_host_[size_t(i) + 1] = window_host_[size_t(i)] + (host ? 1 : 0);
    if (dev && w.chain == i) w.chain = i + 1;
    // Blocks [lo, i] must all be there: the run ending at i covers [i + 1 - run, i].
    const int lo = int(std::max<int64_t>(0, int64_t(i + 1) * block_size_ - window_release_ + 1 - window_slack_) / block_size_);
    if (run_dev > 0 && i + 1 - run_dev <= lo) w.device = i + 1;
    if (run_any > 0 && i + 1 - run_any <= lo) {
      w.any = i + 1;
      w.any_loads = window_host_[size_t(i) + 1] - window_host_[size_t(lo)];
    }
  }
  return w;
}

// Takes the window hit ending at block `end` (window_hashes_ from window_hit): entries below
// what a query there reads stay kNoBlock, device blocks are referenced, host ones loaded into
// fresh device blocks (the caller checked that the group has the blocks for them).
int KvCache::take_window(const int32_t* tokens, int end, std::vector<int32_t>& table, std::vector<uint64_t>& hashes,
                         int group) {
  const int lo = int(std::max<int64_t>(0, int64_t(end) * block_size_ - window_release_ + 1 - window_slack_) / block_size_);
  std::vector<int32_t>& host = window_host_ids_;
  host.assign(size_t(end), -1);
  // Pin the host blocks first (a writeback that taking a device block causes must not pick
  // them), then reference the device ones (so taking blocks cannot evict them), then load.
  for (int i = lo; i < end; ++i)
    if (!by_hash_.count(window_hashes_[size_t(i)])) host[size_t(i)] = store_->find(window_hashes_[size_t(i)]);
  for (int i = 0; i < end; ++i) {
    hashes.push_back(window_hashes_[size_t(i)]);
    if (i < lo || host[size_t(i)] >= 0) {
      table.push_back(kNoBlock);
      continue;
    }
    const int32_t id = by_hash_.find(window_hashes_[size_t(i)])->second;
    ref_cached(id);
    table.push_back(id);
  }
  for (int i = lo; i < end; ++i)
    if (host[size_t(i)] >= 0)
      table[size_t(i)] = load_host_block(host[size_t(i)], size_t(i), tokens + size_t(i) * size_t(block_size_), hashes, group);
  ++window_hits_;
  return end * block_size_;
}

int KvCache::match_prefix(const int32_t* tokens, int max_tokens, std::vector<int32_t>& table,
                          std::vector<uint64_t>& hashes, int group) {
  last_host_tokens_ = 0;
  last_wait_seq_ = 0;
  if (!prefix_) return 0;
  // Window release: a hit needs only the blocks its continuation reads (vLLM's sliding-window
  // cache hit), so one whose earlier blocks were evicted still counts; the entries below what
  // its first chunk reads stay kNoBlock and only the blocks from there are loaded from the host
  // tier. Taken where it reaches past the device chain; the usual walk is the fallback when the
  // group lacks the blocks for the host tier's part.
  if (window_release_ > 0) {
    const WindowHit w = window_hit(tokens, max_tokens, group);
    if (w.any > w.chain && w.any > w.device) {
      // The window's device blocks on the LRU stop being available once referenced.
      const int lo = int(std::max<int64_t>(0, int64_t(w.any) * block_size_ - window_release_ + 1 - window_slack_) / block_size_);
      int64_t lru_held = 0;
      for (int i = lo; i < w.any; ++i) {
        auto it = by_hash_.find(window_hashes_[size_t(i)]);
        if (it != by_hash_.end() && blocks_[size_t(it->second)].in_lru) ++lru_held;
      }
      if (w.any_loads <= available_blocks(group) - lru_held) return take_window(tokens, w.any, table, hashes, group);
    }
    if (w.device > w.chain) return take_window(tokens, w.device, table, hashes, group);
  }
  uint64_t h = group_seed(group);
  int n = 0;
  while (n + block_size_ <= max_tokens) {
    h = hash_block(tokens + n, block_size_, h);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) {
      // The host tier continues the chain: each hit gets a fresh device block and a load op.
      // (Taking the block may evict another cached device block: that one is written back.)
      if (!store_ || available_blocks(group) == 0) break;
      int32_t host = store_->find(h);
      if (host < 0) break;
      hashes.push_back(h);
      table.push_back(load_host_block(host, hashes.size() - 1, tokens + n, hashes, group));
      n += block_size_;
      continue;
    }
    ref_cached(it->second);
    table.push_back(it->second);
    hashes.push_back(h);
    n += block_size_;
  }
  return n;
}

int64_t KvCache::blocks_needed(const std::vector<int32_t>& table, int64_t num_tokens) const {
  int64_t need = (num_tokens + block_size_ - 1) / block_size_;
  return std::max<int64_t>(0, need - int64_t(table.size()));
}

bool KvCache::ensure(std::vector<int32_t>& table, int64_t num_tokens, int group) {
  if (!table.empty() && groups() > 1) group = table_group(table);  // (one group: no load of the table's data)
  int64_t extra = blocks_needed(table, num_tokens);
  if (extra > available_blocks(group)) return false;
  for (int64_t i = 0; i < extra; ++i) table.push_back(take_block(group));
  return true;
}

void KvCache::commit(const int32_t* tokens, int64_t computed, std::vector<int32_t>& table,
                     std::vector<uint64_t>& hashes) {
  if (prefix_) {
    int64_t full = std::min<int64_t>(computed / block_size_, int64_t(table.size()));
    while (int64_t(hashes.size()) < full) {
      size_t i = hashes.size();
      uint64_t parent = i ? hashes[i - 1] : group_seed(table_group(table));
      uint64_t h = hash_block(tokens + i * size_t(block_size_), block_size_, parent);
      hashes.push_back(h);
      index_block(table[i], h, i, tokens + i * size_t(block_size_), hashes);
    }
  }
  release_below_window(table, computed);
}

void KvCache::release_below_window(std::vector<int32_t>& table, int64_t computed) {
  if (window_release_ == 0) return;
  // Blocks [0, upto) end at or below the lowest key a query at `computed` or later may read
  // (never the last block). Released ones form a prefix of the table: walk down from upto - 1
  // to the last released one (O(newly released) a step).
  const int64_t lowest = computed - window_release_ + 1 - window_slack_;
  const int64_t upto = std::min<int64_t>(lowest > 0 ? lowest / block_size_ : 0, int64_t(table.size()) - 1);
  for (int64_t i = upto - 1; i >= 0 && table[size_t(i)] != kNoBlock; --i) {
    unref(table[size_t(i)]);
    table[size_t(i)] = kNoBlock;
  }
}

void KvCache::set_window_release(int window) { set_window_release(window, ops::kWindowReadSlack); }

void KvCache::set_window_release(int window, int slack) {
  TS_CHECK(window >= 0 && slack >= 0, "KvCache: window {} or read slack {} < 0", window, slack);
  window_release_ = window;
  window_slack_ = slack;
}

int64_t KvCache::peak_blocks(int64_t tokens, int64_t step_tokens) const {
  const int64_t all = blocks_needed({}, tokens);
  if (window_release_ == 0) return all;
  // Live: [computed - window + 1 - slack, computed + step) rounded out to blocks at both ends.
  const int64_t live = (window_release_ - 1 + window_slack_ + step_tokens + block_size_ - 1) / block_size_ + 1;
  return std::min(all, live);
}

void KvCache::release(std::vector<int32_t>& table, std::vector<uint64_t>& hashes) {
  // Release the tail first so the LRU evicts a sequence's last blocks before its prefix.
  for (auto it = table.rbegin(); it != table.rend(); ++it)
    if (*it != kNoBlock) unref(*it);
  table.clear();
  hashes.clear();
}

void KvCache::truncate(std::vector<int32_t>& table, std::vector<uint64_t>& hashes, int64_t num_tokens) {
  size_t keep = size_t((num_tokens + block_size_ - 1) / block_size_);
  while (table.size() > keep) {
    if (table.back() != kNoBlock) unref(table.back());
    table.pop_back();
  }
  size_t full = size_t(num_tokens / block_size_);
  if (hashes.size() > full) hashes.resize(full);
}

void KvCache::check() const {
  std::vector<int> seen(blocks_.size(), 0);
  for (size_t g = 0; g < parts_.size(); ++g) {
    for (int32_t id : parts_[g].free) {
      TS_CHECK(blocks_[size_t(id)].ref == 0 && !blocks_[size_t(id)].in_lru, "KvCache: free block {} is in use", id);
      TS_CHECK(group_of(id) == int(g), "KvCache: block {} is on group {}'s free list", id, g);
      ++seen[size_t(id)];
    }
    for (int32_t id : parts_[g].lru) {
      TS_CHECK(blocks_[size_t(id)].ref == 0 && blocks_[size_t(id)].in_lru, "KvCache: cached block {} is in use", id);
      TS_CHECK(group_of(id) == int(g), "KvCache: block {} is on group {}'s cached list", id, g);
      ++seen[size_t(id)];
    }
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    TS_CHECK(blocks_[i].ref >= 0, "KvCache: block {} has {} references", i, blocks_[i].ref);
    TS_CHECK(blocks_[i].load_seq == 0 || blocks_[i].ref > 0, "KvCache: block {} is being loaded but unreferenced", i);
    if (blocks_[i].ref > 0) ++seen[i];
    TS_CHECK(seen[i] == 1, "KvCache: block {} is on {} of the free/cached/referenced lists", i, seen[i]);
  }
  for (auto& [h, id] : by_hash_)
    TS_CHECK(blocks_[size_t(id)].hashed && blocks_[size_t(id)].hash == h, "KvCache: hash index names block {} wrongly", id);
}

}  // namespace ts
