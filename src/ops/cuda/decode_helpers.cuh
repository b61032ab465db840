// Device helpers shared by the unfused kernels and the #22 decode fusions (fused.cu), so both
// round exactly alike (the fusions are tested bit for bit against the chains they replace):
//  - ld_stream16 / dot8_bf16: the small-M GEMV's 16-byte streaming weight load (no L1
//    allocation: each weight is read once) and its 8-element bf16 dot in a fixed order
//    (linear.cu's GEMV, fused.cu's fused GEMVs);
//  - rms_norm_rows_to_smem: the decode GEMVs' RMSNorm prologue (fused.cu's bf16 GEMVs,
//    quant_linear.cu's tensor-core W8A16 GEMV);
//  - head_norm_rope: one warp's optional per-head RMSNorm + rotary of a q/k head
//    (norm.cu's qk_rope_kernel, fused.cu's rope_kv_write_kernel).
#pragma once
#include "ops/cuda/common.cuh"

namespace ts::ops::cuda {

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8_bf16(const uint4& a, const uint4& b) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// The decode GEMVs' norm prologue (fused.cu, quant_linear.cu's tensor-core W8A16 GEMV): rows
// [0, M) of x (bf16 [M, K], row stride x_ld, 16-byte aligned rows, K % 8 == 0) RMS-normalised and
// times w into xs (shared memory, [M, K] contiguous) with rmsnorm_kernel's arithmetic (ss in fp32,
// f * inv * w rounded to bf16; only the order of the sum of squares differs: the block size).
// Every thread of the block calls it (block_sum); red: 32 floats of shared memory. Ends with
// __syncthreads (xs is complete).
__device__ __forceinline__ void rms_norm_rows_to_smem(const __nv_bfloat16* x, int64_t x_ld, int M, int K,
                                                      const __nv_bfloat16* w, float eps, __nv_bfloat16* xs,
                                                      float* red) {
  const int nv = K / 8;
  for (int m = 0; m < M; ++m) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + m * x_ld);
    float ss = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      ::ts::cuda::BF8 v;
      v.u = xr[i];
      float f[8];
      ::ts::cuda::bf8_to_f32(v, f);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += f[k] * f[k];
    }
    ss = ::ts::cuda::block_sum(ss, red);
    const float inv = rsqrtf(ss / float(K) + eps);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      ::ts::cuda::BF8 v, g;
      v.u = xr[i];
      g.u = reinterpret_cast<const uint4*>(w)[i];
      float f[8], gf[8];
      ::ts::cuda::bf8_to_f32(v, f);
      ::ts::cuda::bf8_to_f32(g, gf);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = f[k] * inv * gf[k];
      reinterpret_cast<uint4*>(xs + int64_t(m) * K)[i] = ::ts::cuda::f32_to_bf8(f).u;
    }
  }
  __syncthreads();
}

// One warp, one head p[0, hd) (bf16): NORM: x * rsqrt(mean(x^2) + eps) * w; then rotary on the
// first rot features at position ps (cos_sin row ps of [max_pos, rot]: cos halves then sin
// halves; neox halves or interleaved pairs; positions outside [0, max_pos) or rot == 0: none).
// buf: hd floats of shared memory for this warp. Calls put(i, value) for every feature i (the
// caller rounds and stores; p may be overwritten in place: every read of p happens before).
template <bool NORM, class Put>
__device__ __forceinline__ void head_norm_rope(const __nv_bfloat16* p, const __nv_bfloat16* w, int hd, float eps,
                                               float* buf, int ps, const float* __restrict__ cs, int max_pos, int rot,
                                               int interleaved, int lane, Put put) {
  float scale = 1.0f;
  if (NORM) {
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
      float f = __bfloat162float(p[i]);
      ss += f * f;
    }
    ss = ::ts::cuda::warp_sum(ss);
    scale = rsqrtf(ss / float(hd) + eps);
  }
  for (int i = lane; i < hd; i += 32) {
    float f = __bfloat162float(p[i]) * scale;
    if (NORM) f *= __bfloat162float(w[i]);
    buf[i] = f;
  }
  __syncwarp();
  const bool rotate = ps >= 0 && ps < max_pos && rot > 0;
  const float* c = cs + int64_t(rotate ? ps : 0) * rot;
  const float* s = c + rot / 2;
  const int half = rot / 2;
  for (int i = lane; i < hd; i += 32) {
    float v = buf[i];
    if (rotate && i < rot) {
      if (!interleaved) {
        if (i < half) v = buf[i] * c[i] - buf[i + half] * s[i];
        else v = buf[i] * c[i - half] + buf[i - half] * s[i - half];
      } else {
        const int j = i >> 1;
        if ((i & 1) == 0) v = buf[i] * c[j] - buf[i + 1] * s[j];
        else v = buf[i] * c[j] + buf[i - 1] * s[j];
      }
    }
    put(i, v);
  }
}

}  // namespace ts::ops::cuda
