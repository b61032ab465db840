#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include "cli/common.h"

#include <filesystem>

#include "core/device_memory.h"

namespace ts::cli {

std::string default_model_dir() {
  // Next to the binary's source tree first; the install layout can override with TS_MODEL_DIR.
  if (const char* env = std::getenv("TS_MODEL_DIR")) return env;
  return std::string(TS_SOURCE_DIR) + "/models/pycoder";
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") {
    TS_CHECK(cuda_available(), "--device cuda: no CUDA device is available{}",
#ifdef TS_WITH_CUDA
             ""
#else
             " (this build has no CUDA backend)"
#endif
    );
    return Device::cuda;
  }
  TS_CHECK(s == "auto", "--device must be auto, cpu or cuda (got '{}')", s);
  return cuda_available() ? Device::cuda : Device::cpu;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',' || s[i] == '[' || s[i] == ']')) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    if (s[j] == '-') ++j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    TS_CHECK(j > i && (j == s.size() || s[j] == ',' || s[j] == ' ' || s[j] == ']'), "invalid token id list '{}'", s);
    long long v = std::stoll(s.substr(i, j - i));
    TS_CHECK(v >= 0 && v <= INT32_MAX, "token id {} out of range", v);
    ids.push_back(int32_t(v));
    i = j;
  }
  return ids;
}

}  // namespace ts::cli
