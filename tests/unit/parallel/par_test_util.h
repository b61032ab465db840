// Helpers for the parallel tests: run one function per CPU rank (a thread each) over an
// in-process world, and deterministic random tensors.
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace ts::test {

// Runs fn(rank, comm) on n threads over make_cpu_comms(n); rethrows the first failure.
inline void run_ranks(int n, const std::function<void(int, parallel::Comm&)>& fn) {
  auto comms = parallel::make_cpu_comms(n);
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r, *comms[size_t(r)]);
      } catch (...) {
        err[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

// Same values for the same seed, in [-scale, scale).
inline Tensor rand_f32(std::vector<int64_t> shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(g);
  return t;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t r = 0; r < a.rows(); ++r)
    if (std::memcmp(a.ptr<float>() + r * a.row_stride(), b.ptr<float>() + r * b.row_stride(),
                    size_t(a.size(-1)) * 4) != 0)
      return false;
  return true;
}

inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  float m = 0;
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t i = 0; i < a.size(-1); ++i)
      m = std::max(m, std::fabs(a.ptr<float>()[r * a.row_stride() + i] - b.ptr<float>()[r * b.row_stride() + i]));
  return m;
}

}  // namespace ts::test
