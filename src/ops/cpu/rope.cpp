#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

// Rotates the first rot_dim features of every head of x [T, n, hd] in place.
static void rope_one(Tensor& x, const int32_t* pos, const Rope& r) {
  if (!x.data || x.numel() == 0) return;
  TS_CHECK(x.ndim == 3, "rope: expected [T, heads, head_dim], got {}", x.shape_str());
  int64_t t_n = x.size(0), heads = x.size(1), hd = x.size(2), half = r.rot_dim / 2;
  TS_CHECK(r.rot_dim <= hd && r.rot_dim % 2 == 0, "rope: rot_dim {} vs head_dim {}", r.rot_dim, hd);
  int64_t max_pos = r.cos_sin.size(0);
  const float* table = r.cos_sin.ptr<float>();
  for (int64_t t = 0; t < t_n; ++t) {
    TS_CHECK(pos[t] >= 0 && pos[t] < max_pos, "rope: position {} outside the table of {}", pos[t], max_pos);
    const float* c = table + int64_t(pos[t]) * r.rot_dim;
    const float* s = c + half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.ptr<float>() + t * x.stride[0] + h * x.stride[1];
      for (int64_t i = 0; i < half; ++i) {
        int64_t a = r.interleaved ? 2 * i : i, b = r.interleaved ? 2 * i + 1 : i + half;
        float x1 = v[a], x2 = v[b];
        v[a] = x1 * c[i] - x2 * s[i];
        v[b] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& r) {
  const int32_t* pos = positions.ptr<int32_t>();
  rope_one(q, pos, r);
  rope_one(k, pos, r);
}

static void head_norm(Tensor& x, const Tensor& w, float eps) {
  if (!x.data || x.numel() == 0) return;
  int64_t t_n = x.size(0), heads = x.size(1), hd = x.size(2);
  TS_CHECK(w.numel() == hd, "qk_norm: weight {} vs head_dim {}", w.numel(), hd);
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.ptr<float>() + t * x.stride[0] + h * x.stride[1];
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += double(v[i]) * v[i];
      float r = float(1.0 / std::sqrt(ss / double(hd) + eps));
      for (int64_t i = 0; i < hd; ++i) v[i] = w.ptr<float>()[i] * (v[i] * r);
    }
}

void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps,
                  const Tensor& positions, const Rope& r) {
  head_norm(q, wq, eps);
  head_norm(k, wk, eps);
  ::ts::ops::cpu::rope(q, k, positions, r);
}

}  // namespace ts::ops::cpu
