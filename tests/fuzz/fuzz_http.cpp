// libFuzzer target: raw bytes of a connection through the front door's HTTP/1.1 request parser
// with its limits (server/http/request_parse, the code each connection runs on its reads), one
// pipelined request after another; the bodies sent to the OpenAI endpoints then go through the
// request validation as the server runs it. Invariants checked (abort = finding): a parsed
// request never exceeds the limits it was parsed under, and parsing consumes at least one byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "server/http/request_parse.h"
#include "server/protocol.h"

using namespace ts::server;

namespace {

void validate_body(const http::Request& req) {
  ModelInfo info{"m", "/models/m", 4096, 1000};
  try {
    Json j = parse_body(req.body);
    if (req.path == "/v1/chat/completions") {
      (void)parse_chat_request(j, info);
    } else if (req.path == "/v1/completions") {
      auto encode = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };
      auto decode = [](const std::vector<int32_t>& ids) { return std::string(ids.size(), 'x'); };
      (void)parse_completion_request(j, info, encode, decode);
    }
  } catch (const ApiError&) {
  } catch (const ts::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limits so the fuzzer reaches every breach with short inputs.
  http::HttpLimits lim;
  lim.max_header_bytes = 2048;
  lim.max_uri_bytes = 256;
  lim.max_body_bytes = 4096;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (int n = 0; n < 16 && !bytes.empty(); ++n) {
    http::ParseOutcome r = http::parse_one(bytes, lim);
    if (r.status != 0 || !r.request) break;  // an answer and a closed connection, or incomplete
    if (r.consumed == 0 || r.consumed > bytes.size()) abort();
    if (r.request->body.size() > lim.max_body_bytes || r.request->target.size() > lim.max_uri_bytes) abort();
    validate_body(*r.request);
    bytes.remove_prefix(r.consumed);
  }
  return 0;
}
