// The caching device allocator's bookkeeping (core/caching_allocator.h) over a fake block source:
// size classes, reuse of freed blocks (no source calls in a steady state), best fit with bounded
// waste, uncached (graph-capture) blocks, empty_cache, the out-of-memory retry, and that a live
// block is never handed out twice.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "core/caching_allocator.h"

namespace ts {
namespace {

// Hands out fake addresses from a counter; `limit` bytes at most outstanding (then nullptr).
class FakeSource final : public BlockSource {
 public:
  size_t limit = SIZE_MAX, outstanding = 0;
  int allocs = 0, frees = 0;
  std::map<void*, size_t> live;
  void* raw_alloc(size_t bytes) override {
    if (outstanding + bytes > limit) return nullptr;
    void* p = reinterpret_cast<void*>(next_);
    next_ += bytes + 4096;
    live[p] = bytes;
    outstanding += bytes;
    ++allocs;
    return p;
  }
  void raw_free(void* p, size_t bytes) override {
    auto it = live.find(p);
    ASSERT_NE(it, live.end()) << "free of a block the source never gave (or freed twice)";
    EXPECT_EQ(it->second, bytes);
    outstanding -= bytes;
    live.erase(it);
    ++frees;
  }

 private:
  uintptr_t next_ = 0x10000;
};

TEST(CachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), size_t(1) << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), size_t(2) << 20);
  EXPECT_EQ(CachingAllocator::round_size((5 << 20) + 7), size_t(6) << 20);
  EXPECT_EQ(CachingAllocator::max_fit(size_t(8) << 20), size_t(10) << 20);
}

TEST(CachingAllocator, SteadyStateReusesBlocksWithoutSourceCalls) {
  FakeSource src;
  CachingAllocator a(&src);
  const std::vector<size_t> sizes = {100, 4096, 70000, 3 << 20, 33 << 20};
  // Warm-up: one round of allocations, all released.
  {
    std::vector<CachingAllocator::Block> bs;
    for (size_t s : sizes) bs.push_back(a.allocate(s));
    for (auto& b : bs) a.release(b);
  }
  const DeviceMemoryStats warm = a.stats();
  EXPECT_EQ(warm.malloc_calls, sizes.size());
  EXPECT_EQ(warm.free_calls, 0u);
  EXPECT_EQ(warm.bytes_in_use, 0u);
  EXPECT_GT(warm.bytes_cached, size_t(36) << 20);
  // Steady state: the same sizes again and again (a decode step's tensors) hit the cache.
  for (int step = 0; step < 100; ++step) {
    std::vector<CachingAllocator::Block> bs;
    for (size_t s : sizes) {
      bs.push_back(a.allocate(s));
      ASSERT_NE(bs.back().ptr, nullptr);
      EXPECT_GE(bs.back().size, s);
    }
    EXPECT_EQ(a.stats().bytes_cached, 0u);
    for (auto& b : bs) a.release(b);
  }
  const DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.malloc_calls, warm.malloc_calls) << "no cudaMalloc in steady state";
  EXPECT_EQ(s.free_calls, 0u) << "no cudaFree in steady state";
  EXPECT_EQ(s.cache_hits, 100u * sizes.size());
  EXPECT_EQ(src.allocs, int(sizes.size()));
  EXPECT_EQ(src.frees, 0);
}

TEST(CachingAllocator, BestFitWithBoundedWaste) {
  FakeSource src;
  CachingAllocator a(&src);
  auto big = a.allocate(size_t(10) << 20), mid = a.allocate(size_t(8) << 20);
  a.release(big);
  a.release(mid);
  // 7 MiB -> class 8 MiB: the 8 MiB block fits exactly (the 10 MiB one is also in range, but larger).
  auto x = a.allocate(size_t(7) << 20);
  EXPECT_EQ(x.ptr, mid.ptr);
  EXPECT_EQ(x.size, size_t(8) << 20);
  // 4 MiB: the 10 MiB block is more than 1/4 over: a new block from the source.
  const int before = src.allocs;
  auto y = a.allocate(size_t(4) << 20);
  EXPECT_EQ(src.allocs, before + 1);
  EXPECT_NE(y.ptr, big.ptr);
  // 9 MiB -> class 10 MiB: takes the cached 10 MiB block.
  auto z = a.allocate(size_t(9) << 20);
  EXPECT_EQ(z.ptr, big.ptr);
  for (auto& b : {x, y, z}) a.release(b);
}

TEST(CachingAllocator, NoBlockIsHandedOutTwice) {
  FakeSource src;
  CachingAllocator a(&src);
  std::mt19937 rng(7);
  std::vector<CachingAllocator::Block> live;
  std::set<void*> held;
  for (int i = 0; i < 20000; ++i) {
    if (!live.empty() && rng() % 2) {
      size_t k = rng() % live.size();
      held.erase(live[k].ptr);
      a.release(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      size_t bytes = size_t(1) << (rng() % 24);
      bytes += rng() % bytes;
      auto b = a.allocate(bytes);
      ASSERT_NE(b.ptr, nullptr);
      ASSERT_GE(b.size, bytes);
      ASSERT_TRUE(held.insert(b.ptr).second) << "block handed out while still live";
      live.push_back(b);
    }
    const DeviceMemoryStats s = a.stats();
    ASSERT_EQ(s.bytes_in_use + s.bytes_cached, src.outstanding);
  }
  for (auto& b : live) a.release(b);
  EXPECT_EQ(a.stats().bytes_in_use, 0u);
  a.empty_cache();
  EXPECT_EQ(src.outstanding, 0u);
  EXPECT_TRUE(src.live.empty());
  EXPECT_EQ(a.stats().bytes_cached, 0u);
}

TEST(CachingAllocator, UncachedBlocksGoStraightBack) {
  // CUDA-graph capture: a block a graph may keep must never be reused by someone else.
  FakeSource src;
  CachingAllocator a(&src);
  auto b = a.allocate(4096, false);
  EXPECT_EQ(src.allocs, 1);
  a.release(b, false);
  EXPECT_EQ(src.frees, 1);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  // ... and a capture-time allocation does not take a cached block either.
  auto c = a.allocate(4096);
  a.release(c);
  auto d = a.allocate(4096, false);
  EXPECT_NE(d.ptr, c.ptr);
  a.release(d, false);
  EXPECT_EQ(a.stats().bytes_cached, 4096u);
}

TEST(CachingAllocator, EmptyCacheAndOutOfMemoryRetry) {
  FakeSource src;
  src.limit = size_t(64) << 20;
  CachingAllocator a(&src);
  auto x = a.allocate(size_t(40) << 20);
  a.release(x);
  EXPECT_EQ(a.stats().bytes_cached, size_t(40) << 20);
  // 30 MiB does not fit beside the cached 40 MiB block (and the block is too big to reuse):
  // the cache is emptied and the allocation retried.
  auto y = a.allocate(size_t(30) << 20);
  ASSERT_NE(y.ptr, nullptr);
  EXPECT_EQ(a.stats().oom_retries, 1u);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  EXPECT_EQ(src.frees, 1);
  // Really out of memory: nullptr (the CUDA wrapper turns it into an error).
  auto z = a.allocate(size_t(40) << 20);
  EXPECT_EQ(z.ptr, nullptr);
  a.release(y);
  EXPECT_EQ(a.empty_cache(), size_t(30) << 20);
  EXPECT_EQ(src.outstanding, 0u);
  EXPECT_EQ(a.allocate(0).ptr, nullptr);
}

TEST(CachingAllocator, ThreadsShareOneCache) {
  FakeSource src;
  CachingAllocator a(&src);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&a, t] {
      for (int i = 0; i < 2000; ++i) {
        auto b = a.allocate(size_t(1024) * (1 + (i + t) % 8));
        a.release(b);
      }
    });
  for (auto& t : th) t.join();
  const DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(s.malloc_calls, 32u);  // at most 8 classes x 4 threads ever live at once
  EXPECT_EQ(s.malloc_calls + s.cache_hits, 8000u);
}

}  // namespace
}  // namespace ts
