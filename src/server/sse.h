// Server-sent events for OpenAI streaming: `data: {json}\n\n` chunks and `data: [DONE]\n\n`.
#pragma once
#include <string>

#include "server/protocol.h"

namespace httplib {
class DataSink;
}

namespace ts::server {

std::string sse_data(const Json& j);     // "data: {...}\n\n"
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
inline constexpr const char* kSseKeepAlive = ": keep-alive\n\n";  // an SSE comment; clients ignore it

// Writes events into an httplib chunked-content sink. Every write reports whether the client is
// still there: false once the connection is gone (the caller then cancels its requests).
class SseWriter {
 public:
  explicit SseWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool send(const Json& j);
  bool send_raw(const std::string& s);
  bool done();        // [DONE] then closes the chunked body
  bool ok() const { return ok_; }

 private:
  httplib::DataSink& sink_;
  bool ok_ = true;
};

}  // namespace ts::server
