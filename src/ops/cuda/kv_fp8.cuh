// The FP8 (e4m3) KV cache's conversions on the device (nvcc only), shared by the cache writers
// (elementwise.cu's kv_write, fused.cu's rope_kv_write) and the attention kernels:
//  - writes: e4m3(x * inv_scale), round to nearest even, saturating at +-448 (cvt.rn.satfinite),
//    as the CPU oracle's f32_to_e4m3 (core/fp8.h) rounds x * (1 / scale);
//  - reads: e4m3 -> f16 exactly, one cvt.rn.f16x2.e4m3x2 per two values (the split-KV decode
//    kernel then runs its MMAs in f16), or e4m3 -> bf16 exactly (a bit move gives e4m3 x 2^-120,
//    subnormals included; one bf16x2 multiply by 2^120 restores it: qdot::e4m3x2_bf16x2; the
//    prefill kernel's MMAs stay bf16). The per-tensor scales are applied in f32 by the kernels
//    (the softmax scale takes k's, the output normalisation v's).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/quant_dot.cuh"

namespace ts::ops::cuda::kvfp8 {

__device__ __forceinline__ uint8_t from_f32(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// 8 bf16 (one 16-byte load) -> 8 e4m3 bytes, each value times inv.
__device__ __forceinline__ uint2 from_bf16x8(const uint4& v, float inv) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    f.x *= inv;
    f.y *= inv;
    w[i] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);  // low byte: f.x
  }
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

__device__ __forceinline__ float to_f32(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// A cache element / 8 consecutive ones from bf16 values: bf16 caches take them as they are, FP8
// ones e4m3(value x inv) (the cache writers' one store rule).
__device__ __forceinline__ void store(__nv_bfloat16* p, __nv_bfloat16 x, float) { *p = x; }
__device__ __forceinline__ void store(uint8_t* p, __nv_bfloat16 x, float inv) { *p = from_f32(__bfloat162float(x) * inv); }
__device__ __forceinline__ void store8(__nv_bfloat16* p, const uint4& x, float) { *reinterpret_cast<uint4*>(p) = x; }
__device__ __forceinline__ void store8(uint8_t* p, const uint4& x, float inv) {
  *reinterpret_cast<uint2*>(p) = from_bf16x8(x, inv);
}

// Two e4m3 (low byte first) -> f16x2, exact (e4m3's range and precision fit f16).
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// 8 e4m3 bytes -> 8 f16 (exact).
__device__ __forceinline__ uint4 to_f16x8(const uint2& v) {
  return make_uint4(e4m3x2_f16x2(v.x), e4m3x2_f16x2(v.x >> 16), e4m3x2_f16x2(v.y), e4m3x2_f16x2(v.y >> 16));
}

// 8 e4m3 bytes -> 8 bf16 (exact).
__device__ __forceinline__ uint4 to_bf16x8(const uint2& v) {
  return make_uint4(qdot::e4m3x2_bf16x2<0x1404>(v.x), qdot::e4m3x2_bf16x2<0x3424>(v.x),
                    qdot::e4m3x2_bf16x2<0x1404>(v.y), qdot::e4m3x2_bf16x2<0x3424>(v.y));
}

}  // namespace ts::ops::cuda::kvfp8
