// The engine on CPU ranks (--device cpu --tp-size 2: two rank threads over the CPU Comm
// backend, the GPU TP worker path): batching, chunked prefill and prefix reuse give
// the TP 1 greedy tokens. Row-parallel sums differ from TP 1 by fp32 rounding only, far below
// the demo model's top-2 logit gaps on these prompts.
#include <gtest/gtest.h>

#include "engine_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {

EngineOptions tp2(EngineOptions o) {
  o.parallel.tp_size = 2;
  return o;
}

}  // namespace

TEST(EngineTp, BatchChunksAndPrefixReuseEqualTp1) {
  Engine ref(small_engine());
  ref.start();
  auto prompts = code_prompts(ref, 4);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 6));
  auto solo = run_all(ref, ps, false);

  EngineOptions o = tp2(small_engine());
  o.chunked_prefill_size = 7;  // several prefill chunks per prompt, mixed with decodes
  Engine e(o);
  e.start();
  expect_batched_then_cached_equal(e, ps, solo);
}

// Retraction under a tiny pool at TP 2: every rank's pool loses the same blocks at the same step
// (one KvCache drives them all), and the recomputed requests give the TP 1 tokens.
TEST(EngineTp, RetractionEqualsTp1) {
  Engine ref(small_engine());
  ref.start();
  auto prompts = code_prompts(ref, 4);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 24));
  auto solo = run_all(ref, ps, false);

  Engine e(tp2(small_engine(/*pool_tokens=*/128, /*block=*/16)));
  e.start();
  auto conc = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
    EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "prompt " << i;
  }
  EXPECT_GT(e.metrics().retractions, 0);
}

namespace {

EngineOptions eagle3(EngineOptions o) {
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = demo_draft();
  o.speculative_num_steps = 3;
  return o;
}

// Greedy EAGLE3 requests with their traces (drafts and accepted count per verify).
std::vector<Result> spec_run(Engine& e, const std::vector<std::vector<int32_t>>& prompts, bool concurrent) {
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) {
    ps.push_back(greedy(p, 24));
    ps.back().return_spec_trace = true;
  }
  return run_all(e, ps, concurrent);
}

}  // namespace

// EAGLE3 on a TP 2 target (CPU ranks): the draft runs on rank 0 with the target's embedding
// layout — rebuilt as a replicated table when the target's is vocab-parallel (the default at
// TP 2), shared when the target replicates it (--replicate-embedding). Either way every
// iteration's drafts and accepted counts equal TP 1's (the target logits differ from TP 1 by
// fp32 rounding only, far below the demo pair's top-2 gaps), and the tokens equal plain decoding.
TEST(EngineTp, Eagle3EqualsTp1Eagle3AndPlain) {
  Engine plain(small_engine());
  plain.start();
  auto prompts = code_prompts(plain, 3);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 24));
  auto want = run_all(plain, ps, false);

  Engine spec1(eagle3(small_engine()));
  spec1.start();
  auto tp1 = spec_run(spec1, prompts, false);
  for (bool replicate : {false, true}) {
    EngineOptions o = eagle3(tp2(small_engine()));
    o.replicate_embedding = replicate;
    o.chunked_prefill_size = 9;  // prefill chunks mixed with speculative decodes
    Engine e(o);
    e.start();
    for (bool concurrent : {false, true}) {
      auto got = spec_run(e, prompts, concurrent);
      for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE(testing::Message() << "replicate " << replicate << " concurrent " << concurrent << " prompt " << i);
        EXPECT_TRUE(got[i].error.empty()) << got[i].error;
        EXPECT_EQ(got[i].tokens, want[i].tokens) << "EAGLE3 at TP 2 vs plain TP 1";
        EXPECT_FALSE(got[i].trace.empty());
        if (!concurrent) {
          EXPECT_EQ(got[i].trace, tp1[i].trace) << "drafts / accepted per verify vs TP 1";
        }
      }
    }
  }
}
