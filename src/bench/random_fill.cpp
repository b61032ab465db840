#include "bench/random_fill.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace ts::bench {
namespace {

// q[i] = Phi^-1((i + 0.5) / 65536): the standard normal quantiles, found by bisection on erfc.
const std::vector<float>& normal_table() {
  static const std::vector<float> table = [] {
    constexpr int n = 65536;
    std::vector<float> t(n);
    for (int i = n / 2; i < n; ++i) {
      double p = (i + 0.5) / n, lo = 0.0, hi = 10.0;
      for (int it = 0; it < 60; ++it) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) lo = mid;
        else hi = mid;
      }
      t[size_t(i)] = float(0.5 * (lo + hi));
      t[size_t(n - 1 - i)] = -t[size_t(i)];
    }
    return t;
  }();
  return table;
}

template <typename Conv>
void fill_with(void* dst_v, uint64_t key, uint64_t first, size_t n, float std, Conv conv) {
  const float* q = normal_table().data();
  size_t i = 0;
  // Head up to a multiple of 4 elements: each 64-bit draw gives 4 samples (16 bits each).
  while (i < n && ((first + i) & 3)) {
    uint64_t e = first + i, r = splitmix64(key ^ (e >> 2) * 0xd1b54a32d192ed03ull);
    conv(dst_v, i, q[(r >> (16 * (e & 3))) & 0xffff] * std);
    ++i;
  }
  for (; i + 4 <= n; i += 4) {
    uint64_t e = first + i, r = splitmix64(key ^ (e >> 2) * 0xd1b54a32d192ed03ull);
    conv(dst_v, i, q[r & 0xffff] * std);
    conv(dst_v, i + 1, q[(r >> 16) & 0xffff] * std);
    conv(dst_v, i + 2, q[(r >> 32) & 0xffff] * std);
    conv(dst_v, i + 3, q[r >> 48] * std);
  }
  for (; i < n; ++i) {
    uint64_t e = first + i, r = splitmix64(key ^ (e >> 2) * 0xd1b54a32d192ed03ull);
    conv(dst_v, i, q[(r >> (16 * (e & 3))) & 0xffff] * std);
  }
}

}  // namespace

uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return splitmix64(h ^ splitmix64(seed));
}

void fill_normal(void* dst, DType dt, uint64_t key, uint64_t first, size_t n, float std) {
  switch (dt) {
    case DType::f32:
      fill_with(dst, key, first, n, std, [](void* d, size_t i, float v) { static_cast<float*>(d)[i] = v; });
      break;
    case DType::bf16:
      fill_with(dst, key, first, n, std, [](void* d, size_t i, float v) { static_cast<uint16_t*>(d)[i] = f32_to_bf16(v); });
      break;
    case DType::f16:
      fill_with(dst, key, first, n, std, [](void* d, size_t i, float v) { static_cast<uint16_t*>(d)[i] = f32_to_f16(v); });
      break;
    default: fail("fill_normal: dtype {} is not a float type", dtype_name(dt));
  }
}

void fill_normal_parallel(void* dst, DType dt, uint64_t key, size_t n, float std) {
  normal_table();  // build once, outside the parallel region
  const size_t chunk = size_t(1) << 20;
  const int64_t chunks = int64_t((n + chunk - 1) / chunk);
  const size_t es = dtype_size(dt);
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < chunks; ++c) {
    size_t b = size_t(c) * chunk, len = std::min(chunk, n - b);
    fill_normal(static_cast<char*>(dst) + b * es, dt, key, b, len, std);
  }
}

void fill_constant(void* dst, DType dt, size_t n, float value) {
  switch (dt) {
    case DType::f32: std::fill_n(static_cast<float*>(dst), n, value); break;
    case DType::bf16: std::fill_n(static_cast<uint16_t*>(dst), n, f32_to_bf16(value)); break;
    case DType::f16: std::fill_n(static_cast<uint16_t*>(dst), n, f32_to_f16(value)); break;
    default: fail("fill_constant: dtype {} is not a float type", dtype_name(dt));
  }
}

Tensor random_normal(std::vector<int64_t> shape, DType dt, uint64_t key, float std) {
  Tensor t = Tensor::empty(std::move(shape), dt, Device::cpu);
  fill_normal_parallel(t.data, dt, key, size_t(t.numel()), std);
  return t;
}

}  // namespace ts::bench
