// What one client may cost the server: every HTTP limit in one place (flags in `tokenspeed serve
// --help`, table in the README). Each breach answers an OpenAI-shaped error (or closes the
// connection where HTTP has no answer) and counts in tokenspeed_http_limit_rejections_total.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ts::server::http {

struct HttpLimits {
  size_t max_body_bytes = 32u << 20;    // request body, any transfer encoding (chunked too) -> 413
  size_t max_header_bytes = 16u << 10;  // request line + headers -> 431
  size_t max_uri_bytes = 8u << 10;      // request target -> 414
  double header_timeout_s = 10;         // first byte of a request -> end of its headers -> 408, close
  double body_timeout_s = 60;           // end of headers -> end of body -> 408, close
  double idle_timeout_s = 60;           // keep-alive connection with no request -> closed
  int max_connections = 10000;          // open connections (beyond: 503, close)
  int max_connections_per_ip = 0;       // per client address; 0 = no cap (beyond: 429, close)
  int max_queued_requests = 4096;       // generation requests admitted and not yet started (first
                                        // token not out); beyond: 503; 0 = no cap
  size_t max_pipelined_bytes = 64u << 10;  // bytes read ahead while a response is in progress
  double stream_keepalive_s = 10;       // a silent stream gets an SSE comment this often
};

}  // namespace ts::server::http
