#include "core/stream_waker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace ts {
namespace {

struct CountingWaker : StreamWaker {
  int wakes = 0;
  void wake() override { ++wakes; }
};

TEST(StreamWaker, OneWakeOwedPerTake) {
  CountingWaker w;
  EXPECT_TRUE(w.mark(7));   // the first mark owes a wake
  EXPECT_FALSE(w.mark(8));  // later ones ride on it until the consumer takes
  EXPECT_FALSE(w.mark(7));
  std::vector<uint64_t> tags{99};
  w.take(tags);
  EXPECT_EQ(tags, (std::vector<uint64_t>{7, 8, 7}));  // in mark order, repeats kept
  w.take(tags);
  EXPECT_TRUE(tags.empty());
  EXPECT_TRUE(w.mark(3));  // after a take, a new wake is owed
}

// A producer thread marks while a consumer takes: no mark is lost, and whenever marks are
// waiting a wake was owed since the consumer's last take.
TEST(StreamWaker, ConcurrentMarksAreNeitherLostNorLeftWithoutAWake) {
  CountingWaker w;
  constexpr int kMarks = 200000;
  std::atomic<int> owed{0};
  std::thread producer([&] {
    for (int i = 0; i < kMarks; ++i)
      if (w.mark(uint64_t(i))) owed.fetch_add(1);
  });
  std::vector<uint64_t> tags, all;
  int takes = 0;
  while (int(all.size()) < kMarks) {
    w.take(tags);
    ++takes;
    all.insert(all.end(), tags.begin(), tags.end());
  }
  producer.join();
  ASSERT_EQ(int(all.size()), kMarks);
  for (int i = 0; i < kMarks; ++i) ASSERT_EQ(all[size_t(i)], uint64_t(i));
  EXPECT_GE(owed.load(), 1);
  EXPECT_LE(owed.load(), takes + 1);
}

}  // namespace
}  // namespace ts
