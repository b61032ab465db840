// Per-request logits constraints (runtime/structured.h): grammar masks applied to host logits,
// the matcher advancing with accepted tokens, termination, logit_bias, min_tokens, the
// reasoning gate, and sample_batch using them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/structured.h"
#include "runtime/token_mask.h"

namespace ts {
namespace {

// ids 0..255: one byte each; 256 = </s> (the stop id); 257 = <think>, 258 = </think>.
constexpr int32_t kStop = 256, kThink = 257, kThinkEnd = 258, kV = 259;

std::shared_ptr<const grammar::Vocab> vocab() {
  static auto v = [] {
    std::vector<std::string> b(kV);
    for (int i = 0; i < 256; ++i) b[size_t(i)] = std::string(1, char(i));
    b[kStop] = "</s>";
    b[kThink] = "<think>";
    b[kThinkEnd] = "</think>";
    std::vector<bool> excl(kV, false);
    excl[kThink] = excl[kThinkEnd] = true;  // special tokens: never grammar tokens
    return std::make_shared<const grammar::Vocab>(b, excl, std::vector<int32_t>{kStop});
  }();
  return v;
}

std::shared_ptr<const StructuredRequest> structured(const grammar::Grammar& g,
                                                    StructuredRequest::Reasoning r = StructuredRequest::Reasoning::none) {
  auto s = std::make_shared<StructuredRequest>();
  s->kind = "test";
  s->compiled = std::make_shared<const grammar::CompiledGrammar>(g, vocab());
  s->reasoning = r;
  s->think_start = kThink;
  s->think_end = kThinkEnd;
  return s;
}

std::vector<float> flat_logits() { return std::vector<float>(kV, 0.0f); }

int allowed(const std::vector<float>& l) {
  int n = 0;
  for (float x : l) n += x != -INFINITY;
  return n;
}

TEST(Structured, NoConstraintsNoState) {
  GenerateParams p;
  EXPECT_FALSE(has_constraints(p));
  EXPECT_EQ(LogitsConstraints::make(p, {kStop}), nullptr);
}

TEST(Structured, ChoiceMaskAdvancesAndTerminates) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"yes", "no"}));
  auto c = LogitsConstraints::make(p, {kStop});
  ASSERT_NE(c, nullptr);
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 2);  // 'y' or 'n'
  EXPECT_NE(l['y'], -INFINITY);
  EXPECT_NE(l['n'], -INFINITY);
  EXPECT_EQ(l[kStop], -INFINITY);  // the grammar cannot end yet
  for (char ch : std::string("no")) {
    c->accept(ch);
    EXPECT_FALSE(c->grammar_done());
  }
  l = flat_logits();
  c->apply(l.data(), kV, 2);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l[kStop], -INFINITY);  // complete: only the stop id
  c->accept(kStop);
  EXPECT_TRUE(c->grammar_done());
  EXPECT_FALSE(c->failed());
}

TEST(Structured, PaddedVocabularyMasked) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"a"}));
  auto c = LogitsConstraints::make(p, {kStop});
  std::vector<float> l(kV + 40, 0.0f);  // model vocabulary padded past the tokenizer's
  c->apply(l.data(), int64_t(l.size()), 0);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l['a'], -INFINITY);
}

TEST(Structured, RejectedTokenFails) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"a"}));
  auto c = LogitsConstraints::make(p, {kStop});
  c->accept('z');
  EXPECT_TRUE(c->failed());
}

// A state too ambiguous for the matcher to step through (grammar::Stepper's bound) ends the
// output: the mask allows only the stop id, and nothing throws on the engine or mask threads.
TEST(Structured, TooAmbiguousStateAllowsOnlyTheStop) {
  std::string rules = "root ::= \"xy\" r20\nr0 ::= \"a\"\n";
  for (int k = 1; k <= 20; ++k) rules += fmt::format("r{} ::= r{} | r{} \"z\"\n", k, k - 1, k - 1);
  GenerateParams p;
  p.structured = structured(grammar::parse_gbnf(rules));
  auto c = LogitsConstraints::make(p, {kStop});
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l['x'], -INFINITY);
  c->accept('x');  // the state after 'y' is past the bound: the mask walks through it
  l = flat_logits();
  c->apply(l.data(), kV, 1);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l[kStop], -INFINITY);
  EXPECT_FALSE(c->failed());
  c->accept('y');  // a token the (unmasked) caller forced: refused, the request fails
  EXPECT_TRUE(c->failed());
}

TEST(Structured, LogitBiasAndMinTokens) {
  GenerateParams p;
  p.logit_bias = {{5, 3.0f}, {7, -100.0f}};
  p.min_tokens = 2;
  p.stop_token_ids = {9};
  auto c = LogitsConstraints::make(p, {kStop});
  ASSERT_NE(c, nullptr);
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_FLOAT_EQ(l[5], 3.0f);
  EXPECT_FLOAT_EQ(l[7], -100.0f);
  EXPECT_EQ(l[kStop], -INFINITY);  // min_tokens: eos and the request's stop ids masked
  EXPECT_EQ(l[9], -INFINITY);
  l = flat_logits();
  c->apply(l.data(), kV, 2);  // reached
  EXPECT_FLOAT_EQ(l[kStop], 0.0f);
  EXPECT_FLOAT_EQ(l[9], 0.0f);
}

TEST(Structured, BadWords) {
  GenerateParams p;
  // One-token words become -inf biases (device paths too); longer ones ban their last token
  // where the output ends with the rest.
  auto c = LogitsConstraints::make(p, {kStop}, {{'x'}, {'a', 'b', 'c'}});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->has_bad_sequences());
  EXPECT_FALSE(c->device_maskable());
  ASSERT_EQ(c->bias().size(), 1u);
  EXPECT_EQ(c->bias()[0].first, 'x');
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(l['x'], -INFINITY);
  EXPECT_EQ(allowed(l), kV - 1);
  const std::vector<int32_t> out = {'z', 'a', 'b'};
  l = flat_logits();
  c->apply_bad_sequences(l.data(), kV, out.data(), out.size());  // ends with "ab": 'c' banned
  EXPECT_EQ(l['c'], -INFINITY);
  EXPECT_EQ(allowed(l), kV - 1);
  l = flat_logits();
  c->apply_bad_sequences(l.data(), kV, out.data(), 2);  // "za": nothing
  EXPECT_EQ(allowed(l), kV);
  l = flat_logits();
  c->apply_bad_sequences(l.data(), kV, out.data() + 1, 1);  // "a" alone: shorter than the prefix
  EXPECT_EQ(allowed(l), kV);
  // No bad words, nothing else: no constraints object at all.
  EXPECT_FALSE(LogitsConstraints::make(p, {kStop}, {}));
}

TEST(Structured, GrammarWinsOverMinTokens) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"a"}));
  p.min_tokens = 10;
  auto c = LogitsConstraints::make(p, {kStop});
  c->accept('a');
  auto l = flat_logits();
  c->apply(l.data(), kV, 1);
  EXPECT_EQ(allowed(l), 1);  // only the stop id: never an all -inf row
  EXPECT_NE(l[kStop], -INFINITY);
}

TEST(Structured, Qwen3ReasoningGate) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"ok"}), StructuredRequest::Reasoning::qwen3);
  auto c = LogitsConstraints::make(p, {kStop});
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 2);  // 'o' or <think>
  EXPECT_NE(l[kThink], -INFINITY);
  c->accept(kThink);
  l = flat_logits();
  c->apply(l.data(), kV, 1);
  EXPECT_EQ(allowed(l), kV);  // inside the reasoning: free
  c->accept('x');
  c->accept(kThinkEnd);
  l = flat_logits();
  c->apply(l.data(), kV, 3);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l['o'], -INFINITY);
  c->accept('o');
  c->accept('k');
  c->accept(kStop);
  EXPECT_TRUE(c->grammar_done());
}

TEST(Structured, Qwen3WithoutThinkingStartsAtOnce) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"ok"}), StructuredRequest::Reasoning::qwen3);
  auto c = LogitsConstraints::make(p, {kStop});
  c->accept('o');
  auto l = flat_logits();
  c->apply(l.data(), kV, 1);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l['k'], -INFINITY);
}

TEST(Structured, DeepseekR1StartsInsideReasoning) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"ok"}), StructuredRequest::Reasoning::deepseek_r1);
  auto c = LogitsConstraints::make(p, {kStop});
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), kV);
  c->accept(kThinkEnd);
  l = flat_logits();
  c->apply(l.data(), kV, 1);
  EXPECT_EQ(allowed(l), 1);
}

// sample_batch: greedy and seeded sampling both follow the grammar, for every sample of n.
TEST(Structured, SampleBatchFollowsJsonSchema) {
  auto g = grammar::json_schema_grammar(
      std::string_view(R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},)"
                       R"("ok":{"type":"boolean"}},"required":["n","ok"]})"),
      grammar::JsonSchemaOptions{true, false});
  auto s = structured(g);
  for (float temp : {0.0f, 1.0f}) {
    std::vector<Request> reqs(3);
    std::vector<const Request*> ptrs;
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].params.structured = s;
      reqs[i].params.temperature = temp;
      reqs[i].seed = 1234 + i;
      reqs[i].tokens = {1, 2};
      reqs[i].prompt_len = 2;
      reqs[i].constraints = LogitsConstraints::make(reqs[i].params, {kStop});
      ptrs.push_back(&reqs[i]);
    }
    std::vector<std::string> out(reqs.size());
    std::vector<bool> done(reqs.size(), false);
    for (int step = 0; step < 40; ++step) {
      Tensor logits = Tensor::empty({int64_t(reqs.size()), kV}, DType::f32, Device::cpu);
      for (int64_t i = 0; i < logits.numel(); ++i) logits.ptr<float>()[i] = float((i * 7919) % 13) * 0.3f;
      std::vector<SampleResult> res;
      sample_batch(logits, ptrs, res);
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (done[i]) continue;
        int32_t t = res[i].token;
        reqs[i].tokens.push_back(t);
        reqs[i].constraints->accept(t);
        ASSERT_FALSE(reqs[i].constraints->failed());
        if (t == kStop) done[i] = true;
        else out[i] += char(t);
      }
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(done[i]) << out[i];
      EXPECT_TRUE(reqs[i].constraints->grammar_done());
      auto j = nlohmann::json::parse(out[i]);
      EXPECT_TRUE(j["n"].is_number_integer()) << out[i];
      EXPECT_TRUE(j["ok"].is_boolean()) << out[i];
      EXPECT_LE(j["n"].get<int>(), 99);
    }
  }
}

// tool_choice auto: free text until the trigger, then the grammar up to its end tag, then free
// text again (repeat) or only a stop id (no repeat).
std::shared_ptr<LogitsConstraints> triggered(bool repeat) {
  auto s = std::make_shared<StructuredRequest>(*structured(grammar::choice_grammar({"\nA\n</tc>", "\nBB\n</tc>"})));
  s->trigger = "<tc>";
  s->trigger_repeat = repeat;
  GenerateParams p;
  p.structured = s;
  return LogitsConstraints::make(p, {kStop});
}

int allowed_after(LogitsConstraints& c) {
  auto l = flat_logits();
  c.apply(l.data(), kV, 0);
  return allowed(l);
}

void feed(LogitsConstraints& c, const std::string& s) {
  for (char ch : s) c.accept(uint8_t(ch));
}

TEST(Structured, TriggeredGrammarFreeTextThenCallThenFreeText) {
  auto c = triggered(true);
  EXPECT_EQ(allowed_after(*c), kV);  // free text: no mask
  feed(*c, "hi <t <tc");            // a broken trigger, then a trigger prefix
  EXPECT_EQ(allowed_after(*c), kV);
  feed(*c, ">");  // the trigger: the grammar starts
  EXPECT_EQ(allowed_after(*c), 1);  // '\n'
  feed(*c, "\nB");
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l['B'], -INFINITY);
  feed(*c, "B\n</tc");
  EXPECT_EQ(allowed_after(*c), 1);  // '>' only: no stop id inside a call
  feed(*c, ">");
  EXPECT_EQ(allowed_after(*c), kV);  // free text again
  feed(*c, "ok <tc>\nA\n</tc>");     // a second call, from a fresh matcher
  EXPECT_EQ(allowed_after(*c), kV);
  EXPECT_FALSE(c->failed());
  EXPECT_FALSE(c->grammar_done());
}

TEST(Structured, TriggeredGrammarWithoutRepeatEndsAfterOneCall) {
  auto c = triggered(false);
  feed(*c, "<tc>\nA\n</tc>");
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l[kStop], -INFINITY);  // parallel_tool_calls false: only the end
  c->accept(kStop);
  EXPECT_TRUE(c->grammar_done());
}

// trigger_at_start (llama3 tool calls): the grammar starts only when the output's first bytes
// (after whitespace) are the trigger, which is the grammar's first byte; any other start leaves
// the whole output free, even if the trigger appears later.
std::shared_ptr<LogitsConstraints> triggered_at_start() {
  auto s = std::make_shared<StructuredRequest>(*structured(grammar::choice_grammar({"{A}", "{BB}"})));
  s->trigger = "{";
  s->trigger_at_start = s->trigger_in_grammar = true;
  s->trigger_repeat = false;
  GenerateParams p;
  p.structured = s;
  return LogitsConstraints::make(p, {kStop});
}

TEST(Structured, TriggerAtStartEntersTheGrammarWithTheTriggerByte) {
  auto c = triggered_at_start();
  EXPECT_EQ(allowed_after(*c), kV);
  feed(*c, " \n");                    // leading whitespace: still at the start
  EXPECT_EQ(allowed_after(*c), kV);
  feed(*c, "{");                      // the trigger, fed to the grammar: 'A' or 'B' next
  EXPECT_EQ(allowed_after(*c), 2);
  feed(*c, "BB}");
  auto l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 1);
  EXPECT_NE(l[kStop], -INFINITY);     // then only the end
  c->accept(kStop);
  EXPECT_TRUE(c->grammar_done());
  EXPECT_FALSE(c->failed());
}

TEST(Structured, TriggerAtStartElsewhereIsFreeText) {
  auto c = triggered_at_start();
  feed(*c, "Sure: {");  // the trigger later in the text: free text to the end
  EXPECT_EQ(allowed_after(*c), kV);
  feed(*c, "not a call} {");
  EXPECT_EQ(allowed_after(*c), kV);
  EXPECT_FALSE(c->failed());
  // A speculative walk from the start enters the grammar and rolls back to the start.
  auto d = triggered_at_start();
  d->spec_begin();
  EXPECT_TRUE(d->spec_advance('{'));
  auto l = flat_logits();
  d->spec_apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 2);
  d->spec_end();
  EXPECT_EQ(allowed_after(*d), kV);  // back at the start: free until the first byte
  feed(*d, "{A");
  EXPECT_EQ(allowed_after(*d), 1);   // '}'
}

// The speculative walk (spec_begin .. spec_end) masks each position with the state after the
// drafts before it, stops where a triggered match ends, and leaves no trace.
TEST(Structured, SpecWalkMasksAndRollsBack) {
  auto c = triggered(true);
  feed(*c, "x");
  c->spec_begin();
  auto l = flat_logits();
  c->spec_apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), kV);
  for (char ch : std::string("<tc>\n")) EXPECT_TRUE(c->spec_advance(uint8_t(ch)));
  l = flat_logits();
  c->spec_apply(l.data(), kV, 0);  // after "<tc>\n": 'A' or 'B'
  EXPECT_EQ(allowed(l), 2);
  for (char ch : std::string("A\n</tc")) EXPECT_TRUE(c->spec_advance(uint8_t(ch)));
  EXPECT_FALSE(c->spec_advance('>'));  // the match ended: the next one needs a fresh matcher
  l = flat_logits();
  c->spec_apply(l.data(), kV, 0);  // the bonus position: free text
  EXPECT_EQ(allowed(l), kV);
  c->spec_end();
  EXPECT_EQ(allowed_after(*c), kV);  // back to free text after "x"
  feed(*c, "<tc>\n");
  l = flat_logits();
  c->apply(l.data(), kV, 0);
  EXPECT_EQ(allowed(l), 2);
  // A walk inside the grammar: a draft the grammar rejects ends it; the state is restored.
  c->spec_begin();
  EXPECT_TRUE(c->spec_advance('B'));
  EXPECT_FALSE(c->spec_advance('Z'));
  c->spec_end();
  EXPECT_FALSE(c->failed());
  feed(*c, "A\n</tc>");
  EXPECT_FALSE(c->failed());
  EXPECT_EQ(allowed_after(*c), kV);
}

// The overlap loop's device thread asks for the mask of the state after N accepted tokens
// (mask_after) while the engine thread may not have accepted the N-th yet: it waits for it, gets
// that state's mask, and is released by close() (the request ended) with no mask.
TEST(Structured, MaskAfterWaitsForTheAcceptedToken) {
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"yes", "no"}));
  auto c = LogitsConstraints::make(p, {kStop});
  const int64_t words = c->mask_words();
  std::vector<uint32_t> row(size_t(words), 0);
  ASSERT_TRUE(c->mask_after(0, row.data(), words));  // the first position: 'y' or 'n'
  auto bits = [&] {
    int n = 0;
    for (uint32_t w : row) n += __builtin_popcount(w);
    return n;
  };
  EXPECT_EQ(bits(), 2);
  std::atomic<bool> done{false};
  bool got = false;
  std::thread waiter([&] {
    got = c->mask_after(1, row.data(), words);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load());  // token 1 is not accepted yet
  c->accept('n');
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(bits(), 1);  // after "n": only 'o'
  EXPECT_TRUE((row['o' >> 5] >> ('o' & 31)) & 1u);
  EXPECT_EQ(c->accepted(), 1);
  // close(): a waiter for a token that never comes is released without a mask.
  done = false;
  std::thread stuck([&] {
    got = c->mask_after(5, row.data(), words);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done.load());
  c->close();
  stuck.join();
  EXPECT_FALSE(got);
}

TEST(Structured, MaskAfterHasNoMaskInFreeTextOrAfterTheEnd) {
  auto c = triggered(true);
  const int64_t words = c->mask_words();
  std::vector<uint32_t> row(size_t(words), 7);
  EXPECT_FALSE(c->mask_after(0, row.data(), words));  // free text before the trigger
  EXPECT_EQ(row[0], 7u);                              // untouched
  feed(*c, "<tc>\n");
  EXPECT_TRUE(c->mask_after(c->accepted(), row.data(), words));
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"a"}));
  auto d = LogitsConstraints::make(p, {kStop});
  d->accept('a');
  d->accept(kStop);
  EXPECT_TRUE(d->grammar_done());
  EXPECT_FALSE(d->mask_after(2, row.data(), words));
}

// The step's mask rows (runtime/token_mask.h) on the CPU backend: grammar rows get their mask
// (ids past the tokenizer's vocabulary masked), the others all-ones, and rows masked by one step
// are all-ones again in the next.
TEST(Structured, TokenMaskBufferRows) {
  const int64_t V = 300, W = (V + 31) / 32;  // a model vocabulary padded past the tokenizer's
  TokenMaskBuffer buf(4, V, Device::cpu);
  EXPECT_EQ(buf.words(), W);
  GenerateParams p;
  p.structured = structured(grammar::choice_grammar({"yes", "no"}));
  StepMasks m;
  m.cons = {LogitsConstraints::make(p, {kStop}), nullptr, LogitsConstraints::make(p, {kStop})};
  m.after = {0, 0, 0};
  m.any = true;
  buf.upload(m);
  Tensor t = buf.rows(3);
  auto bit = [&](int64_t r, int64_t id) { return (t.ptr<uint32_t>()[r * W + (id >> 5)] >> (id & 31)) & 1u; };
  for (int64_t r : {0, 2}) {
    int n = 0;
    for (int64_t id = 0; id < V; ++id) n += bit(r, id);
    EXPECT_EQ(n, 2) << "row " << r;
    EXPECT_TRUE(bit(r, 'y') && bit(r, 'n'));
  }
  for (int64_t id = 0; id < V; ++id) ASSERT_TRUE(bit(1, id));
  StepMasks none;
  none.cons = {nullptr, nullptr, nullptr, nullptr};
  none.after = {0, 0, 0, 0};
  buf.upload(none);
  t = buf.rows(4);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t id = 0; id < V; ++id) ASSERT_TRUE(bit(r, id)) << r << " " << id;
}

}  // namespace
}  // namespace ts
