#include <cstdio>

#include "cli/commands.h"
#include "core/device_memory.h"
#include "server/api_protocol.h"

namespace {
int cmd_version(int, char**) {
  std::printf("tokenspeed %s (cuda backend: %s, gpu present: %s)\n", ts::server::kTokenspeedVersion,
#ifdef TS_WITH_CUDA
              "built",
#else
              "not built",
#endif
              ts::cuda_available() ? "yes" : "no");
  return 0;
}
}  // namespace
TS_COMMAND("version", "print version and backend availability", cmd_version);
