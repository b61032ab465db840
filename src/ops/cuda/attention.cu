// Paged causal attention over a mixed batch.
// The dispatcher (paged_attention, bottom) picks per call, from host-side shapes only:
//  - v2 split-KV flash-decoding kernel (attention_v2.cuh) for max_q_len <= kDecodeMaxQLen with
//    head dim 64/128: tensor cores, GQA rows packed per KV head, a cp.async ring, splits sized
//    from max_kv_len (graph-safe), then a merge kernel;
//  - v2 FA2-style prefill kernel (attention_v2.cuh) for longer queries, 64- or 128-row blocks;
//  - the v1 generic CUDA-core kernel below for every other head dim (any hd <= 256, hd_v may
//    differ). The v1 tensor-core kernel stays for comparison (KernelPolicy::attn_path = 2).
// v1 kernels:
//  - Generic kernel (CUDA cores, any head dim): one block per (sequence, kv head, packed-row
//    chunk, KV split). Rows are packed (query, head-in-group) pairs of one KV head, so K/V are
//    read once for the whole GQA group. With more than one split (flash-decoding, chosen for
//    decode-like batches) blocks write unnormalised partials that a second kernel merges.
//  - Tensor-core kernel (mma.sync m16n8k16 bf16, fp32 accumulation, online softmax) for head
//    dims 64 and 128: 64 packed rows x 64-token KV tiles per block; used for prefill.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include <mutex>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kv_fp8.cuh"
#include "ops/cuda/split_kv.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {


// ---- dispatcher thresholds -------------------------------------------------------------------
// First guesses from the kernel design; to be tuned from lab_attention_decode and
// lab_attention_prefill on the H200 (the labs print every variant side by side).
// max_q_len at or below: split-KV decode kernel (decode, speculative verify); above: prefill.
constexpr int kDecodeMaxQLen = kAttnDecodeMaxQLen;
constexpr int kSplitMaxQLen = 512;   // longer chunks have enough query tiles for the prefill kernel
constexpr int kSplitMinKvPerQ = 16;  // prefix at least this many times the chunk
// The decode split count aims at one full wave: the kernel's occupancy (queried: 2 blocks/SM at
// hd 128 — 104 KB smem — and 4 at hd 64), capped at this many blocks per SM...
constexpr int kDecodeMaxCtasPerSm = 4;
// ...with at least this many 64-token tiles per split, and at most this many splits.
constexpr int kDecodeMinSplitTiles = 1;
constexpr int kDecodeMaxSplits = 512;
// Split merge: about this many splits summed per thread (sets the merge's split groups).
constexpr int kMergeSplitsPerThread = 8;
// Prefill: max_q_len * G (packed rows per sequence and kv head) at or above this uses 128-row
// blocks (4 warps x 32 rows, less smem traffic per MMA); below, 64-row blocks (more blocks).
constexpr int64_t kPrefillWideMinRows = 512;
// Wide-block variant per head dim: 5 = S in 32-token slices (hd 128: 255 registers, ~20 B
// spill), 6 = 64-token slices (hd 128 spills ~90 B; hd 64: 239 registers, no spill).
constexpr int kPrefillWidePath128 = 5;
constexpr int kPrefillWidePath64 = 6;

constexpr float kLog2e = 1.4426950408889634f;

struct AttnParams {
  const __nv_bfloat16* q;
  int64_t q_s0, q_s1;
  const __nv_bfloat16* kc;  // bf16 caches (null for FP8 ones)
  const __nv_bfloat16* vc;
  const uint8_t* kc8;       // FP8 (e4m3) caches (null for bf16 ones)
  const uint8_t* vc8;
  int64_t kc_tok, vc_tok;  // elements per cache slot (nkv * hd)
  // FP8 caches' scales (ops::KvScales). The generic kernel dequantizes K/V with k_deq / v_deq as
  // it loads them (f32); the v2 kernels fold k's into scale_log2 and multiply the normalised
  // output by v_out (1 for bf16 caches).
  float k_deq, v_deq, v_out;
  const int32_t* cu_q;
  const int32_t* kv_len;
  const int32_t* bt;
  int64_t bt_ld;
  int max_blocks;          // columns of the block table
  int block_size, nh, nkv, G, hd, hd_v;
  float scale_log2;        // scale * log2(e): scores live in the log2 domain
  __nv_bfloat16* out;
  int64_t o_s0, o_s1;
  int num_splits, split_len;
  // v2 decode: split_target > 0 sizes each sequence's splits from its own kv_len (batch-
  // invariant, seq_split_len in attention_v2.cuh); num_splits is then only the grid bound.
  int split_target, split_min_tiles;
  float* part_o;           // [splits, T, nh, hd_v]
  float* part_ml;          // [splits, T, nh, 2]
  int T, B;
  bool q_vec;              // q rows/heads 16-byte aligned: cp.async straight from q
  bool o_vec2;             // out 4-byte aligned with even strides: bf16x2 stores
  int bs_shift;            // log2(block_size) for power-of-two block sizes, else -1
  int merge_groups;        // attn_merge_kernel: split groups per row (power of two)
  // v2 decode: packed rows per block (0: kDRows). SplitKvOptions::uniform sets 16, so every
  // block runs one m16 tile over 4 warps whatever the query length (attention_v2.cuh).
  int d_rows;
  // Uniform (deterministic) mode: fixed split_len from token 0, splits folded in order by the
  // running merge (attention_v2.cuh uni_*); split_loop: one block walks its splits (prefill
  // rows), else a block per split and attn_merge_kernel folds their partials (decode rows).
  bool uniform, split_loop;
  // Sliding window (ops::paged_attention's window; 0: none): the query at position pos reads the
  // keys (pos - window, pos] only. The kernels skip the tiles below a block's lowest such key
  // and mask the rest; the split-KV kernels count a sequence's splits from seq_kv_base.
  int window;
};

// Rows past cu_q[B] are padding: written as zeros (as the CPU reference does) by the blocks of
// the extra grid slice z == B.
__device__ __forceinline__ void zero_padding_rows(const AttnParams& p) {
  const int64_t first = p.cu_q[p.B];
  const int64_t nblk = int64_t(gridDim.x) * gridDim.y;
  const int64_t bid = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t per_tok = int64_t(p.nh) * p.hd_v;
  for (int64_t i = bid * blockDim.x + threadIdx.x; i < (p.T - first) * per_tok;
       i += nblk * blockDim.x) {
    const int64_t tok = first + i / per_tok, r = i % per_tok, h = r / p.hd_v, d = r % p.hd_v;
    p.out[tok * p.o_s0 + h * p.o_s1 + d] = __float2bfloat16(0.0f);
  }
}

// Physical cache slot of token `tok` of sequence b (tok < kv_len, so its block exists).
__device__ __forceinline__ int64_t slot_of(const AttnParams& p, int b, int tok) {
  const int blk = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
  return int64_t(p.bt[b * p.bt_ld + blk]) * p.block_size + (tok - blk * p.block_size);
}

// ---- generic kernel ---------------------------------------------------------------------------
constexpr int kGR = 16;        // packed rows per block
constexpr int kGN = 32;        // KV tokens per tile (one per lane in the softmax)
constexpr int kGThreads = 128;

size_t generic_smem(int hd, int hd_v) {
  return sizeof(float) * (size_t(kGR) * hd + size_t(kGN) * (hd + 1) + size_t(kGN) * hd_v +
                          size_t(kGR) * hd_v + size_t(kGR) * kGN + 3 * kGR);
}

// grid: x = packed-row chunk, y = kv head * num_splits + split, z = sequence.
__global__ void __launch_bounds__(kGThreads) attn_generic_kernel(AttnParams p) {
  extern __shared__ float sm[];
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  const int b = blockIdx.z;
  const int g = blockIdx.y / p.num_splits, split = blockIdx.y % p.num_splits;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.G;
  const int r0 = blockIdx.x * kGR;
  if (r0 >= rows_total) return;
  const int nrows = min(kGR, rows_total - r0);
  const int hd = p.hd, hd_v = p.hd_v;

  float* qs = sm;                          // [kGR][hd]
  float* ks = qs + kGR * hd;               // [kGN][hd + 1]
  float* vs = ks + kGN * (hd + 1);         // [kGN][hd_v]
  float* acc = vs + kGN * hd_v;            // [kGR][hd_v]
  float* sc = acc + kGR * hd_v;            // [kGR][kGN]
  float* mrow = sc + kGR * kGN;            // [kGR]
  float* lrow = mrow + kGR;                // [kGR]
  float* alpha = lrow + kGR;               // [kGR]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Row r -> query qi = (r0 + r) / G, head g*G + (r0 + r) % G, position kv_len - q_len + qi.
  int max_pos = -1;
  for (int r = 0; r < nrows; ++r) max_pos = max(max_pos, kv_len - q_len + (r0 + r) / p.G);
  // A window: no row of the block reads below its first row's lowest key.
  const int w_lo = p.window > 0 ? max(0, kv_len - q_len + r0 / p.G - p.window + 1) : 0;
  const int t_begin = max(split * p.split_len, w_lo);
  const int t_end = min(min(split * p.split_len + p.split_len, kv_len), max_pos + 1);

  for (int i = tid; i < kGR * hd; i += kGThreads) {
    const int r = i / hd, d = i - r * hd;
    float v = 0.0f;
    if (r < nrows) {
      const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr % p.G;
      v = __bfloat162float(p.q[int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1 + d]);
    }
    qs[i] = v;
  }
  for (int i = tid; i < kGR * hd_v; i += kGThreads) acc[i] = 0.0f;
  if (tid < kGR) {
    mrow[tid] = -INFINITY;
    lrow[tid] = 0.0f;
  }

  for (int t0 = t_begin; t0 < t_end; t0 += kGN) {
    __syncthreads();  // previous tile fully consumed; q/acc initialised
    const int nt = min(kGN, t_end - t0);
    for (int i = tid; i < kGN * hd; i += kGThreads) {
      const int t = i / hd, d = i - t * hd;
      float v = 0.0f;
      if (t < nt) {
        const int64_t e = slot_of(p, b, t0 + t) * p.kc_tok + int64_t(g) * hd + d;
        v = p.kc8 ? kvfp8::to_f32(p.kc8[e]) * p.k_deq : __bfloat162float(p.kc[e]);
      }
      ks[t * (hd + 1) + d] = v;
    }
    for (int i = tid; i < kGN * hd_v; i += kGThreads) {
      const int t = i / hd_v, d = i - t * hd_v;
      float v = 0.0f;
      if (t < nt) {
        const int64_t e = slot_of(p, b, t0 + t) * p.vc_tok + int64_t(g) * hd_v + d;
        v = p.vc8 ? kvfp8::to_f32(p.vc8[e]) * p.v_deq : __bfloat162float(p.vc[e]);
      }
      vs[i] = v;
    }
    __syncthreads();
    // Scores: thread -> token lane, rows strided by warps.
    for (int r = warp; r < nrows; r += kGThreads / 32) {
      const int pos = kv_len - q_len + (r0 + r) / p.G;
      const int t = lane;
      float s = -INFINITY;
      if (t < nt && t0 + t <= pos && (p.window <= 0 || t0 + t + p.window > pos)) {
        const float* qr = qs + r * hd;
        const float* kr = ks + t * (hd + 1);
        float d0 = 0.0f;
        for (int d = 0; d < hd; ++d) d0 = fmaf(qr[d], kr[d], d0);
        s = d0 * p.scale_log2;
      }
      // Online softmax update for row r (whole warp holds the row's tile).
      const float m_old = mrow[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float ref = m_new == -INFINITY ? 0.0f : m_new;
      const float pr = exp2f(s - ref);
      const float sum = warp_sum(pr);
      sc[r * kGN + t] = pr;
      __syncwarp();
      if (lane == 0) {
        const float a = exp2f(m_old - ref);
        alpha[r] = a;
        lrow[r] = lrow[r] * a + sum;
        mrow[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = tid; i < nrows * hd_v; i += kGThreads) {
      const int r = i / hd_v, d = i - r * hd_v;
      float a = acc[i] * alpha[r];
      const float* pr = sc + r * kGN;
      for (int t = 0; t < nt; ++t) a = fmaf(pr[t], vs[t * hd_v + d], a);
      acc[i] = a;
    }
  }
  __syncthreads();
  pdl_trigger();
  for (int i = tid; i < nrows * hd_v; i += kGThreads) {
    const int r = i / hd_v, d = i - r * hd_v;
    const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr % p.G;
    const int64_t tok = q0 + qi;
    if (p.num_splits == 1) {
      const float l = lrow[r];
      p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(l > 0.0f ? acc[i] / l : 0.0f);
    } else {
      const int64_t row = (int64_t(split) * p.T + tok) * p.nh + h;
      p.part_o[row * hd_v + d] = acc[i];
      if (d == 0) {
        p.part_ml[row * 2] = mrow[r];
        p.part_ml[row * 2 + 1] = lrow[r];
      }
    }
  }
}

// Merges split partials: one block of 128 threads per (token, head).
__global__ void attn_reduce_kernel(AttnParams p) {
  pdl_wait();
  const int64_t tok = blockIdx.x / p.nh;
  const int h = blockIdx.x % p.nh;
  if (tok >= p.cu_q[p.B]) return;  // padding row: zeroed by the attention kernel
  float M = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s)
    M = fmaxf(M, p.part_ml[((int64_t(s) * p.T + tok) * p.nh + h) * 2]);
  for (int d = threadIdx.x; d < p.hd_v; d += blockDim.x) {
    float L = 0.0f, o = 0.0f;
    if (M != -INFINITY) {
      for (int s = 0; s < p.num_splits; ++s) {
        const int64_t row = (int64_t(s) * p.T + tok) * p.nh + h;
        const float m = p.part_ml[row * 2];
        if (m == -INFINITY) continue;
        const float w = exp2f(m - M);
        L += w * p.part_ml[row * 2 + 1];
        o += w * p.part_o[row * p.hd_v + d];
      }
    }
    p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(L > 0.0f ? o / L : 0.0f);
  }
  pdl_trigger();
}

// ---- tensor-core kernel ------------------------------------------------------------------------
constexpr int kTM = 64;   // packed rows per block (16 per warp)
constexpr int kTN = 64;   // KV tokens per tile
constexpr int kTThreads = 128;

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// The f16 forms, for the FP8 cache's decode kernel (attention_v2.cuh: its e4m3 K/V convert to
// f16 in one instruction per pair).
__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

template <int HD>
constexpr size_t tc_smem() {
  return size_t(2) * kTN * (HD + 8) * sizeof(__nv_bfloat16);
}

// grid: x = packed-row chunk of 64, y = kv head, z = sequence. hd == hd_v == HD.
template <int HD>
__global__ void __launch_bounds__(kTThreads) attn_tc_kernel(AttnParams p) {
  constexpr int LD = HD + 8;  // padded smem row (elements): conflict-free fragment reads
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* Vs = Ks + kTN * LD;
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  const int b = blockIdx.z, g = blockIdx.y;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.G;
  const int r0 = blockIdx.x * kTM;
  if (r0 >= rows_total) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;  // mma group / thread-in-group

  // This thread's two rows: warp*16 + gq and + 8.
  int pos[2];
  int64_t qoff[2];
  bool valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pr = r0 + warp * 16 + gq + 8 * i;
    valid[i] = pr < rows_total;
    const int qi = valid[i] ? pr / p.G : 0, h = g * p.G + (valid[i] ? pr % p.G : 0);
    pos[i] = valid[i] ? kv_len - q_len + qi : -1;
    qoff[i] = int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1;
  }
  // Q fragments (A operand, row-major 16 x HD).
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j & 1, col = kk * 16 + 2 * tq + (j >> 1) * 8;
      if (valid[i]) qf[kk][j] = pack_bf16(p.q[qoff[i] + col], p.q[qoff[i] + col + 1]);
      else qf[kk][j] = 0u;
    }
  }
  const int last_row = min(rows_total - 1, r0 + kTM - 1);
  const int t_end = min(kv_len, kv_len - q_len + last_row / p.G + 1);

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int t0 = 0; t0 < t_end; t0 += kTN) {
    __syncthreads();
    constexpr int CH = HD / 8;  // 16-byte chunks per row
    for (int i = tid; i < kTN * CH; i += kTThreads) {
      const int r = i / CH, c = i - r * CH, tok = t0 + r;
      __nv_bfloat16* kd = Ks + r * LD + c * 8;
      __nv_bfloat16* vd = Vs + r * LD + c * 8;
      if (tok < t_end) {
        const int64_t slot = slot_of(p, b, tok);
        cp_async16(kd, p.kc + slot * p.kc_tok + int64_t(g) * HD + c * 8);
        cp_async16(vd, p.vc + slot * p.vc_tok + int64_t(g) * HD + c * 8);
      } else {
        *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x 64 tokens.
    float s[kTN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kTN / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const __nv_bfloat16* kr = Ks + (nt * 8 + gq) * LD + 2 * tq;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + kk * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 8);
        mma_bf16(s[nt], qf[kk], b0, b1);
      }
    }
    // Mask, scale, online softmax (rows gq: elements 0,1; gq+8: elements 2,3).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kTN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = t0 + nt * 8 + 2 * tq + (e & 1), i = e >> 1;
        const float v = tok <= pos[i] ? s[nt][e] * p.scale_log2 : -INFINITY;
        s[nt][e] = v;
        mx[i] = fmaxf(mx[i], v);
      }
    }
    float ref[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      ref[i] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[i] = exp2f(m[i] - ref[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
    uint32_t pf[kTN / 16][4];
#pragma unroll
    for (int nt = 0; nt < kTN / 8; ++nt) {
      const float p0 = exp2f(s[nt][0] - ref[0]), p1 = exp2f(s[nt][1] - ref[0]);
      const float p2 = exp2f(s[nt][2] - ref[1]), p3 = exp2f(s[nt][3] - ref[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pf[nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(p0, p1);
      pf[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    // O += P V (B operand: V[token][dim], k = token, n = dim).
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      const __nv_bfloat16* vcol = Vs + dt * 8 + gq;
#pragma unroll
      for (int kc = 0; kc < kTN / 16; ++kc) {
        const int k0 = kc * 16 + 2 * tq;
        const uint32_t b0 = pack_bf16(vcol[k0 * LD], vcol[(k0 + 1) * LD]);
        const uint32_t b1 = pack_bf16(vcol[(k0 + 8) * LD], vcol[(k0 + 9) * LD]);
        mma_bf16(o[dt], pf[kc], b0, b1);
      }
    }
  }
  pdl_trigger();
  // Row sums live spread over the quad.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const int pr = r0 + warp * 16 + gq + 8 * i;
    const int qi = pr / p.G, h = g * p.G + pr % p.G;
    __nv_bfloat16* orow = p.out + int64_t(q0 + qi) * p.o_s0 + int64_t(h) * p.o_s1;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      orow[dt * 8 + 2 * tq] = __float2bfloat16(o[dt][2 * i] * inv);
      orow[dt * 8 + 2 * tq + 1] = __float2bfloat16(o[dt][2 * i + 1] * inv);
    }
  }
}

template <int HD>
void tc_launch(const AttnParams& p, int chunks) {
  constexpr size_t smem = tc_smem<HD>();
  static std::atomic<uint32_t> done{0};  // per device: the attribute is a device setting
  if (once_per_device(done)) set_smem(attn_tc_kernel<HD>, smem);
  launch(attn_tc_kernel<HD>, dim3(unsigned(chunks), unsigned(p.nkv), unsigned(p.B + 1)),
         dim3(kTThreads), smem, true, p);
}


#include "ops/cuda/attention_v2.cuh"

// Blocks of attn_decode_kernel<HD, F8> resident per SM (registers/smem as compiled), queried once.
template <int HD, bool F8>
int decode_occupancy() {
  static std::atomic<uint32_t> done{0};  // per device: the smem attribute is a device setting
  static std::atomic<int> occ{0};
  if (once_per_device(done)) {
    constexpr size_t smem = dec_smem<HD, F8>();
    set_smem(attn_decode_kernel<HD, F8>, smem);
    int n = 0;
    TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_kernel<HD, F8>,
                                                                kDThreads, smem));
    occ.store(std::max(n, 1));
  }
  // Same GPU model on every device of a TP group; until the first device stored it, wait.
  int v = occ.load();
  while (v == 0) v = occ.load();
  return v;
}

template <int HD, bool F8>
void decode_launch(const AttnParams& p, int chunks) {
  constexpr size_t smem = dec_smem<HD, F8>();
  (void)decode_occupancy<HD, F8>();  // also opts the kernel into its smem size
  if (p.uniform) {
    static std::atomic<uint32_t> done{0};  // per device
    if (once_per_device(done)) set_smem(attn_decode_kernel<HD, F8, true>, smem);
    // split_loop: one split, (kv head, row chunk) on grid.x (no 65535 bound; see the kernel).
    const dim3 grid = p.split_loop ? dim3(unsigned(p.nkv * chunks), 1u, unsigned(p.B + 1))
                                   : dim3(unsigned(p.num_splits), unsigned(p.nkv * chunks), unsigned(p.B + 1));
    launch(attn_decode_kernel<HD, F8, true>, grid, dim3(kDThreads), smem, true, p, chunks);
    return;
  }
  launch(attn_decode_kernel<HD, F8>,
         dim3(unsigned(p.num_splits), unsigned(p.nkv * chunks), unsigned(p.B + 1)),
         dim3(kDThreads), smem, true, p, chunks);
}

template <int HD, int MW, int NS, bool F8>
void prefill_launch(const AttnParams& p, int chunks) {
  constexpr size_t smem = prefill_smem<HD, MW, F8>();
  static std::atomic<uint32_t> done{0};  // per device
  if (once_per_device(done)) set_smem(attn_prefill_kernel<HD, MW, NS, F8>, smem);
  launch(attn_prefill_kernel<HD, MW, NS, F8>, dim3(unsigned(p.nkv), unsigned(chunks), unsigned(p.B + 1)),
         dim3(kPThreads), smem, true, p);
}
}  // namespace

// The split options of the launching thread: uniform in the deterministic mode.
static SplitKvOptions thread_split_options() {
  SplitKvOptions s;
  s.uniform = launch_config().batch_invariant;
  return s;
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out, const KernelPolicy& policy) {
  paged_attention(q, k_cache, v_cache, meta, scale, out, policy, thread_split_options());
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out, const KvScales& kvs, int window, const KernelPolicy& policy) {
  paged_attention(q, k_cache, v_cache, meta, scale, out, policy, thread_split_options(), kvs, window);
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out, const KernelPolicy& policy, const SplitKvOptions& split, const KvScales& kvs,
                     int window) {
  const bool f8 = k_cache.dtype == DType::f8_e4m3;
  check_dev(q, DType::bf16, "paged_attention q");
  check_dev(k_cache, f8 ? DType::f8_e4m3 : DType::bf16, "paged_attention k_cache");
  check_dev(v_cache, f8 ? DType::f8_e4m3 : DType::bf16, "paged_attention v_cache");
  if (f8)
    check_kv_scales(kvs, "paged_attention");
  check_dev(out, DType::bf16, "paged_attention out");
  check_dev(meta.cu_q, DType::i32, "attention cu_q");
  check_dev(meta.kv_len, DType::i32, "attention kv_len");
  check_dev(meta.block_tables, DType::i32, "attention block_tables");
  TS_CHECK(q.ndim == 3 && out.ndim == 3 && k_cache.ndim == 4 && v_cache.ndim == 4,
           "paged_attention: q {} out {} k_cache {} v_cache {}", q.shape_str(), out.shape_str(),
           k_cache.shape_str(), v_cache.shape_str());
  const int64_t T = q.size(0), nh = q.size(1), hd = q.size(2);
  const int64_t nkv = k_cache.size(2), hd_v = v_cache.size(3), B = meta.num_seqs;
  TS_CHECK(k_cache.size(3) == hd && v_cache.size(2) == nkv && nkv > 0 && nh % nkv == 0 &&
               out.size(0) == T && out.size(1) == nh && out.size(2) == hd_v &&
               k_cache.size(1) == meta.block_size && v_cache.size(1) == meta.block_size &&
               k_cache.size(0) == v_cache.size(0),
           "paged_attention: q {} k_cache {} v_cache {} out {} block_size {}", q.shape_str(),
           k_cache.shape_str(), v_cache.shape_str(), out.shape_str(), meta.block_size);
  TS_CHECK(q.stride[2] == 1 && out.stride[2] == 1 && k_cache.is_contiguous() &&
               v_cache.is_contiguous(),
           "paged_attention: head dims and caches must be contiguous");
  TS_CHECK(meta.cu_q.numel() == B + 1 && meta.kv_len.numel() == B &&
               meta.block_tables.ndim == 2 && meta.block_tables.size(0) >= B,
           "paged_attention: metadata shapes cu_q {} kv_len {} block_tables {} for {} seqs",
           meta.cu_q.shape_str(), meta.kv_len.shape_str(), meta.block_tables.shape_str(), B);
  if (T == 0 || B == 0 || nh == 0) return;
  TS_CHECK(scale > 0.0f && std::isfinite(scale), "paged_attention: scale {} must be positive", scale);
  TS_CHECK(window >= 0, "paged_attention: window {} < 0", window);
  TS_CHECK(meta.block_size > 0 && meta.max_q_len >= 0 && meta.max_kv_len >= 0,
           "paged_attention: bad block_size/max lens");
  TS_CHECK(B < 65535 && nkv * 64 <= 65535, "paged_attention: batch or heads too large");

  AttnParams p{};
  p.q = q.ptr<__nv_bfloat16>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  if (f8) {
    p.kc8 = k_cache.ptr<uint8_t>();
    p.vc8 = v_cache.ptr<uint8_t>();
  } else {
    p.kc = k_cache.ptr<__nv_bfloat16>();
    p.vc = v_cache.ptr<__nv_bfloat16>();
  }
  p.k_deq = f8 ? kvs.k : 1.0f;
  p.v_deq = f8 ? kvs.v : 1.0f;
  p.v_out = 1.0f;
  p.kc_tok = nkv * hd;
  p.vc_tok = nkv * hd_v;
  p.cu_q = meta.cu_q.ptr<int32_t>();
  p.kv_len = meta.kv_len.ptr<int32_t>();
  p.bt = meta.block_tables.ptr<int32_t>();
  p.bt_ld = meta.block_tables.row_stride();
  p.max_blocks = int(meta.block_tables.size(1));
  p.block_size = meta.block_size;
  p.nh = int(nh);
  p.nkv = int(nkv);
  p.G = int(nh / nkv);
  p.hd = int(hd);
  p.hd_v = int(hd_v);
  p.scale_log2 = scale * kLog2e;
  p.out = out.ptr<__nv_bfloat16>();
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.T = int(T);
  p.B = int(B);
  p.window = window;
  p.bs_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if ((1 << sh) == meta.block_size) p.bs_shift = sh;
  p.q_vec = vec8_ok(p.q, hd, p.q_s1) && p.q_s0 % 8 == 0;
  p.o_vec2 = (reinterpret_cast<uintptr_t>(p.out) & 3) == 0 && p.o_s0 % 2 == 0 && p.o_s1 % 2 == 0;
  const int64_t rows = int64_t(meta.max_q_len) * p.G;
  // The most keys a sequence's rows read: max_kv_len, or with a window at most window + the
  // longest query (its first row's window to its last row).
  const int64_t kv_read =
      window > 0 ? std::min<int64_t>(meta.max_kv_len, int64_t(window) + meta.max_q_len) : meta.max_kv_len;

  // v2 kernels: head dims 64/128 with hd_v == hd and 16-byte aligned caches.
  const bool v2_ok = (hd == 64 || hd == 128) && hd_v == hd && aligned16(k_cache.data) && aligned16(v_cache.data);
  // A mixed batch (decodes first, then prefill chunks): the decodes through the split-KV decode
  // kernel, the chunks through the kernel their lengths pick — two launches over sub-batches.
  // The metadata are views of the same buffers: cu_q keeps absolute row offsets, so the decode
  // launch gets the first lead_decode_rows rows of q / out (its split partials and padding
  // logic cover those rows only) and the chunks' launch the whole of them (rows past the
  // decodes': it zeroes the padding rows after the last chunk).
  TS_CHECK(!split.uniform || v2_ok,
           "paged_attention: deterministic inference needs head dims 64 or 128 with hd_v == hd and aligned caches "
           "(got {} / {})", hd, hd_v);
  if (policy.attn_path == 0 && v2_ok && meta.max_q_len > kDecodeMaxQLen && meta.lead_decode_seqs > 0 &&
      meta.lead_decode_seqs < B && meta.lead_decode_max_q <= kDecodeMaxQLen && meta.lead_decode_rows > 0 &&
      meta.lead_decode_rows <= T) {
    const int64_t nd = meta.lead_decode_seqs;
    AttnMeta dm = meta, pm = meta;
    dm.cu_q = meta.cu_q.narrow(0, 0, nd + 1);
    dm.kv_len = meta.kv_len.narrow(0, 0, nd);
    dm.block_tables = meta.block_tables.narrow(0, 0, nd);
    dm.num_seqs = int(nd);
    dm.max_q_len = meta.lead_decode_max_q;
    dm.lead_decode_seqs = dm.lead_decode_max_q = dm.lead_decode_rows = 0;
    pm.cu_q = meta.cu_q.narrow(0, nd, B - nd + 1);
    pm.kv_len = meta.kv_len.narrow(0, nd, B - nd);
    pm.block_tables = meta.block_tables.narrow(0, nd, B - nd);
    pm.num_seqs = int(B - nd);
    pm.lead_decode_seqs = pm.lead_decode_max_q = pm.lead_decode_rows = 0;
    const Tensor qd = q.narrow(0, 0, meta.lead_decode_rows);
    Tensor od = out.narrow(0, 0, meta.lead_decode_rows);
    paged_attention(qd, k_cache, v_cache, dm, scale, od, policy, split, kvs, window);
    paged_attention(q, k_cache, v_cache, pm, scale, out, policy, split, kvs, window);
    return;
  }
  int path = split.uniform ? 3 : policy.attn_path;
  if (path == 0) {
    if (!v2_ok) path = 1;
    else if (meta.max_q_len <= kDecodeMaxQLen) path = 3;
    // A short chunk over a long cached prefix (the agentic turn): the prefill kernel has one
    // block per 64-128 query rows and walks the whole prefix serially (41 ms for 64 new tokens
    // after 32k on H200); split-KV spreads the prefix over the GPU instead.
    else if (meta.max_q_len <= kSplitMaxQLen && kv_read >= kSplitMinKvPerQ * meta.max_q_len) path = 3;
    else if (rows < kPrefillWideMinRows) path = 4;
    else path = hd == 128 ? kPrefillWidePath128 : kPrefillWidePath64;
  }
  if (path >= 2 && !v2_ok) path = 1;  // forced tensor-core path on an unsupported shape
  if (path == 2 && f8) path = 1;      // the v1 tensor-core kernel reads bf16 caches only
  if (path == 2 && window > 0) path = 4;  // nor slides: the v2 prefill kernel does
  if (f8 && path >= 3) {
    // v2 on FP8: scores = q . (stored x k_scale) = (q . stored) x k_scale, so k's scale joins the
    // softmax scale; v's multiplies the normalised output (the kernels convert exactly, so the
    // scales are applied once, in f32).
    p.scale_log2 *= kvs.k;
    p.v_out = kvs.v;
  }

  if (path == 3) {
    // Uniform (deterministic) mode: 16 rows per block, one split (SplitKvOptions::uniform).
    p.d_rows = split.uniform ? 16 : kDRows;
    const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, int64_t(p.d_rows)));
    // Split count from host-side bounds only (graph-safe): max_kv_len bounds every kv_len;
    // blocks whose split starts past their sequence's real length exit, the merge skips them.
    // A window bounds the range a sequence's splits cover: kv_read plus the rounding of
    // seq_kv_base (a tile; uniform mode: a split) below its first query's lowest key.
    const int64_t span =
        window > 0 ? std::min<int64_t>(meta.max_kv_len, kv_read + (split.uniform ? kUniformSplitTiles : 1) * kDTile)
                   : meta.max_kv_len;
    const int64_t tiles = std::max<int64_t>(1, ceil_div(span, kDTile));
    int64_t splits;
    // The split count this batch shape reaches at any context: the scratch is sized for it at
    // once, so decode steps do not grow (allocate) it as their contexts lengthen.
    int64_t ws_splits = 1;
    if (split.uniform) {
      // Fixed splits of kUniformSplitTiles tiles from token 0. Decode rows: a block per split
      // (the long-context parallelism) and the merge kernel folds them; longer queries: one block
      // per row chunk walks its splits (no partials for thousands of rows). Same bits either way.
      p.uniform = true;
      p.split_len = kUniformSplitTiles * kDTile;
      p.split_loop = meta.max_q_len > kDecodeMaxQLen;
      splits = p.split_loop ? 1 : ceil_div(tiles, int64_t(kUniformSplitTiles));
      TS_CHECK(splits <= 0x7fffffff, "paged_attention: bad split");
      p.num_splits = int(splits);
    } else if (policy.attn_splits <= 0 && split.target > 0) {
      // Batch-invariant splits: each sequence's split length comes from its own kv_len on the
      // device (seq_split_len), never from the batch; the grid covers the most any sequence up to
      // max_kv_len can have: min(target, ceil(tiles / min_tiles)).
      p.split_target = split.target;
      p.split_min_tiles = std::max(1, split.min_tiles);
      splits = std::min<int64_t>(p.split_target, ceil_div(tiles, int64_t(p.split_min_tiles)));
      // seq_split_len's tiles per split are >= ceil(tiles / target) >= 1; the host's split_len
      // (unused by the kernels in this mode) is the longest one.
      p.split_len = int(std::max<int64_t>(p.split_min_tiles, ceil_div(tiles, int64_t(p.split_target))) * kDTile);
      p.num_splits = int(splits);
    } else if (policy.attn_splits > 0) {
      splits = policy.attn_splits;
    } else {
      const int64_t base = B * nkv * chunks;
      const int occ = hd == 64 ? (f8 ? decode_occupancy<64, true>() : decode_occupancy<64, false>())
                               : (f8 ? decode_occupancy<128, true>() : decode_occupancy<128, false>());
      const int64_t target = int64_t(std::min(occ, kDecodeMaxCtasPerSm)) * sm_count();
      // Round down: base * splits stays within one wave of resident blocks (no 1.2-wave tails).
      splits = std::clamp<int64_t>(target / base, 1,
                                   std::max<int64_t>(1, std::min<int64_t>(tiles / kDecodeMinSplitTiles, kDecodeMaxSplits)));
      ws_splits = std::clamp<int64_t>(target / base, 1, kDecodeMaxSplits);
    }
    if (p.split_target == 0 && !p.uniform) {
      const int64_t split_len = ceil_div(tiles, splits) * kDTile;
      splits = ceil_div(tiles * kDTile, split_len);
      TS_CHECK(splits <= 0x7fffffff && split_len <= 0x7fffffff, "paged_attention: bad split");
      p.num_splits = int(splits);
      p.split_len = int(split_len);
    }
    // Partials + merge: several splits, or every uniform-mode launch without split_loop (its
    // rows' splits fold in the merge kernel even when there is one).
    const bool partials = p.uniform ? !p.split_loop : splits > 1;
    if (partials) {
      const size_t n_o = size_t(splits) * size_t(T) * size_t(nh) * size_t(hd_v);
      const size_t n_ml = size_t(splits) * size_t(T) * size_t(nh) * 2;
      const size_t cap = size_t(std::max(splits, ws_splits)) * size_t(T) * size_t(nh) * size_t(hd_v + 2);
      float* ws = static_cast<float*>(workspace(0).get(std::max(n_o + n_ml, cap) * sizeof(float)));
      p.part_o = ws;
      p.part_ml = ws + n_o;
    }
    // Grid y = nkv x chunks, except uniform split_loop launches (x, 2^31 - 1): see decode_launch.
    TS_CHECK(nkv * chunks <= (p.uniform && p.split_loop ? int64_t(0x7fffffff) : int64_t(65535)),
             "paged_attention: {} kv heads x {} row chunks", nkv, chunks);
    if (hd == 64) f8 ? decode_launch<64, true>(p, int(chunks)) : decode_launch<64, false>(p, int(chunks));
    else f8 ? decode_launch<128, true>(p, int(chunks)) : decode_launch<128, false>(p, int(chunks));
    if (partials) {
      // ~kMergeSplitsPerThread splits per thread: groups = pow2 >= splits / that, capped so a
      // row (hd_v / 4 columns x groups) fits the block. Uniform mode: one group (the fold is
      // sequential by design).
      const int nc = int(hd_v / 4);
      int groups = 1;
      // Batch-invariant mode: from the policy's split bound, not the grid, so a row's partials
      // are summed in the same order under any batch or bound.
      const int64_t gs = p.split_target > 0 ? int64_t(p.split_target) : splits;
      while (!p.uniform && groups * nc < kMThreads && groups * kMergeSplitsPerThread < gs) groups *= 2;
      p.merge_groups = groups;
      const int rpb = kMThreads / (nc * groups);
      const int64_t mx = ceil_div(int64_t(std::max(meta.max_q_len, 1)) * nh, rpb);
      TS_CHECK(mx <= 0x7fffffff, "paged_attention: too many rows");
      launch(attn_merge_kernel, dim3(unsigned(mx), unsigned(B)), dim3(kMThreads), 0, true, p);
    }
    return;
  }
  if (path == 4 || path == 5 || path == 6) {
    const int bm = path == 4 ? 64 : 128;
    const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, bm));
    TS_CHECK(chunks <= 65535, "paged_attention: {} row chunks of {}", chunks, bm);
    auto run = [&](auto f8c) {
      constexpr bool F8 = decltype(f8c)::value;
      if (hd == 64) {
        if (path == 4) prefill_launch<64, 1, 64, F8>(p, int(chunks));
        else if (path == 5) prefill_launch<64, 2, 32, F8>(p, int(chunks));
        else prefill_launch<64, 2, 64, F8>(p, int(chunks));
      } else {
        if (path == 4) prefill_launch<128, 1, 64, F8>(p, int(chunks));
        else if (path == 5) prefill_launch<128, 2, 32, F8>(p, int(chunks));
        else prefill_launch<128, 2, 64, F8>(p, int(chunks));
      }
    };
    if (f8) run(std::true_type{});
    else run(std::false_type{});
    return;
  }
  if (path == 2) {
    const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, kTM));
    TS_CHECK(chunks <= 0x7fffffff, "paged_attention: too many rows");
    if (hd == 64) tc_launch<64>(p, int(chunks));
    else tc_launch<128>(p, int(chunks));
    return;
  }
  const bool decode_like = meta.max_q_len <= 8;

  // Generic kernel, with a KV split for decode-like batches.
  const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, kGR));
  TS_CHECK(chunks <= 0x7fffffff, "paged_attention: too many rows");
  const int64_t max_kv = std::max(meta.max_kv_len, 1);
  int splits = 1;
  int64_t ws_splits = 1;  // the most splits this shape reaches at any context (scratch size)
  if (policy.attn_splits > 0) {
    splits = policy.attn_splits;
  } else if (decode_like) {
    const int64_t base = B * nkv * chunks;
    const int64_t target = 2 * int64_t(sm_count());
    const int64_t by_len = ceil_div(max_kv, 256);  // at least 256 tokens per split
    splits = int(std::clamp<int64_t>(ceil_div(target, base), 1, std::min<int64_t>(by_len, 64)));
    ws_splits = std::clamp<int64_t>(ceil_div(target, base), 1, 64);
  }
  int64_t split_len = ceil_div(ceil_div(max_kv, splits), kGN) * kGN;
  splits = int(ceil_div(max_kv, split_len));
  p.num_splits = splits;
  p.split_len = int(split_len);
  TS_CHECK(int64_t(nkv) * splits <= 65535, "paged_attention: too many splits");
  if (splits > 1) {
    const size_t n_o = size_t(splits) * size_t(T) * size_t(nh) * size_t(hd_v);
    const size_t n_ml = size_t(splits) * size_t(T) * size_t(nh) * 2;
    const size_t cap = size_t(std::max<int64_t>(splits, ws_splits)) * size_t(T) * size_t(nh) * size_t(hd_v + 2);
    float* ws = static_cast<float*>(workspace(0).get(std::max(n_o + n_ml, cap) * sizeof(float)));
    p.part_o = ws;
    p.part_ml = ws + n_o;
  }
  const size_t smem = generic_smem(int(hd), int(hd_v));
  TS_CHECK(smem <= 200 * 1024, "paged_attention: head dim {} too large for the generic kernel", hd);
  static std::mutex smem_mu;  // the largest size opted into, per device
  static size_t smem_set[32] = {};
  {
    std::lock_guard<std::mutex> lk(smem_mu);
    size_t& cur = smem_set[current_device() & 31];
    if (smem > std::max<size_t>(cur, 48 * 1024)) {
      set_smem(attn_generic_kernel, smem);
      cur = smem;
    }
  }
  launch(attn_generic_kernel, dim3(unsigned(chunks), unsigned(nkv * splits), unsigned(B + 1)),
         dim3(kGThreads), smem, true, p);
  if (splits > 1)
    launch(attn_reduce_kernel, dim3(unsigned(T * nh)), dim3(128), 0, true, p);
}

}  // namespace ts::ops::cuda
