// The matcher: accept/rollback/termination/jump-forward, and token masks against brute force
// (every token tried with accept + rollback) on the repo's real tokenizers.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar_util.h"
#include "tokenizer/tokenizer.h"

namespace ts::grammar {
namespace {

TEST(Matcher, AcceptRollbackTerminate) {
  auto cg = test::compile(parse_gbnf(R"(root ::= "ab" [0-9]* "c")"));
  Matcher m(cg);
  EXPECT_FALSE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('1'));
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_token(256));  // the stop token needs a complete sentence
  EXPECT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_FALSE(m.accept_token('c'));
  EXPECT_TRUE(m.accept_token(256));
  EXPECT_TRUE(m.is_terminated());
  std::vector<uint32_t> row(static_cast<size_t>(cg->vocab().mask_words()), 1);
  m.fill_bitmask(row.data());
  for (uint32_t w : row) EXPECT_EQ(w, 0u);
  m.rollback(3);  // stop, 'c', '1'
  EXPECT_FALSE(m.is_terminated());
  EXPECT_FALSE(m.can_terminate());
  EXPECT_TRUE(m.accept_bytes("23c"));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_THROW(m.rollback(10), Error);
}

TEST(Matcher, JumpForward) {
  auto cg = test::compile(json_schema_grammar(nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})"),
      JsonSchemaOptions{.strict = true, .any_whitespace = false}));
  Matcher m(cg);
  EXPECT_EQ(m.jump_forward(), "{\"name\":\"");
  ASSERT_TRUE(m.accept_bytes("{\"name\":\"bob\""));
  EXPECT_EQ(m.jump_forward(), ",\"age\":");
  ASSERT_TRUE(m.accept_bytes(",\"age\":42}"));
  EXPECT_EQ(m.jump_forward(), "");
  EXPECT_TRUE(m.can_terminate());
}

// The forced-bytes query (jump-forward): the bytes every continuation starts with, stopping at a
// choice, where the grammar may end, inside a free string, and after rollback as before.
TEST(Matcher, JumpForwardStopsAtEveryChoice) {
  auto cg = test::compile(json_schema_grammar(nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"kind":{"enum":["apple","apricot"]},"n":{"type":"integer"},)"
      R"("tag":{"const":"on"}},"required":["kind","n","tag"],"additionalProperties":false})"),
      JsonSchemaOptions{.strict = true, .any_whitespace = false}));
  Matcher m(cg);
  EXPECT_EQ(m.jump_forward(), "{\"kind\":\"ap");  // the enum's common prefix, then a choice
  ASSERT_TRUE(m.accept_bytes("{\"kind\":\"ap"));
  EXPECT_EQ(m.jump_forward(), "");  // 'p' or 'r'
  ASSERT_TRUE(m.accept_bytes("r"));
  EXPECT_EQ(m.jump_forward(), "icot\",\"n\":");
  ASSERT_TRUE(m.accept_bytes("icot\",\"n\":"));
  EXPECT_EQ(m.jump_forward(), "");  // a digit or '-'
  ASSERT_TRUE(m.accept_bytes("7"));
  EXPECT_EQ(m.jump_forward(), "");  // more digits or ','
  ASSERT_TRUE(m.accept_bytes(","));
  // A const: the whole rest of the object.
  EXPECT_EQ(m.jump_forward(), "\"tag\":\"on\"}");
  m.rollback(1);
  EXPECT_EQ(m.jump_forward(), "");
  ASSERT_TRUE(m.accept_bytes(",\"tag\":\"on\"}"));
  EXPECT_EQ(m.jump_forward(), "");  // complete: it may end (the stop token) -- no forced bytes
  EXPECT_TRUE(m.can_terminate());
}

TEST(Matcher, JumpForwardIsEmptyInsideAFreeString) {
  auto cg = test::compile(parse_gbnf(R"(root ::= "<" [a-z]+ ">" "!")"));
  Matcher m(cg);
  EXPECT_EQ(m.jump_forward(), "<");
  ASSERT_TRUE(m.accept_bytes("<"));
  EXPECT_EQ(m.jump_forward(), "");
  ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_EQ(m.jump_forward(), "");  // another letter or '>'
  ASSERT_TRUE(m.accept_bytes(">"));
  EXPECT_EQ(m.jump_forward(), "!");
}

TEST(Vocab, ExtendableTokens) {
  std::vector<std::string> b = {"a", "ab", "abc", "b", "\":", "\":\"", "x", "zz"};
  Vocab v(b, std::vector<bool>(b.size(), false), {});
  EXPECT_TRUE(v.extendable(0));   // "a" -> "ab"
  EXPECT_TRUE(v.extendable(1));   // "ab" -> "abc"
  EXPECT_FALSE(v.extendable(2));  // nothing longer starts with "abc"
  EXPECT_FALSE(v.extendable(3));
  EXPECT_TRUE(v.extendable(4));   // '":' -> '":"'
  EXPECT_FALSE(v.extendable(5));
  EXPECT_FALSE(v.extendable(7));
  EXPECT_FALSE(v.extendable(-1));
  EXPECT_FALSE(v.extendable(99));
}

// Brute force: token t is allowed iff accept_token(t) succeeds.
void expect_masks_exact(const tok::Tokenizer& tok, const Grammar& g, const std::string& text, const char* what,
                        std::shared_ptr<const Vocab> shared = nullptr) {
  auto vocab = shared ? shared : Vocab::from_tokenizer(tok);
  auto cg = std::make_shared<const CompiledGrammar>(g, vocab);
  Matcher m(cg);
  std::vector<uint32_t> row(static_cast<size_t>(vocab->mask_words()));
  std::string_view rest = text;
  for (int s = 0; s < 12; ++s) {  // each step tries the whole vocabulary
    m.fill_bitmask(row.data());
    int mismatches = 0;
    int32_t next = -1;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      bool brute = m.accept_token(id);
      if (brute) m.rollback(1);
      bool masked = (row[id >> 5] >> (id & 31)) & 1;
      if (brute != masked && mismatches++ < 5)
        ADD_FAILURE() << what << " step " << s << " token " << id << " " << nlohmann::json(vocab->bytes(id)).dump()
                      << " brute=" << brute << " mask=" << masked;
      // Follow the text: the longest allowed token that is a prefix of what is left.
      const std::string& b = vocab->bytes(id);
      if (masked && !b.empty() && rest.substr(0, b.size()) == b && (next < 0 || b.size() > vocab->bytes(next).size()))
        next = id;
    }
    if (next < 0) break;
    ASSERT_TRUE(m.accept_token(next)) << what;
    rest.remove_prefix(vocab->bytes(next).size());
  }
  EXPECT_LT(rest.size(), text.size()) << what << ": no token of the text was allowed";
}

class MaskVsBruteForce : public ::testing::TestWithParam<const char*> {};

TEST_P(MaskVsBruteForce, JsonSchemaRegexAndEbnf) {
  auto tok = tok::Tokenizer::load(test::repo(GetParam()));
  const char* schema = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},
      "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":3},
      "n":{"type":"integer","minimum":-5,"maximum":300},
      "ok":{"type":["boolean","null"]}},
    "required":["name","n"]})";
  expect_masks_exact(*tok, json_schema_grammar(std::string_view(schema)),
                     R"({"name": "Hello world", "tags": ["bb", "a"], "n": 299, "ok": null})", "schema");
  expect_masks_exact(*tok, json_object_grammar(), R"({"x": [1, 2.5e3, "s\n", {"y": true}]})", "json_object");
  expect_masks_exact(*tok, regex_grammar(R"((def|class) [a-z_]+\(\w*\):\n    return \d+)"),
                     "def foo_bar(x):\n    return 42", "regex");
  expect_masks_exact(*tok, parse_gbnf(R"(root ::= ("Yes" | "No") ", because " [a-z ]+ ".")"),
                     "Yes, because it is.", "gbnf");
}

// Grammars compiled against one vocabulary share the context masks of the structures they have
// in common (SharedMaskCache, keyed by the reachable grammar's structure): masks taken from
// another grammar's walks must still be exact.
TEST_P(MaskVsBruteForce, MasksSharedAcrossGrammarsStayExact) {
  auto tok = tok::Tokenizer::load(test::repo(GetParam()));
  auto vocab = Vocab::from_tokenizer(*tok);
  const char* a = R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},
    "required":["city","days"]})";
  const char* b = R"({"type":"object","properties":{"query":{"type":"string"},"filters":{"type":"array",
    "items":{"type":"object","properties":{"field":{"type":"string"},"value":{"type":["string","number"]}},
    "required":["field","value"]}}},"required":["query"]})";
  const std::string text_a = R"({"city": "Paris \"x\"", "days": 12})";
  expect_masks_exact(*tok, json_schema_grammar(std::string_view(a)), text_a, "a", vocab);
  const size_t after_a = vocab->shared_masks().size();
  EXPECT_GT(after_a, 0u);
  expect_masks_exact(*tok, json_schema_grammar(std::string_view(b)),
                     R"({"query": "cheap flights", "filters": [{"field": "price", "value": 12.5}]})", "b", vocab);
  expect_masks_exact(*tok, json_object_grammar(), R"({"k": ["v", 1, {"z": "w"}]})", "json_object", vocab);
  // The same schema and text again, compiled anew: every walk is found in the shared cache.
  const size_t hits = vocab->shared_masks().hits(), held = vocab->shared_masks().size();
  expect_masks_exact(*tok, json_schema_grammar(std::string_view(a)), text_a, "a again", vocab);
  EXPECT_GT(vocab->shared_masks().hits(), hits);
  EXPECT_EQ(vocab->shared_masks().size(), held);
}

TEST(Vocab, SkipSharedMatchesALinearScan) {
  auto tok = tok::Tokenizer::load(test::repo("models/pycoder"));
  auto v = Vocab::from_tokenizer(*tok);
  const auto& lcp = v->lcp();
  std::mt19937 rng(7);
  for (int t = 0; t < 20000; ++t) {
    size_t i = rng() % (lcp.size() + 1), j = rng() % 6;
    size_t k = i;
    while (k < lcp.size() && lcp[k] >= j) ++k;
    ASSERT_EQ(v->skip_shared(i, j), k) << "i=" << i << " j=" << j;
  }
  EXPECT_EQ(v->skip_shared(1, 0), lcp.size());  // every lcp >= 0
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, MaskVsBruteForce,
                         ::testing::Values("tests/data/tokenizers/bytelevel-1k", "tests/data/tokenizers/metaspace-1k",
                                           "models/pycoder"));

TEST(Vocab, ByteFallbackAndSpecialsAreHandled) {
  auto tok = tok::Tokenizer::load(test::repo("tests/data/tokenizers/metaspace-1k"));
  auto v = Vocab::from_tokenizer(*tok);
  int32_t nl = tok->token_to_id("<0x0A>").value_or(-1);
  ASSERT_GE(nl, 0);
  EXPECT_EQ(v->bytes(nl), "\n");
  for (const auto& a : tok->added_tokens()) {
    if (a.special && !v->is_stop(a.id)) {
      EXPECT_FALSE(v->is_normal(a.id)) << a.content;
    }
  }
  // A token spelled with the metaspace decodes with its leading space.
  for (int32_t id = 0; id < v->size(); ++id)
    if (tok->is_valid_id(id) && tok->id_to_token(id).rfind("\xE2\x96\x81", 0) == 0 && tok->id_to_token(id).size() > 3) {
      EXPECT_EQ(v->bytes(id)[0], ' ');
      break;
    }
}

// A chain of nullable rules with two empty ways through each: a step's expansion visits each
// (rule, parent) call once, so 300 links compile and match at once (the fuzzer's timeout on CI:
// walked path by path, 14 links took 13 s and 300 would never end). The masks stay exact.
TEST(Matcher, NullableChainsExpandOnce) {
  std::string src = "root ::=";
  for (int i = 0; i < 300; ++i) src += " a";
  src += " \"x\"\na ::= b | c | \"y\"\nb ::= \"\"?\nc ::= d?\nd ::= \"\" | \"z\"\n";
  auto cg = test::compile(parse_gbnf(src));
  EXPECT_TRUE(test::matches(cg, "x"));
  EXPECT_TRUE(test::matches(cg, "yzzyx"));
  EXPECT_FALSE(test::matches(cg, "xy"));
  EXPECT_FALSE(test::matches(cg, std::string(301, 'y') + "x"));
  EXPECT_TRUE(test::matches(cg, std::string(300, 'y') + "x"));
  Matcher m(cg);
  std::vector<uint32_t> row(static_cast<size_t>(cg->vocab().mask_words()));
  m.fill_bitmask(row.data());
  for (int id = 0; id < 257; ++id)
    EXPECT_EQ((row[id >> 5] >> (id & 31)) & 1u, id == 'x' || id == 'y' || id == 'z' ? 1u : 0u) << id;
}

// Repetitions of repetitions are one repetition (same sentences, one parse each): the fuzzer's
// regex (ab|c)+++...+ (60 stacked quantifiers) took over a second for 20 tokens, and GBNF's
// ((x+)+)+ nested as deep does the same.
TEST(Matcher, NestedRepetitionsAreOneRepetition) {
  auto stacked = test::compile(regex_grammar("(ab|c)" + std::string(60, '+') + "d"));
  EXPECT_TRUE(test::matches(stacked, "abcabd"));
  EXPECT_TRUE(test::matches(stacked, "cd"));
  EXPECT_FALSE(test::matches(stacked, "d"));
  EXPECT_FALSE(test::matches(stacked, "abad"));
  std::string nested = "\"x\"";
  for (int i = 0; i < 40; ++i) nested = "(" + nested + (i % 3 == 0 ? ")+" : i % 3 == 1 ? ")*" : ")?");
  auto g = test::compile(parse_gbnf("root ::= \"<\" " + nested + " \">\""));
  EXPECT_TRUE(test::matches(g, "<>"));
  EXPECT_TRUE(test::matches(g, "<" + std::string(500, 'x') + ">"));
  EXPECT_FALSE(test::matches(g, "<xy>"));
  for (auto [src, yes, no] : {std::tuple{"(a{2})*", "aaaa", "aaa"}, {"(a?){2,3}", "aaa", "aaaa"}, {"(a+){2,}", "aa", "a"},
                              {"(a*){0,2}b", "aaab", "ba"}, {"(a{2,}){0,3}", "", "a"}}) {
    auto cg = test::compile(regex_grammar(src));
    EXPECT_TRUE(test::matches(cg, yes)) << src;
    EXPECT_FALSE(test::matches(cg, no)) << src;
  }
}

// A long "up to n" chain (the fuzzer's regex [^x]?{97776}y): every state reaches the rest of the
// chain, so its structural key (for sharing masks across grammars) would be O(n) per token; past
// kMaxStructuralKey bytes the mask is the grammar's own. Masks stay exact along the walk.
TEST(Matcher, LongOptionalChainsKeepMasksCheap) {
  auto cg = test::compile(regex_grammar("[ab]?{60000}y"));
  Matcher m(cg);
  std::vector<uint32_t> row(static_cast<size_t>(cg->vocab().mask_words()));
  for (int i = 0; i < 200; ++i) {
    m.fill_bitmask(row.data());
    for (int id : {int('a'), int('b'), int('y'), int('x'), 256})
      EXPECT_EQ((row[id >> 5] >> (id & 31)) & 1u, id == 'a' || id == 'b' || id == 'y' ? 1u : 0u) << i << " " << id;
    ASSERT_TRUE(m.accept_token(i % 2 ? 'a' : 'b'));
  }
  EXPECT_TRUE(m.accept_token('y'));
  EXPECT_TRUE(m.can_terminate());
}

// A grammar whose parse stacks double per level (r_k ::= r_{k-1} | r_{k-1} "z": 2^20 ways to
// start) is refused at compile time when its first state or first byte is past the per-step
// bound, and by the step that reaches such a state otherwise -- an error, never seconds per token.
TEST(Matcher, TooAmbiguousGrammarsAreRefused) {
  std::string rules = "r0 ::= \"a\"\n";
  for (int k = 1; k <= 20; ++k) rules += fmt::format("r{} ::= r{} | r{} \"z\"\n", k, k - 1, k - 1);
  try {
    test::compile(parse_gbnf("root ::= r20\n" + rules));
    ADD_FAILURE() << "compiled";
  } catch (const InvalidRequest& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  EXPECT_THROW(test::compile(parse_gbnf("root ::= \"x\" r20\n" + rules)), InvalidRequest);  // the first byte's step
  auto late = test::compile(parse_gbnf("root ::= \"xy\" r20\n" + rules));
  Matcher m(late);
  EXPECT_TRUE(m.accept_token('x'));
  EXPECT_THROW(m.accept_token('y'), InvalidRequest);
  EXPECT_FALSE(m.accept_token('z'));  // the state is as before the refused step
  EXPECT_THROW(m.accept_token('y'), InvalidRequest);
}

// Speculative decoding: accept drafted tokens, roll back the rejected tail; masks and
// termination are as if the tail had never been accepted.
TEST(Matcher, RollbackRestoresMasksOnARealTokenizer) {
  auto tok = tok::Tokenizer::load(test::repo("models/pycoder"));
  auto vocab = Vocab::from_tokenizer(*tok);
  auto cg = std::make_shared<const CompiledGrammar>(
      json_schema_grammar(std::string_view(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})")),
      vocab);
  std::vector<int32_t> ids = tok->encode(R"({"a": [1, 22, 333]})");
  Matcher m(cg);
  std::vector<std::vector<uint32_t>> before;
  std::vector<uint32_t> row(static_cast<size_t>(vocab->mask_words()));
  for (int32_t id : ids) {
    m.fill_bitmask(row.data());
    before.push_back(row);
    ASSERT_TRUE(m.accept_token(id));
  }
  ASSERT_TRUE(m.can_terminate());
  for (size_t k = 1; k <= ids.size(); ++k) {
    m.rollback(1);
    m.fill_bitmask(row.data());
    EXPECT_EQ(row, before[ids.size() - k]) << "after rolling back " << k;
  }
  EXPECT_EQ(m.num_rollback(), 0u);
  EXPECT_TRUE(m.accept_token(ids[0]));
}

}  // namespace
}  // namespace ts::grammar
