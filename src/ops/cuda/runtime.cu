#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/runtime.h"

namespace ts::cuda {

#define TS_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) ::ts::fail("CUDA error {} at {}:{}: {}", int(e_), __FILE__, \
                                      __LINE__, cudaGetErrorString(e_));                 \
  } while (0)

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::shared_ptr<void> alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) TS_CUDA_CHECK(cudaMalloc(&p, bytes));
  return std::shared_ptr<void>(p, [](void* q) { if (q) cudaFree(q); });
}

void memset(void* p, int value, size_t bytes) {
  if (bytes) TS_CUDA_CHECK(cudaMemset(p, value, bytes));
}

void copy(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes) {
  if (!bytes) return;
  cudaMemcpyKind k = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                             : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  TS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, k));
}

void synchronize() { TS_CUDA_CHECK(cudaDeviceSynchronize()); }

size_t free_memory() {
  size_t free = 0, total = 0;
  TS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

size_t total_memory() {
  size_t free = 0, total = 0;
  TS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total;
}

}  // namespace ts::cuda
