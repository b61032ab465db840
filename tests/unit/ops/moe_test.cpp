// Router, gated activations and routed experts (CPU reference ops).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/ops.h"

using namespace ts;

namespace {

Tensor from(std::vector<float> v, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& g, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(g);
  return t;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

TEST(MoeRoute, SoftmaxTopKRenormalized) {
  // Two tokens, four experts.
  Tensor logits = from({1.0f, 3.0f, 2.0f, 0.0f, /**/ 0.5f, -1.0f, 0.5f, 2.0f}, {2, 4});
  ops::MoeRouting r;
  r.scoring = ops::MoeScoring::softmax;
  r.top_k = 2;
  r.renormalize = true;
  Tensor ids = Tensor::empty({2, 2}, DType::i32), w = Tensor::empty({2, 2}, DType::f32);
  ops::moe_route(logits, nullptr, r, ids, w);
  // Token 0 picks experts 1 and 2 (sorted by id); renormalized softmax = softmax over {3, 2}.
  EXPECT_EQ(ids.ptr<int32_t>()[0], 1);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 2);
  float e = std::exp(1.0f);
  EXPECT_NEAR(w.ptr<float>()[0], e / (e + 1), 1e-6);
  EXPECT_NEAR(w.ptr<float>()[1], 1 / (e + 1), 1e-6);
  // Token 1: expert 3 then the tie between 0 and 2 goes to the lower id.
  EXPECT_EQ(ids.ptr<int32_t>()[2], 0);
  EXPECT_EQ(ids.ptr<int32_t>()[3], 3);
  float a = std::exp(0.5f), b = std::exp(2.0f);
  EXPECT_NEAR(w.ptr<float>()[2], a / (a + b), 1e-6);
  EXPECT_NEAR(w.ptr<float>()[3], b / (a + b), 1e-6);

  // Without renormalization the weights are the full softmax probabilities.
  r.renormalize = false;
  ops::moe_route(logits, nullptr, r, ids, w);
  float z = std::exp(1.0f) + std::exp(3.0f) + std::exp(2.0f) + std::exp(0.0f);
  EXPECT_NEAR(w.ptr<float>()[0], std::exp(3.0f) / z, 1e-6);
}

TEST(MoeRoute, GroupedSigmoidWithBias) {
  // 8 experts in 4 groups of 2; keep the best 2 groups, then the top 2 experts among them.
  std::vector<float> lg = {0.0f, 0.1f, /*g1*/ 2.0f, -3.0f, /*g2*/ 1.0f, 1.0f, /*g3*/ -1.0f, 0.5f};
  Tensor logits = from(lg, {1, 8});
  // The bias moves selection (g3's expert 7 gets a big boost) but not the weights.
  Tensor bias = from({0, 0, 0, 0, 0, 0, 0, 0.9f}, {8});
  ops::MoeRouting r;
  r.scoring = ops::MoeScoring::sigmoid;
  r.top_k = 2;
  r.n_group = 4;
  r.topk_group = 2;
  r.renormalize = true;
  r.renorm_eps = 1e-20f;
  r.scale = 2.5f;
  Tensor ids = Tensor::empty({1, 2}, DType::i32), w = Tensor::empty({1, 2}, DType::f32);
  ops::moe_route(logits, &bias, r, ids, w);
  // Group scores (sum of the two best biased scores): g0 1.025, g1 0.928, g2 1.462, g3 1.647.
  // Kept: g2, g3. Candidates 4 (0.731), 5 (0.731), 6 (0.269), 7 (0.622 + 0.9): picks 7 and 4.
  EXPECT_EQ(ids.ptr<int32_t>()[0], 4);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 7);
  float s4 = sigmoid(1.0f), s7 = sigmoid(0.5f);
  EXPECT_NEAR(w.ptr<float>()[0], s4 / (s4 + s7) * 2.5f, 1e-6);
  EXPECT_NEAR(w.ptr<float>()[1], s7 / (s4 + s7) * 2.5f, 1e-6);
}

TEST(MoeRoute, GroupTiesAndMaskedGroups) {
  // Two identical groups: the tie goes to the lower group; experts of the dropped group score
  // 0 (not -inf), as transformers masks them, so with a negative bias they can still win.
  Tensor logits = from({1.0f, 0.0f, 1.0f, 0.0f}, {1, 4});
  Tensor bias = from({-2.0f, -2.0f, -2.0f, -2.0f}, {4});
  ops::MoeRouting r;
  r.scoring = ops::MoeScoring::sigmoid;
  r.top_k = 2;
  r.n_group = 2;
  r.topk_group = 1;
  Tensor ids = Tensor::empty({1, 2}, DType::i32), w = Tensor::empty({1, 2}, DType::f32);
  ops::moe_route(logits, &bias, r, ids, w);
  // Group 0 kept (tie -> lower). Biased scores of group 0 are negative (-1.27, -1.5); the masked
  // experts 2, 3 score 0 and win.
  EXPECT_EQ(ids.ptr<int32_t>()[0], 2);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 3);
  EXPECT_NEAR(w.ptr<float>()[0], sigmoid(1.0f), 1e-6);
  EXPECT_NEAR(w.ptr<float>()[1], 0.5f, 1e-6);
}

TEST(MoeRoute, ZeroTokens) {
  Tensor logits = Tensor::empty({0, 8}, DType::f32);
  Tensor ids = Tensor::empty({0, 2}, DType::i32), w = Tensor::empty({0, 2}, DType::f32);
  ops::MoeRouting r;
  r.top_k = 2;
  EXPECT_NO_THROW(ops::moe_route(logits, nullptr, r, ids, w));
}

TEST(Glu, SwigluOai) {
  Tensor x = from({-9.0f, 0.5f, 8.0f, /* up */ 9.0f, -0.25f, -8.0f}, {1, 6});
  Tensor out = Tensor::empty({1, 3}, DType::f32);
  ops::GluAct act{ops::GluKind::swiglu_oai, 1.702f, 7.0f};
  ops::glu(x, out, act);
  auto ref = [](float g, float u) {
    g = std::min(g, 7.0f);
    u = std::clamp(u, -7.0f, 7.0f);
    return (u + 1.0f) * g * sigmoid(1.702f * g);
  };
  EXPECT_NEAR(out.ptr<float>()[0], ref(-9.0f, 9.0f), 1e-6);
  EXPECT_NEAR(out.ptr<float>()[1], ref(0.5f, -0.25f), 1e-6);
  EXPECT_NEAR(out.ptr<float>()[2], ref(8.0f, -8.0f), 1e-5);
  // silu variant equals silu_mul.
  Tensor s1 = Tensor::empty({1, 3}, DType::f32), s2 = Tensor::empty({1, 3}, DType::f32);
  ops::glu(x, s1, ops::GluAct{});
  ops::silu_mul(x, s2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s1.ptr<float>()[i], s2.ptr<float>()[i]);
}

TEST(MoeExperts, MatchesPerTokenReference) {
  std::mt19937 g(7);
  const int64_t T = 5, H = 12, I = 6, E = 4, K = 2;
  Tensor x = random_tensor({T, H}, g), gu = random_tensor({E, 2 * I, H}, g, 0.3f), dn = random_tensor({E, H, I}, g, 0.3f);
  std::vector<int32_t> idv = {0, 3, 1, 2, 0, 1, 2, 3, 3, 0};
  Tensor ids = Tensor::empty({T, K}, DType::i32);
  std::memcpy(ids.data, idv.data(), idv.size() * 4);
  Tensor w = random_tensor({T, K}, g);
  for (auto act : {ops::GluAct{}, ops::GluAct{ops::GluKind::swiglu_oai, 1.702f, 7.0f}}) {
    Tensor out = Tensor::empty({T, H}, DType::f32);
    ops::moe_experts(x, ids, w, gu, dn, act, out);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> ref(size_t(H), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        int e = idv[size_t(t * K + j)];
        std::vector<float> h(static_cast<size_t>(2 * I));
        for (int64_t n = 0; n < 2 * I; ++n) {
          double s = 0;
          for (int64_t k = 0; k < H; ++k) s += double(gu.ptr<float>()[(e * 2 * I + n) * H + k]) * x.ptr<float>()[t * H + k];
          h[size_t(n)] = float(s);
        }
        Tensor hv = from(h, {1, 2 * I}), av = Tensor::empty({1, I}, DType::f32);
        ops::glu(hv, av, act);
        for (int64_t o = 0; o < H; ++o) {
          double s = 0;
          for (int64_t k = 0; k < I; ++k) s += double(dn.ptr<float>()[(e * H + o) * I + k]) * av.ptr<float>()[k];
          ref[size_t(o)] += s * w.ptr<float>()[t * K + j];
        }
      }
      for (int64_t o = 0; o < H; ++o) EXPECT_NEAR(out.ptr<float>()[t * H + o], ref[size_t(o)], 1e-4) << t << "," << o;
    }
  }
  // A token's output does not depend on the other tokens in the batch (bit-exact).
  Tensor all = Tensor::empty({T, H}, DType::f32), one = Tensor::empty({1, H}, DType::f32);
  ops::moe_experts(x, ids, w, gu, dn, ops::GluAct{}, all);
  for (int64_t t = 0; t < T; ++t) {
    Tensor xt = x.slice_rows(t, t + 1), it = ids.slice_rows(t, t + 1), wt = w.slice_rows(t, t + 1);
    ops::moe_experts(xt, it, wt, gu, dn, ops::GluAct{}, one);
    EXPECT_EQ(0, std::memcmp(one.data, all.ptr<float>() + t * H, size_t(H) * 4)) << "token " << t;
  }
}

TEST(MoeExperts, ZeroTokens) {
  Tensor x = Tensor::empty({0, 8}, DType::f32), out = Tensor::empty({0, 8}, DType::f32);
  Tensor ids = Tensor::empty({0, 2}, DType::i32), w = Tensor::empty({0, 2}, DType::f32);
  Tensor gu = Tensor::zeros({3, 8, 8}, DType::f32), dn = Tensor::zeros({3, 8, 4}, DType::f32);
  EXPECT_NO_THROW(ops::moe_experts(x, ids, w, gu, dn, ops::GluAct{}, out));
  Tensor a = Tensor::empty({0, 4}, DType::f32);
  EXPECT_NO_THROW(ops::glu(x, a, ops::GluAct{}));
}
