#include "bench/ceilings.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/random_fill.h"
#include "ops/ops.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts::bench {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median wall seconds of fn() over iters calls after warmup calls (host work, no device).
double host_median_s(const std::function<void()>& fn, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < std::max(iters, 1); ++i) {
    auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  return median(t);
}

std::string cpu_description() {
  return fmt::format("host CPU, {} OpenMP threads ({} hardware threads)", omp_get_max_threads(),
                     std::thread::hardware_concurrency());
}

}  // namespace

void device_sync(Device d) {
#ifdef TS_WITH_CUDA
  if (d == Device::cuda) cuda::synchronize();
#else
  (void)d;
#endif
}

double time_region_s(Device d, const std::function<void()>& fn) {
  device_sync(d);
  auto a = Clock::now();
  fn();
  device_sync(d);
  return std::chrono::duration<double>(Clock::now() - a).count();
}

double measure_copy_gbs(Device d, size_t bytes, int iters) {
  TS_CHECK(bytes > 0, "copy ceiling: bytes must be > 0");
  if (d == Device::cuda) {
#ifdef TS_WITH_CUDA
    auto src = cuda::alloc(bytes), dst = cuda::alloc(bytes);
    cuda::memset(src.get(), 1, bytes);
    cuda::memset(dst.get(), 0, bytes);
    double ms = cuda::time_ms([&] { cuda::copy_async(dst.get(), src.get(), bytes); }, iters, 3);
    return 2.0 * double(bytes) / (ms * 1e6);
#else
    fail("copy ceiling: this build has no CUDA backend");
#endif
  }
  // CPU: every thread copies its own contiguous slice (first-touched by the same thread).
  std::vector<char> src(bytes), dst(bytes);
  int nt = omp_get_max_threads();
  size_t slice = (bytes + size_t(nt) - 1) / size_t(nt);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < nt; ++t) {
    size_t b = std::min(bytes, size_t(t) * slice), e = std::min(bytes, b + slice);
    std::memset(src.data() + b, 1, e - b);
    std::memset(dst.data() + b, 0, e - b);
  }
  double s = host_median_s(
      [&] {
#pragma omp parallel for schedule(static)
        for (int t = 0; t < nt; ++t) {
          size_t b = std::min(bytes, size_t(t) * slice), e = std::min(bytes, b + slice);
          std::memcpy(dst.data() + b, src.data() + b, e - b);
        }
      },
      iters, 2);
  return 2.0 * double(bytes) / (s * 1e9);
}

double measure_gemm_tflops(Device d, int64_t m, int64_t n, int64_t k, int iters) {
  TS_CHECK(m > 0 && n > 0 && k > 0, "GEMM ceiling: sizes must be > 0");
  DType dt = d == Device::cuda ? DType::bf16 : DType::f32;
  Tensor x = random_normal({m, k}, dt, stream_key(1, "gemm.x"));
  Tensor w = random_normal({n, k}, dt, stream_key(1, "gemm.w"), 0.02f);
  if (d == Device::cuda) {
#ifdef TS_WITH_CUDA
    x = x.to(d);
    w = w.to(d);
    Tensor out = Tensor::empty({m, n}, dt, d);
    double ms = cuda::time_ms([&] { ops::linear(x, w, out); }, iters, 3);
    return 2.0 * double(m) * double(n) * double(k) / (ms * 1e9);
#else
    fail("GEMM ceiling: this build has no CUDA backend");
#endif
  }
  Tensor out = Tensor::empty({m, n}, dt, d);
  double s = host_median_s([&] { ops::linear(x, w, out); }, iters, 1);
  return 2.0 * double(m) * double(n) * double(k) / (s * 1e12);
}

Ceilings measure_ceilings(Device d, int64_t gemm_size, size_t copy_bytes) {
  Ceilings c;
  c.device = d;
  bool gpu = d == Device::cuda;
#ifdef TS_WITH_CUDA
  c.device_desc = gpu ? cuda::device_description() : cpu_description();
#else
  c.device_desc = cpu_description();
#endif
  c.copy_bytes = copy_bytes ? copy_bytes : (gpu ? size_t(1) << 30 : size_t(256) << 20);
  c.copy_iters = gpu ? 20 : 5;
  c.copy_gbs = measure_copy_gbs(d, c.copy_bytes, c.copy_iters);
  int64_t g = gemm_size ? gemm_size : (gpu ? 8192 : 1024);
  c.gemm_m = c.gemm_n = c.gemm_k = g;
  c.gemm_dtype = gpu ? DType::bf16 : DType::f32;
  c.gemm_iters = gpu ? 10 : 3;
  c.gemm_tflops = measure_gemm_tflops(d, g, g, g, c.gemm_iters);
  return c;
}

}  // namespace ts::bench
