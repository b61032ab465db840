// The block-selection hook (models/block_select.h) that route-diff relies on, on MiniMax-M3's
// sparse-attention layers: recording does not perturb the forward, forcing the recorded blocks
// reproduces the logits bit for bit, forcing another block changes exactly the query it should,
// the host block scores pick the blocks the indexer picked, and the kernel check finds nothing
// when the "device" is the CPU itself.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "models/block_select.h"
#include "models/model.h"
#include "runtime/model_runner.h"

using namespace ts;

namespace {

std::string fixture() { return std::string(TS_SOURCE_DIR) + "/tests/data/minimax_m3"; }

// Past index_topk_blocks * index_block_size (4 x 16) tokens, so the later queries drop blocks.
std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((131 + i * 37) % 1000 + 5);
  return p;
}

Tensor run(const std::shared_ptr<models::Model>& m, const std::vector<int32_t>& p, models::BlockTape* tape) {
  const int bs = 16;
  std::vector<int32_t> table(p.size() / bs + 2);
  std::iota(table.begin(), table.end(), 0);
  ModelRunner r(m, int64_t(table.size()), bs);
  models::ScopedBlockSelectHook on(tape);
  if (tape) tape->start();
  return r.run({SeqChunk{p.data(), int(p.size()), 0, &table, SeqChunk::Logits::all}}).to_f32();
}

bool same_rows(const Tensor& a, const Tensor& b, int64_t r0, int64_t r1) {
  const size_t w = size_t(a.size(1)) * 4;
  return std::memcmp(a.ptr<float>() + r0 * a.size(1), b.ptr<float>() + r0 * b.size(1), size_t(r1 - r0) * w) == 0;
}

std::shared_ptr<models::Model> load() {
  models::LoadOptions lo;
  return models::load_model(fixture(), lo);
}

TEST(BlockSelectHook, RecordAndForceReproduceBitExactly) {
  auto model = load();
  const auto p = prompt(100);
  const Tensor plain = run(model, p, nullptr);
  models::BlockTape rec;
  const Tensor recorded = run(model, p, &rec);
  ASSERT_EQ(rec.seen.size(), 2u) << "the fixture has two sparse-attention layers";
  EXPECT_EQ(models::block_select_hook(), nullptr) << "the scoped hook must be removed";
  EXPECT_TRUE(same_rows(plain, recorded, 0, plain.size(0))) << "recording changed the logits";
  for (const auto& r : rec.seen) {
    EXPECT_EQ(r.sel.size(0), int64_t(p.size()));
    EXPECT_EQ(r.sel.size(2), r.indexer.top_k);
    EXPECT_EQ(r.q.size(0), int64_t(p.size()));
    EXPECT_EQ(r.k.size(0), int64_t(p.size()));
  }

  models::BlockTape force;
  force.forced = rec.seen;
  const Tensor forced = run(model, p, &force);
  EXPECT_TRUE(same_rows(recorded, forced, 0, recorded.size(0))) << "forcing the recorded blocks changed the logits";
  ASSERT_EQ(force.seen.size(), rec.seen.size());
  for (size_t l = 0; l < rec.seen.size(); ++l)  // the indexer's own pick, seen before the override
    EXPECT_EQ(0, std::memcmp(force.seen[l].sel.data, rec.seen[l].sel.data, rec.seen[l].sel.nbytes()));
}

TEST(BlockSelectHook, ForcingAnotherBlockChangesThatQueryOnward) {
  auto model = load();
  const auto p = prompt(100);
  models::BlockTape rec;
  const Tensor base = run(model, p, &rec);
  // Query 90 (block 5 of 16 tokens: 6 candidates, 4 kept) of the first sparse layer, index head
  // 0: swap a kept non-local block for the one it dropped.
  const int64_t t = 90;
  models::BlockTape force;
  force.forced = rec.seen;
  models::BlockRecord& l0 = force.forced[0];
  l0.sel = l0.sel.to(Device::cpu);  // own copy
  const int64_t w = l0.sel.size(2);
  int32_t* s = l0.sel.ptr<int32_t>() + t * l0.sel.size(1) * w;
  ASSERT_EQ(s[w - 1], 5) << "the local block is kept";
  int32_t dropped = 0;
  while (std::find(s, s + w, dropped) != s + w) ++dropped;
  ASSERT_LT(dropped, 5);
  s[0] = dropped;
  std::sort(s, s + w);
  const Tensor changed = run(model, p, &force);
  EXPECT_TRUE(same_rows(base, changed, 0, t)) << "queries before the forced one must not change (causal)";
  EXPECT_FALSE(same_rows(base, changed, t, t + 1)) << "forcing another block did not change the query's logits";
}

TEST(BlockSelectHook, ScoresPickTheSelectedBlocks) {
  auto model = load();
  models::BlockTape rec;
  run(model, prompt(100), &rec);
  for (const auto& r : rec.seen) {
    const int64_t T = r.sel.size(0), Hi = r.sel.size(1), w = r.sel.size(2);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hi; ++h) {
        std::vector<float> s = models::block_scores(r, t, h);
        std::vector<int32_t> order(s.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
        const size_t k = std::min(size_t(w), s.size());
        std::vector<int32_t> want(order.begin(), order.begin() + long(k));
        std::sort(want.begin(), want.end());
        const int32_t* got = r.sel.ptr<int32_t>() + (t * Hi + h) * w;
        EXPECT_EQ(want, std::vector<int32_t>(got, got + k)) << "query " << t << " head " << h;
      }
  }
}

TEST(BlockSelectHook, KernelCheckOnTheCpuFindsNothing) {
  auto model = load();
  models::BlockTape rec;
  rec.check = true;
  run(model, prompt(100), &rec);
  ASSERT_EQ(rec.checks.size(), 2u);
  for (const auto& c : rec.checks) {
    EXPECT_EQ(c.pairs, 200);
    EXPECT_EQ(c.sel_differ, 0);
    EXPECT_EQ(c.out_diff, 0.0);
    EXPECT_GT(c.out_max, 0.0);
  }
}

}  // namespace
