// Decode fusions (#22), each replacing a chain of small launches of the dense layer:
//  rope_kv_write:   (per-head q/k RMSNorm) + RoPE + paged K/V write — was rope (or qk_norm_rope)
//                   then kv_write: two launches and a re-read of k.
//  linear_silu_mul: the gate_up GEMV with SiLU-mul in its epilogue — was the GEMV writing
//                   [M, 2I] then silu_mul reading it back: one launch and 3 x M x I x 2 bytes less.
//  lm_head_argmax:  the greedy LM head: (final RMSNorm +) GEMV + argmax in one launch — was
//                   rmsnorm, the GEMV writing f32 logits [M, vocab] and an argmax kernel reading
//                   them back.
// All round exactly where the unfused chain rounds (bf16 after each op), so results are
// bit-identical to it; the CUDA tests compare against the CPU oracle like the unfused ops.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_helpers.cuh"
#include "ops/cuda/kv_fp8.cuh"
#include "ops/cuda/quant_linear.h"
#include "ops/lm_head.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

// ---- rope_kv_write -----------------------------------------------------------------------------
// One warp per (token, unit); units [0, nh) are q heads, [nh, nh + nkv) k heads, [nh + nkv,
// nh + 2 nkv) v heads. q/k: optional RMSNorm over the head, then rotary on the first rot
// features (the arithmetic of qk_rope_kernel in norm.cu, so the values are the same), written
// back in place; k also into k_cache at its slot. v: copied into v_cache. Shared memory: hd
// floats per warp. hd, hd_v <= 32 * 16 (one pass per lane of at most 16 elements is not assumed:
// loops stride by 32).
template <bool NORM, typename CacheT>
__global__ void rope_kv_write_kernel(__nv_bfloat16* q, int64_t q_s0, int64_t q_s1, int nh,
                                     __nv_bfloat16* k, int64_t k_s0, int64_t k_s1, int nkv, int hd,
                                     const __nv_bfloat16* __restrict__ v, int64_t v_s0, int64_t v_s1,
                                     int hd_v, const __nv_bfloat16* __restrict__ wq,
                                     const __nv_bfloat16* __restrict__ wk, float eps,
                                     const int32_t* __restrict__ pos, const float* __restrict__ cs,
                                     int max_pos, int rot, int interleaved,
                                     CacheT* __restrict__ k_cache, CacheT* __restrict__ v_cache,
                                     const int32_t* __restrict__ slots, int64_t T, float inv_k, float inv_v) {
  extern __shared__ float smem[];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = nh + 2 * nkv;
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (gw >= T * units) return;
  const int64_t t = gw / units;
  const int u = int(gw - t * units);
  const int64_t slot = slots[t];
  if (u >= nh + nkv) {  // v head: a plain copy into the cache
    if (slot >= 0) {
      const int h = u - nh - nkv;
      const __nv_bfloat16* src = v + t * v_s0 + int64_t(h) * v_s1;
      CacheT* dst = v_cache + (slot * nkv + h) * int64_t(hd_v);
      for (int i = lane; i < hd_v; i += 32) kvfp8::store(dst + i, src[i], inv_v);
    }
    pdl_trigger();
    return;
  }
  const bool is_q = u < nh;
  __nv_bfloat16* p = is_q ? q + t * q_s0 + int64_t(u) * q_s1 : k + t * k_s0 + int64_t(u - nh) * k_s1;
  const __nv_bfloat16* w = is_q ? wq : wk;
  CacheT* kc = (!is_q && slot >= 0) ? k_cache + (slot * nkv + (u - nh)) * int64_t(hd) : nullptr;
  head_norm_rope<NORM>(p, w, hd, eps, smem + warp * hd, pos[t], cs, max_pos, rot, interleaved, lane,
                       [&](int i, float v) {
                         const __nv_bfloat16 o = __float2bfloat16(v);
                         p[i] = o;
                         if (kc) kvfp8::store(kc + i, o, inv_k);
                       });
  pdl_trigger();
}

// ---- linear_silu_mul: GEMV with a SiLU-mul epilogue ----------------------------------------------
// The GEMV of linear.cu (one warp per output feature, 16-byte streaming weight loads, x rows
// L1-resident) but each warp owns gate row n and up row n + I: out[m, n] =
// bf16(silu(bf16(g)) * bf16(u)) with g, u reduced as linear's GEMV reduces them (same per-lane
// order), so the product equals linear + silu_mul bit for bit.
constexpr int kWarps = 8;
constexpr int kUnroll = 4;
// The same M limits as linear's GEMV (lab_linear on H200): large weights take the GEMV at M <= 2
// only, weights under 8 MB up to M = 8. Elsewhere cuBLASLt + silu_mul is faster.
constexpr int kMaxM = 2;
constexpr int kMaxMSmall = 8;
constexpr int64_t kSmallBytes = 8ll << 20;

// One generic small-M GEMV (the loop of linear.cu's: one warp per output, 16-byte streaming
// weight loads, x rows read through L1 or shared memory) with
//  NORM: a prologue that RMS-normalises the M rows of x (times norm_w) into shared memory, each
//    block for itself (x is [M, K] of a few KB: L2-resident; redundant but free next to the
//    weight stream), so the norm needs no launch of its own;
//  EPI: 0 store acc (+ bias); 1 SiLU-mul of the gate row n and the up row n + N (gate_up layout);
//    2 residual add: out[m, n] = bf16(out[m, n] + bf16(acc)) (fused_add_rmsnorm's rounding);
//    3 argmax: no output row; ids[m] = argmax_n acc (f32, as linear's f32-out GEMV stores it),
//      ties to the lowest n (the key of argmax_rows / sample: monotone float bits << 32 | ~n).
//      Each block reduces its kWarps outputs in shared memory, one atomicMax per row and block
//      goes to keys[m], and the last block to finish (a grid counter) turns the keys into ids and
//      zeroes keys and counter again, so the scratch is ready for the next launch (graph replays).
enum Epi : int { kStore = 0, kSiluMul = 1, kAddInto = 2, kArgmax = 3 };
constexpr int kNormMaxM = 2;            // the norm prologue: decode rows only
constexpr size_t kNormSmem = 48 * 1024;  // M * K bf16 of normalised x (no opt-in needed)

struct GemvArgs {
  const __nv_bfloat16* x;
  int64_t x_ld;
  const __nv_bfloat16* norm_w;  // NORM: [K]
  float eps;
  const __nv_bfloat16* w;
  int64_t w_ld;
  const __nv_bfloat16* bias;  // kStore: optional [N]
  __nv_bfloat16* out;
  int64_t out_ld;
  int N, K;  // N outputs (kSiluMul: I, the weight has 2I rows)
  unsigned long long* keys;  // kArgmax: [kLmArgmaxScratch]: M row keys, then the grid counter
  int32_t* ids;              // kArgmax: [M]
};

__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t n) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t mono = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(mono) << 32) | static_cast<unsigned long long>(0xffffffffu - uint32_t(n));
}

// kArgmax epilogue, lane 0 of every warp of the block (active or not: the block's last warp
// publishes, so every warp must check in). vals[m]: this warp's logit of row m (has: n < N).
template <int M>
__device__ __forceinline__ void argmax_publish(const float* vals, bool has, int64_t n, unsigned long long* bmax,
                                               unsigned* bdone, const GemvArgs& a) {
  if (has) {
#pragma unroll
    for (int m = 0; m < M; ++m) atomicMax(&bmax[m], argmax_key(vals[m], n));
  }
  __threadfence_block();
  if (atomicAdd(bdone, 1u) != kWarps - 1) return;
  // The block's last warp: every warp's maximum is in bmax.
  __threadfence_block();
#pragma unroll
  for (int m = 0; m < M; ++m) atomicMax(&a.keys[m], atomicAdd(&bmax[m], 0ull));
  __threadfence();
  unsigned* grid_done = reinterpret_cast<unsigned*>(a.keys + kLmArgmaxScratch - 1);
  if (atomicAdd(grid_done, 1u) != gridDim.x - 1) return;
  // The grid's last block: every block's maximum is in keys (device-scope atomics, L2).
  __threadfence();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const unsigned long long k = atomicExch(&a.keys[m], 0ull);
    a.ids[m] = int32_t(0xffffffffu - uint32_t(k & 0xffffffffull));
  }
  atomicExch(grid_done, 0u);
}

template <int M, bool NORM, int EPI>
__global__ void __launch_bounds__(kWarps * 32) gemv_fused_kernel(GemvArgs a) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  __shared__ float red[32];
  __shared__ unsigned long long bmax[EPI == kArgmax ? M : 1];
  __shared__ unsigned bdone;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nv = a.K / 8;
  constexpr int R = EPI == kSiluMul ? 2 : 1;  // weight rows per warp
  const int64_t n = int64_t(blockIdx.x) * kWarps + warp;
  const bool active = n < a.N;  // idle warps of the last block still join the norm prologue
  const __nv_bfloat16* wr[R];
  wr[0] = a.w + (active ? n : 0) * a.w_ld;
  if constexpr (R == 2) wr[R - 1] = a.w + ((active ? n : 0) + a.N) * a.w_ld;
  // The first chunk of weights is requested before the PDL wait: weights are never written
  // during a forward, so their stream overlaps the previous kernel's tail (and the norm).
  uint4 wv[R][kUnroll];
  auto load_chunk = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = i < nv ? ld_stream16(wr[r] + int64_t(i) * 8) : make_uint4(0, 0, 0, 0);
    }
  };
  load_chunk(0);
  if constexpr (EPI == kArgmax) {
    if (threadIdx.x < M) bmax[threadIdx.x] = 0ull;
    if (threadIdx.x == 0) bdone = 0u;
    __syncthreads();
  }
  pdl_wait();
  const __nv_bfloat16* x = a.x;
  int64_t x_ld = a.x_ld;
  if constexpr (NORM) {
    __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(gemv_smem);
    rms_norm_rows_to_smem(a.x, a.x_ld, M, a.K, a.norm_w, a.eps, xs, red);
    x = xs;
    x_ld = a.K;
  }
  if (!active) {
    if constexpr (EPI == kArgmax) {
      if (lane == 0) argmax_publish<M>(nullptr, false, n, bmax, &bdone, a);
    }
    return;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  for (int base = 0; base < nv; base += 32 * kUnroll) {
    if (base > 0) load_chunk(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = *reinterpret_cast<const uint4*>(x + m * x_ld + int64_t(i) * 8);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][m] += dot8_bf16(wv[r][u], xv);
        }
      }
    }
  }
  pdl_trigger();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
  if constexpr (EPI == kArgmax) {
    if (lane == 0) {
      float v[M];
#pragma unroll
      for (int m = 0; m < M; ++m) v[m] = acc[0][m] + 0.0f;  // linear's f32 store adds a zero bias: -0 -> +0
      argmax_publish<M>(v, true, n, bmax, &bdone, a);
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      __nv_bfloat16* o = a.out + m * a.out_ld + n;
      if constexpr (EPI == kSiluMul) {
        const float g = __bfloat162float(__float2bfloat16(acc[0][m]));
        const float u = __bfloat162float(__float2bfloat16(acc[R - 1][m]));
        *o = __float2bfloat16(g / (1.0f + __expf(-g)) * u);  // silu_mul's formula
      } else if constexpr (EPI == kAddInto) {
        *o = __float2bfloat16(__bfloat162float(*o) + __bfloat162float(__float2bfloat16(acc[0][m])));
      } else {
        *o = __float2bfloat16(acc[0][m] + (a.bias ? __bfloat162float(a.bias[n]) : 0.0f));
      }
    }
  }
}

template <int M, bool NORM, int EPI>
void gemv_fused_launch(const GemvArgs& a) {
  const size_t smem = NORM ? size_t(M) * size_t(a.K) * 2 : 0;
  launch(gemv_fused_kernel<M, NORM, EPI>, dim3(unsigned(ceil_div(a.N, kWarps))), dim3(kWarps * 32), smem, true, a);
}

// The instantiated cases: SiLU-mul at M <= 8; the norm prologue and the residual add at M <= 2.
void gemv_fused(int M, bool norm, int epi, const GemvArgs& a) {
  if (!norm && epi == kSiluMul) {
    switch (M) {
      case 1: return gemv_fused_launch<1, false, kSiluMul>(a);
      case 2: return gemv_fused_launch<2, false, kSiluMul>(a);
      case 3: return gemv_fused_launch<3, false, kSiluMul>(a);
      case 4: return gemv_fused_launch<4, false, kSiluMul>(a);
      case 5: return gemv_fused_launch<5, false, kSiluMul>(a);
      case 6: return gemv_fused_launch<6, false, kSiluMul>(a);
      case 7: return gemv_fused_launch<7, false, kSiluMul>(a);
      case 8: return gemv_fused_launch<8, false, kSiluMul>(a);
      default: break;
    }
  } else if (M == 1 || M == 2) {
    const bool one = M == 1;
    if (norm && epi == kSiluMul) return one ? gemv_fused_launch<1, true, kSiluMul>(a) : gemv_fused_launch<2, true, kSiluMul>(a);
    if (norm && epi == kStore) return one ? gemv_fused_launch<1, true, kStore>(a) : gemv_fused_launch<2, true, kStore>(a);
    if (!norm && epi == kAddInto)
      return one ? gemv_fused_launch<1, false, kAddInto>(a) : gemv_fused_launch<2, false, kAddInto>(a);
    if (epi == kArgmax) {
      if (norm) return one ? gemv_fused_launch<1, true, kArgmax>(a) : gemv_fused_launch<2, true, kArgmax>(a);
      return one ? gemv_fused_launch<1, false, kArgmax>(a) : gemv_fused_launch<2, false, kArgmax>(a);
    }
  }
  fail("gemv_fused: no kernel for M={} norm={} epilogue={}", M, norm, epi);
}

// The norm weight the fused prologues read (both GEMV families): bf16 [K] on the GPU, 16-byte
// aligned.
bool norm_weight_ok(const Tensor* norm_w, int64_t K) {
  return norm_w && norm_w->device == Device::cuda && norm_w->dtype == DType::bf16 && norm_w->numel() == K &&
         norm_w->is_contiguous() && aligned16(norm_w->data);
}

bool norm_fusable(int64_t M, const Tensor& x, const Tensor* norm_w) {
  return M <= kNormMaxM && size_t(M) * size_t(x.size(-1)) * 2 <= kNormSmem && norm_weight_ok(norm_w, x.size(-1));
}

GemvArgs gemv_args(const Tensor& x, const Tensor& w, Tensor& out, int N) {
  GemvArgs a{};
  a.x = x.ptr<__nv_bfloat16>();
  a.x_ld = x.row_stride();
  a.w = w.ptr<__nv_bfloat16>();
  a.w_ld = w.row_stride();
  a.out = out.data ? out.ptr<__nv_bfloat16>() : nullptr;
  a.out_ld = out.data ? out.row_stride() : 0;
  a.N = N;
  a.K = int(x.size(-1));
  return a;
}

}  // namespace

void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& slot_mapping, const KvScales& kvs) {
  TS_CHECK((wq == nullptr) == (wk == nullptr), "rope_kv_write: give both q/k norm weights or neither");
  const bool norm = wq != nullptr;
  const bool f8 = k_cache.dtype == DType::f8_e4m3;
  check_dev(q, DType::bf16, "rope_kv_write q");
  check_dev(k, DType::bf16, "rope_kv_write k");
  check_dev(v, DType::bf16, "rope_kv_write v");
  check_dev(k_cache, f8 ? DType::f8_e4m3 : DType::bf16, "rope_kv_write k_cache");
  check_dev(v_cache, f8 ? DType::f8_e4m3 : DType::bf16, "rope_kv_write v_cache");
  if (f8)
    check_kv_scales(kvs, "rope_kv_write");
  check_dev(positions, DType::i32, "rope_kv_write positions");
  check_dev(slot_mapping, DType::i32, "rope_kv_write slot_mapping");
  TS_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && k_cache.ndim == 4 && v_cache.ndim == 4,
           "rope_kv_write: q/k/v must be [T, heads, hd], caches [blocks, block_size, nkv, hd]");
  const int64_t T = q.size(0), nh = q.size(1), hd = q.size(2), nkv = k.size(1), hdv = v.size(2);
  TS_CHECK(k.size(0) == T && v.size(0) == T && k.size(2) == hd && v.size(1) == nkv && k_cache.size(2) == nkv &&
               k_cache.size(3) == hd && v_cache.size(2) == nkv && v_cache.size(3) == hdv &&
               k_cache.size(0) * k_cache.size(1) == v_cache.size(0) * v_cache.size(1),
           "rope_kv_write: q {} k {} v {} k_cache {} v_cache {}", q.shape_str(), k.shape_str(), v.shape_str(),
           k_cache.shape_str(), v_cache.shape_str());
  TS_CHECK(q.stride[2] == 1 && k.stride[2] == 1 && v.stride[2] == 1, "rope_kv_write: head dims must be contiguous");
  TS_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && slot_mapping.is_contiguous() &&
               positions.is_contiguous() && slot_mapping.numel() == T && positions.numel() == T,
           "rope_kv_write: contiguous caches, positions {} and slots {} for {} tokens", positions.shape_str(),
           slot_mapping.shape_str(), T);
  if (norm) {
    TS_CHECK(wq->numel() == hd && wk->numel() == hd, "rope_kv_write: q/k norm weights must be [{}]", hd);
    check_dev(*wq, DType::bf16, "rope_kv_write wq");
    check_dev(*wk, DType::bf16, "rope_kv_write wk");
  }
  const float* cs = nullptr;
  int max_pos = 0, rot = 0;
  if (rope.rot_dim > 0) {
    check_dev(rope.cos_sin, DType::f32, "rope cos_sin");
    TS_CHECK(rope.cos_sin.ndim == 2 && rope.cos_sin.size(1) == rope.rot_dim && rope.cos_sin.is_contiguous() &&
                 rope.rot_dim % 2 == 0 && rope.rot_dim <= hd,
             "rope_kv_write: cos_sin {} rot_dim {} head_dim {}", rope.cos_sin.shape_str(), rope.rot_dim, hd);
    cs = rope.cos_sin.ptr<float>();
    max_pos = int(rope.cos_sin.size(0));
    rot = rope.rot_dim;
  }
  const int64_t warps = T * (nh + 2 * nkv);
  if (warps == 0 || hd == 0) return;
  constexpr int kRopeWarps = 4;
  const size_t smem = size_t(kRopeWarps) * size_t(hd) * sizeof(float);
  TS_CHECK(smem <= 48 * 1024, "rope_kv_write: head_dim {} too large", hd);
  const int64_t blocks = ceil_div(warps, kRopeWarps);
  TS_CHECK(blocks <= 0x7fffffff, "rope_kv_write: too many heads");
  auto go = [&](auto* kc, auto* vc) {
    using C = std::remove_pointer_t<decltype(kc)>;
    auto kern = norm ? rope_kv_write_kernel<true, C> : rope_kv_write_kernel<false, C>;
    launch(kern, dim3(unsigned(blocks)), dim3(kRopeWarps * 32), smem, true, q.ptr<__nv_bfloat16>(), q.stride[0],
           q.stride[1], int(nh), k.ptr<__nv_bfloat16>(), k.stride[0], k.stride[1], int(nkv), int(hd),
           v.ptr<__nv_bfloat16>(), v.stride[0], v.stride[1], int(hdv),
           norm ? wq->ptr<__nv_bfloat16>() : nullptr, norm ? wk->ptr<__nv_bfloat16>() : nullptr, eps,
           positions.ptr<int32_t>(), cs, max_pos, rot, rope.interleaved ? 1 : 0, kc, vc, slot_mapping.ptr<int32_t>(), T,
           1.0f / kvs.k, 1.0f / kvs.v);
  };
  if (f8) go(k_cache.ptr<uint8_t>(), v_cache.ptr<uint8_t>());
  else go(k_cache.ptr<__nv_bfloat16>(), v_cache.ptr<__nv_bfloat16>());
}

// Deterministic mode (LaunchConfig::batch_invariant): no fused GEMV anywhere -- a row of 1-2
// would round differently from the same row in a larger batch (the GEMV's dot order is not the
// GEMM's) -- so the models keep their many-row path (add + norm, then linear) at every size.
bool fuses_norm_gemv(int64_t rows) { return rows >= 1 && rows <= kNormMaxM && !launch_config().batch_invariant; }

namespace {
// A fused decode GEMV may run: the policy does not force the GEMM path, and the thread is not in
// the deterministic mode (LaunchConfig::batch_invariant: the GEMV's dot order is not the GEMM's).
bool gemv_allowed(const KernelPolicy& policy) {
  return policy.linear != LinearPath::cublaslt && !launch_config().batch_invariant;
}

// A weight kept as stored (FP8, NVFP4) takes the tensor-core decode GEMV with this epilogue where
// it applies (quant_linear.h), unless the policy asks for the GEMM path.
bool quant_fuses(const Tensor& x, const LinearWeight& w, const Tensor* norm_w, const KernelPolicy& policy) {
  return gemv_allowed(policy) &&
         quant_decode_automatic(x, w, norm_w != nullptr) &&
         (!norm_w || norm_weight_ok(norm_w, x.size(-1)));
}
}  // namespace

void linear_silu_mul(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& gu_scratch, const Tensor* in_norm,
                     float eps, Tensor* x_scratch, const KernelPolicy& policy) {
  check_dev(x, DType::bf16, "linear_silu_mul x");
  if (!w.quantized()) check_dev(w, DType::bf16, "linear_silu_mul w");
  check_dev(out, DType::bf16, "linear_silu_mul out");
  TS_CHECK(w.ndim == 2 && w.size(0) % 2 == 0, "linear_silu_mul: weight must be [2I, K], got {}", w.shape_str());
  const int64_t M = x.rows(), K = x.size(-1), N2 = w.size(0), I = N2 / 2;
  TS_CHECK(w.in_features() == K && out.rows() == M && out.size(-1) == I && gu_scratch.rows() == M &&
               gu_scratch.size(-1) == N2,
           "linear_silu_mul: x {} w {} out {} scratch {}", x.shape_str(), w.shape_str(), out.shape_str(),
           gu_scratch.shape_str());
  TS_CHECK(!in_norm || (x_scratch && x_scratch->rows() == M && x_scratch->size(-1) == K),
           "linear_silu_mul: the input norm needs an x scratch [{}, {}]", M, K);
  if (M == 0 || I == 0) return;
  TS_CHECK(N2 <= 0x7fffffff && K <= 0x7fffffff, "linear_silu_mul: too large");
  const bool norm = in_norm != nullptr;
  if (w.quantized()) {
    if (quant_fuses(x, w, in_norm, policy)) return quant_decode_gemv(x, w, in_norm, eps, DecodeEpilogue::silu_mul, out);
  } else {
    const bool small_w = N2 * K * 2 <= kSmallBytes || policy.linear == LinearPath::gemv;
    const bool gemv = gemv_allowed(policy) &&
                      M <= (small_w ? kMaxMSmall : kMaxM) &&
                      vec8_ok(x.data, K, x.row_stride()) && vec8_ok(w.data, K, w.row_stride());
    if (gemv && (!norm || norm_fusable(M, x, in_norm))) {
      GemvArgs a = gemv_args(x, w, out, int(I));
      if (norm) {
        a.norm_w = in_norm->ptr<__nv_bfloat16>();
        a.eps = eps;
      }
      gemv_fused(int(M), norm, kSiluMul, a);
      return;
    }
  }
  const Tensor* src = &x;
  if (norm) {
    cuda::rmsnorm(x, *in_norm, eps, *x_scratch);
    src = x_scratch;
  }
  if (w.quantized()) quant_linear(*src, w, gu_scratch, nullptr, policy);
  else cuda::linear(*src, w, gu_scratch, nullptr, policy);
  cuda::silu_mul(gu_scratch, out);
}

void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out,
                    const Tensor* bias, Tensor& x_scratch, const KernelPolicy& policy) {
  check_dev(x, DType::bf16, "rmsnorm_linear x");
  if (!w.quantized()) check_dev(w, DType::bf16, "rmsnorm_linear w");
  check_dev(out, DType::bf16, "rmsnorm_linear out");
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.ndim == 2 && w.in_features() == K && out.rows() == M && out.size(-1) == N && x_scratch.rows() == M &&
               x_scratch.size(-1) == K,
           "rmsnorm_linear: x {} w {} out {} scratch {}", x.shape_str(), w.shape_str(), out.shape_str(),
           x_scratch.shape_str());
  if (M == 0 || N == 0) return;
  const bool has_bias = bias && bias->data;
  if (has_bias) check_dev(*bias, DType::bf16, "rmsnorm_linear bias");
  const bool bias_ok = !has_bias || (bias->numel() == N && bias->is_contiguous());
  if (w.quantized()) {
    if (bias_ok && quant_fuses(x, w, &norm_w, policy))
      return quant_decode_gemv(x, w, &norm_w, eps, DecodeEpilogue::store, out, has_bias ? bias : nullptr);
    cuda::rmsnorm(x, norm_w, eps, x_scratch);
    quant_linear(x_scratch, w, out, bias, policy);
    return;
  }
  const bool fused = gemv_allowed(policy) && N <= 0x7fffffff &&
                     K <= 0x7fffffff && vec8_ok(x.data, K, x.row_stride()) && vec8_ok(w.data, K, w.row_stride()) &&
                     norm_fusable(M, x, &norm_w) && bias_ok;
  if (fused) {
    GemvArgs a = gemv_args(x, w, out, int(N));
    a.norm_w = norm_w.ptr<__nv_bfloat16>();
    a.eps = eps;
    a.bias = has_bias ? bias->ptr<__nv_bfloat16>() : nullptr;
    gemv_fused(int(M), true, kStore, a);
    return;
  }
  cuda::rmsnorm(x, norm_w, eps, x_scratch);
  cuda::linear(x_scratch, w, out, bias, policy);
}

void linear_add(const Tensor& x, const LinearWeight& w, Tensor& residual, Tensor& scratch, const KernelPolicy& policy) {
  check_dev(x, DType::bf16, "linear_add x");
  if (!w.quantized()) check_dev(w, DType::bf16, "linear_add w");
  check_dev(residual, DType::bf16, "linear_add residual");
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.ndim == 2 && w.in_features() == K && residual.rows() == M && residual.size(-1) == N && scratch.rows() == M &&
               scratch.size(-1) == N,
           "linear_add: x {} w {} residual {} scratch {}", x.shape_str(), w.shape_str(), residual.shape_str(),
           scratch.shape_str());
  if (M == 0 || N == 0) return;
  if (w.quantized()) {
    if (quant_fuses(x, w, nullptr, policy)) return quant_decode_gemv(x, w, nullptr, 0.0f, DecodeEpilogue::add_into, residual);
    quant_linear(x, w, scratch, nullptr, policy);
    cuda::add_inplace(residual, scratch);
    return;
  }
  const bool fused = gemv_allowed(policy) && M <= kNormMaxM &&
                     N <= 0x7fffffff && K <= 0x7fffffff && vec8_ok(x.data, K, x.row_stride()) &&
                     vec8_ok(w.data, K, w.row_stride());
  if (fused) {
    gemv_fused(int(M), false, kAddInto, gemv_args(x, w, residual, int(N)));
    return;
  }
  cuda::linear(x, w, scratch, nullptr, policy);
  cuda::add_inplace(residual, scratch);
}

bool lm_head_argmax_fusable(const Tensor& x, const Tensor* norm_w, const Tensor& head) {
  const int64_t M = x.rows(), K = x.size(-1);
  // Deterministic mode: the LM head is the GEMM at every batch (logits, then argmax).
  return M >= 1 && M <= kMaxM && !launch_config().batch_invariant && x.device == Device::cuda &&
         x.dtype == DType::bf16 && head.device == Device::cuda &&
         head.dtype == DType::bf16 && head.ndim == 2 && head.size(1) == K && head.size(0) <= 0x7fffffff &&
         K <= 0x7fffffff && vec8_ok(x.data, K, x.row_stride()) && vec8_ok(head.data, K, head.row_stride()) &&
         (!norm_w || norm_fusable(M, x, norm_w));
}

void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor& scratch) {
  TS_CHECK(lm_head_argmax_fusable(x, norm_w, head), "lm_head_argmax: x {} head {} do not fuse (1-{} bf16 rows, K % 8 == 0)",
           x.shape_str(), head.shape_str(), kMaxM);
  check_dev(ids, DType::i32, "lm_head_argmax ids");
  check_dev(scratch, DType::i64, "lm_head_argmax scratch");
  const int64_t M = x.rows();
  TS_CHECK(ids.numel() >= M && ids.is_contiguous() && scratch.numel() >= kLmArgmaxScratch && scratch.is_contiguous(),
           "lm_head_argmax: ids {} for {} rows, scratch {} (needs {} zeroed i64)", ids.shape_str(), M,
           scratch.shape_str(), kLmArgmaxScratch);
  Tensor none;
  GemvArgs a = gemv_args(x, head, none, int(head.size(0)));
  if (norm_w) {
    a.norm_w = norm_w->ptr<__nv_bfloat16>();
    a.eps = eps;
  }
  a.keys = reinterpret_cast<unsigned long long*>(scratch.data);
  a.ids = ids.ptr<int32_t>();
  gemv_fused(int(M), norm_w != nullptr, kArgmax, a);
}

}  // namespace ts::ops::cuda
