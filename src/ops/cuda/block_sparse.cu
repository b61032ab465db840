// MiniMax-M3 block-sparse attention on CUDA: the lightning indexer (block scores, top-k blocks,
// one selection per indexer head) and paged attention restricted to the picked blocks (each
// attention head reads its indexer head's selection, grouped like GQA). Straightforward kernels:
// one block per (query row, head) for both; fp32 math, CUDA cores.
#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 128;

// Sequence of packed query row r (binary search over cu_q[0..B]); -1 for padding rows.
__device__ __forceinline__ int seq_of_row(const int32_t* cu_q, int B, int r) {
  if (B <= 0 || r >= cu_q[B] || r < cu_q[0]) return -1;
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_q[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Float <-> int with the same order (for integer atomicMax on shared memory).
__device__ __forceinline__ int ord_enc(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -INFINITY;
  return warp_max(v);
}

// Dot of a f32 shared-memory vector with n bf16 from global memory.
__device__ __forceinline__ float dot_sh(const float* a, const __nv_bfloat16* b, int n, bool vec) {
  float s = 0.0f;
  if (vec) {
    for (int d = 0; d < n; d += 8) {
      BF8 v;
      v.u = *reinterpret_cast<const uint4*>(b + d);
      float f[8];
      bf8_to_f32(v, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) s = fmaf(a[d + j], f[j], s);
    }
  } else {
    for (int d = 0; d < n; ++d) s = fmaf(a[d], __bfloat162float(b[d]), s);
  }
  return s;
}

struct IndexerParams {
  const __nv_bfloat16* q;
  int64_t q_s0, q_s1;
  int nh, D;
  bool vec;
  const __nv_bfloat16* kc;  // [slots, D]
  const int32_t* cu_q;
  const int32_t* kv_len;
  const int32_t* bt;
  int64_t bt_ld;
  int block_size;  // paging block size
  int ibs, top_k, local;
  int32_t* out;
  int64_t o_s0, o_s1;
  int width, B, max_valid;
};

// One block per (query row, indexer head).
__global__ void __launch_bounds__(kThreads) indexer_kernel(IndexerParams p) {
  extern __shared__ __align__(16) float ism[];
  pdl_wait();
  const int r = blockIdx.x, hq = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* qs = ism;                                                 // [D]
  int* score = reinterpret_cast<int*>(qs + p.D);                   // [max_valid] order-encoded
  int* sel = score + p.max_valid;                                  // [width]
  int* rv = sel + p.width;                                         // [32] reduction scratch
  int* ri = rv + 32;                                               // [32]
  int32_t* o = p.out + int64_t(r) * p.o_s0 + int64_t(hq) * p.o_s1;
  for (int i = tid; i < p.width; i += kThreads) o[i] = -1;
  const int b = seq_of_row(p.cu_q, p.B, r);
  if (b < 0) return;
  const int len = p.kv_len[b];
  const int pos = len - (p.cu_q[b + 1] - p.cu_q[b]) + (r - p.cu_q[b]);
  const int q_block = pos / p.ibs, n_blocks = (len + p.ibs - 1) / p.ibs;
  const int valid = min(q_block + 1, p.max_valid);
  const int k = min(min(p.top_k, n_blocks), valid);
  for (int d = tid; d < p.D; d += kThreads) qs[d] = __bfloat162float(p.q[int64_t(r) * p.q_s0 + int64_t(hq) * p.q_s1 + d]);
  for (int n = tid; n < valid; n += kThreads) score[n] = ord_enc(-INFINITY);
  __syncthreads();
  // Block score: max over the block's keys up to the query.
  for (int j = tid; j <= pos && j / p.ibs < valid; j += kThreads) {
    const int blk = j / p.block_size;
    const int64_t slot = int64_t(p.bt[b * p.bt_ld + blk]) * p.block_size + (j - blk * p.block_size);
    atomicMax(&score[j / p.ibs], ord_enc(dot_sh(qs, p.kc + slot * p.D, p.D, p.vec)));
  }
  __syncthreads();
  if (tid == 0)
    for (int i = 0; i < p.local; ++i) {
      const int n = max(q_block - i, 0);
      if (n < valid) score[n] = ord_enc(INFINITY);
    }
  __syncthreads();
  // Top k by (score desc, block asc); a picked block is marked INT_MIN (below every real score).
  for (int i = 0; i < k; ++i) {
    int bv = INT_MIN, bi = -1;
    for (int n = tid; n < valid; n += kThreads) {
      const int v = score[n];
      if (v != INT_MIN && (bi < 0 || v > bv)) {  // n ascending per thread: ties keep the lower
        bv = v;
        bi = n;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const int ov = __shfl_xor_sync(0xffffffffu, bv, off), oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      rv[warp] = bv;
      ri[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      int wv = INT_MIN, wi = -1;
      for (int w = 0; w < kThreads / 32; ++w) {
        const int ov = rv[w], oi = ri[w];
        if (oi >= 0 && (wi < 0 || ov > wv || (ov == wv && oi < wi))) {
          wv = ov;
          wi = oi;
        }
      }
      sel[i] = wi;
      if (wi >= 0) score[wi] = INT_MIN;
    }
    __syncthreads();
  }
  // Ascending block ids.
  for (int i = tid; i < k; i += kThreads) {
    const int v = sel[i];
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += sel[j] < v;
    o[rank] = v;
  }
  pdl_trigger();
}

struct SparseParams {
  const __nv_bfloat16* q;
  int64_t q_s0, q_s1;
  const __nv_bfloat16* kc;
  const __nv_bfloat16* vc;
  int nh, nkv, hd, hd_v;
  bool vec;
  const int32_t* cu_q;
  const int32_t* kv_len;
  const int32_t* bt;
  int64_t bt_ld;
  int block_size;
  const int32_t* blocks;  // [T, S, n_sel]
  int64_t bl_s0, bl_s1;
  int n_sel, sel_group, sbs;
  float scale_log2;
  __nv_bfloat16* out;
  int64_t o_s0, o_s1;
  int B;
};

constexpr int kMaxVPerThread = 4;  // hd_v <= 4 * kThreads

// One block per (query row, head): online softmax over the picked blocks, 128 keys at a time.
__global__ void __launch_bounds__(kThreads) sparse_attn_kernel(SparseParams p) {
  extern __shared__ __align__(16) float ssm[];
  pdl_wait();
  const int r = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int G = p.nh / p.nkv, kvh = h / G;
  int64_t* slots = reinterpret_cast<int64_t*>(ssm);  // [kThreads]
  float* pr = reinterpret_cast<float*>(slots + kThreads);  // [kThreads]
  float* red = pr + kThreads;                        // [32]
  float* qs = red + 32;                              // [hd]
  __nv_bfloat16* o = p.out + int64_t(r) * p.o_s0 + int64_t(h) * p.o_s1;
  float acc[kMaxVPerThread] = {0, 0, 0, 0};
  float m = -INFINITY, l = 0.0f;
  const int b = seq_of_row(p.cu_q, p.B, r);
  if (b >= 0) {
    const int pos = p.kv_len[b] - (p.cu_q[b + 1] - p.cu_q[b]) + (r - p.cu_q[b]);
    for (int i = tid; i < p.hd; i += kThreads)
      qs[i] = __bfloat162float(p.q[int64_t(r) * p.q_s0 + int64_t(h) * p.q_s1 + i]);
    __syncthreads();
    const int32_t* sel = p.blocks + int64_t(r) * p.bl_s0 + int64_t(h / p.sel_group) * p.bl_s1;
    for (int i = 0; i < p.n_sel; ++i) {
      const int sb = sel[i];
      if (sb < 0) continue;
      const int j_begin = sb * p.sbs, j_end = min((sb + 1) * p.sbs, pos + 1);
      for (int j0 = j_begin; j0 < j_end; j0 += kThreads) {
        const int j = j0 + tid, n = min(kThreads, j_end - j0);
        float s = -INFINITY;
        if (j < j_end) {
          const int blk = j / p.block_size;
          const int64_t slot = int64_t(p.bt[b * p.bt_ld + blk]) * p.block_size + (j - blk * p.block_size);
          slots[tid] = slot;
          s = dot_sh(qs, p.kc + (slot * p.nkv + kvh) * p.hd, p.hd, p.vec) * p.scale_log2;
        }
        const float m_new = fmaxf(m, block_max(s, red));  // finite: the chunk has a key
        const float pj = j < j_end ? exp2f(s - m_new) : 0.0f;
        pr[tid] = pj;
        const float a = exp2f(m - m_new);
        l = l * a + block_sum(pj, red);  // block_sum syncs: pr / slots visible afterwards
        m = m_new;
#pragma unroll
        for (int q = 0; q < kMaxVPerThread; ++q) {
          const int d = tid + q * kThreads;
          if (d >= p.hd_v) break;
          float v = acc[q] * a;
          for (int t = 0; t < n; ++t)
            v = fmaf(pr[t], __bfloat162float(p.vc[(slots[t] * p.nkv + kvh) * p.hd_v + d]), v);
          acc[q] = v;
        }
        __syncthreads();  // pr / slots reused by the next chunk
      }
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int q = 0; q < kMaxVPerThread; ++q) {
    const int d = tid + q * kThreads;
    if (d < p.hd_v) o[d] = __float2bfloat16(acc[q] * inv);
  }
  pdl_trigger();
}

void check_meta(const AttnMeta& meta, int64_t B, const char* what) {
  check_dev(meta.cu_q, DType::i32, "attention cu_q");
  check_dev(meta.kv_len, DType::i32, "attention kv_len");
  check_dev(meta.block_tables, DType::i32, "attention block_tables");
  TS_CHECK(meta.cu_q.numel() == B + 1 && meta.kv_len.numel() == B && meta.block_tables.ndim == 2 &&
               meta.block_tables.size(0) >= B && meta.block_size > 0,
           "{}: metadata shapes cu_q {} kv_len {} block_tables {} for {} seqs", what, meta.cu_q.shape_str(),
           meta.kv_len.shape_str(), meta.block_tables.shape_str(), B);
}

}  // namespace

void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& meta, const BlockIndexer& bi, Tensor& out) {
  check_dev(q, DType::bf16, "block_indexer q");
  check_dev(k_cache, DType::bf16, "block_indexer k_cache");
  check_dev(out, DType::i32, "block_indexer out");
  const int64_t T = q.size(0), nh = q.size(1), width = bi.top_k;
  TS_CHECK(q.ndim == 3 && out.ndim == 3 && out.size(0) == T && out.size(1) == nh && out.size(2) == width &&
               (out.stride[2] == 1 || width <= 1),
           "block_indexer: out {} for [{}, {}, {}]", out.shape_str(), T, nh, width);
  if (T == 0 || nh == 0) return;
  const int64_t D = q.size(2), B = meta.num_seqs;
  TS_CHECK(q.stride[2] == 1, "block_indexer: q {} must have a contiguous last dim", q.shape_str());
  TS_CHECK(k_cache.ndim == 4 && k_cache.size(2) == 1 && k_cache.size(3) == D && k_cache.is_contiguous() &&
               k_cache.size(1) == meta.block_size,
           "block_indexer: q {} k_cache {}", q.shape_str(), k_cache.shape_str());
  TS_CHECK(bi.block_size > 0 && bi.top_k >= 0 && bi.local_blocks >= 0, "block_indexer: bad parameters");
  check_meta(meta, B, "block_indexer");
  IndexerParams p{};
  p.q = q.ptr<__nv_bfloat16>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.nh = int(nh);
  p.D = int(D);
  p.vec = D % 8 == 0 && aligned16(k_cache.data);
  p.kc = k_cache.ptr<__nv_bfloat16>();
  p.cu_q = meta.cu_q.ptr<int32_t>();
  p.kv_len = meta.kv_len.ptr<int32_t>();
  p.bt = meta.block_tables.ptr<int32_t>();
  p.bt_ld = meta.block_tables.row_stride();
  p.block_size = meta.block_size;
  p.ibs = bi.block_size;
  p.top_k = bi.top_k;
  p.local = bi.local_blocks;
  p.out = out.ptr<int32_t>();
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.width = int(width);
  p.B = int(B);
  p.max_valid = int(std::max<int64_t>(1, ceil_div(std::max(meta.max_kv_len, 1), bi.block_size)));
  const size_t smem = size_t(D) * 4 + size_t(p.max_valid) * 4 + size_t(width) * 4 + 64 * 4;
  TS_CHECK(smem <= 200 * 1024, "block_indexer: {} dims, {} blocks: too much shared memory", D, p.max_valid);
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    set_smem(indexer_kernel, smem);
    smem_set = smem;
  }
  TS_CHECK(T <= 0x7fffffff && nh <= 65535, "block_indexer: too many rows or heads");
  launch(indexer_kernel, dim3(unsigned(T), unsigned(nh)), dim3(kThreads), smem, true, p);
}

void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta,
                            float scale, const Tensor& blocks, int sel_block_size, Tensor& out) {
  check_dev(q, DType::bf16, "block_sparse_attention q");
  check_dev(k_cache, DType::bf16, "block_sparse_attention k_cache");
  check_dev(v_cache, DType::bf16, "block_sparse_attention v_cache");
  check_dev(blocks, DType::i32, "block_sparse_attention blocks");
  check_dev(out, DType::bf16, "block_sparse_attention out");
  const int64_t T = q.size(0), B = meta.num_seqs;
  if (T == 0 || B == 0) return;
  TS_CHECK(q.ndim == 3 && out.ndim == 3 && k_cache.ndim == 4 && v_cache.ndim == 4,
           "block_sparse_attention: q {} out {} k_cache {} v_cache {}", q.shape_str(), out.shape_str(),
           k_cache.shape_str(), v_cache.shape_str());
  const int64_t nh = q.size(1), hd = q.size(2), nkv = k_cache.size(2), hd_v = v_cache.size(3);
  TS_CHECK(nkv > 0 && nh % nkv == 0 && k_cache.size(3) == hd && v_cache.size(2) == nkv && blocks.ndim == 3 &&
               blocks.size(0) == T && blocks.size(1) > 0 && nh % blocks.size(1) == 0 &&
               (blocks.stride[2] == 1 || blocks.size(2) <= 1) &&
               sel_block_size > 0 && out.size(0) == T && out.size(1) == nh && out.size(2) == hd_v &&
               k_cache.size(1) == meta.block_size && v_cache.size(1) == meta.block_size,
           "block_sparse_attention: q {} k_cache {} v_cache {} blocks {} out {}", q.shape_str(), k_cache.shape_str(),
           v_cache.shape_str(), blocks.shape_str(), out.shape_str());
  TS_CHECK(q.stride[2] == 1 && out.stride[2] == 1 && k_cache.is_contiguous() && v_cache.is_contiguous(),
           "block_sparse_attention: head dims and caches must be contiguous");
  TS_CHECK(hd_v <= kMaxVPerThread * kThreads && nh <= 65535 && T <= 0x7fffffff,
           "block_sparse_attention: head dim {} / heads {} too large", hd_v, nh);
  check_meta(meta, B, "block_sparse_attention");
  SparseParams p{};
  p.q = q.ptr<__nv_bfloat16>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.kc = k_cache.ptr<__nv_bfloat16>();
  p.vc = v_cache.ptr<__nv_bfloat16>();
  p.nh = int(nh);
  p.nkv = int(nkv);
  p.hd = int(hd);
  p.hd_v = int(hd_v);
  p.vec = hd % 8 == 0 && aligned16(p.kc);
  p.cu_q = meta.cu_q.ptr<int32_t>();
  p.kv_len = meta.kv_len.ptr<int32_t>();
  p.bt = meta.block_tables.ptr<int32_t>();
  p.bt_ld = meta.block_tables.row_stride();
  p.block_size = meta.block_size;
  p.blocks = blocks.ptr<int32_t>();
  p.bl_s0 = blocks.stride[0];
  p.bl_s1 = blocks.stride[1];
  p.n_sel = int(blocks.size(2));
  p.sel_group = int(nh / blocks.size(1));
  p.sbs = sel_block_size;
  p.scale_log2 = scale * kLog2e;
  p.out = out.ptr<__nv_bfloat16>();
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.B = int(B);
  const size_t smem = size_t(hd) * 4 + kThreads * 4 + 32 * 4 + kThreads * 8 + 16;
  TS_CHECK(smem <= 48 * 1024, "block_sparse_attention: head dim {} too large", hd);
  launch(sparse_attn_kernel, dim3(unsigned(T), unsigned(nh)), dim3(kThreads), smem, true, p);
}

}  // namespace ts::ops::cuda
