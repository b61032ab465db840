// MLA in the absorbed form against expanded multi-head attention, the lightning indexer and
// block-sparse attention against paged attention, on random data over a shuffled paged cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/ops.h"

using namespace ts;

namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& g, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(g);
  return t;
}

Tensor i32(std::vector<int32_t> v, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * 4);  // memcpy(null, null, 0) is UB (UBSan)
  return t;
}

// A batch of sequences: (cached tokens before this step, new tokens), blocks shuffled.
struct Batch {
  ops::AttnMeta meta;
  Tensor slots, positions;
  std::vector<int32_t> cu, kv_len, tables, slotv, posv;
  int64_t tokens = 0;
  Batch(const std::vector<std::pair<int, int>>& seqs, int bs, int max_blocks, std::mt19937& g) {
    int n = int(seqs.size());
    std::vector<int32_t> perm(size_t(n * max_blocks));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), g);
    cu.push_back(0);
    for (int b = 0; b < n; ++b) {
      auto [cached, fresh] = seqs[size_t(b)];
      for (int i = 0; i < max_blocks; ++i) tables.push_back(perm[size_t(b * max_blocks + i)]);
      for (int p = cached; p < cached + fresh; ++p) {
        posv.push_back(p);
        slotv.push_back(tables[size_t(b * max_blocks + p / bs)] * bs + p % bs);
      }
      cu.push_back(cu.back() + fresh);
      kv_len.push_back(cached + fresh);
    }
    tokens = cu.back();
    meta.cu_q = i32(cu, {n + 1});
    meta.kv_len = i32(kv_len, {n});
    meta.block_tables = i32(tables, {n, max_blocks});
    meta.block_size = bs;
    meta.num_seqs = n;
    slots = i32(slotv, {tokens});
    positions = i32(posv, {tokens});
  }
};

}  // namespace

TEST(MlaAttention, AbsorbedEqualsExpanded) {
  std::mt19937 g(3);
  const int64_t nh = 3, nope = 8, rope = 4, vd = 6, rank = 10, bs = 4, max_blocks = 6;
  // Sequence 0: prefill of 9; sequence 1: decode after 13 cached; sequence 2: chunk of 3 after 5.
  std::vector<std::pair<int, int>> seqs = {{0, 9}, {13, 1}, {5, 3}};
  Batch bt(seqs, int(bs), int(max_blocks), g);
  const int64_t pool = int64_t(seqs.size()) * max_blocks;
  // Every cached token's latent c and roped k_pe; the batch's own rows are written by the op.
  Tensor latent_cache = Tensor::zeros({pool, bs, 1, rank + rope}, DType::f32);
  Tensor k_cache = Tensor::zeros({pool, bs, nh, nope + rope}, DType::f32);
  Tensor v_cache = Tensor::zeros({pool, bs, nh, vd}, DType::f32);
  Tensor kv_b = random_tensor({nh * (nope + vd), rank}, g, 0.4f);
  auto expand_token = [&](const float* c, const float* kpe, int64_t slot) {
    for (int64_t h = 0; h < nh; ++h) {
      float* kd = k_cache.ptr<float>() + (slot * nh + h) * (nope + rope);
      float* vv = v_cache.ptr<float>() + (slot * nh + h) * vd;
      for (int64_t d = 0; d < nope; ++d) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j) s += double(kv_b.ptr<float>()[(h * (nope + vd) + d) * rank + j]) * c[j];
        kd[d] = float(s);
      }
      for (int64_t d = 0; d < rope; ++d) kd[nope + d] = kpe[d];
      for (int64_t d = 0; d < vd; ++d) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j) s += double(kv_b.ptr<float>()[(h * (nope + vd) + nope + d) * rank + j]) * c[j];
        vv[d] = float(s);
      }
    }
  };
  // Earlier context of each sequence.
  for (size_t b = 0; b < seqs.size(); ++b)
    for (int p = 0; p < seqs[b].first; ++p) {
      int64_t slot = int64_t(bt.tables[b * size_t(max_blocks) + size_t(p / bs)]) * bs + p % bs;
      Tensor row = random_tensor({rank + rope}, g);
      std::memcpy(latent_cache.ptr<float>() + slot * (rank + rope), row.data, size_t(rank + rope) * 4);
      expand_token(row.ptr<float>(), row.ptr<float>() + rank, slot);
    }
  // This step's tokens.
  const int64_t T = bt.tokens;
  Tensor ckv = random_tensor({T, 1, rank + rope}, g);
  ops::cache_write(ckv, latent_cache, bt.slots);
  for (int64_t t = 0; t < T; ++t)
    expand_token(ckv.ptr<float>() + t * (rank + rope), ckv.ptr<float>() + t * (rank + rope) + rank, bt.slotv[size_t(t)]);
  Tensor q = random_tensor({T, nh, nope + rope}, g);
  const float scale = 0.37f;

  // Expanded reference: ordinary paged attention over per-head keys and values.
  Tensor ref = Tensor::empty({T, nh, vd}, DType::f32);
  ops::paged_attention(q, k_cache, v_cache, bt.meta, scale, ref);

  // Absorbed: q_lat = W_UK^T q_nope per head, attention over [c | k_pe], then W_UV.
  Tensor qc = Tensor::empty({T, nh, rank + rope}, DType::f32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* qn = q.ptr<float>() + (t * nh + h) * (nope + rope);
      float* o = qc.ptr<float>() + (t * nh + h) * (rank + rope);
      for (int64_t j = 0; j < rank; ++j) {
        double s = 0;
        for (int64_t d = 0; d < nope; ++d) s += double(qn[d]) * kv_b.ptr<float>()[(h * (nope + vd) + d) * rank + j];
        o[j] = float(s);
      }
      for (int64_t d = 0; d < rope; ++d) o[rank + d] = qn[nope + d];
    }
  Tensor olat = Tensor::empty({T, nh, rank}, DType::f32);
  ops::mla_attention(qc, latent_cache, bt.meta, scale, rank, olat);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t d = 0; d < vd; ++d) {
        double s = 0;
        for (int64_t j = 0; j < rank; ++j)
          s += double(kv_b.ptr<float>()[(h * (nope + vd) + nope + d) * rank + j]) * olat.ptr<float>()[(t * nh + h) * rank + j];
        EXPECT_NEAR(s, ref.ptr<float>()[(t * nh + h) * vd + d], 2e-5) << t << "," << h << "," << d;
      }
}

TEST(MlaAttention, ZeroTokens) {
  std::mt19937 g(1);
  Batch bt({}, 4, 2, g);
  Tensor cache = Tensor::zeros({2, 4, 1, 12}, DType::f32);
  Tensor q = Tensor::empty({0, 2, 12}, DType::f32), out = Tensor::empty({0, 2, 8}, DType::f32);
  Tensor none = Tensor::empty({0, 1, 12}, DType::f32);
  EXPECT_NO_THROW(ops::cache_write(none, cache, bt.slots));
  EXPECT_NO_THROW(ops::mla_attention(q, cache, bt.meta, 1.0f, 8, out));
}

TEST(BlockIndexer, SelectsTopBlocksWithLocal) {
  // One sequence of 10 tokens, index blocks of 2 tokens, 1 index head of dim 2, top 3 with the
  // query's own block forced in. Keys: token j has k = (s_j, 0), query q = (1, 0).
  std::mt19937 g(5);
  Batch bt({{0, 10}}, 4, 3, g);
  Tensor k = Tensor::zeros({10, 1, 2}, DType::f32);
  float s[10] = {5, 0, 1, 1, 0, 9, 2, 2, 0, -1};
  for (int j = 0; j < 10; ++j) k.ptr<float>()[j * 2] = s[j];
  Tensor cache = Tensor::zeros({3, 4, 1, 2}, DType::f32);
  ops::cache_write(k, cache, bt.slots);
  Tensor q = Tensor::zeros({10, 1, 2}, DType::f32);
  for (int j = 0; j < 10; ++j) q.ptr<float>()[j * 2] = 1.0f;
  ops::BlockIndexer p{2, 3, 1};
  Tensor out = Tensor::empty({10, 1, 3}, DType::i32);  // [T, indexer heads, top-k]
  ops::block_indexer(q, cache, bt.meta, p, out);
  auto row = [&](int r) { return std::vector<int32_t>(out.ptr<int32_t>() + r * 3, out.ptr<int32_t>() + r * 3 + 3); };
  // Block scores (max over keys): b0 5, b1 1, b2 9 (9 only from position 5 on), b3 2, b4 0.
  EXPECT_EQ(row(0), (std::vector<int32_t>{0, -1, -1}));
  EXPECT_EQ(row(3), (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(row(4), (std::vector<int32_t>{0, 1, 2}));     // b2 = local (its key 4 scores 0 so far)
  EXPECT_EQ(row(7), (std::vector<int32_t>{0, 2, 3}));     // b3 local, then b2 (9) and b0 (5)
  EXPECT_EQ(row(9), (std::vector<int32_t>{0, 2, 4}));     // b4 local
}

TEST(BlockSparseAttention, AllBlocksEqualsPagedAttention) {
  std::mt19937 g(9);
  const int64_t nh = 4, nkv = 2, hd = 8, bs = 4, max_blocks = 5;
  std::vector<std::pair<int, int>> seqs = {{0, 11}, {6, 1}, {3, 4}};
  Batch bt(seqs, int(bs), int(max_blocks), g);
  const int64_t pool = int64_t(seqs.size()) * max_blocks, T = bt.tokens;
  Tensor kc = random_tensor({pool, bs, nkv, hd}, g), vc = random_tensor({pool, bs, nkv, hd}, g);
  Tensor q = random_tensor({T, nh, hd}, g);
  Tensor ref = Tensor::empty({T, nh, hd}, DType::f32), out = Tensor::empty({T, nh, hd}, DType::f32);
  ops::paged_attention(q, kc, vc, bt.meta, 0.3f, ref);
  // Every block of 3 tokens listed (index blocks need not match the cache's paging).
  const int sbs = 3;
  Tensor sel = Tensor::empty({T, 1, 6}, DType::i32);  // one indexer head: shared by all heads
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 6; ++i) sel.ptr<int32_t>()[t * 6 + i] = i < 5 ? i : -1;
  ops::block_sparse_attention(q, kc, vc, bt.meta, 0.3f, sel, sbs, out);
  for (int64_t i = 0; i < ref.numel(); ++i) EXPECT_NEAR(out.ptr<float>()[i], ref.ptr<float>()[i], 1e-6);
  // Two indexer heads: heads 0-1 read selection 0 (every block), heads 2-3 selection 1 (block 0
  // only) — heads 0-1 still equal full attention, heads 2-3 of a long row do not.
  Tensor sel2 = Tensor::empty({T, 2, 6}, DType::i32);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 6; ++i) {
      sel2.ptr<int32_t>()[(t * 2 + 0) * 6 + i] = i < 5 ? i : -1;
      sel2.ptr<int32_t>()[(t * 2 + 1) * 6 + i] = i == 0 ? 0 : -1;
    }
  ops::block_sparse_attention(q, kc, vc, bt.meta, 0.3f, sel2, sbs, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < hd; ++e)
        EXPECT_NEAR(out.ptr<float>()[(t * nh + h) * hd + e], ref.ptr<float>()[(t * nh + h) * hd + e], 1e-6);
  int64_t last = bt.cu[1] - 1;  // position 10 of sequence 0: blocks 1-3 dropped for heads 2-3
  double diff = 0;
  for (int64_t e = 0; e < hd; ++e) diff += std::fabs(out.ptr<float>()[(last * nh + 2) * hd + e] - ref.ptr<float>()[(last * nh + 2) * hd + e]);
  EXPECT_GT(diff, 1e-3);
  // Only block 0 (tokens 0..2): row 0 of sequence 2 (position 3) attends to tokens 0..2 only.
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 6; ++i) sel.ptr<int32_t>()[t * 6 + i] = i == 0 ? 0 : -1;  // [T, 1, 6]
  ops::block_sparse_attention(q, kc, vc, bt.meta, 0.3f, sel, sbs, out);
  int64_t r = bt.cu[2];  // first row of sequence 2, position 3
  for (int64_t h = 0; h < nh; ++h) {
    int64_t kvh = h / (nh / nkv);
    double w[3], sum = 0, mx = -1e30;
    for (int j = 0; j < 3; ++j) {
      int64_t slot = int64_t(bt.tables[2 * size_t(max_blocks)]) * bs + j;
      double d = 0;
      for (int64_t e = 0; e < hd; ++e) d += double(q.ptr<float>()[(r * nh + h) * hd + e]) * kc.ptr<float>()[(slot * nkv + kvh) * hd + e];
      w[j] = d * 0.3;
      mx = std::max(mx, w[j]);
    }
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (int64_t e = 0; e < hd; ++e) {
      double o = 0;
      for (int j = 0; j < 3; ++j) {
        int64_t slot = int64_t(bt.tables[2 * size_t(max_blocks)]) * bs + j;
        o += w[j] / sum * vc.ptr<float>()[(slot * nkv + kvh) * hd + e];
      }
      EXPECT_NEAR(out.ptr<float>()[(r * nh + h) * hd + e], o, 1e-5);
    }
  }
}

TEST(BlockSparse, ZeroTokens) {
  std::mt19937 g(1);
  Batch bt({}, 4, 2, g);
  Tensor kc = Tensor::zeros({2, 4, 1, 8}, DType::f32), vc = Tensor::zeros({2, 4, 1, 8}, DType::f32);
  Tensor q = Tensor::empty({0, 2, 8}, DType::f32), out = Tensor::empty({0, 2, 8}, DType::f32);
  Tensor sel = Tensor::empty({0, 2, 4}, DType::i32);
  EXPECT_NO_THROW(ops::block_indexer(q, kc, bt.meta, ops::BlockIndexer{4, 4, 1}, sel));
  EXPECT_NO_THROW(ops::block_sparse_attention(q, kc, vc, bt.meta, 1.0f, sel, 4, out));
}

// Sliding-window paged attention (ops::paged_attention's window): the query at position p reads
// keys (p - window, p]. With q = 0 every key weighs the same, and with V[t] = t the output is
// the mean of the positions read, (lo + p) / 2: an off-by-one either way changes it. A window
// covering the whole context is full attention, bit for bit.
TEST(SlidingWindowAttention, ReadsTheLastWindowPositions) {
  std::mt19937 g(11);
  const int bs = 4, max_blocks = 12, nh = 4, nkv = 2, hd = 8;
  Batch bt({{0, 20}, {30, 1}, {5, 3}, {0, 1}}, bs, max_blocks, g);
  const int64_t nblocks = int64_t(bt.meta.num_seqs) * max_blocks;
  Tensor kc = random_tensor({nblocks, bs, nkv, hd}, g), vc = Tensor::empty({nblocks, bs, nkv, hd}, DType::f32);
  for (int b = 0; b < bt.meta.num_seqs; ++b)
    for (int t = 0; t < bt.kv_len[size_t(b)]; ++t) {
      const int64_t slot = int64_t(bt.tables[size_t(b * max_blocks + t / bs)]) * bs + t % bs;
      for (int i = 0; i < nkv * hd; ++i) vc.ptr<float>()[slot * nkv * hd + i] = float(t);
    }
  Tensor q0 = Tensor::zeros({bt.tokens, nh, hd}, DType::f32);
  for (int window : {1, 4, 7, 100}) {
    Tensor out = Tensor::empty({bt.tokens, nh, hd}, DType::f32);
    ops::paged_attention(q0, kc, vc, bt.meta, 0.5f, out, {}, window);
    for (int64_t r = 0; r < bt.tokens; ++r) {
      const int p = bt.posv[size_t(r)], lo = std::max(0, p - window + 1);
      for (int i = 0; i < nh * hd; ++i)
        ASSERT_NEAR(out.ptr<float>()[r * nh * hd + i], 0.5f * float(lo + p), 1e-4f) << "row " << r << " window " << window;
    }
  }
  Tensor q = random_tensor({bt.tokens, nh, hd}, g);
  Tensor full = Tensor::empty({bt.tokens, nh, hd}, DType::f32), wide = Tensor::empty({bt.tokens, nh, hd}, DType::f32);
  ops::paged_attention(q, kc, vc, bt.meta, 0.5f, full);
  ops::paged_attention(q, kc, vc, bt.meta, 0.5f, wide, {}, 31);  // the longest context is 31
  EXPECT_EQ(std::memcmp(full.data, wide.data, size_t(full.numel()) * 4), 0);
  Tensor narrow = Tensor::empty({bt.tokens, nh, hd}, DType::f32);
  ops::paged_attention(q, kc, vc, bt.meta, 0.5f, narrow, {}, 30);
  EXPECT_NE(std::memcmp(full.data, narrow.data, size_t(full.numel()) * 4), 0);  // row at 30 loses key 0
}
