// PlainWorker with grammar rows (runtime/token_mask.h): an overlapped step (staged, run on
// another thread, not live) samples a constrained row only once the token before it has been
// accepted -- the forward does not wait, the sampling does -- and under that token's mask.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine_test_util.h"
#include "grammar/ir.h"
#include "models/model.h"
#include "runtime/model_runner.h"
#include "runtime/plain_worker.h"
#include "runtime/request.h"
#include "runtime/structured.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::test;

TEST(PlainWorker, OverlappedSamplingWaitsForTheMaskOfThePreviousToken) {
  models::LoadOptions lo;
  lo.device = Device::cpu;
  std::shared_ptr<models::Model> model = models::load_model(demo_model(), lo);
  ModelRunner runner(model, 64, 16);
  PlainWorker worker(runner);
  auto tok = tok::Tokenizer::load(demo_model());
  GrammarCache cache(tok, {});
  StructuredRequest sr;
  sr.kind = "choice";
  sr.key = "ab|cd";
  sr.ir = std::make_shared<const grammar::Grammar>(grammar::choice_grammar({"ab", "cd"}));
  auto s = cache.prepare(sr);
  const std::vector<int32_t> a = tok->encode("a");
  ASSERT_EQ(a.size(), 1u);

  Request r;
  r.params.temperature = 0;
  r.params.max_tokens = 8;
  r.params.structured = s;
  r.params.jump_forward = false;
  r.constraints = LogitsConstraints::make(r.params, {});
  r.tokens = tok->encode("def f(x):\n    return ");
  r.prompt_len = int(r.tokens.size());
  r.tokens.push_back(a[0]);  // generated, but (as in the overlap loop) not applied yet
  for (int b = 0; b < 4; ++b) r.block_table.push_back(b);
  r.state = state::Prefilling{};
  StepPlan plan;
  plan.chunks.push_back({&r, int(r.tokens.size())});
  StagedStep staged;
  worker.stage(plan, staged);
  ASSERT_TRUE(staged.masks.any);
  ASSERT_EQ(staged.masks.after[0], 1);

  std::atomic<bool> done{false};
  StepResult out;
  std::thread device([&] {
    worker.run_staged(staged, nullptr, out);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the forward is long done by now
  EXPECT_FALSE(done.load()) << "sampled before the token its mask depends on was accepted";
  r.constraints->accept(a[0]);  // the engine thread applies the previous step
  device.join();
  ASSERT_EQ(out.rows.size(), 1u);
  ASSERT_EQ(out.rows[0].count, 1);
  // After "a" the grammar allows only "b" (before it: "a" or "c").
  EXPECT_EQ(tok->decode({out.tokens[0]}), "b");
  r.constraints->close();
}
