// --enable-mixed-batch with the automatic budget (runtime/mixed_budget.h) through the engine on
// the CPU: the engine feeds its steps' times to the cost model, the scheduler asks it per step
// (one decode-only probe per new batch size, then measured chunks), a request that arrives while
// others decode is prefilled beside them (it finishes long before they do), and greedy outputs
// equal solo runs without mixing (overlap loop and simple loop).
#include <gtest/gtest.h>

#include <utility>

#include "engine_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {

std::vector<Result> staggered(Engine& e, const std::vector<GenerateParams>& early, const GenerateParams& late,
                              int& running_when_late_done) {
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : early) st.push_back(e.submit(p));
  // Every early request decodes before the late one arrives.
  std::vector<Result> out(early.size() + 1);
  for (size_t i = 0; i < st.size(); ++i) {
    StreamEvent ev;
    while (out[i].tokens.size() < 2 && st[i]->pop(ev, 60000)) {
      out[i].tokens.insert(out[i].tokens.end(), ev.tokens.begin(), ev.tokens.end());
      EXPECT_FALSE(ev.finished);
    }
  }
  out.back() = collect(e.submit(late));
  running_when_late_done = e.metrics().running;
  for (size_t i = 0; i < st.size(); ++i) {
    Result rest = collect(st[i]);
    out[i].tokens.insert(out[i].tokens.end(), rest.tokens.begin(), rest.tokens.end());
    out[i].error = rest.error;
  }
  return out;
}

}  // namespace

TEST(MixedBatchEngine, AutomaticBudgetPrefillsBesideDecodesAndKeepsOutputs) {
  Engine solo(small_engine());
  solo.start();
  auto prompts = code_prompts(solo, 5);
  std::vector<GenerateParams> early;
  for (int i = 0; i < 4; ++i) {
    GenerateParams p = greedy(prompts[size_t(i)], 120);
    p.ignore_eos = true;
    early.push_back(p);
  }
  std::vector<int32_t> long_prompt;
  for (auto& q : prompts) long_prompt.insert(long_prompt.end(), q.begin(), q.end());
  GenerateParams late = greedy(long_prompt, 4);
  late.ignore_eos = true;
  std::vector<GenerateParams> all = early;
  all.push_back(late);
  const std::vector<Result> ref = run_all(solo, all, false);
  // The third run aligns each step's rows to 64 (--mixed-align-tokens): same outputs.
  for (auto [overlap, align] : {std::pair{true, 0}, std::pair{false, 0}, std::pair{true, 64}}) {
    EngineOptions o = small_engine();
    o.enable_mixed_batch = true;  // --mixed-prefill-tokens 0: automatic
    o.disable_overlap_schedule = !overlap;
    o.mixed_align_tokens = align;
    Engine e(o);
    e.start();
    int running = 0;
    const std::vector<Result> got = staggered(e, early, late, running);
    EXPECT_GE(running, 1) << "the late request must be prefilled while the early ones decode (overlap " << overlap << ")";
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].error.empty()) << got[i].error;
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i << " (overlap " << overlap << ")";
    }
    // The steps by kind (/metrics: tokenspeed_engine_steps_by_kind_total): decode-only steps,
    // and the late prompt's chunks beside decodes as mixed steps; every prompt token counted.
    const EngineMetrics m = e.metrics();
    EXPECT_GE(m.steps_by_kind[0], 1);
    EXPECT_GE(m.steps_by_kind[1], 1) << "no mixed step (overlap " << overlap << ")";
    EXPECT_LE(m.steps_by_kind[0] + m.steps_by_kind[1] + m.steps_by_kind[2], m.steps);
    EXPECT_GT(m.step_seconds_by_kind[1], 0.0);
    EXPECT_EQ(m.step_prefill_tokens, m.prompt_tokens - m.cached_prompt_tokens);
    EXPECT_GE(m.step_decode_rows, 4 * 100);
  }
}
