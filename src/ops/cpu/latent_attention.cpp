// Single-tensor cache writes and multi-head latent attention (absorbed form) over the paged
// latent cache. Same conventions as paged_attention: fp32, one work item per (row, head), a
// two-pass softmax with a double sum, keys visited in position order.
#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale) {
  int64_t t_n = x.size(0);
  if (t_n == 0) return;
  if (cache.dtype == DType::f8_e4m3) {  // kv_write's FP8 path without the v half
    Tensor none;
    ::ts::ops::cpu::kv_write(x, none, cache, none, slot_mapping, KvScales{fp8_scale, 1.0f});
    return;
  }
  TS_CHECK(x.ndim == 3 && cache.ndim == 4 && x.dtype == DType::f32 && cache.dtype == DType::f32,
           "cache_write: x {} cache {}", x.shape_str(), cache.shape_str());
  int64_t heads = x.size(1), dim = x.size(2), w = heads * dim;
  TS_CHECK(cache.size(2) == heads && cache.size(3) == dim && x.stride[2] == 1, "cache_write: x {} vs cache {}",
           x.shape_str(), cache.shape_str());
  int64_t slots = cache.size(0) * cache.size(1);
  const int32_t* slot = slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < t_n; ++t) {
    if (slot[t] < 0) continue;
    TS_CHECK(slot[t] < slots, "cache_write: slot {} outside the pool of {}", slot[t], slots);
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(cache.ptr<float>() + slot[t] * w + h * dim, x.ptr<float>() + t * x.stride[0] + h * x.stride[1],
                  size_t(dim) * 4);
  }
}

void mla_attention(const Tensor& q, const Tensor& cache, const AttnMeta& m, float scale, int64_t rank, Tensor& out,
                   float fp8_scale) {
  int64_t t_n = q.size(0);
  if (t_n == 0 || m.num_seqs == 0) return;
  int64_t nh = q.size(1), dk = q.size(2);
  TS_CHECK(cache.ndim == 4 && cache.size(2) == 1 && cache.size(3) == dk && rank > 0 && rank <= dk,
           "mla_attention: q {} latent cache {} rank {}", q.shape_str(), cache.shape_str(), rank);
  TS_CHECK(out.size(0) == t_n && out.size(1) == nh && out.size(2) == rank, "mla_attention: out {}", out.shape_str());
  int64_t bs = m.block_size, max_blocks = m.block_tables.size(1);
  const int32_t* cu = m.cu_q.ptr<int32_t>();
  const int32_t* kv_len = m.kv_len.ptr<int32_t>();
  const int32_t* bt = m.block_tables.ptr<int32_t>();
  std::vector<int32_t> row_seq(size_t(t_n), -1);
  for (int b = 0; b < m.num_seqs; ++b)
    for (int32_t r = cu[b]; r < cu[b + 1]; ++r) row_seq[size_t(r)] = b;
  // An FP8 latent cache: each row read is decoded (stored x fp8_scale) into a row buffer first,
  // the values the CUDA kernel reads.
  const bool fp8 = cache.dtype == DType::f8_e4m3;
  TS_CHECK(fp8 || cache.dtype == DType::f32, "mla_attention: latent cache dtype {}", dtype_name(cache.dtype));
  TS_CHECK(!fp8 || (fp8_scale > 0 && std::isfinite(fp8_scale)), "mla_attention: FP8 cache scale {} must be positive",
           fp8_scale);
  const float* c = fp8 ? nullptr : cache.ptr<float>();
  const uint8_t* c8 = fp8 ? cache.ptr<uint8_t>() : nullptr;
  int64_t items = t_n * nh;
#pragma omp parallel
  {
    std::vector<float> scores, row(size_t(fp8 ? dk : 0));
    // Cache row `slot` as f32 (decoded into `row` for an FP8 cache).
    auto row_of = [&](int64_t slot) -> const float* {
      if (!fp8) return c + slot * dk;
      for (int64_t d = 0; d < dk; ++d) row[size_t(d)] = e4m3_to_f32(c8[slot * dk + d]) * fp8_scale;
      return row.data();
    };
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      int64_t r = it / nh, h = it % nh;
      float* o = out.ptr<float>() + r * out.stride[0] + h * out.stride[1];
      int b = row_seq[size_t(r)];
      if (b < 0) {
        std::memset(o, 0, size_t(rank) * 4);
        continue;
      }
      int64_t q_len = cu[b + 1] - cu[b];
      int64_t n = kv_len[b] - q_len + (r - cu[b]) + 1;
      const float* qv = q.ptr<float>() + r * q.stride[0] + h * q.stride[1];
      scores.resize(size_t(n));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        int64_t slot = int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs;
        float s = dot(qv, row_of(slot), dk) * scale;
        scores[size_t(j)] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
        sum += scores[size_t(j)];
      }
      float inv = float(1.0 / sum);
      for (int64_t d = 0; d < rank; ++d) o[d] = 0;
      for (int64_t j = 0; j < n; ++j) {
        int64_t slot = int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs;
        const float* cv = row_of(slot);
        float p = scores[size_t(j)] * inv;
        for (int64_t d = 0; d < rank; ++d) o[d] += p * cv[d];
      }
    }
  }
}

}  // namespace ts::ops::cpu
