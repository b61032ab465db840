// Shared pieces of the CUDA backend (nvcc only): error checks, the current stream, PDL launch,
// bf16 vector helpers and warp reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"
#include "core/cuda/runtime.cuh"

namespace ts::cuda {

// Launches kernel on the current stream; with pdl (and PDL on in this thread's LaunchConfig,
// core/cuda/runtime.h) the launch may overlap the previous kernel's tail, so the kernel must call pdl_wait() before touching global memory.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, bool pdl,
            Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cudaLaunchAttribute attr[1];
  if (pdl && launch_config().pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  TS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Opts a kernel into more than 48 KB of dynamic shared memory (once per kernel and size).
template <typename K>
void set_smem(K* kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(bytes)));
}

// ---- host-side argument checks --------------------------------------------------------------
inline void check_dev(const Tensor& t, DType dt, const char* what) {
  TS_CHECK(t.device == Device::cuda, "cuda op: {} must be on the GPU", what);
  TS_CHECK(t.dtype == dt, "cuda op: {} must be {}, got {}", what, dtype_name(dt),
           dtype_name(t.dtype));
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// Rows of n bf16 with row stride ld (elements) can be moved as 16-byte vectors.
inline bool vec8_ok(const void* p, int64_t n, int64_t ld) {
  return aligned16(p) && n % 8 == 0 && ld % 8 == 0;
}
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- device helpers -------------------------------------------------------------------------
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `red` is 32 floats of shared memory; safe to call repeatedly.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.0f;
  return warp_sum(v);
}

// 8 bf16 as one 16-byte vector.
struct BF8 {
  uint4 u;
  __device__ __forceinline__ __nv_bfloat162* h2() { return reinterpret_cast<__nv_bfloat162*>(&u); }
  __device__ __forceinline__ const __nv_bfloat162* h2() const {
    return reinterpret_cast<const __nv_bfloat162*>(&u);
  }
};
__device__ __forceinline__ void bf8_to_f32(const BF8& v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(v.h2()[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ BF8 f32_to_bf8(const float* f) {
  BF8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h2()[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// Device copy of ts::ops::sampling_uniform (ops.h): must stay bit-identical to it.
__host__ __device__ __forceinline__ float uniform_draw(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ts::cuda
