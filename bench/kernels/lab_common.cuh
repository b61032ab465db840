// Kernel-lab helpers (llm.c dev/cuda style): random device data, CPU-reference checks, CUDA-event
// timing (warm-up, median of many), and the measured device-to-device copy ceiling.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace lab {
using ts::Tensor;
using ts::DType;
using ts::Device;

inline std::mt19937& rng() {
  static std::mt19937 r(7);
  return r;
}

// Host f32 values (bf16-representable) and their bf16 device copy.
struct Pair {
  Tensor h, d;
};
inline Pair rand_pair(std::vector<int64_t> shape, float scale = 1.0f) {
  Pair p;
  p.h = Tensor::empty(shape, DType::f32);
  Tensor b = Tensor::empty(shape, DType::bf16);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < p.h.numel(); ++i) {
    float v = dist(rng());
    if (v == 0.0f) v = scale / 2;
    uint16_t u = ts::f32_to_bf16(v);
    b.ptr<uint16_t>()[i] = u;
    p.h.ptr<float>()[i] = ts::bf16_to_f32(u);
  }
  p.d = b.to(Device::cuda);
  return p;
}
// Large device buffer of random bf16 without a host mirror (for timing only).
inline Tensor rand_dev(std::vector<int64_t> shape) {
  Tensor b = Tensor::empty(shape, DType::bf16);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < b.numel(); ++i) b.ptr<uint16_t>()[i] = ts::f32_to_bf16(dist(rng()) + 1e-3f);
  return b.to(Device::cuda);
}

inline double rel_err(const Tensor& got_dev_bf16, const Tensor& ref_host_f32) {
  ts::cuda::synchronize();
  Tensor g = got_dev_bf16.to(Device::cpu).to_f32();
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    double a = g.ptr<float>()[i], b = ref_host_f32.ptr<float>()[i];
    if (std::isnan(a)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline const char* verdict(double e) { return e < 1e-2 ? "OK" : "FAIL"; }

// Median time in microseconds of fn() over iters runs (after warm-up), each timed with events.
inline double time_us(const std::function<void()>& fn, int iters = 50, int warmup = 5) {
  cudaStream_t s = ts::cuda::stream();
  for (int i = 0; i < warmup; ++i) fn();
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    TS_CUDA_CHECK(cudaEventRecord(b, s));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device-to-device copy ceiling in GB/s (bytes read + bytes written), 512 MB buffers.
inline double copy_ceiling_gbs() {
  const size_t bytes = size_t(512) << 20;
  auto src = ts::cuda::alloc(bytes), dst = ts::cuda::alloc(bytes);
  TS_CUDA_CHECK(cudaMemset(src.get(), 1, bytes));
  double us = time_us([&] {
    TS_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice,
                                  ts::cuda::stream()));
  }, 20, 3);
  double gbs = 2.0 * double(bytes) / (us * 1e3);
  std::printf("device-to-device copy ceiling: %.0f GB/s (512 MB, read + write)\n", gbs);
  return gbs;
}

// bf16 GEMM ceiling in TFLOP/s: our cuBLASLt linear at 8192^3 on random data.
inline double gemm_ceiling_tflops() {
  const int64_t n = 8192;
  Tensor a = rand_dev({n, n}), b = rand_dev({n, n});
  Tensor c = Tensor::empty({n, n}, DType::bf16, Device::cuda);
  const double us = time_us([&] { ts::ops::cuda::linear(a, b, c, nullptr, {}); }, 10, 3);
  const double tf = 2.0 * double(n) * double(n) * double(n) / (us * 1e6);
  std::printf("bf16 GEMM ceiling: %.1f TFLOP/s (8192^3)\n", tf);
  return tf;
}

inline bool have_gpu() {
  if (!ts::cuda_available()) {
    std::printf("no CUDA device: lab skipped\n");
    return false;
  }
  cudaDeviceProp p;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
  return true;
}

}  // namespace lab
