// CUDA paged attention vs the CPU reference, every kernel (path 1: generic split-KV, 2: v1
// tensor-core, 3: v2 split-KV flash-decoding, 4/5/6: v2 FA2-style prefill; 0: the dispatcher):
// decode and speculative verify (q_len 1..8 mixed), prefill, chunked prefill (cached prefix),
// mixed batches, padding rows, GQA 1/4/8, head dims 16/64/96/128/192/256 (hd_v may differ),
// block sizes 16/64, strided q and out, forced and empty KV splits (max_kv_len bound far above
// the real lengths, as under CUDA-graph replay). FP8 (e4m3) caches with per-tensor scales: the
// same cache bytes on both sides, every path.
#include "core/fp8.h"
#include "cuda_test_util.h"
#include "ops/cuda/split_kv.h"

using namespace ts;
using namespace ts::test;

namespace {

struct Seq {
  int q_len, kv_len;
};

// An e4m3 cache (random values, stored as e4m3(x / scale)): the same bytes on the host and the
// device.
Pair fp8_cache(std::vector<int64_t> shape, float scale) {
  Tensor f = rand_host(shape, 2.0f);
  Pair p;
  p.h = Tensor::empty(shape, DType::f8_e4m3);
  for (int64_t i = 0; i < f.numel(); ++i) p.h.ptr<uint8_t>()[i] = f32_to_e4m3(f.ptr<float>()[i] / scale);
  p.d = to_dev(p.h);
  return p;
}

void check_attention(const std::vector<Seq>& seqs, int64_t nkv, int64_t G, int64_t hd, int bs,
                     int path, int splits = 0, int pad_rows = 0, int64_t hd_v = 0,
                     int max_kv_bound = 0, int split_target = 0, int split_min = 0,
                     const ops::KvScales* fp8 = nullptr, int window = 0) {
  if (hd_v == 0) hd_v = hd;
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
  mh.max_kv_len = std::max(max_kv, max_kv_bound);
  // The dispatcher's own choice (path 0) gets the lead decodes marked as the batch builder marks
  // them, so mixed batches take the two-launch split (decodes, then chunks).
  if (path == 0) ops::set_decode_lead(mh, cu.data());
  md = mh;
  md.cu_q = to_dev(mh.cu_q);
  md.kv_len = to_dev(mh.kv_len);
  md.block_tables = to_dev(bt);

  const ops::KvScales kvs = fp8 ? *fp8 : ops::KvScales{};
  Pair kc = fp8 ? fp8_cache({num_blocks, bs, nkv, hd}, kvs.k) : Pair::rand({num_blocks, bs, nkv, hd});
  Pair vc = fp8 ? fp8_cache({num_blocks, bs, nkv, hd_v}, kvs.v) : Pair::rand({num_blocks, bs, nkv, hd_v});
  const int64_t W = (nh + 2 * nkv) * hd;
  Pair qkv = Pair::rand({T, W}, 2.0f);
  Tensor qh = heads_view(qkv.h, 0, nh, hd), qd = heads_view(qkv.d, 0, nh, hd);
  Pair obuf = Pair::rand({T, nh * hd_v + 16});
  Tensor oh = heads_view(obuf.h, 8, nh, hd_v), od = heads_view(obuf.d, 8, nh, hd_v);
  const float scale = 1.0f / std::sqrt(float(hd));
  ops::cpu::paged_attention(qh, kc.h, vc.h, mh, scale, oh, kvs, window);
  ops::cuda::paged_attention(qd, kc.d, vc.d, md, scale, od, ops::KernelPolicy{.attn_path = path, .attn_splits = splits},
                             ops::cuda::SplitKvOptions{split_target, split_min}, kvs, window);
  std::string desc = fmt::format("attn B={} q0={} kv0={} maxq={} maxkv={} bound={} nkv={} G={} hd={} hd_v={} bs={} path={} splits={} pad={} target={} min={} fp8={} ({}, {}) window={}",
                                 B, seqs[0].q_len, seqs[0].kv_len, max_q, max_kv, mh.max_kv_len, nkv, G, hd,
                                 hd_v, bs, path, splits, pad_rows, split_target, split_min, fp8 != nullptr, kvs.k, kvs.v,
                                 window);
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

// Sliding-window layers (window 1, shorter / longer than a 64-token tile, longer than the
// context): every path -- the dispatcher (decodes, long-prefix chunks, mixed batches), the
// generic kernel (head dims 16 / 96, forced splits), v2 split-KV with forced and empty splits and
// a graph bound, batch-invariant splits, the prefill variants, FP8 caches.
TEST(CudaAttention, SlidingWindow) {
  TS_REQUIRE_CUDA();
  const ops::KvScales f8{0.5f, 1.5f};
  for (int window : {1, 33, 64, 300, 5000}) {
    for (int64_t hd : {64, 128}) {
      check_attention({{1, 1000}, {1, 40}, {3, 700}, {8, 129}}, 2, 4, hd, 16, 0, 0, 1, 0, 0, 0, 0, nullptr, window);
      check_attention({{1, 900}, {2, 300}, {100, 600}, {50, 50}}, 2, 4, hd, 16, 0, 0, 2, 0, 0, 0, 0, nullptr, window);
      check_attention({{1, 2000}, {5, 333}}, 2, 8, hd, 64, 3, 7, 0, 0, 4096, 0, 0, nullptr, window);
      check_attention({{1, 2000}, {1, 70}}, 1, 4, hd, 16, 3, 0, 0, 0, 0, 8, 2, nullptr, window);
      for (int path : {4, 5, 6}) {
        check_attention({{300, 300}, {77, 500}, {1, 1}}, 2, 4, hd, 16, path, 0, 3, 0, 0, 0, 0, nullptr, window);
        check_attention({{200, 900}}, 2, 2, hd, 16, path, 0, 0, 0, 0, 0, 0, &f8, window);
      }
      check_attention({{1, 1500}, {4, 90}}, 2, 4, hd, 16, 3, 0, 0, 0, 0, 0, 0, &f8, window);
    }
    for (int64_t hd : {16, 96}) {
      check_attention({{1, 700}, {6, 200}, {90, 90}}, 2, 4, hd, 16, 0, 0, 1, 0, 0, 0, 0, nullptr, window);
      check_attention({{1, 700}, {1, 30}}, 2, 4, hd, 16, 1, 5, 0, 0, 0, 0, 0, nullptr, window);
    }
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

// Mixed batches as the scheduler builds them (decodes and verify rows first, then prefill
// chunks over cached prefixes, padding rows last): path 0 runs the leading decodes through the
// split-KV decode kernel and the chunks through the prefill kernel. Also batches where nothing
// leads (a chunk first) or every row is short, which stay one launch.
TEST(CudaAttention, MixedBatchSplitsLeadingDecodes) {
  TS_REQUIRE_CUDA();
  std::vector<Seq> mixed;
  for (int i = 0; i < 24; ++i) mixed.push_back({1, 300 + 37 * i});
  mixed.push_back({4, 700});  // a verify row among the decodes
  mixed.push_back({128, 128});
  mixed.push_back({512, 2048});
  mixed.push_back({9, 40});
  for (int64_t hd : {64, 128})
    for (int bs : {16, 64}) {
      check_attention(mixed, 8, 4, hd, bs, 0, 0, 5);
      check_attention(mixed, 2, 1, hd, bs, 0);
      check_attention({{1, 1}, {200, 200}}, 1, 8, hd, bs, 0, 0, 2);            // one decode, one chunk
      check_attention({{64, 64}, {1, 500}, {1, 33}}, 2, 4, hd, bs, 0);          // a chunk first: no split
      check_attention({{1, 900}, {1, 33}, {3, 77}}, 2, 4, hd, bs, 0, 0, 0, 0, 4096);  // all short: decode kernel
      check_attention({{1, 900}, {2, 1000}, {16, 9000}}, 2, 4, hd, bs, 0);      // short chunk, long prefix
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

// ---- v2 kernels -------------------------------------------------------------------------------

// Decode and speculative verify: q_len 1..8 mixed within a batch, kv lengths around tile and
// block edges, auto and forced split counts, auto dispatch and the forced split-KV kernel.
TEST(CudaAttention, DecodeSplitKV) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {64, 128})
    for (int bs : {16, 64})
      for (int64_t G : {1, 4, 8})
        for (int kv : {1, 15, 16, 17, 63, 64, 65, 1000})
          for (int path : {0, 3}) {
            const int kv2 = std::max(1, kv / 2);
            check_attention({{1, kv}, {std::min(8, kv), kv}, {std::min(3, kv2), kv2}, {std::min(5, kv + 3), kv + 3}},
                            2, G, hd, bs, path);
          }
}

TEST(CudaAttention, DecodeSplitKVForcedSplits) {
  TS_REQUIRE_CUDA();
  for (int splits : {1, 2, 3, 7, 64})
    for (int64_t hd : {64, 128})
      for (int64_t G : {1, 8})
        check_attention({{1, 500}, {1, 1}, {4, 129}, {8, 64}, {2, 2}}, 2, G, hd, 16, 3, splits, 2);
}

TEST(CudaAttention, DecodeSplitKVLong) {
  TS_REQUIRE_CUDA();
  check_attention({{1, 32768}}, 1, 8, 128, 64, 0);
  check_attention({{1, 32768}, {5, 32768}, {8, 1000}}, 1, 8, 128, 64, 0);
  check_attention({{1, 32768}, {1, 5000}}, 2, 4, 64, 16, 0);
  check_attention({{4, 32768}}, 8, 1, 128, 64, 3);
  check_attention({{1, 32768}}, 2, 8, 64, 64, 3, 512);
}

// Many query rows per kv head (G * q_len > 64): several row chunks per (sequence, kv head).
TEST(CudaAttention, DecodeSplitKVRowChunks) {
  TS_REQUIRE_CUDA();
  for (int path : {0, 3}) {
    check_attention({{8, 300}, {7, 40}, {1, 9}}, 1, 16, 128, 16, path);
    check_attention({{6, 200}, {8, 8}}, 2, 12, 64, 64, path, 0, 1);
  }
}

// Graph-replay shape: the split grid comes from a max_kv_len bound far above the real lengths,
// so most splits of every sequence are empty; padding rows at the end.
TEST(CudaAttention, DecodeSplitKVEmptySplits) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {64, 128})
    for (int path : {0, 3})
      for (int splits : {0, 5}) {
        check_attention({{1, 1}, {1, 15}, {4, 17}, {1, 1000}, {8, 65}}, 2, 4, hd, 16, path, splits, 3,
                        0, 32768);
        check_attention({{1, 64}, {2, 2}}, 1, 8, hd, 64, path, splits, 0, 0, 100000);
      }
}

// Head dims without a v2 fast path go to the generic kernel (also hd_v != hd, MLA-like).
TEST(CudaAttention, GenericHeadDims) {
  TS_REQUIRE_CUDA();
  struct HD { int64_t k, v; };
  for (HD d : {HD{16, 16}, HD{96, 96}, HD{192, 128}, HD{256, 256}, HD{128, 64}})
    for (int path : {0, 3, 4}) {
      check_attention({{1, 300}, {4, 77}, {1, 1}}, 2, 4, d.k, 16, path, 0, 2, d.v, 4096);
      check_attention({{37, 200}, {1, 65}}, 1, 8, d.k, 16, path, 0, 0, d.v);
    }
}

TEST(CudaAttention, PrefillV2) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {64, 128})
    for (int64_t G : {1, 4, 8})
      for (int path : {4, 5, 6})
        for (int q : {1, 17, 100, 300}) check_attention({{q, q}, {q / 2 + 1, q / 2 + 1}}, 2, G, hd, 16, path);
  // The dispatcher's wide-block pick (max_q_len * G >= 512).
  for (int64_t hd : {64, 128}) check_attention({{600, 600}, {1, 1}, {130, 1000}}, 2, 4, hd, 64, 0);
}

TEST(CudaAttention, ChunkedPrefillAndMixedV2) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {64, 128})
    for (int bs : {16, 64})
      for (int path : {4, 5, 6}) {
        check_attention({{37, 200}, {64, 64}, {1, 77}, {5, 1000}}, 2, 4, hd, bs, path);
        check_attention({{1, 65}, {128, 300}, {1, 1}, {3, 3}}, 1, 8, hd, bs, path, 0, 3);
        check_attention({{200, 2100}, {129, 129}}, 2, 1, hd, bs, path, 0, 1);
      }
}

TEST(CudaAttention, ZeroTokensAllPaths) {
  TS_REQUIRE_CUDA();
  ops::AttnMeta m;
  m.cu_q = to_dev(i32_host({0}));
  m.kv_len = Tensor::empty({0}, DType::i32, Device::cuda);
  m.block_tables = Tensor::empty({0, 1}, DType::i32, Device::cuda);
  m.block_size = 16;
  Tensor q = Tensor::empty({0, 4, 128}, DType::bf16, Device::cuda);
  Tensor out = Tensor::empty({0, 4, 128}, DType::bf16, Device::cuda);
  Tensor kc = Tensor::empty({2, 16, 2, 128}, DType::bf16, Device::cuda);
  for (int path = 0; path <= 6; ++path) {
    ops::cuda::paged_attention(q, kc, kc, m, 0.125f, out, ops::KernelPolicy{.attn_path = path});
  }
  ::ts::cuda::synchronize();
}

// Only padding rows (no sequences' rows, B > 0): every path zeroes them.
TEST(CudaAttention, OnlyPaddingRows) {
  TS_REQUIRE_CUDA();
  for (int path : {0, 3, 4, 5})
    check_attention({{0, 5}, {0, 70}}, 2, 4, 128, 16, path, 0, 4);
}

// Batch-invariant split-KV decode (ops::cuda::SplitKvOptions): each sequence's KV cut by its
// own length, vs the CPU oracle at contexts 1, 17, 1k, 8k and 32k, GQA, paged (shuffled blocks),
// decode and verify rows, a graph-style max_kv_len bound far above the real lengths.
TEST(CudaAttention, DecodeSplitKVBatchInvariant) {
  TS_REQUIRE_CUDA();
  for (auto [target, min_tiles] : {std::pair<int, int>{32, 4}, {64, 2}, {8, 1}})
    for (int ctx : {1, 17, 1024, 8192, 32768}) {
      const int64_t nkv = ctx >= 8192 ? 2 : 8;  // the CPU oracle's time at 32k
      check_attention({{1, ctx}}, nkv, 4, 128, 64, 3, 0, 0, 0, 0, target, min_tiles);
      // (a 4-token query needs at least 4 tokens of KV: kv_len counts the query's own tokens)
      check_attention({{1, ctx}, {1, std::max(1, ctx / 3)}, {4, std::max(4, ctx)}}, nkv, 4, 128, 16, 3, 0, 2, 0, 0,
                      target, min_tiles);
      if (ctx <= 1024) check_attention({{1, ctx}, {1, 5}}, 8, 4, 64, 64, 3, 0, 0, 0, 4 * ctx + 100, target, min_tiles);
    }
}

// The same sequence gives bit-identical rows alone and inside batches of other lengths (and under
// a larger max_kv_len bound, as in a CUDA graph bucket) in the batch-invariant mode.
TEST(CudaAttention, DecodeSplitKVInvariantAcrossBatches) {
  TS_REQUIRE_CUDA();
  const int64_t nkv = 8, G = 4, hd = 128, nh = nkv * G;
  const int bs = 64, ctx = 5000;
  const std::vector<int> others{100, 20000, 1, 7000};
  const int max_kv = 20000;
  const int64_t nb_max = (max_kv + bs - 1) / bs, num_blocks = 5 * nb_max;
  Tensor kc = to_dev_bf16(rand_host({num_blocks, bs, nkv, hd})), vc = to_dev_bf16(rand_host({num_blocks, bs, nkv, hd}));
  Tensor q1 = rand_host({1, nh, hd}, 2.0f);
  // Sequence s of a batch uses blocks [s * nb_max, ...): the test sequence always its own blocks.
  auto run = [&](const std::vector<int>& lens, int at, int bound) {
    const int64_t B = int64_t(lens.size());
    std::vector<int32_t> cu{0}, kvl;
    Tensor bt = Tensor::empty({B, nb_max}, DType::i32);
    for (int64_t b = 0; b < B; ++b) {
      cu.push_back(cu.back() + 1);
      kvl.push_back(lens[size_t(b)]);
      const int64_t base = (b == at ? 0 : 1 + b) * nb_max;
      for (int64_t j = 0; j < nb_max; ++j) bt.ptr<int32_t>()[b * nb_max + j] = int32_t(base % num_blocks + j);
    }
    Tensor qh = rand_host({B, nh, hd}, 2.0f);
    std::copy(q1.ptr<float>(), q1.ptr<float>() + nh * hd, qh.ptr<float>() + int64_t(at) * nh * hd);
    ops::AttnMeta md;
    md.cu_q = to_dev(i32_host(cu));
    md.kv_len = to_dev(i32_host(kvl));
    md.block_tables = to_dev(bt);
    md.block_size = bs;
    md.num_seqs = int(B);
    md.max_q_len = 1;
    md.max_kv_len = bound;
    Tensor qd = to_dev_bf16(qh), od = Tensor::empty({B, nh, hd}, DType::bf16, Device::cuda);
    ops::cuda::paged_attention(qd, kc, vc, md, 1.0f / std::sqrt(float(hd)), od,
                               ops::KernelPolicy{}, ops::cuda::SplitKvOptions{32, 4});
    Tensor h = to_host_f32(od);
    return std::vector<float>(h.ptr<float>() + int64_t(at) * nh * hd, h.ptr<float>() + int64_t(at + 1) * nh * hd);
  };
  const std::vector<float> alone = run({ctx}, 0, ctx);
  EXPECT_EQ(run({ctx}, 0, max_kv), alone) << "alone, larger bound";
  EXPECT_EQ(run({others[0], others[1], ctx}, 2, max_kv), alone) << "3 sequences";
  EXPECT_EQ(run({ctx, others[2], others[3], others[1], others[0]}, 0, max_kv), alone) << "5 sequences";
}

// FP8 (e4m3) caches with per-tensor scales (as a checkpoint's k_scale / v_scale): every kernel
// against the CPU oracle reading the same bytes — decode (one and forced splits, batch-invariant
// splits), verify rows, prefill (64- and 128-row blocks), chunked prefill over a cached prefix,
// mixed batches (the two-launch split), the generic kernel's head dims, and the forced v1
// tensor-core path (which falls back to the generic kernel for FP8).
TEST(CudaAttention, Fp8Cache) {
  TS_REQUIRE_CUDA();
  const ops::KvScales one{}, scaled{0.37f, 2.5f};
  for (const ops::KvScales* s : {&one, &scaled})
    for (int64_t hd : {64, 128})
      for (int path : {0, 1, 2, 3}) {
        check_attention({{1, 1}, {1, 65}, {1, 1000}, {4, 300}}, 2, 4, hd, 16, path, 0, 2, 0, 0, 0, 0, s);
        check_attention({{1, 5000}, {1, 129}}, 2, 8, hd, 64, path, 0, 0, 0, 0, 0, 0, s);
      }
  for (const ops::KvScales* s : {&one, &scaled}) {
    for (int64_t hd : {64, 128})
      for (int path : {0, 1, 4, 5, 6}) {
        check_attention({{300, 300}, {17, 17}}, 2, 4, hd, 16, path, 0, 0, 0, 0, 0, 0, s);
        check_attention({{37, 200}, {64, 64}, {1, 77}, {5, 1000}}, 2, 4, hd, 64, path, 0, 3, 0, 0, 0, 0, s);
      }
    std::vector<Seq> mixed;
    for (int i = 0; i < 12; ++i) mixed.push_back({1, 300 + 37 * i});
    mixed.push_back({128, 128});
    mixed.push_back({512, 2048});
    for (int64_t hd : {64, 128}) check_attention(mixed, 8, 4, hd, 16, 0, 0, 5, 0, 0, 0, 0, s);
    // Forced splits and batch-invariant splits over a bound far above the real lengths.
    check_attention({{1, 500}, {1, 1}, {1, 129}}, 2, 4, 128, 16, 3, 7, 0, 0, 0, 0, 0, s);
    check_attention({{1, 3000}, {1, 70}}, 2, 4, 128, 16, 3, 0, 0, 0, 8192, 16, 1, s);
    // Head dims only the generic kernel takes (hd_v differing too).
    for (int64_t hd : {16, 96}) {
      check_attention({{1, 700}, {1, 3}}, 2, 4, hd, 16, 0, 0, 0, 0, 0, 0, 0, s);
      check_attention({{40, 90}}, 1, 2, hd, 16, 0, 0, 1, hd + 32, 0, 0, 0, s);
    }
  }
}
