// Paged causal attention over a mixed batch.
//  - Generic kernel (CUDA cores, any head dim): one block per (sequence, kv head, packed-row
//    chunk, KV split). Rows are packed (query, head-in-group) pairs of one KV head, so K/V are
//    read once for the whole GQA group. With more than one split (flash-decoding, chosen for
//    decode-like batches) blocks write unnormalised partials that a second kernel merges.
//  - Tensor-core kernel (mma.sync m16n8k16 bf16, fp32 accumulation, online softmax) for head
//    dims 64 and 128: 64 packed rows x 64-token KV tiles per block; used for prefill.
#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

int g_attn_path = 0;   // see set_attention_path in cuda_ops.h
int g_attn_splits = 0; // 0 heuristic

// ---- dispatcher thresholds -------------------------------------------------------------------
// First guesses from the kernel design; to be tuned from lab_attention_decode and
// lab_attention_prefill on the H200 (the labs print every variant side by side).
// max_q_len at or below: split-KV decode kernel (decode, speculative verify); above: prefill.
constexpr int kDecodeMaxQLen = 8;
// The decode split count aims at one full wave: the kernel's occupancy (queried: 2 blocks/SM at
// hd 128 — 104 KB smem — and 4 at hd 64), capped at this many blocks per SM...
constexpr int kDecodeMaxCtasPerSm = 4;
// ...with at least this many 64-token tiles per split, and at most this many splits.
constexpr int kDecodeMinSplitTiles = 1;
constexpr int kDecodeMaxSplits = 512;
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
  const __nv_bfloat16* kc;
  const __nv_bfloat16* vc;
  int64_t kc_tok, vc_tok;  // elements per cache slot (nkv * hd)
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
  float* part_o;           // [splits, T, nh, hd_v]
  float* part_ml;          // [splits, T, nh, 2]
  int T, B;
  bool q_vec;              // q rows/heads 16-byte aligned: cp.async straight from q
  bool o_vec2;             // out 4-byte aligned with even strides: bf16x2 stores
  int bs_shift;            // log2(block_size) for power-of-two block sizes, else -1
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
  const int t_begin = split * p.split_len;
  const int t_end = min(min(t_begin + p.split_len, kv_len), max_pos + 1);

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
      if (t < nt) v = __bfloat162float(p.kc[slot_of(p, b, t0 + t) * p.kc_tok + int64_t(g) * hd + d]);
      ks[t * (hd + 1) + d] = v;
    }
    for (int i = tid; i < kGN * hd_v; i += kGThreads) {
      const int t = i / hd_v, d = i - t * hd_v;
      float v = 0.0f;
      if (t < nt) v = __bfloat162float(p.vc[slot_of(p, b, t0 + t) * p.vc_tok + int64_t(g) * hd_v + d]);
      vs[i] = v;
    }
    __syncthreads();
    // Scores: thread -> token lane, rows strided by warps.
    for (int r = warp; r < nrows; r += kGThreads / 32) {
      const int pos = kv_len - q_len + (r0 + r) / p.G;
      const int t = lane;
      float s = -INFINITY;
      if (t < nt && t0 + t <= pos) {
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
  static bool once = [] {
    set_smem(attn_tc_kernel<HD>, smem);
    return true;
  }();
  (void)once;
  launch(attn_tc_kernel<HD>, dim3(unsigned(chunks), unsigned(p.nkv), unsigned(p.B + 1)),
         dim3(kTThreads), smem, true, p);
}


// ==== FlashAttention-2 style kernels (v2) ====================================================
// Shared pieces: ldmatrix fragment loads, pipelined cp.async, ex2.approx.
//
// Fragment conventions (mma.sync m16n8k16, gq = lane / 4, tq = lane % 4):
//   A (16 x 16, row): a0 = A[gq][2tq..], a1 = A[gq+8][2tq..], a2 = A[gq][8+2tq..], a3 = A[gq+8][8+2tq..]
//   B (16 x 8, col):  b0 = B[2tq..][gq], b1 = B[8+2tq..][gq]
//   C (16 x 8):       c0,c1 = C[gq][2tq..], c2,c3 = C[gq+8][2tq..]
// K tiles live in smem as [token][dim] (rows padded by 16 bytes: conflict-free ldmatrix), which
// is exactly the "col" B operand of S = Q K^T, so plain ldmatrix gives the B fragments; V tiles
// are [token][dim] too and are the "row" B of O = P V, so ldmatrix.trans gives them.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// 2^x (MUFU); ex2.approx.ftz(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void zero16(void* smem) {
  *reinterpret_cast<uint4*>(smem) = make_uint4(0, 0, 0, 0);
}

// Copies KV tokens [t0, t0 + NTOK) of sequence b, kv head g, into smem tiles [NTOK][LD] for K
// and V with 16-byte cp.async; tokens at or past t_lim are zero-filled (so masked scores meet
// zero V rows, never stale NaN/Inf bytes). All kThreads threads of the block take part.
template <int HD, int NTOK, int NTHR>
__device__ __forceinline__ void load_kv_tile(const AttnParams& p, int b, int g, int t0, int t_lim,
                                             __nv_bfloat16* sk, __nv_bfloat16* sv) {
  constexpr int LD = HD + 8, CH = HD / 8;
  static_assert((NTOK * CH) % NTHR == 0, "tile chunks must split evenly over the block");
  const int tid = threadIdx.x;
#pragma unroll
  for (int it = 0; it < NTOK * CH / NTHR; ++it) {
    const int i = it * NTHR + tid;
    const int r = i / CH, c = i % CH, tok = t0 + r;
    __nv_bfloat16* kd = sk + r * LD + c * 8;
    __nv_bfloat16* vd = sv + r * LD + c * 8;
    if (tok < t_lim) {
      const int64_t slot = slot_of(p, b, tok);
      cp_async16(kd, p.kc + slot * p.kc_tok + int64_t(g) * HD + c * 8);
      cp_async16(vd, p.vc + slot * p.vc_tok + int64_t(g) * HD + c * 8);
    } else {
      zero16(kd);
      zero16(vd);
    }
  }
}

// ---- split-KV flash-decoding kernel (tensor cores) -------------------------------------------
// grid: x = KV split, y = kv head * row chunks + chunk, z = sequence (z == B: padding rows).
// A block owns up to kDRows packed rows (query i, head-in-group j -> row i*G + j) of one KV head
// and the split's token range [split * split_len, +split_len) clipped to the causal range. K/V
// stream through a kDStages-deep cp.async ring of kDTile-token tiles. The rows form RT m16 tiles
// (1, 2 or 4); each m16 tile is served by 4/RT warps that take interleaved 16-token slices of
// every KV tile, each keeping its own online softmax; the warps of an m16 tile are merged
// through smem at the end. One split: normalised bf16 out; several: fp32 partials (o unnormalised,
// m in the log2 domain, l) merged by attn_merge_kernel.
constexpr int kDTile = 64;
constexpr int kDStages = 3;
constexpr int kDThreads = 128;
constexpr int kDRows = 64;

template <int HD>
constexpr size_t dec_smem() {
  constexpr size_t pipe = size_t(kDStages) * 2 * kDTile * (HD + 8) * sizeof(__nv_bfloat16);
  constexpr size_t comb = sizeof(float) * (size_t(4) * 16 * (HD + 4) + 2 * 4 * 16 + 2 * kDRows);
  return pipe > comb ? pipe : comb;
}

template <int HD>
__global__ void __launch_bounds__(kDThreads, 2) attn_decode_kernel(AttnParams p, int chunks) {
  constexpr int LD = HD + 8;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smraw);  // [stages][kDTile][LD]
  __nv_bfloat16* sV = sK + kDStages * kDTile * LD;               // [stages][kDTile][LD]
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  const int b = blockIdx.z, g = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int split = blockIdx.x;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.G, r0 = chunk * kDRows;
  const int t_begin = split * p.split_len;
  // Splits at or past the real length write nothing (the merge reads only live splits); split 0
  // always runs, so a (degenerate) empty sequence still gets its zero rows.
  if (r0 >= rows_total || (split > 0 && t_begin >= kv_len)) return;
  const int nrows = min(kDRows, rows_total - r0);
  const int off = kv_len - q_len;                       // position of query 0
  const int min_pos = off + r0 / p.G;                   // first row's position
  const int max_pos = off + (r0 + nrows - 1) / p.G;     // last row's position
  const int t_end = min(min(t_begin + p.split_len, kv_len), max_pos + 1);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kDTile - 1) / kDTile : 0;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int RT = nrows <= 16 ? 1 : nrows <= 32 ? 2 : 4;  // m16 tiles
  const int WPM = 4 / RT;                                // warps per m16 tile
  const int mt = warp / WPM, sub = warp % WPM;
  // Per-lane ldmatrix row addresses (bytes): K x4 = {tok 0-7, tok 8-15} x {dims +0, +8},
  // V x4.trans = {dims +0, +8} x {tok 0-7, tok 8-15}.
  const uint32_t k_lane = smem_u32(sK) + ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = smem_u32(sV) + ((((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;

  // Prologue: start the first kDStages-1 tiles.
#pragma unroll
  for (int s = 0; s < kDStages - 1; ++s) {
    if (s < n_tiles)
      load_kv_tile<HD, kDTile, kDThreads>(p, b, g, t_begin + s * kDTile, t_end,
                                          sK + s * kDTile * LD, sV + s * kDTile * LD);
    cp_async_commit();
  }

  // This thread's rows (mt*16 + gq, + 8) and Q fragments (registers for the whole split).
  int pos[2];
  uint32_t qf[HD / 16][4];
  {
    int64_t qoff[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = mt * 16 + gq + 8 * i;
      valid[i] = r < nrows;
      const int pr = r0 + (valid[i] ? r : 0), qi = pr / p.G, h = g * p.G + pr % p.G;
      pos[i] = valid[i] ? off + qi : INT_MAX;  // padding rows: unmasked, never written
      qoff[i] = int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1;
    }
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = j & 1, col = kk * 16 + 2 * tq + (j >> 1) * 8;
        qf[kk][j] = valid[i] ? pack_bf16(p.q[qoff[i] + col], p.q[qoff[i] + col + 1]) : 0u;
      }
  }

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kDStages - 2>();
    __syncthreads();  // tile `it` visible to all; tile it-1's stage free for reuse
    {
      const int nt = it + kDStages - 1;
      if (nt < n_tiles) {
        const int st = nt % kDStages;
        load_kv_tile<HD, kDTile, kDThreads>(p, b, g, t_begin + nt * kDTile, t_end,
                                            sK + st * kDTile * LD, sV + st * kDTile * LD);
      }
      cp_async_commit();
    }
    const int st = it % kDStages;
    const int t0 = t_begin + it * kDTile;
    for (int j = sub; j < kDTile / 16; j += WPM) {
      const int tb = t0 + j * 16;
      if (tb >= t_end) break;
      const uint32_t kb = k_lane + (st * kDTile + j * 16) * LD * 2;
      const uint32_t vb = v_lane + (st * kDTile + j * 16) * LD * 2;
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t bk[4];
        ldsm_x4(bk, kb + kk * 32);
        mma_bf16(s[0], qf[kk], bk[0], bk[1]);
        mma_bf16(s[1], qf[kk], bk[2], bk[3]);
      }
      const bool need_mask = tb + 15 >= t_end || tb + 15 > min_pos;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[nt][e] * p.scale_log2;
          if (need_mask) {
            const int tok = tb + nt * 8 + 2 * tq + (e & 1);
            if (tok >= t_end || tok > pos[e >> 1]) v = -INFINITY;
          }
          s[nt][e] = v;
        }
      float ref[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx);
        ref[i] = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(m[i] - ref[i]);
        m[i] = m_new;
        l[i] *= alpha;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
          o[dt][2 * i] *= alpha;
          o[dt][2 * i + 1] *= alpha;
        }
      }
      uint32_t pf[4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float p0 = fast_exp2(s[nt][0] - ref[0]), p1 = fast_exp2(s[nt][1] - ref[0]);
        const float p2 = fast_exp2(s[nt][2] - ref[1]), p3 = fast_exp2(s[nt][3] - ref[1]);
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pf[nt * 2 + 0] = pack_bf16(p0, p1);
        pf[nt * 2 + 1] = pack_bf16(p2, p3);
      }
#pragma unroll
      for (int dt2 = 0; dt2 < HD / 16; ++dt2) {
        uint32_t bv[4];
        ldsm_x4_t(bv, vb + dt2 * 32);
        mma_bf16(o[2 * dt2], pf, bv[0], bv[1]);
        mma_bf16(o[2 * dt2 + 1], pf, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // all warps done with the ring: reuse it for the cross-warp merge
  pdl_trigger();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  float* co = reinterpret_cast<float*>(smraw);  // [4 warps][16][HD + 4]
  float* cm = co + 4 * 16 * (HD + 4);           // [4][16]
  float* cl = cm + 4 * 16;                      // [4][16]
  float* rowM = cl + 4 * 16;                    // [kDRows]
  float* rowL = rowM + kDRows;                  // [kDRows]
  if (tq == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      cm[warp * 16 + gq + 8 * i] = m[i];
      cl[warp * 16 + gq + 8 * i] = l[i];
    }
  }
  __syncthreads();
  const bool single = p.num_splits == 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rr = gq + 8 * i;
    float M = -INFINITY;
    for (int k = 0; k < WPM; ++k) M = fmaxf(M, cm[(mt * WPM + k) * 16 + rr]);
    float L = 0.0f;
    for (int k = 0; k < WPM; ++k) {
      const float mk = cm[(mt * WPM + k) * 16 + rr];
      if (mk != -INFINITY) L += fast_exp2(mk - M) * cl[(mt * WPM + k) * 16 + rr];
    }
    float w = m[i] == -INFINITY ? 0.0f : fast_exp2(m[i] - M);
    if (single) w = L > 0.0f ? w / L : 0.0f;
    float* dst = co + (warp * 16 + rr) * (HD + 4);
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8 + 2 * tq) = make_float2(o[dt][2 * i] * w, o[dt][2 * i + 1] * w);
    if (sub == 0 && tq == 0) {
      rowM[mt * 16 + rr] = M;
      rowL[mt * 16 + rr] = L;
    }
  }
  __syncthreads();
  for (int i = tid; i < nrows * HD; i += kDThreads) {
    const int r = i / HD, d = i % HD, rm = r >> 4, rr = r & 15;
    float acc = 0.0f;
    for (int k = 0; k < WPM; ++k) acc += co[((rm * WPM + k) * 16 + rr) * (HD + 4) + d];
    const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr % p.G;
    const int64_t tok = q0 + qi;
    if (single) {
      p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(acc);
    } else {
      const int64_t row = (int64_t(split) * p.T + tok) * p.nh + h;
      p.part_o[row * HD + d] = acc;
      if (d == 0) {
        p.part_ml[row * 2] = rowM[r];
        p.part_ml[row * 2 + 1] = rowL[r];
      }
    }
  }
}

// Merges the live splits of one (query, head) row per block (hd_v % 4 == 0, hd_v <= 256): the
// block's threads form NG = 256 / (hd_v / 4) groups, each summing every NG-th split for all
// hd_v / 4 float4 columns (independent loads, so hundreds of splits stay latency-bound only
// ~n_live / NG deep), then the groups are reduced through smem.
// grid: x = max_q_len * nh (row qi * nh + h of the sequence), y = sequence; 256 threads.
constexpr int kMThreads = 256;
__global__ void __launch_bounds__(kMThreads) attn_merge_kernel(AttnParams p) {
  __shared__ float4 red[kMThreads];
  __shared__ float redl[kMThreads];
  __shared__ float redm[kMThreads / 32];
  pdl_wait();
  const int b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int row = blockIdx.x;
  if (row >= q_len * p.nh) return;
  const int qi = row / p.nh, h = row % p.nh;
  const int64_t tok = q0 + qi;
  const int n_live = min(p.num_splits, (kv_len + p.split_len - 1) / p.split_len);
  const int64_t stride = int64_t(p.T) * p.nh;  // rows per split
  const int64_t base = tok * p.nh + h;
  float M = -INFINITY;
  for (int s = tid; s < n_live; s += kMThreads) M = fmaxf(M, p.part_ml[(s * stride + base) * 2]);
  M = warp_max(M);
  if (lane == 0) redm[warp] = M;
  __syncthreads();
  M = redm[0];
#pragma unroll
  for (int w = 1; w < kMThreads / 32; ++w) M = fmaxf(M, redm[w]);
  const int nc = p.hd_v / 4, ng = kMThreads / nc;
  const int c = tid % nc, grp = tid / nc;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float L = 0.0f;
  if (grp < ng) {
#pragma unroll 4
    for (int s = grp; s < n_live; s += ng) {
      const int64_t r = s * stride + base;
      const float2 ml = *reinterpret_cast<const float2*>(p.part_ml + r * 2);
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + r * p.hd_v + c * 4);
      const float w = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - M);
      L += w * ml.y;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  red[tid] = acc;
  redl[tid] = L;
  __syncthreads();
  pdl_trigger();
  if (grp != 0) return;
  for (int k = 1; k < ng; ++k) {
    const float4 v = red[k * nc + c];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
    L += redl[k * nc + c];
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  __nv_bfloat16* orow = p.out + tok * p.o_s0 + int64_t(h) * p.o_s1 + c * 4;
  if (p.o_vec2) {
    reinterpret_cast<__nv_bfloat162*>(orow)[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    reinterpret_cast<__nv_bfloat162*>(orow)[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  } else {
    orow[0] = __float2bfloat16(acc.x * inv);
    orow[1] = __float2bfloat16(acc.y * inv);
    orow[2] = __float2bfloat16(acc.z * inv);
    orow[3] = __float2bfloat16(acc.w * inv);
  }
}

// ---- FA2-style prefill kernel (tensor cores) ---------------------------------------------------
// grid: x = kv head, y = packed-row chunk of BM = 64*MW rows (reversed: the heaviest causal
// chunks of every head are scheduled first), z = sequence (z == B: padding rows). 4 warps, each owning 16*MW rows; Q tile in smem
// (ldmatrix per k-step), K/V 64-token tiles double-buffered with cp.async; S computed in NS-token
// slices (exp2 online softmax with the log2e-prescaled scale); tiles past the chunk's last
// position are never loaded, warps whose rows end before a tile skip it, and the causal mask is
// applied only on tiles that cross a warp's first position.
constexpr int kPThreads = 128;
constexpr int kPBN = 64;

template <int HD, int MW>
constexpr size_t prefill_smem() {
  return (size_t(64) * MW + 4 * kPBN) * (HD + 8) * sizeof(__nv_bfloat16) + 64 * MW * sizeof(int);
}

template <int HD, int MW, int NS>
__global__ void __launch_bounds__(kPThreads) attn_prefill_kernel(AttnParams p) {
  constexpr int LD = HD + 8, CH = HD / 8, BM = 64 * MW, BN = kPBN;
  static_assert(BN % NS == 0 && NS % 16 == 0, "bad NS");
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smraw);  // [BM][LD]
  __nv_bfloat16* sK = sQ + BM * LD;                              // [2][BN][LD]
  __nv_bfloat16* sV = sK + 2 * BN * LD;                          // [2][BN][LD]
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  const int b = blockIdx.z, g = blockIdx.x;
  const int chunk = int(gridDim.y) - 1 - int(blockIdx.y);
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.G, r0 = chunk * BM;
  if (r0 >= rows_total) return;
  const int nrows = min(BM, rows_total - r0);
  const int off = kv_len - q_len;
  const int t_end = min(kv_len, off + (r0 + nrows - 1) / p.G + 1);
  const int n_tiles = t_end > 0 ? (t_end + BN - 1) / BN : 0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;

  // Q tile -> smem (zero rows past nrows), joined to the first K/V commit group.
  for (int i = tid; i < BM * CH; i += kPThreads) {
    const int r = i / CH, c = i % CH;
    __nv_bfloat16* dst = sQ + r * LD + c * 8;
    if (r < nrows) {
      const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr - qi * p.G;
      const __nv_bfloat16* src = p.q + int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1 + c * 8;
      if (p.q_vec) {
        cp_async16(dst, src);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = src[e];
      }
    } else {
      zero16(dst);
    }
  }
  if (n_tiles > 0) load_kv_tile<HD, BN, kPThreads>(p, b, g, 0, t_end, sK, sV);
  cp_async_commit();

  const int wrow0 = warp * 16 * MW;                 // warp's first row in the chunk
  // Per-lane ldmatrix row addresses (bytes): Q x4 = {rows 0-7, 8-15} x {k +0, +8};
  // K x4 = {tok 0-7, tok 8-15} x {dims +0, +8}; V x4.trans = {dims +0, +8} x {tok 0-7, 8-15}.
  const uint32_t q_lane = smem_u32(sQ) + ((wrow0 + (lane & 15)) * LD + (lane >> 4) * 8) * 2;
  const uint32_t k_lane = smem_u32(sK) + ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = smem_u32(sV) + ((((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;
  const bool warp_live = wrow0 < nrows;
  const int w_min_pos = off + (r0 + wrow0) / p.G;
  const int w_max_pos = warp_live ? off + (r0 + min(wrow0 + 16 * MW, nrows) - 1) / p.G : -1;
  // Row positions live in smem (read only on tiles that need the causal mask: saves registers).
  int* spos = reinterpret_cast<int*>(sV + 2 * BN * LD);  // [BM]
  for (int r = tid; r < BM; r += kPThreads)
    spos[r] = r < nrows ? off + (r0 + r) / p.G : INT_MAX;  // padding rows: never written

  float o[MW][HD / 8][4];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.0f;
  float m[MW][2], l[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;

  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles)
      load_kv_tile<HD, BN, kPThreads>(p, b, g, (j + 1) * BN, t_end, sK + ((j + 1) & 1) * BN * LD,
                                      sV + ((j + 1) & 1) * BN * LD);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int stg = j & 1, t0 = j * BN;
    if (t0 <= w_max_pos) {
#pragma unroll
      for (int hf = 0; hf < BN / NS; ++hf) {
        const int tb = t0 + hf * NS;
        if (tb > w_max_pos) break;
        const uint32_t kb = k_lane + (stg * BN + hf * NS) * LD * 2;
        const uint32_t vb = v_lane + (stg * BN + hf * NS) * LD * 2;
        float s[MW][NS / 8][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
          for (int nt = 0; nt < NS / 8; ++nt) s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          uint32_t a[MW][4];
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
            ldsm_x4(a[mi], q_lane + (mi * 16 * LD + kk * 16) * 2);
#pragma unroll
          for (int n2 = 0; n2 < NS / 16; ++n2) {
            uint32_t bk[4];
            ldsm_x4(bk, kb + (n2 * 16 * LD + kk * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
              mma_bf16(s[mi][2 * n2], a[mi], bk[0], bk[1]);
              mma_bf16(s[mi][2 * n2 + 1], a[mi], bk[2], bk[3]);
            }
          }
        }
        // Scores stay raw (m too); scale_log2 > 0 folds into the exponent: p = 2^(s*c - m*c).
        if (tb + NS - 1 > w_min_pos) {
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NS / 8; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (tb + nt * 8 + 2 * tq + (e & 1) > spos[wrow0 + mi * 16 + gq + 8 * (e >> 1)])
                  s[mi][nt][e] = -INFINITY;
        }
        const float sl2 = p.scale_log2;
        uint32_t pf[MW][NS / 16][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          float ref[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NS / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mi][nt][2 * i], s[mi][nt][2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[mi][i], mx);
            ref[i] = m_new == -INFINITY ? 0.0f : m_new * sl2;
            const float alpha = fast_exp2(fmaf(m[mi][i], sl2, -ref[i]));
            m[mi][i] = m_new;
            l[mi][i] *= alpha;
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
              o[mi][dt][2 * i] *= alpha;
              o[mi][dt][2 * i + 1] *= alpha;
            }
          }
#pragma unroll
          for (int nt = 0; nt < NS / 8; ++nt) {
            const float p0 = fast_exp2(fmaf(s[mi][nt][0], sl2, -ref[0]));
            const float p1 = fast_exp2(fmaf(s[mi][nt][1], sl2, -ref[0]));
            const float p2 = fast_exp2(fmaf(s[mi][nt][2], sl2, -ref[1]));
            const float p3 = fast_exp2(fmaf(s[mi][nt][3], sl2, -ref[1]));
            l[mi][0] += p0 + p1;
            l[mi][1] += p2 + p3;
            pf[mi][nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(p0, p1);
            pf[mi][nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p2, p3);
          }
        }
#pragma unroll
        for (int kc = 0; kc < NS / 16; ++kc)
#pragma unroll
          for (int dt2 = 0; dt2 < HD / 16; ++dt2) {
            uint32_t bv[4];
            ldsm_x4_t(bv, vb + (kc * 16 * LD + dt2 * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
              mma_bf16(o[mi][2 * dt2], pf[mi][kc], bv[0], bv[1]);
              mma_bf16(o[mi][2 * dt2 + 1], pf[mi][kc], bv[2], bv[3]);
            }
          }
      }
    }
    __syncthreads();  // stage j&1 is refilled by the next iteration's prefetch
  }
  pdl_trigger();
#pragma unroll
  for (int mi = 0; mi < MW; ++mi)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[mi][i];
      li += __shfl_xor_sync(0xffffffffu, li, 1);
      li += __shfl_xor_sync(0xffffffffu, li, 2);
      const int r = wrow0 + mi * 16 + gq + 8 * i;
      if (r >= nrows) continue;
      const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr - qi * p.G;
      __nv_bfloat16* orow = p.out + int64_t(q0 + qi) * p.o_s0 + int64_t(h) * p.o_s1;
      const float inv = li > 0.0f ? 1.0f / li : 0.0f;
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const float v0 = o[mi][dt][2 * i] * inv, v1 = o[mi][dt][2 * i + 1] * inv;
        if (p.o_vec2) {
          *reinterpret_cast<__nv_bfloat162*>(orow + dt * 8 + 2 * tq) = __floats2bfloat162_rn(v0, v1);
        } else {
          orow[dt * 8 + 2 * tq] = __float2bfloat16(v0);
          orow[dt * 8 + 2 * tq + 1] = __float2bfloat16(v1);
        }
      }
    }
}

// Blocks of attn_decode_kernel<HD> resident per SM (registers/smem as compiled), queried once.
template <int HD>
int decode_occupancy() {
  static const int occ = [] {
    constexpr size_t smem = dec_smem<HD>();
    set_smem(attn_decode_kernel<HD>, smem);
    int n = 0;
    TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_kernel<HD>,
                                                                kDThreads, smem));
    return std::max(n, 1);
  }();
  return occ;
}

template <int HD>
void decode_launch(const AttnParams& p, int chunks) {
  constexpr size_t smem = dec_smem<HD>();
  (void)decode_occupancy<HD>();  // also opts the kernel into its smem size
  launch(attn_decode_kernel<HD>,
         dim3(unsigned(p.num_splits), unsigned(p.nkv * chunks), unsigned(p.B + 1)),
         dim3(kDThreads), smem, true, p, chunks);
}

template <int HD, int MW, int NS>
void prefill_launch(const AttnParams& p, int chunks) {
  constexpr size_t smem = prefill_smem<HD, MW>();
  static bool once = [] {
    set_smem(attn_prefill_kernel<HD, MW, NS>, smem);
    return true;
  }();
  (void)once;
  launch(attn_prefill_kernel<HD, MW, NS>, dim3(unsigned(p.nkv), unsigned(chunks), unsigned(p.B + 1)),
         dim3(kPThreads), smem, true, p);
}
}  // namespace

void set_attention_path(int path, int num_splits) {
  g_attn_path = path;
  g_attn_splits = num_splits;
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out) {
  check_dev(q, DType::bf16, "paged_attention q");
  check_dev(k_cache, DType::bf16, "paged_attention k_cache");
  check_dev(v_cache, DType::bf16, "paged_attention v_cache");
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
  TS_CHECK(meta.block_size > 0 && meta.max_q_len >= 0 && meta.max_kv_len >= 0,
           "paged_attention: bad block_size/max lens");
  TS_CHECK(B < 65535 && nkv * 64 <= 65535, "paged_attention: batch or heads too large");

  AttnParams p{};
  p.q = q.ptr<__nv_bfloat16>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.kc = k_cache.ptr<__nv_bfloat16>();
  p.vc = v_cache.ptr<__nv_bfloat16>();
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
  p.bs_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if ((1 << sh) == meta.block_size) p.bs_shift = sh;
  p.q_vec = vec8_ok(p.q, hd, p.q_s1) && p.q_s0 % 8 == 0;
  p.o_vec2 = (reinterpret_cast<uintptr_t>(p.out) & 3) == 0 && p.o_s0 % 2 == 0 && p.o_s1 % 2 == 0;
  const int64_t rows = int64_t(meta.max_q_len) * p.G;

  // v2 kernels: head dims 64/128 with hd_v == hd and 16-byte aligned caches.
  const bool v2_ok = (hd == 64 || hd == 128) && hd_v == hd && aligned16(p.kc) && aligned16(p.vc);
  int path = g_attn_path;
  if (path == 0) {
    if (!v2_ok) path = 1;
    else if (meta.max_q_len <= kDecodeMaxQLen) path = 3;
    else if (rows < kPrefillWideMinRows) path = 4;
    else path = hd == 128 ? kPrefillWidePath128 : kPrefillWidePath64;
  }
  if (path >= 2 && !v2_ok) path = 1;  // forced tensor-core path on an unsupported shape

  if (path == 3) {
    const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, kDRows));
    TS_CHECK(nkv * chunks <= 65535, "paged_attention: {} kv heads x {} row chunks", nkv, chunks);
    // Split count from host-side bounds only (graph-safe): max_kv_len bounds every kv_len;
    // blocks whose split starts past their sequence's real length exit, the merge skips them.
    const int64_t tiles = std::max<int64_t>(1, ceil_div(meta.max_kv_len, kDTile));
    int64_t splits;
    if (g_attn_splits > 0) {
      splits = g_attn_splits;
    } else {
      const int64_t base = B * nkv * chunks;
      const int occ = hd == 64 ? decode_occupancy<64>() : decode_occupancy<128>();
      const int64_t target = int64_t(std::min(occ, kDecodeMaxCtasPerSm)) * sm_count();
      splits = std::clamp<int64_t>(ceil_div(target, base), 1,
                                   std::max<int64_t>(1, std::min<int64_t>(tiles / kDecodeMinSplitTiles, kDecodeMaxSplits)));
    }
    const int64_t split_len = ceil_div(tiles, splits) * kDTile;
    splits = ceil_div(tiles * kDTile, split_len);
    TS_CHECK(splits <= 0x7fffffff && split_len <= 0x7fffffff, "paged_attention: bad split");
    p.num_splits = int(splits);
    p.split_len = int(split_len);
    if (splits > 1) {
      const size_t n_o = size_t(splits) * size_t(T) * size_t(nh) * size_t(hd_v);
      const size_t n_ml = size_t(splits) * size_t(T) * size_t(nh) * 2;
      float* ws = static_cast<float*>(workspace(0).get((n_o + n_ml) * sizeof(float)));
      p.part_o = ws;
      p.part_ml = ws + n_o;
    }
    if (hd == 64) decode_launch<64>(p, int(chunks));
    else decode_launch<128>(p, int(chunks));
    if (splits > 1) {
      const int64_t mx = int64_t(std::max(meta.max_q_len, 1)) * nh;
      TS_CHECK(mx <= 0x7fffffff, "paged_attention: too many rows");
      launch(attn_merge_kernel, dim3(unsigned(mx), unsigned(B)), dim3(kMThreads), 0, true, p);
    }
    return;
  }
  if (path == 4 || path == 5 || path == 6) {
    const int bm = path == 4 ? 64 : 128;
    const int64_t chunks = std::max<int64_t>(1, ceil_div(rows, bm));
    TS_CHECK(chunks <= 65535, "paged_attention: {} row chunks of {}", chunks, bm);
    if (hd == 64) {
      if (path == 4) prefill_launch<64, 1, 64>(p, int(chunks));
      else if (path == 5) prefill_launch<64, 2, 32>(p, int(chunks));
      else prefill_launch<64, 2, 64>(p, int(chunks));
    } else {
      if (path == 4) prefill_launch<128, 1, 64>(p, int(chunks));
      else if (path == 5) prefill_launch<128, 2, 32>(p, int(chunks));
      else prefill_launch<128, 2, 64>(p, int(chunks));
    }
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
  if (g_attn_splits > 0) {
    splits = g_attn_splits;
  } else if (decode_like) {
    const int64_t base = B * nkv * chunks;
    const int64_t target = 2 * int64_t(sm_count());
    const int64_t by_len = ceil_div(max_kv, 256);  // at least 256 tokens per split
    splits = int(std::clamp<int64_t>(ceil_div(target, base), 1, std::min<int64_t>(by_len, 64)));
  }
  int64_t split_len = ceil_div(ceil_div(max_kv, splits), kGN) * kGN;
  splits = int(ceil_div(max_kv, split_len));
  p.num_splits = splits;
  p.split_len = int(split_len);
  TS_CHECK(int64_t(nkv) * splits <= 65535, "paged_attention: too many splits");
  if (splits > 1) {
    const size_t n_o = size_t(splits) * size_t(T) * size_t(nh) * size_t(hd_v);
    const size_t n_ml = size_t(splits) * size_t(T) * size_t(nh) * 2;
    float* ws = static_cast<float*>(workspace(0).get((n_o + n_ml) * sizeof(float)));
    p.part_o = ws;
    p.part_ml = ws + n_o;
  }
  const size_t smem = generic_smem(int(hd), int(hd_v));
  TS_CHECK(smem <= 200 * 1024, "paged_attention: head dim {} too large for the generic kernel", hd);
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    set_smem(attn_generic_kernel, smem);
    smem_set = smem;
  }
  launch(attn_generic_kernel, dim3(unsigned(chunks), unsigned(nkv * splits), unsigned(B + 1)),
         dim3(kGThreads), smem, true, p);
  if (splits > 1)
    launch(attn_reduce_kernel, dim3(unsigned(T * nh)), dim3(128), 0, true, p);
}

}  // namespace ts::ops::cuda
