#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/runtime.h"

namespace ts::cuda {

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

std::string device_description() {
  int dev = 0;
  TS_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return fmt::format("{}, {} SMs, {:.1f} GiB", p.name, p.multiProcessorCount, double(p.totalGlobalMem) / double(1ull << 30));
}

void copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

double time_ms(const std::function<void()>& fn, int iters, int warmup) {
  cudaStream_t s = stream();
  for (int i = 0; i < warmup; ++i) fn();
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < std::max(iters, 1); ++i) {
    TS_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    TS_CUDA_CHECK(cudaEventRecord(b, s));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return double(t[t.size() / 2]);
}

namespace {
std::atomic<bool> g_pdl{true};
std::atomic<bool> g_user_stream_set{false};
cudaStream_t g_user_stream = nullptr;
cudaStream_t g_default_stream = nullptr;
std::once_flag g_default_once;
}  // namespace

cudaStream_t stream() {
  if (g_user_stream_set.load(std::memory_order_acquire)) return g_user_stream;
  std::call_once(g_default_once, [] {
    // Blocking (not cudaStreamNonBlocking): the legacy default stream used by cudaMemcpy
    // synchronises with it, so host copies see finished kernels.
    TS_CUDA_CHECK(cudaStreamCreate(&g_default_stream));
  });
  return g_default_stream;
}

void* stream_handle() { return static_cast<void*>(stream()); }

void set_stream(void* s) {
  g_user_stream = static_cast<cudaStream_t>(s);
  g_user_stream_set.store(s != nullptr, std::memory_order_release);
}

void stream_synchronize() { TS_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void set_pdl_enabled(bool on) { g_pdl.store(on); }
bool pdl_enabled() { return g_pdl.load(); }

bool stream_capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TS_CUDA_CHECK(cudaStreamIsCapturing(stream(), &st));
  return st != cudaStreamCaptureStatusNone;
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    TS_CUDA_CHECK(cudaGetDevice(&dev));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v > 0 ? v : 1;
  }();
  return n;
}

Workspace& workspace(int which) {
  static Workspace ws[4];
  TS_CHECK(which >= 0 && which < 4, "workspace index {}", which);
  return ws[which];
}

void* Workspace::get(size_t bytes) {
  if (bytes <= size) return ptr.get();
  TS_CHECK(!stream_capturing(),
           "CUDA workspace must grow to {} bytes during graph capture; run the shape eagerly first",
           bytes);
  // The old buffer may still be in use by queued kernels, and captured CUDA graphs keep its
  // address: retire it (never freed) instead of freeing it.
  static std::vector<std::shared_ptr<void>> retired;
  if (ptr) retired.push_back(ptr);
  size_t want = bytes < (size_t(1) << 20) ? (size_t(1) << 20) : bytes + bytes / 4;
  ptr = alloc(want);
  size = want;
  return ptr.get();
}

}  // namespace ts::cuda
