// Overlap scheduling on the CPU (the same loop the GPU runs: steps staged by the engine thread,
// run on the device thread, applied one step late): greedy outputs equal the simple loop's
// (--disable-overlap-schedule) under EOS / stop ids / max_tokens, retraction, aborts and
// host-logit requests that force the simple loop, also for grammar-constrained requests; steps
// really overlap; nothing leaks.
#include <gtest/gtest.h>

#include <thread>

#include "engine_test_util.h"
#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "runtime/structured.h"

using namespace ts;
using namespace ts::test;

namespace {

EngineOptions opts(bool overlap, int64_t pool = 16384) {
  EngineOptions o = small_engine(pool, 16);
  o.disable_overlap_schedule = !overlap;
  return o;
}

// Mixed finish conditions: EOS honoured (some), a stop id (some), max_tokens 1..24.
std::vector<GenerateParams> mixed_params(const Engine& e, int n, const std::vector<Result>* ref = nullptr) {
  auto prompts = code_prompts(e, n);
  std::vector<GenerateParams> ps;
  for (int i = 0; i < n; ++i) {
    GenerateParams p = greedy(prompts[size_t(i)], 1 + (i * 7) % 16);
    p.ignore_eos = i % 3 == 0;
    if (ref && i % 4 == 1 && (*ref)[size_t(i)].tokens.size() > 3) p.stop_token_ids = {(*ref)[size_t(i)].tokens[2]};
    ps.push_back(p);
  }
  return ps;
}

std::vector<Result> run_concurrent(Engine& e, const std::vector<GenerateParams>& ps) {
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) st.push_back(e.submit(p));
  std::vector<Result> out;
  for (auto& s : st) out.push_back(collect(s));
  return out;
}

void wait_idle(Engine& e) {
  for (int i = 0; i < 200 && (e.metrics().running > 0 || e.metrics().kv_used_blocks > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void expect_same(const std::vector<Result>& a, const std::vector<Result>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].error.empty() && b[i].error.empty()) << a[i].error << b[i].error;
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].reason, b[i].reason) << "request " << i;
    EXPECT_EQ(a[i].completion_tokens, b[i].completion_tokens) << "request " << i;
    EXPECT_EQ(a[i].completion_tokens, int(a[i].tokens.size())) << "request " << i;
  }
}

}  // namespace

TEST(Overlap, GreedyEqualsSimpleLoopUnderStops) {
  Engine simple(opts(false)), over(opts(true));
  simple.start();
  over.start();
  auto ref0 = run_concurrent(simple, mixed_params(simple, 16));
  auto ps = mixed_params(simple, 16, &ref0);  // now with stop ids taken from the outputs
  auto a = run_concurrent(simple, ps);
  auto b = run_concurrent(over, ps);
  expect_same(a, b);
  int stops = 0;
  for (auto& r : b) stops += r.reason == FinishReason::stop;
  EXPECT_GT(stops, 0);  // the stop-id / EOS paths were exercised
  wait_idle(over);
  EngineMetrics m = over.metrics(), ms = simple.metrics();
  EXPECT_GT(m.overlap_steps, 0);
  EXPECT_EQ(ms.overlap_steps, 0);
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_EQ(m.running, 0);
  EXPECT_GT(m.device_busy_seconds, 0);
  EXPECT_GE(m.device_idle_seconds, 0);
  // The idle breakdown: by step kind and launch it adds up to the total; the gap histogram
  // counts every counted gap; the simple loop's gaps are all sync ones.
  for (const EngineMetrics* e : {&m, &ms}) {
    double by = 0;
    for (auto& k : e->device_idle_seconds_by) by += k[0] + k[1];
    EXPECT_NEAR(by, e->device_idle_seconds, 1e-9);
    EXPECT_NEAR(e->device_idle_gap_s.sum, e->device_idle_seconds, 1e-9);
    EXPECT_GT(e->device_idle_gap_s.count, 0);
  }
  for (auto& k : ms.device_idle_seconds_by) EXPECT_EQ(k[0], 0.0);
  int64_t made = 0;
  for (auto& r : b) made += r.completion_tokens;
  EXPECT_EQ(m.generation_tokens, made);
}

TEST(Overlap, RetractionEqualsSimpleLoop) {
  Engine simple(opts(false, 256)), over(opts(true, 256));
  simple.start();
  over.start();
  auto prompts = code_prompts(simple, 6);
  std::vector<GenerateParams> ps;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ps.push_back(greedy(prompts[i], 24 + int(i)));
    ps.back().ignore_eos = i % 2 == 0;
  }
  auto a = run_concurrent(simple, ps);
  auto b = run_concurrent(over, ps);
  expect_same(a, b);
  EXPECT_GT(over.metrics().retractions, 0);
  wait_idle(over);
  EXPECT_EQ(over.metrics().kv_used_blocks, 0);
}

TEST(Overlap, AbortsMidFlightLeaveOthersUnchanged) {
  Engine simple(opts(false)), over(opts(true));
  simple.start();
  over.start();
  auto prompts = code_prompts(simple, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 20));
  auto a = run_concurrent(simple, ps);
  // Same set plus long requests cancelled / stopped after their first event.
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) st.push_back(over.submit(p));
  auto c1 = over.submit(greedy(prompts[0], 500));
  auto c2 = over.submit(greedy(prompts[1], 500));
  StreamEvent ev;
  ASSERT_TRUE(c1->pop(ev, 60000));
  c1->cancel();
  ASSERT_TRUE(c2->pop(ev, 60000));
  c2->request_stop();
  std::vector<Result> b;
  for (auto& s : st) b.push_back(collect(s));
  expect_same(a, b);
  Result r1 = collect(c1), r2 = collect(c2);
  EXPECT_EQ(r1.reason, FinishReason::abort);
  EXPECT_EQ(r2.reason, FinishReason::stop);
  EXPECT_LT(r2.completion_tokens, 500);
  wait_idle(over);
  EngineMetrics m = over.metrics();
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_EQ(m.requests_aborted, 1);
  EXPECT_EQ(m.requests_finished, 7);
}

TEST(Overlap, HostLogitRequestsFallBackAndStayEqual) {
  // A penalised request and one with logprobs run the simple loop while they are live; the
  // greedy ones around them keep their outputs, and the penalised one matches the simple loop.
  Engine simple(opts(false)), over(opts(true));
  simple.start();
  over.start();
  auto prompts = code_prompts(simple, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 16));
  ps[2].repetition_penalty = 1.3f;
  ps[4].logprobs = 2;
  auto a = run_concurrent(simple, ps);
  auto b = run_concurrent(over, ps);
  expect_same(a, b);
  ASSERT_EQ(b[4].logprobs.size(), b[4].tokens.size());
  for (size_t i = 0; i < a[4].logprobs.size(); ++i) EXPECT_FLOAT_EQ(a[4].logprobs[i].logprob, b[4].logprobs[i].logprob);
}

TEST(Overlap, MaxTokensOneAndSeededSampling) {
  Engine simple(opts(false)), over(opts(true));
  simple.start();
  over.start();
  auto prompts = code_prompts(simple, 8);
  std::vector<GenerateParams> ps;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateParams p = greedy(prompts[i], i % 2 ? 1 : 9);
    p.temperature = 0.8f;  // device sampling (not host logits): seeded, so reproducible
    p.seed = 1234 + i;
    ps.push_back(p);
  }
  expect_same(run_concurrent(simple, ps), run_concurrent(over, ps));
}

// Grammar-constrained requests (runtime/structured.h, runtime/token_mask.h) in the overlap loop:
// step N+1's forward is launched before step N's token is applied, and only its sampling waits
// for the mask that token leads to. Greedy outputs equal the simple loop's token for token (with
// jump-forward off, so both sample every token), mixed with plain requests, under stops,
// max_tokens, a triggered grammar (tool_choice auto's mechanism) and aborts; and the steps do
// overlap (before, any constrained request forced the simple loop).
namespace {

std::shared_ptr<const StructuredRequest> prepare(Engine& e, grammar::Grammar g, const std::string& key) {
  static std::unique_ptr<GrammarCache> cache;
  if (!cache) cache = std::make_unique<GrammarCache>(e.tokenizer_ptr(), e.eos_token_ids());
  StructuredRequest r;
  r.kind = "test";
  r.key = key;
  r.ir = std::make_shared<const grammar::Grammar>(std::move(g));
  return cache->prepare(r);
}

EngineOptions grammar_opts(bool overlap, int64_t pool = 16384) {
  EngineOptions o = opts(overlap, pool);
  o.disable_jump_forward = true;
  return o;
}

constexpr const char* kObjSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},)"
    R"("age":{"type":"integer","minimum":0,"maximum":99},"kind":{"enum":["def","class","lambda"]}},)"
    R"("required":["name","age","kind"],"additionalProperties":false})";

std::vector<GenerateParams> grammar_params(Engine& e, int n) {
  auto schema = prepare(e, grammar::json_schema_grammar(std::string_view(kObjSchema), grammar::JsonSchemaOptions{true, false}),
                        "overlap-schema");
  auto re = prepare(e, grammar::regex_grammar("(ab|cd)[0-9]{2,6}( [a-z]+){1,3}"), "overlap-regex");
  auto ch = prepare(e, grammar::choice_grammar({"return None", "return self", "raise ValueError"}), "overlap-choice");
  auto base = prepare(e, grammar::regex_grammar(" (given|first|second) [a-z]{1,10}\\."), "overlap-trigger");
  auto trig = std::make_shared<StructuredRequest>(*base);
  trig->trigger = "of the";  // free text; after "of the" the grammar, then free text again
  auto prompts = code_prompts(e, n);
  std::vector<GenerateParams> ps;
  for (int i = 0; i < n; ++i) {
    GenerateParams p = greedy(prompts[size_t(i)], 8 + (i * 11) % 48);
    p.ignore_eos = false;
    switch (i % 5) {
      case 0: p.structured = schema; break;
      case 1: p.structured = re; break;
      case 2: p.structured = ch; break;
      case 3: p.structured = trig; break;
      default: break;  // plain, in the same batches
    }
    ps.push_back(p);
  }
  return ps;
}

}  // namespace

TEST(Overlap, GrammarRequestsOverlapAndEqualSimpleLoop) {
  Engine simple(grammar_opts(false)), over(grammar_opts(true));
  simple.start();
  over.start();
  auto ps = grammar_params(simple, 15);
  auto a = run_concurrent(simple, ps);
  auto b = run_concurrent(over, ps);
  expect_same(a, b);
  // Some constrained requests ended by their grammar (stop), some by max_tokens.
  int stops = 0, lengths = 0;
  for (size_t i = 0; i < b.size(); ++i)
    if (ps[i].structured) (b[i].reason == FinishReason::stop ? stops : lengths)++;
  EXPECT_GT(stops, 0);
  EXPECT_GT(lengths, 0);
  wait_idle(over);
  EngineMetrics m = over.metrics();
  EXPECT_EQ(m.kv_used_blocks, 0);
  EXPECT_EQ(m.running, 0);

  // Constrained requests alone: the overlap loop runs them (steps launched while one is in flight).
  std::vector<GenerateParams> only;
  for (auto& p : ps)
    if (p.structured) only.push_back(p);
  const int64_t before = over.metrics().overlap_steps;
  auto c = run_concurrent(over, only);
  auto d = run_concurrent(simple, only);
  expect_same(d, c);
  EXPECT_GT(over.metrics().overlap_steps - before, int64_t(only.size()));
}

TEST(Overlap, GrammarRequestsSequentialAndRetractedEqualSimpleLoop) {
  // One at a time (each step a single constrained row: the device thread waits for every mask),
  // then a pool so small that constrained requests are retracted and recomputed.
  for (int64_t pool : {16384, 256}) {
    Engine simple(grammar_opts(false, pool)), over(grammar_opts(true, pool));
    simple.start();
    over.start();
    auto ps = grammar_params(simple, 6);
    if (pool == 16384) expect_same(run_all(simple, ps, false), run_all(over, ps, false));
    else expect_same(run_concurrent(simple, ps), run_concurrent(over, ps));
    wait_idle(over);
    EXPECT_EQ(over.metrics().kv_used_blocks, 0);
  }
}

TEST(Overlap, GrammarRequestsAbortedMidFlight) {
  // Cancelled and client-stopped constrained requests while their next step is in flight: the
  // device thread waiting for their masks is released (closed), the others are unchanged.
  Engine simple(grammar_opts(false)), over(grammar_opts(true));
  simple.start();
  over.start();
  auto ps = grammar_params(simple, 5);
  auto a = run_concurrent(simple, ps);
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) st.push_back(over.submit(p));
  GenerateParams longer = ps[3];  // the triggered grammar: free text with masks now and then
  longer.max_tokens = 400;
  longer.ignore_eos = true;
  auto c1 = over.submit(longer);
  GenerateParams longer2 = ps[1];
  longer2.max_tokens = 400;
  auto c2 = over.submit(longer2);
  StreamEvent ev;
  ASSERT_TRUE(c1->pop(ev, 60000));
  c1->cancel();
  ASSERT_TRUE(c2->pop(ev, 60000));
  c2->request_stop();
  std::vector<Result> b;
  for (auto& s : st) b.push_back(collect(s));
  expect_same(a, b);
  EXPECT_EQ(collect(c1).reason, FinishReason::abort);
  EXPECT_TRUE(collect(c2).error.empty());
  wait_idle(over);
  EXPECT_EQ(over.metrics().kv_used_blocks, 0);
}
