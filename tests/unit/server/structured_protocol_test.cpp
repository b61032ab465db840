// Structured-output request fields (protocol.h parse_structured, parse_logit_constraints) and
// the tool_choice grammar (output_parsers.h tool_call_structured).
#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "server/output_parsers.h"
#include "server/protocol.h"

namespace ts::server {
namespace {

std::shared_ptr<const grammar::Vocab> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> b(257);
    for (int i = 0; i < 256; ++i) b[size_t(i)] = std::string(1, char(i));
    b[256] = "</s>";
    return std::make_shared<const grammar::Vocab>(b, std::vector<bool>(257, false), std::vector<int32_t>{256});
  }();
  return v;
}

// The whole string is accepted by the request's grammar.
bool accepts(const StructuredRequest& s, std::string_view text) {
  auto cg = std::make_shared<const grammar::CompiledGrammar>(*s.ir, byte_vocab());
  grammar::Matcher m(cg);
  return m.accept_bytes(text) && m.can_terminate();
}

std::shared_ptr<StructuredRequest> parse(const std::string& body) { return parse_structured(Json::parse(body)); }

void expect_400(const std::string& body, const std::string& param, const std::string& needle) {
  try {
    parse(body);
    FAIL() << "no error for " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(StructuredFields, NoneAndText) {
  EXPECT_EQ(parse(R"({})"), nullptr);
  EXPECT_EQ(parse(R"({"response_format": {"type": "text"}})"), nullptr);
}

TEST(StructuredFields, ResponseFormatJsonSchema) {
  auto s = parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
    "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
               "required": ["b", "a"], "additionalProperties": false}}}})");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->kind, "json_schema");
  EXPECT_TRUE(accepts(*s, R"({"b":1,"a":"x"})"));  // schema key order, compact
  EXPECT_FALSE(accepts(*s, R"({"a":"x","b":1})"));
  EXPECT_FALSE(accepts(*s, R"({"b":1})"));
}

TEST(StructuredFields, NonStrictAllowsExtraKeys) {
  auto strict = parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}})");
  auto loose = parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p",
    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}})");
  EXPECT_FALSE(accepts(*strict, R"({"a":1,"z":2})"));
  EXPECT_TRUE(accepts(*loose, R"({"a":1,"z":2})"));
  EXPECT_NE(strict->key, loose->key);
}

// OpenAI's strict: true holds the output to the schema, so a keyword no grammar can express is
// a 400; without it (no enforcement promised) such keywords are left unconstrained (lenient).
TEST(StructuredFields, NonStrictIgnoresWhatAGrammarCannotExpress) {
  const char* schema = R"("schema": {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"},
    "uniqueItems": true}}, "required": ["ids"]})";
  EXPECT_THROW(parse(std::string(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true, )") +
                     schema + "}}}"),
               ApiError);
  auto loose = parse(std::string(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p", )") + schema + "}}}");
  ASSERT_NE(loose, nullptr);
  EXPECT_TRUE(accepts(*loose, R"({"ids":[1,1]})"));
  EXPECT_FALSE(accepts(*loose, R"({"ids":["1"]})"));
  EXPECT_THROW(parse(std::string(R"({"guided_json": {"type": "array", "uniqueItems": true}})")), ApiError);
}

TEST(StructuredFields, JsonObject) {
  auto s = parse(R"({"response_format": {"type": "json_object"}})");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(accepts(*s, R"({"k":[1,2,{"x":null}]})"));
  EXPECT_FALSE(accepts(*s, R"([1])"));
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"json_object": true}})"), R"({})"));
}

TEST(StructuredFields, VllmAndSglangFields) {
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"regex": "[0-9]{3}-[a-z]+"}})"), "123-ab"));
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"choice": ["red", "green"]}})"), "green"));
  EXPECT_FALSE(accepts(*parse(R"({"structured_outputs": {"choice": ["red", "green"]}})"), "blue"));
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"grammar": "root ::= \"a\" | \"b\""}})"), "b"));
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"json": {"type": "integer"}}})"), "42"));
  EXPECT_TRUE(accepts(*parse(R"({"structured_outputs": {"json": "{\"type\": \"boolean\"}"}})"), "true"));
  EXPECT_TRUE(accepts(*parse(R"({"guided_json": {"type": "array", "items": {"type": "integer"}}})"), "[1,2]"));
  EXPECT_TRUE(accepts(*parse(R"({"guided_regex": "x+"})"), "xxx"));
  EXPECT_TRUE(accepts(*parse(R"({"guided_choice": ["A", "B"]})"), "A"));
  EXPECT_TRUE(accepts(*parse(R"({"guided_grammar": "start: \"q\""})"), "q"));
  EXPECT_TRUE(accepts(*parse(R"({"regex": "(ab)*"})"), "abab"));
  EXPECT_TRUE(accepts(*parse(R"({"ebnf": "root ::= [0-9]+"})"), "007"));
  EXPECT_TRUE(accepts(*parse(R"({"json_schema": "{\"type\": \"null\"}"})"), "null"));
}

TEST(StructuredFields, InvalidOnesName400) {
  expect_400(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}})",
             "response_format.json_schema.schema", "strin");
  expect_400(R"({"structured_outputs": {"regex": "(ab"}})", "structured_outputs.regex", "regex");
  expect_400(R"({"guided_grammar": "root ::= foo"})", "guided_grammar", "foo");
  expect_400(R"({"guided_json": "{not json"})", "guided_json", "Invalid JSON schema");
  expect_400(R"({"guided_choice": []})", "guided_choice", "non-empty");
  expect_400(R"({"response_format": {"type": "xml"}})", "response_format", "xml");
  expect_400(R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema", "required");
  expect_400(R"({"guided_regex": "a", "response_format": {"type": "json_object"}})", "guided_regex", "Only one");
  expect_400(R"({"json_schema": {"type": "object", "not": {}}})", "json_schema", "not");
}

TEST(StructuredFields, LogitBiasAndMinTokens) {
  GenerateParams p;
  parse_logit_constraints(Json::parse(R"({"logit_bias": {"5": 2.5, "17": -100}, "min_tokens": 3, "max_tokens": 8})"), p, 100);
  ASSERT_EQ(p.logit_bias.size(), 2u);
  EXPECT_EQ(p.logit_bias[0], (std::pair<int32_t, float>{5, 2.5f}));
  EXPECT_EQ(p.logit_bias[1], (std::pair<int32_t, float>{17, -100.0f}));
  EXPECT_EQ(p.min_tokens, 3);
  auto bad = [](const char* body, const char* param) {
    GenerateParams q;
    try {
      parse_logit_constraints(Json::parse(body), q, 100);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param) << e.what();
    }
  };
  bad(R"({"logit_bias": {"100": 1}})", "logit_bias");
  bad(R"({"logit_bias": {"abc": 1}})", "logit_bias");
  bad(R"({"logit_bias": {"3": 101}})", "logit_bias");
  bad(R"({"logit_bias": [1]})", "logit_bias");
  bad(R"({"min_tokens": -1})", "min_tokens");
  bad(R"({"min_tokens": 9, "max_tokens": 8})", "min_tokens");
}

TEST(StructuredFields, BadWords) {
  GenerateParams p;
  parse_sampling(Json::parse(R"({"bad_words": ["foo", " bar baz"]})"), p, 100);
  EXPECT_EQ(p.bad_words, (std::vector<std::string>{"foo", " bar baz"}));
  auto bad = [](const char* body) {
    GenerateParams q;
    try {
      parse_sampling(Json::parse(body), q, 100);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "bad_words") << e.what();
    }
  };
  bad(R"({"bad_words": "foo"})");
  bad(R"({"bad_words": [1]})");
  bad(R"({"bad_words": ["  "]})");
}

TEST(StructuredFields, ChatRequestCarriesThem) {
  ModelInfo mi{"m", "m", 4096, 1000};
  ChatRequest r = parse_chat_request(Json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
    "response_format": {"type": "json_object"}, "parallel_tool_calls": false, "logit_bias": {"1": 1}})"), mi);
  ASSERT_NE(r.structured, nullptr);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.params.logit_bias.size(), 1u);
  CompletionRequest c = parse_completion_request(
      Json::parse(R"({"prompt": [1, 2], "guided_choice": ["x"]})"), mi, [](const std::string&) { return std::vector<int32_t>{1}; },
      [](const std::vector<int32_t>&) { return std::string("p"); });
  ASSERT_NE(c.params.structured, nullptr);
  EXPECT_EQ(c.params.structured->kind, "choice");
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "get_time"}}])";

TEST(ToolChoiceGrammar, HermesRequiredAndNamed) {
  Json tools = Json::parse(kTools);
  auto any = tool_call_structured(tools, "", true, ToolCallParser::Kind::hermes);
  const std::string w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>";
  const std::string t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(accepts(*any, w));
  EXPECT_TRUE(accepts(*any, t));
  EXPECT_TRUE(accepts(*any, w + "\n" + t));  // parallel
  EXPECT_FALSE(accepts(*any, "hello"));
  EXPECT_FALSE(accepts(*any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"));
  auto one = tool_call_structured(tools, "", false, ToolCallParser::Kind::hermes);
  EXPECT_TRUE(accepts(*one, w));
  EXPECT_FALSE(accepts(*one, w + "\n" + t));  // parallel_tool_calls: false
  auto named = tool_call_structured(tools, "get_time", true, ToolCallParser::Kind::hermes);
  EXPECT_TRUE(accepts(*named, t));
  EXPECT_FALSE(accepts(*named, w));
  // What the grammar produces, the hermes parser reads back as calls.
  ToolCallParser p(ToolCallParser::Kind::hermes);
  std::string content;
  std::vector<ToolCall> calls;
  p.feed(w + "\n" + t, content, calls);
  p.finish(content, calls);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(calls[0].arguments)["unit"], "c");
  EXPECT_TRUE(content.empty()) << content;
}

// A tool whose schema has keywords a grammar cannot express (MCP servers' uniqueItems,
// patternProperties, ...): the tool grammar leaves them unconstrained instead of a 400 for every
// request that lists the tool.
TEST(ToolChoiceGrammar, ToolSchemasWithUnexpressibleKeywordsAreLenient) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "tag", "parameters": {"type": "object",
     "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true},
                    "meta": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}}},
     "required": ["ids"]}}}])");
  auto any = tool_call_structured(tools, "", true, ToolCallParser::Kind::hermes);
  EXPECT_TRUE(accepts(*any, "<tool_call>\n{\"name\": \"tag\", \"arguments\": {\"ids\":[1,1],\"meta\":{\"x-a\":\"b\"}}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*any, "<tool_call>\n{\"name\": \"tag\", \"arguments\": {\"ids\":[\"1\"]}}\n</tool_call>"));
  EXPECT_NO_THROW(tool_call_triggered(tools, true));
}

// tool_choice auto: the grammar is what follows the <tool_call> trigger, up to the end tag.
TEST(ToolChoiceGrammar, AutoIsTriggeredAtTheStartTag) {
  Json tools = Json::parse(kTools);
  auto s = tool_call_triggered(tools, true);
  EXPECT_EQ(s->trigger, "<tool_call>");
  EXPECT_TRUE(s->trigger_repeat);
  EXPECT_FALSE(tool_call_triggered(tools, false)->trigger_repeat);  // parallel_tool_calls false: one call
  EXPECT_TRUE(accepts(*s, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\",\"unit\":\"f\"}}\n</tool_call>"));
  EXPECT_TRUE(accepts(*s, "\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*s, "\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>"));  // not a listed tool
  EXPECT_FALSE(accepts(*s, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*s, "\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nmore"));  // ends at the tag
}

// tool_choice auto with the llama3 syntax: the output is the calls (it starts with "{") or free
// text; the grammar is the required-call grammar entered at that first byte.
TEST(ToolChoiceGrammar, AutoLlama3IsTriggeredAtTheOutputStart) {
  Json tools = Json::parse(kTools);
  auto s = tool_call_triggered(tools, true, ToolCallParser::Kind::llama3);
  EXPECT_EQ(s->kind, "tool_call_auto");
  EXPECT_EQ(s->trigger, "{");
  EXPECT_TRUE(s->trigger_at_start && s->trigger_in_grammar);
  EXPECT_FALSE(s->trigger_repeat);
  const std::string w = "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Rome\",\"unit\":\"f\"}}";
  EXPECT_TRUE(accepts(*s, w));
  EXPECT_TRUE(accepts(*s, w + "; {\"name\": \"get_time\", \"parameters\": {}}"));
  EXPECT_FALSE(accepts(*s, "{\"name\": \"get_date\", \"parameters\": {}}"));
  EXPECT_FALSE(accepts(*tool_call_triggered(tools, false, ToolCallParser::Kind::llama3), w + "; " + w));
  EXPECT_NE(s->key, tool_call_structured(tools, "", true, ToolCallParser::Kind::llama3)->key);  // cached apart
}

TEST(ToolChoiceGrammar, Llama3) {
  Json tools = Json::parse(kTools);
  auto any = tool_call_structured(tools, "", true, ToolCallParser::Kind::llama3);
  const std::string w = "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Rome\",\"unit\":\"f\"}}";
  const std::string t = "{\"name\": \"get_time\", \"parameters\": {}}";
  EXPECT_TRUE(accepts(*any, w));
  EXPECT_TRUE(accepts(*any, w + "; " + t));
  ToolCallParser p(ToolCallParser::Kind::llama3);
  std::string content;
  std::vector<ToolCall> calls;
  p.feed(w + "; " + t, content, calls);
  p.finish(content, calls);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].name, "get_time");
}

TEST(ToolChoiceGrammar, InvalidSchemaNamesTheTool) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}])");
  try {
    tool_call_structured(tools, "", true, ToolCallParser::Kind::hermes);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "tools[0].function.parameters");
  }
}

}  // namespace
}  // namespace ts::server
