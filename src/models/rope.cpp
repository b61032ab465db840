#include "models/rope.h"

#include <algorithm>
#include <cmath>

namespace ts::models {

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeParams rope_params(const io::RopeScaling& r, int dim, int64_t max_pos_emb) {
  RopeParams p;
  int half = dim / 2;
  float base = float(r.theta);
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all in fp32.
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(dim));
  if (r.type == "linear") {
    for (auto& f : inv) f = f / float(r.factor);
  } else if (r.type == "llama3") {
    float factor = float(r.factor), lo = float(r.low_freq_factor), hi = float(r.high_freq_factor);
    float omax = float(r.original_max_position_embeddings);
    float lo_wl = omax / lo, hi_wl = omax / hi;
    for (auto& f : inv) {
      float wl = 2.0f * float(M_PI) / f;
      float scaled = wl > lo_wl ? f / factor : f;
      float smooth = (omax / wl - lo) / (hi - lo);
      float mid = (1.0f - smooth) * scaled / factor + smooth * scaled;
      bool is_mid = wl >= hi_wl && wl <= lo_wl;
      f = is_mid ? mid : scaled;
    }
  } else if (r.type == "yarn") {
    // transformers 5 uses the config's `factor` (the max_position_embeddings /
    // original_max_position_embeddings ratio only stands in when `factor` is missing); the
    // correction range comes from the pretrained context, original_max_position_embeddings.
    double factor = r.factor;
    double orig = r.original_max_position_embeddings > 0 ? double(r.original_max_position_embeddings) : double(max_pos_emb);
    double af;
    if (r.attention_factor) af = *r.attention_factor;
    else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0)
      af = yarn_get_mscale(factor, *r.mscale) / yarn_get_mscale(factor, *r.mscale_all_dim);
    else af = yarn_get_mscale(factor, 1.0);
    p.attention_factor = float(af);
    auto corr_dim = [&](double rot) { return (dim * std::log(orig / (rot * 2 * M_PI))) / (2 * std::log(double(base))); };
    double low = corr_dim(r.beta_fast), high = corr_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      float pos_freq = std::pow(base, float(2 * i) / float(dim));
      float extra = 1.0f / pos_freq, inter = 1.0f / (float(factor) * pos_freq);
      float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
      float extra_factor = 1.0f - ramp;
      inv[size_t(i)] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
  } else if (r.type == "dynamic") {
    // Dynamic NTK rescales the base once the sequence passes the trained context; with a
    // static table we use the rescaling for the full max_position_embeddings context.
    double orig = r.original_max_position_embeddings > 0 ? double(r.original_max_position_embeddings) : double(max_pos_emb);
    double seq = double(max_pos_emb);
    if (seq > orig) {
      double b = r.theta * std::pow(r.factor * seq / orig - (r.factor - 1), double(dim) / (dim - 2));
      for (int i = 0; i < half; ++i) inv[size_t(i)] = 1.0f / std::pow(float(b), float(2 * i) / float(dim));
    }
  }
  p.inv_freq = std::move(inv);
  return p;
}

ops::Rope build_rope(const io::RopeScaling& r, int rot_dim, int64_t max_pos_emb, int64_t max_pos, bool interleaved,
                     Device device) {
  RopeParams p = rope_params(r, rot_dim, max_pos_emb);
  int half = rot_dim / 2;
  Tensor t = Tensor::empty({max_pos, rot_dim}, DType::f32);
  float* d = t.ptr<float>();
  for (int64_t pos = 0; pos < max_pos; ++pos)
    for (int i = 0; i < half; ++i) {
      float ang = float(pos) * p.inv_freq[size_t(i)];  // fp32 product, as torch computes it
      d[pos * rot_dim + i] = float(std::cos(double(ang))) * p.attention_factor;
      d[pos * rot_dim + half + i] = float(std::sin(double(ang))) * p.attention_factor;
    }
  ops::Rope rope;
  rope.cos_sin = device == Device::cpu ? t : t.to(device);
  rope.rot_dim = rot_dim;
  rope.interleaved = interleaved;
  return rope;
}

}  // namespace ts::models
