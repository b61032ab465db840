#include "runtime/kv_store.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/device_memory.h"
#include "core/error.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

KvStore::KvStore(int64_t num_blocks, int block_size) : block_size_(block_size), blocks_(size_t(num_blocks)) {
  TS_CHECK(num_blocks > 0 && block_size > 0, "KvStore: bad host pool {} x {}", num_blocks, block_size);
  free_.reserve(size_t(num_blocks));
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(int32_t(i));  // hands out 0, 1, ... (copy runs)
}

KvStore::~KvStore() {
#ifdef TS_WITH_CUDA
  if (copy_stream_) {
    cuda::stream_synchronize();
    cuda::event_destroy(ev_compute_);
    cuda::event_destroy(ev_copy_);
    cuda::stream_destroy(copy_stream_);
  }
#endif
}

void KvStore::begin_plan() { ++epoch_; }

int32_t KvStore::find(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  Block& b = blocks_[size_t(it->second)];
  lru_.splice(lru_.end(), lru_, b.lru_it);
  b.pin_epoch = epoch_;
  ++stats_.hit_blocks;
  return it->second;
}

// The block a writeback fills: a free one, else the least recently used one not read by this
// plan's loads (their copies run after this plan's writebacks). -1: none (all pinned).
int32_t KvStore::victim() {
  if (!free_.empty()) {
    int32_t id = free_.back();
    free_.pop_back();
    return id;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    Block& b = blocks_[size_t(*it)];
    if (b.pin_epoch == epoch_) continue;
    int32_t id = *it;
    lru_.erase(it);
    by_hash_.erase(b.hash);
    b.hashed = false;
    ++stats_.evicted_blocks;
    if (events_) events_->push_back({KvCacheEvent::Kind::removed, KvCacheEvent::Medium::cpu, b.hash, 0, false, {}});
    return id;
  }
  return -1;
}

void KvStore::offer(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens) {
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end()) {  // already held (written back before, or loaded from here): no copy
    lru_.splice(lru_.end(), lru_, blocks_[size_t(it->second)].lru_it);
    ++stats_.writeback_skipped;
    return;
  }
  int32_t id = victim();
  if (id < 0) {
    ++stats_.dropped_blocks;
    return;
  }
  Block& b = blocks_[size_t(id)];
  b.hash = hash;
  b.hashed = true;
  b.lru_it = lru_.insert(lru_.end(), id);
  by_hash_.emplace(hash, id);
  ops_.writeback.push_back({device_block, id});
  ++stats_.writeback_blocks;
  if (events_) {
    KvCacheEvent ev{KvCacheEvent::Kind::stored, KvCacheEvent::Medium::cpu, hash, parent, has_parent, {}};
    if (tokens) ev.tokens.assign(tokens, tokens + block_size_);
    events_->push_back(std::move(ev));
  }
}

void KvStore::take_ops(KvBlockOps& out) {
  out.clear();
  std::swap(out, ops_);
}

void KvStore::attach(KvPool& pool) {
  auto add = [&](Tensor& t) {
    if (!t.defined() || t.numel() == 0) return;
    TS_CHECK(!t.shape.empty() && t.shape[0] == pool.num_blocks, "KvStore: a KV tensor is not [num_blocks, ...]");
    Mirror m;
    m.dev = t;
    m.block_bytes = t.nbytes() / size_t(pool.num_blocks);
    // Pinned on CUDA builds with a GPU (DMA at full PCIe rate, truly asynchronous copies); plain
    // aligned memory otherwise. Pages are touched only when a block is first written back.
    m.host = host_pinned_alloc(m.block_bytes * size_t(num_blocks()));
    bytes_per_block_ += m.block_bytes;
    device_ = t.device;
    mirrors_.push_back(std::move(m));
  };
  TS_CHECK(pool.block_size == block_size_, "KvStore: pool block size {} != {}", pool.block_size, block_size_);
  for (size_t l = 0; l < pool.k.size(); ++l) {
    add(pool.k[l]);
    if (l < pool.v.size()) add(pool.v[l]);
    if (l < pool.aux.size()) add(pool.aux[l]);
  }
#ifdef TS_WITH_CUDA
  if (device_ == Device::cuda && !copy_stream_) {
    copy_stream_ = cuda::copy_stream_create();
    ev_compute_ = cuda::event_create();
    ev_copy_ = cuda::event_create();
  }
#endif
}

void KvStore::execute(const KvBlockOps& ops) {
  if (ops.empty() || mirrors_.empty()) return;
  auto t0 = std::chrono::steady_clock::now();
  // Consecutive ops whose device and host blocks both follow on are one copy per tensor (the
  // free lists hand out ascending ids, so a sequence's blocks are mostly runs).
  auto runs = [&](const std::vector<KvBlockOp>& v, bool to_host) {
    for (size_t i = 0; i < v.size();) {
      size_t j = i + 1;
      while (j < v.size() && v[j].device_block == v[j - 1].device_block + 1 && v[j].host_block == v[j - 1].host_block + 1) ++j;
      const size_t n = j - i;
      for (Mirror& m : mirrors_) {
        char* dev = static_cast<char*>(m.dev.data) + size_t(v[i].device_block) * m.block_bytes;
        char* host = static_cast<char*>(m.host.get()) + size_t(v[i].host_block) * m.block_bytes;
        void* dst = to_host ? static_cast<void*>(host) : static_cast<void*>(dev);
        const void* src = to_host ? static_cast<const void*>(dev) : static_cast<const void*>(host);
#ifdef TS_WITH_CUDA
        if (copy_stream_) {
          cuda::copy_async_on(dst, src, n * m.block_bytes, copy_stream_);
          continue;
        }
#endif
        std::memcpy(dst, src, n * m.block_bytes);
      }
      i = j;
    }
  };
#ifdef TS_WITH_CUDA
  // The copies start after the compute work already enqueued (the evicted blocks' K/V is
  // written), and the next forward waits for them (it overwrites the evicted blocks and reads
  // the loaded ones). The host never blocks.
  if (copy_stream_) {
    cuda::event_record_on(ev_compute_, nullptr);
    cuda::stream_wait_event(copy_stream_, ev_compute_);
  }
#endif
  runs(ops.writeback, true);
  runs(ops.load, false);
#ifdef TS_WITH_CUDA
  if (copy_stream_) {
    cuda::event_record_on(ev_copy_, copy_stream_);
    cuda::stream_wait_event(nullptr, ev_copy_);
  }
#endif
  stats_.bytes_written += int64_t(ops.writeback.size() * bytes_per_block_);
  stats_.bytes_loaded += int64_t(ops.load.size() * bytes_per_block_);
  if (!ops.load.empty()) {
    stats_.load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stats_.load_batches;
  }
}

void KvStore::check() const {
  std::vector<int> seen(blocks_.size(), 0);
  for (int32_t id : free_) {
    TS_CHECK(!blocks_[size_t(id)].hashed, "KvStore: free host block {} is indexed", id);
    ++seen[size_t(id)];
  }
  for (int32_t id : lru_) {
    TS_CHECK(blocks_[size_t(id)].hashed, "KvStore: host block {} on the LRU has no hash", id);
    ++seen[size_t(id)];
  }
  for (size_t i = 0; i < blocks_.size(); ++i)
    TS_CHECK(seen[i] == 1, "KvStore: host block {} is on {} of the free/cached lists", i, seen[i]);
  TS_CHECK(by_hash_.size() == lru_.size(), "KvStore: {} hashes index {} cached blocks", by_hash_.size(), lru_.size());
  for (auto& [h, id] : by_hash_)
    TS_CHECK(blocks_[size_t(id)].hashed && blocks_[size_t(id)].hash == h, "KvStore: hash index names host block {} wrongly", id);
}

size_t host_available_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

int64_t kvstore_blocks(int64_t device_blocks, size_t bytes_per_block, double ratio, double size_gb,
                       size_t& available_bytes) {
  available_bytes = host_available_bytes();
  if (bytes_per_block == 0) return 0;
  int64_t want = size_gb > 0 ? int64_t(size_gb * double(1ull << 30) / double(bytes_per_block))
                             : int64_t(ratio * double(device_blocks));
  if (available_bytes > 0) want = std::min<int64_t>(want, int64_t(available_bytes / 2 / bytes_per_block));
  return std::max<int64_t>(want, 0);
}

}  // namespace ts
