// StreamWaker: coalesced wake-ups for a consumer that serves many streams from one thread (the
// HTTP event loop). A producer that has output for stream `tag` marks the tag instead of
// calling into the consumer; wake() runs once for a batch of marks (the engine: once per step
// that marked, and not at all while an earlier wake's marks are still untaken). So a step with
// output for 200 streams costs the producer 200 append-under-a-lock and one wake, and the
// consumer wakes once to serve them all. runtime::Stream::set_waker attaches a stream.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace ts {

class StreamWaker {
 public:
  virtual ~StreamWaker() = default;
  // Consumer: the tags marked since the last take, in mark order (a tag may repeat), replacing
  // `out`'s contents. Marks after this call owe a new wake.
  void take(std::vector<uint64_t>& out) {
    out.clear();
    std::lock_guard<std::mutex> lk(mu_);
    marks_.swap(out);  // swapped: the producer's next marks reuse out's buffer (no allocation)
    pending_ = false;
  }
  // Producer: records that `tag` has output. True: a wake is owed now (call wake(), at once or
  // at the end of the producer's batch); false: an earlier wake's take is still to come.
  bool mark(uint64_t tag) {
    std::lock_guard<std::mutex> lk(mu_);
    marks_.push_back(tag);
    if (pending_) return false;
    pending_ = true;
    return true;
  }
  // Producer: mark(tag) for each of `tags` under one lock (a step's marks, batched by the
  // engine's outbox: one lock per step instead of one per stream).
  bool mark_all(const std::vector<uint64_t>& tags) {
    std::lock_guard<std::mutex> lk(mu_);
    marks_.insert(marks_.end(), tags.begin(), tags.end());
    if (pending_ || tags.empty()) return false;
    pending_ = true;
    return true;
  }
  // Producer's thread: the consumer has marks to take. Cheap and non-blocking (e.g. a post to
  // an event loop); must not call back into a producer.
  virtual void wake() = 0;

 private:
  std::mutex mu_;
  std::vector<uint64_t> marks_;
  bool pending_ = false;  // a wake is owed or done, its take not yet
};

}  // namespace ts
