// Logging goes through spdlog; the engine thread's hot loop never logs per step.
#pragma once
#include <spdlog/spdlog.h>

namespace ts {
// Sets the level from TS_LOG_LEVEL (trace|debug|info|warn|error|off) or `level` if unset.
void init_logging(const char* level = "info");
}  // namespace ts
