// Structured-output request fields (protocol.h parse_structured, parse_logit_constraints) and
// the tool_choice grammar (output_parsers.h tool_call_structured).
#include <gtest/gtest.h>

#include "ts_source_dir.h"
#include <fstream>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"
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

// The block formats (each as its chat template renders an assistant tool call): tool_choice
// required's grammar takes the template's text, the format's parser reads it back as the calls,
// and a wrong name, a missing required argument or a second call under parallel false is refused.
struct BlockCase {
  ToolCallParser::Kind kind;
  std::string one, two;   // one call of get_weather / the two calls get_weather + get_time
  std::string bad_name;   // a block calling get_date
  std::string missing;    // get_weather without its required unit
};

std::vector<BlockCase> block_cases() {
  using K = ToolCallParser::Kind;
  const std::string ds_w = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"unit\": \"c\"}\n```<｜tool▁call▁end｜>";
  const std::string ds_t = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>";
  const std::string d1_w = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"unit\": \"c\"}<｜tool▁call▁end｜>";
  const std::string d1_t = "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
  const std::string k_w = "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"unit\": \"c\"}<|tool_call_end|>";
  const std::string k_t = "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>";
  const std::string q_w = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
  const std::string q_t = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  const std::string g_w = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>";
  const std::string g_t = "<tool_call>get_time\n</tool_call>";
  const std::string m_w = "<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"unit\">c</parameter>\n</invoke>\n";
  const std::string m_t = "<invoke name=\"get_time\">\n</invoke>\n";
  return {
      {K::mistral, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}, \"id\": \"a1B2c3D4e\"}, "
       "{\"name\": \"get_time\", \"arguments\": {}}]",
       "[TOOL_CALLS] [{\"name\": \"get_date\", \"arguments\": {}}]",
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"},
      {K::deepseek_v3, "<｜tool▁calls▁begin｜>" + ds_w + "<｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜>" + ds_w + "\n" + ds_t + "<｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_date\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {K::deepseek_v31, "<｜tool▁calls▁begin｜>" + d1_w + "<｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜>" + d1_w + d1_t + "<｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_date<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {K::kimi_k2, "<|tool_calls_section_begin|>" + k_w + "<|tool_calls_section_end|>",
       "<|tool_calls_section_begin|>" + k_w + k_t + "<|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_date:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
       "<|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"P\"}"
       "<|tool_call_end|><|tool_calls_section_end|>"},
      {K::qwen3_coder, q_w, q_w + "\n" + q_t, "<tool_call>\n<function=get_date>\n</function>\n</tool_call>",
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"},
      {K::glm45, g_w, g_w + "\n" + g_t, "<tool_call>get_date\n</tool_call>",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"},
      {K::minimax_m2, "<minimax:tool_call>\n" + m_w + "</minimax:tool_call>", "<minimax:tool_call>\n" + m_w + m_t + "</minimax:tool_call>",
       "<minimax:tool_call>\n<invoke name=\"get_date\">\n</invoke>\n</minimax:tool_call>",
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n</minimax:tool_call>"},
  };
}

std::vector<std::pair<std::string, Json>> parse_calls(ToolCallParser::Kind kind, const std::string& text, const Json& tools) {
  ToolCallParser p(kind, std::make_shared<const Json>(tools));
  std::string content;
  std::vector<ToolCall> calls;
  p.feed(text, content, calls);
  p.finish(content, calls);
  EXPECT_TRUE(content.empty()) << content;
  std::vector<std::pair<std::string, Json>> out;
  for (auto& c : calls) out.emplace_back(c.name, Json::parse(c.arguments));
  return out;
}

TEST(ToolChoiceGrammar, BlockFormatsRequiredNamedAndParallel) {
  Json tools = Json::parse(kTools);
  for (const BlockCase& c : block_cases()) {
    SCOPED_TRACE(int(c.kind));
    ASSERT_TRUE(has_tool_call_grammar(c.kind));
    auto any = tool_call_structured(tools, "", true, c.kind);
    auto one = tool_call_structured(tools, "", false, c.kind);
    auto named = tool_call_structured(tools, "get_time", true, c.kind);
    EXPECT_EQ(any->kind, "tool_call");
    EXPECT_TRUE(accepts(*any, c.one)) << c.one;
    EXPECT_TRUE(accepts(*any, c.two)) << c.two;
    EXPECT_TRUE(accepts(*one, c.one));
    EXPECT_FALSE(accepts(*one, c.two));  // parallel_tool_calls false: one call
    EXPECT_FALSE(accepts(*named, c.one));  // named get_time: get_weather refused
    EXPECT_FALSE(accepts(*any, c.bad_name));
    EXPECT_FALSE(accepts(*any, c.missing));
    EXPECT_FALSE(accepts(*any, "Sure, " + c.one));  // required: the output is the calls
    EXPECT_NE(any->key, one->key);
    EXPECT_NE(any->key, named->key);
    // What the grammar takes, the format's parser reads back as the calls.
    auto calls = parse_calls(c.kind, c.two, tools);
    ASSERT_EQ(calls.size(), 2u) << c.two;
    EXPECT_EQ(calls[0].first, "get_weather");
    EXPECT_EQ(calls[0].second, Json::parse(R"({"city": "Paris", "unit": "c"})"));
    EXPECT_EQ(calls[1].first, "get_time");
    EXPECT_EQ(calls[1].second, Json::object());
  }
}

// tool_choice auto: free text until the block's open marker; then the block must be calls.
TEST(ToolChoiceGrammar, BlockFormatsAutoIsTriggeredAtTheOpenMarker) {
  Json tools = Json::parse(kTools);
  for (const BlockCase& c : block_cases()) {
    SCOPED_TRACE(int(c.kind));
    auto s = tool_call_triggered(tools, true, c.kind);
    EXPECT_EQ(s->kind, "tool_call_auto");
    ASSERT_FALSE(s->trigger.empty());
    ASSERT_TRUE(c.one.starts_with(s->trigger)) << s->trigger;
    EXPECT_FALSE(s->trigger_at_start);
    EXPECT_TRUE(s->trigger_repeat);
    EXPECT_FALSE(tool_call_triggered(tools, false, c.kind)->trigger_repeat);
    EXPECT_TRUE(accepts(*s, c.one.substr(s->trigger.size()))) << c.one;
    EXPECT_FALSE(accepts(*s, c.bad_name.substr(s->trigger.size())));
    EXPECT_FALSE(accepts(*s, c.missing.substr(s->trigger.size())));
    EXPECT_NE(s->key, tool_call_structured(tools, "", true, c.kind)->key);
  }
}

// The text formats type a parameter's value by its schema: the grammar admits exactly the values
// that typing turns into a value of that schema.
TEST(ToolChoiceGrammar, TextFormatsFollowTheParameterTypes) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "run", "parameters": {"type": "object",
      "properties": {"n": {"type": "integer", "minimum": 1}, "ok": {"type": "boolean"}, "mode": {"type": "string", "enum": ["a", "b c"]},
                     "code": {"type": "string"}, "opts": {"type": "object", "properties": {"x": {"type": "number"}}}},
      "required": ["n"], "additionalProperties": false}}}])");
  auto q = tool_call_structured(tools, "", false, ToolCallParser::Kind::qwen3_coder);
  auto qp = [](const std::string& params) { return "<tool_call>\n<function=run>\n" + params + "</function>\n</tool_call>"; };
  auto param = [](const std::string& k, const std::string& v) { return "<parameter=" + k + ">\n" + v + "\n</parameter>\n"; };
  EXPECT_TRUE(accepts(*q, qp(param("n", "42"))));
  EXPECT_TRUE(accepts(*q, qp(param("n", "3") + param("ok", "true") + param("mode", "b c") + param("code", "x = '<a>'\nprint(x)") +
                             param("opts", "{\"x\": 1.5}"))));
  EXPECT_FALSE(accepts(*q, qp(param("n", "0"))));      // minimum 1
  EXPECT_FALSE(accepts(*q, qp(param("n", "abc"))));    // not an integer
  EXPECT_FALSE(accepts(*q, qp(param("ok", "true"))));  // n is required
  EXPECT_FALSE(accepts(*q, qp(param("n", "1") + param("mode", "c"))));  // not in the enum
  EXPECT_FALSE(accepts(*q, qp(param("n", "1") + param("extra", "1"))));  // additionalProperties false
  EXPECT_FALSE(accepts(*q, qp(param("n", "1") + param("code", "a</parameter>b"))));  // the value would end early
  auto calls = parse_calls(ToolCallParser::Kind::qwen3_coder,
                           qp(param("n", "3") + param("ok", "true") + param("mode", "b c") + param("opts", "{\"x\": 1.5}")), tools);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].second, Json::parse(R"({"n": 3, "ok": true, "mode": "b c", "opts": {"x": 1.5}})"));
  // A schema without properties: any parameters with text values.
  Json free = Json::parse(R"([{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}])");
  auto g = tool_call_structured(free, "", false, ToolCallParser::Kind::glm45);
  EXPECT_TRUE(accepts(*g, "<tool_call>run\n<arg_key>a_b</arg_key>\n<arg_value>anything\nat all</arg_value>\n</tool_call>"));
  EXPECT_FALSE(accepts(*g, "<tool_call>run\n<arg_key></arg_key>\n<arg_value>x</arg_value>\n</tool_call>"));  // empty key
}

// A string parameter's pattern / format hold for the text formats' raw values too; the pattern's
// open classes never admit the '<' of a closing tag; a pattern the grammar cannot express leaves
// the value free (the lenient tool schema rule).
TEST(ToolChoiceGrammar, TextFormatsEnforcePatternAndFormat) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "book", "parameters": {"type": "object",
      "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}, "day": {"type": "string", "format": "date"},
                     "note": {"type": "string", "pattern": "^.+$"}, "look": {"type": "string", "pattern": "^(?=a).*$"},
                     "mail": {"type": "string", "format": "email", "pattern": "^[a-z]+@x\\.org$"},
                     "short": {"type": "string", "pattern": "^.*$", "maxLength": 5}},
      "required": ["code"], "additionalProperties": false}}}])");
  for (auto kind : {ToolCallParser::Kind::qwen3_coder, ToolCallParser::Kind::minimax_m2}) {
    const bool q = kind == ToolCallParser::Kind::qwen3_coder;
    auto g = tool_call_structured(tools, "", false, kind);
    auto call = [&](const std::string& params) {
      return q ? "<tool_call>\n<function=book>\n" + params + "</function>\n</tool_call>"
               : "<minimax:tool_call>\n<invoke name=\"book\">\n" + params + "</invoke>\n</minimax:tool_call>";
    };
    auto param = [&](const std::string& k, const std::string& v) {
      return q ? "<parameter=" + k + ">\n" + v + "\n</parameter>\n" : "<parameter name=\"" + k + "\">" + v + "</parameter>\n";
    };
    SCOPED_TRACE(q ? "qwen3_coder" : "minimax_m2");
    EXPECT_TRUE(accepts(*g, call(param("code", "ABC-12"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "ABC-123"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "abc-12"))));
    EXPECT_TRUE(accepts(*g, call(param("code", "XYZ-00") + param("day", "2026-02-28"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("day", "2026-02-30"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("day", "tomorrow"))));
    EXPECT_TRUE(accepts(*g, call(param("code", "XYZ-00") + param("note", "any text, even > this"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("note", "a</parameter>b"))));
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("note", "a<b"))));
    EXPECT_TRUE(accepts(*g, call(param("code", "XYZ-00") + param("look", "b, not a"))));  // lookahead: free text
    EXPECT_TRUE(accepts(*g, call(param("code", "XYZ-00") + param("mail", "me@x.org"))));  // the pattern wins
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("mail", "me@y.org"))));
    EXPECT_TRUE(accepts(*g, call(param("code", "XYZ-00") + param("short", "a b>c"))));  // pattern + maxLength
    EXPECT_FALSE(accepts(*g, call(param("code", "XYZ-00") + param("short", "abcdef"))));
    auto calls = parse_calls(kind, call(param("code", "ABC-12") + param("day", "2026-12-07")), tools);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].second, Json::parse(R"({"code": "ABC-12", "day": "2026-12-07"})"));
  }
}

// A marker the tokenizer has as a special token: the forced grammar takes that one id where the
// marker goes (the model writes it so), and nowhere else -- not inside an argument's string.
TEST(ToolChoiceGrammar, SpecialTokenMarkers) {
  nlohmann::json tj = nlohmann::json::parse(std::ifstream(std::string(TS_SOURCE_DIR) + "/tests/data/tokenizers/bytelevel-1k/tokenizer.json"));
  int32_t next = 0;
  for (auto& [k, v] : tj["model"]["vocab"].items()) next = std::max<int32_t>(next, v.get<int32_t>() + 1);
  for (auto& a : tj["added_tokens"]) next = std::max<int32_t>(next, a["id"].get<int32_t>() + 1);
  const int32_t marker_id = next, other_id = next + 1;
  for (auto [id, text] : {std::pair<int32_t, const char*>{marker_id, "[TOOL_CALLS]"}, {other_id, "[INST]"}})
    tj["added_tokens"].push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                  {"normalized", false}, {"special", true}});
  auto tok = tok::Tokenizer::from_json_string(tj.dump());
  ASSERT_EQ(tok->token_to_id("[TOOL_CALLS]"), std::optional<int32_t>(marker_id));
  Json tools = Json::parse(kTools);
  auto req = tool_call_structured(tools, "", true, ToolCallParser::Kind::mistral, {"[TOOL_CALLS]"});
  auto text_req = tool_call_structured(tools, "", true, ToolCallParser::Kind::mistral);
  EXPECT_NE(req->key, text_req->key);
  auto allowed = [](grammar::Matcher& m, int32_t id) {
    std::vector<uint32_t> row(size_t(m.grammar().vocab().mask_words()));
    m.fill_bitmask(row.data());
    return ((row[size_t(id) / 32] >> (id % 32)) & 1u) != 0;
  };
  // Admitted: the grammar's first token may be the special id; then the calls follow.
  auto with = grammar::Vocab::from_tokenizer(*tok, {}, {"[TOOL_CALLS]"});
  EXPECT_EQ(with->text(marker_id), "[TOOL_CALLS]");
  grammar::Matcher m(std::make_shared<const grammar::CompiledGrammar>(*req->ir, with));
  EXPECT_TRUE(allowed(m, marker_id));
  EXPECT_FALSE(allowed(m, other_id));
  ASSERT_TRUE(m.accept_token(marker_id));
  ASSERT_TRUE(m.accept_bytes(" [{\"name\": \"get_weather\", \"arguments\": {\"city\": \""));
  EXPECT_FALSE(allowed(m, marker_id));  // inside a string: not the marker
  ASSERT_TRUE(m.accept_bytes("Paris\", \"unit\": \"c\"}}]"));
  EXPECT_TRUE(m.can_terminate());
  // The marker is the token: spelled out in text it is refused (the model writes the id), and
  // jump-forward turns the forced marker into that id.
  grammar::Matcher spelled(std::make_shared<const grammar::CompiledGrammar>(*req->ir, with));
  EXPECT_FALSE(spelled.accept_bytes("[TOOL_CALLS]"));
  grammar::Matcher jf(std::make_shared<const grammar::CompiledGrammar>(*tool_call_structured(tools, "", false,
                                                                          ToolCallParser::Kind::mistral, {"[TOOL_CALLS]"})->ir, with));
  EXPECT_EQ(forced_tokens(*tok, *with, jf.jump_forward()), std::vector<int32_t>{marker_id});
  // A tokenizer without the special (the marker's text grammar, the default vocabulary): text.
  auto without = grammar::Vocab::from_tokenizer(*tok);
  grammar::Matcher n(std::make_shared<const grammar::CompiledGrammar>(*text_req->ir, without));
  EXPECT_FALSE(allowed(n, marker_id));
  EXPECT_TRUE(n.accept_bytes("[TOOL_CALLS]"));
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
