// The MoE route hook (models/moe.h) that route-diff relies on: recording does not perturb the
// forward, forcing the recorded routing reproduces the logits bit for bit, forcing another expert
// changes exactly the tokens it should, and the host selection scores pick the experts the
// router picked.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "models/model.h"
#include "models/moe.h"
#include "runtime/model_runner.h"

using namespace ts;

namespace {

std::string fixture(const char* name) { return std::string(TS_SOURCE_DIR) + "/tests/data/" + name; }

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((131 + i * 37) % 1000 + 5);
  return p;
}

// All logit rows of one prompt from a fresh runner, as an owned host copy.
Tensor run(const std::shared_ptr<models::Model>& m, const std::vector<int32_t>& p, models::RouteTape* tape) {
  const int bs = 16;
  std::vector<int32_t> table(p.size() / bs + 2);
  std::iota(table.begin(), table.end(), 0);
  ModelRunner r(m, int64_t(table.size()), bs);
  models::ScopedMoeRouteHook on(tape);
  if (tape) tape->start();
  return r.run({SeqChunk{p.data(), int(p.size()), 0, &table, SeqChunk::Logits::all}}).to_f32();
}

bool same_rows(const Tensor& a, const Tensor& b, int64_t r0, int64_t r1) {
  const size_t w = size_t(a.size(1)) * 4;
  return std::memcmp(a.ptr<float>() + r0 * a.size(1), b.ptr<float>() + r0 * b.size(1), size_t(r1 - r0) * w) == 0;
}

class MoeRouteHook : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeRouteHook, RecordAndForceReproduceBitExactly) {
  models::LoadOptions lo;
  std::shared_ptr<models::Model> model = models::load_model(fixture(GetParam()), lo);
  const auto p = prompt(40);
  const Tensor plain = run(model, p, nullptr);
  models::RouteTape rec;
  const Tensor recorded = run(model, p, &rec);
  ASSERT_FALSE(rec.seen.empty()) << "no MoE layer reported";
  EXPECT_EQ(models::moe_route_hook(), nullptr) << "the scoped hook must be removed";
  EXPECT_TRUE(same_rows(plain, recorded, 0, plain.size(0))) << "recording changed the logits";
  for (const auto& r : rec.seen) {
    EXPECT_EQ(r.logits.size(0), int64_t(p.size()));
    EXPECT_EQ(r.ids.size(0), int64_t(p.size()));
    EXPECT_EQ(r.ids.size(1), r.routing.top_k);
    EXPECT_EQ(r.weights.dims(), r.ids.dims());
  }

  models::RouteTape force;
  force.forced = rec.seen;
  const Tensor forced = run(model, p, &force);
  EXPECT_TRUE(same_rows(recorded, forced, 0, recorded.size(0))) << "forcing the recorded routing changed the logits";
  ASSERT_EQ(force.seen.size(), rec.seen.size());
  for (size_t l = 0; l < rec.seen.size(); ++l)  // the model's own choice, seen before the override
    EXPECT_EQ(0, std::memcmp(force.seen[l].ids.data, rec.seen[l].ids.data, rec.seen[l].ids.nbytes()));
}

TEST_P(MoeRouteHook, ForcingAnotherExpertChangesThatTokenOnward) {
  models::LoadOptions lo;
  std::shared_ptr<models::Model> model = models::load_model(fixture(GetParam()), lo);
  const auto p = prompt(24);
  models::RouteTape rec;
  const Tensor base = run(model, p, &rec);
  // Token 9 of the first MoE layer: swap its first expert for one it did not pick.
  const int64_t t = 9;
  models::RouteTape force;
  force.forced = rec.seen;
  models::RouteRecord& l0 = force.forced[0];
  l0.ids = l0.ids.to(Device::cpu);  // own copy (the recorded one stays as it was)
  const int64_t k = l0.ids.size(1), experts = l0.logits.size(1);
  int32_t* ids = l0.ids.ptr<int32_t>() + t * k;
  int32_t other = 0;
  while (std::find(ids, ids + k, other) != ids + k) ++other;
  ASSERT_LT(other, experts);
  ids[0] = other;
  const Tensor changed = run(model, p, &force);
  EXPECT_TRUE(same_rows(base, changed, 0, t)) << "tokens before the forced one must not change (causal)";
  EXPECT_FALSE(same_rows(base, changed, t, t + 1)) << "forcing another expert did not change the token's logits";
}

TEST_P(MoeRouteHook, SelectionScoresPickTheRoutedExperts) {
  models::LoadOptions lo;
  std::shared_ptr<models::Model> model = models::load_model(fixture(GetParam()), lo);
  models::RouteTape rec;
  run(model, prompt(32), &rec);
  for (const auto& r : rec.seen) {
    const int64_t T = r.ids.size(0), k = r.ids.size(1), E = r.logits.size(1);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> s = models::route_selection_scores(r.logits.ptr<float>() + t * E,
                                                            r.bias.data ? r.bias.ptr<float>() : nullptr, E, r.routing);
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
      std::vector<int32_t> want(order.begin(), order.begin() + k), got(r.ids.ptr<int32_t>() + t * k, r.ids.ptr<int32_t>() + (t + 1) * k);
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      EXPECT_EQ(want, got) << "token " << t;
    }
  }
}

// Softmax top-k (Qwen3-MoE, MiniMax-M3) and grouped sigmoid with a correction bias (DeepSeek-V3).
INSTANTIATE_TEST_SUITE_P(Fixtures, MoeRouteHook, ::testing::Values("qwen3_moe", "deepseek_v3", "minimax_m3"));

}  // namespace
