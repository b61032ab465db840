// quant GEMV lab: the decode (M = 1 and 8) W8A16 / W4A16 GEMV over FP8 block-128 and NVFP4
// weights kept as stored, Llama-3.1-8B shapes, GB/s of the stored bytes against the copy ceiling
// measured in the same run; each version checked against a CPU reference (dequantize, f64 dot) on
// the first 300 rows. Times: one launch between events, ten launches back to back, and per call
// inside a CUDA graph of 20 calls (as the decode graphs run them: PDL, no host gaps).
// Versions side by side:
//  gemv  the product's CUDA-core GEMV (QuantKernel::gemv: a warp per row, 16-byte register loads)
//  tc    the product's tensor-core decode GEMV (QuantKernel::tc: 16 rows per block, 8 warps over K)
//  tma   a persistent grid (one block per SM: 8 consumer warps + a producer warp) streaming each
//        block's 16-row tiles through a ring of shared-memory stages with cp.async.bulk (full /
//        empty mbarriers), the tc arithmetic on padded (conflict-free) rows
//  U?B?  the tc kernel (FP8, store) with U chunks of loads in flight per warp and B blocks per SM
//        asked of the compiler (the product had U4, no bound)
// H100 results (2026-12-06, copy 2976 GB/s, in-graph us and % of copy, M = 1):
//   qkv 6144x4096: gemv 13.8 (61%), tc 14.1 (60%), tma 16.4 (52%), U8B1 16.6, U4B3 12.7, U2B4 11.5 (74%)
//   o   4096x4096: gemv 8.6 (66%), tc 8.9 (63%), tma 12.2 (46%), U2B4 9.0
//   gate_up 28672x4096: gemv 41.8 (94%), tc 44.1 (90%), tma 60.0 (66%), U2B4 43.5
//   down 4096x14336: gemv 24.6 (80%), tc 25.4 (78%), tma 36.6 (54%), U2B4 26.6
//   NVFP4 (tc, in-graph): qkv 46%, o 35%, gate_up 57%, down 46% -- ALU-bound (~9 integer ops per
//   weight byte to unpack e2m1 to bf16 pairs and scale them); tma does not help it.
// So: the TMA ring loses everywhere (stage count 4-10 made no difference: its producer/consumer
// hand-off, not DRAM latency, sets the pace), more loads in flight per warp (U8) lose, and what
// wins is more resident blocks for grids of more than 2 blocks per SM (qkv: all 384 blocks in one
// wave); the product now takes U2B4 there (quant_linear.cu tc_wide). An earlier version here, the
// CUDA-core dot out of shared memory behind cp.async.bulk, lost too (gate_up 61.6 vs 47.8 us
// single-launch): at M >= 2 the CUDA-core dequant is issue-bound.
#include <cstring>

#include "core/fp8.h"
#include "lab_common.cuh"
#include "ops/cuda/quant_dot.cuh"
#include "ops/cuda/graph.h"
#include "ops/cuda/quant_linear.h"

namespace {
using namespace ts;
namespace qd = ts::ops::cuda::qdot;

constexpr int kMaxStages = 12;


__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(
          smem_addr(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(b))
               : "memory");
}

// ---- tma: cp.async.bulk stages + the tensor-core dot (the product's tc arithmetic) ------------
// One block per SM (8 consumer warps + 1 producer warp), a contiguous range of 16-row tiles; each
// tile's K is streamed in stages of kKs k-values x 16 rows (FP8 1 KB a row, NVFP4 512 B + 64 B of
// E4M3 scales a row) through a ring of kNs stages: full barriers (the copies' bytes), empty
// barriers (the 8 consumer warps), so the producer runs up to kNs stages ahead across tile
// boundaries and DRAM never waits for a block to finish its tile. Rows are padded in shared
// memory so the MMA fragments' loads are conflict-free.
constexpr int kKs = 1024;                       // k-values per row per stage
constexpr int kTRows = 16;
constexpr int kWRowFp8 = kKs + 64;               // bytes between stage rows: FP8
constexpr int kWRowFp4 = kKs / 2 + 32;           // NVFP4 nibbles
constexpr int kSRowFp4 = kKs / 16 + 16;          // NVFP4 scales
template <bool FP4>
constexpr int stage_bytes() { return FP4 ? kTRows * (kWRowFp4 + kSRowFp4) : kTRows * kWRowFp8; }

struct TmaArgs {
  const __nv_bfloat16* x;
  int64_t x_ld;
  int M;
  const uint8_t* w;
  int64_t w_ld;
  const void* sc;
  int64_t s_ld;
  int bn_log2, bk_log2;
  const float* s2;
  __nv_bfloat16* out;
  int64_t out_ld;
  int N, K;
  int stages;
};

__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}

template <bool FP4>
__global__ void __launch_bounds__(9 * 32) tma_tc_kernel(TmaArgs a) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ float red[2][8][4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int NS = a.stages;
  const int tiles = (a.N + kTRows - 1) / kTRows;
  const int t0 = int(int64_t(tiles) * blockIdx.x / gridDim.x), t1 = int(int64_t(tiles) * (blockIdx.x + 1) / gridDim.x);
  const int nks = (a.K + kKs - 1) / kKs;
  const int total = (t1 - t0) * nks;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  constexpr int SB = stage_bytes<FP4>();
  if (warp == 8) {  // producer
    for (int s = 0; s < total; ++s) {
      const int buf = s % NS;
      if (s >= NS) mbar_wait(&empty[buf], unsigned((s / NS) - 1) & 1u);
      const int tile = t0 + s / nks, k0 = (s % nks) * kKs, ks = min(kKs, a.K - k0);
      const int n0 = tile * kTRows, rows = min(kTRows, a.N - n0);
      const unsigned wbytes = FP4 ? unsigned(ks / 2) : unsigned(ks);
      const unsigned sbytes = FP4 ? unsigned(ks / 16) : 0u;
      if (lane == 0) mbar_expect_tx(&full[buf], unsigned(rows) * (wbytes + sbytes));
      __syncwarp();
      unsigned char* st = ring + int64_t(buf) * SB;
      if (lane < rows)
        bulk_g2s(st + lane * (FP4 ? kWRowFp4 : kWRowFp8), a.w + int64_t(n0 + lane) * a.w_ld + (FP4 ? k0 / 2 : k0), wbytes,
                 &full[buf]);
      if constexpr (FP4) {
        if (lane >= 16 && lane - 16 < rows)
          bulk_g2s(st + kTRows * kWRowFp4 + (lane - 16) * kSRowFp4,
                   static_cast<const uint8_t*>(a.sc) + int64_t(n0 + lane - 16) * a.s_ld + k0 / 16, sbytes, &full[buf]);
      }
    }
    return;
  }
  ts::cuda::pdl_wait();
  const int g = lane >> 2, t = lane & 3;
  const bool has_row = g < a.M;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < total; ++s) {
    const int buf = s % NS;
    const int tile = t0 + s / nks, kst = s % nks, k0 = kst * kKs, ks = min(kKs, a.K - k0);
    const int n0 = tile * kTRows;
    mbar_wait(&full[buf], unsigned(s / NS) & 1u);
    const unsigned char* st = ring + int64_t(buf) * SB;
    const int nch = ks / 64;
    for (int c = warp; c < nch; c += 8) {
      const int kt = k0 + c * 64 + t * 16;
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
      if (has_row) {
        const uint4* xp = reinterpret_cast<const uint4*>(a.x + g * a.x_ld + kt);
        x0 = __ldg(xp);
        x1 = __ldg(xp + 1);
      }
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (FP4) {
        const uint2 wl = *reinterpret_cast<const uint2*>(st + g * kWRowFp4 + c * 32 + t * 8);
        const uint2 wh = *reinterpret_cast<const uint2*>(st + (g + 8) * kWRowFp4 + c * 32 + t * 8);
        const unsigned char* ss = st + kTRows * kWRowFp4;
        const __nv_bfloat162 fl = __float2bfloat162_rn(qd::e4m3_value(ss[g * kSRowFp4 + c * 4 + t]) * 0x1p118f);
        const __nv_bfloat162 fh = __float2bfloat162_rn(qd::e4m3_value(ss[(g + 8) * kSRowFp4 + c * 4 + t]) * 0x1p118f);
        const uint32_t lo[2] = {wl.x, wl.y}, hi[2] = {wh.x, wh.y};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t a0 = lo[q >> 1], a1 = hi[q >> 1];
          if (q % 2 == 0)
            qd::mma_bf16(p, qd::e2m1x2_bf16x2<0>(a0, fl), qd::e2m1x2_bf16x2<0>(a1, fh), qd::e2m1x2_bf16x2<1>(a0, fl),
                         qd::e2m1x2_bf16x2<1>(a1, fh), xw[2 * q], xw[2 * q + 1]);
          else
            qd::mma_bf16(p, qd::e2m1x2_bf16x2<2>(a0, fl), qd::e2m1x2_bf16x2<2>(a1, fh), qd::e2m1x2_bf16x2<3>(a0, fl),
                         qd::e2m1x2_bf16x2<3>(a1, fh), xw[2 * q], xw[2 * q + 1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += p[i];
      } else {
        const uint4 wl = *reinterpret_cast<const uint4*>(st + g * kWRowFp8 + c * 64 + t * 16);
        const uint4 wh = *reinterpret_cast<const uint4*>(st + (g + 8) * kWRowFp8 + c * 64 + t * 16);
        const uint32_t lo[4] = {wl.x, wl.y, wl.z, wl.w}, hi[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          qd::mma_bf16(p, qd::e4m3x2_bf16x2<0x1404>(lo[q]), qd::e4m3x2_bf16x2<0x1404>(hi[q]),
                       qd::e4m3x2_bf16x2<0x3424>(lo[q]), qd::e4m3x2_bf16x2<0x3424>(hi[q]), xw[2 * q], xw[2 * q + 1]);
        const float* sc = static_cast<const float*>(a.sc);
        const int kb = (k0 + c * 64) >> a.bk_log2;
        const int rl = min(n0 + g, a.N - 1), rh = min(n0 + g + 8, a.N - 1);
        const float sl = __ldg(sc + int64_t(rl >> a.bn_log2) * a.s_ld + kb);
        const float sh = __ldg(sc + int64_t(rh >> a.bn_log2) * a.s_ld + kb);
        acc[0] = fmaf(p[0], sl, acc[0]);
        acc[1] = fmaf(p[1], sl, acc[1]);
        acc[2] = fmaf(p[2], sh, acc[2]);
        acc[3] = fmaf(p[3], sh, acc[3]);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[buf]);
    if (kst == nks - 1) {  // the tile is complete: reduce over the warps, store
      const int par = (s / nks) & 1;
#pragma unroll
      for (int i = 0; i < 4; ++i) red[par][warp][i][lane] = acc[i], acc[i] = 0.0f;
      asm volatile("bar.sync 1, 256;" ::: "memory");
      for (int o = threadIdx.x; o < kTRows * a.M; o += 256) {
        const int f = o % kTRows, m = o / kTRows;
        const int n = n0 + f;
        if (n >= a.N) continue;
        const int l = (f & 7) * 4 + (m >> 1), i = (f >= 8 ? 2 : 0) + (m & 1);
        float v = 0.0f;
#pragma unroll
        for (int ww = 0; ww < 8; ++ww) v += red[par][ww][i][l];
        if constexpr (FP4) v *= a.s2[n] * 256.0f;
        a.out[m * a.out_ld + n] = __float2bfloat16(v);
      }
    }
  }
  ts::cuda::pdl_trigger();
}


// ---- tcU: the product's tensor-core decode GEMV (store epilogue, FP8) with U chunks of loads in
// flight per warp as a parameter (the product keeps 4) and B blocks per SM asked of the compiler:
// at K = 4096 a warp owns 8 chunks, so U = 8 requests a block's whole 64 KB at once, before the
// PDL wait, instead of in two round trips.
template <int U, int B>
__global__ void __launch_bounds__(256, B) tcu_kernel(TmaArgs a) {
  __shared__ float red[8][4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const uint8_t* wp[2];
  const float* sp[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t f = n0 + g + 8 * h;
    const int64_t row = f < a.N ? f : 0;
    wp[h] = a.w + row * a.w_ld + t * 16;
    sp[h] = static_cast<const float*>(a.sc) + (row >> a.bn_log2) * a.s_ld;
  }
  const int nchunks = a.K / 64;
  uint4 wv[U][2];
  float sv[U][2];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * 8;
      const bool in = c < nchunks;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wv[u][h] = in ? qd::ld_stream(wp[h] + int64_t(c) * 64) : make_uint4(0, 0, 0, 0);
        sv[u][h] = in ? __ldg(sp[h] + ((c * 64) >> a.bk_log2)) : 0.0f;
      }
    }
  };
  load(warp);
  ts::cuda::pdl_wait();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool has_row = g < a.M;
  for (int c0 = warp; c0 < nchunks; c0 += 8 * U) {
    if (c0 != warp) load(c0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * 8;
      if (c >= nchunks) break;
      const int kt = c * 64 + t * 16;
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
      if (has_row) {
        const uint4* xp = reinterpret_cast<const uint4*>(a.x + g * a.x_ld + kt);
        x0 = xp[0];
        x1 = xp[1];
      }
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t lo[4] = {wv[u][0].x, wv[u][0].y, wv[u][0].z, wv[u][0].w};
      const uint32_t hi[4] = {wv[u][1].x, wv[u][1].y, wv[u][1].z, wv[u][1].w};
#pragma unroll
      for (int st = 0; st < 4; ++st)
        qd::mma_bf16(p, qd::e4m3x2_bf16x2<0x1404>(lo[st]), qd::e4m3x2_bf16x2<0x1404>(hi[st]),
                     qd::e4m3x2_bf16x2<0x3424>(lo[st]), qd::e4m3x2_bf16x2<0x3424>(hi[st]), xw[2 * st], xw[2 * st + 1]);
      acc[0] = fmaf(p[0], sv[u][0], acc[0]);
      acc[1] = fmaf(p[1], sv[u][0], acc[1]);
      acc[2] = fmaf(p[2], sv[u][1], acc[2]);
      acc[3] = fmaf(p[3], sv[u][1], acc[3]);
    }
  }
  ts::cuda::pdl_trigger();
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  for (int o = threadIdx.x; o < 16 * a.M; o += 256) {
    const int f = o % 16, m = o / 16;
    const int64_t n = n0 + f;
    if (n >= a.N) continue;
    const int l = (f & 7) * 4 + (m >> 1), i = (f >= 8 ? 2 : 0) + (m & 1);
    float v = 0.0f;
#pragma unroll
    for (int ww = 0; ww < 8; ++ww) v += red[ww][i][l];
    a.out[m * a.out_ld + n] = __float2bfloat16(v);
  }
}

struct Fp8W {
  Tensor w, sc, s2;  // device
  std::vector<uint8_t> hw;
  std::vector<float> hs, hs2;
  int N, K;
  bool fp4;
  int64_t bytes() const { return w.nbytes() + sc.nbytes() + (s2.data ? s2.nbytes() : 0); }
};

Fp8W make_weight(int N, int K, bool fp4, uint64_t seed, bool keep_host) {
  Fp8W q;
  q.N = N;
  q.K = K;
  q.fp4 = fp4;
  const int64_t wb = fp4 ? int64_t(N) * K / 2 : int64_t(N) * K;
  Tensor h = Tensor::empty({N, fp4 ? K / 2 : K}, DType::u8);
  uint8_t* p = h.ptr<uint8_t>();
  uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < wb; ++i) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    uint8_t c = uint8_t(r >> 24);
    if (!fp4 && (c & 0x7f) == 0x7f) c ^= 1;  // no NaN
    p[i] = c;
  }
  if (fp4) {
    Tensor s = Tensor::empty({N, K / 16}, DType::u8);
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = uint8_t(0x30 + i % 16);
    Tensor s2 = Tensor::empty({N}, DType::f32);
    for (int i = 0; i < N; ++i) s2.ptr<float>()[i] = 1e-3f * float(1 + i % 3);
    if (keep_host) {
      q.hs.resize(size_t(s.numel()));
      for (int64_t i = 0; i < s.numel(); ++i) q.hs[size_t(i)] = ts::e4m3_to_f32(s.ptr<uint8_t>()[i]);
      q.hs2.assign(s2.ptr<float>(), s2.ptr<float>() + N);
    }
    q.sc = s.to(Device::cuda);
    q.s2 = s2.to(Device::cuda);
  } else {
    Tensor s = Tensor::empty({(N + 127) / 128, (K + 127) / 128}, DType::f32);
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = 1e-4f * float(1 + (i % 7));
    if (keep_host) q.hs.assign(s.ptr<float>(), s.ptr<float>() + s.numel());
    q.sc = s.to(Device::cuda);
  }
  if (keep_host) q.hw.assign(p, p + wb);
  q.w = h.to(Device::cuda);
  return q;
}

Tensor as_dtype(Tensor t, DType d) {
  t.dtype = d;  // same element size: a reinterpretation
  return t;
}

ts::ops::LinearWeight product_weight(const Fp8W& q) {
  ts::ops::LinearWeight w(q.fp4 ? q.w : as_dtype(q.w, DType::f8_e4m3));
  w.quant.scale = q.fp4 ? as_dtype(q.sc, DType::f8_e4m3) : q.sc;
  if (q.fp4) {
    w.dtype = DType::u8;
    w.quant.scale2 = q.s2;
    w.quant.block_k_log2 = 4;
    w.quant.nvfp4 = true;
    w.quant.format = "NVFP4";
  } else {
    w.quant.block_n_log2 = 7;
    w.quant.block_k_log2 = 7;
    w.quant.format = "fp8 block";
  }
  return w;
}

float e2m1(uint8_t c) {
  static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8) ? -v[c & 7] : v[c & 7];
}

// ref [M, rows] over the first `rows` rows.
std::vector<double> reference(const Fp8W& q, const std::vector<float>& x, int M, int rows) {
  std::vector<double> ref(size_t(M) * rows, 0.0);
  const int K = q.K;
  for (int n = 0; n < rows; ++n)
    for (int k = 0; k < K; ++k) {
      double wv;
      if (q.fp4) {
        const uint8_t b = q.hw[size_t(n) * (K / 2) + k / 2];
        wv = double(e2m1(k % 2 ? b >> 4 : b & 15)) * q.hs[size_t(n) * (K / 16) + k / 16] * q.hs2[size_t(n)];
      } else {
        wv = double(ts::e4m3_to_f32(q.hw[size_t(n) * K + k])) * q.hs[size_t(n / 128) * ((K + 127) / 128) + k / 128];
      }
      for (int m = 0; m < M; ++m) ref[size_t(m) * rows + n] += wv * x[size_t(m) * K + k];
    }
  return ref;
}

double check(const Tensor& out, const std::vector<double>& ref, int M, int N, int rows) {
  ts::cuda::synchronize();
  Tensor g = out.to(Device::cpu).to_f32();
  double num = 0, den = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < rows; ++n) {
      const double a = g.ptr<float>()[int64_t(m) * N + n], b = ref[size_t(m) * rows + n];
      if (std::isnan(a)) return INFINITY;
      num += (a - b) * (a - b);
      den += b * b;
    }
  return std::sqrt(num / std::max(den, 1e-30));
}

TmaArgs lab_args(const Tensor& x, const Fp8W& q, Tensor& out) {
  TmaArgs a{};
  a.x = x.ptr<__nv_bfloat16>();
  a.x_ld = x.row_stride();
  a.M = int(x.size(0));
  a.w = q.w.ptr<uint8_t>();
  a.w_ld = q.fp4 ? q.K / 2 : q.K;
  a.sc = q.sc.data;
  a.s_ld = q.fp4 ? q.K / 16 : (q.K + 127) / 128;
  a.bn_log2 = 7;
  a.bk_log2 = 7;
  a.s2 = q.fp4 ? q.s2.ptr<float>() : nullptr;
  a.out = out.ptr<__nv_bfloat16>();
  a.out_ld = out.row_stride();
  a.N = q.N;
  a.K = q.K;
  return a;
}

// variant: 0 = U4 B1 (the product's), 1 = U8 B1, 2 = U8 B2, 3 = U4 B3, 4 = U2 B4
void tcu(const Tensor& x, const Fp8W& q, Tensor& out, int variant) {
  const TmaArgs a = lab_args(x, q, out);
  const dim3 grid(unsigned((q.N + 15) / 16)), block(256);
  switch (variant) {
    case 0: return ts::cuda::launch(tcu_kernel<4, 1>, grid, block, 0, true, a);
    case 1: return ts::cuda::launch(tcu_kernel<8, 1>, grid, block, 0, true, a);
    case 2: return ts::cuda::launch(tcu_kernel<8, 2>, grid, block, 0, true, a);
    case 3: return ts::cuda::launch(tcu_kernel<4, 3>, grid, block, 0, true, a);
    default: return ts::cuda::launch(tcu_kernel<2, 4>, grid, block, 0, true, a);
  }
}
const char* const kTcuNames[] = {"U4B1", "U8B1", "U8B2", "U4B3", "U2B4"};

// Device time per call inside a CUDA graph of `n` calls (as the model's decode graphs run them:
// PDL edges, no host launch gaps); fn(i) issues call i.
double graph_us(int n, const std::function<void(int)>& fn) {
  ts::cuda::Graph g;
  try {
    g.begin_capture();
    for (int i = 0; i < n; ++i) fn(i);
    g.end_capture();
  } catch (const std::exception& e) {
    std::printf("graph capture failed: %s\n", e.what());
    return NAN;
  }
  return lab::time_us([&] { g.replay(); }, 20, 3) / n;
}

void tma_tc(const Tensor& x, const Fp8W& q, Tensor& out, int stages, int sms) {
  TmaArgs a{};
  a.x = x.ptr<__nv_bfloat16>();
  a.x_ld = x.row_stride();
  a.M = int(x.size(0));
  a.w = q.w.ptr<uint8_t>();
  a.w_ld = q.fp4 ? q.K / 2 : q.K;
  a.sc = q.sc.data;
  a.s_ld = q.fp4 ? q.K / 16 : (q.K + 127) / 128;
  a.bn_log2 = 7;
  a.bk_log2 = 7;
  a.s2 = q.fp4 ? q.s2.ptr<float>() : nullptr;
  a.out = out.ptr<__nv_bfloat16>();
  a.out_ld = out.row_stride();
  a.N = q.N;
  a.K = q.K;
  a.stages = stages;
  const size_t smem = size_t(stages) * size_t(q.fp4 ? stage_bytes<true>() : stage_bytes<false>());
  auto k = q.fp4 ? tma_tc_kernel<true> : tma_tc_kernel<false>;
  ts::cuda::set_smem(k, smem);
  const int tiles = (q.N + kTRows - 1) / kTRows;
  ts::cuda::launch(k, dim3(unsigned(std::min(tiles, sms))), dim3(9 * 32), smem, true, a);
}

}  // namespace

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  struct Shape {
    int N, K;
    const char* name;
  };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o_proj"}, {28672, 4096, "gate_up"}, {4096, 14336, "down"}};
  std::printf("| fmt | shape | M | MB | gemv us | tc us | tma us | gemv %%copy | tc %%copy | tma %%copy | tc x10 us | tma x10 us | tc x10 %%copy | tma x10 %%copy |\n");
  for (bool fp4 : {false, true})
    for (const Shape& s : shapes) {
      const double mb = double(s.N) * s.K * (fp4 ? 0.5 : 1.0) / 1e6;
      const int copies = int(std::max(2.0, std::ceil(300.0 / mb)));
      std::vector<Fp8W> ws;
      std::vector<ts::ops::LinearWeight> pw;
      for (int c = 0; c < copies; ++c) {
        ws.push_back(make_weight(s.N, s.K, fp4, uint64_t(c + 1) * 77 + s.N, c == 0));
        pw.push_back(product_weight(ws.back()));
      }
      for (int M : {1, 8}) {
        lab::Pair x = lab::rand_pair({M, s.K});
        std::vector<float> xh(x.h.ptr<float>(), x.h.ptr<float>() + x.h.numel());
        Tensor out = Tensor::empty({M, s.N}, DType::bf16, Device::cuda);
        const int rows = std::min(s.N, 300);
        const std::vector<double> ref = reference(ws[0], xh, M, rows);
        using QK = ts::ops::cuda::QuantKernel;
        double e;
        ts::ops::cuda::quant_linear_kernel(x.d, pw[0], out, nullptr, QK::gemv);
        e = check(out, ref, M, s.N, rows);
        std::printf("check %s %s M=%d gemv err %.2e %s\n", fp4 ? "nvfp4" : "fp8", s.name, M, e, lab::verdict(e));
        ts::ops::cuda::quant_linear_kernel(x.d, pw[0], out, nullptr, QK::tc);
        e = check(out, ref, M, s.N, rows);
        std::printf("check %s %s M=%d tc err %.2e %s\n", fp4 ? "nvfp4" : "fp8", s.name, M, e, lab::verdict(e));
        int it = 0;
        const double tg = lab::time_us([&] { ts::ops::cuda::quant_linear_kernel(x.d, pw[size_t(it++ % copies)], out, nullptr, QK::gemv); }, 60, 6);
        const double tt = lab::time_us([&] { ts::ops::cuda::quant_linear_kernel(x.d, pw[size_t(it++ % copies)], out, nullptr, QK::tc); }, 60, 6);
        double best = 1e30;
        int bi = 0;
        for (int ns : {4, 6, 8, 10}) {
          TS_CUDA_CHECK(cudaMemset(out.data, 0, out.nbytes()));
          tma_tc(x.d, ws[0], out, ns, sms);
          e = check(out, ref, M, s.N, rows);
          const double tb = lab::time_us([&] { tma_tc(x.d, ws[size_t(it++ % copies)], out, ns, sms); }, 60, 6);
          std::printf("  tma %s %s M=%d stages %d: %.2f us, %.0f GB/s, err %.2e %s\n", fp4 ? "nvfp4" : "fp8", s.name, M,
                      ns, tb, double(ws[0].bytes()) / (tb * 1e3), e, lab::verdict(e));
          if (tb < best) best = tb, bi = ns;
        }
        // Ten launches back to back (PDL on): the per-kernel ramp the single-launch time includes.
        const double tg10 = lab::time_us([&] { for (int r = 0; r < 10; ++r) ts::ops::cuda::quant_linear_kernel(x.d, pw[size_t(it++ % copies)], out, nullptr, QK::tc); }, 20, 3) / 10;
        const double tb10 = lab::time_us([&] { for (int r = 0; r < 10; ++r) tma_tc(x.d, ws[size_t(it++ % copies)], out, bi, sms); }, 20, 3) / 10;
        std::printf("  x10 %s %s M=%d: tc %.2f us, tma %.2f us per call\n", fp4 ? "nvfp4" : "fp8", s.name, M, tg10, tb10);
        {
          const int n = 20;
          const double gg = graph_us(n, [&](int i) { ts::ops::cuda::quant_linear_kernel(x.d, pw[size_t(i % copies)], out, nullptr, QK::gemv); });
          const double gt = graph_us(n, [&](int i) { ts::ops::cuda::quant_linear_kernel(x.d, pw[size_t(i % copies)], out, nullptr, QK::tc); });
          const double gm = graph_us(n, [&](int i) { tma_tc(x.d, ws[size_t(i % copies)], out, bi, sms); });
          std::printf("  graph %s %s M=%d: gemv %.2f us (%.1f%%), tc %.2f us (%.1f%%), tma %.2f us (%.1f%%)", fp4 ? "nvfp4" : "fp8",
                      s.name, M, gg, 100.0 * double(ws[0].bytes()) / (gg * 1e3) / ceiling, gt,
                      100.0 * double(ws[0].bytes()) / (gt * 1e3) / ceiling, gm, 100.0 * double(ws[0].bytes()) / (gm * 1e3) / ceiling);
          if (!fp4) {
            for (int v = 0; v < 5; ++v) {
              TS_CUDA_CHECK(cudaMemset(out.data, 0, out.nbytes()));
              tcu(x.d, ws[0], out, v);
              const double ev = check(out, ref, M, s.N, rows);
              const double gv = graph_us(n, [&](int i) { tcu(x.d, ws[size_t(i % copies)], out, v); });
              std::printf(", %s %.2f us (%.1f%%, err %.1e)", kTcuNames[v], gv, 100.0 * double(ws[0].bytes()) / (gv * 1e3) / ceiling, ev);
            }
          }
          std::printf("\n");
        }
        const double b = double(ws[0].bytes());
        auto pct = [&](double us) { return 100.0 * b / (us * 1e3) / ceiling; };
        std::printf("| %s | %s | %d | %.1f | %.2f | %.2f | %.2f (%d stages) | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f |\n",
                    fp4 ? "nvfp4" : "fp8", s.name, M, b / 1e6, tg, tt, best, bi, pct(tg), pct(tt), pct(best), tg10, tb10,
                    pct(tg10), pct(tb10));
      }
    }
  return 0;
}
