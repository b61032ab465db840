// Attention data parallelism in the engine (--device cpu --data-parallel-size 2: two DP groups
// of CPU ranks, one scheduler placing each request in a group, the KV cache partitioned per
// group) on the DeepSeek-V3 fixture (MLA + MoE): batched, chunked, prefix-reusing and retracting
// runs give DP 1's greedy tokens, with the MoE layers over both groups either as MoE TP (the
// groups' tokens gathered) or as EP (dispatch / combine), and with attention TP inside the groups.
#include <gtest/gtest.h>

#include "engine_test_util.h"

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
    auto batch = run_all(e, ps, true);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(batch[i].error.empty()) << batch[i].error;
      EXPECT_EQ(batch[i].tokens, solo[i].tokens) << "batched, prompt " << i;
    }
    // Again: the full blocks come from the prefix cache of the group that holds them.
    auto again = run_all(e, ps, true);
    int cached = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(again[i].tokens, solo[i].tokens) << "cached prefix, prompt " << i;
      cached += again[i].cached_tokens;
    }
    EXPECT_GT(cached, 0);
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
