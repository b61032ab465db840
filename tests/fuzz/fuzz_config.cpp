// libFuzzer target: config.json text through parse + validation, then the typed reads model
// files make. Every rejection must be a ts::Error naming the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/config.h"
#include "io/json_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto j = ts::io::parse_json_text(text, "config.json");
    auto c = ts::io::parse_config(j, "config.json");
    // What model files read from `raw`.
    (void)c.get<int64_t>("num_experts", 0);
    (void)c.get<int>("num_experts_per_tok", 1);
    (void)c.get<double>("routed_scaling_factor", 1.0);
    (void)c.get<std::vector<std::string>>("layer_types", {});
    (void)c.get<bool>("norm_topk_prob", false);
  } catch (const ts::Error&) {
  }
  return 0;
}
