// Per-op device time for diagnostics (bench --profile). While a profiler is installed on this
// thread, every CUDA op dispatched through ops.cpp is bracketed by begin(label) / end(); the CUDA
// implementation (ops/cuda/op_profiler.h) records an event pair per op. Null (the default) costs
// one thread-local load per op; the label is only built while profiling. Eager forwards only:
// events between kernels break programmatic dependent launch, so profiled times run a little
// slower than unprofiled ones, and ops replayed inside a CUDA graph are not seen.
#pragma once
#include <string>

namespace ts::ops {

class OpProfiler {
 public:
  virtual ~OpProfiler() = default;
  virtual void begin(const std::string& label) = 0;
  virtual void end() = 0;
};

OpProfiler*& op_profiler();  // thread-local; null = off

// Brackets one op when a profiler is installed; label() is called only then. Nested ops (an op
// implemented with other dispatched ops) are left to the profiler (it times the outermost).
class OpProfileScope {
 public:
  template <class F>
  explicit OpProfileScope(F&& label) : p_(op_profiler()) {
    if (p_) p_->begin(label());
  }
  ~OpProfileScope() {
    if (p_) p_->end();
  }
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;

 private:
  OpProfiler* p_;
};

}  // namespace ts::ops
