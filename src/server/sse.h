// Server-sent events for OpenAI streaming: `data: {json}\n\n` chunks and `data: [DONE]\n\n`.
// The HTTP layer frames them (chunked transfer encoding); this only makes the event text.
#pragma once
#include <string>

#include "server/protocol.h"

namespace ts::server {

std::string sse_data(const Json& j);     // "data: {...}\n\n"
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
inline constexpr const char* kSseKeepAlive = ": keep-alive\n\n";  // an SSE comment; clients ignore it

}  // namespace ts::server
