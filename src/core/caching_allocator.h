// CachingAllocator: keeps freed device blocks and hands them out again, so a server in steady
// state makes no cudaMalloc/cudaFree calls (cudaFree synchronises the whole device; cudaMalloc
// takes tens of µs to ms). Device-independent: the memory comes from a BlockSource (cudaMalloc in
// core/cuda/runtime.cu, a fake in tests/unit/core/caching_allocator_test.cpp).
//
// Blocks: a request is rounded up to its size class (multiples of 512 B up to 1 MiB, of 2 MiB
// above: cudaMalloc's own granularities, so rounding wastes nothing the driver would not); freed
// blocks wait in per-class free lists; an allocation takes the smallest cached block of its class
// or of a class at most 1/4 larger (best fit with bounded waste, no splitting), else asks the
// source. A source that is out of memory gets the whole cache back (empty_cache) and one retry.
// Blocks are never split or merged, so a steady state of recurring sizes reuses its own blocks.
//
// Stream semantics (what makes reuse safe; the CUDA wrapper, core/cuda/runtime.h, says it too):
// the host drops a tensor while kernels queued on the device may still read it. A cached block is
// only handed to the next allocation, whose users are ordered after those kernels when both run on
// the same stream: every op of a device launches on that device's one compute stream, and the
// synchronous copies/memsets use the legacy default stream, which waits for it. Work on any other
// stream (the host KV tier's copy stream) must keep its buffers alive until an event says it is
// done (KvStore's persistent pool blocks and pinned host memory do).
//
// Header-only: the CUDA runtime wrapper (below ts_core) links it.
// Thread-safe (one mutex): tensors are created and dropped on the engine, device and TP threads.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace ts {

// Where blocks come from (one device).
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual void* raw_alloc(size_t bytes) = 0;  // nullptr: out of memory (no throw)
  virtual void raw_free(void* p, size_t bytes) = 0;
};

struct DeviceMemoryStats {
  uint64_t malloc_calls = 0;  // raw_alloc calls that returned memory (cudaMalloc)
  uint64_t free_calls = 0;    // raw_free calls (cudaFree)
  uint64_t cache_hits = 0;    // allocations served from the cache
  uint64_t oom_retries = 0;   // allocations that emptied the cache and retried
  uint64_t pinned_alloc_calls = 0;  // cudaMallocHost calls (pinned host staging; CUDA wrapper)
  size_t bytes_in_use = 0;    // held by live allocations (block sizes)
  size_t bytes_cached = 0;    // in the free lists
  size_t peak_bytes = 0;      // most bytes_in_use + bytes_cached ever held from the source
  DeviceMemoryStats& operator+=(const DeviceMemoryStats& o);
};

class CachingAllocator {
 public:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;  // the block's size (>= the request; pass it back to release)
  };
  explicit CachingAllocator(BlockSource* src = nullptr) : src_(src) {}
  void set_source(BlockSource* src) { src_ = src; }

  // A block of at least `bytes` (0 bytes: {nullptr, 0}). cached = false: straight from the
  // source and back to it on release (CUDA-graph capture: a block a graph may keep must never
  // be handed to anyone else). {nullptr, 0} when the source is out of memory even after
  // empty_cache().
  Block allocate(size_t bytes, bool cached = true);
  // Gives a block back: to the free list of its size (cached), or to the source.
  void release(const Block& b, bool cached = true);
  // Frees every cached block (before memory is measured for the KV pool; on out of memory).
  // Returns the bytes given back to the source.
  size_t empty_cache();
  DeviceMemoryStats stats() const;

  // The class of a request: 512 B multiples up to 1 MiB, 2 MiB multiples above.
  static size_t round_size(size_t bytes);
  // The largest cached block an allocation of class `rounded` may take.
  static size_t max_fit(size_t rounded) { return rounded + rounded / 4; }

 private:
  size_t empty_cache_locked();
  BlockSource* src_;
  mutable std::mutex mu_;
  // class size -> cached blocks of exactly that size (vectors keep their capacity: a warm cache
  // takes and gives back blocks without touching the heap).
  std::map<size_t, std::vector<void*>> free_;
  DeviceMemoryStats st_;
};

// ---- implementation ----

inline DeviceMemoryStats& DeviceMemoryStats::operator+=(const DeviceMemoryStats& o) {
  malloc_calls += o.malloc_calls;
  free_calls += o.free_calls;
  cache_hits += o.cache_hits;
  oom_retries += o.oom_retries;
  pinned_alloc_calls += o.pinned_alloc_calls;
  bytes_in_use += o.bytes_in_use;
  bytes_cached += o.bytes_cached;
  peak_bytes += o.peak_bytes;
  return *this;
}

inline size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSmallMax = size_t(1) << 20;
  if (bytes <= kSmallMax) return std::max(kSmall, (bytes + kSmall - 1) / kSmall * kSmall);
  TS_CHECK(bytes <= SIZE_MAX - kLarge, "device allocation of {} bytes", bytes);
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

inline CachingAllocator::Block CachingAllocator::allocate(size_t bytes, bool cached) {
  if (bytes == 0) return {};
  const size_t want = round_size(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  TS_CHECK(src_, "CachingAllocator: no block source");
  if (cached) {
    // Best fit: the smallest non-empty class in [want, max_fit(want)].
    for (auto it = free_.lower_bound(want); it != free_.end() && it->first <= max_fit(want); ++it) {
      if (it->second.empty()) continue;
      Block b{it->second.back(), it->first};
      it->second.pop_back();
      st_.bytes_cached -= b.size;
      st_.bytes_in_use += b.size;
      ++st_.cache_hits;
      return b;
    }
  }
  void* p = src_->raw_alloc(want);
  if (!p && st_.bytes_cached > 0) {
    ++st_.oom_retries;
    empty_cache_locked();
    p = src_->raw_alloc(want);
  }
  if (!p) return {};
  ++st_.malloc_calls;
  st_.bytes_in_use += want;
  st_.peak_bytes = std::max(st_.peak_bytes, st_.bytes_in_use + st_.bytes_cached);
  return {p, want};
}

inline void CachingAllocator::release(const Block& b, bool cached) {
  if (!b.ptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  st_.bytes_in_use -= std::min(st_.bytes_in_use, b.size);
  if (!cached) {
    src_->raw_free(b.ptr, b.size);
    ++st_.free_calls;
    return;
  }
  free_[b.size].push_back(b.ptr);
  st_.bytes_cached += b.size;
}

inline size_t CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  return empty_cache_locked();
}

inline size_t CachingAllocator::empty_cache_locked() {
  size_t freed = 0;
  for (auto& [size, list] : free_) {
    for (void* p : list) {
      src_->raw_free(p, size);
      ++st_.free_calls;
      freed += size;
    }
    list.clear();
  }
  st_.bytes_cached -= std::min(st_.bytes_cached, freed);
  return freed;
}

inline DeviceMemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

}  // namespace ts
