// Multi-head latent attention (absorbed form) over the paged latent cache
// [blocks, block_size, 1, D], D = kv_rank + rope_dim: scores q . [c | k_pe], values c (the first
// kv_rank features of the same cache row). Prefill and decode share one kernel.
//
// One block per (sequence, packed-row chunk, KV split). Packed rows are (query, head) pairs of one
// sequence, so every latent tile is loaded once into shared memory and used by all the chunk's
// heads, as keys and values both. Decode-like batches split the KV range (flash-decoding); the
// blocks then write unnormalised partials that a second kernel merges. CUDA cores, fp32 math.
// With one split (every batch in the deterministic mode) a row's arithmetic is its own: 16 rows
// per block each on its own warp, tiles aligned to token 0.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kv_fp8.cuh"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMR = 16;        // packed rows per block
constexpr int kMN = 32;        // latent tokens per tile (one per lane in the softmax)
constexpr int kMThreads = 256;

struct MlaParams {
  const __nv_bfloat16* q;
  int64_t q_s0, q_s1;
  const __nv_bfloat16* c;  // latent cache, D elements per slot (bf16; null for FP8)
  const uint8_t* c8;       // FP8 (e4m3) latent cache, read as stored x c_deq (null for bf16)
  float c_deq;
  int D, rank;
  bool vec;                // D % 8 == 0 and 16-byte aligned cache: tiles move as uint4 (FP8: uint2)
  const int32_t* cu_q;
  const int32_t* kv_len;
  const int32_t* bt;
  int64_t bt_ld;
  int block_size, nh;
  float scale_log2;
  __nv_bfloat16* out;
  int64_t o_s0, o_s1;
  int num_splits, split_len;
  float* part_o;   // [splits, T, nh, rank]
  float* part_ml;  // [splits, T, nh, 2]
  int T, B;
};

size_t mla_smem(int D, int rank) {
  return sizeof(float) * (size_t(kMR) * D + size_t(kMN) * (D + 1) + size_t(kMR) * rank + size_t(kMR) * kMN + 3 * kMR);
}

__device__ __forceinline__ int64_t slot_of(const MlaParams& p, int b, int tok) {
  const int blk = tok / p.block_size;
  return int64_t(p.bt[b * p.bt_ld + blk]) * p.block_size + (tok - blk * p.block_size);
}

// grid: x = packed-row chunk, y = KV split, z = sequence (z == B: zero the padding rows).
__global__ void __launch_bounds__(kMThreads) mla_kernel(MlaParams p) {
  extern __shared__ float sm[];
  pdl_wait();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (int(blockIdx.z) == p.B) {
    const int64_t first = p.cu_q[p.B];
    const int64_t nblk = int64_t(gridDim.x) * gridDim.y;
    const int64_t bid = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    const int64_t per_tok = int64_t(p.nh) * p.rank;
    for (int64_t i = bid * blockDim.x + tid; i < (p.T - first) * per_tok; i += nblk * blockDim.x) {
      const int64_t tok = first + i / per_tok, r = i % per_tok, h = r / p.rank, d = r % p.rank;
      p.out[tok * p.o_s0 + h * p.o_s1 + d] = __float2bfloat16(0.0f);
    }
    return;
  }
  const int b = blockIdx.z, split = blockIdx.y;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.nh;
  const int r0 = blockIdx.x * kMR;
  if (r0 >= rows_total) return;
  const int nrows = min(kMR, rows_total - r0);
  const int D = p.D, rank = p.rank, KLD = D + 1;

  float* qs = sm;                    // [kMR][D]
  float* ks = qs + kMR * D;          // [kMN][D + 1]; values are its first `rank` columns
  float* acc = ks + kMN * KLD;       // [kMR][rank]
  float* sc = acc + kMR * rank;      // [kMR][kMN]
  float* mrow = sc + kMR * kMN;      // [kMR]
  float* lrow = mrow + kMR;
  float* alpha = lrow + kMR;

  // Packed row r -> query (r0 + r) / nh, head (r0 + r) % nh, position kv_len - q_len + query.
  const int max_pos = kv_len - q_len + (r0 + nrows - 1) / p.nh;
  const int t_begin = split * p.split_len;
  const int t_end = min(min(t_begin + p.split_len, kv_len), max_pos + 1);

  for (int i = tid; i < kMR * D; i += kMThreads) {
    const int r = i / D, d = i - r * D;
    float v = 0.0f;
    if (r < nrows) {
      const int pr = r0 + r, qi = pr / p.nh, h = pr - qi * p.nh;
      v = __bfloat162float(p.q[int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1 + d]);
    }
    qs[i] = v;
  }
  for (int i = tid; i < kMR * rank; i += kMThreads) acc[i] = 0.0f;
  if (tid < kMR) {
    mrow[tid] = -INFINITY;
    lrow[tid] = 0.0f;
  }

  for (int t0 = t_begin; t0 < t_end; t0 += kMN) {
    __syncthreads();  // previous tile consumed; q / acc initialised
    const int nt = min(kMN, t_end - t0);
    if (p.vec) {
      const int cpr = D / 8;
      for (int i = tid; i < kMN * cpr; i += kMThreads) {
        const int t = i / cpr, c8 = i - t * cpr;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (t < nt && p.c8) {
          const uint2 v = *reinterpret_cast<const uint2*>(p.c8 + slot_of(p, b, t0 + t) * D + c8 * 8);
          const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
          for (int j = 0; j < 8; ++j) f[j] = kvfp8::to_f32(bytes[j]) * p.c_deq;
        } else if (t < nt) {
          BF8 v;
          v.u = *reinterpret_cast<const uint4*>(p.c + slot_of(p, b, t0 + t) * D + c8 * 8);
          bf8_to_f32(v, f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) ks[t * KLD + c8 * 8 + j] = f[j];
      }
    } else {
      for (int i = tid; i < kMN * D; i += kMThreads) {
        const int t = i / D, d = i - t * D;
        const int64_t e = t < nt ? slot_of(p, b, t0 + t) * D + d : 0;
        ks[t * KLD + d] = t >= nt ? 0.0f : p.c8 ? kvfp8::to_f32(p.c8[e]) * p.c_deq : __bfloat162float(p.c[e]);
      }
    }
    __syncthreads();
    for (int r = warp; r < nrows; r += kMThreads / 32) {
      const int pos = kv_len - q_len + (r0 + r) / p.nh;
      const int t = lane;
      float s = -INFINITY;
      if (t < nt && t0 + t <= pos) {
        const float* qr = qs + r * D;
        const float* kr = ks + t * KLD;
        float d0 = 0.0f;
        for (int d = 0; d < D; ++d) d0 = fmaf(qr[d], kr[d], d0);
        s = d0 * p.scale_log2;
      }
      const float m_old = mrow[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float ref = m_new == -INFINITY ? 0.0f : m_new;
      const float pr = exp2f(s - ref);
      const float sum = warp_sum(pr);
      sc[r * kMN + t] = pr;
      __syncwarp();
      if (lane == 0) {
        const float a = exp2f(m_old - ref);
        alpha[r] = a;
        lrow[r] = lrow[r] * a + sum;
        mrow[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = tid; i < nrows * rank; i += kMThreads) {
      const int r = i / rank, d = i - r * rank;
      float a = acc[i] * alpha[r];
      const float* pr = sc + r * kMN;
      for (int t = 0; t < nt; ++t) a = fmaf(pr[t], ks[t * KLD + d], a);
      acc[i] = a;
    }
  }
  __syncthreads();
  pdl_trigger();
  for (int i = tid; i < nrows * rank; i += kMThreads) {
    const int r = i / rank, d = i - r * rank;
    const int pr = r0 + r, qi = pr / p.nh, h = pr - qi * p.nh;
    const int64_t tok = q0 + qi;
    if (p.num_splits == 1) {
      const float l = lrow[r];
      p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(l > 0.0f ? acc[i] / l : 0.0f);
    } else {
      const int64_t row = (int64_t(split) * p.T + tok) * p.nh + h;
      p.part_o[row * rank + d] = acc[i];
      if (d == 0) {
        p.part_ml[row * 2] = mrow[r];
        p.part_ml[row * 2 + 1] = lrow[r];
      }
    }
  }
}

// Merges split partials: one block per (token, head). Every split writes its partials (empty
// ranges as m = -inf, l = 0), so all are read.
__global__ void mla_reduce_kernel(MlaParams p) {
  pdl_wait();
  const int64_t tok = blockIdx.x / p.nh;
  const int h = blockIdx.x % p.nh;
  if (tok >= p.cu_q[p.B]) return;  // padding row: zeroed by the attention kernel
  const int used = p.num_splits;
  float M = -INFINITY;
  for (int s = 0; s < used; ++s) M = fmaxf(M, p.part_ml[((int64_t(s) * p.T + tok) * p.nh + h) * 2]);
  for (int d = threadIdx.x; d < p.rank; d += blockDim.x) {
    float L = 0.0f, o = 0.0f;
    if (M != -INFINITY) {
      for (int s = 0; s < used; ++s) {
        const int64_t row = (int64_t(s) * p.T + tok) * p.nh + h;
        const float m = p.part_ml[row * 2];
        if (m == -INFINITY) continue;
        const float w = exp2f(m - M);
        L += w * p.part_ml[row * 2 + 1];
        o += w * p.part_o[row * p.rank + d];
      }
    }
    p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(L > 0.0f ? o / L : 0.0f);
  }
  pdl_trigger();
}

}  // namespace

void mla_attention(const Tensor& q, const Tensor& latent_cache, const AttnMeta& meta, float scale, int64_t kv_rank,
                   Tensor& out, float fp8_scale) {
  const bool f8 = latent_cache.dtype == DType::f8_e4m3;
  check_dev(q, DType::bf16, "mla_attention q");
  check_dev(latent_cache, f8 ? DType::f8_e4m3 : DType::bf16, "mla_attention latent_cache");
  if (f8)
    TS_CHECK(fp8_scale > 0 && std::isfinite(fp8_scale), "mla_attention: FP8 cache scale {} must be positive", fp8_scale);
  check_dev(out, DType::bf16, "mla_attention out");
  check_dev(meta.cu_q, DType::i32, "attention cu_q");
  check_dev(meta.kv_len, DType::i32, "attention kv_len");
  check_dev(meta.block_tables, DType::i32, "attention block_tables");
  TS_CHECK(q.ndim == 3 && out.ndim == 3 && latent_cache.ndim == 4, "mla_attention: q {} out {} latent cache {}",
           q.shape_str(), out.shape_str(), latent_cache.shape_str());
  const int64_t T = q.size(0), nh = q.size(1), D = q.size(2), B = meta.num_seqs;
  TS_CHECK(latent_cache.size(2) == 1 && latent_cache.size(3) == D && kv_rank > 0 && kv_rank <= D &&
               latent_cache.size(1) == meta.block_size,
           "mla_attention: q {} latent cache {} rank {} block_size {}", q.shape_str(), latent_cache.shape_str(), kv_rank,
           meta.block_size);
  TS_CHECK(out.size(0) == T && out.size(1) == nh && out.size(2) == kv_rank, "mla_attention: out {}", out.shape_str());
  TS_CHECK(q.stride[2] == 1 && out.stride[2] == 1 && latent_cache.is_contiguous(),
           "mla_attention: head dims and the cache must be contiguous");
  if (T == 0 || B == 0 || nh == 0) return;
  TS_CHECK(meta.cu_q.numel() == B + 1 && meta.kv_len.numel() == B && meta.block_tables.ndim == 2 &&
               meta.block_tables.size(0) >= B,
           "mla_attention: metadata shapes cu_q {} kv_len {} block_tables {} for {} seqs", meta.cu_q.shape_str(),
           meta.kv_len.shape_str(), meta.block_tables.shape_str(), B);
  TS_CHECK(meta.block_size > 0 && meta.max_q_len >= 0 && meta.max_kv_len >= 0, "mla_attention: bad block_size/max lens");
  TS_CHECK(B < 65535, "mla_attention: batch too large");

  MlaParams p{};
  p.q = q.ptr<__nv_bfloat16>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  if (f8) p.c8 = latent_cache.ptr<uint8_t>();
  else p.c = latent_cache.ptr<__nv_bfloat16>();
  p.c_deq = f8 ? fp8_scale : 1.0f;
  p.D = int(D);
  p.rank = int(kv_rank);
  p.vec = D % 8 == 0 && aligned16(latent_cache.data);
  p.cu_q = meta.cu_q.ptr<int32_t>();
  p.kv_len = meta.kv_len.ptr<int32_t>();
  p.bt = meta.block_tables.ptr<int32_t>();
  p.bt_ld = meta.block_tables.row_stride();
  p.block_size = meta.block_size;
  p.nh = int(nh);
  p.scale_log2 = scale * kLog2e;
  p.out = out.ptr<__nv_bfloat16>();
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.T = int(T);
  p.B = int(B);

  const int64_t rows = int64_t(std::max(meta.max_q_len, 1)) * nh;
  const int64_t chunks = ceil_div(rows, kMR);
  TS_CHECK(chunks <= 0x7fffffff, "mla_attention: too many rows");
  const int64_t max_kv = std::max(meta.max_kv_len, 1);
  int splits = 1;
  // Deterministic mode (LaunchConfig::batch_invariant): one split for every batch. A row then
  // walks its tokens [0, pos] in 32-token tiles from token 0 whatever its chunk, batch or
  // kv_len (tokens past pos add exact zeros), so its bits depend on its own query and KV only;
  // split counts chosen from the grid would not.
  if (meta.max_q_len <= 8 && !launch_config().batch_invariant) {
    const int64_t base = B * chunks;
    const int64_t target = 2 * int64_t(sm_count());
    const int64_t by_len = ceil_div(max_kv, 256);  // at least 256 tokens per split
    splits = int(std::clamp<int64_t>(ceil_div(target, base), 1, std::min<int64_t>(by_len, 64)));
  }
  const int64_t split_len = ceil_div(ceil_div(max_kv, splits), kMN) * kMN;
  splits = int(ceil_div(max_kv, split_len));
  p.num_splits = splits;
  p.split_len = int(split_len);
  if (splits > 1) {
    const size_t n_o = size_t(splits) * size_t(T) * size_t(nh) * size_t(kv_rank);
    const size_t n_ml = size_t(splits) * size_t(T) * size_t(nh) * 2;
    float* ws = static_cast<float*>(workspace(0).get((n_o + n_ml) * sizeof(float)));
    p.part_o = ws;
    p.part_ml = ws + n_o;
  }
  const size_t smem = mla_smem(int(D), int(kv_rank));
  TS_CHECK(smem <= 220 * 1024, "mla_attention: latent dim {} / rank {} too large", D, kv_rank);
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    set_smem(mla_kernel, smem);
    smem_set = smem;
  }
  launch(mla_kernel, dim3(unsigned(chunks), unsigned(splits), unsigned(B + 1)), dim3(kMThreads), smem, true, p);
  if (splits > 1) launch(mla_reduce_kernel, dim3(unsigned(T * nh)), dim3(128), 0, true, p);
}

}  // namespace ts::ops::cuda
