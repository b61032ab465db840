// CPU GEMM lab: our fixed-order AVX2 GEMM (src/ops/cpu/linear.cpp) against OpenBLAS sgemm on the
// demo model's shapes. Each version is checked against a double-precision reference, then timed
// (median of repeats) with GFLOP/s and GB/s (weights read once per call).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "ops/cpu/cpu_ops.h"

using namespace ts;

static double median_ms(const std::function<void()>& f, int reps) {
  std::vector<double> t;
  f();
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  struct Shape { const char* name; int m, n, k; };
  Shape shapes[] = {{"decode qkv", 1, 640, 384},  {"decode gate_up", 1, 2048, 384}, {"decode lm_head", 1, 8192, 384},
                    {"prefill qkv", 128, 640, 384}, {"prefill gate_up", 512, 2048, 384}, {"prefill down", 512, 384, 1024}};
  std::printf("%-16s %5s %5s %5s | %-8s %9s %9s %9s %10s\n", "shape", "M", "N", "K", "impl", "ms", "GFLOP/s", "GB/s", "rel err");
  for (auto& s : shapes) {
    Tensor x = Tensor::empty({s.m, s.k}, DType::f32), w = Tensor::empty({s.n, s.k}, DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = d(rng);
    std::vector<double> ref(size_t(s.m) * s.n);
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        double acc = 0;
        for (int p = 0; p < s.k; ++p) acc += double(x.ptr<float>()[i * s.k + p]) * w.ptr<float>()[j * s.k + p];
        ref[size_t(i) * s.n + j] = acc;
      }
    Tensor out = Tensor::empty({s.m, s.n}, DType::f32);
    auto err = [&] {
      double num = 0, den = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        double e = out.ptr<float>()[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
      }
      return std::sqrt(num / den);
    };
    double flops = 2.0 * s.m * s.n * s.k, bytes = 4.0 * (double(s.n) * s.k + double(s.m) * (s.k + s.n));
    int reps = s.m == 1 ? 200 : 20;
    double ours = median_ms([&] { ops::cpu::linear(x, w, out, nullptr); }, reps);
    double e1 = err();
    double blas = median_ms([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.ptr<float>(), s.k, w.ptr<float>(), s.k, 0.0f,
                  out.ptr<float>(), s.n);
    }, reps);
    double e2 = err();
    std::printf("%-16s %5d %5d %5d | %-8s %9.4f %9.1f %9.1f %10.2e\n", s.name, s.m, s.n, s.k, "ours", ours, flops / ours / 1e6,
                bytes / ours / 1e6, e1);
    std::printf("%-16s %5d %5d %5d | %-8s %9.4f %9.1f %9.1f %10.2e\n", s.name, s.m, s.n, s.k, "openblas", blas,
                flops / blas / 1e6, bytes / blas / 1e6, e2);
  }
  return 0;
}
