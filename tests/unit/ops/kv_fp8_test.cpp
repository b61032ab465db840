// FP8 (e4m3) KV cache on the CPU backend, the reference for GPU kernels: kv_write stores
// round-to-nearest e4m3, paged attention over it equals attention over an f32 cache holding the
// same rounded values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/fp8.h"
#include "ops/ops.h"

using namespace ts;

namespace {

Tensor i32v(const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

// One sequence prefilling T tokens through a (scrambled) block table of block size bs: its
// attention metadata, and each token's cache slot (as ids and as the kernels' [T] tensor).
struct OneSeq {
  ops::AttnMeta meta;
  std::vector<int32_t> slots;
  Tensor slot_t;
  OneSeq(int64_t T, int64_t bs, const std::vector<int32_t>& table) {
    for (int p = 0; p < T; ++p) slots.push_back(table[size_t(p / bs)] * int32_t(bs) + p % int32_t(bs));
    meta.cu_q = i32v({0, int32_t(T)}, {2});
    meta.kv_len = i32v({int32_t(T)}, {1});
    meta.block_tables = i32v(table, {1, int64_t(table.size())});
    meta.block_size = int(bs);
    meta.num_seqs = 1;
    meta.max_q_len = meta.max_kv_len = int(T);
    slot_t = i32v(slots, {T});
  }
};

}  // namespace

TEST(KvCacheFp8, WriteRoundsAndAttentionMatchesF32OfTheRoundedValues) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  const int64_t T = 11, nkv = 2, nh = 4, hd = 8, bs = 4, blocks = 4;
  // One sequence prefilling 11 tokens; block table scrambled.
  const OneSeq seq(T, bs, {2, 0, 3, 1});
  const ops::AttnMeta& m = seq.meta;
  const std::vector<int32_t>& slots = seq.slots;
  const Tensor& slot_t = seq.slot_t;
  auto rnd = [&](std::vector<int64_t> s) {
    Tensor t = Tensor::empty(s, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = nd(g);
    return t;
  };
  Tensor q = rnd({T, nh, hd}), k = rnd({T, nkv, hd}), v = rnd({T, nkv, hd});
  Tensor kr = Tensor::empty({T, nkv, hd}, DType::f32), vr = Tensor::empty({T, nkv, hd}, DType::f32);
  for (int64_t i = 0; i < k.numel(); ++i) {
    kr.ptr<float>()[i] = e4m3_to_f32(f32_to_e4m3(k.ptr<float>()[i]));
    vr.ptr<float>()[i] = e4m3_to_f32(f32_to_e4m3(v.ptr<float>()[i]));
  }
  Tensor kc8 = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3), vc8 = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3);
  Tensor kc = Tensor::zeros({blocks, bs, nkv, hd}, DType::f32), vc = Tensor::zeros({blocks, bs, nkv, hd}, DType::f32);
  ops::kv_write(k, v, kc8, vc8, slot_t);
  ops::kv_write(kr, vr, kc, vc, slot_t);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < nkv * hd; ++i) {
      ASSERT_EQ(kc8.ptr<uint8_t>()[slots[size_t(t)] * nkv * hd + i], f32_to_e4m3(k.ptr<float>()[t * nkv * hd + i]));
      ASSERT_EQ(vc8.ptr<uint8_t>()[slots[size_t(t)] * nkv * hd + i], f32_to_e4m3(v.ptr<float>()[t * nkv * hd + i]));
    }
  Tensor o8 = Tensor::empty({T, nh, hd}, DType::f32), o = Tensor::empty({T, nh, hd}, DType::f32);
  ops::paged_attention(q, kc8, vc8, m, 0.35f, o8);
  ops::paged_attention(q, kc, vc, m, 0.35f, o);
  for (int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o8.ptr<float>()[i], o.ptr<float>()[i]) << i;
}

// Per-tensor scales (a checkpoint's k_scale / v_scale): the cache holds e4m3(x / scale) and
// attention reads stored x scale, i.e. attention over an f32 cache of those values.
TEST(KvCacheFp8, ScalesDivideOnWriteAndMultiplyOnRead) {
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const ops::KvScales s{0.3f, 2.5f};
  const int64_t T = 9, nkv = 1, nh = 2, hd = 16, bs = 4, blocks = 3;
  const OneSeq seq(T, bs, {1, 2, 0});
  const ops::AttnMeta& m = seq.meta;
  const std::vector<int32_t>& slots = seq.slots;
  const Tensor& slot_t = seq.slot_t;
  auto rnd = [&](std::vector<int64_t> sh) {
    Tensor t = Tensor::empty(sh, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = nd(g);
    return t;
  };
  Tensor q = rnd({T, nh, hd}), k = rnd({T, nkv, hd}), v = rnd({T, nkv, hd});
  Tensor kr = Tensor::empty({T, nkv, hd}, DType::f32), vr = Tensor::empty({T, nkv, hd}, DType::f32);
  for (int64_t i = 0; i < k.numel(); ++i) {
    kr.ptr<float>()[i] = e4m3_to_f32(f32_to_e4m3(k.ptr<float>()[i] * (1.0f / s.k))) * s.k;
    vr.ptr<float>()[i] = e4m3_to_f32(f32_to_e4m3(v.ptr<float>()[i] * (1.0f / s.v))) * s.v;
  }
  Tensor kc8 = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3), vc8 = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3);
  Tensor kc = Tensor::zeros({blocks, bs, nkv, hd}, DType::f32), vc = Tensor::zeros({blocks, bs, nkv, hd}, DType::f32);
  ops::kv_write(k, v, kc8, vc8, slot_t, s);
  ops::kv_write(kr, vr, kc, vc, slot_t, s);  // an f32 cache ignores the scales
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < nkv * hd; ++i) {
      ASSERT_EQ(kc8.ptr<uint8_t>()[slots[size_t(t)] * nkv * hd + i], f32_to_e4m3(k.ptr<float>()[t * nkv * hd + i] / s.k));
      ASSERT_EQ(kc.ptr<float>()[slots[size_t(t)] * nkv * hd + i], kr.ptr<float>()[t * nkv * hd + i]);
    }
  Tensor o8 = Tensor::empty({T, nh, hd}, DType::f32), o = Tensor::empty({T, nh, hd}, DType::f32);
  ops::paged_attention(q, kc8, vc8, m, 0.25f, o8, s);
  ops::paged_attention(q, kc, vc, m, 0.25f, o, s);
  for (int64_t i = 0; i < o.numel(); ++i) ASSERT_NEAR(o8.ptr<float>()[i], o.ptr<float>()[i], 1e-5f) << i;
  // Scales 1 read the same bytes as different values: the scales are not ignored.
  Tensor o1 = Tensor::empty({T, nh, hd}, DType::f32);
  ops::paged_attention(q, kc8, vc8, m, 0.25f, o1);
  float diff = 0;
  for (int64_t i = 0; i < o.numel(); ++i) diff = std::max(diff, std::fabs(o1.ptr<float>()[i] - o.ptr<float>()[i]));
  EXPECT_GT(diff, 0.1f);
}

// The MLA latent cache in FP8 (DeepSeek-V3 under --kv-cache-dtype fp8): cache_write stores
// e4m3(x / scale), mla_attention over it equals mla_attention over an f32 cache of stored x scale.
TEST(KvCacheFp8, MlaLatentCache) {
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float s = 0.05f;
  const int64_t T = 7, nh = 3, rank = 16, rope = 4, D = rank + rope, bs = 4, blocks = 2;
  const OneSeq seq(T, bs, {1, 0});
  const ops::AttnMeta& m = seq.meta;
  const std::vector<int32_t>& slots = seq.slots;
  const Tensor& slot_t = seq.slot_t;
  Tensor x = Tensor::empty({T, 1, D}, DType::f32), q = Tensor::empty({T, nh, D}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = nd(g);
  for (int64_t i = 0; i < q.numel(); ++i) q.ptr<float>()[i] = nd(g);
  Tensor c8 = Tensor::zeros({blocks, bs, 1, D}, DType::f8_e4m3), c = Tensor::zeros({blocks, bs, 1, D}, DType::f32);
  ops::cache_write(x, c8, slot_t, s);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      const uint8_t b = c8.ptr<uint8_t>()[slots[size_t(t)] * D + d];
      ASSERT_EQ(b, f32_to_e4m3(x.ptr<float>()[t * D + d] * (1.0f / s)));
      c.ptr<float>()[slots[size_t(t)] * D + d] = e4m3_to_f32(b) * s;
    }
  Tensor o8 = Tensor::empty({T, nh, rank}, DType::f32), o = Tensor::empty({T, nh, rank}, DType::f32);
  ops::mla_attention(q, c8, m, 0.3f, rank, o8, s);
  ops::mla_attention(q, c, m, 0.3f, rank, o);
  for (int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o8.ptr<float>()[i], o.ptr<float>()[i]) << i;
}
