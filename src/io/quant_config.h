// Quantized checkpoints as published: which quantization a checkpoint declares (config.json
// `quantization_config`, or ModelOpt's hf_quant_config.json) and how each linear's weight is
// stored next to its scales. Quantized weights are recognised by their dtype and scale partner
// (never by name lists); the config only says which formats are allowed where:
//
//   format        weight                 scale partner(s)                                  W =
//   fp8_block     F8_E4M3 [N, K]         weight_scale_inv | weight_scale F32/BF16          q × s[n/bn, k/bk]
//                                        [ceil(N/bn), ceil(K/bk)] (ModelOpt: [nb,1,kb,1])
//   fp8_channel   F8_E4M3 [N, K]         weight_scale F32/BF16 [N, 1] or [N]                q × s[n]
//   fp8_tensor    F8_E4M3 [N, K]         weight_scale(_inv) F32/BF16 scalar                 q × s
//   mxfp8         F8_E4M3 [N, K]         weight_scale U8/F8_E8M0 [N, K/32] (UE8M0)          q × 2^(s-127)
//   nvfp4         U8 [N, K/2] (element   weight_scale F8_E4M3 [N, K/16],                    e2m1 × s[n, k/16] × s2
//                 2i in the low nibble)  weight_scale_2 F32 scalar (s2), input_scale F32
//
// Methods: `fp8` (fmt e4m3, weight_block_size [bn, bk] or per-tensor, scale_fmt ue8m0 allowed),
// `fbgemm_fp8` (Meta: fp8 per-channel, `modules_to_not_convert`, `activation_scale_ub`),
// `compressed-tensors` float-quantized (config_groups with weights strategy tensor | channel |
// block, `ignore` with exact names and `re:` patterns) and nvfp4-pack-quantized (4-bit float
// weights, strategy tensor_group, group_size 16; tensors renamed by adopt_quant_names; config.json
// `compression_config` too), `modelopt` (quant_algo NVFP4 | W4A16_NVFP4 | MXFP8 | FP8_PB_WO | FP8 |
// FP8_PER_CHANNEL_PER_TOKEN, or MIXED_PRECISION with a per-module `quantized_layers` map of those;
// `exclude_modules` globs). Activation scales (input_scale, dynamic per-token) are parsed and
// checked but do not change the dequantized weights: the CPU oracle computes in fp32.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace ts::io {

enum class WeightFormat { plain, fp8_block, fp8_channel, fp8_tensor, mxfp8, nvfp4 };
const char* weight_format_name(WeightFormat f);

struct QuantConfig {
  std::string method;  // "" (not quantized) | fp8 | compressed-tensors | fbgemm_fp8 | modelopt
  std::string algo;    // modelopt: NVFP4 | FP8 | MIXED_PRECISION
  std::string source;  // the file the config came from (for errors)
  int64_t block_n = 0, block_k = 0;  // fp8 weight_block_size (0: per-tensor)
  bool ue8m0_scales = false;         // fp8 scale_fmt ue8m0 (power-of-two scales; same dequant)
  bool act_dynamic = true;           // fp8 activation_scheme dynamic (W8A8 with per-token scales allowed)
  float act_scale_ub = 0;            // fbgemm_fp8 activation_scale_ub (0: none); parsed, checked, unused
  int64_t nvfp4_group = 16;
  std::vector<std::string> ignore;   // compressed-tensors: exact names or "re:" patterns; fp8 /
                                     // fbgemm_fp8: modules_to_not_convert
  std::vector<std::string> exclude;  // modelopt: globs ('*' any run of characters)
  std::map<std::string, std::string> layers;  // MIXED_PRECISION: module -> NVFP4 | MXFP8 | FP8_PB_WO | FP8
  struct CtGroup {
    std::string name;
    std::vector<std::string> targets;  // "Linear", exact names, "re:" patterns
    WeightFormat format = WeightFormat::fp8_channel;
    int64_t block_n = 0, block_k = 0;
    bool act_dynamic = true;
    std::string act_strategy;  // token | tensor | group | "" (weight-only)
  };
  std::vector<CtGroup> groups;
  std::string kv_cache_quant_algo;  // "" | FP8 (ModelOpt) / from kv_cache_scheme

  bool quantized() const { return !method.empty(); }
  // Why `module` (a weight's name less ".weight") must hold no quantized weight, or "" if it may.
  std::string excluded(const std::string& module) const;
  // The formats `module`'s weight may be stored in under this config (empty: none).
  std::vector<WeightFormat> allowed(const std::string& module) const;
  // Block shape of fp8_block weights of `module` ([0, 0] where blocks are not configured).
  std::pair<int64_t, int64_t> block_of(const std::string& module) const;
};

// config.json's quantization_config, else hf_quant_config.json's "quantization"; method "" when
// the checkpoint declares none. Unknown methods/algorithms are errors naming the file and listing
// the supported ones.
QuantConfig load_quant_config(const std::string& dir);
// `q` is a quantization_config object (or hf_quant_config.json's "quantization" section).
QuantConfig parse_quant_config(const nlohmann::json& q, const std::string& path);

// Whether the checkpoint tensor `name` is a quantized weight: F8_E4M3, or U8 with an F8_E4M3
// `weight_scale` partner (NVFP4).
bool is_quantized_weight(const Checkpoint& c, const std::string& name);
// The stored format of weight `name` (from dtypes and partners; plain for float weights).
// Errors (naming file and tensor) for a missing or mis-typed scale.
WeightFormat detect_weight_format(const Checkpoint& c, const std::string& name);
// A quantized weight as stored, its scales in one layout for every format: element (n, k) is
// value(n, k) x scale[n / block_n, k / block_k] (x scale2 for NVFP4), scale f32 on the host
// [ceil(N / block_n), ceil(K / block_k)]: fp8_block [bn, bk]; fp8_channel [1, K] (scale [N, 1]);
// fp8_tensor [N, K] (scale [1, 1]); mxfp8 [1, 32] (UE8M0 decoded); nvfp4 [1, 16] (E4M3 decoded).
struct StoredWeight {
  WeightFormat format = WeightFormat::plain;
  Tensor data;   // host view: F8_E4M3 [N, K], or U8 [N, K/2] (NVFP4: element 2i in the low nibble)
  Tensor scale;  // f32 [ceil(N / block_n), ceil(K / block_k)]
  int64_t n = 0, k = 0, block_n = 1, block_k = 1;
  float scale2 = 1.0f;
};
// Weight `name` as stored, checked against the config (format allowed, module not excluded) and
// its scales' shapes (errors name file and tensor).
StoredWeight stored_weight(const Checkpoint& c, const QuantConfig& q, const std::string& name);
// value x scales in f32 [N, K] (the CPU oracle).
Tensor dequantize(const StoredWeight& w);
// The dequantized f32 [N, K] host tensor of quantized weight `name` (stored value × scales),
// checking it against the config (format allowed, module not excluded) and its scales' shapes.
Tensor dequantize_weight(const Checkpoint& c, const QuantConfig& q, const std::string& name);

// Formats that name their tensors otherwise, read in the layout above: compressed-tensors NVFP4
// ("nvfp4-pack-quantized": weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
// weight_global_scale F32 [1] a divisor, W = e2m1 x scale / global) gets `weight` = weight_packed
// and `weight_scale_2` = 1 / weight_global_scale (input_scale = 1 / input_global_scale). Errors
// for a non-positive or non-scalar global scale.
void adopt_quant_names(Checkpoint& c);

// ModelOpt glob ('*' = any run, everything else literal, whole-string match).
bool glob_match(const std::string& pattern, const std::string& s);

}  // namespace ts::io
