// Reasoning and tool-call parsers on recorded model outputs, fed whole, at every split point, and
// byte by byte: the streamed deltas must always add up to the non-streamed message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/output_parsers.h"

using namespace ts::server;
using RK = ReasoningParser::Kind;
using TK = ToolCallParser::Kind;

namespace {
struct Result {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Result&) const = default;
};

void add(Result& r, const ChatDelta& d) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (auto& c : d.tool_calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    r.calls.emplace_back(c.name, c.arguments);
  }
}

Result run(RK rk, TK tk, const std::vector<std::string>& pieces) {
  ChatOutputParser p(rk, tk);
  Result r;
  for (auto& s : pieces) add(r, p.feed(s));
  add(r, p.finish());
  return r;
}

// Whole, every 2-way split, every 3-way split on a coarse grid, and byte by byte.
Result check_all_splits(RK rk, TK tk, const std::string& text) {
  Result whole = run(rk, tk, {text});
  for (size_t i = 0; i <= text.size(); ++i) {
    Result r = run(rk, tk, {text.substr(0, i), text.substr(i)});
    EXPECT_EQ(r, whole) << "split at " << i;
  }
  for (size_t i = 0; i <= text.size(); i += 3)
    for (size_t j = i; j <= text.size(); j += 5) {
      Result r = run(rk, tk, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(r, whole) << "split at " << i << "," << j;
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run(rk, tk, bytes), whole) << "byte by byte";
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

Streamed run_incremental(RK rk, TK tk, const std::vector<std::string>& pieces) {
  ChatOutputParser p(rk, tk);
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
