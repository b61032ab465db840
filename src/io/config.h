// config.json / generation_config.json. Both rope formats are read: the classic Hub fields
// (`rope_theta`, `rope_scaling` with rope_type or type) and transformers 5 `rope_parameters`.
// Model files read architecture-specific fields (MoE, MLA, ...) from `raw` through get().
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace ts::io {

// Limits on config.json values (checked at load, so a bad file fails there and not in the first
// forward): ids are int32, the rope table is max_position_embeddings x head_dim floats.
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxPositionEmbeddings = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096, kMaxHeads = 65536, kMaxHeadDim = 4096;
constexpr int64_t kMaxHidden = int64_t(1) << 20;

// A JSON value read as T, erroring "<path>: field <key> ..." on a wrong type or an integer that
// does not fit T (nlohmann's get<int32_t>() silently truncates 2^40 to 0).
template <typename T>
T json_field(const nlohmann::json& v, const std::string& path, const std::string& key) {
  if constexpr (std::is_same_v<T, bool>) {
    TS_CHECK(v.is_boolean(), "{}: field {} must be a boolean, got {}", path, key, v.type_name());
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    using L = std::numeric_limits<T>;
    bool ok = false;
    T r{};
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      ok = u <= uint64_t(L::max());
      r = T(u);
    } else if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      ok = L::is_signed ? (i >= int64_t(L::min()) && i <= int64_t(L::max())) : (i >= 0 && uint64_t(i) <= uint64_t(L::max()));
      r = T(i);
    } else if (v.is_number_float()) {  // 8.0 is accepted as 8 (some exporters write floats)
      double d = v.get<double>();
      ok = std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e18 && d >= double(L::min()) &&
           d <= double(L::max());
      r = ok ? T(d) : T{};
    } else {
      fail("{}: field {} must be an integer, got {}", path, key, v.type_name());
    }
    TS_CHECK(ok, "{}: field {} = {} is out of range [{}, {}]", path, key, v.dump(), L::min(), L::max());
    return r;
  } else if constexpr (std::is_floating_point_v<T>) {
    TS_CHECK(v.is_number(), "{}: field {} must be a number, got {}", path, key, v.type_name());
    return T(v.get<double>());
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      std::string w = e.what();
      auto pos = w.find("] ");
      fail("{}: field {} has the wrong type: {}", path, key, pos == std::string::npos ? w : w.substr(pos + 2));
    }
  }
}

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
  // Sliding-window attention as transformers applies it (0: every layer attends to the whole
  // context): Mistral's `sliding_window` (all layers), Qwen2/Qwen3's `use_sliding_window` with the
  // layers from `max_window_layers` on, or the `layer_types` entries "sliding_attention". A query
  // in a sliding layer sees the last `sliding_window` tokens, itself included
  // (ops::paged_attention's window); sliding_layers[i] says whether layer i slides. The
  // architectures whose model file passes the window on: llama.cpp (Mistral, Qwen2/3) and
  // qwen3_moe.cpp; the others validate their own layer_types.
  int64_t sliding_window = 0;
  std::vector<uint8_t> sliding_layers;
  // The attention window of layer i (0: full causal attention).
  int window_of(int64_t layer) const {
    return layer >= 0 && size_t(layer) < sliding_layers.size() && sliding_layers[size_t(layer)] ? int(sliding_window) : 0;
  }
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  bool has(const char* key) const { return raw.contains(key) && !raw[key].is_null(); }
  // For the model files whose MLP is SiLU-gated: hidden_act must say so ("silu" / "swish", the
  // default when absent); another activation is a load error naming it, never silently SiLU.
  void require_silu_mlp() const;
  template <typename T>
  T get(const char* key, T def) const {
    return has(key) ? json_field<T>(raw[key], path, key) : def;
  }
  template <typename T>
  T require(const char* key) const {
    TS_CHECK(has(key), "{}: missing field {}", path, key);
    return json_field<T>(raw[key], path, key);
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
// int, list of ints, or null; an id outside [0, 2^31) is an error naming `path` and `key`.
std::vector<int32_t> parse_id_list(const nlohmann::json& v, const std::string& path = "config",
                                   const std::string& key = "eos_token_id");
// Range checks on the parsed fields and on the architecture fields every model reads (MoE top-k
// vs experts, DeepSeek groups); called by parse_config.
void validate_config(const ModelConfig& c);

}  // namespace ts::io
