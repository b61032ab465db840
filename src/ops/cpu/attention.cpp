#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping,
              const KvScales& kvs) {
  int64_t t_n = k.size(0);
  if (t_n == 0) return;
  int64_t kw = k.size(1) * k.size(2), vw = v.size(1) * v.size(2);
  int64_t slots = k_cache.size(0) * k_cache.size(1);
  TS_CHECK(k_cache.size(2) * k_cache.size(3) == kw && v_cache.size(2) * v_cache.size(3) == vw,
           "kv_write: cache {} vs k {}", k_cache.shape_str(), k.shape_str());
  const int32_t* slot = slot_mapping.ptr<int32_t>();
  if (k_cache.dtype == DType::f8_e4m3) {
    // FP8 cache: round-to-nearest e4m3 (saturating) of x times the inverse scale (the CUDA kernels
    // multiply by the same f32 inverse), the reference for the GPU kernels.
    check_kv_scales(kvs, "kv_write");
    const float ik = 1.0f / kvs.k, iv = 1.0f / kvs.v;
    for (int64_t t = 0; t < t_n; ++t) {
      if (slot[t] < 0) continue;
      TS_CHECK(slot[t] < slots, "kv_write: slot {} outside the pool of {}", slot[t], slots);
      for (int64_t h = 0; h < k.size(1); ++h)
        for (int64_t d = 0; d < k.size(2); ++d)
          k_cache.ptr<uint8_t>()[slot[t] * kw + h * k.size(2) + d] =
              f32_to_e4m3(k.ptr<float>()[t * k.stride[0] + h * k.stride[1] + d] * ik);
      for (int64_t h = 0; h < v.size(1); ++h)
        for (int64_t d = 0; d < v.size(2); ++d)
          v_cache.ptr<uint8_t>()[slot[t] * vw + h * v.size(2) + d] =
              f32_to_e4m3(v.ptr<float>()[t * v.stride[0] + h * v.stride[1] + d] * iv);
    }
    return;
  }
  for (int64_t t = 0; t < t_n; ++t) {
    if (slot[t] < 0) continue;
    TS_CHECK(slot[t] < slots, "kv_write: slot {} outside the pool of {}", slot[t], slots);
    // k/v rows are [heads, hd] possibly strided per token (views of a fused qkv buffer).
    for (int64_t h = 0; h < k.size(1); ++h)
      std::memcpy(k_cache.ptr<float>() + slot[t] * kw + h * k.size(2), k.ptr<float>() + t * k.stride[0] + h * k.stride[1],
                  size_t(k.size(2)) * 4);
    for (int64_t h = 0; h < v.size(1); ++h)
      std::memcpy(v_cache.ptr<float>() + slot[t] * vw + h * v.size(2), v.ptr<float>() + t * v.stride[0] + h * v.stride[1],
                  size_t(v.size(2)) * 4);
  }
}

// Reference paged attention: for each (query row, head) a two-pass softmax over the
// sequence's cached keys up to the query's position (from position - window + 1 with a
// window). fp32 throughout, double for the sum.
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& m,
                     float scale, Tensor& out, const KvScales& kvs, int window) {
  TS_CHECK(window >= 0, "paged_attention: window {} < 0", window);
  int64_t t_n = q.size(0);
  if (t_n == 0 || m.num_seqs == 0) return;
  int64_t nh = q.size(1), hd = q.size(2), nkv = k_cache.size(2), hdv = v_cache.size(3);
  TS_CHECK(nh % nkv == 0 && k_cache.size(3) == hd, "paged_attention: q {} k_cache {}", q.shape_str(), k_cache.shape_str());
  int64_t group = nh / nkv, bs = m.block_size, max_blocks = m.block_tables.size(1);
  const int32_t* cu = m.cu_q.ptr<int32_t>();
  const int32_t* kv_len = m.kv_len.ptr<int32_t>();
  const int32_t* bt = m.block_tables.ptr<int32_t>();
  // (row, head) work items, each independent.
  std::vector<int32_t> row_seq(size_t(t_n), -1);
  for (int b = 0; b < m.num_seqs; ++b) {
    // Checked here, before the parallel region (an exception cannot leave it): a query's rows
    // attend to kv_len - q_len + i + 1 keys, so kv_len below q_len is malformed metadata.
    TS_CHECK(cu[b] <= cu[b + 1] && cu[b + 1] <= t_n && kv_len[b] >= cu[b + 1] - cu[b],
             "paged_attention: sequence {} has {} query rows (from row {}) but kv_len {}", b, cu[b + 1] - cu[b], cu[b],
             kv_len[b]);
    for (int32_t r = cu[b]; r < cu[b + 1]; ++r) row_seq[size_t(r)] = b;
  }
  int64_t items = t_n * nh;
  const bool fp8 = k_cache.dtype == DType::f8_e4m3;
  TS_CHECK(v_cache.dtype == k_cache.dtype, "paged_attention: k cache {} vs v cache {}", dtype_name(k_cache.dtype),
           dtype_name(v_cache.dtype));
#pragma omp parallel
  {
    std::vector<float> scores, krow(size_t(fp8 ? hd : 0)), vrow(size_t(fp8 ? hdv : 0));
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      int64_t r = it / nh, h = it % nh, kvh = h / group;
      float* o = out.ptr<float>() + r * out.stride[0] + h * out.stride[1];
      int b = row_seq[size_t(r)];
      if (b < 0) {  // padding row
        std::memset(o, 0, size_t(hdv) * 4);
        continue;
      }
      int64_t q_len = cu[b + 1] - cu[b];
      int64_t pos = kv_len[b] - q_len + (r - cu[b]);
      const float* qv = q.ptr<float>() + r * q.stride[0] + h * q.stride[1];
      // Keys [lo, pos]: scores[j - lo].
      const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      int64_t n = pos + 1 - lo;
      scores.resize(size_t(n));
      float mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = lo + i;
        int64_t slot = int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs;
        const float* kv;
        if (fp8) {
          const uint8_t* kb = k_cache.ptr<uint8_t>() + (slot * nkv + kvh) * hd;
          for (int64_t d = 0; d < hd; ++d) krow[size_t(d)] = e4m3_to_f32(kb[d]) * kvs.k;
          kv = krow.data();
        } else {
          kv = k_cache.ptr<float>() + (slot * nkv + kvh) * hd;
        }
        float s = dot(qv, kv, hd) * scale;
        scores[size_t(i)] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
        sum += scores[size_t(j)];
      }
      float inv = float(1.0 / sum);
      for (int64_t d = 0; d < hdv; ++d) o[d] = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = lo + i;
        int64_t slot = int64_t(bt[b * max_blocks + j / bs]) * bs + j % bs;
        const float* vv;
        if (fp8) {
          const uint8_t* vb = v_cache.ptr<uint8_t>() + (slot * nkv + kvh) * hdv;
          for (int64_t d = 0; d < hdv; ++d) vrow[size_t(d)] = e4m3_to_f32(vb[d]) * kvs.v;
          vv = vrow.data();
        } else {
          vv = v_cache.ptr<float>() + (slot * nkv + kvh) * hdv;
        }
        float p = scores[size_t(i)] * inv;
        for (int64_t d = 0; d < hdv; ++d) o[d] += p * vv[d];
      }
    }
  }
}

}  // namespace ts::ops::cpu
