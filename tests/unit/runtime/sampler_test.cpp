// greedy_without_logits: the requests whose steps may skip the logits (the fused greedy LM head,
// ModelRunner::run_greedy) are exactly the plain greedy ones; anything that reads or changes
// the logits (sampling, logprobs, penalties, logit_bias, min_tokens, a grammar) keeps them.
#include <gtest/gtest.h>

#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/structured.h"

namespace ts {

TEST(Sampler, GreedyWithoutLogits) {
  Request r;
  r.params.temperature = 0.0f;
  EXPECT_TRUE(greedy_without_logits(r));
  auto with = [&](auto change) {
    Request q = r;
    change(q);
    return greedy_without_logits(q);
  };
  EXPECT_FALSE(with([](Request& q) { q.params.temperature = 0.7f; }));
  EXPECT_FALSE(with([](Request& q) { q.params.logprobs = 0; }));
  EXPECT_FALSE(with([](Request& q) { q.params.repetition_penalty = 1.1f; }));
  EXPECT_FALSE(with([](Request& q) { q.params.presence_penalty = 0.5f; }));
  EXPECT_FALSE(with([](Request& q) { q.params.frequency_penalty = -0.5f; }));
  EXPECT_FALSE(with([](Request& q) { q.params.logit_bias = {{3, 1.0f}}; }));
  EXPECT_FALSE(with([](Request& q) { q.params.min_tokens = 4; }));
  // top-k / top-p / min-p do not matter at temperature 0 (greedy ignores them, as ops::sample does).
  EXPECT_TRUE(with([](Request& q) {
    q.params.top_k = 5;
    q.params.top_p = 0.5f;
  }));
}

}  // namespace ts
