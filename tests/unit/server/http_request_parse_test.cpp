// The front door's request parsing with its limits (server/http/request_parse), driven over byte
// strings as the fuzz target drives it: what each connection does on its reads.
#include <gtest/gtest.h>

#include <string>

#include "server/http/request_parse.h"

using namespace ts::server::http;

namespace {
HttpLimits small_limits() {
  HttpLimits l;
  l.max_header_bytes = 512;
  l.max_uri_bytes = 64;
  l.max_body_bytes = 100;
  return l;
}
}  // namespace

TEST(HttpRequestParse, ContentLengthBodyAndPath) {
  std::string b = "POST /v1/chat%2Fcompletions?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd";
  auto r = parse_one(b, small_limits());
  ASSERT_EQ(r.status, 0);
  ASSERT_TRUE(r.request);
  EXPECT_EQ(r.consumed, b.size());
  EXPECT_EQ(r.request->method, "POST");
  EXPECT_EQ(r.request->path, "/v1/chat/completions");
  EXPECT_EQ(r.request->target, "/v1/chat%2Fcompletions?x=1");
  EXPECT_EQ(r.request->body, "abcd");
}

TEST(HttpRequestParse, PipelinedRequestsOneAtATime) {
  std::string b = "GET /health HTTP/1.1\r\nHost: h\r\n\r\nGET /metrics HTTP/1.1\r\nHost: h\r\n\r\n";
  auto a = parse_one(b, small_limits());
  ASSERT_TRUE(a.request);
  EXPECT_EQ(a.request->path, "/health");
  auto c = parse_one(std::string_view(b).substr(a.consumed), small_limits());
  ASSERT_TRUE(c.request);
  EXPECT_EQ(c.request->path, "/metrics");
  EXPECT_EQ(a.consumed + c.consumed, b.size());
}

TEST(HttpRequestParse, ChunkedBodyCountsAgainstTheBodyLimit) {
  std::string ok = "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
  auto r = parse_one(ok, small_limits());
  ASSERT_TRUE(r.request);
  EXPECT_EQ(r.request->body, "hello");
  std::string big = "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 30; ++i) big += "a\r\n0123456789\r\n";  // 300 bytes in chunks of 10
  big += "0\r\n\r\n";
  EXPECT_EQ(parse_one(big, small_limits()).status, 413);
}

TEST(HttpRequestParse, LimitsAnswerTheirStatus) {
  auto l = small_limits();
  std::string long_uri = "GET /" + std::string(100, 'a') + " HTTP/1.1\r\nHost: h\r\n\r\n";
  EXPECT_EQ(parse_one(long_uri, l).status, 414);
  std::string big_header = "GET / HTTP/1.1\r\nX: " + std::string(1000, 'b') + "\r\n\r\n";
  EXPECT_EQ(parse_one(big_header, l).status, 431);
  std::string big_body = "POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'c');
  EXPECT_EQ(parse_one(big_body, l).status, 413);
  EXPECT_EQ(parse_one("GARBAGE\r\n\r\n", l).status, 400);
  EXPECT_EQ(parse_one("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", l).status, 400);
}

TEST(HttpRequestParse, IncompleteInputIsNeitherRequestNorError) {
  auto r = parse_one("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", small_limits());
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.request);
  auto h = parse_one("GET / HTTP/1.1\r\nHost:", small_limits());
  EXPECT_EQ(h.status, 0);
  EXPECT_FALSE(h.request);
}

TEST(HttpRequestParse, PercentDecodeKeepsInvalidEscapes) {
  EXPECT_EQ(percent_decode("/a%20b%zz%4"), "/a b%zz%4");
  EXPECT_EQ(percent_decode(""), "");
}
