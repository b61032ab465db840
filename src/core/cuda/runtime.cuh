// The nvcc-only half of the CUDA runtime wrapper (core/cuda/runtime.h is the half plain C++
// sees): the error check, the typed current stream, SM count and the per-device scratch
// workspaces. The kernels (ops/cuda/common.cuh) build on it; it depends on nothing above core.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/error.h"
#include "core/cuda/runtime.h"

#define TS_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) ::ts::fail("CUDA error {} at {}:{}: {}", int(e_), __FILE__, \
                                      __LINE__, cudaGetErrorString(e_));                 \
  } while (0)

namespace ts::cuda {

cudaStream_t stream();
bool stream_capturing();
int sm_count();

// A grow-only device scratch buffer (split-KV partials, sampling scratch). Growing is refused
// while the stream is being captured into a graph.
struct Workspace {
  std::shared_ptr<void> ptr;
  size_t size = 0;
  void* get(size_t bytes);
};
Workspace& workspace(int which);  // per device; 0: attention, 1: sampling, 2-3: spare
// A grow-only pinned host buffer per device, for ops that stage a few bytes to and from the
// device and synchronise before they return (so the next call may reuse it): a fresh pageable
// vector per call is a heap allocation plus a staged copy each way.
struct HostStaging {
  std::shared_ptr<void> ptr;
  size_t size = 0;
  void* get(size_t bytes);
};
HostStaging& host_staging();
// True the first time it is called for the current device with this mask (one bit per device):
// for per-device one-time setup such as cudaFuncSetAttribute.
bool once_per_device(std::atomic<uint32_t>& mask);

}  // namespace ts::cuda
