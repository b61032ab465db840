#include "server/sse.h"

#include <httplib.h>

namespace ts::server {

std::string sse_data(const Json& j) { return "data: " + dump(j) + "\n\n"; }

bool SseWriter::send_raw(const std::string& s) {
  if (!ok_) return false;
  if (sink_.is_writable && !sink_.is_writable()) return ok_ = false;
  ok_ = sink_.write(s.data(), s.size());
  return ok_;
}

bool SseWriter::send(const Json& j) { return send_raw(sse_data(j)); }

bool SseWriter::done() {
  bool r = send_raw(kSseDone);
  if (r) sink_.done();
  return r;
}

}  // namespace ts::server
