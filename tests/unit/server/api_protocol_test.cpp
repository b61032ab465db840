// The Responses / Messages / tokenize / embeddings protocol translation and the --api-key check
// (no model, no HTTP).
#include <gtest/gtest.h>

#include <cmath>

#include "server/api_protocol.h"
#include "server/response_store.h"

using namespace ts;
using namespace ts::server;

namespace {
ModelInfo info() {
  ModelInfo m;
  m.served_name = "pycoder";
  m.model_path = "/models/pycoder";
  m.context_length = 64;
  m.vocab_size = 300;
  return m;
}
std::vector<int32_t> enc(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c + 1);
  return ids;
}
Json J(const char* s) { return Json::parse(s); }

template <class F>
void expect_400(F fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << needle;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(ApiKey, BearerAndXApiKey) {
  std::vector<std::pair<std::string, std::string>> h;
  EXPECT_TRUE(api_key_ok(h, ""));
  EXPECT_FALSE(api_key_ok(h, "k"));
  EXPECT_TRUE(api_key_ok({{"Authorization", "Bearer k"}}, "k"));
  EXPECT_TRUE(api_key_ok({{"authorization", "bearer k"}}, "k"));
  EXPECT_FALSE(api_key_ok({{"Authorization", "Bearer kk"}}, "k"));
  EXPECT_FALSE(api_key_ok({{"Authorization", "k"}}, "k"));
  EXPECT_TRUE(api_key_ok({{"X-Api-Key", "k"}}, "k"));
  EXPECT_FALSE(api_key_ok({{"x-api-key", "K"}}, "k"));
  EXPECT_TRUE(api_key_exempt("/health"));
  EXPECT_TRUE(api_key_exempt("/metrics"));
  EXPECT_FALSE(api_key_exempt("/v1/models"));
  EXPECT_FALSE(api_key_exempt("/version"));
}

TEST(Tokenize, PromptOrMessages) {
  TokenizeRequest p = parse_tokenize_request(J(R"({"prompt": "ab"})"), info());
  EXPECT_FALSE(p.chat);
  EXPECT_TRUE(p.add_special_tokens);
  TokenizeRequest m = parse_tokenize_request(J(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})"), info());
  EXPECT_TRUE(m.chat);
  EXPECT_FALSE(m.add_special_tokens);
  EXPECT_EQ(m.chat_body["add_generation_prompt"], false);
  EXPECT_EQ(m.chat_body["messages"].size(), 1u);
  expect_400([] { parse_tokenize_request(J(R"({})"), info()); }, "Exactly one");
  expect_400([] { parse_tokenize_request(J(R"({"prompt": "a", "messages": []})"), info()); }, "Exactly one");
  Json r = tokenize_response({1, 2}, 64, nullptr);
  EXPECT_EQ(r["count"], 2);
  EXPECT_TRUE(r["token_strs"].is_null());
  EXPECT_EQ(parse_detokenize_request(J(R"({"tokens": [1, 2]})"), info()), (std::vector<int32_t>{1, 2}));
  expect_400([] { parse_detokenize_request(J(R"({"tokens": [300]})"), info()); }, "outside the vocabulary");
  expect_400([] { parse_detokenize_request(J(R"({"tokens": "ab"})"), info()); }, "'tokens' is required");
}

TEST(Embeddings, InputsFormatsDimensions) {
  auto e = parse_embeddings_request(J(R"({"input": "ab"})"), info(), enc);
  ASSERT_EQ(e.inputs.size(), 1u);
  EXPECT_EQ(e.inputs[0], enc("ab"));
  EXPECT_FALSE(e.base64);
  e = parse_embeddings_request(J(R"({"input": ["a", [5, 6]], "encoding_format": "base64", "dimensions": 2})"), info(), enc);
  EXPECT_EQ(e.inputs.size(), 2u);
  EXPECT_EQ(e.inputs[1], (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(e.base64);
  EXPECT_EQ(*e.dimensions, 2);
  e = parse_embeddings_request(J(R"({"input": [7, 8, 9]})"), info(), enc);
  EXPECT_EQ(e.inputs[0].size(), 3u);
  expect_400([] { parse_embeddings_request(J(R"({"input": ""})"), info(), enc); }, "empty");
  expect_400([] { parse_embeddings_request(J(R"({"input": []})"), info(), enc); }, "must not be empty");
  expect_400([] { parse_embeddings_request(J(R"({"input": "a", "encoding_format": "int8"})"), info(), enc); }, "encoding_format");
  expect_400([] { parse_embeddings_request(J(R"({"input": "a", "dimensions": 0})"), info(), enc); }, "dimensions");
  expect_400([] { parse_embeddings_request(Json{{"input", std::string(65, 'x')}}, info(), enc); }, "maximum context length");

  std::vector<float> v = {3, 4, 12};
  finish_embedding(v, std::nullopt);
  EXPECT_NEAR(v[0], 3.0 / 13, 1e-6);
  std::vector<float> w = {3, 4, 12};
  finish_embedding(w, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NEAR(w[0], 0.6, 1e-6);
  EXPECT_NEAR(w[1], 0.8, 1e-6);
  std::vector<float> x = {1};
  expect_400([&] { finish_embedding(x, 2); }, "larger than");
}

TEST(Embeddings, Base64IsLittleEndianFloat32) {
  EXPECT_EQ(base64_encode("", 0), "");
  EXPECT_EQ(base64_encode("f", 1), "Zg==");
  EXPECT_EQ(base64_encode("fo", 2), "Zm8=");
  EXPECT_EQ(base64_encode("foobar", 6), "Zm9vYmFy");
  // 1.0f = 00 00 80 3f
  EXPECT_EQ(embedding_value({1.0f}, true), "AACAPw==");
  EXPECT_EQ(embedding_value({1.0f, -2.0f}, false), J("[1.0, -2.0]"));
}

TEST(Messages, ToChat) {
  Json chat = anthropic_to_chat(J(R"({
    "model": "pycoder", "max_tokens": 20, "system": [{"type": "text", "text": "Be terse."}],
    "stop_sequences": ["END"], "temperature": 0.5, "top_k": 3,
    "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Checking."},
                                         {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                                    {"type": "text", "text": "Thanks"}]}
    ]})"));
  EXPECT_EQ(chat["max_tokens"], 20);
  EXPECT_EQ(chat["stop"], J(R"(["END"])"));
  EXPECT_EQ(chat["top_k"], 3);
  const Json& m = chat["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], J(R"({"role": "system", "content": "Be terse."})"));
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(J(m[2]["tool_calls"][0]["function"]["arguments"].get<std::string>().c_str()), J(R"({"city": "Paris"})"));
  EXPECT_EQ(m[3], J(R"({"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"})"));
  EXPECT_EQ(m[4], J(R"({"role": "user", "content": "Thanks"})"));
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], J(R"({"type": "object"})"));
  EXPECT_EQ(chat["tool_choice"]["function"]["name"], "get_weather");
  // the chat validator accepts the translation
  ModelInfo mi = info();
  EXPECT_NO_THROW(parse_chat_request(chat, mi));

  EXPECT_EQ(anthropic_to_chat(J(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})"))["tool_choice"],
            "required");
  expect_400([] { anthropic_to_chat(J(R"({"messages": [{"role": "user", "content": "x"}]})")); }, "max_tokens");
  expect_400([] { anthropic_to_chat(J(R"({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})")); }, "role");
  expect_400([] { anthropic_to_chat(J(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]})")); },
             "not supported");
}

TEST(Messages, OutputShapes) {
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::length, false, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::stop, true, false), "tool_use");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::stop, false, true), "stop_sequence");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::stop, false, false), "end_turn");
  ChatDelta d{"think", "hi", {ToolCall{"call_1", "f", R"({"a": 1})"}}};
  Json c = anthropic_content(d);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0]["type"], "thinking");
  EXPECT_EQ(c[1], J(R"({"type": "text", "text": "hi"})"));
  EXPECT_EQ(c[2]["type"], "tool_use");
  EXPECT_EQ(c[2]["input"], J(R"({"a": 1})"));
  EXPECT_EQ(c[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(anthropic_content(ChatDelta{})[0], J(R"({"type": "text", "text": ""})"));
  Json e = anthropic_error(401, "no");
  EXPECT_EQ(e, J(R"({"type": "error", "error": {"type": "authentication_error", "message": "no"}})"));
  EXPECT_EQ(arguments_object("not json"), Json::object());
}

TEST(Responses, ToChat) {
  Json conv;
  Json chat = responses_to_chat(J(R"({"input": "hi", "instructions": "Be nice.", "max_output_tokens": 7})"), Json::array(), conv);
  EXPECT_EQ(chat["max_tokens"], 7);
  EXPECT_EQ(chat["messages"], J(R"([{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(conv, J(R"([{"role": "user", "content": "hi"}])"));  // instructions are not carried over

  Json history = J(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])");
  chat = responses_to_chat(J(R"({
    "input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
      {"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"k\":1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "ok"},
      {"type": "reasoning", "id": "rs_1", "summary": []}
    ],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "f"},
    "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}}})"),
                           history, conv);
  const Json& m = chat["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0]["content"], "a");
  EXPECT_EQ(m[2], J(R"({"role": "system", "content": "dev"})"));
  EXPECT_EQ(m[3]["content"], "x\ny");
  EXPECT_EQ(m[4]["tool_calls"].size(), 2u);  // consecutive calls: one assistant turn
  EXPECT_EQ(m[4]["tool_calls"][1]["function"]["arguments"], "{\"k\":1}");
  EXPECT_EQ(m[5], J(R"({"role": "tool", "tool_call_id": "c1", "content": "ok"})"));
  EXPECT_EQ(conv.size(), 6u);
  EXPECT_EQ(chat["tools"][0]["function"]["strict"], true);
  EXPECT_EQ(chat["tool_choice"]["function"]["name"], "f");
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "out");

  expect_400([&] { responses_to_chat(J(R"({})"), Json::array(), conv); }, "'input' is required");
  expect_400([&] { responses_to_chat(J(R"({"input": [{"type": "file_search_call"}]})"), Json::array(), conv); }, "not supported");
  expect_400([&] { responses_to_chat(J(R"({"input": "x", "tools": [{"type": "web_search"}]})"), Json::array(), conv); },
             "only function tools");
}

TEST(Responses, OutputAndObject) {
  ResponsesOutput o = responses_output(ChatDelta{"r", "hello", {ToolCall{"", "f", "{}"}}});
  ASSERT_EQ(o.items.size(), 3u);
  EXPECT_EQ(o.items[0]["type"], "reasoning");
  EXPECT_EQ(o.items[1]["type"], "message");
  EXPECT_EQ(o.items[1]["content"][0]["text"], "hello");
  EXPECT_EQ(o.items[2]["type"], "function_call");
  EXPECT_EQ(o.items[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  ASSERT_EQ(o.messages.size(), 1u);
  EXPECT_EQ(o.messages[0]["tool_calls"][0]["id"], o.items[2]["call_id"]);
  Usage u{5, 3, 1};
  Json r = response_object("resp_1", 10, "m", J(R"({"instructions": "i", "store": false})"), o.items, "completed", &u);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["instructions"], "i");
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(r["usage"]["total_tokens"], 8);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 1);
  EXPECT_TRUE(r["incomplete_details"].is_null());
  Json inc = response_object("resp_2", 10, "m", Json::object(), Json::array(), "incomplete", nullptr);
  EXPECT_EQ(inc["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_TRUE(inc["usage"].is_null());
  EXPECT_EQ(sse_event("x", J(R"({"a": 1})")), "event: x\ndata: {\"a\":1}\n\n");
}

TEST(Responses, StoreIsBoundedLru) {
  ResponseStore s(2);
  s.put("a", {J("[1]"), J("{}")});
  s.put("b", {J("[2]"), J("{}")});
  ASSERT_TRUE(s.get("a"));  // a is now the most recent
  s.put("c", {J("[3]"), J("{}")});
  EXPECT_EQ(s.size(), 2u);
  EXPECT_FALSE(s.get("b"));
  EXPECT_EQ(s.get("a")->conversation, J("[1]"));
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  ResponseStore none(0);
  none.put("a", {});
  EXPECT_FALSE(none.get("a"));
}

TEST(PromptLogprobs, EchoAndVllmShapes) {
  auto piece = [](int32_t id) { return std::string(1, char('a' + id)); };
  std::vector<int32_t> ids = {0, 1, 2};
  std::vector<TokenLogprob> lps = {{1, -0.5f, {{1, -0.5f}, {3, -1.0f}}}, {2, -2.0f, {{4, -0.1f}, {2, -2.0f}}}};
  CompletionLogprobs L;
  size_t off = 0;
  add_prompt_logprobs(L, ids, lps, 1, piece, off);
  EXPECT_EQ(off, 3u);
  EXPECT_TRUE(L.token_logprobs[0].is_null());
  EXPECT_FLOAT_EQ(L.token_logprobs[2].get<float>(), -2.0f);
  // The top-1 ("e") and the prompt token's own ("c"): OpenAI's "up to logprobs + 1".
  EXPECT_EQ(L.top_logprobs[2].size(), 2u);
  EXPECT_TRUE(L.top_logprobs[2].contains("e"));
  EXPECT_FLOAT_EQ(L.top_logprobs[2]["c"].get<float>(), -2.0f);
  Json v = vllm_prompt_logprobs(ids, lps, {1, 2}, 2, piece);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_TRUE(v[0].is_null());
  EXPECT_EQ(v[2]["2"]["rank"], 2);
  EXPECT_EQ(v[2]["2"]["decoded_token"], "c");
  EXPECT_EQ(v[2]["4"]["rank"], 1);
  EXPECT_EQ(v[2].size(), 2u);
}

// Completions logprobs: the sampled token is always in its top_logprobs entry (also with
// logprobs 0), and text_offset counts characters (Python string indices), not UTF-8 bytes.
TEST(CompletionLogprobs, SampledTokenAndCharacterOffsets) {
  auto piece = [](int32_t id) { return id == 7 ? std::string("\xc3\xa9") : std::string(1, char('a' + id)); };
  CompletionLogprobs L;
  size_t off = 0;
  L.add({{7, -0.25f, {}}, {1, -1.5f, {{2, -0.5f}}}, {3, -0.1f, {{3, -0.1f}}}}, piece, off);
  ASSERT_EQ(L.top_logprobs.size(), 3u);
  EXPECT_EQ(L.top_logprobs[0].size(), 1u);  // logprobs 0: the sampled token alone
  EXPECT_FLOAT_EQ(L.top_logprobs[0]["\xc3\xa9"].get<float>(), -0.25f);
  EXPECT_EQ(L.top_logprobs[1].size(), 2u);  // top-1 "c" and the sampled "b"
  EXPECT_FLOAT_EQ(L.top_logprobs[1]["b"].get<float>(), -1.5f);
  EXPECT_EQ(L.top_logprobs[2].size(), 1u);  // sampled == top-1: once
  EXPECT_EQ(L.text_offset, Json::array({0, 1, 2}));
  EXPECT_EQ(off, 3u);
  EXPECT_EQ(text_chars("a\xc3\xa9\xf0\x9f\x98\x80z"), 4u);
}

// Chat logprobs' bytes are the token's own (a piece of a multi-byte character keeps its byte,
// where the decoded piece is U+FFFD), so clients can rebuild split characters.
TEST(ChatLogprobs, BytesAreTheTokensOwn) {
  auto piece = [](int32_t id) { return id == 1 ? std::string("\xef\xbf\xbd") : std::string("a"); };
  auto raw = [](int32_t id) { return id == 1 ? std::string("\xc3") : std::string("a"); };
  Json c = chat_logprobs_content({{1, -0.5f, {{1, -0.5f}, {2, -1.0f}}}}, 2, piece, raw);
  EXPECT_EQ(c[0]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(c[0]["bytes"], Json::array({0xc3}));
  EXPECT_EQ(c[0]["top_logprobs"][0]["bytes"], Json::array({0xc3}));
  EXPECT_EQ(c[0]["top_logprobs"][1]["bytes"], Json::array({'a'}));
  Json d = chat_logprobs_content({{1, -0.5f, {}}}, 0, piece);  // no raw bytes: the piece's UTF-8
  EXPECT_EQ(d[0]["bytes"], Json::array({0xef, 0xbf, 0xbd}));
}
