// Linears over FP8 (e4m3) weights kept as stored: W8A16 GEMV for decode, dequantized bf16 row
// tiles + cuBLASLt for prefill (ops/cuda/quant_linear.h).
//
// Dequantizing in registers: an e4m3 byte s eeee mmm becomes the f32 with sign s, exponent field
// 0000eeee and mantissa mmm0...: exactly e4m3 x 2^-120 (subnormals included: e4m3 exponent 0 lands
// on f32 exponent 0, whose denormals the kernels keep, no --use_fast_math). Three integer ops per
// value and no conversion unit; the 2^120 goes into the block scale once per 16 values.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/quant_linear.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

// Auto policy: the GEMV up to this many rows. Per 16 weights a row costs ~32 CUDA-core ops
// (FMA + bf16 unpack) on top of ~11 to unpack the weights, so past a few rows the GEMV is
// compute-bound; it still reads 5x fewer bytes than dequantize + GEMM (1 B vs 1 + 2 + 2).
constexpr int kQuantGemvMaxM = 8;
constexpr int kQuantGemvMaxForced = 16;
constexpr int kQWarps = 8;   // one output feature per warp
constexpr int kQUnroll = 4;  // 16-byte weight loads in flight per lane
constexpr size_t kDequantScratch = size_t(64) << 20;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Byte j of v (element j of 4) as e4m3 x 2^-120 in f32.
template <int J>
__device__ __forceinline__ float e4m3_scaled(uint32_t v) {
  const uint32_t t = v << (24 - 8 * J);  // byte j in bits 24..31
  return __uint_as_float((t & 0x80000000u) | ((t >> 4) & 0x07f00000u));
}

// sum_j w[j] * x[j] over 16 values (w: 16 e4m3, x: 16 bf16 as two 16-byte vectors), in units of
// 2^-120.
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x0, const uint4& x1) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t a = xx[2 * q], b = xx[2 * q + 1];  // elements 4q, 4q+1 | 4q+2, 4q+3
    s0 = fmaf(e4m3_scaled<0>(ww[q]), __uint_as_float(a << 16), s0);
    s1 = fmaf(e4m3_scaled<1>(ww[q]), __uint_as_float(a & 0xffff0000u), s1);
    s0 = fmaf(e4m3_scaled<2>(ww[q]), __uint_as_float(b << 16), s0);
    s1 = fmaf(e4m3_scaled<3>(ww[q]), __uint_as_float(b & 0xffff0000u), s1);
  }
  return s0 + s1;
}

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
  const int nv = K / 16;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int base = 0; base < nv; base += 32 * kQUnroll) {
    uint4 wv[kQUnroll];
    float s[kQUnroll];
#pragma unroll
    for (int u = 0; u < kQUnroll; ++u) {
      const int i = base + u * 32 + lane;
      wv[u] = i < nv ? ld_stream(wr + int64_t(i) * 16) : make_uint4(0, 0, 0, 0);
      s[u] = i < nv ? __ldg(sr + ((i * 16) >> bk_log2)) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kQUnroll; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* xp = reinterpret_cast<const uint4*>(x + m * x_ld + int64_t(i) * 16);
          acc[m] = fmaf(s[u], dot16(wv[u], xp[0], xp[1]) * 0x1p120f, acc[m]);
        }
      }
    }
  }
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

// out [rows, K] bf16 = rows [row0, row0 + rows) of W dequantized; one thread per 16 values.
__global__ void fp8_dequant_kernel(const uint8_t* __restrict__ w, int64_t w_ld, const float* __restrict__ sc,
                                   int64_t s_ld, int bn_log2, int bk_log2, int64_t row0, int64_t rows, int K,
                                   __nv_bfloat16* __restrict__ out) {
  pdl_wait();
  const int64_t nv = K / 16;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * nv) return;
  const int64_t r = idx / nv, c = idx % nv, n = row0 + r;
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

void check_weight(const LinearWeight& w) {
  TS_CHECK(w.quantized() && w.dtype == DType::f8_e4m3 && w.ndim == 2 && w.device == Device::cuda,
           "quant_linear: weight must be a quantized f8_e4m3 [N, K] on the GPU, got {} {}", dtype_name(w.dtype),
           w.shape_str());
  const Tensor& s = w.quant.scale;
  TS_CHECK(s.dtype == DType::f32 && s.ndim == 2 && s.is_contiguous() && s.device == Device::cuda,
           "quant_linear: scales must be f32 [rows, cols] on the GPU");
  TS_CHECK(w.quant.block_k_log2 >= 4 && w.quant.block_n_log2 >= 0 && w.quant.block_n_log2 < 31 &&
               w.quant.block_k_log2 < 31,
           "quant_linear: block 2^{} x 2^{} (need k blocks of >= 16)", w.quant.block_n_log2, w.quant.block_k_log2);
  const int64_t N = w.size(0), K = w.size(1);
  TS_CHECK(s.size(0) == ceil_div(N, int64_t(1) << w.quant.block_n_log2) &&
               s.size(1) == ceil_div(K, int64_t(1) << w.quant.block_k_log2),
           "quant_linear: scales {} for weight {} with blocks 2^{} x 2^{}", s.shape_str(), w.shape_str(),
           w.quant.block_n_log2, w.quant.block_k_log2);
  TS_CHECK(K % 16 == 0 && w.row_stride() % 16 == 0 && aligned16(w.data),
           "quant_linear: K {} and the row stride must be multiples of 16", K);
  TS_CHECK(N <= 0x7fffffff && K <= 0x7fffffff, "quant_linear: too large");
}

}  // namespace

void reserve_quant_scratch() { workspace(3).get(kDequantScratch); }

void dequantize_rows(const LinearWeight& w, int64_t row0, int64_t rows, Tensor& out) {
  check_weight(w);
  const int64_t K = w.size(1);
  check_dev(out, DType::bf16, "dequantize_rows out");
  TS_CHECK(out.is_contiguous() && out.ndim == 2 && out.size(0) == rows && out.size(1) == K && row0 >= 0 &&
               row0 + rows <= w.size(0),
           "dequantize_rows: rows [{}, +{}) of {} into {}", row0, rows, w.shape_str(), out.shape_str());
  const int64_t threads = rows * (K / 16);
  if (threads == 0) return;
  launch(fp8_dequant_kernel, dim3(unsigned(ceil_div(threads, 256))), dim3(256), 0, true, w.ptr<uint8_t>(),
         w.row_stride(), w.quant.scale.ptr<float>(), w.quant.scale.size(1), w.quant.block_n_log2,
         w.quant.block_k_log2, row0, rows, int(K), out.ptr<__nv_bfloat16>());
}

void quant_linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias, const KernelPolicy& policy) {
  check_weight(w);
  check_dev(x, DType::bf16, "linear x");
  const bool f32out = out.dtype == DType::f32;
  if (!f32out) check_dev(out, DType::bf16, "linear out");
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.size(1) == K && out.rows() == M && out.size(-1) == N, "linear: x {} w {} ({}) out {}", x.shape_str(),
           w.shape_str(), w.quant.format, out.shape_str());
  const __nv_bfloat16* bp = nullptr;
  if (bias && bias->data) {
    check_dev(*bias, DType::bf16, "linear bias");
    TS_CHECK(bias->numel() == N && bias->is_contiguous(), "linear: bias {} for N={}", bias->shape_str(), N);
    bp = bias->ptr<__nv_bfloat16>();
  }
  if (M == 0 || N == 0) return;
  const int64_t ldx = x.row_stride(), ldc = out.row_stride();
  const int max_m = policy.linear == LinearPath::gemv ? kQuantGemvMaxForced : kQuantGemvMaxM;
  const bool gemv_ok = M <= max_m && vec8_ok(x.data, K, ldx) && K % 16 == 0;
  if (gemv_ok && policy.linear != LinearPath::cublaslt) {
    if (f32out) gemv(int(M), x, w, bp, out.ptr<float>(), ldc);
    else gemv(int(M), x, w, bp, out.ptr<__nv_bfloat16>(), ldc);
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
