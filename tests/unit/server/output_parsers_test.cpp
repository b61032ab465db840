// Reasoning and tool-call parsers on recorded model outputs, fed whole, at every split point, and
// byte by byte: the streamed deltas must always add up to the non-streamed message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/output_parsers.h"
#include "server/tool_parsers.h"
#include "server/api_endpoints.h"
#include "server/protocol.h"
#include "runtime/structured.h"

using namespace ts::server;
using RK = ReasoningParser::Kind;
using TK = ToolCallParser::Kind;

namespace {
struct Result {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Result&) const = default;
};

void PrintTo(const Result& r, std::ostream* os) {
  *os << "{reasoning=" << ::testing::PrintToString(r.reasoning) << " content=" << ::testing::PrintToString(r.content)
      << " calls=" << ::testing::PrintToString(r.calls) << "}";
}

void add(Result& r, const ChatDelta& d) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (auto& c : d.tool_calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    r.calls.emplace_back(c.name, c.arguments);
  }
}

Result run(RK rk, TK tk, const std::vector<std::string>& pieces, const ParseContext& ctx = {}) {
  ChatOutputParser p(rk, tk, ctx);
  Result r;
  for (auto& s : pieces) add(r, p.feed(s));
  add(r, p.finish());
  return r;
}

// Whole, every 2-way split, every 3-way split on a coarse grid, and byte by byte.
Result check_all_splits(RK rk, TK tk, const std::string& text, const ParseContext& ctx = {}) {
  Result whole = run(rk, tk, {text}, ctx);
  for (size_t i = 0; i <= text.size(); ++i) {
    Result r = run(rk, tk, {text.substr(0, i), text.substr(i)}, ctx);
    EXPECT_EQ(r, whole) << "split at " << i;
  }
  for (size_t i = 0; i <= text.size(); i += 3)
    for (size_t j = i; j <= text.size(); j += 5) {
      Result r = run(rk, tk, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}, ctx);
      EXPECT_EQ(r, whole) << "split at " << i << "," << j;
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run(rk, tk, bytes, ctx), whole) << "byte by byte";
  return whole;
}
}  // namespace

TEST(ReasoningParser, Qwen3) {
  auto r = check_all_splits(RK::qwen3, TK::none, "<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(r.reasoning, "\nLet me add 2 and 2.\n");
  EXPECT_EQ(r.content, "\n\nThe answer is 4.");
  // No <think> at the start: all content (thinking disabled).
  auto c = check_all_splits(RK::qwen3, TK::none, "The answer is 4. <think> is a tag");
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "The answer is 4. <think> is a tag");
  // Unclosed: everything after <think> is reasoning (hit max_tokens while thinking).
  auto u = check_all_splits(RK::qwen3, TK::none, "<think>still thinking </thi");
  EXPECT_EQ(u.reasoning, "still thinking </thi");
  EXPECT_EQ(u.content, "");
  // Short outputs that are a prefix of the tag.
  EXPECT_EQ(run(RK::qwen3, TK::none, {"<th"}).content, "<th");
}

TEST(ReasoningParser, DeepSeekR1) {
  // The template opened <think>: the output starts inside the reasoning.
  auto r = check_all_splits(RK::deepseek_r1, TK::none, "Hmm, 2+2.\n</think>\n\n**4**");
  EXPECT_EQ(r.reasoning, "Hmm, 2+2.\n");
  EXPECT_EQ(r.content, "\n\n**4**");
  auto r2 = check_all_splits(RK::deepseek_r1, TK::none, "<think>\nok</think>done");
  EXPECT_EQ(r2.reasoning, "\nok");
  EXPECT_EQ(r2.content, "done");
  auto r3 = check_all_splits(RK::deepseek_r1, TK::none, "never closed");
  EXPECT_EQ(r3.reasoning, "never closed");
  EXPECT_EQ(r3.content, "");
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(ReasoningParser::kind_from_name("qwen3"), RK::qwen3);
  EXPECT_EQ(ReasoningParser::kind_from_name("deepseek-r1"), RK::deepseek_r1);
  EXPECT_EQ(ReasoningParser::kind_from_name(""), RK::none);
  EXPECT_THROW(ReasoningParser::kind_from_name("gpt"), ts::Error);
  EXPECT_EQ(ToolCallParser::kind_from_name("qwen25"), TK::hermes);
  EXPECT_EQ(ToolCallParser::kind_from_name("llama3_json"), TK::llama3);
  EXPECT_THROW(ToolCallParser::kind_from_name("mistral-x"), ts::Error);
}

// Incremental (streamed) tool calls: a head (id, name) as soon as `{"name": N, "arguments": {`
// is complete, then argument fragments; merged, they equal the non-incremental result.
namespace {
struct Streamed {
  Result merged;
  int heads = 0, fragments = 0;
};

Streamed run_incremental(RK rk, TK tk, const std::vector<std::string>& pieces, const ParseContext& ctx = {}) {
  ChatOutputParser p(rk, tk, ctx);
  p.set_incremental_tool_calls(true);
  Streamed s;
  auto take = [&](const ChatDelta& d) {
    s.merged.reasoning += d.reasoning;
    s.merged.content += d.content;
    for (auto& c : d.tool_calls) {
      if (c.continuation) {
        EXPECT_FALSE(s.merged.calls.empty());
        EXPECT_TRUE(c.id.empty() && c.name.empty());
        if (!s.merged.calls.empty()) s.merged.calls.back().second += c.arguments;
        ++s.fragments;
      } else {
        EXPECT_EQ(c.id.rfind("call_", 0), 0u);
        s.merged.calls.emplace_back(c.name, c.arguments);
        ++s.heads;
      }
    }
  };
  for (auto& x : pieces) take(p.feed(x));
  take(p.finish());
  return s;
}

void expect_incremental_equals_whole(const std::string& text, const Result& whole) {
  for (size_t i = 0; i <= text.size(); ++i) {
    Result r = run_incremental(RK::none, TK::hermes, {text.substr(0, i), text.substr(i)}).merged;
    // The whole-call parser re-serialises arguments compactly; streamed ones are the model's text.
    ASSERT_EQ(r.calls.size(), whole.calls.size()) << "split at " << i;
    EXPECT_EQ(r.content, whole.content) << "split at " << i;
    for (size_t k = 0; k < r.calls.size(); ++k) {
      EXPECT_EQ(r.calls[k].first, whole.calls[k].first);
      EXPECT_EQ(nlohmann::json::parse(r.calls[k].second), nlohmann::json::parse(whole.calls[k].second)) << "split at " << i;
    }
  }
}
}  // namespace

TEST(ToolCallParser, HermesIncrementalArguments) {
  const std::string text =
      "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a } b </tool\", "
      "\"n\": [1, {\"x\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n";
  Result whole = run(RK::none, TK::hermes, {text});
  ASSERT_EQ(whole.calls.size(), 2u);
  expect_incremental_equals_whole(text, whole);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Streamed s = run_incremental(RK::none, TK::hermes, bytes);
  EXPECT_EQ(s.heads, 2);
  EXPECT_GT(s.fragments, 20);  // byte by byte: the arguments arrive as they are written
  EXPECT_EQ(s.merged.calls[0].second, "{\"city\": \"a } b </tool\", \"n\": [1, {\"x\": 2}]}");
  EXPECT_EQ(s.merged.content, "I'll check both.\n");
  // The head goes out before the arguments are complete.
  ChatOutputParser p(RK::none, TK::hermes);
  p.set_incremental_tool_calls(true);
  ChatDelta d = p.feed("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"ci");
  EXPECT_TRUE(p.has_tool_calls());
}

TEST(ToolCallParser, HermesIncrementalOtherShapesWaitForTheClose) {
  // Keys in another order, string arguments, bad JSON: the whole-call path (same result).
  for (std::string text : {"<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n</tool_call>",
                           "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>",
                           "<tool_call>\nnot json\n</tool_call> tail"}) {
    Result whole = run(RK::none, TK::hermes, {text});
    Streamed s = run_incremental(RK::none, TK::hermes, {text.substr(0, 20), text.substr(20)});
    EXPECT_EQ(s.merged, whole) << text;
    EXPECT_EQ(s.fragments, 0);
  }
}

TEST(ToolCallParser, HermesSingle) {
  // Recorded Qwen2.5 output.
  auto r = check_all_splits(RK::none, TK::hermes,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                            "\"unit\": \"celsius\"}}\n</tool_call>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "get_weather");
  auto args = nlohmann::json::parse(r.calls[0].second);
  EXPECT_EQ(args["city"], "Paris");
  EXPECT_EQ(args["unit"], "celsius");
  EXPECT_EQ(r.calls[0].second, "{\"city\":\"Paris\",\"unit\":\"celsius\"}");  // key order kept
}

TEST(ToolCallParser, HermesMultipleWithContent) {
  auto r = check_all_splits(RK::none, TK::hermes,
                            "I'll check both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                            "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"a < b </tool\"}}\n</tool_call>\n");
  EXPECT_EQ(r.content, "I'll check both cities.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(r.calls[1].second)["city"], "a < b </tool");
}

TEST(ToolCallParser, HermesMalformedStaysContent) {
  std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call> after";
  auto r = check_all_splits(RK::none, TK::hermes, text);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, text);
  // Cut off by max_tokens inside the call: content, unchanged.
  std::string cut = "ok <tool_call>{\"name\": \"f\", \"argu";
  auto c = check_all_splits(RK::none, TK::hermes, cut);
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.content, cut);
  // Closed by EOS without </tool_call> but complete JSON: a call.
  auto e = check_all_splits(RK::none, TK::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(e.calls.size(), 1u);
  // max_tokens cut the close tag of a complete call: still the call (as the stream took it), no
  // markup left in the content.
  for (const char* tail : {"\n</tool", "\n<", "</tool_call"}) {
    auto t = check_all_splits(RK::none, TK::hermes, std::string("<tool_call>\n{\"name\": \"p\", \"arguments\": {}}") + tail);
    ASSERT_EQ(t.calls.size(), 1u) << tail;
    EXPECT_EQ(t.calls[0].first, "p");
    EXPECT_EQ(t.content, "") << tail;
  }
  EXPECT_EQ(e.calls[0].second, "{}");
  // Plain text with a partial tag at the end.
  auto p = check_all_splits(RK::none, TK::hermes, "x <tool");
  EXPECT_EQ(p.content, "x <tool");
  // After calls, the cut start of the next one is not content (max_tokens).
  for (const char* tail : {"\n<", "\n<t", "<tool_"}) {
    auto q = check_all_splits(RK::none, TK::hermes, std::string("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>") + tail);
    ASSERT_EQ(q.calls.size(), 1u) << tail;
    EXPECT_EQ(q.content, "") << tail;
  }
}

TEST(ToolCallParser, HermesStringArgumentsAndNoArguments) {
  auto r = check_all_splits(RK::none, TK::hermes,
                            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                            "<tool_call>{\"name\": \"g\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].second, "{\"a\": 1}");
  EXPECT_EQ(r.calls[1].second, "{}");
}

TEST(ToolCallParser, ReasoningThenToolCall) {
  auto r = check_all_splits(RK::qwen3, TK::hermes,
                            "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(r.reasoning, "\nNeed the weather.\n");
  EXPECT_EQ(r.content, "\n\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "get_weather");
}

TEST(ToolCallParser, Llama3Json) {
  // Recorded Llama-3.1 output (custom tool, JSON format).
  auto r = check_all_splits(RK::none, TK::llama3,
                            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\", \"days\": 3}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "get_weather");
  EXPECT_EQ(r.calls[0].second, "{\"city\":\"San Francisco\",\"days\":3}");
  auto t = check_all_splits(RK::none, TK::llama3,
                            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"x; y}\"}}; "
                            "{\"name\": \"b\", \"arguments\": {}}");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[0].first, "a");
  EXPECT_EQ(nlohmann::json::parse(t.calls[0].second)["s"], "x; y}");
  EXPECT_EQ(t.calls[1].first, "b");
}

TEST(ToolCallParser, Llama3PlainTextAndBadJson) {
  auto r = check_all_splits(RK::none, TK::llama3, "  The weather in Paris is sunny {really}.");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "  The weather in Paris is sunny {really}.");
  auto j = check_all_splits(RK::none, TK::llama3, "{\"answer\": 42}");
  EXPECT_TRUE(j.calls.empty());
  EXPECT_EQ(j.content, "{\"answer\": 42}");
  auto p = check_all_splits(RK::none, TK::llama3, "<|python");
  EXPECT_EQ(p.content, "<|python");
}

TEST(ToolCallParser, NoneIsPassThrough) {
  auto r = check_all_splits(RK::none, TK::none, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST(ToolCallParser, Utf8Content) {
  auto r = check_all_splits(RK::qwen3, TK::hermes, "<think>中文</think>h\xC3\xA9llo <tool_call>{\"name\": \"f\", "
                                                   "\"arguments\": {\"q\": \"\xE2\x82\xAC\"}}</tool_call>");
  EXPECT_EQ(r.reasoning, "中文");
  EXPECT_EQ(r.content, "h\xC3\xA9llo ");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].second)["q"], "\xE2\x82\xAC");
}

// --- the block formats (tool_parsers.h): vLLM's names ------------------------------------------------
namespace {
using Call = std::pair<std::string, std::string>;

// The calls the templates below render: get_weather(city: Paris), get_time(tz: Europe/Zürich, days: 3).
const std::vector<Call> kTwoCalls = {{"get_weather", "{\"city\":\"Paris\"}"},
                                     {"get_time", "{\"tz\":\"Europe/Zürich\",\"days\":3}"}};

ParseContext with_tools(const char* tools_json) {
  ParseContext c;
  c.tools = std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::parse(tools_json));
  return c;
}

// Incremental mode (streaming) gives what the whole parse gives: the same content and reasoning,
// one head per call, and each call's head + fragments concatenating to its arguments (JSON-equal:
// the JSON formats stream the model's own object text).
void expect_streamed_equals(const Streamed& s, const Result& whole, const std::string& where) {
  EXPECT_EQ(s.merged.content, whole.content) << where;
  EXPECT_EQ(s.merged.reasoning, whole.reasoning) << where;
  ASSERT_EQ(s.merged.calls.size(), whole.calls.size()) << where;
  EXPECT_EQ(s.heads, int(whole.calls.size())) << where;
  for (size_t k = 0; k < whole.calls.size(); ++k) {
    EXPECT_EQ(s.merged.calls[k].first, whole.calls[k].first) << where;
    auto a = nlohmann::json::parse(s.merged.calls[k].second, nullptr, false);
    ASSERT_FALSE(a.is_discarded()) << where << ": " << s.merged.calls[k].second;
    EXPECT_EQ(a, nlohmann::json::parse(whole.calls[k].second)) << where;
  }
}

// Checks every split, and incremental mode fed byte by byte and in two pieces split anywhere.
// Returns the whole parse and (streamed) how many fragments the byte-by-byte run sent.
Result check_block_format(RK rk, TK tk, const std::string& text, const ParseContext& ctx = {}, int* streamed = nullptr) {
  Result whole = check_all_splits(rk, tk, text, ctx);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Streamed s = run_incremental(rk, tk, bytes, ctx);
  expect_streamed_equals(s, whole, "byte by byte");
  if (streamed) *streamed = s.fragments;
  for (size_t i = 0; i <= text.size(); ++i)
    expect_streamed_equals(run_incremental(rk, tk, {text.substr(0, i), text.substr(i)}, ctx), whole,
                           "split at " + std::to_string(i));
  return whole;
}

// Malformed or cut blocks are content, unchanged.
void expect_content(TK tk, const std::string& text) {
  Result r = check_all_splits(RK::none, tk, text);
  EXPECT_TRUE(r.calls.empty()) << text;
  EXPECT_EQ(r.content, text);
}
}  // namespace

TEST(ToolCallParser, NewKindNames) {
  EXPECT_EQ(ToolCallParser::kind_from_name("mistral"), TK::mistral);
  EXPECT_EQ(ToolCallParser::kind_from_name("deepseek_v3"), TK::deepseek_v3);
  EXPECT_EQ(ToolCallParser::kind_from_name("deepseek_v31"), TK::deepseek_v31);
  EXPECT_EQ(ToolCallParser::kind_from_name("kimi_k2"), TK::kimi_k2);
  EXPECT_EQ(ToolCallParser::kind_from_name("qwen3_coder"), TK::qwen3_coder);
  EXPECT_EQ(ToolCallParser::kind_from_name("glm45"), TK::glm45);
  EXPECT_EQ(ToolCallParser::kind_from_name("minimax_m2"), TK::minimax_m2);
  EXPECT_THROW(ToolCallParser::kind_from_name("openai"), ts::Error);
  EXPECT_EQ(ReasoningParser::kind_from_name("deepseek_v3"), RK::deepseek_v3);
  EXPECT_EQ(ReasoningParser::kind_from_name("glm45"), RK::glm45);
  EXPECT_EQ(ReasoningParser::kind_from_name("kimi_k2"), RK::kimi_k2);
  EXPECT_EQ(ReasoningParser::kind_from_name("minimax_m2"), RK::minimax_m2);
  EXPECT_EQ(ReasoningParser::kind_from_name("minimax_m2_append_think"), RK::minimax_m2_append_think);
  EXPECT_TRUE(has_tool_call_grammar(TK::hermes));
  EXPECT_TRUE(has_tool_call_grammar(TK::llama3));
  for (TK k : {TK::mistral, TK::deepseek_v3, TK::deepseek_v31, TK::kimi_k2, TK::qwen3_coder, TK::glm45, TK::minimax_m2})
    EXPECT_TRUE(has_tool_call_grammar(k));
  EXPECT_FALSE(has_tool_call_grammar(TK::none));
}

// mistral-7b-instruct-v0.3.jinja / mistral-nemo-instruct-2407.jinja render an assistant turn with
// two calls (ids must be 9 alphanumerics) as below (then eos).
TEST(ToolCallParser, MistralTemplateRendered) {
  for (std::string marker : {"[TOOL_CALLS] [", "[TOOL_CALLS]["}) {
    auto r = check_block_format(RK::none, TK::mistral,
                                marker + "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
                                         "\"abcDEF123\"}, {\"name\": \"get_time\", \"arguments\": {\"tz\": "
                                         "\"Europe/Zürich\", \"days\": 3}, \"id\": \"xyzXYZ789\"}]");
    EXPECT_EQ(r.calls, kTwoCalls);
    EXPECT_EQ(r.content, "");
  }
}

TEST(ToolCallParser, MistralV11AndContent) {
  // Tokenizer v11+: NAME{ARGS} after each marker (also NAME[ARGS]{...}); content before kept.
  auto r = check_block_format(RK::none, TK::mistral,
                              "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time"
                              "{\"tz\": \"Europe/Zürich\", \"days\": 3}");
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.");
  // String-encoded arguments, unicode, text after the calls.
  auto s = check_block_format(RK::none, TK::mistral,
                              "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": \\\"中文 €\\\"}\"}] done");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(s.calls[0].second)["q"], "中文 €");
  EXPECT_EQ(s.content, " done");
}

TEST(ToolCallParser, MistralMalformedStaysContent) {
  expect_content(TK::mistral, "[TOOL_CALLS] [{\"name\": 1, \"arguments\": {}}] after");
  expect_content(TK::mistral, "[TOOL_CALLS] not a call at all");
  expect_content(TK::mistral, "x [TOOL_CALLS] [{\"name\": \"f\", \"argu");  // cut (max_tokens)
  expect_content(TK::mistral, "plain [TOOL_CA");
}

// deepseek-r1.jinja (DeepSeek-V3 / R1 tool calls: --tool-call-parser deepseek_v3), assistant turn
// with content "Checking." and two calls (then <｜end▁of▁sentence｜>).
TEST(ToolCallParser, DeepSeekV3TemplateRendered) {
  auto r = check_block_format(
      RK::none, TK::deepseek_v3,
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
      "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": "
      "\"Europe/Zürich\", \"days\": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.");
}

TEST(ToolCallParser, DeepSeekV3ReasoningAndMalformed) {
  // R1: the template opened <think>.
  auto r = check_block_format(RK::deepseek_r1, TK::deepseek_v3,
                              "Need it.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
                              "```json\n{\"q\": \"€ 中文\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(r.reasoning, "Need it.\n");
  EXPECT_EQ(r.content, "\n\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\"q\":\"€ 中文\"}");
  expect_content(TK::deepseek_v3,
                 "a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{oops}\n```"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜> b");
  expect_content(TK::deepseek_v3, "a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\"");
}

// deepseek-v3.1.jinja, assistant turn with content "Checking." and two calls.
TEST(ToolCallParser, DeepSeekV31TemplateRendered) {
  auto r = check_block_format(RK::none, TK::deepseek_v31,
                              "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
                              "\"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": "
                              "\"Europe/Zürich\", \"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.");
}

TEST(ToolCallParser, DeepSeekV31SeveralBlocksAndMalformed) {
  const std::string text = "A <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                           "<｜tool▁calls▁end｜> B <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>"
                           "{\"s\": \"<｜tool▁call▁end｜> inside\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  // Streamed, a call is out at its head and reads its JSON string-aware: g's argument holds the
  // marker.
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Streamed st = run_incremental(RK::none, TK::deepseek_v31, bytes);
  ASSERT_EQ(st.merged.calls.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(st.merged.calls[1].second)["s"], "<｜tool▁call▁end｜> inside");
  EXPECT_EQ(st.merged.content, "A  B");  // the space before a block of calls is dropped
  // Parsed whole, a close marker inside a JSON string is not understood (as in vLLM): that block
  // stays text.
  auto r = check_all_splits(RK::none, TK::deepseek_v31, text);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], Call("f", "{}"));
  EXPECT_EQ(r.content, "A  B <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"s\": \"<｜tool▁call▁end｜> "
                       "inside\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  expect_content(TK::deepseek_v31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f {}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  // Closed by EOS without <｜tool▁calls▁end｜>: the complete calls still count.
  auto e = check_block_format(RK::none, TK::deepseek_v31,
                              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>");
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.content, "");
}

// kimi-k2-instruct.jinja (and kimi-k2.5.jinja with the model's own ids) render the two calls so.
TEST(ToolCallParser, KimiK2TemplateRendered) {
  const std::string calls =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
      "\"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{\"tz\": "
      "\"Europe/Zürich\", \"days\": 3}<|tool_call_end|><|tool_calls_section_end|>";
  auto r = check_block_format(RK::none, TK::kimi_k2, "Checking." + calls);
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.");
  // kimi-k2.5: the generation prompt opens <think>; the reasoning ends at </think>, or where the
  // tool-call section starts.
  auto t = check_block_format(RK::kimi_k2, TK::kimi_k2, "Weather first.</think>Checking." + calls);
  EXPECT_EQ(t.reasoning, "Weather first.");
  EXPECT_EQ(t.content, "Checking.");
  EXPECT_EQ(t.calls, kTwoCalls);
  auto u = check_block_format(RK::kimi_k2, TK::kimi_k2, "Weather first." + calls);
  EXPECT_EQ(u.reasoning, "Weather first.");
  EXPECT_EQ(u.content, "");
  EXPECT_EQ(u.calls, kTwoCalls);
  // The instruct template writes a string argument through tojson: a JSON string holding the object.
  auto s = check_block_format(RK::none, TK::kimi_k2,
                              "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_"
                              "begin|>\"{\\\"city\\\": \\\"Oslo\\\"}\"<|tool_call_end|><|tool_calls_section_end|>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0], Call("get_weather", "{\"city\":\"Oslo\"}"));
}

TEST(ToolCallParser, KimiK2Malformed) {
  // vLLM's id shape is NAME:IDX; a bare id is not a call.
  expect_content(TK::kimi_k2, "x<|tool_calls_section_begin|><|tool_call_begin|>call_1<|tool_call_argument_begin|>{}"
                              "<|tool_call_end|><|tool_calls_section_end|>y");
  expect_content(TK::kimi_k2, "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
                              "{\"a\": }<|tool_call_end|><|tool_calls_section_end|>");
  expect_content(TK::kimi_k2, "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_arg");
}

// qwen3-coder-30b-a3b-instruct.jinja, assistant turn with content "Checking." and two calls.
TEST(ToolCallParser, Qwen3CoderTemplateRendered) {
  const std::string text =
      "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Zürich\n</parameter>\n<parameter=days>"
      "\n3\n</parameter>\n</function>\n</tool_call>";
  auto r = check_block_format(RK::none, TK::qwen3_coder, text);
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.\n\n");
  // Typed by the schema: days declared a string stays "3".
  auto s = check_block_format(RK::none, TK::qwen3_coder, text, with_tools(R"([
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
       "properties": {"tz": {"type": "string"}, "days": {"type": "string"}}}}}])"));
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[1].second, "{\"tz\":\"Europe/Zürich\",\"days\":\"3\"}");
}

TEST(ToolCallParser, Qwen3CoderValuesAndMalformed) {
  auto ctx = with_tools(R"([{"type": "function", "function": {"name": "run", "parameters": {"type": "object",
      "properties": {"code": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"},
                     "ok": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": ["array", "null"]},
                     "none": {"type": "integer"}}}}}])");
  auto r = check_block_format(RK::none, TK::qwen3_coder,
                              "<tool_call>\n<function=run>\n<parameter=code>\nprint(\"中文\")\n\nx = 1\n</parameter>\n"
                              "<parameter=n>\n42\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n<parameter=ok>\nTrue\n"
                              "</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=tags>\n[\"t\"]\n"
                              "</parameter>\n<parameter=none>\nnull\n</parameter>\n<parameter=extra>\nfree text\n"
                              "</parameter>\n</function>\n</tool_call>",
                              ctx);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\"code\":\"print(\\\"中文\\\")\\n\\nx = 1\",\"n\":42,\"x\":2.5,\"ok\":true,\"opts\":{\"a\":"
                               "[1]},\"tags\":[\"t\"],\"none\":null,\"extra\":\"free text\"}");
  // No schema: JSON when it parses, else a string.
  auto n = check_block_format(RK::none, TK::qwen3_coder,
                              "<tool_call>\n<function=run>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello\n"
                              "</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(n.calls.size(), 1u);
  EXPECT_EQ(n.calls[0].second, "{\"n\":42,\"s\":\"hello\"}");
  expect_content(TK::qwen3_coder, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> after");
  expect_content(TK::qwen3_coder, "<tool_call>\n<function=run>\n<parameter=code>\nprint(");
}

// glm-4.6v-flash.jinja: after <|assistant|>, "\n<think></think>\nChecking.\n<tool_call>..." .
TEST(ToolCallParser, Glm45TemplateRendered) {
  auto r = check_block_format(RK::glm45, TK::glm45,
                              "\n<think></think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
                              "Paris</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>"
                              "Europe/Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>");
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "\nChecking.\n");
}

TEST(ToolCallParser, Glm45ValuesAndMalformed) {
  // GLM-4.7 writes no newline after the name; typed by the schema when given.
  auto ctx = with_tools(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}}}])");
  auto r = check_block_format(RK::glm45, TK::glm45,
                              "<think>Think: 中文</think><tool_call>f<arg_key>id</arg_key><arg_value>007</arg_value>"
                              "<arg_key>n</arg_key><arg_value>7</arg_value></tool_call> tail",
                              ctx);
  EXPECT_EQ(r.reasoning, "Think: 中文");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\"id\":\"007\",\"n\":7}");
  EXPECT_EQ(r.content, " tail");
  auto g = check_block_format(RK::none, TK::glm45, "<tool_call>get_time\n</tool_call>");
  ASSERT_EQ(g.calls.size(), 1u);
  EXPECT_EQ(g.calls[0], Call("get_time", "{}"));
  expect_content(TK::glm45, "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>");
  expect_content(TK::glm45, "<tool_call>two words\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>");
  expect_content(TK::glm45, "ok <tool_call>f\n<arg_key>a</arg_key>\n<arg_val");
}

// minimax-m2.jinja: after "]~b]ai\n" (the generation prompt adds "<think>\n"), content, the calls.
TEST(ToolCallParser, MiniMaxM2TemplateRendered) {
  const std::string calls =
      "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n"
      "<invoke name=\"get_time\">\n<parameter name=\"tz\">Europe/Zürich</parameter>\n<parameter name=\"days\">3"
      "</parameter>\n</invoke>\n</minimax:tool_call>";
  auto r = check_block_format(RK::none, TK::minimax_m2, "Checking.\n" + calls);
  EXPECT_EQ(r.calls, kTwoCalls);
  EXPECT_EQ(r.content, "Checking.\n");
  auto t = check_block_format(RK::minimax_m2, TK::minimax_m2, "Need weather.\n</think>\n\n" + calls);
  EXPECT_EQ(t.reasoning, "Need weather.\n");
  EXPECT_EQ(t.content, "\n\n");
  EXPECT_EQ(t.calls, kTwoCalls);
  // minimax_m2_append_think: all content, <think> put back.
  auto a = check_all_splits(RK::minimax_m2_append_think, TK::none, "Need weather.\n</think>\n\nok");
  EXPECT_EQ(a.reasoning, "");
  EXPECT_EQ(a.content, "<think>Need weather.\n</think>\n\nok");
}

TEST(ToolCallParser, MiniMaxM2ValuesAndMalformed) {
  auto ctx = with_tools(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"s": {"type": "string"}, "b": {"type": "boolean"}}}}}])");
  auto r = check_block_format(RK::none, TK::minimax_m2,
                              "<minimax:tool_call><invoke name='f'><parameter name=\"s\">true</parameter><parameter "
                              "name=\"b\">true</parameter><parameter name=\"u\">€</parameter></invoke></minimax:tool_call>",
                              ctx);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\"s\":\"true\",\"b\":true,\"u\":\"€\"}");
  expect_content(TK::minimax_m2, "<minimax:tool_call>\n<invoke>\n</invoke>\n</minimax:tool_call>");
  expect_content(TK::minimax_m2, "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1</invoke>\n"
                                 "</minimax:tool_call>");
  expect_content(TK::minimax_m2, "x <minimax:tool_call>\n<invoke name=\"f\">\n<parameter na");
}

TEST(ReasoningParser, DeepSeekV3FollowsThinking) {
  // vLLM's deepseek_v3: deepseek_r1 when thinking (or enable_thinking) is on, else no reasoning.
  auto off = check_all_splits(RK::deepseek_v3, TK::none, "Hi</think> there");
  EXPECT_EQ(off.reasoning, "");
  EXPECT_EQ(off.content, "Hi</think> there");
  ParseContext on;
  on.thinking = true;
  auto r = check_all_splits(RK::deepseek_v3, TK::deepseek_v31,
                            "Plan.</think>Ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                            "<｜tool▁calls▁end｜>",
                            on);
  EXPECT_EQ(r.reasoning, "Plan.");
  EXPECT_EQ(r.content, "Ok");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(ReasoningParser(RK::deepseek_v3, true).start(), ReasoningParser::Start::reasoning);
  EXPECT_EQ(ReasoningParser(RK::deepseek_v3).start(), ReasoningParser::Start::content);
  EXPECT_EQ(ReasoningParser(RK::kimi_k2, false).start(), ReasoningParser::Start::content);
  EXPECT_EQ(ReasoningParser(RK::glm45).start(), ReasoningParser::Start::think_tag);
}

TEST(ReasoningParser, Glm45AndKimiAndMiniMax) {
  auto g = check_all_splits(RK::glm45, TK::none, " \n<think>a < b</think>\nHi");
  EXPECT_EQ(g.reasoning, "a < b");
  EXPECT_EQ(g.content, "\nHi");
  auto n = check_all_splits(RK::glm45, TK::none, "\nNo thinking.");
  EXPECT_EQ(n.reasoning, "");
  EXPECT_EQ(n.content, "\nNo thinking.");
  auto k = check_all_splits(RK::kimi_k2, TK::none, "<think>x</think>y <|tool_calls_section_begin|>");
  EXPECT_EQ(k.reasoning, "x");
  EXPECT_EQ(k.content, "y <|tool_calls_section_begin|>");
  ParseContext off;
  off.thinking = false;
  auto ko = check_all_splits(RK::kimi_k2, TK::none, "plain</think>", off);
  EXPECT_EQ(ko.content, "plain</think>");
  auto m = check_all_splits(RK::minimax_m2, TK::none, "<think>\nhmm</think>done");
  EXPECT_EQ(m.reasoning, "\nhmm");
  EXPECT_EQ(m.content, "done");
}

// Streaming: a block format's call is out (head, then argument text) before its block closes.
TEST(ToolCallParser, BlockFormatsStreamBeforeTheBlockCloses) {
  struct Case {
    TK kind;
    std::string before, after;  // the text so far / the rest
    std::string args_so_far;    // what the head + fragments hold after `before`
  };
  const std::vector<Case> cases = {
      {TK::deepseek_v31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Pa",
       "ris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "{\"city\": \"Pa"},
      {TK::deepseek_v3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\":",
       " \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "{\"city\":"},
      {TK::kimi_k2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"c",
       "ity\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>", "{\"c"},
      {TK::mistral, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\"", ": \"Paris\"}}]", "{\"city\""},
      {TK::mistral, "[TOOL_CALLS]get_weather[ARGS]{\"ci", "ty\": \"Paris\"}", "{\"ci"},
      {TK::qwen3_coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3",
       "\n</parameter>\n</function>\n</tool_call>", "{\"city\": \"Paris\""},
      {TK::glm45, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>da",
       "ys</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "{\"city\": \"Paris\""},
      {TK::minimax_m2, "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n",
       "<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>", "{\"city\": \"Paris\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.before);
    // Fed without finish(), to see what is out mid-block.
    ChatOutputParser p(RK::none, c.kind);
    p.set_incremental_tool_calls(true);
    ChatDelta d = p.feed(c.before);
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, c.args_so_far);
    EXPECT_TRUE(d.content.empty()) << d.content;
    ChatDelta rest = p.feed(c.after);
    ChatDelta fin = p.finish();
    std::string args = d.tool_calls[0].arguments;
    for (const ChatDelta* x : {&rest, &fin})
      for (const auto& t : x->tool_calls) {
        EXPECT_TRUE(t.continuation);
        args += t.arguments;
      }
    auto j = nlohmann::json::parse(args);
    EXPECT_EQ(j["city"], "Paris");
  }
}

TEST(ToolCallParser, TypedParamValue) {
  EXPECT_EQ(typed_param_value("[1, 2]", nullptr, "f", "a"), nlohmann::ordered_json::parse("[1, 2]"));
  EXPECT_EQ(typed_param_value("  Paris ", nullptr, "f", "a"), "  Paris ");
  EXPECT_EQ(typed_param_value("", nullptr, "f", "a"), "");
}

// tool_choice with every parser kind: required / named get the format's forced-call grammar,
// auto (with --tool-choice-auto-grammar) its grammar triggered at the block's open marker, none
// nothing; required beside another constraint is a 400; the reasoning setting follows the parser.
TEST(ToolCallParser, ToolChoiceGrammarForEveryKind) {
  auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (TK k : {TK::none, TK::hermes, TK::llama3, TK::mistral, TK::deepseek_v3, TK::deepseek_v31, TK::kimi_k2, TK::qwen3_coder,
               TK::glm45, TK::minimax_m2})
    for (auto choice : {ToolChoice::required, ToolChoice::named, ToolChoice::auto_, ToolChoice::none}) {
      SCOPED_TRACE(int(k) * 10 + int(choice));
      ChatRequest cr;
      cr.tools = tools;
      cr.tool_choice = choice;
      cr.tool_choice_name = choice == ToolChoice::named ? "get_weather" : "";
      ASSERT_NO_THROW(apply_tool_choice(cr, k, RK::none, true));
      if (choice == ToolChoice::none) {
        EXPECT_EQ(cr.structured, nullptr);
        continue;
      }
      ASSERT_NE(cr.structured, nullptr);
      EXPECT_EQ(cr.params.structured, cr.structured);
      EXPECT_EQ(cr.structured->kind, choice == ToolChoice::auto_ ? "tool_call_auto" : "tool_call");
      ChatRequest off;
      off.tools = tools;
      off.tool_choice = choice;
      off.tool_choice_name = cr.tool_choice_name;
      apply_tool_choice(off, k, RK::none, false);
      EXPECT_EQ(off.structured == nullptr, choice == ToolChoice::auto_);  // auto without the grammar: parsed only
    }
  ChatRequest cr;
  cr.tools = tools;
  cr.tool_choice = ToolChoice::required;
  cr.structured = std::make_shared<ts::StructuredRequest>();
  EXPECT_THROW(apply_tool_choice(cr, TK::minimax_m2, RK::minimax_m2, false), ApiError);
  ChatRequest a;
  a.tools = tools;
  a.tool_choice = ToolChoice::auto_;
  a.structured = std::make_shared<ts::StructuredRequest>();  // response_format: kept, auto not forced
  apply_tool_choice(a, TK::minimax_m2, RK::minimax_m2, true);
  EXPECT_EQ(a.structured->reasoning, ts::StructuredRequest::Reasoning::deepseek_r1);
  EXPECT_EQ(a.params.structured, a.structured);
  // hermes still gets its grammar; deepseek_v3 reasoning follows chat_template_kwargs.
  ChatRequest h;
  h.tools = tools;
  h.tool_choice = ToolChoice::required;
  h.template_kwargs = {{"thinking", true}};
  apply_tool_choice(h, TK::hermes, RK::deepseek_v3, false);
  ASSERT_NE(h.structured, nullptr);
  EXPECT_EQ(h.structured->kind, "tool_call");
  EXPECT_EQ(h.structured->reasoning, ts::StructuredRequest::Reasoning::deepseek_r1);
  EXPECT_EQ(parse_context(h).thinking, std::optional<bool>(true));
  ASSERT_NE(parse_context(h).tools, nullptr);
}
