// The engine thread's steady decode steps allocate nothing (#17: "the engine thread's hot loop
// neither allocates nor logs"). This binary's operator new counts the allocations of one thread
// while counting is on; the engine thread is found as the thread that wakes the consumer (the
// StreamWaker's wake runs at the end of each engine step).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>

#include "engine_test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::thread::id> g_thread{};
std::atomic<long> g_allocs{0};

void* counted_alloc(size_t n) {
  if (g_counting.load(std::memory_order_relaxed) && std::this_thread::get_id() == g_thread.load(std::memory_order_relaxed))
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace

// Every non-aligned form is replaced, nothrow ones included: a form left to the runtime (or to a
// sanitizer's interposer) would pair its own allocation with this free (ASan: alloc-dealloc
// mismatch). The aligned forms stay the runtime's, new and delete alike.
void* operator new(size_t n) { return counted_alloc(n); }
void* operator new[](size_t n) { return counted_alloc(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace ts {
namespace {

using namespace ts::test;

// n requests decode together; the engine thread's allocations are counted over the steps
// between a quarter and three quarters of their tokens (all n decoding, no admissions or
// finishes), with the consumer draining through one StreamWaker as the HTTP loop does.
void steady_allocs(int n, int max_tokens, bool kvstore, long& allocs, int64_t& steps) {
  EngineOptions o = small_engine(int64_t(n) * 1024, 16);
  o.model_dir = TS_SOURCE_DIR "/tests/data/llama3";
  o.max_num_seqs = n;
  o.disable_kvstore = !kvstore;
  Engine e(o);
  e.start();
  int64_t steps0 = 0;
  const int failed = drain_steady(
      e, n, max_tokens,
      [&](std::thread::id engine_thread) {
        steps0 = e.metrics().steps;
        g_thread = engine_thread;
        g_allocs = 0;
        g_counting = true;
      },
      [&] {
        g_counting = false;
        steps = e.metrics().steps - steps0;
        allocs = g_allocs.load();
      });
  EXPECT_EQ(failed, 0);
}

TEST(EngineAllocations, SteadyDecodeStepsAllocateNothingOnTheEngineThread) {
  for (bool kvstore : {false, true}) {
    long allocs = -1;
    int64_t steps = 0;
    steady_allocs(64, 48, kvstore, allocs, steps);
    std::printf("  engine thread allocations over %lld steady decode steps at 64 running (host tier %s): %ld\n",
                static_cast<long long>(steps), kvstore ? "on" : "off", allocs);
    EXPECT_GT(steps, 5);
    // 0 here; a rare growth (a stream's event ring when its consumer falls 16 steps behind on a
    // loaded machine) is tolerated, an allocation per step or per request is not.
    EXPECT_LE(allocs, 2);
  }
}

}  // namespace
}  // namespace ts
