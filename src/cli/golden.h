// A fixture's goldens (DIR/golden.json + DIR/golden.safetensors, written by transformers) and
// the one logit measure verify-golden and route-diff both report.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace ts::cli {

class Golden {
 public:
  explicit Golden(const std::string& dir);
  size_t num_prompts() const { return json_["prompts"].size(); }
  std::vector<int32_t> prompt(size_t i) const { return json_["prompts"][i].get<std::vector<int32_t>>(); }
  std::vector<int32_t> greedy(size_t i) const { return json_["greedy"][i].get<std::vector<int32_t>>(); }
  // Positions of the prompt whose logits the golden holds (all of them unless listed).
  std::vector<int64_t> logit_rows(size_t i) const;
  Tensor logits(size_t i) const;  // [rows, V] f32, host
  int64_t max_prompt_len() const;
  // golden.json's `w8a8_simulated_max_abs_diff[i]` (quantized fixtures: the logit difference that
  // per-token x 128-channel e4m3 activation quantization alone gives in fp32), or 0 when absent.
  double w8a8_simulated_diff(size_t i) const;

 private:
  nlohmann::json json_;
  io::SafetensorsFile tensors_;
};

// Max |logits[rows[r]] - ref[r]| over every listed row and vocab entry. logits: [T, V] f32 host,
// one row per prompt position; ref [rows, V] f32 host.
double max_logit_diff(const Tensor& logits, const Tensor& ref, const std::vector<int64_t>& rows);

}  // namespace ts::cli
