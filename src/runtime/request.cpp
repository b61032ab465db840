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

void Stream::push(StreamEvent ev) {
  std::function<void()>* fn = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (q_.empty() && notify_) fn = &notify_;
    q_.push_back(std::move(ev));
  }
  cv_.notify_one();
  // notify_ is set once before the consumer waits and never reset, so calling it unlocked is safe.
  if (fn) (*fn)();
}

bool Stream::pop(StreamEvent& ev, int timeout_ms) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) return false;
    ev = std::move(q_.front());
    q_.pop_front();
  }
  if (filter_) filter_(ev);  // outside the lock: the engine's pushes never wait for text work
  return true;
}

bool Stream::try_pop(StreamEvent& ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (q_.empty()) return false;
    ev = std::move(q_.front());
    q_.pop_front();
  }
  if (filter_) filter_(ev);
  return true;
}

void Stream::set_notify(std::function<void()> fn) {
  bool now;
  {
    std::lock_guard<std::mutex> lk(mu_);
    TS_CHECK(!notify_, "Stream::set_notify: a notifier is already registered");
    notify_ = std::move(fn);
    now = !q_.empty();
  }
  if (now) notify_();
}

}  // namespace ts
