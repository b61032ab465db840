// CUDA MLA attention (absorbed, over the paged latent cache) vs the CPU reference: decode with
// kv lengths 1..4096 (split-KV), prefill, chunked prefill, mixed batches with padding rows,
// fixture dims (kv_lora 32, rope 8, 4 heads) and DeepSeek dims (512 + 64, 16/128 heads), block
// sizes 16/64, shuffled block tables, strided q and out.
#include "paged_meta.h"

using namespace ts;
using namespace ts::test;

namespace {

// fp8_scale > 0: an FP8 (e4m3) latent cache holding e4m3(x / fp8_scale), the same bytes on both
// sides (--kv-cache-dtype fp8).
void check_mla(const std::vector<SeqLens>& seqs, int64_t nh, int64_t rank, int64_t rope, int bs, int pad_rows = 0,
               float fp8_scale = 0.0f) {
  PagedMeta m = make_paged(seqs, bs, pad_rows);
  const int64_t D = rank + rope, T = m.rows;
  Pair cache = Pair::rand({m.num_blocks, bs, 1, D});
  if (fp8_scale > 0) {
    Tensor h = Tensor::empty(cache.h.dims(), DType::f8_e4m3);
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<uint8_t>()[i] = f32_to_e4m3(cache.h.ptr<float>()[i] / fp8_scale);
    cache.h = h;
    cache.d = to_dev(h);
  }
  const float cs = fp8_scale > 0 ? fp8_scale : 1.0f;
  Pair qb = Pair::rand({T, nh * D + 8});
  Tensor qh = heads_view(qb.h, 8, nh, D), qd = heads_view(qb.d, 8, nh, D);
  Pair ob = Pair::rand({T, nh * rank + 16});
  Tensor oh = heads_view(ob.h, 8, nh, rank), od = heads_view(ob.d, 8, nh, rank);
  const float scale = 1.0f / std::sqrt(float(D) / 3.0f);  // softmax neither flat nor one-hot
  ops::cpu::mla_attention(qh, cache.h, m.h, scale, rank, oh, cs);
  ops::cuda::mla_attention(qd, cache.d, m.d, scale, rank, od, cs);
  EXPECT_CLOSE(ob.back(), ob.h,
               fmt::format("mla B={} q0={} kv0={} maxq={} maxkv={} nh={} rank={} rope={} bs={} pad={} fp8={}", seqs.size(),
                           seqs[0].q_len, seqs[0].kv_len, m.h.max_q_len, m.h.max_kv_len, nh, rank, rope, bs, pad_rows,
                           fp8_scale));
}

TEST(CudaMla, DecodeFixtureDims) {
  TS_REQUIRE_CUDA();
  for (int bs : {16, 64})
    for (int kv : {1, 63, 64, 65, 1000, 4096}) check_mla({{1, kv}, {1, std::max(1, kv / 2)}, {1, kv + 3}}, 4, 32, 8, bs);
}

TEST(CudaMla, DecodeDeepseekDims) {
  TS_REQUIRE_CUDA();
  for (int kv : {1, 63, 64, 65, 1000, 4096}) check_mla({{1, kv}, {1, kv / 3 + 1}}, 16, 512, 64, 64);
  check_mla({{1, 4096}}, 128, 512, 64, 64);
  check_mla({{1, 1000}, {1, 17}}, 128, 512, 64, 16);
}

TEST(CudaMla, Prefill) {
  TS_REQUIRE_CUDA();
  for (int q : {1, 17, 100, 300}) {
    check_mla({{q, q}, {q / 2 + 1, q / 2 + 1}}, 4, 32, 8, 16);
    check_mla({{q, q}}, 16, 512, 64, 64);
  }
}

TEST(CudaMla, ChunkedPrefillAndMixed) {
  TS_REQUIRE_CUDA();
  for (int bs : {16, 64}) {
    check_mla({{37, 200}, {64, 64}, {1, 77}, {5, 1000}}, 4, 32, 8, bs);
    check_mla({{1, 65}, {128, 300}, {1, 1}, {3, 3}}, 4, 32, 8, bs, 3);  // padding rows at the end
    check_mla({{2, 4096}, {1, 63}}, 8, 512, 64, bs, 2);                  // decode-like with 2-row queries
  }
  check_mla({{37, 200}, {1, 1000}}, 128, 512, 64, 64);
}

TEST(CudaMla, OddDims) {
  TS_REQUIRE_CUDA();
  check_mla({{1, 100}, {5, 40}}, 3, 20, 6, 16);  // D = 26: scalar tile loads
  check_mla({{1, 100}, {5, 40}}, 5, 36, 4, 16);  // D = 40, rank not a multiple of 32
}

// The FP8 latent cache (e4m3, scale 1 and 0.05): decode (split-KV), prefill, mixed, scalar tiles.
TEST(CudaMla, Fp8LatentCache) {
  TS_REQUIRE_CUDA();
  for (float s : {1.0f, 0.05f}) {
    check_mla({{1, 1000}, {1, 17}, {1, 4096}}, 16, 512, 64, 64, 0, s);
    check_mla({{100, 100}, {37, 200}}, 16, 512, 64, 16, 2, s);
    check_mla({{1, 65}, {128, 300}, {1, 1}}, 4, 32, 8, 16, 3, s);
    check_mla({{1, 100}, {5, 40}}, 3, 20, 6, 16, 0, s);  // D = 26: scalar loads
  }
}

TEST(CudaMla, ZeroTokens) {
  TS_REQUIRE_CUDA();
  ops::AttnMeta m;
  m.cu_q = to_dev(i32_host({0}));
  m.kv_len = Tensor::empty({0}, DType::i32, Device::cuda);
  m.block_tables = Tensor::empty({0, 1}, DType::i32, Device::cuda);
  m.block_size = 16;
  Tensor q = Tensor::empty({0, 4, 40}, DType::bf16, Device::cuda);
  Tensor out = Tensor::empty({0, 4, 32}, DType::bf16, Device::cuda);
  Tensor c = Tensor::empty({2, 16, 1, 40}, DType::bf16, Device::cuda);
  ops::cuda::mla_attention(q, c, m, 0.1f, 32, out);
  ::ts::cuda::synchronize();
}

}  // namespace
