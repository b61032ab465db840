// EAGLE3 with logits constraints (runtime/spec_worker.cpp accept + runtime/structured.h spec walk):
// verify position j is masked with the grammar state after drafts 1..j, a draft the grammar
// forbids ends acceptance, the bonus is drawn under the mask, and the matcher is rolled back to
// the tokens kept. Greedy outputs must equal plain (non-speculative) constrained decoding token
// for token, and every output must follow its schema -- greedy and sampled, alone and batched.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine_test_util.h"
#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "runtime/structured.h"

using namespace ts;
using namespace ts::test;

namespace {

EngineOptions spec_engine() {
  EngineOptions o = small_engine();
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = demo_draft();
  o.speculative_num_steps = 3;
  return o;
}

// The non-speculative reference: jump-forward off, as under EAGLE3 (forced runs are tokenized
// differently from token-by-token decoding, so outputs would differ in their tokens).
EngineOptions plain_engine() {
  EngineOptions o = small_engine();
  o.disable_jump_forward = true;
  return o;
}

// Bounded, so the tiny model finishes within max_tokens.
constexpr const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},)"
    R"("age":{"type":"integer","minimum":0,"maximum":99},"kind":{"enum":["def","class","lambda"]}},)"
    R"("required":["name","age","kind"],"additionalProperties":false})";

std::shared_ptr<const StructuredRequest> prepare(Engine& e, grammar::Grammar g, const std::string& key) {
  static std::unique_ptr<GrammarCache> cache;
  if (!cache) cache = std::make_unique<GrammarCache>(e.tokenizer_ptr(), e.eos_token_ids());
  StructuredRequest r;
  r.kind = "test";
  r.key = key;
  r.ir = std::make_shared<const grammar::Grammar>(std::move(g));
  return cache->prepare(r);
}

GenerateParams constrained(std::vector<int32_t> prompt, std::shared_ptr<const StructuredRequest> s, int max_tokens = 64) {
  GenerateParams p = greedy(std::move(prompt), max_tokens);
  p.ignore_eos = false;
  p.structured = std::move(s);
  p.return_spec_trace = true;
  return p;
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

TEST(SpecStructured, GreedyJsonSchemaEqualsPlainDecoding) {
  Engine plain(plain_engine());
  plain.start();
  Engine spec(spec_engine());
  spec.start();
  auto s = prepare(plain, grammar::json_schema_grammar(std::string_view(kSchema), grammar::JsonSchemaOptions{true, false}), "schema");
  auto prompts = code_prompts(plain, 3);
  std::vector<std::shared_ptr<Stream>> batch;  // several constrained requests in one spec step
  for (auto& p : prompts) batch.push_back(submit_text(spec, constrained(p, s)));
  int accepted = 0, steps = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result want = collect(submit_text(plain, constrained(prompts[i], s)));
    Result got = collect(batch[i]);
    EXPECT_EQ(got.error, "");
    EXPECT_EQ(got.tokens, want.tokens) << "prompt " << i << ": " << got.text << " vs " << want.text;
    EXPECT_EQ(got.reason, FinishReason::stop) << got.text;
    expect_schema(got.text);
    for (auto& [d, a] : got.trace) accepted += a, ++steps;
  }
  // Forced stretches ("name": ...) are where the draft agrees: some drafts are accepted, so the
  // walk and its rollback ran.
  EXPECT_GT(steps, 0);
  EXPECT_GT(accepted, 0);
}

TEST(SpecStructured, GreedyRegexChoiceBiasMinTokensEqualPlain) {
  Engine plain(plain_engine());
  plain.start();
  Engine spec(spec_engine());
  spec.start();
  auto re = prepare(plain, grammar::regex_grammar("(ab|cd)[0-9]{2,6}( [a-z]+){1,3}"), "regex");
  auto ch = prepare(plain, grammar::choice_grammar({"return None", "return self", "raise ValueError"}), "choice");
  for (auto& p : code_prompts(plain, 1)) {
    std::vector<GenerateParams> cases = {constrained(p, re), constrained(p, ch), greedy(p, 20)};
    cases[2].logit_bias = {{10, 3.0f}, {20, -2.0f}};
    cases[2].min_tokens = 12;
    cases[2].ignore_eos = false;
    for (auto& g : cases) {
      Result want = collect(submit_text(plain, g));
      Result got = collect(submit_text(spec, g));
      EXPECT_EQ(got.tokens, want.tokens) << got.text << " vs " << want.text;
    }
  }
}

TEST(SpecStructured, SampledOutputsFollowTheSchema) {
  Engine spec(spec_engine());
  spec.start();
  auto s = prepare(spec, grammar::json_schema_grammar(std::string_view(kSchema), grammar::JsonSchemaOptions{true, false}), "schema");
  auto prompts = code_prompts(spec, 3);
  std::vector<std::shared_ptr<Stream>> batch;
  for (size_t i = 0; i < 4; ++i) {
    GenerateParams g = constrained(prompts[i % prompts.size()], s);
    g.temperature = 0.8f;
    g.top_p = 0.95f;
    g.seed = 100 + uint64_t(i);
    batch.push_back(submit_text(spec, g));
  }
  for (auto& st : batch) {
    Result r = collect(st);
    EXPECT_EQ(r.reason, FinishReason::stop) << r.text;
    expect_schema(r.text);
  }
}

// A triggered grammar (tool_choice auto's mechanism) on the real model: the demo model writes
// "of the" in its docstrings by itself; after it the grammar allows only " (given|first|second)
// WORD." (the "." is its end tag), then free text again. Plain and speculative decoding agree
// token for token, and every "of the" is followed by the grammar's text.
TEST(SpecStructured, TriggeredGrammarOnTheDemoModel) {
  Engine plain(plain_engine());
  plain.start();
  Engine spec(spec_engine());
  spec.start();
  auto base = prepare(plain, grammar::regex_grammar(" (given|first|second) [a-z]{1,10}\\."), "of-the-trigger");
  auto s = std::make_shared<StructuredRequest>(*base);
  s->trigger = "of the";
  const std::regex after("of the (given|first|second) [a-z]{1,10}\\.");
  int defs = 0;
  for (auto& p : code_prompts(plain, 1)) {
    GenerateParams g = constrained(p, s, 64);
    Result want = collect(submit_text(plain, g));
    Result got = collect(submit_text(spec, g));
    EXPECT_EQ(got.tokens, want.tokens) << got.text << " vs " << want.text;
    for (size_t at = got.text.find("of the"); at != std::string::npos; at = got.text.find("of the", at + 1)) {
      std::string rest = got.text.substr(at);
      if (rest.size() < 24) continue;  // may be cut by max_tokens
      ++defs;
      EXPECT_TRUE(std::regex_search(rest, after, std::regex_constants::match_continuous)) << rest;
    }
  }
  EXPECT_GT(defs, 0);
}

}  // namespace
