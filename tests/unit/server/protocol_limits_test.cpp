// Issue #23: request JSON nesting is limited before parsing (a 50k-deep message was a stack
// overflow), and a number out of double range is a 400 (was a 500).
#include <gtest/gtest.h>

#include <string>

#include "server/protocol.h"

using namespace ts::server;

namespace {

int status_of(const std::string& body, std::string* msg = nullptr) {
  try {
    Json j = parse_body(body);
    ModelInfo info{"m", "/m", 4096, 1000};
    if (j.contains("messages")) parse_chat_request(j, info);
    return 200;
  } catch (const ApiError& e) {
    if (msg) *msg = e.what();
    return e.status;
  }
}

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

TEST(ProtocolLimits, DeepMessageIs400) {
  std::string msg;
  std::string body = R"({"messages":[{"role":"user","content":)" + nested(50000) + "}]}";
  EXPECT_EQ(status_of(body, &msg), 400);
  EXPECT_NE(msg.find("nested deeper than 64 levels (--max-json-depth)"), std::string::npos) << msg;
}

TEST(ProtocolLimits, DepthAtTheLimitIsAccepted) {
  // The body object is level 1: 63 more levels fit.
  std::string body = R"({"prompt":"x","extra":)" + nested(63) + "}";
  EXPECT_EQ(status_of(body), 200);
  body = R"({"prompt":"x","extra":)" + nested(64) + "}";
  EXPECT_EQ(status_of(body), 400);
}

TEST(ProtocolLimits, DeepToolArgumentsAre400) {
  std::string inner;
  for (int i = 0; i < 2000; ++i) inner += "{\\\"a\\\":";
  inner += "1";
  for (int i = 0; i < 2000; ++i) inner += "}";
  std::string body = R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",)"
                     R"("function":{"name":"f","arguments":")" + inner + R"("}}]}]})";
  std::string msg;
  EXPECT_EQ(status_of(body, &msg), 400);
  EXPECT_NE(msg.find("function.arguments is nested deeper"), std::string::npos) << msg;
}

TEST(ProtocolLimits, FlagChangesTheLimit) {
  set_max_json_depth(3);
  EXPECT_EQ(status_of(R"({"prompt":"x","a":[[1]]})"), 200);
  EXPECT_EQ(status_of(R"({"prompt":"x","a":[[[1]]]})"), 400);
  set_max_json_depth(64);
}

TEST(ProtocolLimits, NumberOverflowIs400) {
  std::string msg;
  EXPECT_EQ(status_of(R"({"prompt":"x","temperature":1e400})", &msg), 400);
  EXPECT_NE(msg.find("1e400"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
}

}  // namespace
