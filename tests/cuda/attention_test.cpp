// CUDA paged attention (generic split-KV kernel and tensor-core kernel) vs the CPU reference:
// decode, prefill, chunked prefill (cached prefix), mixed batches, padding rows, GQA 1/4/8,
// head dims 16/64/128, block sizes 16/64, strided q and out.
#include "cuda_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {

struct Seq {
  int q_len, kv_len;
};

void check_attention(const std::vector<Seq>& seqs, int64_t nkv, int64_t G, int64_t hd, int bs,
                     int path, int splits = 0, int pad_rows = 0) {
  const int64_t nh = nkv * G, B = int64_t(seqs.size());
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
  const int64_t num_blocks = total_blocks + 3;
  // Block tables: a shuffled permutation of physical blocks, -1 past each sequence's end.
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng());
  Tensor bt = Tensor::empty({B, max_blocks}, DType::i32);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int nb = (seqs[size_t(b)].kv_len + bs - 1) / bs;
    for (int j = 0; j < max_blocks; ++j) bt.ptr<int32_t>()[b * max_blocks + j] = j < nb ? perm[next++] : -1;
  }
  const int64_t T = cu.back() + pad_rows;
  ops::AttnMeta mh, md;
  mh.cu_q = i32_host(cu);
  mh.kv_len = i32_host(kvl);
  mh.block_tables = bt;
  mh.block_size = bs;
  mh.num_seqs = int(B);
  mh.max_q_len = max_q;
  mh.max_kv_len = max_kv;
  md = mh;
  md.cu_q = to_dev(mh.cu_q);
  md.kv_len = to_dev(mh.kv_len);
  md.block_tables = to_dev(bt);

  Pair kc = Pair::rand({num_blocks, bs, nkv, hd}), vc = Pair::rand({num_blocks, bs, nkv, hd});
  const int64_t W = (nh + 2 * nkv) * hd;
  Pair qkv = Pair::rand({T, W}, 2.0f);
  Tensor qh = heads_view(qkv.h, 0, nh, hd), qd = heads_view(qkv.d, 0, nh, hd);
  Pair obuf = Pair::rand({T, nh * hd + 16});
  Tensor oh = heads_view(obuf.h, 8, nh, hd), od = heads_view(obuf.d, 8, nh, hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  ops::cpu::paged_attention(qh, kc.h, vc.h, mh, scale, oh);
  ops::cuda::set_attention_path(path, splits);
  ops::cuda::paged_attention(qd, kc.d, vc.d, md, scale, od);
  ops::cuda::set_attention_path(0, 0);
  std::string desc = fmt::format("attn B={} q0={} kv0={} maxq={} maxkv={} nkv={} G={} hd={} bs={} path={} splits={} pad={}",
                                 B, seqs[0].q_len, seqs[0].kv_len, max_q, max_kv, nkv, G, hd, bs,
                                 path, splits, pad_rows);
  EXPECT_CLOSE(obuf.back(), obuf.h, desc);
}

}  // namespace

TEST(CudaAttention, Decode) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {16, 64, 128})
    for (int bs : {16, 64})
      for (int64_t G : {1, 4, 8})
        for (int kv : {1, 63, 64, 65, 1000})
          for (int path : {0, 2}) {
            if (path == 2 && hd == 16) continue;
            check_attention({{1, kv}, {1, std::max(1, kv / 2)}, {1, kv + 3}}, 2, G, hd, bs, path);
          }
}

TEST(CudaAttention, DecodeForcedSplits) {
  TS_REQUIRE_CUDA();
  for (int splits : {1, 2, 3, 7})
    for (int64_t hd : {16, 128}) check_attention({{1, 500}, {1, 1}, {1, 129}}, 2, 4, hd, 16, 1, splits);
}

TEST(CudaAttention, DecodeLong) {
  TS_REQUIRE_CUDA();
  for (int path : {0, 2}) check_attention({{1, 32768}, {1, 5000}}, 2, 4, 128, 64, path);
  check_attention({{1, 32768}}, 8, 8, 64, 16, 0);
}

TEST(CudaAttention, Prefill) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {16, 64, 128})
    for (int64_t G : {1, 4, 8})
      for (int path : {0, 1})
        for (int q : {1, 17, 100, 300}) check_attention({{q, q}, {q / 2 + 1, q / 2 + 1}}, 2, G, hd, 16, path);
}

TEST(CudaAttention, ChunkedPrefillAndMixed) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {16, 64, 128})
    for (int bs : {16, 64})
      for (int path : {0, 1}) {
        // Prefix cached: queries start at kv_len - q_len.
        check_attention({{37, 200}, {64, 64}, {1, 77}, {5, 1000}}, 2, 4, hd, bs, path);
        // Mixed: decodes and a chunk, with padding rows at the end.
        check_attention({{1, 65}, {128, 300}, {1, 1}, {3, 3}}, 1, 8, hd, bs, path, 0, 3);
      }
}

TEST(CudaAttention, ZeroTokens) {
  TS_REQUIRE_CUDA();
  ops::AttnMeta m;
  m.cu_q = to_dev(i32_host({0}));
  m.kv_len = Tensor::empty({0}, DType::i32, Device::cuda);
  m.block_tables = Tensor::empty({0, 1}, DType::i32, Device::cuda);
  m.block_size = 16;
  Tensor q = Tensor::empty({0, 4, 64}, DType::bf16, Device::cuda);
  Tensor out = Tensor::empty({0, 4, 64}, DType::bf16, Device::cuda);
  Tensor kc = Tensor::empty({2, 16, 2, 64}, DType::bf16, Device::cuda);
  ops::cuda::paged_attention(q, kc, kc, m, 0.125f, out);
  ::ts::cuda::synchronize();
}
