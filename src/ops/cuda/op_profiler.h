// The CUDA op profiler (see ops/op_profile.h): one event pair per outermost dispatched op on
// the current stream; collect() waits for them and sums device milliseconds per label. No CUDA
// headers here (included from host .cpp files).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "ops/op_profile.h"

namespace ts::ops::cuda {

struct OpTime {
  std::string label;
  double ms = 0;  // summed device time
  int count = 0;
};

struct OpProfile {
  std::vector<OpTime> ops;  // first-seen order
  double busy_ms = 0;       // sum over ops
  double span_ms = 0;       // first op's start to last op's end (busy + gaps between ops)
};

class CudaOpProfiler final : public OpProfiler {
 public:
  CudaOpProfiler();
  ~CudaOpProfiler() override;
  void begin(const std::string& label) override;
  void end() override;
  // Waits for the recorded ops and returns their times; the profiler is then empty again.
  OpProfile collect();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::ops::cuda
