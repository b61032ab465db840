// Small helpers shared by CLI commands.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ts::cli {
std::string default_model_dir();                     // the bundled demo model
Device parse_device(const std::string& s);           // auto | cpu | cuda
std::vector<int32_t> parse_ids(const std::string& s);  // "1,2,3" (spaces allowed)
}  // namespace ts::cli
