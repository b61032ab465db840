// Linears over FP8 (e4m3) weights kept as stored: W8A16 GEMV for decode, dequantized bf16 row
// tiles + cuBLASLt for prefill (ops/cuda/quant_linear.h).
// The GEMVs' inner row dot products (and the in-register dequantization) are in quant_dot.cuh,
// shared with the routed experts kept as stored (moe.cu).
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/quant_dot.cuh"
#include "ops/cuda/quant_linear.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;
using namespace qdot;

namespace {

// Auto policy. The CUDA-core GEMV spends ~32 ops per 16 weights per row (FMA + bf16 unpack) on
// top of ~11 to unpack the weights, so past one row it is compute-bound; the tensor-core kernel
// (mma) unpacks once for all rows. H200 lab (2026-12-02, block-128, copy 4.2 TB/s): M=1 GEMV
// 46-72% of copy, 1.36-1.49x bf16; 8B decode bs1 284 vs 215 tok/s, bs8 1919 vs 1515 (mma), but
// bs32/64 mma is 0.41-0.57x bf16 and the tiles (prefill) 0.56-0.64x: the mma kernel still
// reloads x from L1 per 8-row tile (next: x in shared memory), prefill wants an FP8 GEMM.
constexpr int kQuantGemvAutoM = 1;   // GEMV up to here (H200 lab: M=2 is slower than M=4)
constexpr int kQuantMmaAutoM = 64;   // then mma (k blocks >= 64)
constexpr int kQuantGemvMaxM = 8;    // else GEMV up to here, then dequantized tiles
constexpr int kQuantGemvMaxForced = 16;
constexpr int kQWarps = 8;   // one output feature per warp
// W8A8 (fp8gemm) from kW8A8MinRows rows on (ops/linear_weight.h), where the weight and checkpoint
// allow it (see fp8_gemm_applies): the FP8 tensor cores run at twice the bf16 rate and read 1 byte
// per weight, against the dequantized tiles' extra pass over W per step.
constexpr int64_t kFp8GemmAutoM = kW8A8MinRows;
// See fp8_gemm_automatic() in quant_linear.h.
constexpr bool kFp8GemmAuto = true;
// cuBLASLt's scale-tensor orders for BLK128x128 (weights) and VEC128 (activations): checked by
// bench/kernels/fp8_gemm_lab.cu against the CPU on the H200.
constexpr Fp8ScaleOrder kFp8Order{};
constexpr size_t kDequantScratch = size_t(64) << 20;

__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

// out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for the M rows of x; one warp per n, each lane
// streaming 16 weights (one 16-byte load) at a time; the 16 always share one scale (blocks are
// powers of two >= 16). Requires K % 16 == 0, 16-byte aligned rows of x (bf16) and w (fp8).
template <int M, typename OutT>
__global__ void __launch_bounds__(kQWarps * 32)
fp8_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, const uint8_t* __restrict__ w, int64_t w_ld,
                const float* __restrict__ sc, int64_t s_ld, int bn_log2, int bk_log2,
                const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ out, int64_t out_ld, int N, int K) {
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kQWarps + warp;
  if (n >= N) return;
  const uint8_t* wr = w + n * w_ld;
  const float* sr = sc + (n >> bn_log2) * s_ld;
  const __nv_bfloat16* xr[M];
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    xr[m] = x + m * x_ld;
    acc[m] = 0.0f;
  }
  fp8_row_dot<M>(wr, sr, bk_log2, K, xr, acc, lane);
  pdl_trigger();
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias ? __bfloat162float(bias[n]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) store_out(out + m * out_ld + n, acc[m] + b);
  }
}

template <int M, typename OutT>
void gemv_launch(const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  const int N = int(w.size(0)), K = int(w.size(1));
  launch(fp8_gemv_kernel<M, OutT>, dim3(unsigned(ceil_div(N, kQWarps))), dim3(kQWarps * 32), 0, true,
         x.ptr<__nv_bfloat16>(), x.row_stride(), w.ptr<uint8_t>(), w.row_stride(), w.quant.scale.ptr<float>(),
         w.quant.scale.size(1), w.quant.block_n_log2, w.quant.block_k_log2, bias, out, out_ld, N, K);
}

template <typename OutT>
void gemv(int M, const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  switch (M) {
#define TS_QCASE(m) \
  case m: gemv_launch<m, OutT>(x, w, bias, out, out_ld); break;
    TS_QCASE(1) TS_QCASE(2) TS_QCASE(3) TS_QCASE(4) TS_QCASE(5) TS_QCASE(6) TS_QCASE(7) TS_QCASE(8)
    TS_QCASE(9) TS_QCASE(10) TS_QCASE(11) TS_QCASE(12) TS_QCASE(13) TS_QCASE(14) TS_QCASE(15) TS_QCASE(16)
#undef TS_QCASE
    default: fail("fp8 gemv: M {} > {}", M, kQuantGemvMaxForced);
  }
}

// ---- NVFP4 (W4A16) ------------------------------------------------------------------------------
constexpr int kFp4GemvAutoM = 4;

// As fp8_gemv_kernel, 32 values (16 bytes, two E4M3 block scales) per lane load.
template <int M, typename OutT>
__global__ void __launch_bounds__(kQWarps * 32)
fp4_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, const uint8_t* __restrict__ w, int64_t w_ld,
                const uint8_t* __restrict__ sc, int64_t s_ld, const float* __restrict__ s2,
                const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ out, int64_t out_ld, int N, int K) {
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kQWarps + warp;
  if (n >= N) return;
  const uint8_t* wr = w + n * w_ld;
  const uint8_t* sr = sc + n * s_ld;
  const __nv_bfloat16* xr[M];
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    xr[m] = x + m * x_ld;
    acc[m] = 0.0f;
  }
  fp4_row_dot<M>(wr, sr, K, xr, acc, lane);
  pdl_trigger();
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias ? __bfloat162float(bias[n]) : 0.0f, g = s2[n];
#pragma unroll
    for (int m = 0; m < M; ++m) store_out(out + m * out_ld + n, acc[m] * g + b);
  }
}

template <int M, typename OutT>
void fp4_gemv_launch(const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  const int N = int(w.size(0)), K = int(w.in_features());
  launch(fp4_gemv_kernel<M, OutT>, dim3(unsigned(ceil_div(N, kQWarps))), dim3(kQWarps * 32), 0, true,
         x.ptr<__nv_bfloat16>(), x.row_stride(), w.ptr<uint8_t>(), w.row_stride(), w.quant.scale.ptr<uint8_t>(),
         w.quant.scale.row_stride(), w.quant.scale2.ptr<float>(), bias, out, out_ld, N, K);
}

template <typename OutT>
void fp4_gemv(int M, const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  switch (M) {
#define TS_QCASE(m) \
  case m: fp4_gemv_launch<m, OutT>(x, w, bias, out, out_ld); break;
    TS_QCASE(1) TS_QCASE(2) TS_QCASE(3) TS_QCASE(4) TS_QCASE(5) TS_QCASE(6) TS_QCASE(7) TS_QCASE(8)
    TS_QCASE(9) TS_QCASE(10) TS_QCASE(11) TS_QCASE(12) TS_QCASE(13) TS_QCASE(14) TS_QCASE(15) TS_QCASE(16)
#undef TS_QCASE
    default: fail("nvfp4 gemv: M {} > {}", M, kQuantGemvMaxForced);
  }
}

// out [rows, K] bf16 = rows [row0, row0 + rows) of an NVFP4 W; one thread per 32 values.
__global__ void fp4_dequant_kernel(const uint8_t* __restrict__ w, int64_t w_ld, const uint8_t* __restrict__ sc,
                                   int64_t s_ld, const float* __restrict__ s2, int64_t row0, int64_t rows, int K,
                                   __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ goff, int64_t grows) {
  pdl_wait();
  const int64_t nv = K / 32;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * nv) return;
  const int64_t r = idx / nv, c = idx % nv, n = row0 + r;
  if (goff && goff[n / grows + 1] == goff[n / grows]) return;
  const uint4 v = ld_stream(w + n * w_ld + c * 16);
  const uint32_t sv = reinterpret_cast<const unsigned short*>(sc + n * s_ld)[c];
  const float sa = e4m3_value(sv & 0xffu), sb = e4m3_value(sv >> 8), g = s2[n];
  const uint32_t ww[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[16];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float s = q < 2 ? sa : sb;
    // (e2m1 x block scale) x global scale: the CPU oracle's order, so the same rounding.
    const float f[8] = {e2m1_scaled<0>(ww[q]), e2m1_scaled<1>(ww[q]), e2m1_scaled<2>(ww[q]), e2m1_scaled<3>(ww[q]),
                        e2m1_scaled<4>(ww[q]), e2m1_scaled<5>(ww[q]), e2m1_scaled<6>(ww[q]), e2m1_scaled<7>(ww[q])};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * j] * 0x1p126f * s * g, f[2 * j + 1] * 0x1p126f * s * g);
      o[4 * q + j] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
  pdl_trigger();
  uint4* op = reinterpret_cast<uint4*>(out + r * K + c * 32);
#pragma unroll
  for (int j = 0; j < 4; ++j) op[j] = make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
}

// ---- tensor-core W8A16 for small batches (M <= 8 * kMmaMaxTiles) --------------------------------
// Block = 16 output features x all M rows of x; its 8 warps split K in interleaved 64-wide chunks
// (adjacent warps read adjacent 64 bytes of each weight row) and reduce through shared memory.
// Per chunk a lane (g = lane / 4, t = lane % 4) loads 16 weights of rows g and g + 8 (two 16-byte
// loads) and, per 8-row tile of x, 16 values of row g of the tile; k is permuted the same way for
// A and B: MMA step s takes the lane's elements 4s..4s+3 as logical k (2t, 2t+1 | 2t+8, 2t+9).
// Weights become bf16 exactly (the bit move gives e4m3 x 2^-120, one bf16x2 multiply by 2^120
// restores it, subnormals included); each chunk lies inside one k block (2^bk >= 64), so its
// partial product takes the row's block scale once.
constexpr int kMmaWarps = 8;
constexpr int kMmaMaxTiles = 8;

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Bytes (sel: 0x1404 -> bytes 0, 1; 0x3424 -> bytes 2, 3) of v as bf16x2, exact.
template <uint32_t Sel>
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v) {
  const uint32_t t = __byte_perm(v, 0u, Sel);  // the two bytes in bits 8..15 and 24..31
  const uint32_t r = (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);  // e4m3 x 2^-120
  __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&r);
  h = __hmul2(h, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int MT, typename OutT>
__global__ void __launch_bounds__(kMmaWarps * 32)
fp8_mma_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, int M, const uint8_t* __restrict__ w,
               int64_t w_ld, const float* __restrict__ sc, int64_t s_ld, int bn_log2, int bk_log2,
               const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ out, int64_t out_ld, int N, int K) {
  __shared__ float red[kMmaWarps][MT][4][32];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const int64_t r_lo = n0 + g, r_hi = n0 + g + 8;
  const bool ok_lo = r_lo < N, ok_hi = r_hi < N;
  const uint8_t* w_lo = w + (ok_lo ? r_lo : 0) * w_ld;
  const uint8_t* w_hi = w + (ok_hi ? r_hi : 0) * w_ld;
  const float* s_lo = sc + ((ok_lo ? r_lo : 0) >> bn_log2) * s_ld;
  const float* s_hi = sc + ((ok_hi ? r_hi : 0) >> bn_log2) * s_ld;
  float acc[MT][4];
#pragma unroll
  for (int T = 0; T < MT; ++T)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[T][r] = 0.0f;
  const int nchunks = (K + 63) / 64;
  for (int c = warp; c < nchunks; c += kMmaWarps) {
    const int kt = c * 64 + t * 16;  // this lane's 16 values
    const bool kin = kt < K;
    const uint4 wl = kin && ok_lo ? ld_stream(w_lo + kt) : make_uint4(0, 0, 0, 0);
    const uint4 wh = kin && ok_hi ? ld_stream(w_hi + kt) : make_uint4(0, 0, 0, 0);
    const float sl = ok_lo ? __ldg(s_lo + ((c * 64) >> bk_log2)) : 0.0f;
    const float sh = ok_hi ? __ldg(s_hi + ((c * 64) >> bk_log2)) : 0.0f;
    const uint32_t wlw[4] = {wl.x, wl.y, wl.z, wl.w}, whw[4] = {wh.x, wh.y, wh.z, wh.w};
    uint32_t a[4][4];
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      a[st][0] = e4m3x2_bf16x2<0x1404>(wlw[st]);
      a[st][1] = e4m3x2_bf16x2<0x1404>(whw[st]);
      a[st][2] = e4m3x2_bf16x2<0x3424>(wlw[st]);
      a[st][3] = e4m3x2_bf16x2<0x3424>(whw[st]);
    }
#pragma unroll
    for (int T = 0; T < MT; ++T) {
      const int row = T * 8 + g;
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
      if (kin && row < M) {
        const uint4* xp = reinterpret_cast<const uint4*>(x + row * x_ld + kt);
        x0 = xp[0];
        x1 = xp[1];
      }
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int st = 0; st < 4; ++st) mma_bf16(p, a[st][0], a[st][1], a[st][2], a[st][3], xw[2 * st], xw[2 * st + 1]);
      acc[T][0] = fmaf(p[0], sl, acc[T][0]);
      acc[T][1] = fmaf(p[1], sl, acc[T][1]);
      acc[T][2] = fmaf(p[2], sh, acc[T][2]);
      acc[T][3] = fmaf(p[3], sh, acc[T][3]);
    }
  }
  pdl_trigger();
#pragma unroll
  for (int T = 0; T < MT; ++T)
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][T][r][lane] = acc[T][r];
  __syncthreads();
  // C fragment: r 0, 1 -> feature g, tokens 2t, 2t + 1; r 2, 3 -> feature g + 8.
  for (int i = threadIdx.x; i < MT * 4 * 32; i += kMmaWarps * 32) {
    const int T = i / 128, r = (i / 32) % 4, l = i % 32;
    const int64_t n = n0 + (l >> 2) + (r >= 2 ? 8 : 0);
    const int m = T * 8 + 2 * (l & 3) + (r & 1);
    if (n >= N || m >= M) continue;
    float v = bias ? __bfloat162float(bias[n]) : 0.0f;
#pragma unroll
    for (int ww = 0; ww < kMmaWarps; ++ww) v += red[ww][T][r][l];
    store_out(out + m * out_ld + n, v);
  }
}

template <int MT, typename OutT>
void mma_launch(const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  const int N = int(w.size(0)), K = int(w.size(1));
  launch(fp8_mma_kernel<MT, OutT>, dim3(unsigned(ceil_div(N, 16))), dim3(kMmaWarps * 32), 0, true,
         x.ptr<__nv_bfloat16>(), x.row_stride(), int(x.rows()), w.ptr<uint8_t>(), w.row_stride(),
         w.quant.scale.ptr<float>(), w.quant.scale.size(1), w.quant.block_n_log2, w.quant.block_k_log2, bias, out,
         out_ld, N, K);
}

template <typename OutT>
void mma(const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  switch ((x.rows() + 7) / 8) {
#define TS_QCASE(t) \
  case t: mma_launch<t, OutT>(x, w, bias, out, out_ld); break;
    TS_QCASE(1) TS_QCASE(2) TS_QCASE(3) TS_QCASE(4) TS_QCASE(5) TS_QCASE(6) TS_QCASE(7) TS_QCASE(8)
#undef TS_QCASE
    default: fail("fp8 mma: M {} > {}", x.rows(), 8 * kMmaMaxTiles);
  }
}

// out [rows, K] bf16 = rows [row0, row0 + rows) of W dequantized; one thread per 16 values.
__global__ void fp8_dequant_kernel(const uint8_t* __restrict__ w, int64_t w_ld, const float* __restrict__ sc,
                                   int64_t s_ld, int bn_log2, int bk_log2, int64_t row0, int64_t rows, int K,
                                   __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ goff, int64_t grows) {
  pdl_wait();
  const int64_t nv = K / 16;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * nv) return;
  const int64_t r = idx / nv, c = idx % nv, n = row0 + r;
  if (goff && goff[n / grows + 1] == goff[n / grows]) return;
  const uint4 v = ld_stream(w + n * w_ld + c * 16);
  const float s = sc[(n >> bn_log2) * s_ld + ((c * 16) >> bk_log2)] * 0x1p60f;
  const uint32_t ww[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[8];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // (w 2^-120 x 2^60) x (s 2^60): neither factor overflows for any f32 scale below 2^68.
    __nv_bfloat162 lo = __floats2bfloat162_rn(e4m3_scaled<0>(ww[q]) * 0x1p60f * s, e4m3_scaled<1>(ww[q]) * 0x1p60f * s);
    __nv_bfloat162 hi = __floats2bfloat162_rn(e4m3_scaled<2>(ww[q]) * 0x1p60f * s, e4m3_scaled<3>(ww[q]) * 0x1p60f * s);
    o[2 * q] = *reinterpret_cast<uint32_t*>(&lo);
    o[2 * q + 1] = *reinterpret_cast<uint32_t*>(&hi);
  }
  pdl_trigger();
  uint4* op = reinterpret_cast<uint4*>(out + r * K + c * 16);
  op[0] = make_uint4(o[0], o[1], o[2], o[3]);
  op[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// One warp per (token, 128-channel group), 4 values a lane: amax, scale = amax / 448 (1 for an
// all-zero group), codes e4m3(x / scale) rounded to nearest and saturated. IEEE division on both
// sides, so the codes and scales are bit-equal to ops::cpu::quantize_act_fp8.
// Rows M..rows-1 (padding up to the GEMM's multiple of 4) get zero codes and scale 1.
__global__ void quant_act_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, int64_t M, int64_t rows, int G,
                                 uint8_t* __restrict__ q, float* __restrict__ sc, int64_t s_ld, bool k_major) {
  pdl_wait();
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= rows * G) return;
  const int64_t m = item / G;
  const int g = int(item % G);
  if (m >= M) {
    if (lane == 0) sc[k_major ? m * G + g : int64_t(g) * s_ld + m] = 1.0f;
    *reinterpret_cast<uint32_t*>(q + m * int64_t(G) * 128 + g * 128 + lane * 4) = 0u;
    return;
  }
  const uint2 raw = *reinterpret_cast<const uint2*>(x + m * x_ld + g * 128 + lane * 4);
  const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  const float v[4] = {__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi)};
  float a = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float s = a > 0.0f ? __fdiv_rn(a, 448.0f) : 1.0f;
  pdl_trigger();
  if (lane == 0) sc[k_major ? m * G + g : int64_t(g) * s_ld + m] = s;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed |= uint32_t(__nv_cvt_float_to_fp8(__fdiv_rn(v[i], s), __NV_SATFINITE, __NV_E4M3)) << (8 * i);
  *reinterpret_cast<uint32_t*>(q + m * int64_t(G) * 128 + g * 128 + lane * 4) = packed;
}

void check_weight(const LinearWeight& w) {
  const QuantScales& q = w.quant;
  const Tensor& s = q.scale;
  const int64_t N = w.size(0), K = w.in_features();
  TS_CHECK(N <= 0x7fffffff && K <= 0x7fffffff, "quant_linear: too large");
  TS_CHECK(w.quantized() && w.ndim == 2 && w.device == Device::cuda && s.ndim == 2 && s.is_contiguous() &&
               s.device == Device::cuda,
           "quant_linear: weight must be a quantized [N, K] weight with 2-D scales on the GPU, got {} {}",
           dtype_name(w.dtype), w.shape_str());
  if (q.nvfp4) {
    TS_CHECK(w.dtype == DType::u8 && s.dtype == DType::f8_e4m3 && s.size(0) == N && s.size(1) == K / 16 &&
                 q.scale2.dtype == DType::f32 && q.scale2.numel() == N && q.scale2.device == Device::cuda,
             "quant_linear: NVFP4 weight {} needs E4M3 scales [N, K/16] (got {}) and f32 scale2 [N]", w.shape_str(),
             s.shape_str());
    TS_CHECK(K % 32 == 0 && w.row_stride() % 16 == 0 && aligned16(w.data) && s.row_stride() % 2 == 0,
             "quant_linear: NVFP4 K {} must be a multiple of 32 (16-byte rows)", K);
    return;
  }
  TS_CHECK(w.dtype == DType::f8_e4m3 && s.dtype == DType::f32, "quant_linear: FP8 weight must be f8_e4m3 with f32 scales");
  TS_CHECK(q.block_k_log2 >= 4 && q.block_n_log2 >= 0 && q.block_n_log2 < 31 && q.block_k_log2 < 31,
           "quant_linear: block 2^{} x 2^{} (need k blocks of >= 16)", q.block_n_log2, q.block_k_log2);
  TS_CHECK(s.size(0) == ceil_div(N, int64_t(1) << q.block_n_log2) && s.size(1) == ceil_div(K, int64_t(1) << q.block_k_log2),
           "quant_linear: scales {} for weight {} with blocks 2^{} x 2^{}", s.shape_str(), w.shape_str(), q.block_n_log2,
           q.block_k_log2);
  TS_CHECK(K % 16 == 0 && w.row_stride() % 16 == 0 && aligned16(w.data),
           "quant_linear: K {} and the row stride must be multiples of 16", K);
}

}  // namespace

bool fp8_gemm_applies(const LinearWeight& w) {
  const QuantScales& q = w.quant;
  // (K / 128) % 4: cuBLASLt reads the BLK128x128 scale grid with its k-block dimension padded to
  // a multiple of 4 (as it pads the activations' VEC128 scales: it refuses M % 4 != 0), while
  // the checkpoint's grid is [ceil(N/128), K/128] unpadded; K = 256 read it misaligned (the
  // llama3_fp8 fixture's garbage on the H200). Real checkpoints' K are multiples of 512.
  return w.quantized() && w.ndim == 2 && w8a8_weight_form(q, w.in_features()) && w.row_stride() % 16 == 0 &&
         aligned16(w.data);
}

Fp8ScaleOrder fp8_scale_order() { return kFp8Order; }
bool fp8_gemm_automatic() { return kFp8GemmAuto; }

void quantize_act_fp8(const Tensor& x, Tensor& q, float* scale, int64_t scale_ld, bool k_major) {
  check_dev(x, DType::bf16, "quantize_act_fp8 x");
  const int64_t M = x.rows(), K = x.size(-1);
  TS_CHECK(K % 128 == 0 && x.row_stride() % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 8 == 0,
           "quantize_act_fp8: K {} must be a multiple of 128 with 8-byte aligned rows", K);
  TS_CHECK(q.device == Device::cuda && q.dtype == DType::u8 && q.is_contiguous() && q.numel() % K == 0 &&
               q.numel() >= M * K,
           "quantize_act_fp8: q {} for x {}", q.shape_str(), x.shape_str());
  const int64_t rows = q.numel() / K;  // rows past M: padding (zero codes, scale 1)
  TS_CHECK(k_major || scale_ld >= rows, "quantize_act_fp8: scale ld {} < {} rows", scale_ld, rows);
  const int64_t items = rows * (K / 128);
  if (items == 0) return;
  launch(quant_act_kernel, dim3(unsigned(ceil_div(items * 32, int64_t(256)))), dim3(256), 0, true,
         x.ptr<__nv_bfloat16>(), x.row_stride(), M, rows, int(K / 128), q.ptr<uint8_t>(), scale, scale_ld, k_major);
}

void reserve_quant_scratch(size_t bytes) { workspace(3).get(std::max(kDequantScratch, bytes)); }

constexpr size_t kExpertScratch = size_t(1) << 30;

void reserve_expert_scratch(int64_t experts, size_t per_expert) {
  reserve_quant_scratch(std::max(per_expert, std::min(kExpertScratch, size_t(std::max<int64_t>(experts, 1)) * per_expert)));
}

int64_t expert_chunk(int64_t experts, size_t per_expert) {
  return std::clamp<int64_t>(int64_t(kExpertScratch / std::max<size_t>(per_expert, 1)), 1, std::max<int64_t>(experts, 1));
}

void dequantize_rows(const LinearWeight& w, int64_t row0, int64_t rows, Tensor& out, const int32_t* group_offsets,
                     int64_t group_rows) {
  check_weight(w);
  TS_CHECK(!group_offsets || group_rows > 0, "dequantize_rows: groups of {} rows", group_rows);
  const int64_t K = w.in_features();
  check_dev(out, DType::bf16, "dequantize_rows out");
  TS_CHECK(out.is_contiguous() && out.ndim == 2 && out.size(0) == rows && out.size(1) == K && row0 >= 0 &&
               row0 + rows <= w.size(0),
           "dequantize_rows: rows [{}, +{}) of {} into {}", row0, rows, w.shape_str(), out.shape_str());
  if (w.quant.nvfp4) {
    const int64_t threads = rows * (K / 32);
    if (threads == 0) return;
    launch(fp4_dequant_kernel, dim3(unsigned(ceil_div(threads, 256))), dim3(256), 0, true, w.ptr<uint8_t>(),
           w.row_stride(), w.quant.scale.ptr<uint8_t>(), w.quant.scale.row_stride(), w.quant.scale2.ptr<float>(), row0,
           rows, int(K), out.ptr<__nv_bfloat16>(), group_offsets, group_rows);
    return;
  }
  const int64_t threads = rows * (K / 16);
  if (threads == 0) return;
  launch(fp8_dequant_kernel, dim3(unsigned(ceil_div(threads, 256))), dim3(256), 0, true, w.ptr<uint8_t>(),
         w.row_stride(), w.quant.scale.ptr<float>(), w.quant.scale.size(1), w.quant.block_n_log2,
         w.quant.block_k_log2, row0, rows, int(K), out.ptr<__nv_bfloat16>(), group_offsets, group_rows);
}

void quant_linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias, const KernelPolicy& policy) {
  const QuantKernel k = policy.linear == LinearPath::gemv       ? QuantKernel::gemv
                        : policy.linear == LinearPath::cublaslt ? QuantKernel::tiles
                                                                : QuantKernel::automatic;
  quant_linear_kernel(x, w, out, bias, k);
}

void quant_linear_kernel(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias, QuantKernel kernel) {
  check_weight(w);
  check_dev(x, DType::bf16, "linear x");
  const bool f32out = out.dtype == DType::f32;
  if (!f32out) check_dev(out, DType::bf16, "linear out");
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.in_features() == K && out.rows() == M && out.size(-1) == N, "linear: x {} w {} ({}) out {}", x.shape_str(),
           w.shape_str(), w.quant.format, out.shape_str());
  const __nv_bfloat16* bp = nullptr;
  if (bias && bias->data) {
    check_dev(*bias, DType::bf16, "linear bias");
    TS_CHECK(bias->numel() == N && bias->is_contiguous(), "linear: bias {} for N={}", bias->shape_str(), N);
    bp = bias->ptr<__nv_bfloat16>();
  }
  if (M == 0 || N == 0) return;
  const int64_t ldc = out.row_stride();
  const bool vec_ok = vec8_ok(x.data, K, x.row_stride());
  const bool gemv_ok = vec_ok && M <= kQuantGemvMaxForced;
  if (w.quant.nvfp4) {
    if (kernel == QuantKernel::automatic) kernel = M <= kFp4GemvAutoM ? QuantKernel::gemv : QuantKernel::tiles;
    if (kernel != QuantKernel::tiles && gemv_ok) {  // no tensor-core form yet: mma means the GEMV
      if (f32out) fp4_gemv(int(M), x, w, bp, out.ptr<float>(), ldc);
      else fp4_gemv(int(M), x, w, bp, out.ptr<__nv_bfloat16>(), ldc);
      return;
    }
    kernel = QuantKernel::tiles;
  }
  const bool mma_ok = vec_ok && M <= 8 * kMmaMaxTiles && w.quant.block_k_log2 >= 6;
  const bool fp8_ok = !f32out && fp8_gemm_applies(w) && x.ndim == 2 && out.ndim == 2 && x.row_stride() % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(x.data) % 8 == 0 && (!bp || aligned16(bp));
  if (kernel == QuantKernel::automatic)
    kernel = M <= kQuantGemvAutoM && gemv_ok  ? QuantKernel::gemv
             : kFp8GemmAuto && M >= kFp8GemmAutoM && fp8_ok ? QuantKernel::fp8gemm
             : M <= kQuantMmaAutoM && mma_ok  ? QuantKernel::mma
             : M <= kQuantGemvMaxM && gemv_ok ? QuantKernel::gemv
                                              : QuantKernel::tiles;
  if (kernel == QuantKernel::fp8gemm && fp8_ok) {
    // cuBLASLt's block-scaled FP8 GEMM wants M % 4 == 0 (H200: no algorithm at M = 13): the first
    // M4 rows go straight into out; the last 1-3 rows run as a 4-row GEMM padded with zero rows
    // into scratch and are copied over. Quantized activations, scales and that scratch live in
    // workspace(3) (the tiles' scratch, unused on this path; reserved at load, so a prefill graph
    // capture never grows it).
    const int64_t G = K / 128, M4 = M / 4 * 4, tail = M - M4;
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t q_main = up(size_t(M4 * K)), s_main = up(size_t(G * M4) * 4), q_tail = up(size_t(4 * K)),
                 s_tail = up(size_t(G) * 16), d_tail = up(size_t(4 * N) * 2);
    char* ws = static_cast<char*>(
        workspace(3).get(std::max(kDequantScratch, q_main + s_main + q_tail + s_tail + d_tail)));
    const float* wsc = w.quant.scale.ptr<float>();
    bool done = true;
    if (M4 > 0) {
      Tensor xq = Tensor::from_blob(ws, {M4, K}, DType::u8, Device::cuda);
      float* xs = reinterpret_cast<float*>(ws + q_main);
      quantize_act_fp8(x.slice_rows(0, M4), xq, xs, M4, kFp8Order.act_k_major);
      done = fp8_block_matmul(M4, N, K, xq.data, xs, w.data, w.row_stride(), wsc, bp, out.data, ldc, kFp8Order);
    }
    if (done && tail > 0) {
      char* t = ws + q_main + s_main;
      Tensor xq = Tensor::from_blob(t, {4, K}, DType::u8, Device::cuda);
      float* xs = reinterpret_cast<float*>(t + q_tail);
      void* d = t + q_tail + s_tail;
      quantize_act_fp8(x.slice_rows(M4, M), xq, xs, 4, kFp8Order.act_k_major);
      if (fp8_block_matmul(4, N, K, xq.data, xs, w.data, w.row_stride(), wsc, bp, d, N, kFp8Order)) {
        for (int64_t r = 0; r < tail; ++r)
          ::ts::cuda::copy_async(out.ptr<__nv_bfloat16>() + (M4 + r) * ldc, static_cast<__nv_bfloat16*>(d) + r * N,
                                 size_t(N) * 2);
        return;
      }
      // The tail alone falls back (W8A16 tiles for its rows).
      Tensor xt = x.slice_rows(M4, M), ot = out.slice_rows(M4, M);
      quant_linear_kernel(xt, w, ot, bias, QuantKernel::tiles);
      return;
    }
    if (done) return;
    kernel = QuantKernel::tiles;  // no cuBLASLt algorithm for this shape
  }
  if (kernel == QuantKernel::gemv && gemv_ok) {
    if (f32out) gemv(int(M), x, w, bp, out.ptr<float>(), ldc);
    else gemv(int(M), x, w, bp, out.ptr<__nv_bfloat16>(), ldc);
    return;
  }
  if (kernel == QuantKernel::mma && mma_ok) {
    if (f32out) mma(x, w, bp, out.ptr<float>(), ldc);
    else mma(x, w, bp, out.ptr<__nv_bfloat16>(), ldc);
    return;
  }
  // Prefill: bf16 row tiles of W (at most kDequantScratch bytes, whole scale blocks) through the
  // bf16 GEMM, each writing its column block of out.
  int64_t tile = std::max<int64_t>(128, int64_t(kDequantScratch / size_t(K * 2)) / 128 * 128);
  tile = std::min(tile, N);
  // Always the full size (reserved at load), so a graph capture never has to grow it.
  Tensor scratch = Tensor::from_blob(workspace(3).get(std::max(kDequantScratch, size_t(tile * K) * 2)), {tile, K},
                                     DType::bf16, Device::cuda);
  const KernelPolicy gemm{.linear = LinearPath::cublaslt};
  for (int64_t n0 = 0; n0 < N; n0 += tile) {
    const int64_t nt = std::min(tile, N - n0);
    Tensor wt = scratch.slice_rows(0, nt);
    dequantize_rows(w, n0, nt, wt);
    Tensor ot = out.narrow(out.ndim - 1, n0, nt);
    Tensor bt = bp ? bias->view({N}).narrow(0, n0, nt) : Tensor{};
    linear(x, wt, ot, bp ? &bt : nullptr, gemm);
  }
}

}  // namespace ts::ops::cuda
