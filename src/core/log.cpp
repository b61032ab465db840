#include "core/log.h"

#include <cstdlib>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace ts {
void init_logging(const char* level) {
  static bool done = false;
  if (!done) {
    // Logs go to stderr so that stdout carries only program output (ids, text, JSON).
    auto logger = spdlog::stderr_color_mt("tokenspeed");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
    done = true;
  }
  const char* env = std::getenv("TS_LOG_LEVEL");
  spdlog::set_level(spdlog::level::from_str(env ? env : level));
}
}  // namespace ts
