#include "core/device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

#ifdef TS_WITH_CUDA
std::shared_ptr<void> device_alloc(size_t bytes) { return cuda::alloc(bytes); }
void device_memset(void* p, int value, size_t bytes) { cuda::memset(p, value, bytes); }
void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  if (dd == Device::cpu && sd == Device::cpu) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  cuda::copy(dst, dd == Device::cuda, src, sd == Device::cuda, bytes);
}
bool cuda_available() { return cuda::device_count() > 0; }
DeviceMemoryStats device_memory_stats() { return cuda::memory_stats(); }
size_t device_empty_cache() { return cuda::empty_cache(); }

StagedUpload::StagedUpload() = default;
StagedUpload::~StagedUpload() {
  if (event_) cuda::event_destroy(event_);
}
void StagedUpload::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  if (event_) cuda::event_synchronize(event_);  // the previous copy has read the staging buffer
  else event_ = cuda::event_create();
  if (bytes > cap_) {
    cap_ = std::max({bytes, cap_ * 2, size_t(64) << 10});  // a few growths at most, then none
    pinned_ = cuda::alloc_host(cap_);
  }
  std::memcpy(pinned_.get(), src, bytes);
  cuda::copy_h2d_async(dst, pinned_.get(), bytes);
  cuda::event_record(event_);
}
std::shared_ptr<void> host_pinned_alloc(size_t bytes) {
  if (cuda_available()) return cuda::alloc_host(bytes);
  void* p = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
  TS_CHECK(p || !bytes, "out of host memory allocating {} bytes", bytes);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
#else
std::shared_ptr<void> device_alloc(size_t) { fail("this build has no CUDA backend (configure with -DTS_CUDA=ON)"); }
void device_memset(void*, int, size_t) { fail("this build has no CUDA backend"); }
void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  TS_CHECK(dd == Device::cpu && sd == Device::cpu, "this build has no CUDA backend");
  if (bytes) std::memcpy(dst, src, bytes);
}
bool cuda_available() { return false; }
DeviceMemoryStats device_memory_stats() { return {}; }
size_t device_empty_cache() { return 0; }
StagedUpload::StagedUpload() = default;
StagedUpload::~StagedUpload() = default;
void StagedUpload::upload(void*, const void*, size_t) { fail("this build has no CUDA backend"); }
std::shared_ptr<void> host_pinned_alloc(size_t bytes) {
  void* p = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
  TS_CHECK(p || !bytes, "out of host memory allocating {} bytes", bytes);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
#endif

}  // namespace ts
