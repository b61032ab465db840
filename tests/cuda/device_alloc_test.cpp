// The caching device allocator in the engine's steady state (core/caching_allocator.h, issue #17
// item 6): after a warm-up, decode steps make no cudaMalloc, no cudaFree and no cudaMallocHost,
// with CUDA graphs and eagerly, in the overlap loop and the simple loop, with greedy, sampled and
// device-penalised requests in the batch. Plus the allocator's wrapper on the device: reuse of a
// freed block, capture-time blocks kept out of the cache, empty_cache.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <cstdio>

#include "core/cuda/runtime.h"
#include "core/device_memory.h"
#include "ops/cuda/graph.h"
#include "runtime/engine.h"

using namespace ts;

namespace {

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

struct Window {
  DeviceMemoryStats before, after;
  int64_t steps = 0;
};

Window steady_state(bool graphs, bool overlap) {
  EngineOptions o;
  o.model_dir = std::string(TS_SOURCE_DIR) + "/models/pycoder";
  o.device = "cuda";
  o.max_total_tokens = 16384;
  o.max_num_seqs = 8;
  o.cuda_graph_max_bs = 8;
  o.prefill_graph_max_tokens = 256;
  o.disable_cuda_graph = !graphs;
  o.disable_overlap_schedule = !overlap;
  Engine e(o);
  std::vector<std::shared_ptr<Stream>> st;
  for (int i = 0; i < 8; ++i) {
    GenerateParams g;
    for (int k = 0; k < 30 + 9 * i; ++k) g.prompt.push_back(100 + (k * 13 + i) % 700);
    g.max_tokens = 400;
    g.ignore_eos = true;
    g.temperature = i % 3 == 1 ? 0.8f : 0.0f;
    g.seed = uint64_t(i);
    if (i == 2) g.repetition_penalty = 1.3f;                     // device logits processing
    if (i == 5) g.presence_penalty = 0.5f, g.frequency_penalty = 0.2f;
    st.push_back(e.submit(g));
  }
  e.start();
  std::vector<size_t> got(st.size(), 0);
  auto read_until = [&](size_t n) {
    for (size_t i = 0; i < st.size(); ++i) {
      StreamEvent ev;
      while (got[i] < n && st[i]->pop(ev, 60000)) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        got[i] += ev.tokens.size();
        if (ev.finished) break;
      }
      EXPECT_GE(got[i], n) << "request " << i;
    }
  };
  // Warm-up: every request admitted, prefilled and some way into its decode; the block tables
  // have widened past the first growths.
  read_until(48);
  Window w;
  w.before = device_memory_stats();
  const int64_t s0 = e.metrics().steps;
  read_until(300);
  w.after = device_memory_stats();
  w.steps = e.metrics().steps - s0;
  e.stop();
  return w;
}

}  // namespace

TEST(CudaDeviceAlloc, NoDeviceAllocationInSteadyStateDecode) {
  TS_REQUIRE_CUDA();
  struct Case {
    bool graphs, overlap;
  };
  for (Case c : {Case{true, true}, Case{false, true}, Case{true, false}, Case{false, false}}) {
    const Window w = steady_state(c.graphs, c.overlap);
    std::printf("graphs=%d overlap=%d: %lld steps; cudaMalloc %llu -> %llu, cudaFree %llu -> %llu, "
                "cudaMallocHost %llu -> %llu, cache hits +%llu, in use %.1f MiB, cached %.1f MiB\n",
                int(c.graphs), int(c.overlap), (long long)w.steps, (unsigned long long)w.before.malloc_calls,
                (unsigned long long)w.after.malloc_calls, (unsigned long long)w.before.free_calls,
                (unsigned long long)w.after.free_calls, (unsigned long long)w.before.pinned_alloc_calls,
                (unsigned long long)w.after.pinned_alloc_calls,
                (unsigned long long)(w.after.cache_hits - w.before.cache_hits), double(w.after.bytes_in_use) / (1 << 20),
                double(w.after.bytes_cached) / (1 << 20));
    EXPECT_GE(w.steps, 100) << "the window must cover decode steps";
    EXPECT_EQ(w.after.malloc_calls, w.before.malloc_calls) << "cudaMalloc in steady state, graphs=" << c.graphs
                                                           << " overlap=" << c.overlap;
    EXPECT_EQ(w.after.free_calls, w.before.free_calls) << "cudaFree in steady state, graphs=" << c.graphs
                                                       << " overlap=" << c.overlap;
    EXPECT_EQ(w.after.pinned_alloc_calls, w.before.pinned_alloc_calls)
        << "cudaMallocHost in steady state, graphs=" << c.graphs << " overlap=" << c.overlap;
    EXPECT_GT(w.after.malloc_calls, 0u) << "device memory goes through the caching allocator";
  }
}

TEST(CudaDeviceAlloc, FreedBlocksAreReusedAndCaptureBlocksAreNot) {
  TS_REQUIRE_CUDA();
  const DeviceMemoryStats s0 = cuda::memory_stats();
  void* first = nullptr;
  {
    auto a = cuda::alloc(3 << 20);
    first = a.get();
    cuda::memset(a.get(), 1, 3 << 20);
  }
  const DeviceMemoryStats s1 = cuda::memory_stats();
  EXPECT_GE(s1.bytes_cached, size_t(4) << 20) << "a dropped block waits in the cache";
  {
    auto b = cuda::alloc((3 << 20) + 100);  // same 4 MiB class
    EXPECT_EQ(b.get(), first);
  }
  const DeviceMemoryStats s2 = cuda::memory_stats();
  EXPECT_EQ(s2.malloc_calls, s1.malloc_calls);
  EXPECT_EQ(s2.free_calls, s0.free_calls);
  EXPECT_GT(s2.cache_hits, s1.cache_hits);
  // While the stream is captured, a block bypasses the cache both ways (a graph may keep its
  // address): a fresh cudaMalloc although a block of the class is cached, and cudaFree on drop.
  {
    cuda::Graph g;
    g.begin_capture();
    std::shared_ptr<void> c = cuda::alloc(3 << 20);
    cuda::copy_async(c.get(), static_cast<char*>(c.get()) + (2 << 20), 1 << 20);  // one node
    g.end_capture();
    EXPECT_NE(c.get(), first) << "a capture-time allocation must not take a cached block";
    c.reset();
  }
  const DeviceMemoryStats s2b = cuda::memory_stats();
  EXPECT_EQ(s2b.malloc_calls, s2.malloc_calls + 1);
  EXPECT_EQ(s2b.free_calls, s2.free_calls + 1);
  EXPECT_EQ(s2b.bytes_cached, s2.bytes_cached);
  // empty_cache gives every cached block back (cudaFree).
  const size_t freed = cuda::empty_cache();
  EXPECT_GE(freed, size_t(4) << 20);
  const DeviceMemoryStats s3 = cuda::memory_stats();
  EXPECT_EQ(s3.bytes_cached, 0u);
  EXPECT_GT(s3.free_calls, s2b.free_calls);
}
