#include "server/sse.h"

namespace ts::server {

std::string sse_data(const Json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace ts::server
