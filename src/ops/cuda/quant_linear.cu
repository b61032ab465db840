// Linears over FP8 (e4m3) weights kept as stored: W8A16 GEMV for decode, dequantized bf16 row
// tiles + cuBLASLt for prefill (ops/cuda/quant_linear.h).
// The GEMVs' inner row dot products (and the in-register dequantization) are in quant_dot.cuh,
// shared with the routed experts kept as stored (moe.cu).
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_helpers.cuh"
#include "ops/cuda/quant_dot.cuh"
#include "ops/cuda/quant_linear.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;
using namespace qdot;

namespace {

// Auto policy. The tensor-core decode GEMV (tc) for 1..8 rows where it applies (k blocks >= 64,
// K % 64 == 0, bf16 out): as fast as the CUDA-core GEMV at one row and flat to 8 rows (H200 lab
// 2026-12-04, see quant_decode_gemv below). Otherwise: the CUDA-core GEMV at one row (it spends ~32
// ops per 16 weights per row, so past one row it is compute-bound), W8A8 (fp8gemm) from
// kFp8GemmAutoM rows, the tensor-core mma kernel to 64 rows, the dequantized tiles above.
// H200 lab (2026-12-02): mma at bs32/64 is 0.41-0.57x bf16 (it reloads x from L1 per 8-row tile).
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
// NVFP4 takes the tensor-core decode GEMV from 2 rows (and the decode fusions with it, fused.cu):
// H200 lab 2026-12-04, Llama-3.1-8B shapes, tc vs this GEMV: M=1 81.0 vs 80.7 us per layer (qkv
// 10.4 vs 13.1, gate_up 37.8 vs 36.7, down 23.5 vs 22.4, o 9.3 vs 8.5) and 8B bs1 decode 257 vs
// 277 tok/s through the fused flow; M=2 per layer 81 vs 140 us, M=8 84 vs 458 us (8B bs8 1685 vs
// 512 tok/s).
constexpr int kFp4TcAutoMinM = 2;
// Past the tc kernel's 8 rows: the small-batch tensor-core kernel (fp8_mma_kernel<.., FP4>) to 64
// rows, over the stored nibbles (the dequantized tiles write and re-read 2 bytes per weight each
// step: the 8B bs64 decode ran at 22% of copy through them, H100 2026-12-06).
constexpr int kFp4MmaAutoM = 64;

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

// FP4 (NVFP4, W4A16): the lane's 16 values are 8 bytes and one 16-value group, its E4M3 scale
// multiplied into the unpacked pairs exactly (e2m1x2_bf16x2), the row's scale2 x 2^8 at the end;
// sc is then the E4M3 codes [N, s_ld] and s2 the f32 scale2 [N].
template <int MT, bool FP4, typename OutT>
__global__ void __launch_bounds__(kMmaWarps * 32)
fp8_mma_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, int M, const uint8_t* __restrict__ w,
               int64_t w_ld, const void* __restrict__ scv, int64_t s_ld, int bn_log2, int bk_log2,
               const float* __restrict__ s2, const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ out,
               int64_t out_ld, int N, int K) {
  const float* sc = static_cast<const float*>(scv);
  const uint8_t* sc4 = static_cast<const uint8_t*>(scv);
  __shared__ float red[kMmaWarps][MT][4][32];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const int64_t r_lo = n0 + g, r_hi = n0 + g + 8;
  const bool ok_lo = r_lo < N, ok_hi = r_hi < N;
  const uint8_t* w_lo = w + (ok_lo ? r_lo : 0) * w_ld;
  const uint8_t* w_hi = w + (ok_hi ? r_hi : 0) * w_ld;
  const float* s_lo = FP4 ? nullptr : sc + ((ok_lo ? r_lo : 0) >> bn_log2) * s_ld;
  const float* s_hi = FP4 ? nullptr : sc + ((ok_hi ? r_hi : 0) >> bn_log2) * s_ld;
  float acc[MT][4];
#pragma unroll
  for (int T = 0; T < MT; ++T)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[T][r] = 0.0f;
  const int nchunks = (K + 63) / 64;
  for (int c = warp; c < nchunks; c += kMmaWarps) {
    const int kt = c * 64 + t * 16;  // this lane's 16 values
    const bool kin = kt < K;
    uint32_t a[4][4];
    float sl, sh;
    if constexpr (FP4) {
      const uint2 wl = kin && ok_lo ? ld_stream8(w_lo + kt / 2) : make_uint2(0, 0);
      const uint2 wh = kin && ok_hi ? ld_stream8(w_hi + kt / 2) : make_uint2(0, 0);
      const float gl = kin && ok_lo ? e4m3_value(__ldg(sc4 + r_lo * s_ld + kt / 16)) * 0x1p118f : 0.0f;
      const float gh = kin && ok_hi ? e4m3_value(__ldg(sc4 + r_hi * s_ld + kt / 16)) * 0x1p118f : 0.0f;
      const __nv_bfloat162 fl = __float2bfloat162_rn(gl), fh = __float2bfloat162_rn(gh);
      // MMA step st takes the lane's values 4st..4st+3: bytes 2st, 2st + 1 of its 8.
      const uint32_t lo[2] = {wl.x, wl.y}, hi[2] = {wh.x, wh.y};
#pragma unroll
      for (int st = 0; st < 4; st += 2) {
        a[st][0] = e2m1x2_bf16x2<0>(lo[st >> 1], fl);
        a[st][1] = e2m1x2_bf16x2<0>(hi[st >> 1], fh);
        a[st][2] = e2m1x2_bf16x2<1>(lo[st >> 1], fl);
        a[st][3] = e2m1x2_bf16x2<1>(hi[st >> 1], fh);
        a[st + 1][0] = e2m1x2_bf16x2<2>(lo[st >> 1], fl);
        a[st + 1][1] = e2m1x2_bf16x2<2>(hi[st >> 1], fh);
        a[st + 1][2] = e2m1x2_bf16x2<3>(lo[st >> 1], fl);
        a[st + 1][3] = e2m1x2_bf16x2<3>(hi[st >> 1], fh);
      }
      sl = sh = 1.0f;  // in the unpacked values
    } else {
      const uint4 wl = kin && ok_lo ? ld_stream(w_lo + kt) : make_uint4(0, 0, 0, 0);
      const uint4 wh = kin && ok_hi ? ld_stream(w_hi + kt) : make_uint4(0, 0, 0, 0);
      sl = ok_lo ? __ldg(s_lo + ((c * 64) >> bk_log2)) : 0.0f;
      sh = ok_hi ? __ldg(s_hi + ((c * 64) >> bk_log2)) : 0.0f;
      const uint32_t wlw[4] = {wl.x, wl.y, wl.z, wl.w}, whw[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        a[st][0] = e4m3x2_bf16x2<0x1404>(wlw[st]);
        a[st][1] = e4m3x2_bf16x2<0x1404>(whw[st]);
        a[st][2] = e4m3x2_bf16x2<0x3424>(wlw[st]);
        a[st][3] = e4m3x2_bf16x2<0x3424>(whw[st]);
      }
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
    float v = 0.0f;
#pragma unroll
    for (int ww = 0; ww < kMmaWarps; ++ww) v += red[ww][T][r][l];
    if constexpr (FP4) v *= s2[n] * 256.0f;  // the row's scale2 and the 2^8 (e2m1x2_bf16x2)
    store_out(out + m * out_ld + n, v + (bias ? __bfloat162float(bias[n]) : 0.0f));
  }
}

template <int MT, typename OutT>
void mma_launch(const Tensor& x, const LinearWeight& w, const __nv_bfloat16* bias, OutT* out, int64_t out_ld) {
  const int N = int(w.size(0)), K = int(w.in_features());
  const dim3 grid(unsigned(ceil_div(N, 16))), block(kMmaWarps * 32);
  if (w.quant.nvfp4)
    launch(fp8_mma_kernel<MT, true, OutT>, grid, block, 0, true, x.ptr<__nv_bfloat16>(), x.row_stride(),
           int(x.rows()), w.ptr<uint8_t>(), w.row_stride(), static_cast<const void*>(w.quant.scale.data),
           w.quant.scale.row_stride(), 0, 0, w.quant.scale2.ptr<float>(), bias, out, out_ld, N, K);
  else
    launch(fp8_mma_kernel<MT, false, OutT>, grid, block, 0, true, x.ptr<__nv_bfloat16>(), x.row_stride(),
           int(x.rows()), w.ptr<uint8_t>(), w.row_stride(), static_cast<const void*>(w.quant.scale.data),
           w.quant.scale.size(1), w.quant.block_n_log2, w.quant.block_k_log2, static_cast<const float*>(nullptr),
           bias, out, out_ld, N, K);
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

// ---- tensor-core W8A16 / W4A16 decode GEMV with the decode fusions (quant_decode_gemv) -----------
// The mma kernel's arithmetic (16 output features per block, 8 warps splitting K in interleaved
// 64-wide chunks, weights unpacked exactly to bf16, one m16n8k16 per 16 k, the block scale once
// per chunk; NVFP4: each lane's 16 values are one group, its E4M3 scale multiplied into the
// unpacked pairs exactly, scale2 per row at the end) for the M <= 8 rows of decode, with U chunks of loads in flight per warp (the mma
// kernel keeps one) and the first U requested before the PDL wait (weights are never written
// during a forward, so they stream under the previous kernel's tail); and the decode fusions'
// prologue / epilogues, so FP8 checkpoints take the dense decoder's fused flow (blocks.h).
// Epilogues (DecodeEpilogue): store (+ bias); silu_mul (the block's 16 gate rows n and up rows
// n + N, out = bf16(silu(bf16(g)) * bf16(u)), silu_mul's formula); add_into (out += bf16(acc),
// the residual add). NORM: the rows of x are RMS-normalised into shared memory first (each block
// for itself: x is a few KB, L2-resident).
// H200 lab (bench --linear-lab, 2026-12-04, Llama-3.1-8B shapes, copy 4.2 TB/s): at M = 1 it
// times as the CUDA-core GEMV (gate_up 40.3 vs 39.4 us, down 22.0 vs 24.2, o 8.4 vs 8.6), and it
// stays flat to M = 8 where the GEMV grows with M (down 25.3 vs 105 us; mma 32.0). Both FP8
// kernels stream at ~3.0-3.2 TB/s at large N (the bf16 GEMV: 4.1-4.4), so the unpack cost was
// not the limit (this kernel spends ~2.7 integer ops per weight byte against the GEMV's ~5); a
// second register buffer of loads in flight during the MMAs was slower (gate_up + SiLU 54 vs
// 43 us: fewer resident warps). Also tried (H200, same lab): 3 blocks per SM here
// (__launch_bounds__(256, 3): 80 registers, small spills) took gate_up to 36.6 us and qkv 12.9 ->
// 10.7 but down 22.0 -> 24.9 and the fused forms slower, 8B decode unchanged (281 tok/s); 8 loads
// per lane in the CUDA-core GEMV at M = 1 (64 registers) was slower (gate_up 42.2 vs 39.4 us).
// Not yet known what caps it; the issue's 85% of copy is not met.
constexpr int kTcWarps = 8;
constexpr int kTcRows = 16;   // output features per block (the MMA's m16)
constexpr int kTcMaxM = 8;    // rows of x (the MMA's n8)
constexpr int kTcChunk = 64;  // k per warp step: 4 lanes x 16 values
constexpr size_t kTcNormSmem = 48 * 1024;

struct TcArgs {
  const __nv_bfloat16* x;
  int64_t x_ld;
  int M;
  const __nv_bfloat16* norm_w;  // NORM: [K]
  float eps;
  const uint8_t* w;
  int64_t w_ld;  // bytes
  const void* sc;  // FP8: f32 [ceil(N/2^bn), ceil(K/2^bk)]; NVFP4: E4M3 codes [N, K/16]
  int64_t s_ld;
  int bn_log2, bk_log2;  // FP8
  const float* s2;       // NVFP4: f32 [N] (weight_scale_2 per row)
  const __nv_bfloat16* bias;  // store: optional [N]
  __nv_bfloat16* out;
  int64_t out_ld;
  int N, K;  // N outputs (silu_mul: the weight has 2N rows)
};

// The weight bytes of one lane's 16 values of one row: FP8 16 bytes, NVFP4 8.
template <bool FP4>
struct TcVec;
template <>
struct TcVec<false> {
  uint4 v;
};
template <>
struct TcVec<true> {
  uint2 v;
};

// WIDE: one row set with 2 chunks in flight and 4 blocks per SM asked of the compiler instead of 4
// chunks and no bound -- for grids of more than 2 blocks per SM (tc_wide).
template <bool NORM, int EPI, bool FP4, bool WIDE = false>
__global__ void __launch_bounds__(kTcWarps * 32, WIDE ? 4 : 1) quant_tc_gemv_kernel(TcArgs a) {
  constexpr int R = EPI == int(DecodeEpilogue::silu_mul) ? 2 : 1;  // weight row sets (gate, up)
  // Chunks in flight per warp: 4 (FP8: 128 bytes per lane; NVFP4: 64) with one row set, 2 with two
  // or WIDE.
  constexpr int U = R == 2 || WIDE ? 2 : 4;
  extern __shared__ __align__(16) unsigned char tc_smem[];  // NORM: x normalised [M, K]
  __shared__ float red[kTcWarps][R][4][32];
  __shared__ float nred[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * kTcRows;
  // This lane's weight rows: features n0 + g (h = 0) and n0 + g + 8 (h = 1) of each row set, at
  // its 16 values (t) of the first chunk; and their scales.
  const uint8_t* wp[R][2];
  const uint8_t* sp[R][2];  // FP8: the row block's f32 scales; NVFP4: the row's E4M3 codes
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t f = n0 + g + 8 * h;
      const int64_t row = (f < a.N ? f : 0) + int64_t(r) * a.N;
      wp[r][h] = a.w + row * a.w_ld + t * (FP4 ? 8 : 16);
      if constexpr (FP4) sp[r][h] = static_cast<const uint8_t*>(a.sc) + row * a.s_ld + t;
      else sp[r][h] = reinterpret_cast<const uint8_t*>(static_cast<const float*>(a.sc) + (row >> a.bn_log2) * a.s_ld);
    }
  const int nchunks = a.K / kTcChunk;
  TcVec<FP4> wv[U][R][2];
  float sv[U][R][2];  // FP8: the chunk's block scale; NVFP4: the lane's group scale x 2^118
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kTcWarps;
      const bool in = c < nchunks;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (FP4) {
            wv[u][r][h].v = in ? ld_stream8(wp[r][h] + int64_t(c) * (kTcChunk / 2)) : make_uint2(0, 0);
            sv[u][r][h] = in ? e4m3_value(__ldg(sp[r][h] + c * (kTcChunk / 16))) * 0x1p118f : 0.0f;
          } else {
            wv[u][r][h].v = in ? ld_stream(wp[r][h] + int64_t(c) * kTcChunk) : make_uint4(0, 0, 0, 0);
            sv[u][r][h] = in ? __ldg(reinterpret_cast<const float*>(sp[r][h]) + ((c * kTcChunk) >> a.bk_log2)) : 0.0f;
          }
        }
    }
  };
  load(warp);
  pdl_wait();
  const __nv_bfloat16* x = a.x;
  int64_t x_ld = a.x_ld;
  if constexpr (NORM) {
    __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(tc_smem);
    rms_norm_rows_to_smem(a.x, a.x_ld, a.M, a.K, a.norm_w, a.eps, xs, nred);
    x = xs;
    x_ld = a.K;
  }
  float acc[R][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
  const bool has_row = g < a.M;  // this lane feeds row g of x (B's column g)
  for (int c0 = warp; c0 < nchunks; c0 += kTcWarps * U) {
    if (c0 != warp) load(c0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kTcWarps;
      if (c >= nchunks) break;  // uniform over the warp
      const int kt = c * kTcChunk + t * 16;
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
      if (has_row) {
        const uint4* xp = reinterpret_cast<const uint4*>(x + g * x_ld + kt);
        x0 = xp[0];
        x1 = xp[1];
      }
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (FP4) {
          // MMA step st takes the lane's values 4st..4st+3: bytes 2st, 2st + 1 of its 8.
          const __nv_bfloat162 fl = __float2bfloat162_rn(sv[u][r][0]), fh = __float2bfloat162_rn(sv[u][r][1]);
          const uint32_t lo[2] = {wv[u][r][0].v.x, wv[u][r][0].v.y}, hi[2] = {wv[u][r][1].v.x, wv[u][r][1].v.y};
#pragma unroll
          for (int st = 0; st < 4; ++st) {
            const uint32_t wl = lo[st >> 1], wh = hi[st >> 1];
            if (st % 2 == 0)
              mma_bf16(p, e2m1x2_bf16x2<0>(wl, fl), e2m1x2_bf16x2<0>(wh, fh), e2m1x2_bf16x2<1>(wl, fl),
                       e2m1x2_bf16x2<1>(wh, fh), xw[2 * st], xw[2 * st + 1]);
            else
              mma_bf16(p, e2m1x2_bf16x2<2>(wl, fl), e2m1x2_bf16x2<2>(wh, fh), e2m1x2_bf16x2<3>(wl, fl),
                       e2m1x2_bf16x2<3>(wh, fh), xw[2 * st], xw[2 * st + 1]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[r][i] += p[i];
        } else {
          const uint32_t lo[4] = {wv[u][r][0].v.x, wv[u][r][0].v.y, wv[u][r][0].v.z, wv[u][r][0].v.w};
          const uint32_t hi[4] = {wv[u][r][1].v.x, wv[u][r][1].v.y, wv[u][r][1].v.z, wv[u][r][1].v.w};
#pragma unroll
          for (int st = 0; st < 4; ++st)
            mma_bf16(p, e4m3x2_bf16x2<0x1404>(lo[st]), e4m3x2_bf16x2<0x1404>(hi[st]), e4m3x2_bf16x2<0x3424>(lo[st]),
                     e4m3x2_bf16x2<0x3424>(hi[st]), xw[2 * st], xw[2 * st + 1]);
          acc[r][0] = fmaf(p[0], sv[u][r][0], acc[r][0]);
          acc[r][1] = fmaf(p[1], sv[u][r][0], acc[r][1]);
          acc[r][2] = fmaf(p[2], sv[u][r][1], acc[r][2]);
          acc[r][3] = fmaf(p[3], sv[u][r][1], acc[r][3]);
        }
      }
    }
  }
  pdl_trigger();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][r][i][lane] = acc[r][i];
  __syncthreads();
  // C fragment: register i of lane l holds feature (l / 4) + 8 * (i / 2), row 2 * (l % 4) + i % 2.
  for (int o = threadIdx.x; o < kTcRows * a.M; o += kTcWarps * 32) {
    const int f = o % kTcRows, m = o / kTcRows;
    const int64_t n = n0 + f;
    if (n >= a.N) continue;
    const int l = (f & 7) * 4 + (m >> 1), i = (f >= 8 ? 2 : 0) + (m & 1);
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      v[r] = 0.0f;
#pragma unroll
      for (int ww = 0; ww < kTcWarps; ++ww) v[r] += red[ww][r][i][l];
      if constexpr (FP4) v[r] *= a.s2[n + int64_t(r) * a.N] * 256.0f;  // the row's scale2 and the 2^8
    }
    __nv_bfloat16* op = a.out + m * a.out_ld + n;
    if constexpr (EPI == int(DecodeEpilogue::silu_mul)) {
      const float gt = __bfloat162float(__float2bfloat16(v[0]));
      const float up = __bfloat162float(__float2bfloat16(v[R - 1]));
      *op = __float2bfloat16(gt / (1.0f + __expf(-gt)) * up);
    } else if constexpr (EPI == int(DecodeEpilogue::add_into)) {
      *op = __float2bfloat16(__bfloat162float(*op) + __bfloat162float(__float2bfloat16(v[0])));
    } else {
      *op = __float2bfloat16(v[0] + (a.bias ? __bfloat162float(a.bias[n]) : 0.0f));
    }
  }
}

// Whether an FP8 grid of `blocks` takes the WIDE form (FP8, one row set): more blocks than 2 per
// SM. H100 lab (lab_quant_gemv, 2026-12-06, in a CUDA graph of 20 calls, copy 2976 GB/s): qkv
// (6144 x 4096, 384 blocks) 14.08 -> 11.48 us at M = 1 (60 -> 74% of copy), 15.33 -> 11.95 at
// M = 8, gate_up as one row set (1792 blocks) 44.1 -> 43.5; grids of <= 2 blocks per SM lose or
// tie (down 4096 x 14336: 25.4 -> 26.6 us; o_proj 8.90 -> 9.02), so they keep 4 chunks. Every
// block of a 384-block grid is resident at once with 4 per SM (at most 2-3 otherwise: a second
// wave of a third of the grid). NVFP4 is ALU-bound here (~9 integer ops per weight byte): not
// measured, left as it was.
bool tc_wide(int64_t blocks, bool fp4, int R) {
  return !fp4 && R == 1 && blocks > 2 * int64_t(sm_count());
}

template <bool NORM, int EPI>
void tc_launch(const TcArgs& a, bool fp4) {
  const size_t smem = NORM ? size_t(a.M) * size_t(a.K) * 2 : 0;
  const dim3 grid(unsigned(ceil_div(a.N, kTcRows))), block(kTcWarps * 32);
  constexpr int R = EPI == int(DecodeEpilogue::silu_mul) ? 2 : 1;
  if (fp4) launch(quant_tc_gemv_kernel<NORM, EPI, true>, grid, block, smem, true, a);
  else if (tc_wide(grid.x, fp4, R)) launch(quant_tc_gemv_kernel<NORM, EPI, false, true>, grid, block, smem, true, a);
  else launch(quant_tc_gemv_kernel<NORM, EPI, false>, grid, block, smem, true, a);
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

bool quant_decode_applies(const Tensor& x, const LinearWeight& w, bool norm) {
  const QuantScales& q = w.quant;
  const int64_t M = x.rows(), K = x.size(-1);
  const bool fmt = q.nvfp4 ? w.dtype == DType::u8 && q.scale.dtype == DType::f8_e4m3 && q.scale2.data &&
                                 w.row_stride() % 8 == 0 && q.scale.row_stride() >= K / 16
                           : w.dtype == DType::f8_e4m3 && q.block_k_log2 >= 6 && w.row_stride() % 16 == 0;
  return w.quantized() && fmt && w.ndim == 2 && w.device == Device::cuda && w.in_features() == K &&
         K % kTcChunk == 0 && K <= 0x7fffffff && w.size(0) <= 0x7fffffff && aligned16(w.data) &&
         x.device == Device::cuda && x.dtype == DType::bf16 && M >= 1 && M <= kTcMaxM &&
         vec8_ok(x.data, K, x.row_stride()) && (!norm || size_t(M) * size_t(K) * 2 <= kTcNormSmem);
}

void quant_decode_gemv(const Tensor& x, const LinearWeight& w, const Tensor* norm_w, float eps, DecodeEpilogue epi,
                     Tensor& out, const Tensor* bias) {
  const bool norm = norm_w != nullptr;
  TS_CHECK(quant_decode_applies(x, w, norm), "quant_decode_gemv: x {} w {} ({}, k block 2^{}) does not apply", x.shape_str(),
           w.shape_str(), w.quant.format, w.quant.block_k_log2);
  check_weight(w);
  check_dev(out, DType::bf16, "quant_decode_gemv out");
  const int64_t M = x.rows(), K = x.size(-1), rows = w.size(0);
  const bool glu = epi == DecodeEpilogue::silu_mul;
  TS_CHECK(!glu || rows % 2 == 0, "quant_decode_gemv: silu_mul needs [2I, K] gate|up rows, got {}", w.shape_str());
  const int64_t N = glu ? rows / 2 : rows;
  TS_CHECK(out.rows() == M && out.size(-1) == N && out.stride[out.ndim - 1] == 1, "quant_decode_gemv: out {} for [{}, {}]",
           out.shape_str(), M, N);
  if (norm) {
    check_dev(*norm_w, DType::bf16, "quant_decode_gemv norm");
    TS_CHECK(norm_w->numel() == K && norm_w->is_contiguous() && aligned16(norm_w->data),
             "quant_decode_gemv: norm weight {} for K={}", norm_w->shape_str(), K);
  }
  const bool has_bias = bias && bias->data;
  TS_CHECK(!has_bias || epi == DecodeEpilogue::store, "quant_decode_gemv: a bias only with the store epilogue");
  if (has_bias) {
    check_dev(*bias, DType::bf16, "quant_decode_gemv bias");
    TS_CHECK(bias->numel() == N && bias->is_contiguous(), "quant_decode_gemv: bias {} for N={}", bias->shape_str(), N);
  }
  if (N == 0) return;
  TcArgs a{};
  a.x = x.ptr<__nv_bfloat16>();
  a.x_ld = x.row_stride();
  a.M = int(M);
  a.norm_w = norm ? norm_w->ptr<__nv_bfloat16>() : nullptr;
  a.eps = eps;
  a.w = w.ptr<uint8_t>();
  a.w_ld = w.row_stride();
  const bool fp4 = w.quant.nvfp4;
  a.sc = w.quant.scale.data;
  a.s_ld = fp4 ? w.quant.scale.row_stride() : w.quant.scale.size(1);
  a.bn_log2 = w.quant.block_n_log2;
  a.bk_log2 = w.quant.block_k_log2;
  a.s2 = fp4 ? w.quant.scale2.ptr<float>() : nullptr;
  a.bias = has_bias ? bias->ptr<__nv_bfloat16>() : nullptr;
  a.out = out.ptr<__nv_bfloat16>();
  a.out_ld = out.row_stride();
  a.N = int(N);
  a.K = int(K);
  constexpr int kS = int(DecodeEpilogue::store), kG = int(DecodeEpilogue::silu_mul), kA = int(DecodeEpilogue::add_into);
  switch (epi) {
    case DecodeEpilogue::store: return norm ? tc_launch<true, kS>(a, fp4) : tc_launch<false, kS>(a, fp4);
    case DecodeEpilogue::silu_mul: return norm ? tc_launch<true, kG>(a, fp4) : tc_launch<false, kG>(a, fp4);
    case DecodeEpilogue::add_into: return norm ? tc_launch<true, kA>(a, fp4) : tc_launch<false, kA>(a, fp4);
  }
}

bool quant_decode_automatic(const Tensor& x, const LinearWeight& w, bool norm) {
  return quant_decode_applies(x, w, norm) && (!w.quant.nvfp4 || x.rows() >= kFp4TcAutoMinM);
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
  // Deterministic mode (LaunchConfig::batch_invariant): the stored weight dequantized to bf16
  // tiles, then the bf16 GEMM's per-shape algorithm (linear.cu) at every M -- exact
  // dequantization, so rows round the same in any batch; the decode kernels (GEMV, tensor-core
  // GEMV, small-M MMA) and the W8A8 GEMM are each exact for one batch size only.
  const QuantKernel k = policy.linear == LinearPath::cublaslt || launch_config().batch_invariant ? QuantKernel::tiles
                        : policy.linear == LinearPath::gemv                                      ? QuantKernel::gemv
                        : policy.linear == LinearPath::mma                                       ? QuantKernel::mma
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
  const bool tc_ok = !f32out && quant_decode_applies(x, w, false);
  const bool tc_auto = !f32out && quant_decode_automatic(x, w, false);
  if (w.quant.nvfp4) {
    const bool mma4_ok = vec_ok && M <= 8 * kMmaMaxTiles;
    if (kernel == QuantKernel::automatic)
      kernel = tc_auto                          ? QuantKernel::tc
               : M <= kFp4GemvAutoM && gemv_ok ? QuantKernel::gemv
               : M <= kFp4MmaAutoM && mma4_ok  ? QuantKernel::mma
                                                : QuantKernel::tiles;
    if (kernel == QuantKernel::tc && tc_ok) return quant_decode_gemv(x, w, nullptr, 0.0f, DecodeEpilogue::store, out, bias);
    if (kernel == QuantKernel::mma && mma4_ok) {
      if (f32out) mma(x, w, bp, out.ptr<float>(), ldc);
      else mma(x, w, bp, out.ptr<__nv_bfloat16>(), ldc);
      return;
    }
    if (kernel != QuantKernel::tiles && gemv_ok) {
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
    kernel = tc_auto                          ? QuantKernel::tc
             : M <= kQuantGemvAutoM && gemv_ok ? QuantKernel::gemv
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
  if (kernel == QuantKernel::tc && tc_ok) return quant_decode_gemv(x, w, nullptr, 0.0f, DecodeEpilogue::store, out, bias);
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
