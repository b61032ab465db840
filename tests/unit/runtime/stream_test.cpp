// Stream (runtime/engine.h): the ring queue with event recycling, notifiers, wakers and the
// engine's StreamOutbox.
#include <gtest/gtest.h>

#include "runtime/engine.h"

namespace ts {
namespace {

StreamEvent tokens_event(std::vector<int32_t> ids, bool finished = false) {
  StreamEvent ev;
  ev.tokens = std::move(ids);
  ev.finished = finished;
  return ev;
}

TEST(Stream, KeepsOrderAcrossGrowthWithInterleavedPops) {
  Stream s;
  StreamEvent ev;
  int next_in = 0, next_out = 0;
  // Pushes outpace pops: the ring grows several times while its head moves.
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 3; ++k) s.push(tokens_event({next_in++}));
    ASSERT_TRUE(s.try_pop(ev));
    ASSERT_EQ(ev.tokens, std::vector<int32_t>{next_out});
    ++next_out;
  }
  while (s.try_pop(ev)) {
    ASSERT_EQ(ev.tokens, std::vector<int32_t>{next_out});
    ++next_out;
  }
  EXPECT_EQ(next_out, next_in);
  EXPECT_FALSE(s.pop(ev, 1));
}

TEST(Stream, RecycledEventsCarryNothingOver) {
  auto s = std::make_shared<Stream>();
  StreamOutbox out;
  StreamEvent ev;
  ev.tokens = {1, 2, 3};
  ev.text = "abc";
  ev.error = "boom";
  ev.finished = true;
  ev.logprobs.push_back({1, -0.5f, {}});
  out.push(s, ev);
  // The producer's event comes back reset.
  EXPECT_TRUE(ev.tokens.empty() && ev.text.empty() && ev.error.empty() && ev.logprobs.empty() && !ev.finished);
  StreamEvent got;
  got.text = "consumer's old text";
  got.tokens = {42};
  ASSERT_TRUE(s->try_pop(got));
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(got.text, "abc");
  EXPECT_EQ(got.error, "boom");
  // The consumer's old event went back into the ring; the next push hands it to the producer,
  // which gets it reset: nothing of it reaches the consumer again.
  ev.tokens.push_back(5);
  out.push(s, ev);
  EXPECT_TRUE(ev.tokens.empty() && ev.text.empty());
  ASSERT_TRUE(s->try_pop(got));
  EXPECT_EQ(got.tokens, std::vector<int32_t>{5});
  EXPECT_TRUE(got.text.empty() && got.error.empty() && !got.finished && got.logprobs.empty());
}

TEST(Stream, OutboxDefersNotifiersToFlush) {
  auto s = std::make_shared<Stream>();
  int calls = 0;
  s->set_notify([&] { ++calls; });
  StreamOutbox out;
  StreamEvent ev = tokens_event({1});
  out.push(s, ev);
  ev.tokens = {2};
  out.push(s, ev);  // the queue was not empty: nothing more is owed
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(out.empty());
  out.flush();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(out.empty());
  StreamEvent got;
  while (s->try_pop(got)) {
  }
  s->push(tokens_event({3}));  // a plain push notifies at once
  EXPECT_EQ(calls, 2);
}

struct Waker : StreamWaker {
  int wakes = 0;
  void wake() override { ++wakes; }
};

TEST(Stream, WakerWakesOncePerFlushForManyStreams) {
  auto w = std::make_shared<Waker>();
  std::vector<std::shared_ptr<Stream>> st;
  for (int i = 0; i < 100; ++i) {
    st.push_back(std::make_shared<Stream>());
    st.back()->set_waker(w, uint64_t(i));
  }
  StreamOutbox out;
  StreamEvent ev;
  for (int i = 0; i < 100; ++i) {
    ev.tokens = {i};
    out.push(st[size_t(i)], ev);
  }
  EXPECT_EQ(w->wakes, 0);
  out.flush();
  EXPECT_EQ(w->wakes, 1);
  // Another step before the consumer took the marks: no second wake (one is pending).
  for (int i = 0; i < 100; i += 2) {
    ev.tokens = {1000 + i};
    out.push(st[size_t(i)], ev);
  }
  out.flush();
  EXPECT_EQ(w->wakes, 1);
  std::vector<uint64_t> tags;
  w->take(tags);
  EXPECT_EQ(tags.size(), 100u);  // only the empty-queue pushes mark
  StreamEvent got;
  for (uint64_t t : tags) {
    ASSERT_TRUE(st[t]->try_pop(got));
    EXPECT_EQ(got.tokens, std::vector<int32_t>{int32_t(t)});
  }
  for (int i = 0; i < 100; i += 2) {
    ASSERT_TRUE(st[size_t(i)]->try_pop(got));
    EXPECT_EQ(got.tokens, std::vector<int32_t>{1000 + i});
    EXPECT_FALSE(st[size_t(i)]->try_pop(got));
  }
  // Drained and taken: the next step's output wakes again.
  ev.tokens = {7};
  out.push(st[3], ev);
  out.flush();
  EXPECT_EQ(w->wakes, 2);
}

// The outbox marks each waker's tags at flush, under one lock per waker and step: two
// consumers' streams interleaved in one step each get their tags in push order and one wake,
// and nothing is marked before the flush.
TEST(Stream, OutboxBatchesMarksPerWaker) {
  auto a = std::make_shared<Waker>(), b = std::make_shared<Waker>();
  std::vector<std::shared_ptr<Stream>> st;
  for (int i = 0; i < 6; ++i) {
    st.push_back(std::make_shared<Stream>());
    st.back()->set_waker(i % 2 ? b : a, uint64_t(10 + i));
  }
  StreamOutbox out;
  StreamEvent ev;
  for (int step = 0; step < 2; ++step) {
    for (int i : {5, 0, 3, 2, 1, 4}) {
      ev.tokens = {i};
      out.push(st[size_t(i)], ev);
    }
    EXPECT_FALSE(out.empty());
    std::vector<uint64_t> tags;
    a->take(tags);
    EXPECT_TRUE(tags.empty());  // not marked before the flush
    out.flush();
    EXPECT_TRUE(out.empty());
    EXPECT_EQ(a->wakes, step + 1);
    EXPECT_EQ(b->wakes, step + 1);
    a->take(tags);
    EXPECT_EQ(tags, (std::vector<uint64_t>{10, 12, 14}));
    b->take(tags);
    EXPECT_EQ(tags, (std::vector<uint64_t>{15, 13, 11}));
    StreamEvent got;
    for (auto& s : st) {
      ASSERT_TRUE(s->try_pop(got));
      EXPECT_FALSE(s->try_pop(got));
    }
  }
}

TEST(Stream, WakerRegisteredAfterOutputWakesAtOnce) {
  auto s = std::make_shared<Stream>();
  s->push(tokens_event({1}));
  auto w = std::make_shared<Waker>();
  s->set_waker(w, 5);
  EXPECT_EQ(w->wakes, 1);
  std::vector<uint64_t> tags;
  w->take(tags);
  EXPECT_EQ(tags, std::vector<uint64_t>{5});
  EXPECT_THROW(s->set_notify([] {}), Error);
}

}  // namespace
}  // namespace ts
