// Jump-forward decoding (runtime/structured.h): the forced bytes' tokenization (whole UTF-8
// characters, the last token kept back where it could grow), the forced run a request's
// constraints take and the mask after it; through the engine: fewer steps, outputs that still
// follow the schema, forced tokens counted as completion tokens, streamed text equal to the
// tokens' text, the run cut by max_tokens; and --disable-jump-forward.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine_test_util.h"
#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "runtime/structured.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::test;

namespace {

constexpr const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},)"
    R"("age":{"type":"integer","minimum":0,"maximum":99},"kind":{"enum":["def","class","lambda"]}},)"
    R"("required":["name","age","kind"],"additionalProperties":false})";

std::shared_ptr<const tok::Tokenizer> demo_tok() {
  static std::shared_ptr<const tok::Tokenizer> t = tok::Tokenizer::load(demo_model());
  return t;
}

std::shared_ptr<const StructuredRequest> prepare(GrammarCache& cache, const std::string& schema) {
  StructuredRequest r;
  r.kind = "json_schema";
  r.key = schema;
  r.ir = std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(
      nlohmann::ordered_json::parse(schema), grammar::JsonSchemaOptions{.strict = true, .any_whitespace = false}));
  return cache.prepare(r);
}

void expect_schema(const std::string& text) {
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j.size(), 3u) << text;
  EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 8) << text;
  EXPECT_TRUE(j["age"].is_number_integer() && j["age"].get<int>() >= 0 && j["age"].get<int>() <= 99) << text;
  EXPECT_TRUE(j["kind"] == "def" || j["kind"] == "class" || j["kind"] == "lambda") << text;
}

}  // namespace

TEST(JumpForward, ForcedTokensCutAtCharactersAndKeepTheLastBack) {
  auto tok = demo_tok();
  auto vocab = grammar::Vocab::from_tokenizer(*tok);
  const std::string run = "{\"name\":\"";
  std::vector<int32_t> all = tok->encode(run), ids = forced_tokens(*tok, *vocab, run);
  ASSERT_FALSE(all.empty());
  // Exactly the tokenizer's ids, without the last one when a longer token starts with it.
  std::vector<int32_t> want = all;
  if (vocab->extendable(all.back())) want.pop_back();
  EXPECT_EQ(ids, want);
  EXPECT_TRUE(run.starts_with(tok->decode(ids)));
  // A run that stops inside a character: the character is left to the sampler.
  for (const std::string& cut : {std::string("ab\xc3"), std::string("x\xe2\x82"), std::string("\xf0\x9f\x98")}) {
    std::vector<int32_t> c = forced_tokens(*tok, *vocab, cut);
    const std::string text = tok->decode(c);
    EXPECT_TRUE(cut.starts_with(text)) << text;
    EXPECT_LT(text.size(), cut.size() - 1) << "the partial character was tokenized";
  }
  EXPECT_TRUE(forced_tokens(*tok, *vocab, "\xe2\x82").empty());
  EXPECT_TRUE(forced_tokens(*tok, *vocab, "").empty());
  // A whole multi-byte character stays.
  const std::string e = "\"\xc3\xa9\",\"";
  EXPECT_TRUE(e.starts_with(tok->decode(forced_tokens(*tok, *vocab, e))));
}

TEST(JumpForward, ConstraintsTakeTheRunAndMaskAfterIt) {
  GrammarCache cache(demo_tok(), {});
  auto s = prepare(cache, kSchema);
  GenerateParams p;
  p.structured = s;
  p.max_tokens = 64;
  auto c = LogitsConstraints::make(p, {});
  ASSERT_TRUE(c->jumps());
  std::vector<int32_t> f;
  c->take_forced(f);
  ASSERT_FALSE(f.empty());
  const std::string text = demo_tok()->decode(f);
  EXPECT_TRUE(std::string("{\"name\":\"").starts_with(text)) << text;
  EXPECT_EQ(c->accepted(), int64_t(f.size()));
  std::vector<int32_t> again;
  c->take_forced(again);
  EXPECT_TRUE(again.empty());  // taken once
  // The mask after the run is the grammar's after those bytes.
  const int64_t words = c->mask_words();
  std::vector<uint32_t> row(size_t(words), 0), want(size_t(words), 0);
  ASSERT_TRUE(c->mask_after(int64_t(f.size()), row.data(), words));
  grammar::Matcher m(s->compiled);
  ASSERT_TRUE(m.accept_bytes(text));
  m.fill_bitmask(want.data());
  EXPECT_EQ(row, want);
  // Then a sampled token: the next run comes with the next accept.
  const int32_t q = demo_tok()->encode("\"").at(0);
  if (text == "{\"name\":\"" && m.accept_token(q)) {
    c->accept(q);
    c->take_forced(f);
    EXPECT_TRUE(std::string(",\"age\":").starts_with(demo_tok()->decode(f)));
  }

  // Off: by the request, and without a tokenizer (a StructuredRequest not prepared by a cache).
  GenerateParams off = p;
  off.jump_forward = false;
  auto c2 = LogitsConstraints::make(off, {});
  EXPECT_FALSE(c2->jumps());
  c2->take_forced(f);
  EXPECT_TRUE(f.empty());
  EXPECT_EQ(c2->accepted(), 0);
  GenerateParams lp = p;
  lp.logprobs = 1;  // forced tokens would have no logprobs
  EXPECT_FALSE(LogitsConstraints::make(lp, {})->jumps());
  // One token must be left to sample: max_tokens 1 forces nothing, 2 at most one token.
  GenerateParams one = p;
  one.max_tokens = 1;
  auto c3 = LogitsConstraints::make(one, {});
  c3->take_forced(f);
  EXPECT_TRUE(f.empty());
  one.max_tokens = 2;
  auto c4 = LogitsConstraints::make(one, {});
  c4->take_forced(f);
  EXPECT_LE(f.size(), 1u);
}

namespace {

struct Outcome {
  std::vector<Result> out;
  int64_t steps = 0;
};

// Constrained greedy requests, one after another; the engine's steps counted.
Outcome run_schema(bool jump, bool overlap, int n, int max_tokens = 64) {
  EngineOptions o = small_engine();
  o.disable_jump_forward = !jump;
  o.disable_overlap_schedule = !overlap;
  Engine e(o);
  e.start();
  GrammarCache cache(e.tokenizer_ptr(), e.eos_token_ids());
  auto s = prepare(cache, kSchema);
  Outcome r;
  auto prompts = code_prompts(e, n);
  for (int i = 0; i < n; ++i) {
    GenerateParams p = greedy(prompts[size_t(i)], max_tokens);
    p.ignore_eos = false;
    p.structured = s;
    r.out.push_back(collect(submit_text(e, p)));
  }
  for (int i = 0; i < 200 && e.metrics().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  r.steps = e.metrics().steps;
  e.stop();
  return r;
}

}  // namespace

TEST(JumpForward, FewerStepsAndOutputsStillFollowTheSchema) {
  for (bool overlap : {false, true}) {
    Outcome off = run_schema(false, overlap, 4), on = run_schema(true, overlap, 4);
    auto tok = demo_tok();
    int64_t made_on = 0, made_off = 0;
    for (size_t i = 0; i < on.out.size(); ++i) {
      for (const Outcome* r : {&off, &on}) {
        const Result& x = r->out[i];
        ASSERT_TRUE(x.error.empty()) << x.error;
        EXPECT_EQ(x.reason, FinishReason::stop) << x.text;
        expect_schema(x.text);
        // Forced tokens are completion tokens, and the streamed text is the tokens' text.
        EXPECT_EQ(x.completion_tokens, int(x.tokens.size()));
        EXPECT_EQ(x.text, tok->decode(x.tokens, true));
      }
      made_on += on.out[i].completion_tokens;
      made_off += off.out[i].completion_tokens;
    }
    std::printf("  [%s] steps: jump-forward %lld, without %lld; completion tokens %lld vs %lld\n",
                overlap ? "overlap" : "simple", (long long)on.steps, (long long)off.steps, (long long)made_on,
                (long long)made_off);
    // Each object has at least `{"name":"` and `","age":` / `,"kind":"` runs of several tokens.
    EXPECT_LT(on.steps, off.steps) << (overlap ? "overlap" : "simple");
  }
}

TEST(JumpForward, OverlapEqualsSimpleLoop) {
  // The overlap loop computes a jump one step later (the step in flight samples a void token),
  // but from the same context: greedy outputs are the simple loop's token for token.
  Outcome a = run_schema(true, false, 3), b = run_schema(true, true, 3);
  ASSERT_EQ(a.out.size(), b.out.size());
  for (size_t i = 0; i < a.out.size(); ++i) {
    EXPECT_EQ(a.out[i].tokens, b.out[i].tokens) << "request " << i;
    EXPECT_EQ(a.out[i].text, b.out[i].text);
  }
}

TEST(JumpForward, MaxTokensCutsTheRun) {
  // 5 tokens: the first run (`{"name":"` minus the kept-back token) fits, later ones are cut;
  // the output ends by length with exactly max_tokens tokens, each a prefix of valid JSON.
  for (int max_tokens : {1, 2, 3, 5}) {
    Outcome r = run_schema(true, true, 1, max_tokens);
    ASSERT_EQ(r.out.size(), 1u);
    EXPECT_EQ(r.out[0].reason, FinishReason::length) << r.out[0].text;
    EXPECT_EQ(int(r.out[0].tokens.size()), max_tokens) << r.out[0].text;
    EXPECT_EQ(r.out[0].completion_tokens, max_tokens);
    EXPECT_TRUE(std::string("{\"name\":\"").starts_with(r.out[0].text.substr(0, 9)) ||
                r.out[0].text.starts_with("{\"name\":\""))
        << r.out[0].text;
  }
}
