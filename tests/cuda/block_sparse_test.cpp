// CUDA MiniMax-M3 block-sparse ops vs the CPU reference: the lightning indexer's picked blocks
// per index head (exact ids; decode, prefill, chunked prefill, padding rows, local blocks, top_k
// larger than the block count) and attention restricted to picked blocks (indexer picks and
// random picks with -1 holes; one selection per KV group or one for all heads; GQA; strided q
// and out).
#include "paged_meta.h"

using namespace ts;
using namespace ts::test;

namespace {

void check_indexer(const std::vector<SeqLens>& seqs, int64_t heads, int64_t D, ops::BlockIndexer p, int bs,
                   int pad_rows = 0) {
  PagedMeta m = make_paged(seqs, bs, pad_rows);
  const int64_t T = m.rows;
  Pair kc = Pair::rand({m.num_blocks, bs, 1, D});
  Pair qb = Pair::rand({T, heads * D + 8});
  Tensor qh = heads_view(qb.h, 8, heads, D), qd = heads_view(qb.d, 8, heads, D);
  Tensor oh = Tensor::empty({T, heads, int64_t(p.top_k)}, DType::i32);
  Tensor od = Tensor::empty({T, heads, int64_t(p.top_k)}, DType::i32, Device::cuda);
  ops::cpu::block_indexer(qh, kc.h, m.h, p, oh);
  ops::cuda::block_indexer(qd, kc.d, m.d, p, od);
  ::ts::cuda::synchronize();
  Tensor og = od.to(Device::cpu);
  int64_t bad = 0;
  for (int64_t i = 0; i < oh.numel(); ++i) bad += og.ptr<int32_t>()[i] != oh.ptr<int32_t>()[i];
  const std::string desc = fmt::format("indexer B={} maxq={} maxkv={} heads={} D={} ibs={} top_k={} local={} bs={} pad={}",
                                       seqs.size(), m.h.max_q_len, m.h.max_kv_len, heads, D, p.block_size, p.top_k,
                                       p.local_blocks, bs, pad_rows);
  std::printf("  [%s] mismatches %lld\n", desc.c_str(), (long long)bad);
  EXPECT_EQ(bad, 0) << desc;
}

ops::BlockIndexer idx(int ibs, int top_k, int local) {
  ops::BlockIndexer p;
  p.block_size = ibs;
  p.top_k = top_k;
  p.local_blocks = local;
  return p;
}

TEST(CudaBlockSparse, Indexer) {
  TS_REQUIRE_CUDA();
  for (int bs : {16, 64}) {
    // Fixture shape: 2 index heads x 16, index blocks of 16, top 4, 1 local block.
    check_indexer({{1, 1}, {1, 17}, {1, 300}, {1, 1000}}, 2, 16, idx(16, 4, 1), bs);
    check_indexer({{40, 40}, {7, 100}, {1, 64}}, 2, 16, idx(16, 4, 1), bs, 2);
    check_indexer({{1, 500}, {33, 260}}, 4, 64, idx(32, 6, 2), bs);
    check_indexer({{20, 20}}, 2, 16, idx(16, 8, 1), bs);          // top_k above the block count
    check_indexer({{1, 2000}, {3, 130}}, 2, 24, idx(128, 3, 0), bs);  // no local blocks; D % 8 == 0, not 16
    check_indexer({{5, 90}}, 3, 13, idx(16, 4, 3), bs);           // D = 13: scalar loads
  }
}

// Rows' positions (host) for building random selections.
std::vector<int> row_positions(const std::vector<SeqLens>& seqs, int pad_rows) {
  std::vector<int> pos;
  for (auto& s : seqs)
    for (int i = 0; i < s.q_len; ++i) pos.push_back(s.kv_len - s.q_len + i);
  for (int i = 0; i < pad_rows; ++i) pos.push_back(-1);
  return pos;
}

// mode 0: blocks from the CPU indexer; 1: random ascending picks with -1 holes. S selection
// heads (a divisor of the attention heads).
void check_sparse(const std::vector<SeqLens>& seqs, int64_t nkv, int64_t G, int64_t hd, int sbs, int n_sel, int bs,
                  int mode, int pad_rows = 0, int64_t S = 0) {
  PagedMeta m = make_paged(seqs, bs, pad_rows);
  const int64_t T = m.rows, nh = nkv * G;
  Pair kc = Pair::rand({m.num_blocks, bs, nkv, hd}), vc = Pair::rand({m.num_blocks, bs, nkv, hd});
  Pair qb = Pair::rand({T, nh * hd + 8}, 2.0f);
  Tensor qh = heads_view(qb.h, 8, nh, hd), qd = heads_view(qb.d, 8, nh, hd);
  if (S == 0) S = nkv;
  Tensor sel = Tensor::empty({T, S, int64_t(n_sel)}, DType::i32);
  if (mode == 0) {
    Pair ik = Pair::rand({m.num_blocks, bs, 1, 16}), iq = Pair::rand({T, S, 16});
    ops::cpu::block_indexer(iq.h, ik.h, m.h, idx(sbs, n_sel, 1), sel);
  } else {
    std::vector<int> pos = row_positions(seqs, pad_rows);
    for (int64_t rs = 0; rs < T * S; ++rs) {
      const int64_t r = rs / S;
      int32_t* o = sel.ptr<int32_t>() + rs * n_sel;
      for (int i = 0; i < n_sel; ++i) o[i] = -1;
      if (pos[size_t(r)] < 0) continue;
      std::vector<int32_t> all;
      for (int b = 0; b <= pos[size_t(r)] / sbs; ++b) all.push_back(b);
      std::shuffle(all.begin(), all.end(), rng());
      all.resize(std::min<size_t>(all.size(), size_t(n_sel)));
      std::sort(all.begin(), all.end());
      for (size_t i = 0; i < all.size(); ++i) o[i] = (i % 3 == 1) ? -1 : all[i];  // holes
    }
  }
  Pair ob = Pair::rand({T, nh * hd + 16});
  Tensor oh = heads_view(ob.h, 8, nh, hd), od = heads_view(ob.d, 8, nh, hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  ops::cpu::block_sparse_attention(qh, kc.h, vc.h, m.h, scale, sel, sbs, oh);
  ops::cuda::block_sparse_attention(qd, kc.d, vc.d, m.d, scale, to_dev(sel), sbs, od);
  EXPECT_CLOSE(ob.back(), ob.h,
               fmt::format("sparse B={} maxq={} maxkv={} nkv={} G={} hd={} sbs={} n_sel={} S={} bs={} mode={} pad={}",
                           seqs.size(), m.h.max_q_len, m.h.max_kv_len, nkv, G, hd, sbs, n_sel, S, bs, mode, pad_rows));
}

TEST(CudaBlockSparse, Attention) {
  TS_REQUIRE_CUDA();
  for (int mode : {0, 1})
    for (int bs : {16, 64}) {
      // Fixture shape: 4 heads over 2 kv heads of 16, selection blocks of 16, 4 picked.
      check_sparse({{1, 1}, {1, 17}, {1, 300}, {1, 1000}}, 2, 2, 16, 16, 4, bs, mode);
      check_sparse({{40, 40}, {7, 100}, {1, 64}}, 2, 2, 16, 16, 4, bs, mode, 2);
      check_sparse({{1, 2000}, {9, 700}}, 2, 4, 128, 128, 6, bs, mode);
      check_sparse({{3, 50}}, 1, 3, 24, 16, 8, bs, mode);  // hd 24: vector loads
      check_sparse({{3, 50}}, 1, 3, 20, 16, 8, bs, mode);  // hd 20: scalar loads
      check_sparse({{1, 300}, {5, 90}}, 2, 2, 16, 16, 4, bs, mode, 0, 1);  // one selection for all heads
      check_sparse({{1, 300}, {5, 90}}, 2, 2, 16, 16, 4, bs, mode, 0, 4);  // one per attention head
    }
}

TEST(CudaBlockSparse, ZeroTokens) {
  TS_REQUIRE_CUDA();
  ops::AttnMeta m;
  m.cu_q = to_dev(i32_host({0}));
  m.kv_len = Tensor::empty({0}, DType::i32, Device::cuda);
  m.block_tables = Tensor::empty({0, 1}, DType::i32, Device::cuda);
  m.block_size = 16;
  Tensor q = Tensor::empty({0, 2, 16}, DType::bf16, Device::cuda);
  Tensor kc = Tensor::empty({2, 16, 1, 16}, DType::bf16, Device::cuda);
  Tensor out = Tensor::empty({0, 2, 4}, DType::i32, Device::cuda);
  ops::cuda::block_indexer(q, kc, m, idx(16, 4, 1), out);
  Tensor sel = Tensor::empty({0, 2, 4}, DType::i32, Device::cuda);
  Tensor o = Tensor::empty({0, 2, 16}, DType::bf16, Device::cuda);
  ops::cuda::block_sparse_attention(q, kc, kc, m, 0.25f, sel, 16, o);
  ::ts::cuda::synchronize();
}

}  // namespace
