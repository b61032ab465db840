// Attention data parallelism in the engine (--device cpu --data-parallel-size 2: two DP groups
// of CPU ranks, one scheduler placing each request in a group, the KV cache partitioned per
// group) on the DeepSeek-V3 fixture (MLA + MoE): batched, chunked, prefix-reusing and retracting
// runs give DP 1's greedy tokens, with the MoE layers over both groups either as MoE TP (the
// groups' tokens gathered) or as EP (dispatch / combine), and with attention TP inside the groups.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"
#include "io/config.h"
#include "runtime/model_runner.h"
#include "runtime/tp_workers.h"

using namespace ts;
using namespace ts::test;

namespace {

std::string fixture() { return std::string(TS_SOURCE_DIR) + "/tests/data/deepseek_v3"; }

EngineOptions engine(int64_t pool_tokens = 4096, int dp = 1, int tp = 1, int ep = 1) {
  EngineOptions o = small_engine(pool_tokens, 16);
  o.model_dir = fixture();
  o.parallel.tp_size = tp;
  o.parallel.dp_size = dp;
  o.parallel.ep_size = ep;
  return o;
}

std::vector<GenerateParams> requests(const Engine& e, int n, int max_tokens) {
  std::vector<GenerateParams> ps;
  for (auto& p : code_prompts(e, n)) ps.push_back(greedy(p, max_tokens));
  return ps;
}

}  // namespace

TEST(EngineDp, BatchChunksAndPrefixReuseEqualDp1) {
  Engine ref(engine());
  ref.start();
  auto ps = requests(ref, 6, 10);
  auto solo = run_all(ref, ps, false);
  struct Mapping {
    int tp, ep;
  };
  for (Mapping m : {Mapping{1, 1}, Mapping{1, 2}, Mapping{2, 4}}) {
    SCOPED_TRACE(testing::Message() << "dp 2, attention tp " << m.tp << ", ep " << m.ep);
    EngineOptions o = engine(4096, 2, m.tp, m.ep);
    o.chunked_prefill_size = 5;  // several chunks per prompt, mixed with decodes of both groups
    Engine e(o);
    e.start();
    // The second run's full blocks come from the prefix cache of the group that holds them.
    expect_batched_then_cached_equal(e, ps, solo);
  }
}

// A pool of 10 blocks per group: concurrent requests run a group dry, the scheduler retracts
// within that group, and the recomputed requests still give DP 1's tokens.
TEST(EngineDp, RetractionWithinAGroupEqualsDp1) {
  Engine ref(engine());
  ref.start();
  auto ps = requests(ref, 8, 40);
  auto solo = run_all(ref, ps, false);
  Engine e(engine(/*pool_tokens=*/160, /*dp=*/2));
  e.start();
  auto conc = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
    EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "prompt " << i;
  }
  EXPECT_GT(e.metrics().retractions, 0);
}

// What attention DP does not run yet is a startup error that says so.
TEST(EngineDp, UnsupportedCombinationsAreStartupErrors) {
  EngineOptions spec = engine(4096, 2);
  spec.model_dir = demo_model();
  spec.speculative_algorithm = "EAGLE3";
  spec.speculative_draft_model_path = demo_draft();
  try {
    Engine e(spec);
    FAIL() << "EAGLE3 with --data-parallel-size 2 started";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("--speculative-algorithm is not supported with attention data parallelism"),
              std::string::npos)
        << ex.what();
  }
  EngineOptions hybrid = engine(4096, 2);
  hybrid.model_dir = std::string(TS_SOURCE_DIR) + "/tests/data/qwen3_5";
  try {
    Engine e(hybrid);
    FAIL() << "a hybrid model with --data-parallel-size 2 started";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("recurrent state"), std::string::npos) << ex.what();
  }
}

// The runner's DP step directly: chunks of both groups in one step, in an order that interleaves
// them (group 1, group 0, group 1), each rank running only its group's chunks on its own pool
// (block ids minus the group's first id); the returned logits are every chunk's rows in chunk
// order and equal one rank's. A later step where group 0 has nothing runs it as a zero-token
// forward beside group 1's decode (MoE EP dispatch needs both ranks).
TEST(ModelRunnerDp, ChunksOfBothGroupsInOneStepEqualOneRank) {
  const io::ModelConfig cfg = io::load_config(fixture());
  models::LoadOptions lo;
  lo.device = Device::cpu;
  ModelRunner one(models::create_model(cfg, lo), 16, 16);
  parallel::ParallelOptions p;
  p.dp_size = 2;
  p.ep_size = 2;
  TpModels tpm = load_tp_models(cfg, lo, p);
  std::unique_ptr<ModelRunner> dp = make_tp_runner(tpm, /*num_blocks=*/8, /*block_size=*/16);
  ASSERT_EQ(dp->dp_groups(), 2);
  std::vector<int32_t> a = {5, 17, 3, 99, 42, 7, 8, 250, 11, 64}, b = {1, 2, 3, 4, 5}, c = {300, 301, 302};
  // One rank: each prompt alone in its own blocks.
  std::vector<int32_t> ta1 = {0}, tb1 = {1}, tc1 = {2};
  auto rows = [](const Tensor& t) { return t.to_f32(); };
  Tensor ra = rows(one.run({SeqChunk{a.data(), int(a.size()), 0, &ta1, SeqChunk::Logits::all}}));
  Tensor rb = rows(one.run({SeqChunk{b.data(), int(b.size()), 0, &tb1, SeqChunk::Logits::last}}));
  Tensor rc = rows(one.run({SeqChunk{c.data(), int(c.size()), 0, &tc1, SeqChunk::Logits::last}}));
  // DP: a and c in group 1 (global ids 8..15), b in group 0.
  std::vector<int32_t> ta = {8}, tb = {0}, tc = {9};
  Tensor got = rows(dp->run({SeqChunk{a.data(), int(a.size()), 0, &ta, SeqChunk::Logits::all},
                             SeqChunk{b.data(), int(b.size()), 0, &tb, SeqChunk::Logits::last},
                             SeqChunk{c.data(), int(c.size()), 0, &tc, SeqChunk::Logits::last}}));
  ASSERT_EQ(got.size(0), int64_t(a.size()) + 2);
  auto max_diff = [](const Tensor& x, int64_t xr, const Tensor& y, int64_t yr, int64_t n) {
    float m = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < x.size(1); ++i)
        m = std::max(m, std::fabs(x.ptr<float>()[(xr + r) * x.size(1) + i] - y.ptr<float>()[(yr + r) * y.size(1) + i]));
    return m;
  };
  EXPECT_LT(max_diff(got, 0, ra, 0, int64_t(a.size())), 1e-4f) << "group 1's prefill, every row";
  EXPECT_LT(max_diff(got, int64_t(a.size()), rb, 0, 1), 1e-4f) << "group 0's prefill";
  EXPECT_LT(max_diff(got, int64_t(a.size()) + 1, rc, 0, 1), 1e-4f) << "group 1's second prefill";
  // Group 1 decodes one token of c alone; group 0 runs a zero-token forward.
  int32_t next = 7;
  Tensor rc2 = rows(one.run({SeqChunk{&next, 1, int(c.size()), &tc1, SeqChunk::Logits::last}}));
  Tensor got2 = rows(dp->run({SeqChunk{&next, 1, int(c.size()), &tc, SeqChunk::Logits::last}}));
  ASSERT_EQ(got2.size(0), 1);
  EXPECT_LT(max_diff(got2, 0, rc2, 0, 1), 1e-4f) << "group 1's decode beside an empty group 0";
}
