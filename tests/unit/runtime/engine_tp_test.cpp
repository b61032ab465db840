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
  auto batch = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(batch[i].error.empty()) << batch[i].error;
    EXPECT_EQ(batch[i].tokens, solo[i].tokens) << "batched, prompt " << i;
  }
  // Again: full blocks now come from the prefix cache.
  auto again = run_all(e, ps, true);
  int cached = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(again[i].tokens, solo[i].tokens) << "cached prefix, prompt " << i;
    cached += again[i].cached_tokens;
  }
  EXPECT_GT(cached, 0);
}
