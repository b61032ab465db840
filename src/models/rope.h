// Rotary tables from the config's rope settings, computed as transformers computes them
// (inv_freq and angles in fp32, cos/sin times the attention factor), so logits match to 1e-5.
#pragma once
#include "io/config.h"
#include "ops/ops.h"

namespace ts::models {

struct RopeParams {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  float attention_factor = 1.0f;
};

// inv_freq for head dimension `rot_dim` (the rotated part) under the config's scaling.
RopeParams rope_params(const io::RopeScaling& r, int rot_dim, int64_t max_position_embeddings);
// Table [max_pos, rot_dim] (cos | sin) on `device` (always f32).
ops::Rope build_rope(const io::RopeScaling& r, int rot_dim, int64_t max_position_embeddings, int64_t max_pos,
                     bool interleaved, Device device);
// YaRN's softmax-scale correction used by DeepSeek (0.1 * mscale * ln(scale) + 1).
double yarn_get_mscale(double scale, double mscale);

}  // namespace ts::models
