// --enable-deterministic-inference on the CPU backend: a request's tokens AND its logprobs (the
// f32 bits) equal its solo run's under load -- batched with others, its prompt cut into small
// chunks, prefilled beside decodes (mixed batches), retracted from a tiny KV pool and
// recomputed, served from the prefix cache. The CPU ops are batch-invariant by construction (one
// dot order per output element, one pass per attention row); this pins the property the flag
// promises, on the engine paths that would break it. The CUDA twin is
// tests/cuda/deterministic_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "engine_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {

GenerateParams with_logprobs(std::vector<int32_t> prompt, int max_tokens) {
  GenerateParams p = greedy(std::move(prompt), max_tokens);
  p.logprobs = 3;
  return p;
}

// Bitwise equality of the sampled ids' and the top-3 logprobs.
void expect_same_bits(const Result& got, const Result& want, const std::string& what) {
  ASSERT_TRUE(got.error.empty()) << what << ": " << got.error;
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    const TokenLogprob &g = got.logprobs[i], &w = want.logprobs[i];
    EXPECT_EQ(std::memcmp(&g.logprob, &w.logprob, sizeof(float)), 0)
        << what << ": token " << i << " logprob " << g.logprob << " vs " << w.logprob;
    ASSERT_EQ(g.top.size(), w.top.size()) << what;
    for (size_t k = 0; k < g.top.size(); ++k) {
      EXPECT_EQ(g.top[k].first, w.top[k].first) << what << ": token " << i << " top " << k;
      EXPECT_EQ(std::memcmp(&g.top[k].second, &w.top[k].second, sizeof(float)), 0)
          << what << ": token " << i << " top " << k << " " << g.top[k].second << " vs " << w.top[k].second;
    }
  }
}

}  // namespace

TEST(DeterministicInference, LogprobBitsEqualSoloUnderAnyLoad) {
  // Solo: one request at a time, whole prompts in one chunk, default options.
  Engine solo(small_engine());
  solo.start();
  auto prompts = code_prompts(solo, 8);
  std::vector<int32_t> long_prompt;
  for (auto& q : prompts) long_prompt.insert(long_prompt.end(), q.begin(), q.end());
  prompts.push_back(long_prompt);
  prompts.push_back({prompts[0][0]});  // a 1-token context
  std::vector<GenerateParams> ps;
  for (auto& q : prompts) ps.push_back(with_logprobs(q, 24));
  const std::vector<Result> ref = run_all(solo, ps, false);

  struct Load {
    const char* name;
    int64_t pool;
    int chunk;
    bool mixed;
    bool overlap;
  };
  for (const Load& l : {Load{"chunked 32, mixed, overlap", 16384, 32, true, true},
                        Load{"chunked 7, simple loop", 16384, 7, false, false},
                        Load{"tiny pool (retractions)", 512, 64, true, true}}) {
    EngineOptions o = small_engine(l.pool, 16);
    o.enable_deterministic_inference = true;
    o.chunked_prefill_size = l.chunk;
    o.enable_mixed_batch = l.mixed;
    o.disable_overlap_schedule = !l.overlap;
    Engine e(o);
    e.start();
    // The long prompt needs more than the tiny pool; there it runs alone at the end.
    std::vector<GenerateParams> batch = ps;
    if (l.pool < 2048) batch.erase(batch.begin() + 8);
    const std::vector<Result> got = run_all(e, batch, true);
    for (size_t i = 0, j = 0; i < ps.size(); ++i) {
      if (l.pool < 2048 && i == 8) {
        continue;
      }
      expect_same_bits(got[j++], ref[i], std::string(l.name) + ", request " + std::to_string(i));
    }
    if (l.pool < 2048) {
      EXPECT_GT(e.metrics().retractions, 0) << "the tiny pool must retract";
    }
    // Again: now with cached prefixes (the same prompts, concurrently).
    const std::vector<Result> again = run_all(e, batch, true);
    int cached = 0;
    for (size_t i = 0, j = 0; i < ps.size(); ++i) {
      if (l.pool < 2048 && i == 8) {
        continue;
      }
      cached += again[j].cached_tokens;
      expect_same_bits(again[j++], ref[i], std::string(l.name) + ", cached, request " + std::to_string(i));
    }
    EXPECT_GT(cached, 0) << l.name;
  }
}
