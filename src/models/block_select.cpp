#include "models/block_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device_memory.h"

namespace ts::models {

namespace {

// Contiguous host copy of a possibly strided tensor (e.g. q, a column slice of the fused qkv):
// one copy of the span it covers, then a gather.
Tensor host_copy(const Tensor& t) {
  if (t.is_contiguous() || t.numel() == 0) return t.to(Device::cpu);
  int64_t span = 1;
  for (int d = 0; d < t.ndim; ++d) span += (t.shape[size_t(d)] - 1) * t.stride[size_t(d)];
  Tensor raw = Tensor::empty({span}, t.dtype);
  device_copy(raw.data, Device::cpu, t.data, t.device, size_t(span) * dtype_size(t.dtype));
  Tensor packed = Tensor::empty(t.dims(), t.dtype);
  const size_t es = dtype_size(t.dtype);
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0, rem = i;
    for (int d = t.ndim - 1; d >= 0; --d) {
      idx[size_t(d)] = rem % t.shape[size_t(d)];
      rem /= t.shape[size_t(d)];
      off += idx[size_t(d)] * t.stride[size_t(d)];
    }
    std::memcpy(static_cast<char*>(packed.data) + size_t(i) * es, static_cast<char*>(raw.data) + size_t(off) * es, es);
  }
  return packed;
}

Tensor host_f32(const Tensor& t) { return host_copy(t).to_f32(); }

ops::AttnMeta host_meta(const ops::AttnMeta& m) {
  ops::AttnMeta h = m;
  h.cu_q = host_copy(m.cu_q);
  h.kv_len = host_copy(m.kv_len);
  h.block_tables = host_copy(m.block_tables);
  return h;
}

}  // namespace

BlockSelectHook*& block_select_hook() {
  static thread_local BlockSelectHook* h = nullptr;
  return h;
}

void BlockTape::on_select(int layer, const Tensor& idx_q, const Tensor& idx_k, const Tensor& positions,
                          const ops::BlockIndexer& p, Tensor& sel) {
  TS_CHECK(layer == int(seen.size()), "block tape: layer {} after {} recorded (call start() before each forward)", layer,
           seen.size());
  BlockRecord rec;
  rec.q = host_f32(idx_q);
  rec.k = host_f32(idx_k).view({idx_k.size(0), idx_k.size(-1)});
  rec.positions = host_copy(positions);
  rec.sel = host_copy(sel);
  rec.indexer = p;
  seen.push_back(std::move(rec));
  if (forced.empty()) return;
  TS_CHECK(layer < int(forced.size()), "block tape: no forced selection for sparse layer {} ({} given)", layer,
           forced.size());
  const BlockRecord& f = forced[size_t(layer)];
  TS_CHECK(f.sel.dims() == sel.dims() && f.sel.dtype == DType::i32 && sel.is_contiguous(),
           "block tape: forced layer {} has sel {}, the model selects {}", layer, f.sel.shape_str(), sel.shape_str());
  device_copy(sel.data, sel.device, f.sel.data, Device::cpu, sel.nbytes());
}

void BlockTape::on_attention(int layer, const SparseAttnCall& c) {
  if (!check) return;
  TS_CHECK(layer == int(checks.size()) && layer < int(seen.size()), "block tape: attention of layer {} out of order", layer);
  // The CPU ops on host f32 copies of exactly what the device kernels read.
  const ops::AttnMeta m = host_meta(*c.meta);
  const Tensor iq = host_f32(*c.idx_q), ic = host_f32(*c.idx_cache);
  Tensor cpu_sel = Tensor::empty(c.sel->dims(), DType::i32);
  ops::block_indexer(iq, ic, m, *c.indexer, cpu_sel);
  const Tensor q = host_f32(*c.q), kc = host_f32(*c.k_cache), vc = host_f32(*c.v_cache);
  const Tensor used = host_copy(*c.sel), dev_out = host_f32(*c.out);
  Tensor cpu_out = Tensor::empty(c.out->dims(), DType::f32);
  ops::block_sparse_attention(q, kc, vc, m, c.scale, used, c.indexer->block_size, cpu_out);
  SparseCheck r;
  const BlockRecord& own = seen[size_t(layer)];  // the device indexer's own pick
  const int64_t T = cpu_sel.size(0), Hi = cpu_sel.size(1), w = cpu_sel.size(2);
  r.pairs = T * Hi;
  for (int64_t i = 0; i < T * Hi; ++i)
    r.sel_differ += std::memcmp(cpu_sel.ptr<int32_t>() + i * w, own.sel.ptr<int32_t>() + i * w, size_t(w) * 4) != 0;
  for (int64_t i = 0; i < cpu_out.numel(); ++i) {
    r.out_diff = std::max(r.out_diff, double(std::fabs(cpu_out.ptr<float>()[i] - dev_out.ptr<float>()[i])));
    r.out_max = std::max(r.out_max, double(std::fabs(cpu_out.ptr<float>()[i])));
  }
  checks.push_back(r);
}

std::vector<float> block_scores(const BlockRecord& r, int64_t row, int64_t head) {
  const int64_t D = r.q.size(2), ibs = r.indexer.block_size;
  const int64_t pos = r.positions.ptr<int32_t>()[row];
  TS_CHECK(pos < r.k.size(0), "block_scores: position {} past the record's {} keys (one sequence from 0 only)", pos,
           r.k.size(0));
  const int64_t q_block = pos / ibs;
  std::vector<float> s(size_t(q_block + 1), -INFINITY);
  const float* q = r.q.ptr<float>() + (row * r.q.size(1) + head) * D;
  for (int64_t j = 0; j <= pos; ++j) {
    const float* k = r.k.ptr<float>() + j * D;
    float d = 0;
    for (int64_t i = 0; i < D; ++i) d += q[i] * k[i];
    s[size_t(j / ibs)] = std::max(s[size_t(j / ibs)], d);
  }
  for (int64_t i = 0; i < r.indexer.local_blocks; ++i) s[size_t(std::max<int64_t>(q_block - i, 0))] = INFINITY;
  return s;
}

}  // namespace ts::models
