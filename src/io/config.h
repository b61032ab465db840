// config.json / generation_config.json. Both rope formats are read: the classic Hub fields
// (`rope_theta`, `rope_scaling` with rope_type or type) and transformers 5 `rope_parameters`.
// Model files read architecture-specific fields (MoE, MLA, ...) from `raw` through get().
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ts::io {

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | yarn | dynamic
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;          // 0: not given
  double beta_fast = 32.0, beta_slow = 1.0;               // yarn
  std::optional<double> mscale, mscale_all_dim, attention_factor;
  bool truncate = true;
};

struct ModelConfig {
  std::string dir, path;
  nlohmann::json raw;
  std::string architecture, model_type;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  double partial_rotary_factor = 1.0;
  RopeScaling rope;
  bool tie_word_embeddings = false, attention_bias = false, mlp_bias = false;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  bool has(const char* key) const { return raw.contains(key) && !raw[key].is_null(); }
  template <typename T>
  T get(const char* key, T def) const {
    return has(key) ? raw[key].get<T>() : def;
  }
  template <typename T>
  T require(const char* key) const {
    TS_CHECK(has(key), "{}: missing field {}", path, key);
    try {
      return raw[key].get<T>();
    } catch (const std::exception& e) {
      fail("{}: field {} has the wrong type: {}", path, key, e.what());
    }
  }
};

// Sampling defaults and stop ids from generation_config.json (absent file = no defaults).
struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<bool> do_sample;
};

ModelConfig load_config(const std::string& dir);
ModelConfig parse_config(const nlohmann::json& j, const std::string& path);
RopeScaling parse_rope(const nlohmann::json& j, const std::string& path);
GenerationConfig load_generation_config(const std::string& dir);
std::vector<int32_t> parse_id_list(const nlohmann::json& v);  // int, list of ints, or null

}  // namespace ts::io
