// Helpers for the CUDA op tests: paired host (f32, bf16-rounded) / device (bf16) tensors built from
// the same random data, strided views applied identically to both, relative-norm comparisons.
#pragma once
#include "core/fp8.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "core/cuda/runtime.h"

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

namespace ts::test {

inline std::mt19937& rng() {
  static std::mt19937 r(12345);
  return r;
}

// Random f32 values in [-scale, scale], never exactly zero, rounded to bf16.
inline Tensor rand_host(std::vector<int64_t> shape, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  std::uniform_real_distribution<float> d(-scale, scale);
  float* p = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = d(rng());
    if (v == 0.0f) v = scale * 0.5f;
    p[i] = bf16_to_f32(f32_to_bf16(v));
  }
  return t;
}

// Host f32 (contiguous) -> device bf16.
inline Tensor to_dev_bf16(const Tensor& h) {
  Tensor b = Tensor::empty(h.dims(), DType::bf16);
  for (int64_t i = 0; i < h.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(h.ptr<float>()[i]);
  return b.to(Device::cuda);
}
// Host contiguous (any dtype) -> device, same dtype.
inline Tensor to_dev(const Tensor& h) { return h.to(Device::cuda); }
// Device contiguous -> host f32.
inline Tensor to_host_f32(const Tensor& d) {
  ::ts::cuda::synchronize();
  return d.to(Device::cpu).to_f32();
}

// A host/device pair holding the same (bf16-representable) values.
struct Pair {
  Tensor h, d;
  static Pair rand(std::vector<int64_t> shape, float scale = 1.0f) {
    Pair p;
    p.h = rand_host(std::move(shape), scale);
    p.d = to_dev_bf16(p.h);
    return p;
  }
  // Device result (contiguous buffer) back on the host as f32.
  Tensor back() const { return to_host_f32(d); }
};

inline Tensor i32_host(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

// [T, heads, hd] view of the columns [col0, col0 + heads*hd) of a contiguous [T, W] buffer.
inline Tensor heads_view(const Tensor& buf, int64_t col0, int64_t heads, int64_t hd) {
  Tensor t = buf.narrow(1, col0, heads * hd);
  t.ndim = 3;
  t.shape = {buf.size(0), heads, hd, 0};
  t.stride = {buf.size(1), hd, 1, 0};
  return t;
}

// ||a - b|| / ||b|| over two host f32 tensors of the same shape (strided rows allowed).
inline double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 0;
  const int64_t w = a.size(-1), rows = a.numel() ? a.numel() / w : 0;
  // Walk every element through the generic strides (up to 4 dims).
  std::array<int64_t, 4> idx{};
  (void)rows;
  const int64_t n = a.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t r = e, oa = 0, ob = 0;
    for (int d = a.ndim - 1; d >= 0; --d) {
      idx[d] = r % a.shape[d];
      r /= a.shape[d];
      oa += idx[d] * a.stride[d];
      ob += idx[d] * b.stride[d];
    }
    const double x = a.ptr<float>()[oa], y = b.ptr<float>()[ob];
    num += (x - y) * (x - y);
    den += y * y;
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

constexpr double kTol = 1e-2;

// An e4m3 tensor (host or device) decoded to host f32, times scale (the FP8 KV cache's reading).
inline Tensor e4m3_to_host_f32(const Tensor& t, float scale = 1.0f) {
  const Tensor h = t.device == Device::cpu ? t : t.to(Device::cpu);
  Tensor f = Tensor::empty(h.dims(), DType::f32);
  for (int64_t i = 0; i < h.numel(); ++i) f.ptr<float>()[i] = e4m3_to_f32(h.ptr<uint8_t>()[i]) * scale;
  return f;
}

#define EXPECT_CLOSE(got, ref, what)                                               \
  do {                                                                             \
    const double e_ = ::ts::test::rel_err((got), (ref));                           \
    std::printf("  [%s] rel err %.3e\n", std::string(what).c_str(), e_);           \
    EXPECT_LT(e_, ::ts::test::kTol) << (what);                                     \
  } while (0)

}  // namespace ts::test
