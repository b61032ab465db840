#include "bench/linear_lab.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "bench/ceilings.h"
#include "bench/random_fill.h"
#include "core/error.h"
#include "ops/linear_weight.h"
#include "ops/ops.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/quant_linear.h"
#endif

namespace ts::bench {

#ifdef TS_WITH_CUDA
namespace {

// Random e4m3 codes (no NaN) [N, K] on the GPU.
Tensor rand_fp8(int64_t N, int64_t K, uint64_t key) {
  Tensor h = Tensor::empty({N, K}, DType::f8_e4m3);
  uint8_t* p = h.ptr<uint8_t>();
  const int64_t n = h.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 8) {
    uint64_t r = splitmix64(key + uint64_t(i));
    for (int64_t j = i; j < std::min(n, i + 8); ++j, r >>= 8) {
      uint8_t c = uint8_t(r & 0xff);
      p[j] = (c & 0x7f) == 0x7f ? uint8_t(c ^ 1) : c;
    }
  }
  return h.to(Device::cuda);
}

Tensor rand_bf16(std::vector<int64_t> shape, uint64_t key, float std) {
  Tensor h = Tensor::empty(std::move(shape), DType::bf16);
  fill_normal_parallel(h.data, DType::bf16, key, size_t(h.numel()), std);
  return h.to(Device::cuda);
}

ops::LinearWeight fp8_weight(int64_t N, int64_t K, int bn, int bk, uint64_t key) {
  ops::LinearWeight w(rand_fp8(N, K, key));
  const int64_t sr = (N + (int64_t(1) << bn) - 1) >> bn, sc = (K + (int64_t(1) << bk) - 1) >> bk;
  Tensor s = Tensor::empty({sr, sc}, DType::f32);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = 1e-4f * float(1 + (i % 7));
  w.quant.scale = s.to(Device::cuda);
  w.quant.block_n_log2 = bn;
  w.quant.block_k_log2 = bk;
  w.quant.format = bn == 0 ? "fp8 per-channel" : "fp8 block";
  return w;
}

// Seconds per call of fn(i) over `iters` calls (after 3 warm-up calls), i cycling the copies.
template <class F>
double per_call(int iters, F&& fn) {
  for (int i = 0; i < 3; ++i) fn(i);
  return time_region_s(Device::cuda, [&] {
           for (int i = 0; i < iters; ++i) fn(i);
         }) /
         iters;
}

}  // namespace

std::string run_linear_lab(const LinearLabOptions& o) {
  std::fprintf(stderr, "linear lab: measuring the copy ceiling...\n");
  const double copy = measure_copy_gbs(Device::cuda, o.copy_bytes, 20);
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"o_proj", 4096, 4096}, {"qkv_proj", 6144, 4096}, {"gate_up_proj", 28672, 4096},
                          {"down_proj", 4096, 14336}};
  std::string md = fmt::format(
      "## Linear kernels, bf16 vs FP8 weights kept as stored (copy ceiling {:.0f} GB/s read+write)\n\n"
      "GB/s = weight bytes as stored / time (FP8: values + f32 scales). gemv / mma / tiles: the FP8 kernels "
      "forced (CUDA-core W8A16 GEMV, M <= 16; tensor-core W8A16, M <= 64; dequantized bf16 tiles + cuBLASLt); "
      "auto: what ops::linear picks.\n\n"
      "| shape | N x K | M | bf16 us | bf16 GB/s | fp8 block auto us | GB/s | % copy | x bf16 | fp8 gemv us | fp8 "
      "mma us | fp8 tiles us | fp8 channel auto us |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      copy);
  for (const Shape& s : shapes) {
    const int64_t N = s.n, K = s.k;
    const double bf16_bytes = double(N * K) * 2;
    // Enough copies of each weight to stream >= 256 MB per cycle (past the 50 MB L2).
    const int nb = int(std::max<int64_t>(1, (int64_t(256) << 20) / int64_t(bf16_bytes) + 1));
    const int nq = int(std::max<int64_t>(1, (int64_t(256) << 20) / (N * K) + 1));
    std::vector<Tensor> wb;
    std::vector<ops::LinearWeight> wq, wc;
    for (int i = 0; i < nb; ++i) wb.push_back(rand_bf16({N, K}, stream_key(1, s.name) + uint64_t(i), 0.02f));
    for (int i = 0; i < nq; ++i) {
      wq.push_back(fp8_weight(N, K, 7, 7, stream_key(2, s.name) + uint64_t(i) * 0x1000000ull));
      wc.push_back(fp8_weight(N, K, 0, 30, stream_key(3, s.name) + uint64_t(i) * 0x1000000ull));
    }
    const double q_bytes = double(wq[0].stored_bytes()), c_bytes = double(wc[0].stored_bytes());
    for (int M : o.ms) {
      Tensor x = rand_bf16({M, K}, stream_key(4, s.name), 1.0f);
      Tensor out = Tensor::empty({M, N}, DType::bf16, Device::cuda);
      const double tb = per_call(o.iters, [&](int i) { ops::cuda::linear(x, wb[size_t(i % nb)], out); });
      const double tq = per_call(o.iters, [&](int i) { ops::cuda::quant_linear(x, wq[size_t(i % nq)], out); });
      const double tc = per_call(o.iters, [&](int i) { ops::cuda::quant_linear(x, wc[size_t(i % nq)], out); });
      const double tt = per_call(o.iters, [&](int i) {
        ops::cuda::quant_linear(x, wq[size_t(i % nq)], out, nullptr, ops::KernelPolicy{.linear = ops::LinearPath::cublaslt});
      });
      using ops::cuda::QuantKernel;
      auto forced = [&](QuantKernel k, int max_m) -> std::string {
        if (M > max_m) return "-";
        return fmt::format("{:.1f}", 1e6 * per_call(o.iters, [&](int i) {
                                       ops::cuda::quant_linear_kernel(x, wq[size_t(i % nq)], out, nullptr, k);
                                     }));
      };
      const std::string tg = forced(QuantKernel::gemv, 16), tm = forced(QuantKernel::mma, 64);
      const double gq = q_bytes / tq / 1e9;
      md += fmt::format("| {} | {} x {} | {} | {:.1f} | {:.0f} | {:.1f} | {:.0f} | {:.0f}% | {:.2f} | {} | {} | {:.1f} | {:.1f} |\n",
                        s.name, N, K, M, tb * 1e6, bf16_bytes / tb / 1e9, tq * 1e6, gq, 100.0 * gq / copy, tb / tq, tg,
                        tm, tt * 1e6, tc * 1e6);
      (void)c_bytes;
    }
  }
  return md;
}

#else

std::string run_linear_lab(const LinearLabOptions&) { fail("--linear-lab needs a CUDA build"); }

#endif

}  // namespace ts::bench
