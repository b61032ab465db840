// Hardware ceilings measured in the same run as a benchmark, so every figure can be stated as a
// share of what this machine can do:
//  - copy bandwidth: one large device-to-device copy (CUDA: cudaMemcpyAsync timed with events;
//    CPU: memcpy split over the OpenMP threads), counted as bytes read + bytes written;
//  - GEMM throughput: our ops::linear (CUDA: bf16 cuBLASLt; CPU: our f32 GEMM) on random data,
//    2*M*N*K flops per call.
// Both report the median of several timed calls after warm-up.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace ts::bench {

struct Ceilings {
  Device device = Device::cpu;
  std::string device_desc;
  double copy_gbs = 0;  // GB/s, read + write
  size_t copy_bytes = 0;
  int copy_iters = 0;
  double gemm_tflops = 0;
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
  DType gemm_dtype = DType::f32;
  int gemm_iters = 0;
};

double measure_copy_gbs(Device d, size_t bytes, int iters);
double measure_gemm_tflops(Device d, int64_t m, int64_t n, int64_t k, int iters);
// gemm_size / copy_bytes 0: defaults (CUDA 8192^3 and 1 GiB; CPU 1024^3 and 256 MiB).
Ceilings measure_ceilings(Device d, int64_t gemm_size = 0, size_t copy_bytes = 0);

// Seconds of wall time for fn(), with the device synchronised before and after.
double time_region_s(Device d, const std::function<void()>& fn);
void device_sync(Device d);

}  // namespace ts::bench
