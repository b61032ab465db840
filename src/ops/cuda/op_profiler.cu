#include "ops/cuda/common.cuh"
#include "ops/cuda/op_profiler.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

struct CudaOpProfiler::Impl {
  std::vector<cudaEvent_t> events;  // pool: [2i] start, [2i + 1] end of record i
  std::vector<std::string> labels;  // per record
  int depth = 0;                    // ops dispatched from inside an op are not timed apart
  cudaEvent_t event(size_t i) {
    while (events.size() <= i) {
      cudaEvent_t e;
      TS_CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    return events[i];
  }
};

CudaOpProfiler::CudaOpProfiler() : impl_(std::make_unique<Impl>()) {}

CudaOpProfiler::~CudaOpProfiler() {
  for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
}

void CudaOpProfiler::begin(const std::string& label) {
  if (impl_->depth++ > 0) return;
  TS_CUDA_CHECK(cudaEventRecord(impl_->event(2 * impl_->labels.size()), stream()));
  impl_->labels.push_back(label);
}

void CudaOpProfiler::end() {
  TS_CHECK(impl_->depth > 0, "op profiler: end() without begin()");
  if (--impl_->depth > 0) return;
  TS_CUDA_CHECK(cudaEventRecord(impl_->event(2 * impl_->labels.size() - 1), stream()));
}

OpProfile CudaOpProfiler::collect() {
  TS_CHECK(impl_->depth == 0, "op profiler: collect() inside an op");
  OpProfile p;
  const size_t n = impl_->labels.size();
  if (n == 0) return p;
  TS_CUDA_CHECK(cudaEventSynchronize(impl_->events[2 * n - 1]));
  for (size_t i = 0; i < n; ++i) {
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->events[2 * i], impl_->events[2 * i + 1]));
    auto it = std::find_if(p.ops.begin(), p.ops.end(), [&](const OpTime& o) { return o.label == impl_->labels[i]; });
    if (it == p.ops.end()) {
      p.ops.push_back({impl_->labels[i], 0.0, 0});
      it = p.ops.end() - 1;
    }
    it->ms += ms;
    it->count += 1;
    p.busy_ms += ms;
  }
  float span = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&span, impl_->events[0], impl_->events[2 * n - 1]));
  p.span_ms = span;
  impl_->labels.clear();
  return p;
}

}  // namespace ts::ops::cuda
