// The greedy LM head (ops::lm_head_argmax, ops/cuda/fused.cu): (RMSNorm +) GEMV + argmax in one
// launch vs the unfused CUDA chain (linear's f32-out GEMV, then argmax_rows) — bit for bit
// without the norm (same reduction order), within a near-tie margin with it (the prologue sums
// squares in another order than rmsnorm) — at real vocab sizes (Llama-3 128256, Qwen 151936,
// Llama-2 32000, odd ones whose last block has idle warps), ties (lowest id wins, across blocks),
// all-equal and all-negative logits, and repeated launches on one scratch (it resets itself).
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"
#include "ops/lm_head.h"

using namespace ts;
using namespace ts::test;

namespace {

// Fast bf16 fill (a 150k x K head through mt19937 would take seconds): xorshift values in
// [-scale, scale], never zero.
Tensor fill_bf16_host(std::vector<int64_t> shape, float scale, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  float* p = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float v = (float(uint32_t(s >> 40)) / float(1 << 24) * 2.0f - 1.0f) * scale;
    if (v == 0.0f) v = scale * 0.5f;
    p[i] = bf16_to_f32(f32_to_bf16(v));
  }
  return t;
}

struct Case {
  Tensor x_h, head_h;  // host f32 (bf16 values)
};

std::vector<int32_t> ids_host(const Tensor& d, int64_t n) {
  ::ts::cuda::synchronize();
  Tensor h = d.to(Device::cpu);
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + n);
}

// Unfused CUDA reference: [rmsnorm,] linear (GEMV, f32 out), argmax_rows. Returns ids and the
// logits (host f32) for the near-tie check.
std::vector<int32_t> unfused(const Tensor& x, const Tensor* nw, float eps, const Tensor& head, Tensor& logits_h) {
  const int64_t M = x.rows(), V = head.size(0);
  Tensor xn = x;
  if (nw) {
    xn = Tensor::empty(x.dims(), DType::bf16, Device::cuda);
    ops::cuda::rmsnorm(x, *nw, eps, xn);
  }
  Tensor logits = Tensor::empty({M, V}, DType::f32, Device::cuda);
  ops::cuda::linear(xn, head, logits, nullptr, ops::KernelPolicy{.linear = ops::LinearPath::gemv});
  Tensor ids = Tensor::zeros({M}, DType::i32, Device::cuda);
  ops::cuda::argmax_rows(logits, nullptr, ids, 1, nullptr);
  logits_h = to_host_f32(logits);
  return ids_host(ids, M);
}

void check(const Tensor& x_h, const Tensor* nw_h, const Tensor& head_h, Tensor& scratch, const std::string& what) {
  const int64_t M = x_h.rows(), V = head_h.size(0);
  Tensor x = to_dev_bf16(x_h), head = to_dev_bf16(head_h);
  Tensor nw;
  if (nw_h) nw = to_dev_bf16(*nw_h);
  ASSERT_TRUE(ops::cuda::lm_head_argmax_fusable(x, nw_h ? &nw : nullptr, head)) << what;
  Tensor ids = Tensor::zeros({M}, DType::i32, Device::cuda);
  ops::cuda::lm_head_argmax(x, nw_h ? &nw : nullptr, 1e-5f, head, ids, scratch);
  std::vector<int32_t> got = ids_host(ids, M);
  Tensor logits_h;
  std::vector<int32_t> want = unfused(x, nw_h ? &nw : nullptr, 1e-5f, head, logits_h);
  for (int64_t m = 0; m < M; ++m) {
    ASSERT_GE(got[size_t(m)], 0) << what;
    ASSERT_LT(got[size_t(m)], V) << what;
    if (!nw_h) {
      EXPECT_EQ(got[size_t(m)], want[size_t(m)]) << what << " row " << m;
    } else if (got[size_t(m)] != want[size_t(m)]) {
      const float* l = logits_h.ptr<float>() + m * V;
      const float gap = l[want[size_t(m)]] - l[got[size_t(m)]];
      EXPECT_LE(gap, 1e-3f * std::max(1.0f, std::fabs(l[want[size_t(m)]]))) << what << " row " << m << ": not a near tie";
    }
  }
  // The scratch is zero again (the next launch, or a graph replay, starts clean).
  ::ts::cuda::synchronize();
  Tensor sh = scratch.to(Device::cpu);
  for (int64_t i = 0; i < ops::kLmArgmaxScratch; ++i) EXPECT_EQ(sh.ptr<int64_t>()[i], 0) << what << " scratch[" << i << "]";
}

}  // namespace

TEST(CudaLmHeadArgmax, Fusable) {
  TS_REQUIRE_CUDA();
  Tensor head = Tensor::zeros({1000, 256}, DType::bf16, Device::cuda);
  for (int64_t M : {1, 2}) EXPECT_TRUE(ops::cuda::lm_head_argmax_fusable(Tensor::zeros({M, 256}, DType::bf16, Device::cuda), nullptr, head));
  EXPECT_FALSE(ops::cuda::lm_head_argmax_fusable(Tensor::zeros({3, 256}, DType::bf16, Device::cuda), nullptr, head));
  EXPECT_FALSE(ops::cuda::lm_head_argmax_fusable(Tensor::zeros({1, 128}, DType::bf16, Device::cuda), nullptr, head));
  EXPECT_FALSE(ops::lm_head_argmax_fusable(Tensor::zeros({1, 256}, DType::f32), nullptr, Tensor::zeros({1000, 256}, DType::f32)));
}

TEST(CudaLmHeadArgmax, MatchesUnfusedAtVocabSizes) {
  TS_REQUIRE_CUDA();
  Tensor scratch = Tensor::zeros({ops::kLmArgmaxScratch}, DType::i64, Device::cuda);
  uint64_t seed = 1;
  for (auto [V, K] : {std::pair<int64_t, int64_t>{1000, 4096}, {1001, 512}, {32000, 512}, {32003, 256},
                      {128256, 256}, {151936, 128}}) {
    Tensor head = fill_bf16_host({V, K}, 0.05f, seed++);
    for (int64_t M : {1, 2})
      for (bool norm : {false, true})
        for (int rep = 0; rep < 2; ++rep) {
          Tensor x = fill_bf16_host({M, K}, 3.0f, seed++), nw = fill_bf16_host({K}, 1.0f, seed++);
          check(x, norm ? &nw : nullptr, head, scratch, fmt::format("V={} K={} M={} norm={} rep={}", V, K, M, norm, rep));
        }
  }
}

TEST(CudaLmHeadArgmax, TiesGoToTheLowestId) {
  TS_REQUIRE_CUDA();
  Tensor scratch = Tensor::zeros({ops::kLmArgmaxScratch}, DType::i64, Device::cuda);
  const int64_t K = 256;
  for (int64_t V : {1000, 128256, 151936}) {
    Tensor x = fill_bf16_host({2, K}, 1.0f, 77);
    Tensor head = fill_bf16_host({V, K}, 0.01f, 78);
    // Rows 13 (block 1), 9 (block 1), 200 (block 25) and V - 1 (the last block) are copies of
    // a row aligned with x[0] (the clear maximum of row 0); row 1's maximum is tied between
    // rows V - 1 and V - 2 (one block) and 40 (another).
    auto set_row = [&](int64_t r, const float* src) { std::copy(src, src + K, head.ptr<float>() + r * K); };
    std::vector<float> big(static_cast<size_t>(K)), big1(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) {
      big[size_t(k)] = x.ptr<float>()[k] > 0 ? 0.5f : -0.5f;
      big1[size_t(k)] = x.ptr<float>()[K + k] > 0 ? 0.25f : -0.25f;
    }
    for (int64_t r : {V - 1, int64_t(200), int64_t(13), int64_t(9)}) set_row(r, big.data());
    for (int64_t r : {V - 2, V - 3, int64_t(40)}) set_row(r, big1.data());
    // Row 1 must prefer the big1 rows: make them larger for x[1] than the big rows (x[1] differs).
    check(x, nullptr, head, scratch, fmt::format("ties V={}", V));
    Tensor ids = Tensor::zeros({2}, DType::i32, Device::cuda);
    Tensor xd = to_dev_bf16(x), hd = to_dev_bf16(head);
    ops::cuda::lm_head_argmax(xd, nullptr, 0.0f, hd, ids, scratch);
    std::vector<int32_t> got = ids_host(ids, 2);
    EXPECT_EQ(got[0], 9) << "V=" << V;
    EXPECT_TRUE(got[1] == 9 || got[1] == 40) << "V=" << V << " got " << got[1];  // whichever tie set is larger for x[1]
  }
  // All logits equal (a zero head): id 0. All negative: the largest (least negative) wins.
  for (int64_t V : {1000, 32003}) {
    Tensor x = fill_bf16_host({1, K}, 1.0f, 5);
    Tensor zero = Tensor::zeros({V, K}, DType::f32);
    check(x, nullptr, zero, scratch, fmt::format("zero head V={}", V));
    Tensor ids = Tensor::zeros({1}, DType::i32, Device::cuda);
    Tensor xd = to_dev_bf16(x), zd = to_dev_bf16(zero);
    ops::cuda::lm_head_argmax(xd, nullptr, 0.0f, zd, ids, scratch);
    EXPECT_EQ(ids_host(ids, 1)[0], 0);
    Tensor neg = Tensor::empty({V, K}, DType::f32);
    for (int64_t r = 0; r < V; ++r)
      for (int64_t k = 0; k < K; ++k)  // logit r = -(1 + (r * 7919) % V) * sum|x| / 64: unique max at r = 0
        neg.ptr<float>()[r * K + k] =
            bf16_to_f32(f32_to_bf16((x.ptr<float>()[k] > 0 ? -1.0f : 1.0f) * float(1 + (r * 7919) % V) / 64.0f));
    check(x, nullptr, neg, scratch, fmt::format("negative head V={}", V));
  }
}

TEST(CudaLmHeadArgmax, MatchesCpuReference) {
  TS_REQUIRE_CUDA();
  Tensor scratch = Tensor::zeros({ops::kLmArgmaxScratch}, DType::i64, Device::cuda);
  const int64_t V = 5000, K = 512;
  Tensor head = fill_bf16_host({V, K}, 0.05f, 11), x = fill_bf16_host({2, K}, 3.0f, 12), nw = fill_bf16_host({K}, 1.0f, 13);
  Tensor want = Tensor::zeros({2}, DType::i32), none;
  ops::cpu::lm_head_argmax(x, &nw, 1e-5f, head, want, none);
  Tensor xd = to_dev_bf16(x), hd = to_dev_bf16(head), nd = to_dev_bf16(nw);
  Tensor ids = Tensor::zeros({2}, DType::i32, Device::cuda);
  ops::cuda::lm_head_argmax(xd, &nd, 1e-5f, hd, ids, scratch);
  std::vector<int32_t> got = ids_host(ids, 2);
  // CPU logits for the near-tie margin.
  Tensor xn = Tensor::empty({2, K}, DType::f32), logits = Tensor::empty({2, V}, DType::f32);
  ops::cpu::rmsnorm(x, nw, 1e-5f, xn);
  ops::cpu::linear(xn, head, logits, nullptr);
  for (int m = 0; m < 2; ++m) {
    const float* l = logits.ptr<float>() + m * V;
    const int32_t w = want.ptr<int32_t>()[m];
    EXPECT_LE(l[w] - l[got[size_t(m)]], 2e-2f * std::max(1.0f, std::fabs(l[w]))) << "row " << m;
  }
}
