// MiniMax-M3 block-sparse attention: the lightning indexer that picks key blocks per query,
// and paged attention restricted to the picked blocks. Each query row is independent.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

static std::vector<int32_t> rows_to_seqs(const AttnMeta& m, int64_t t_n) {
  std::vector<int32_t> row_seq(size_t(t_n), -1);
  const int32_t* cu = m.cu_q.ptr<int32_t>();
  for (int b = 0; b < m.num_seqs; ++b)
    for (int32_t r = cu[b]; r < cu[b + 1]; ++r) row_seq[size_t(r)] = b;
  return row_seq;
}

void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& m, const BlockIndexer& p, Tensor& out) {
  // transformers: one independent selection per indexer head (= per KV / GQA group).
  int64_t t_n = q.size(0), nh = q.size(1), dim = q.size(2);
  const int64_t width = p.top_k;
  TS_CHECK(out.dtype == DType::i32 && out.ndim == 3 && out.size(0) == t_n && out.size(1) == nh && out.size(2) == width,
           "block_indexer: out {} for [{}, {}, {}]", out.shape_str(), t_n, nh, width);
  if (t_n == 0) return;
  TS_CHECK(k_cache.ndim == 4 && k_cache.size(2) == 1 && k_cache.size(3) == dim, "block_indexer: q {} k_cache {}",
           q.shape_str(), k_cache.shape_str());
  TS_CHECK(p.block_size > 0 && p.top_k >= 0 && p.local_blocks >= 0, "block_indexer: bad parameters");
  int64_t bs = m.block_size, max_blocks = m.block_tables.size(1), ibs = p.block_size;
  const int32_t* cu = m.cu_q.ptr<int32_t>();
  const int32_t* kv_len = m.kv_len.ptr<int32_t>();
  const int32_t* bt = m.block_tables.ptr<int32_t>();
  std::vector<int32_t> row_seq = rows_to_seqs(m, t_n);
  const float* kc = k_cache.ptr<float>();
  int64_t os = out.stride[0];
#pragma omp parallel
  {
    std::vector<float> score;
    std::vector<int> order;
    std::vector<int32_t> sel;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < t_n * nh; ++it) {
      int64_t r = it / nh, h = it % nh;
      int32_t* o = out.ptr<int32_t>() + r * os + h * out.stride[1];
      std::fill(o, o + width, -1);
      int b = row_seq[size_t(r)];
      if (b < 0) continue;
      int64_t len = kv_len[b];
      int64_t pos = len - (cu[b + 1] - cu[b]) + (r - cu[b]);
      int64_t q_block = pos / ibs, n_blocks = (len + ibs - 1) / ibs;
      // Blocks after the query's own are never kept; a block's score pools its keys up to the
      // query only (so prefill, chunked prefill and decode select alike).
      int64_t valid = q_block + 1;
      score.assign(size_t(valid), -INFINITY);
      for (int64_t n = 0; n < valid; ++n) {
        float best = -INFINITY;
        for (int64_t j = n * ibs; j < std::min((n + 1) * ibs, pos + 1); ++j) {
          int64_t slot = int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs;
          const float* kv = kc + slot * dim;
          best = std::max(best, dot(q.ptr<float>() + r * q.stride[0] + h * q.stride[1], kv, dim));
        }
        score[size_t(n)] = best;
      }
      for (int64_t i = 0; i < p.local_blocks; ++i) score[size_t(std::max<int64_t>(q_block - i, 0))] = INFINITY;
      int64_t k = std::min<int64_t>(std::min<int64_t>(p.top_k, n_blocks), valid);
      order.resize(size_t(valid));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int c) {
        return score[size_t(a)] > score[size_t(c)] || (score[size_t(a)] == score[size_t(c)] && a < c);
      });
      sel.assign(order.begin(), order.begin() + k);
      std::sort(sel.begin(), sel.end());
      std::copy(sel.begin(), sel.end(), o);
    }
  }
}

void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& m,
                            float scale, const Tensor& blocks, int sel_block_size, Tensor& out) {
  int64_t t_n = q.size(0);
  if (t_n == 0 || m.num_seqs == 0) return;
  int64_t nh = q.size(1), hd = q.size(2), nkv = k_cache.size(2), hdv = v_cache.size(3);
  TS_CHECK(nh % nkv == 0 && k_cache.size(3) == hd && blocks.dtype == DType::i32 && blocks.ndim == 3 &&
               blocks.size(0) == t_n && nh % blocks.size(1) == 0 && sel_block_size > 0,
           "block_sparse_attention: q {} k_cache {} blocks {}", q.shape_str(), k_cache.shape_str(), blocks.shape_str());
  int64_t group = nh / nkv, bs = m.block_size, max_blocks = m.block_tables.size(1), sbs = sel_block_size;
  int64_t n_sel = blocks.size(2), sel_group = nh / blocks.size(1);
  const int32_t* cu = m.cu_q.ptr<int32_t>();
  const int32_t* kv_len = m.kv_len.ptr<int32_t>();
  const int32_t* bt = m.block_tables.ptr<int32_t>();
  std::vector<int32_t> row_seq = rows_to_seqs(m, t_n);
  int64_t items = t_n * nh;
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<int64_t> keys;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      int64_t r = it / nh, h = it % nh, kvh = h / group;
      float* o = out.ptr<float>() + r * out.stride[0] + h * out.stride[1];
      for (int64_t d = 0; d < hdv; ++d) o[d] = 0;
      int b = row_seq[size_t(r)];
      if (b < 0) continue;
      int64_t pos = kv_len[b] - (cu[b + 1] - cu[b]) + (r - cu[b]);
      keys.clear();
      // Attention head h reads the selection of its indexer head (heads grouped like GQA).
      const int32_t* sel = blocks.ptr<int32_t>() + r * blocks.stride[0] + (h / sel_group) * blocks.stride[1];
      for (int64_t i = 0; i < n_sel; ++i) {
        if (sel[i] < 0) continue;
        for (int64_t j = int64_t(sel[i]) * sbs; j < std::min<int64_t>((int64_t(sel[i]) + 1) * sbs, pos + 1); ++j)
          keys.push_back(int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs);
      }
      if (keys.empty()) continue;
      const float* qv = q.ptr<float>() + r * q.stride[0] + h * q.stride[1];
      scores.resize(keys.size());
      float mx = -INFINITY;
      for (size_t i = 0; i < keys.size(); ++i) {
        float s = dot(qv, k_cache.ptr<float>() + (keys[i] * nkv + kvh) * hd, hd) * scale;
        scores[i] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (auto& s : scores) {
        s = std::exp(s - mx);
        sum += s;
      }
      float inv = float(1.0 / sum);
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* vv = v_cache.ptr<float>() + (keys[i] * nkv + kvh) * hdv;
        float pr = scores[i] * inv;
        for (int64_t d = 0; d < hdv; ++d) o[d] += pr * vv[d];
      }
    }
  }
}

}  // namespace ts::ops::cpu
