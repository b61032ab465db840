// Device memory entry points used by Tensor. Without the CUDA backend they fail loudly.
#pragma once
#include <cstddef>
#include <memory>

#include "core/caching_allocator.h"
#include "core/tensor.h"

namespace ts {
std::shared_ptr<void> device_alloc(size_t bytes);
void device_memset(void* p, int value, size_t bytes);
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
bool cuda_available();  // a CUDA device is present and usable
// The device caching allocator (core/cuda/runtime.h alloc): its counters summed over devices
// (zeros without the CUDA backend), and every cached block back to the driver (bytes freed).
DeviceMemoryStats device_memory_stats();
size_t device_empty_cache();

// Small host->device uploads (per-step batch metadata) without a host stall: the bytes go
// through a pinned staging buffer and an asynchronous copy on the backend's stream, ordered
// before the kernels that read them. The next upload first waits until the previous copy has
// left the staging buffer. Not for use while a stream is being captured into a graph.
class StagedUpload {
 public:
  StagedUpload();
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;
  void upload(void* dev_dst, const void* host_src, size_t bytes);

 private:
  std::shared_ptr<void> pinned_;
  size_t cap_ = 0;
  void* event_ = nullptr;
};
// Host memory that device copies reach by DMA (pinned on CUDA builds with a GPU, else plain
// aligned memory), for buffers copied every step: a fresh pageable buffer costs its page
// faults plus a staged copy each time.
std::shared_ptr<void> host_pinned_alloc(size_t bytes);
}  // namespace ts
