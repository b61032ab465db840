#include <cstdio>

#include "cli/commands.h"
#include "core/device_memory.h"

namespace {
int cmd_version(int, char**) {
  std::printf("tokenspeed 0.1.0 (cuda backend: %s, gpu present: %s)\n",
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
