// Mixture of experts on CUDA: gated activations (glu), single-tensor cache writes, the router
// (moe_route) and the routed experts (moe_experts).
//
// moe_experts runs four kernels, none of which needs the host to know the routing:
//  1. moe_align: one CTA counting-sorts the T*k (token, slot) pairs by expert id — per-warp
//     counts over contiguous segments, an exclusive scan, then a stable placement (pairs of an
//     expert keep token order) — and cuts every expert's rows into work items of <= kRowsPerItem
//     rows. Outputs: perm (sorted row -> pair), inv (pair -> sorted row), items, item count.
//  2. moe_gemm<gate_up>: per (work item, 16-feature tile) CTA, act = glu(x_e W_gate^T, x_e W_up^T)
//     for the item's rows, x rows gathered through perm. Tensor cores in "swap AB" form: the
//     weight tile is the 16-row A operand, up to NT*8 token rows the 8-column B operand, so one
//     token costs no more weight traffic than 64 and decode streams each selected expert's
//     weights once. Fragments come straight from global memory with 16-byte loads (k is permuted
//     identically in A and B, so every lane loads 8 consecutive k). The 4 warps of a CTA split K
//     and their partial sums are added in a fixed order.
//  3. moe_gemm<down>: y = act W_down^T over the sorted rows, same kernel.
//  4. moe_combine: out[t] = sum_j weights[t, j] * y[inv[t, j]], j ascending, fp32 — the fixed
//     order of the CPU reference; no atomics.
// Routed experts kept as stored (FP8 e4m3 with block / channel / tensor / MXFP8 scales, NVFP4;
// ops::LinearWeight [E, rows, K] with per-expert scale rows) take the same sort and combine:
//  decode, about one row per routed-to expert: moe_qgemv<gate_up | down> per (work item, 8
//   features), one warp per feature streaming the selected expert's stored row once per 1-8 token
//   rows through the dense GEMV's row dot product (quant_dot.cuh) — only the active experts' bytes
//   are read;
//  small batches (1.2 to 32 rows per routed-to expert): moe_gemm<.., kQFp8 | kQFp4>, the tensor-core
//   kernel above reading the stored bytes and unpacking them to bf16 in registers (exact), the FP8
//   block scale applied per 32-k chunk, NVFP4's group scale folded into the unpacked values;
//  prefill: the experts are dequantized to bf16 a chunk (<= 1 GB) at a time (experts without rows skipped)
//   into workspace(3) and the chunk's work items run the bf16 moe_gemm above; the combine follows
//   once, so the result equals the bf16 path over the exactly dequantized weights.
// Every output element is a fixed sequence of k-chunk MMAs independent of how many rows share its
// expert or tile, so a token's result does not depend on the rest of the batch.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/quant_dot.cuh"
#include "ops/cuda/quant_linear.h"
#include "ops/moe_experts.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;

dim3 row_grid(int64_t rows, int64_t units) {
  TS_CHECK(rows <= 0x7fffffff, "cuda op: too many rows ({})", rows);
  int64_t y = ceil_div(units, kThreads);
  if (y < 1) y = 1;
  if (y > 65535) y = 65535;
  return dim3(unsigned(rows), unsigned(y));
}

__host__ __device__ inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// ---- activations ----------------------------------------------------------------------------------
// kind 0: silu(g) * u; 1: swiglu_oai (clamped, alpha-scaled sigmoid, u + 1).
__device__ __forceinline__ float glu_act(float g, float u, int kind, float alpha, float limit) {
  if (kind == 0) return g / (1.0f + __expf(-g)) * u;
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return g / (1.0f + __expf(-alpha * g)) * (u + 1.0f);
}

template <bool VEC>
__global__ void glu_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, __nv_bfloat16* __restrict__ out,
                           int64_t out_ld, int I, int kind, float alpha, float limit) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* g = x + t * x_ld;
  const __nv_bfloat16* u = g + I;
  __nv_bfloat16* o = out + t * out_ld;
  if (VEC) {
    const int nv = I / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      BF8 gv, uv;
      gv.u = reinterpret_cast<const uint4*>(g)[i];
      uv.u = reinterpret_cast<const uint4*>(u)[i];
      float gf[8], uf[8], of[8];
      bf8_to_f32(gv, gf);
      bf8_to_f32(uv, uf);
#pragma unroll
      for (int j = 0; j < 8; ++j) of[j] = glu_act(gf[j], uf[j], kind, alpha, limit);
      reinterpret_cast<uint4*>(o)[i] = f32_to_bf8(of).u;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < I; i += gridDim.y * blockDim.x)
      o[i] = __float2bfloat16(glu_act(__bfloat162float(g[i]), __bfloat162float(u[i]), kind, alpha, limit));
  }
  pdl_trigger();
}

// ---- router ---------------------------------------------------------------------------------------
constexpr int kRouteWarps = 4;

struct RouteArgs {
  const float* logits;
  int64_t l_ld;
  const float* bias_f;          // one of these or neither
  const __nv_bfloat16* bias_h;
  int32_t* ids;
  int64_t i_ld;
  float* w;
  int64_t w_ld;
  int T, E, k, n_group, topk_group, gsize;
  int sigmoid, renorm;
  float eps, scale;
};

// Per-warp scratch: p, choice, group scores (floats), picked ids (int), taken / kept flags.
__host__ __device__ inline size_t route_smem_per_warp(int E) { return align_up(size_t(E) * (4 * 4 + 2), 16); }

// Strict total order "a before b": larger value, then lower index; index -1 means "none".
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

// Best entry of v[lo, hi) under `better`, skipping taken[e] (if taken) and index `skip`.
// Every lane returns the same index (-1 if nothing qualifies).
__device__ int warp_argmax(const float* v, const uint8_t* taken, int lo, int hi, int skip) {
  const int lane = threadIdx.x & 31;
  float bv = -INFINITY;
  int bi = -1;
  for (int e = lo + lane; e < hi; e += 32) {
    if (e == skip || (taken && taken[e])) continue;
    if (better(v[e], e, bv, bi)) {
      bv = v[e];
      bi = e;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  return bi;
}

// One warp per token (the CPU reference's moe_route, step for step).
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(RouteArgs a) {
  extern __shared__ __align__(16) unsigned char route_sm[];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= a.T) return;  // no block-wide barriers below
  const int E = a.E;
  unsigned char* base = route_sm + size_t(warp) * route_smem_per_warp(E);
  float* p = reinterpret_cast<float*>(base);
  float* ch = p + E;
  float* gs = ch + E;
  int* sel = reinterpret_cast<int*>(gs + E);
  uint8_t* taken = reinterpret_cast<uint8_t*>(sel + E);
  uint8_t* kept = taken + E;
  const float* lg = a.logits + int64_t(t) * a.l_ld;

  if (!a.sigmoid) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    double s = 0.0;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(lg[e] - mx);
      p[e] = v;
      s += v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    const float inv = float(1.0 / s);
    for (int e = lane; e < E; e += 32) {
      p[e] *= inv;
      ch[e] = p[e];
    }
  } else {
    for (int e = lane; e < E; e += 32) {
      const float v = 1.0f / (1.0f + expf(-lg[e]));
      const float b = a.bias_f ? a.bias_f[e] : a.bias_h ? __bfloat162float(a.bias_h[e]) : 0.0f;
      p[e] = v;
      ch[e] = v + b;
    }
  }
  for (int e = lane; e < E; e += 32) {
    taken[e] = 0;
    kept[e] = 0;
  }
  __syncwarp();

  if (a.n_group > 1) {
    // Group score: the sum of its two best choices (one if groups are single experts).
    for (int g = 0; g < a.n_group; ++g) {
      const int lo = g * a.gsize, hi = lo + a.gsize;
      const int i1 = warp_argmax(ch, nullptr, lo, hi, -1);
      float s = 0.0f;
      s += ch[i1];
      if (a.gsize >= 2) {
        const int i2 = warp_argmax(ch, nullptr, lo, hi, i1);
        s += ch[i2];
      }
      if (lane == 0) gs[g] = s;
    }
    __syncwarp();
    for (int i = 0; i < a.topk_group; ++i) {
      const int g = warp_argmax(gs, kept, 0, a.n_group, -1);
      if (lane == 0) kept[g] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (!kept[e / a.gsize]) ch[e] = 0.0f;  // transformers masks with 0, not -inf
    __syncwarp();
  }

  for (int i = 0; i < a.k; ++i) {
    const int e = warp_argmax(ch, taken, 0, E, -1);
    if (lane == 0) taken[e] = 1;
    __syncwarp();
  }
  // Picked experts in ascending id order.
  int cnt = 0;
  for (int b0 = 0; b0 < E; b0 += 32) {
    const int e = b0 + lane;
    const bool f = e < E && taken[e];
    const unsigned m = __ballot_sync(kFull, f);
    if (f) sel[cnt + __popc(m & ((1u << lane) - 1u))] = e;
    cnt += __popc(m);
  }
  __syncwarp();
  float denom = 0.0f;
  for (int j = 0; j < a.k; ++j) denom += p[sel[j]];
  denom += a.eps;
  for (int j = lane; j < a.k; j += 32) {
    const int e = sel[j];
    float wv = p[e];
    if (a.renorm) wv /= denom;
    a.ids[int64_t(t) * a.i_ld + j] = e;
    a.w[int64_t(t) * a.w_ld + j] = wv * a.scale;
  }
  pdl_trigger();
}

// ---- expert sort (counting sort by expert id) ------------------------------------------------------
constexpr int kRowsPerItem = 64;

struct AlignArgs {
  const int32_t* ids;
  int64_t ids_ld;
  int T, k, E;
  int32_t* offsets;  // [E + 1]
  int32_t* perm;     // [N] sorted row -> pair (t * k + j)
  int32_t* inv;      // [N] pair -> sorted row (-1: id out of range, dropped)
  int4* items;       // [max_items] (expert, row_begin, row_end, 0)
  int32_t* meta;     // [0]: number of items
};

// In-place exclusive scan of v[0, n) in shared memory by the whole block; returns the total.
// red: 33 ints of shared scratch.
__device__ int block_exclusive_scan(int* v, int n, int* red) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  const int per = (n + nt - 1) / nt, lo = min(n, tid * per), hi = min(n, lo + per);
  int s = 0;
  for (int i = lo; i < hi; ++i) s += v[i];
  int x = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) red[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const int wv = lane < nw ? red[lane] : 0;
    int wx = wv;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, wx, o);
      if (lane >= o) wx += y;
    }
    if (lane < nw) red[lane] = wx - wv;
    if (lane == 31) red[32] = wx;
  }
  __syncthreads();
  int run = red[warp] + x - s;
  for (int i = lo; i < hi; ++i) {
    const int c = v[i];
    v[i] = run;
    run += c;
  }
  const int total = red[32];
  __syncthreads();
  return total;
}

__global__ void moe_align_kernel(AlignArgs a) {
  extern __shared__ int align_sm[];
  pdl_wait();
  const int nt = blockDim.x, nw = nt >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int E = a.E, N = a.T * a.k;
  int* wc = align_sm;       // [nw][E] per-warp counts, then per-warp start within the expert
  int* cnt = wc + nw * E;   // [E] counts, then offsets
  int* ich = cnt + E;       // [E] items per expert, then first item
  int* red = ich + E;       // [33]
  for (int i = tid; i < nw * E; i += nt) wc[i] = 0;
  __syncthreads();
  const int seg = (N + nw - 1) / nw, s0 = min(N, warp * seg), s1 = min(N, s0 + seg);
  auto expert_of = [&](int i) {
    if (i >= s1) return -1;
    const int e = a.ids[int64_t(i / a.k) * a.ids_ld + i % a.k];
    return (e >= 0 && e < E) ? e : -1;
  };
  for (int b0 = s0; b0 < s1; b0 += 32) {
    const int e = expert_of(b0 + lane);
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && lane == __ffs(peers) - 1) wc[warp * E + e] += __popc(peers);
  }
  __syncthreads();
  for (int e = tid; e < E; e += nt) {
    int run = 0;
    for (int w = 0; w < nw; ++w) {
      const int c = wc[w * E + e];
      wc[w * E + e] = run;
      run += c;
    }
    cnt[e] = run;
    ich[e] = (run + kRowsPerItem - 1) / kRowsPerItem;
  }
  __syncthreads();
  const int total = block_exclusive_scan(cnt, E, red);
  const int n_items = block_exclusive_scan(ich, E, red);
  for (int e = tid; e < E; e += nt) {
    a.offsets[e] = cnt[e];
    const int beg = cnt[e], end = e + 1 < E ? cnt[e + 1] : total;
    int it = ich[e];
    for (int r = beg; r < end; r += kRowsPerItem) a.items[it++] = make_int4(e, r, min(end, r + kRowsPerItem), 0);
  }
  if (tid == 0) {
    a.offsets[E] = total;
    a.meta[0] = n_items;
  }
  // Stable placement: pairs of one expert keep their (token, slot) order.
  for (int b0 = s0; b0 < s1; b0 += 32) {
    const int i = b0 + lane;
    const int e = expert_of(i);
    const unsigned peers = __match_any_sync(kFull, e);
    int pos = -1;
    if (e >= 0) pos = cnt[e] + wc[warp * E + e] + __popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) wc[warp * E + e] += __popc(peers);
    __syncwarp();
    if (i < s1) {
      a.inv[i] = pos;
      if (pos >= 0) a.perm[pos] = i;
    }
  }
  pdl_trigger();
}

// ---- grouped expert GEMM (tensor cores, swap AB) ---------------------------------------------------
constexpr int kKW = 4;   // warps per CTA, splitting K
constexpr int kFT = 16;  // output features per CTA (the MMA's M)

struct GemmArgs {
  const __nv_bfloat16* w;  // [E, rows, K]
  int64_t w_expert;        // elements per expert
  int64_t up_off;          // gate_up: elements from a gate row to its up row (I * K)
  int n_feat, K;
  const __nv_bfloat16* src;  // gate_up: x (token rows, gathered via perm); down: act (sorted rows)
  int64_t src_ld;
  const int32_t* perm;
  int topk;
  const int4* items;
  const int32_t* meta;
  __nv_bfloat16* out;  // [N, n_feat]
  int64_t out_ld;
  int act_kind;
  float alpha, limit;
  int e_lo = 0, e_hi = 0x7fffffff;  // experts [e_lo, e_hi) only, w holding expert e_lo first
  // Experts kept as stored (moe_gemm_kernel's Q = kQFp8 / kQFp4; w unused): flat weight rows
  // [E * q_rows, q_ld bytes], FP8 f32 scales [(E * q_rows) >> bn_log2, qs_ld] or NVFP4 E4M3 codes
  // [E * q_rows, qs_ld] with f32 scale2 [E * q_rows]; the up row of gate row f is f + n_feat.
  const uint8_t* qw = nullptr;
  int64_t q_ld = 0;
  const void* qsc = nullptr;
  int64_t qs_ld = 0;
  const float* qs2 = nullptr;
  int q_rows = 0;
  int bn_log2 = 0, bk_log2 = 0;
};

// moe_gemm_kernel's weight forms: bf16, FP8 e4m3 with f32 block scales (k blocks >= 32), NVFP4.
constexpr int kQBf16 = 0, kQFp8 = 1, kQFp4 = 2;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 8 bf16 of row[k0, k0 + 8), zero outside [0, K) or for a null row.
template <bool VEC, bool STREAM>
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* row, int k0, int K) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!row) return v;
  if (VEC) {
    if (k0 < K) v = STREAM ? ld_stream(row + k0) : __ldg(reinterpret_cast<const uint4*>(row + k0));
    return v;
  }
  uint16_t h[8];
  const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = k0 + i < K ? r[k0 + i] : uint16_t(0);
  v.x = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
  v.y = uint32_t(h[2]) | (uint32_t(h[3]) << 16);
  v.z = uint32_t(h[4]) | (uint32_t(h[5]) << 16);
  v.w = uint32_t(h[6]) | (uint32_t(h[7]) << 16);
  return v;
}

using qdot::mma_bf16;  // quant_dot.cuh

// k permutation: lane (gq, tq) holds physical k = c*32 + tq*8 + [0, 8) of its rows. MMA step s
// of the chunk takes elements 4s..4s+3: logical k (2tq, 2tq+1) <- elements 4s, 4s+1 and logical
// (2tq+8, 2tq+9) <- 4s+2, 4s+3, for A rows and B columns alike.
__device__ __forceinline__ uint32_t lo_pair(const uint4& v, int s) { return s == 0 ? v.x : v.z; }
__device__ __forceinline__ uint32_t hi_pair(const uint4& v, int s) { return s == 0 ? v.y : v.w; }

// grid: x = work item (blocks past the item count exit), y = 16-feature tile.
// Q = kQFp8 / kQFp4 (experts kept as stored, decode and small batches): the lane's 8 weights of
// a chunk are 8 bytes (FP8) or 4 (NVFP4) and become bf16 in registers exactly, as in the dense
// tensor-core decode GEMV (quant_dot.cuh): FP8 e4m3 x 2^-120 by a bit move and one bf16x2
// multiply by 2^120, the chunk's MMAs into a temporary that takes the row block's f32 scale once
// (a chunk of 32 k lies in one k block: 2^bk >= 32); NVFP4 e2m1 x (group scale x 2^118) exact
// (the lane's 8 values lie in one 16-value group), scale2 x 2^8 per feature row at the end.
// VEC (whole 16-byte rows of B) and K % 32 == 0 hold for these.
template <int NT, bool GATE_UP, bool VEC, int Q = kQBf16>
__global__ void __launch_bounds__(kKW * 32) moe_gemm_kernel(GemmArgs a) {
  constexpr int U = NT <= 2 ? 4 : NT == 4 ? 2 : 1;  // k-chunks in flight per warp
  constexpr int NA = GATE_UP ? 2 : 1;                 // A tiles: gate (and up)
  __shared__ float red[kKW - 1][NA][NT][4][32];
  pdl_wait();
  const int item = blockIdx.x;
  if (item >= a.meta[0]) return;
  const int4 it = a.items[item];
  const int e = it.x, rb = it.y, re = it.z;
  if (e < a.e_lo || e >= a.e_hi) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int f0 = blockIdx.y * kFT;
  const __nv_bfloat16* we = Q == kQBf16 ? a.w + int64_t(e - a.e_lo) * a.w_expert : nullptr;
  const __nv_bfloat16* arow[NA][2];
  const uint8_t* qrow[NA][2];  // Q: the stored row (null past n_feat)
  int64_t qn[NA][2];           // Q: its flat row index
#pragma unroll
  for (int na = 0; na < NA; ++na)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int f = f0 + gq + 8 * h;
      if constexpr (Q == kQBf16) {
        arow[na][h] = f < a.n_feat ? we + (na ? a.up_off : 0) + int64_t(f) * a.K : nullptr;
      } else {
        qn[na][h] = int64_t(e) * a.q_rows + (f < a.n_feat ? f : 0) + (na ? a.n_feat : 0);
        qrow[na][h] = f < a.n_feat ? a.qw + qn[na][h] * a.q_ld : nullptr;
      }
    }
  const int nchunks = (a.K + 31) / 32;

  for (int p0 = rb; p0 < re; p0 += NT * 8) {
    const __nv_bfloat16* brow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int p = p0 + nt * 8 + gq;
      brow[nt] = nullptr;
      if (p < re) {
        const int64_t r = GATE_UP ? int64_t(a.perm[p] / a.topk) : int64_t(p);
        brow[nt] = a.src + r * a.src_ld;
      }
    }
    float acc[NA][NT][4];
#pragma unroll
    for (int na = 0; na < NA; ++na)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[na][nt][0] = acc[na][nt][1] = acc[na][nt][2] = acc[na][nt][3] = 0.0f;

    for (int c0 = warp; c0 < nchunks; c0 += kKW * U) {
      uint4 av[U][NA][2], bv[U][NT];
      float qs[U][NA][2];  // FP8: the chunk's block scale per A row
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k0 = (c0 + u * kKW) * 32 + tq * 8;  // >= K past the last chunk: zeros
#pragma unroll
        for (int na = 0; na < NA; ++na)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (Q == kQBf16) {
              av[u][na][h] = load8<VEC, true>(arow[na][h], k0, a.K);
            } else if constexpr (Q == kQFp8) {
              uint2 r = make_uint2(0, 0);
              qs[u][na][h] = 0.0f;
              if (qrow[na][h] && k0 < a.K) {
                r = qdot::ld_stream8(qrow[na][h] + k0);
                qs[u][na][h] = __ldg(static_cast<const float*>(a.qsc) + (qn[na][h] >> a.bn_log2) * a.qs_ld +
                                     (k0 >> a.bk_log2));
              }
              av[u][na][h] = make_uint4(qdot::e4m3x2_bf16x2<0x1404>(r.x), qdot::e4m3x2_bf16x2<0x3424>(r.x),
                                        qdot::e4m3x2_bf16x2<0x1404>(r.y), qdot::e4m3x2_bf16x2<0x3424>(r.y));
            } else {
              uint32_t r = 0;
              float gs = 0.0f;
              if (qrow[na][h] && k0 < a.K) {
                r = __ldg(reinterpret_cast<const uint32_t*>(qrow[na][h] + k0 / 2));
                gs = qdot::e4m3_value(__ldg(static_cast<const uint8_t*>(a.qsc) + qn[na][h] * a.qs_ld + k0 / 16)) *
                     0x1p118f;
              }
              const __nv_bfloat162 fg = __float2bfloat162_rn(gs);
              av[u][na][h] = make_uint4(qdot::e2m1x2_bf16x2<0>(r, fg), qdot::e2m1x2_bf16x2<1>(r, fg),
                                        qdot::e2m1x2_bf16x2<2>(r, fg), qdot::e2m1x2_bf16x2<3>(r, fg));
            }
          }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) bv[u][nt] = load8<VEC, false>(brow[nt], k0, a.K);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float p[NA][NT][4];  // FP8: this chunk's products, before its scale
        if constexpr (Q == kQFp8) {
#pragma unroll
          for (int na = 0; na < NA; ++na)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) p[na][nt][0] = p[na][nt][1] = p[na][nt][2] = p[na][nt][3] = 0.0f;
        }
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int na = 0; na < NA; ++na) {
            const uint32_t a0 = lo_pair(av[u][na][0], s), a1 = lo_pair(av[u][na][1], s);
            const uint32_t a2 = hi_pair(av[u][na][0], s), a3 = hi_pair(av[u][na][1], s);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              mma_bf16(Q == kQFp8 ? p[na][nt] : acc[na][nt], a0, a1, a2, a3, lo_pair(bv[u][nt], s),
                       hi_pair(bv[u][nt], s));
          }
        if constexpr (Q == kQFp8) {
#pragma unroll
          for (int na = 0; na < NA; ++na)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[na][nt][i] = fmaf(p[na][nt][i], qs[u][na][i >> 1], acc[na][nt][i]);
        }
      }
    }
    // K-split partials: warps 1.. hand theirs to warp 0, which adds them in warp order.
    if (warp > 0) {
#pragma unroll
      for (int na = 0; na < NA; ++na)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[warp - 1][na][nt][i][lane] = acc[na][nt][i];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int w = 0; w < kKW - 1; ++w)
#pragma unroll
        for (int na = 0; na < NA; ++na)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[na][nt][i] += red[w][na][nt][i][lane];
      // C fragment: element i is feature f0 + gq + 8 (i >> 1), token column 2 tq + (i & 1).
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int f = f0 + gq + 8 * (i >> 1), p = p0 + nt * 8 + 2 * tq + (i & 1);
          if (f < a.n_feat && p < re) {
            float g = acc[0][nt][i], up = acc[NA - 1][nt][i];
            if constexpr (Q == kQFp4) {  // the rows' scale2 and the 2^8 (e2m1x2_bf16x2)
              g *= a.qs2[qn[0][i >> 1]] * 256.0f;
              up *= a.qs2[qn[NA - 1][i >> 1]] * 256.0f;
            }
            const float v = GATE_UP ? glu_act(g, up, a.act_kind, a.alpha, a.limit) : g;
            a.out[int64_t(p) * a.out_ld + f] = __float2bfloat16(v);
          }
        }
    }
    __syncthreads();  // red is reused by the next pass
  }
  pdl_trigger();
}

// ---- grouped GEMV over experts kept as stored (decode) ---------------------------------------------
constexpr int kQW = 8;  // warps (output features) per CTA
constexpr int kQuantGemvAutoRows = 8;  // gemv policy / no tensor-core form: the GEMV while the expected rows per expert <= this
constexpr int kQuantMmaAutoRows = 32;  // auto: the tensor-core form over stored experts to here
constexpr double kQuantMmaMinRows = 1.2;  // auto: ... from here (rows per routed-to expert, below)

struct QGemvArgs {
  const uint8_t* w;  // flat [E * rows, K bytes (FP8) or K/2 (NVFP4)]
  int64_t w_ld;      // bytes per row
  const void* sc;    // FP8: f32 [E * rows >> bn, scols]; NVFP4: E4M3 codes [E * rows, K / 16]
  int64_t s_ld;      // scale elements per scale row
  const float* s2;   // NVFP4: f32 [E * rows]
  int rows;          // weight rows per expert (2I for gate_up, H for down)
  int bn_log2, bk_log2;
  int n_feat, K;     // outputs per pair (I or H), reduction length
  const __nv_bfloat16* src;
  int64_t src_ld;
  const int32_t* perm;
  int topk;
  const int4* items;
  const int32_t* meta;
  __nv_bfloat16* out;
  int64_t out_ld;
  int act_kind;
  float alpha, limit;
};

// grid: x = work item (blocks past the item count exit), y = 8-feature group; warp = feature f.
// gate_up: act[p, f] = glu(x_p . W_e[f], x_p . W_e[I + f]); down: y[p, f] = act_p . W_e[f], for the
// item's rows p, R at a time (each pass re-streams the row; decode has one pass).
template <int R, bool GATE_UP, bool FP4>
__global__ void __launch_bounds__(kQW * 32) moe_qgemv_kernel(QGemvArgs a) {
  constexpr int NA = GATE_UP ? 2 : 1;
  pdl_wait();
  const int item = blockIdx.x;
  if (item >= a.meta[0]) return;
  const int4 it = a.items[item];
  const int e = it.x, rb = it.y, re = it.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f = blockIdx.y * kQW + warp;
  if (f >= a.n_feat) return;
  const uint8_t* wr[NA];
  const void* sr[NA];
  float g2[NA];
#pragma unroll
  for (int na = 0; na < NA; ++na) {
    const int64_t n = int64_t(e) * a.rows + f + (na ? a.n_feat : 0);  // flat weight row
    wr[na] = a.w + n * a.w_ld;
    if (FP4) {
      sr[na] = static_cast<const uint8_t*>(a.sc) + n * a.s_ld;
      g2[na] = a.s2[n];
    } else {
      sr[na] = static_cast<const float*>(a.sc) + (n >> a.bn_log2) * a.s_ld;
      g2[na] = 1.0f;
    }
  }
  for (int p0 = rb; p0 < re; p0 += R) {
    const __nv_bfloat16* xr[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int p = min(p0 + j, re - 1);  // past the item: a valid row, result dropped
      const int64_t r = GATE_UP ? int64_t(a.perm[p] / a.topk) : int64_t(p);
      xr[j] = a.src + r * a.src_ld;
    }
    float acc[NA][R];
#pragma unroll
    for (int na = 0; na < NA; ++na) {
#pragma unroll
      for (int j = 0; j < R; ++j) acc[na][j] = 0.0f;
      if (FP4) qdot::fp4_row_dot<R>(wr[na], static_cast<const uint8_t*>(sr[na]), a.K, xr, acc[na], lane);
      else qdot::fp8_row_dot<R>(wr[na], static_cast<const float*>(sr[na]), a.bk_log2, a.K, xr, acc[na], lane);
#pragma unroll
      for (int j = 0; j < R; ++j) acc[na][j] = warp_sum(acc[na][j]) * g2[na];
    }
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (p0 + j >= re) break;
        const float v = GATE_UP ? glu_act(acc[0][j], acc[NA - 1][j], a.act_kind, a.alpha, a.limit) : acc[0][j];
        a.out[int64_t(p0 + j) * a.out_ld + f] = __float2bfloat16(v);
      }
    }
  }
  pdl_trigger();
}

template <int R, bool GATE_UP>
void qgemv_launch(const QGemvArgs& g, int64_t items, bool fp4) {
  const dim3 grid(unsigned(items), unsigned(ceil_div(g.n_feat, kQW)));
  if (fp4) launch(moe_qgemv_kernel<R, GATE_UP, true>, grid, dim3(kQW * 32), 0, true, g);
  else launch(moe_qgemv_kernel<R, GATE_UP, false>, grid, dim3(kQW * 32), 0, true, g);
}

template <bool GATE_UP>
void qgemv_dispatch(int r, const QGemvArgs& g, int64_t items, bool fp4) {
  switch (r) {
    case 1: qgemv_launch<1, GATE_UP>(g, items, fp4); break;
    case 2: qgemv_launch<2, GATE_UP>(g, items, fp4); break;
    case 4: qgemv_launch<4, GATE_UP>(g, items, fp4); break;
    default: qgemv_launch<8, GATE_UP>(g, items, fp4); break;
  }
}

// ---- combine ---------------------------------------------------------------------------------------
template <bool VEC>
__global__ void moe_combine_kernel(const __nv_bfloat16* __restrict__ y, int64_t y_ld, const int32_t* __restrict__ inv,
                                   const float* __restrict__ w, int64_t w_ld, int topk, __nv_bfloat16* __restrict__ out,
                                   int64_t out_ld, int H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __nv_bfloat16* o = out + t * out_ld;
  if (VEC) {
    const int nv = H / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < topk; ++j) {
        const int pos = inv[t * topk + j];
        if (pos < 0) continue;
        const float wt = w[t * w_ld + j];
        BF8 v;
        v.u = reinterpret_cast<const uint4*>(y + int64_t(pos) * y_ld)[i];
        float f[8];
        bf8_to_f32(v, f);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[q] += f[q] * wt;
      }
      reinterpret_cast<uint4*>(o)[i] = f32_to_bf8(acc).u;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < topk; ++j) {
        const int pos = inv[t * topk + j];
        if (pos < 0) continue;
        acc += __bfloat162float(y[int64_t(pos) * y_ld + i]) * w[t * w_ld + j];
      }
      o[i] = __float2bfloat16(acc);
    }
  }
  pdl_trigger();
}

template <int NT, bool GATE_UP>
void gemm_launch(const GemmArgs& g, int64_t items, bool vec, int q) {
  const dim3 grid(unsigned(items), unsigned(ceil_div(g.n_feat, kFT)));
  if (q == kQFp8) launch(moe_gemm_kernel<NT, GATE_UP, true, kQFp8>, grid, dim3(kKW * 32), 0, true, g);
  else if (q == kQFp4) launch(moe_gemm_kernel<NT, GATE_UP, true, kQFp4>, grid, dim3(kKW * 32), 0, true, g);
  else if (vec) launch(moe_gemm_kernel<NT, GATE_UP, true>, grid, dim3(kKW * 32), 0, true, g);
  else launch(moe_gemm_kernel<NT, GATE_UP, false>, grid, dim3(kKW * 32), 0, true, g);
}

// nt: token tiles of 8 per pass (1, 2, 4, 8); q: the weights' form (kQBf16 / kQFp8 / kQFp4).
template <bool GATE_UP>
void gemm_dispatch(int nt, const GemmArgs& g, int64_t items, bool vec, int q = kQBf16) {
  switch (nt) {
    case 1: gemm_launch<1, GATE_UP>(g, items, vec, q); break;
    case 2: gemm_launch<2, GATE_UP>(g, items, vec, q); break;
    case 4: gemm_launch<4, GATE_UP>(g, items, vec, q); break;
    default: gemm_launch<8, GATE_UP>(g, items, vec, q); break;
  }
}

}  // namespace


void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale) {
  // kv_write without the v half is exactly a single-tensor paged write (bf16 or FP8).
  if (x.ndim == 3 && x.size(0) == 0) return;
  Tensor none;
  ::ts::ops::cuda::kv_write(x, none, cache, none, slot_mapping, KvScales{fp8_scale, 1.0f});
}

void glu(const Tensor& x, Tensor& out, const GluAct& act) {
  check_dev(x, DType::bf16, "glu x");
  check_dev(out, DType::bf16, "glu out");
  const int64_t I = out.size(-1);
  TS_CHECK(x.size(-1) == 2 * I && x.rows() == out.rows(), "glu: x {} out {}", x.shape_str(), out.shape_str());
  const int64_t T = x.rows();
  if (T == 0 || I == 0) return;
  const int64_t xld = x.row_stride(), old = out.row_stride();
  const int kind = act.kind == GluKind::silu ? 0 : 1;
  if (vec8_ok(x.data, I, xld) && vec8_ok(out.data, I, old))
    launch(glu_kernel<true>, row_grid(T, I / 8), dim3(kThreads), 0, true, x.ptr<__nv_bfloat16>(), xld,
           out.ptr<__nv_bfloat16>(), old, int(I), kind, act.alpha, act.limit);
  else
    launch(glu_kernel<false>, row_grid(T, I), dim3(kThreads), 0, true, x.ptr<__nv_bfloat16>(), xld,
           out.ptr<__nv_bfloat16>(), old, int(I), kind, act.alpha, act.limit);
}

void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights) {
  check_dev(logits, DType::f32, "moe_route logits");
  check_dev(ids, DType::i32, "moe_route ids");
  check_dev(weights, DType::f32, "moe_route weights");
  const int64_t T = logits.rows();
  const int E = int(logits.size(-1)), k = r.top_k;
  TS_CHECK(k >= 1 && k <= E, "moe_route: top_k {} with {} experts", k, E);
  TS_CHECK(r.n_group >= 1 && E % r.n_group == 0 && r.topk_group >= 1 && r.topk_group <= r.n_group,
           "moe_route: {} experts in {} groups, topk_group {}", E, r.n_group, r.topk_group);
  TS_CHECK(ids.rows() == T && weights.rows() == T && ids.size(-1) == k && weights.size(-1) == k,
           "moe_route: ids {} weights {} for {} tokens, top_k {}", ids.shape_str(), weights.shape_str(), T, k);
  const bool has_bias = bias && bias->data;
  if (has_bias) {
    TS_CHECK(bias->device == Device::cuda && (bias->dtype == DType::f32 || bias->dtype == DType::bf16) &&
                 bias->is_contiguous() && bias->numel() == E,
             "moe_route: bias must be a contiguous f32/bf16 GPU vector of {} entries, got {}", E, bias->shape_str());
  }
  TS_CHECK(r.scoring == MoeScoring::sigmoid || (!has_bias && r.n_group == 1),
           "moe_route: correction bias and groups need sigmoid scoring");
  TS_CHECK(E <= 2048, "moe_route: {} experts (at most 2048)", E);
  if (T == 0) return;
  RouteArgs a{};
  a.logits = logits.ptr<float>();
  a.l_ld = logits.row_stride();
  a.bias_f = has_bias && bias->dtype == DType::f32 ? bias->ptr<float>() : nullptr;
  a.bias_h = has_bias && bias->dtype == DType::bf16 ? bias->ptr<__nv_bfloat16>() : nullptr;
  a.ids = ids.ptr<int32_t>();
  a.i_ld = ids.row_stride();
  a.w = weights.ptr<float>();
  a.w_ld = weights.row_stride();
  a.T = int(T);
  a.E = E;
  a.k = k;
  a.n_group = r.n_group;
  a.topk_group = r.topk_group;
  a.gsize = E / r.n_group;
  a.sigmoid = r.scoring == MoeScoring::sigmoid;
  a.renorm = r.renormalize;
  a.eps = r.renorm_eps;
  a.scale = r.scale;
  const size_t smem = kRouteWarps * route_smem_per_warp(E);
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    set_smem(moe_route_kernel, smem);
    smem_set = smem;
  }
  launch(moe_route_kernel, dim3(unsigned(ceil_div(T, kRouteWarps))), dim3(kRouteWarps * 32), smem, true, a);
}

namespace {

// A routed-expert weight kept as stored: data [E, R, K or K/2], scales [E, SR, SC] (R a multiple
// of the row block), scale2 [E, R] (NVFP4), on the GPU, contiguous.
void check_quant_experts(const LinearWeight& w, int64_t E, int64_t R, int64_t K, const char* what) {
  const QuantScales& q = w.quant;
  const bool fp4 = q.nvfp4;
  TS_CHECK(w.ndim == 3 && w.device == Device::cuda && w.is_contiguous() && w.size(0) == E && w.size(1) == R &&
               expert_in_features(w) == K && w.dtype == (fp4 ? DType::u8 : DType::f8_e4m3),
           "moe_experts: {} must be a quantized [{}, {}, {}] expert weight, got {} {}", what, E, R, K,
           dtype_name(w.dtype), w.shape_str());
  TS_CHECK(q.scale.ndim == 3 && q.scale.is_contiguous() && q.scale.device == Device::cuda && q.scale.size(0) == E &&
               q.scale.dtype == (fp4 ? DType::f8_e4m3 : DType::f32),
           "moe_experts: {} scales {} for {}", what, q.scale.shape_str(), w.shape_str());
  if (fp4) {
    TS_CHECK(q.scale.size(1) == R && q.scale.size(2) == K / 16 && K % 32 == 0 && q.scale2.numel() == E * R &&
                 q.scale2.dtype == DType::f32 && q.scale2.is_contiguous() && q.scale2.device == Device::cuda,
             "moe_experts: NVFP4 {} {} needs K % 32 == 0, E4M3 scales [E, R, K/16] (got {}) and scale2 [E, R]", what,
             w.shape_str(), q.scale.shape_str());
    return;
  }
  TS_CHECK(q.block_k_log2 >= 4 && q.block_k_log2 < 31 && q.block_n_log2 >= 0 && q.block_n_log2 < 31 && K % 16 == 0 &&
               R % (int64_t(1) << q.block_n_log2) == 0 && q.scale.size(1) == (R >> q.block_n_log2) &&
               q.scale.size(2) == ceil_div(K, int64_t(1) << q.block_k_log2),
           "moe_experts: FP8 {} {} with blocks 2^{} x 2^{} and scales {}", what, w.shape_str(), q.block_n_log2,
           q.block_k_log2, q.scale.shape_str());
}

QGemvArgs qgemv_args(const LinearWeight& w, int rows, int n_feat, int K) {
  const LinearWeight f = expert_rows(w, 0, w.size(0));  // flat [E * rows, ...]
  QGemvArgs a{};
  a.w = f.ptr<uint8_t>();
  a.w_ld = f.row_stride();
  a.sc = f.quant.scale.data;
  a.s_ld = f.quant.scale.row_stride();
  a.s2 = f.quant.nvfp4 ? f.quant.scale2.ptr<float>() : nullptr;
  a.rows = rows;
  a.bn_log2 = f.quant.block_n_log2;
  a.bk_log2 = f.quant.block_k_log2;
  a.n_feat = n_feat;
  a.K = K;
  return a;
}

}  // namespace

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                 const GluAct& act, Tensor& out, const KernelPolicy& policy) {
  moe_experts_stored(x, ids, weights, LinearWeight(gate_up), LinearWeight(down), act, out, policy);
}

void moe_experts_stored(const Tensor& x, const Tensor& ids, const Tensor& weights, const LinearWeight& gate_up,
                        const LinearWeight& down, const GluAct& act, Tensor& out, const KernelPolicy& policy) {
  check_dev(x, DType::bf16, "moe_experts x");
  check_dev(ids, DType::i32, "moe_experts ids");
  check_dev(weights, DType::f32, "moe_experts weights");
  check_dev(out, DType::bf16, "moe_experts out");
  const bool quant = gate_up.quantized();
  TS_CHECK(quant == down.quantized() && (!quant || gate_up.quant.nvfp4 == down.quant.nvfp4),
           "moe_experts: gate_up ({}) and down ({}) must be stored alike", gate_up.quant.format, down.quant.format);
  TS_CHECK(gate_up.ndim == 3 && down.ndim == 3, "moe_experts: gate_up {} down {} must be [E, rows, K]",
           gate_up.shape_str(), down.shape_str());
  const int64_t T = x.rows(), H = x.size(-1), k = ids.size(-1);
  const int64_t E = gate_up.size(0), I = quant ? expert_in_features(down) : down.size(2);
  if (quant) {
    check_quant_experts(gate_up, E, 2 * I, H, "gate_up");
    check_quant_experts(down, E, H, I, "down");
  } else {
    check_dev(gate_up, DType::bf16, "moe_experts gate_up");
    check_dev(down, DType::bf16, "moe_experts down");
    TS_CHECK(gate_up.size(0) == down.size(0) && gate_up.size(2) == H && down.size(1) == H &&
                 gate_up.size(1) == 2 * down.size(2),
             "moe_experts: gate_up {} down {} for hidden {}", gate_up.shape_str(), down.shape_str(), H);
    TS_CHECK(gate_up.is_contiguous() && down.is_contiguous(), "moe_experts: expert weights must be contiguous");
  }
  TS_CHECK(ids.rows() == T && weights.rows() == T && weights.size(-1) == k && out.rows() == T && out.size(-1) == H,
           "moe_experts: x {} ids {} weights {} out {}", x.shape_str(), ids.shape_str(), weights.shape_str(),
           out.shape_str());
  if (T == 0 || H == 0) return;
  const int64_t N = T * k;
  TS_CHECK(k >= 1 && E >= 1 && I >= 1, "moe_experts: empty routing or experts");
  TS_CHECK(N < (int64_t(1) << 30) && H <= 0x7fffffff / 2 && I <= 0x7fffffff / 2 && E <= 8192,
           "moe_experts: too large (T {} k {} H {} I {} E {})", T, k, H, I, E);
  TS_CHECK(H / kFT < 65535 && I / kFT < 65535, "moe_experts: feature dims too large");

  // Workspace: offsets, meta, perm, inv, items, act [N, I], y [N, H].
  const int64_t max_items = N / kRowsPerItem + 1 + std::min<int64_t>(E, N);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off = align_up(off + bytes, 256);
    return o;
  };
  const size_t o_offsets = take(size_t(E + 1) * 4), o_meta = take(16), o_perm = take(size_t(N) * 4),
               o_inv = take(size_t(N) * 4), o_items = take(size_t(max_items) * 16),
               o_act = take(size_t(N) * size_t(I) * 2), o_y = take(size_t(N) * size_t(H) * 2);
  char* ws = static_cast<char*>(workspace(2).get(off));
  auto* offsets = reinterpret_cast<int32_t*>(ws + o_offsets);
  auto* meta = reinterpret_cast<int32_t*>(ws + o_meta);
  auto* perm = reinterpret_cast<int32_t*>(ws + o_perm);
  auto* inv = reinterpret_cast<int32_t*>(ws + o_inv);
  auto* items = reinterpret_cast<int4*>(ws + o_items);
  auto* actb = reinterpret_cast<__nv_bfloat16*>(ws + o_act);
  auto* yb = reinterpret_cast<__nv_bfloat16*>(ws + o_y);

  // 1. sort pairs by expert.
  AlignArgs al{};
  al.ids = ids.ptr<int32_t>();
  al.ids_ld = ids.row_stride();
  al.T = int(T);
  al.k = int(k);
  al.E = int(E);
  al.offsets = offsets;
  al.perm = perm;
  al.inv = inv;
  al.items = items;
  al.meta = meta;
  const int64_t budget = 40 * 1024 / 4 - 2 * E - 40;  // ints of shared memory for the per-warp counts
  const int nw = int(std::clamp<int64_t>(budget / E, 1, 32));
  const size_t align_smem = size_t(nw * E + 2 * E + 33) * 4;
  static size_t align_set = 48 * 1024;
  if (align_smem > align_set) {
    set_smem(moe_align_kernel, align_smem);
    align_set = align_smem;
  }
  launch(moe_align_kernel, dim3(1), dim3(unsigned(nw * 32)), align_smem, true, al);

  // 2-3. grouped GEMMs. Token tile: expected rows per selected expert.
  const int64_t avg = ceil_div(N, std::min<int64_t>(E, N));
  int nt = policy.moe_tile;  // 0: heuristic; else token tiles of 8 per pass: 1, 2, 4 or 8
  if (nt != 1 && nt != 2 && nt != 4 && nt != 8) nt = avg <= 8 ? 1 : avg <= 16 ? 2 : avg <= 32 ? 4 : 8;
  const int kind = act.kind == GluKind::silu ? 0 : 1;
  GemmArgs g{};
  g.w = quant ? nullptr : gate_up.ptr<__nv_bfloat16>();
  g.w_expert = 2 * I * H;
  g.up_off = I * H;
  g.n_feat = int(I);
  g.K = int(H);
  g.src = x.ptr<__nv_bfloat16>();
  g.src_ld = x.row_stride();
  g.perm = perm;
  g.topk = int(k);
  g.items = items;
  g.meta = meta;
  g.out = actb;
  g.out_ld = I;
  g.act_kind = kind;
  g.alpha = act.alpha;
  g.limit = act.limit;
  GemmArgs d = g;  // d.w: below
  d.w_expert = H * I;
  d.up_off = 0;
  d.n_feat = int(H);
  d.K = int(I);
  d.src = actb;
  d.src_ld = I;
  d.out = yb;
  d.out_ld = H;
  const bool vec_x = vec8_ok(x.data, H, x.row_stride()) && H % 8 == 0;
  const LinearPath qp = policy.linear;  // stored experts: gemv / cublaslt force the GEMV / the tiles
  // Deterministic mode: stored experts always take the dequantized bf16 grouped GEMM (the
  // decode GEMV rounds differently), which is batch-invariant (see the header).
  const bool inv_mode = launch_config().batch_invariant;
  const bool fp4 = quant && gate_up.quant.nvfp4;
  // The tensor-core form over stored experts (moe_gemm_kernel<.., kQFp8 | kQFp4>): k blocks of
  // >= 32 (FP8), K and I multiples of 32, 8-byte (FP8) / 4-byte (NVFP4) aligned rows.
  const int64_t row_align = fp4 ? 4 : 8;
  const bool qmma_ok = quant && vec_x && H % 32 == 0 && I % 32 == 0 &&
                       (fp4 || (gate_up.quant.block_k_log2 >= 5 && down.quant.block_k_log2 >= 5)) &&
                       gate_up.row_stride() % row_align == 0 && down.row_stride() % row_align == 0 &&
                       reinterpret_cast<uintptr_t>(gate_up.data) % row_align == 0 &&
                       reinterpret_cast<uintptr_t>(down.data) % row_align == 0 && aligned16(x.data);
  // Automatic: about one row per routed-to expert -> the CUDA-core GEMV (it streams a row per
  // warp); from kQuantMmaMinRows rows per routed-to expert (expected under uniform routing: N
  // pairs reach E (1 - (1 - 1/E)^N) distinct experts) to kQuantMmaAutoRows -> the tensor cores
  // over the stored bytes (the GEMV spends ~32 ops per 16 weights per row: compute-bound past one
  // row); more -> dequantized chunks. H100 lab 2026-12-06 (bench --moe-lab, Qwen3-30B-A3B layer,
  // FP8, GEMV vs MMA us): 4 tokens (1.10 rows per expert) 79.7 vs 82.8; 8 (1.25) 143.2 vs 130.9;
  // 16 (1.56) 267.2 vs 201.6; 64 (4.1) 792 vs 316; NVFP4 64 tokens 1073 vs 359.
  const double reached = double(E) * (1.0 - std::pow(1.0 - 1.0 / double(E), double(N)));
  const double rows_per_expert = double(N) / std::max(reached, 1.0);
  const bool qmma = qmma_ok && !inv_mode &&
                    (qp == LinearPath::mma || (qp == LinearPath::automatic && rows_per_expert >= kQuantMmaMinRows &&
                                               avg <= kQuantMmaAutoRows));
  const bool decode_ok =
      qp == LinearPath::gemv || (qp == LinearPath::automatic && avg <= kQuantGemvAutoRows && !inv_mode);
  if (qmma) {
    const int qnt = avg <= 8 ? 1 : avg <= 16 ? 2 : 4;  // token tiles (the FP8 form keeps a second accumulator)
    const int qf = fp4 ? kQFp4 : kQFp8;
    auto stored = [&](GemmArgs& a, const LinearWeight& w, int rows) {
      const LinearWeight f = expert_rows(w, 0, w.size(0));  // flat [E * rows, ...]
      a.qw = f.ptr<uint8_t>();
      a.q_ld = f.row_stride();
      a.qsc = f.quant.scale.data;
      a.qs_ld = f.quant.scale.row_stride();
      a.qs2 = fp4 ? f.quant.scale2.ptr<float>() : nullptr;
      a.q_rows = rows;
      a.bn_log2 = f.quant.block_n_log2;
      a.bk_log2 = f.quant.block_k_log2;
    };
    stored(g, gate_up, int(2 * I));
    stored(d, down, int(H));
    gemm_dispatch<true>(qnt, g, max_items, true, qf);
    gemm_dispatch<false>(qnt, d, max_items, true, qf);
  } else if (quant && vec_x && decode_ok) {
    // Decode: the stored bytes of the active experts, once per pass of up to R rows.
    const int R = avg <= 1 ? 1 : avg <= 2 ? 2 : avg <= 4 ? 4 : 8;
    QGemvArgs q = qgemv_args(gate_up, int(2 * I), int(I), int(H));
    q.src = x.ptr<__nv_bfloat16>();
    q.src_ld = x.row_stride();
    q.perm = perm;
    q.topk = int(k);
    q.items = items;
    q.meta = meta;
    q.out = actb;
    q.out_ld = I;
    q.act_kind = kind;
    q.alpha = act.alpha;
    q.limit = act.limit;
    qgemv_dispatch<true>(R, q, max_items, fp4);
    QGemvArgs qd = qgemv_args(down, int(H), int(H), int(I));
    qd.src = actb;
    qd.src_ld = I;
    qd.perm = perm;
    qd.topk = int(k);
    qd.items = items;
    qd.meta = meta;
    qd.out = yb;
    qd.out_ld = H;
    qgemv_dispatch<false>(R, qd, max_items, fp4);
  } else if (quant) {
    // Prefill: a chunk of experts at a time dequantized to bf16 (experts without rows skipped),
    // then the chunk's work items through the bf16 GEMMs.
    const size_t gu_bytes = size_t(2 * I * H) * 2, per_expert = gu_bytes + size_t(H * I) * 2;
    const int64_t ec = expert_chunk(E, per_expert);
    char* scratch = static_cast<char*>(workspace(3).get(size_t(ec) * per_expert));
    for (int64_t e0 = 0; e0 < E; e0 += ec) {
      const int64_t c = std::min(ec, E - e0);
      Tensor gu_s = Tensor::from_blob(scratch, {c * 2 * I, H}, DType::bf16, Device::cuda);
      Tensor dn_s = Tensor::from_blob(scratch + size_t(ec) * gu_bytes, {c * H, I}, DType::bf16, Device::cuda);
      dequantize_rows(expert_rows(gate_up, e0, c), 0, c * 2 * I, gu_s, offsets + e0, 2 * I);
      dequantize_rows(expert_rows(down, e0, c), 0, c * H, dn_s, offsets + e0, H);
      g.w = gu_s.ptr<__nv_bfloat16>();
      g.e_lo = int(e0);
      g.e_hi = int(e0 + c);
      gemm_dispatch<true>(nt, g, max_items, vec_x);
      d.w = dn_s.ptr<__nv_bfloat16>();
      d.e_lo = g.e_lo;
      d.e_hi = g.e_hi;
      gemm_dispatch<false>(nt, d, max_items, I % 8 == 0);
    }
  } else {
    gemm_dispatch<true>(nt, g, max_items, vec_x && aligned16(gate_up.data));
    d.w = down.ptr<__nv_bfloat16>();
    gemm_dispatch<false>(nt, d, max_items, aligned16(down.data) && I % 8 == 0);
  }

  // 4. weighted sum per token in slot order.
  const int64_t old = out.row_stride();
  if (vec8_ok(out.data, H, old))
    launch(moe_combine_kernel<true>, row_grid(T, H / 8), dim3(kThreads), 0, true, yb, H, inv, weights.ptr<float>(),
           weights.row_stride(), int(k), out.ptr<__nv_bfloat16>(), old, int(H));
  else
    launch(moe_combine_kernel<false>, row_grid(T, H), dim3(kThreads), 0, true, yb, H, inv, weights.ptr<float>(),
           weights.row_stride(), int(k), out.ptr<__nv_bfloat16>(), old, int(H));
}

}  // namespace ts::ops::cuda
