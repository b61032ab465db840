#include "runtime/request.h"

#include "core/error.h"

namespace ts {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::none: return "none";
  }
  return "none";
}

const char* state_name(const RequestState& s) {
  static const char* names[] = {"Waiting", "Prefilling", "Decoding", "Retracted", "Finished", "Aborted"};
  return names[s.index()];
}

bool transition_allowed(const RequestState& from, const RequestState& to) {
  return std::visit(
      [](const auto& f, const auto& t) {
        return transition_allowed_v<std::decay_t<decltype(f)>, std::decay_t<decltype(t)>>();
      },
      from, to);
}

void Request::bad_transition(const char* to) const {
  throw Error(fmt::format("request {}: illegal transition {} -> {}", id, state_name(state), to));
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  for (size_t j = i; j < counts.size(); ++j) ++counts[j];
  sum += v;
  ++count;
}

bool Stream::enqueue(StreamEvent& ev) {
  bool due, evented;
  {
    std::lock_guard<std::mutex> lk(mu_);
    evented = notify_ || waker_;
    due = !queued() && evented;
    if (count_ == ring_.size()) {  // full: grow, oldest first
      // (4 first: every slot is warm, holding a recycled event's buffers, after 4 pushes)
      std::vector<StreamEvent> bigger(std::max<size_t>(4, 2 * ring_.size()));
      for (size_t i = 0; i < count_; ++i) std::swap(bigger[i], ring_[(head_ + i) % ring_.size()]);
      ring_.swap(bigger);
      head_ = 0;
    }
    std::swap(ring_[(head_ + count_) % ring_.size()], ev);
    ++count_;
  }
  // pop() waits on cv_; event-driven consumers (a notifier or a waker, set once) never do.
  if (!evented) cv_.notify_one();
  return due;
}

void Stream::take_front(StreamEvent& ev) {
  std::swap(ev, ring_[head_]);  // the consumer's previous event goes back for reuse
  head_ = (head_ + 1) % ring_.size();
  --count_;
}

// notify_ / waker_ are set once before the consumer waits and never reset, so using them
// unlocked is safe.
void Stream::push(StreamEvent ev) {
  if (!enqueue(ev)) return;
  if (waker_) {
    if (waker_->mark(tag_)) waker_->wake();
  } else {
    notify_();
  }
}

void StreamOutbox::push(const std::shared_ptr<Stream>& s, StreamEvent& ev) {
  const bool due = s->enqueue(ev);
  ev.reset();
  if (!due) return;
  if (!s->waker_) {
    due_.push_back(s);
    return;
  }
  size_t i = 0;
  while (i < used_ && marks_[i].waker != s->waker_) ++i;
  if (i == used_) {
    if (used_ == marks_.size()) marks_.emplace_back();
    marks_[used_++].waker = s->waker_;
  }
  marks_[i].tags.push_back(s->tag_);
}

void StreamOutbox::flush() {
  for (size_t i = 0; i < used_; ++i) {
    Marks& m = marks_[i];
    if (m.waker->mark_all(m.tags)) m.waker->wake();
    m.tags.clear();
    m.waker.reset();
  }
  used_ = 0;
  for (auto& s : due_) s->notify_();
  due_.clear();
}

bool Stream::pop(StreamEvent& ev, int timeout_ms) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return queued(); })) return false;
    take_front(ev);
  }
  if (filter_) filter_(ev);  // outside the lock: the engine's pushes never wait for text work
  return true;
}

bool Stream::try_pop(StreamEvent& ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!queued()) return false;
    take_front(ev);
  }
  if (filter_) filter_(ev);
  return true;
}

void Stream::set_notify(std::function<void()> fn) {
  bool now;
  {
    std::lock_guard<std::mutex> lk(mu_);
    TS_CHECK(!notify_ && !waker_, "Stream::set_notify: a notifier is already registered");
    notify_ = std::move(fn);
    now = queued();
  }
  if (now) notify_();
}

void Stream::set_waker(std::shared_ptr<StreamWaker> waker, uint64_t tag) {
  TS_CHECK(waker, "Stream::set_waker: no waker");
  bool now;
  {
    std::lock_guard<std::mutex> lk(mu_);
    TS_CHECK(!notify_ && !waker_, "Stream::set_waker: a notifier is already registered");
    waker_ = std::move(waker);
    tag_ = tag;
    now = queued();
  }
  if (now && waker_->mark(tag_)) waker_->wake();
}

}  // namespace ts
