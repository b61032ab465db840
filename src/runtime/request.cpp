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
  using namespace state;
  if (std::holds_alternative<Finished>(from) || std::holds_alternative<Aborted>(from)) return false;
  if (std::holds_alternative<Aborted>(to)) return true;
  switch (from.index()) {
    case 0: return std::holds_alternative<Prefilling>(to);                        // Waiting
    case 1: return std::holds_alternative<Decoding>(to) || std::holds_alternative<Finished>(to) ||
                   std::holds_alternative<Retracted>(to);                         // Prefilling
    case 2: return std::holds_alternative<Finished>(to) || std::holds_alternative<Retracted>(to);  // Decoding
    case 3: return std::holds_alternative<Waiting>(to);                           // Retracted
  }
  return false;
}

void Request::to(RequestState next) {
  TS_CHECK(transition_allowed(state, next), "request {}: illegal transition {} -> {}", id, state_name(state),
           state_name(next));
  state = std::move(next);
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
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) return false;
  ev = std::move(q_.front());
  q_.pop_front();
  return true;
}

bool Stream::try_pop(StreamEvent& ev) {
  std::lock_guard<std::mutex> lk(mu_);
  if (q_.empty()) return false;
  ev = std::move(q_.front());
  q_.pop_front();
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
