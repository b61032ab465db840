#include "cli/golden.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace ts::cli {

namespace {
nlohmann::json read_json(const std::string& path) {
  TS_CHECK(std::filesystem::exists(path), "{}: missing", path);
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}
}  // namespace

Golden::Golden(const std::string& dir) : json_(read_json(dir + "/golden.json")), tensors_(dir + "/golden.safetensors") {}

std::vector<int64_t> Golden::logit_rows(size_t i) const {
  if (!json_["logit_positions"][i].is_null()) return json_["logit_positions"][i].get<std::vector<int64_t>>();
  std::vector<int64_t> rows(json_["prompts"][i].size());
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = int64_t(r);
  return rows;
}

Tensor Golden::logits(size_t i) const { return tensors_.get("logits." + std::to_string(i)).to_f32(); }

double Golden::w8a8_simulated_diff(size_t i) const {
  const auto it = json_.find("w8a8_simulated_max_abs_diff");
  if (it == json_.end() || !it->is_array() || i >= it->size() || !(*it)[i].is_number()) return 0.0;
  return (*it)[i].get<double>();
}

int64_t Golden::max_prompt_len() const {
  int64_t n = 0;
  for (auto& p : json_["prompts"]) n = std::max<int64_t>(n, int64_t(p.size()));
  return n;
}

double max_logit_diff(const Tensor& logits, const Tensor& ref, const std::vector<int64_t>& rows) {
  TS_CHECK(int64_t(rows.size()) == ref.size(0) && ref.size(1) == logits.size(1),
           "golden logits have shape {}, expected [{}, {}]", ref.shape_str(), rows.size(), logits.size(1));
  double diff = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    TS_CHECK(rows[r] >= 0 && rows[r] < logits.size(0), "golden row {} outside {} logit rows", rows[r], logits.size(0));
    const float* a = logits.ptr<float>() + rows[r] * logits.row_stride();
    const float* b = ref.ptr<float>() + int64_t(r) * ref.row_stride();
    for (int64_t v = 0; v < ref.size(1); ++v) diff = std::max(diff, double(std::fabs(a[v] - b[v])));
  }
  return diff;
}

}  // namespace ts::cli
