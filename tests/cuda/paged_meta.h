// Paged-attention metadata for the CUDA op tests: sequences (q_len, kv_len) laid out over a
// shuffled permutation of physical blocks, as host and device AttnMeta.
#pragma once
#include <algorithm>
#include <vector>

#include "cuda_test_util.h"

namespace ts::test {

struct SeqLens {
  int q_len, kv_len;
};

struct PagedMeta {
  ops::AttnMeta h, d;
  int64_t num_blocks = 0;
  int64_t rows = 0;  // query rows incl. padding rows
};

inline PagedMeta make_paged(const std::vector<SeqLens>& seqs, int bs, int pad_rows = 0, int spare_blocks = 3) {
  const int64_t B = int64_t(seqs.size());
  std::vector<int32_t> cu{0}, kvl;
  int max_q = 0, max_kv = 0, max_blocks = 1;
  int64_t total_blocks = 0;
  for (auto& s : seqs) {
    cu.push_back(cu.back() + s.q_len);
    kvl.push_back(s.kv_len);
    max_q = std::max(max_q, s.q_len);
    max_kv = std::max(max_kv, s.kv_len);
    const int nb = (s.kv_len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  PagedMeta m;
  m.num_blocks = total_blocks + spare_blocks;
  std::vector<int32_t> perm(static_cast<size_t>(m.num_blocks));
  for (int64_t i = 0; i < m.num_blocks; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng());
  Tensor bt = Tensor::empty({std::max<int64_t>(B, 1), max_blocks}, DType::i32);
  for (int64_t i = 0; i < bt.numel(); ++i) bt.ptr<int32_t>()[i] = -1;
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int nb = (seqs[size_t(b)].kv_len + bs - 1) / bs;
    for (int j = 0; j < nb; ++j) bt.ptr<int32_t>()[b * max_blocks + j] = perm[next++];
  }
  m.rows = cu.back() + pad_rows;
  m.h.cu_q = i32_host(cu);
  m.h.kv_len = i32_host(kvl);
  m.h.block_tables = bt;
  m.h.block_size = bs;
  m.h.num_seqs = int(B);
  m.h.max_q_len = max_q;
  m.h.max_kv_len = max_kv;
  m.d = m.h;
  m.d.cu_q = to_dev(m.h.cu_q);
  m.d.kv_len = B ? to_dev(m.h.kv_len) : Tensor::empty({0}, DType::i32, Device::cuda);
  m.d.block_tables = to_dev(bt);
  return m;
}

// Host and device copies of an i32 tensor.
inline Tensor i32_dev(const Tensor& h) { return h.to(Device::cuda); }

}  // namespace ts::test
