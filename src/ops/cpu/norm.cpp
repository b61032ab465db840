#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

static void check_f32(const Tensor& t, const char* what) {
  TS_CHECK(t.dtype == DType::f32 && t.device == Device::cpu, "cpu op: {} must be f32 on cpu", what);
}

// One row: out = x * rsqrt(mean(x^2) + eps) * w. Accumulates in double so the reference is
// at least as accurate as transformers' fp32 path.
static inline void norm_row(const float* x, const float* w, float eps, int64_t h, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < h; ++i) ss += double(x[i]) * x[i];
  float r = float(1.0 / std::sqrt(ss / double(h) + eps));
  for (int64_t i = 0; i < h; ++i) out[i] = w[i] * (x[i] * r);
}

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_f32(x, "x");
  int64_t n = x.rows(), h = x.size(-1);
  TS_CHECK(w.numel() == h && out.size(-1) == h && out.rows() == n, "rmsnorm: shape mismatch x {} w {} out {}",
           x.shape_str(), w.shape_str(), out.shape_str());
  if (n == 0) return;
  int64_t xs = x.row_stride(), os = out.row_stride();
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t r = 0; r < n; ++r) norm_row(x.ptr<float>() + r * xs, w.ptr<float>(), eps, h, out.ptr<float>() + r * os);
}

void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  check_f32(x, "x");
  int64_t n = x.rows(), h = x.size(-1);
  TS_CHECK(residual.rows() == n && residual.size(-1) == h && w.numel() == h, "fused_add_rmsnorm: shape mismatch");
  if (n == 0) return;
  int64_t xs = x.row_stride(), rs = residual.row_stride();
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    float* xr = x.ptr<float>() + r * xs;
    float* rr = residual.ptr<float>() + r * rs;
    for (int64_t i = 0; i < h; ++i) rr[i] += xr[i];
    norm_row(rr, w.ptr<float>(), eps, h, xr);
  }
}

void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps,
                  Tensor& out_a, Tensor& out_b) {
  rmsnorm(a, wa, eps, out_a);
  rmsnorm(b, wb, eps, out_b);
}

void silu_mul(const Tensor& x, Tensor& out) {
  check_f32(x, "x");
  int64_t n = x.rows(), i2 = x.size(-1), inter = i2 / 2;
  TS_CHECK(i2 % 2 == 0 && out.size(-1) == inter && out.rows() == n, "silu_mul: x {} out {}", x.shape_str(), out.shape_str());
  if (n == 0) return;
  int64_t xs = x.row_stride(), os = out.row_stride();
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* g = x.ptr<float>() + r * xs;
    const float* u = g + inter;
    float* o = out.ptr<float>() + r * os;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void add_inplace(Tensor& y, const Tensor& x) {
  int64_t n = y.rows(), h = y.size(-1);
  TS_CHECK(x.rows() == n && x.size(-1) == h, "add_inplace: {} vs {}", y.shape_str(), x.shape_str());
  if (n == 0) return;
  int64_t ys = y.row_stride(), xs = x.row_stride();
  for (int64_t r = 0; r < n; ++r) {
    float* yr = y.ptr<float>() + r * ys;
    const float* xr = x.ptr<float>() + r * xs;
    for (int64_t i = 0; i < h; ++i) yr[i] += xr[i];
  }
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  TS_CHECK(ids.dtype == DType::i32, "embedding: ids must be i32");
  int64_t n = ids.numel(), h = table.size(-1), v = table.size(0);
  TS_CHECK(out.rows() == n && out.size(-1) == h, "embedding: out {} for {} ids of width {}", out.shape_str(), n, h);
  int64_t os = n ? out.row_stride() : 0;
  for (int64_t t = 0; t < n; ++t) {
    int64_t id = int64_t(ids.ptr<int32_t>()[t]) - vocab_start;
    float* o = out.ptr<float>() + t * os;
    if (id >= 0 && id < v) std::memcpy(o, table.ptr<float>() + id * h, size_t(h) * 4);
    else std::memset(o, 0, size_t(h) * 4);
  }
}

void copy_rows(const Tensor& src, Tensor& dst) {
  int64_t n = src.rows(), w = src.size(-1);
  TS_CHECK(dst.rows() == n && dst.size(-1) == w && src.dtype == dst.dtype, "copy_rows: {} -> {}", src.shape_str(), dst.shape_str());
  if (n == 0) return;
  size_t es = dtype_size(src.dtype);
  int64_t ss = src.row_stride(), ds = dst.row_stride();
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(static_cast<char*>(dst.data) + r * ds * int64_t(es), static_cast<const char*>(src.data) + r * ss * int64_t(es), size_t(w) * es);
}

void cast(const Tensor& src, Tensor& dst) {
  int64_t n = src.rows(), w = src.size(-1);
  TS_CHECK(dst.rows() == n && dst.size(-1) == w, "cast: {} -> {}", src.shape_str(), dst.shape_str());
  if (n == 0) return;
  int64_t ss = src.row_stride(), ds = dst.row_stride();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < w; ++i) {
      float v = src.dtype == DType::f32 ? src.ptr<float>()[r * ss + i] : bf16_to_f32(src.ptr<uint16_t>()[r * ss + i]);
      if (dst.dtype == DType::f32) dst.ptr<float>()[r * ds + i] = v;
      else dst.ptr<uint16_t>()[r * ds + i] = f32_to_bf16(v);
    }
}

void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) {
  int64_t n = index.numel(), h = x.size(-1);
  size_t es = dtype_size(x.dtype);
  int64_t xs = x.rows() ? x.row_stride() : 0, os = n ? out.row_stride() : 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = index.ptr<int32_t>()[i];
    TS_CHECK(r >= 0 && r < x.rows(), "gather_rows: index {} out of {}", r, x.rows());
    std::memcpy(static_cast<char*>(out.data) + i * os * int64_t(es),
                static_cast<const char*>(x.data) + r * xs * int64_t(es), size_t(h) * es);
  }
}

}  // namespace ts::ops::cpu
