#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "core/cuda/runtime.cuh"
#include "core/cuda/runtime.h"

namespace ts::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {
constexpr int kMaxAllocDevices = 16;

// cudaMalloc / cudaFree on one device, whatever device the calling thread drives.
class CudaBlockSource final : public BlockSource {
 public:
  int dev = 0;
  void* raw_alloc(size_t bytes) override {
    DeviceGuard g(dev);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it, the caller empties its cache and retries
      return nullptr;
    }
    TS_CUDA_CHECK(e);
    return p;
  }
  void raw_free(void* p, size_t) override {
    DeviceGuard g(dev);
    cudaFree(p);
  }

 private:
  struct DeviceGuard {
    int prev = -1;
    explicit DeviceGuard(int d) {
      if (cudaGetDevice(&prev) == cudaSuccess && prev != d) cudaSetDevice(d);
      else prev = -1;
    }
    ~DeviceGuard() {
      if (prev >= 0) cudaSetDevice(prev);
    }
  };
};

struct DeviceCaches {
  CudaBlockSource src[kMaxAllocDevices];
  CachingAllocator cache[kMaxAllocDevices];
  DeviceCaches() {
    for (int d = 0; d < kMaxAllocDevices; ++d) {
      src[d].dev = d;
      cache[d].set_source(&src[d]);
    }
  }
};
// Never destroyed: tensors held by other statics (workspaces, retired buffers) give their blocks
// back during exit, after function-local statics constructed later are gone.
DeviceCaches& caches() {
  static DeviceCaches* c = new DeviceCaches();
  return *c;
}
std::atomic<uint64_t> g_pinned_allocs{0};
}  // namespace

std::shared_ptr<void> alloc(size_t bytes) {
  if (!bytes) return std::shared_ptr<void>(nullptr, [](void*) {});
  const int dev = current_device();
  TS_CHECK(dev < kMaxAllocDevices, "cuda::alloc: device {} (at most {})", dev, kMaxAllocDevices);
  const bool cached = !stream_capturing();
  CachingAllocator& cache = caches().cache[dev];
  const CachingAllocator::Block b = cache.allocate(bytes, cached);
  if (!b.ptr) {
    const DeviceMemoryStats s = cache.stats();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    cudaGetLastError();
    fail("CUDA out of memory on device {}: {} bytes requested; {:.1f} MiB in use by tensors, {:.1f} MiB free of {:.1f} MiB",
         dev, bytes, double(s.bytes_in_use) / (1 << 20), double(free) / (1 << 20), double(total) / (1 << 20));
  }
  // Back to the owning device's cache (the last reference may drop on another GPU's thread).
  return std::shared_ptr<void>(b.ptr, [dev, b, cached](void*) { caches().cache[dev].release(b, cached); });
}

size_t empty_cache() {
  size_t freed = 0;
  for (auto& c : caches().cache) freed += c.empty_cache();
  return freed;
}

DeviceMemoryStats memory_stats() {
  DeviceMemoryStats s;
  for (auto& c : caches().cache) s += c.stats();
  s.pinned_alloc_calls = g_pinned_allocs.load(std::memory_order_relaxed);
  return s;
}

std::shared_ptr<void> alloc_host(size_t bytes) {
  void* p = nullptr;
  if (bytes) TS_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  if (bytes) g_pinned_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<void>(p, [](void* q) {
    if (q) cudaFreeHost(q);
  });
}

void memset(void* p, int value, size_t bytes) {
  if (bytes) TS_CUDA_CHECK(cudaMemset(p, value, bytes));
}

void copy(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes) {
  if (!bytes) return;
  // cudaMemcpyDefault (unified addressing): a pointer on another GPU of this process is fine.
  cudaMemcpyKind k = (dst_dev || src_dev) ? cudaMemcpyDefault : cudaMemcpyHostToHost;
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
  int dev = current_device();
  cudaDeviceProp p;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return fmt::format("{}, {} SMs, {:.1f} GiB", p.name, p.multiProcessorCount, double(p.totalGlobalMem) / double(1ull << 30));
}

void copy_h2d_async(void* dst, const void* src, size_t bytes) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
}
void* event_create() {
  cudaEvent_t e;
  TS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_record(void* ev) { TS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), stream())); }
void event_synchronize(void* ev) { TS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev))); }
void event_destroy(void* ev) { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); }
void* copy_stream_create() {
  cudaStream_t s;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void stream_destroy(void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
static cudaStream_t stream_or_default(void* s) { return s ? static_cast<cudaStream_t>(s) : stream(); }
void copy_async_on(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes) TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_or_default(s)));
}
void event_record_on(void* ev, void* s) { TS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), stream_or_default(s))); }
void stream_wait_event(void* s, void* ev) {
  TS_CUDA_CHECK(cudaStreamWaitEvent(stream_or_default(s), static_cast<cudaEvent_t>(ev), 0));
}
void* event_create_timed() {
  cudaEvent_t e;
  TS_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
bool event_query(void* ev) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
  if (e == cudaErrorNotReady) return false;
  TS_CUDA_CHECK(e);
  return true;
}
float event_elapsed_ms(void* a, void* b) {
  float ms = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)));
  return ms;
}
void stream_synchronize_on(void* s) { TS_CUDA_CHECK(cudaStreamSynchronize(stream_or_default(s))); }

StreamMarks::StreamMarks(int n) : n_(n) {
  TS_CHECK(n >= 1 && n <= 8, "StreamMarks: 1..8 markers (got {})", n);
  for (int i = 0; i < n; ++i) {
    cudaEvent_t e;
    TS_CUDA_CHECK(cudaEventCreate(&e));
    ev_[i] = e;
  }
}
StreamMarks::~StreamMarks() {
  for (int i = 0; i < n_; ++i) cudaEventDestroy(static_cast<cudaEvent_t>(ev_[i]));
}
void StreamMarks::record(int i) { TS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_[i]), stream())); }
void StreamMarks::synchronize(int i) const { TS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev_[i]))); }
float StreamMarks::elapsed_ms(int a, int b) const {
  float ms = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(ev_[a]), static_cast<cudaEvent_t>(ev_[b])));
  return ms;
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
constexpr int kMaxDevices = 16;
// Per thread: the GPU this thread drives (-1: never set, i.e. device 0 — the single-GPU
// behaviour) and an optional caller-chosen stream for it.
thread_local int t_device = -1;
thread_local cudaStream_t t_user_stream = nullptr;
thread_local bool t_user_stream_set = false;
thread_local LaunchConfig t_launch;  // see LaunchConfig (runtime.h)
// Per device: the blocking stream all ops of that GPU launch on, created on first use.
cudaStream_t g_default_stream[kMaxDevices] = {};
std::once_flag g_default_once[kMaxDevices];
}  // namespace

int current_device() { return t_device < 0 ? 0 : t_device; }

void set_device(int dev) {
  int n = device_count();
  TS_CHECK(dev >= 0 && dev < n && dev < kMaxDevices, "cuda::set_device({}): {} GPUs visible", dev, n);
  TS_CUDA_CHECK(cudaSetDevice(dev));
  t_device = dev;
  t_user_stream = nullptr;
  t_user_stream_set = false;
}

cudaStream_t stream() {
  if (t_user_stream_set) return t_user_stream;
  const int dev = current_device();
  std::call_once(g_default_once[dev], [dev] {
    // Blocking (not cudaStreamNonBlocking): the legacy default stream used by cudaMemcpy
    // synchronises with it, so host copies see finished kernels.
    int cur = 0;
    TS_CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != dev) TS_CUDA_CHECK(cudaSetDevice(dev));
    TS_CUDA_CHECK(cudaStreamCreate(&g_default_stream[dev]));
    if (cur != dev) TS_CUDA_CHECK(cudaSetDevice(cur));
  });
  return g_default_stream[dev];
}

void* stream_handle() { return static_cast<void*>(stream()); }

void set_stream(void* s) {
  t_user_stream = static_cast<cudaStream_t>(s);
  t_user_stream_set = s != nullptr;
}

void stream_synchronize() { TS_CUDA_CHECK(cudaStreamSynchronize(stream())); }

LaunchConfig launch_config() { return t_launch; }
void set_launch_config(const LaunchConfig& c) { t_launch = c; }

bool stream_capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TS_CUDA_CHECK(cudaStreamIsCapturing(stream(), &st));
  return st != cudaStreamCaptureStatusNone;
}

int sm_count() {
  static std::atomic<int> n[kMaxDevices] = {};
  const int dev = current_device();
  int v = n[dev].load(std::memory_order_relaxed);
  if (v > 0) return v;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
  v = v > 0 ? v : 1;
  n[dev].store(v, std::memory_order_relaxed);
  return v;
}

Workspace& workspace(int which) {
  // One set per device: each GPU's thread grows and uses only its own.
  static Workspace ws[kMaxDevices][4];
  TS_CHECK(which >= 0 && which < 4, "workspace index {}", which);
  return ws[current_device()][which];
}

HostStaging& host_staging() {
  static HostStaging hs[kMaxDevices];
  return hs[current_device()];
}

void* HostStaging::get(size_t bytes) {
  if (bytes <= size) return ptr.get();
  size = std::max(bytes + bytes / 2, size_t(64) << 10);
  ptr = alloc_host(size);
  return ptr.get();
}

bool once_per_device(std::atomic<uint32_t>& mask) {
  const uint32_t bit = 1u << current_device();
  return (mask.fetch_or(bit) & bit) == 0;
}

void* Workspace::get(size_t bytes) {
  if (bytes <= size) return ptr.get();
  TS_CHECK(!stream_capturing(),
           "CUDA workspace must grow to {} bytes during graph capture; run the shape eagerly first",
           bytes);
  // The old buffer may still be in use by queued kernels, and captured CUDA graphs keep its
  // address: retire it (never freed) instead of freeing it.
  static std::mutex retired_mu;
  static std::vector<std::shared_ptr<void>> retired;
  if (ptr) {
    std::lock_guard<std::mutex> lk(retired_mu);
    retired.push_back(ptr);
  }
  size_t want = bytes < (size_t(1) << 20) ? (size_t(1) << 20) : bytes + bytes / 4;
  ptr = alloc(want);
  size = want;
  return ptr.get();
}

}  // namespace ts::cuda
