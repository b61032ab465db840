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

ops::LinearWeight nvfp4_weight(int64_t N, int64_t K, uint64_t key) {
  ops::LinearWeight w(rand_fp8(N, K / 2, key).view({N, K / 2}));
  w.dtype = DType::u8;
  Tensor s = Tensor::empty({N, K / 16}, DType::f8_e4m3);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = uint8_t(0x30 + i % 16);  // 0.5 .. 1.9
  Tensor s2 = Tensor::empty({N}, DType::f32);
  for (int64_t i = 0; i < N; ++i) s2.ptr<float>()[i] = 1e-3f;
  w.quant.scale = s.to(Device::cuda);
  w.quant.scale2 = s2.to(Device::cuda);
  w.quant.block_k_log2 = 4;
  w.quant.nvfp4 = true;
  w.quant.format = "NVFP4";
  return w;
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
      "auto: what ops::linear picks; tc: the tensor-core decode GEMV (M <= 8; NVFP4 auto takes it too). nvfp4: W4A16 (e2m1 + E4M3 per 16 + "
      "f32 per row). fused (M <= 2): the decode flow's op for the shape, bf16 vs FP8 block weights (qkv_proj: "
      "rmsnorm_linear; gate_up_proj: linear_silu_mul with the input norm; o_proj, down_proj: linear_add), GB/s of "
      "the FP8 weight.\n\n"
      "| shape | N x K | M | bf16 us | bf16 GB/s | fp8 block auto us | GB/s | % copy | x bf16 | fp8 gemv us | fp8 "
      "mma us | fp8 tc us | fp8 tiles us | fp8 channel auto us | nvfp4 auto us | nvfp4 GB/s | % copy | bf16 fused us | "
      "fp8 fused us | fp8 fused GB/s | % copy | nvfp4 gemv us |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      copy);
  for (const Shape& s : shapes) {
    const int64_t N = s.n, K = s.k;
    const double bf16_bytes = double(N * K) * 2;
    // Enough copies of each weight to stream >= 256 MB per cycle (past the 50 MB L2).
    const int nb = int(std::max<int64_t>(1, (int64_t(256) << 20) / int64_t(bf16_bytes) + 1));
    const int nq = int(std::max<int64_t>(1, (int64_t(256) << 20) / (N * K) + 1));
    std::vector<Tensor> wb;
    std::vector<ops::LinearWeight> wq, wc, w4;
    for (int i = 0; i < nb; ++i) wb.push_back(rand_bf16({N, K}, stream_key(1, s.name) + uint64_t(i), 0.02f));
    for (int i = 0; i < nq; ++i) {
      wq.push_back(fp8_weight(N, K, 7, 7, stream_key(2, s.name) + uint64_t(i) * 0x1000000ull));
      wc.push_back(fp8_weight(N, K, 0, 30, stream_key(3, s.name) + uint64_t(i) * 0x1000000ull));
      w4.push_back(nvfp4_weight(N, K, stream_key(5, s.name) + uint64_t(i) * 0x1000000ull));
    }
    const double f4_bytes = double(w4[0].stored_bytes());
    const double q_bytes = double(wq[0].stored_bytes()), c_bytes = double(wc[0].stored_bytes());
    for (int M : o.ms) {
      Tensor x = rand_bf16({M, K}, stream_key(4, s.name), 1.0f);
      Tensor out = Tensor::empty({M, N}, DType::bf16, Device::cuda);
      const double tb = per_call(o.iters, [&](int i) { ops::cuda::linear(x, wb[size_t(i % nb)], out); });
      const double tq = per_call(o.iters, [&](int i) { ops::cuda::quant_linear(x, wq[size_t(i % nq)], out); });
      const double tc = per_call(o.iters, [&](int i) { ops::cuda::quant_linear(x, wc[size_t(i % nq)], out); });
      const double t4 = per_call(o.iters, [&](int i) { ops::cuda::quant_linear(x, w4[size_t(i % nq)], out); });
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
      const std::string tg = forced(QuantKernel::gemv, 16), tm = forced(QuantKernel::mma, 64),
                        ttc = forced(QuantKernel::tc, 8);
      const std::string t4g = M > 16 ? std::string("-") : fmt::format("{:.1f}", 1e6 * per_call(o.iters, [&](int i) {
        ops::cuda::quant_linear_kernel(x, w4[size_t(i % nq)], out, nullptr, QuantKernel::gemv);
      }));
      const double gq = q_bytes / tq / 1e9;
      const double g4 = f4_bytes / t4 / 1e9;
      // The decode flow's fused op at this shape (blocks.cpp: attention_block_residual,
      // mlp_block_residual), over weight w.
      std::string fb = "-", fq = "-", fqg = "-", fqp = "-";
      if (M <= 2) {
        const std::string name = s.name;
        Tensor nw = rand_bf16({K}, stream_key(6, s.name), 1.0f);
        Tensor xs = Tensor::empty({M, K}, DType::bf16, Device::cuda);
        Tensor gu = Tensor::empty({M, N}, DType::bf16, Device::cuda);
        Tensor half = Tensor::empty({M, N / 2}, DType::bf16, Device::cuda);
        Tensor res = Tensor::zeros({M, N}, DType::bf16, Device::cuda);
        auto fused = [&](const ops::LinearWeight& w) {
          if (name == "qkv_proj") ops::cuda::rmsnorm_linear(x, nw, 1e-5f, w, out, nullptr, xs);
          else if (name == "gate_up_proj") ops::cuda::linear_silu_mul(x, w, half, gu, &nw, 1e-5f, &xs);
          else ops::cuda::linear_add(x, w, res, gu);
        };
        const double fb_s = per_call(o.iters, [&](int i) { fused(wb[size_t(i % nb)]); });
        const double fq_s = per_call(o.iters, [&](int i) { fused(wq[size_t(i % nq)]); });
        const double g = q_bytes / fq_s / 1e9;
        fb = fmt::format("{:.1f}", fb_s * 1e6);
        fq = fmt::format("{:.1f}", fq_s * 1e6);
        fqg = fmt::format("{:.0f}", g);
        fqp = fmt::format("{:.0f}%", 100.0 * g / copy);
      }
      md += fmt::format(
          "| {} | {} x {} | {} | {:.1f} | {:.0f} | {:.1f} | {:.0f} | {:.0f}% | {:.2f} | {} | {} | {} | {:.1f} | {:.1f} | "
          "{:.1f} | {:.0f} | {:.0f}% | {} | {} | {} | {} | {} |\n",
          s.name, N, K, M, tb * 1e6, bf16_bytes / tb / 1e9, tq * 1e6, gq, 100.0 * gq / copy, tb / tq, tg, tm, ttc,
          tt * 1e6, tc * 1e6, t4 * 1e6, g4, 100.0 * g4 / copy, fb, fq, fqg, fqp, t4g);
      (void)c_bytes;
    }
  }
  return md;
}

std::string run_gemm_lab(const GemmLabOptions& o) {
  TS_CHECK(o.candidates >= 1 && o.candidates <= 32 && o.iters >= 1 && !o.ms.empty(), "gemm lab: bad options");
  std::fprintf(stderr, "gemm lab: measuring the GEMM ceiling...\n");
  const Ceilings c = measure_ceilings(Device::cuda, 0, size_t(64) << 20);
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"qkv_proj", 6144, 4096}, {"o_proj", 4096, 4096}, {"gate_up_proj", 28672, 4096},
                          {"down_proj", 4096, 14336}};
  auto pow2_above = [](int64_t m) {
    int64_t b = 1;
    while (b < m) b <<= 1;
    return b;
  };
  std::string md = fmt::format(
      "## bf16 GEMMs at Llama-3.1-8B shapes under cuBLASLt algorithm choices (GEMM ceiling {:.0f} TFLOP/s, "
      "measured in this run)\n\n"
      "us per call (median of 3 runs of {} calls). exact: the heuristic's first algorithm for M; pow2: its first "
      "for the power-of-two bucket above M (a cache keyed by that bucket, filled largest first); low: its first "
      "for the bucket's smallest size; best: the fastest of its first {} for M (#: its rank).\n\n"
      "| shape | M | exact us | TFLOP/s | pow2 us | low us | best us | # |\n|---|---|---|---|---|---|---|---|\n",
      c.gemm_tflops, o.iters, o.candidates);
  struct Sum {
    double exact = 0, pow2 = 0, low = 0, best = 0;
  };
  std::vector<Sum> sums(o.ms.size());
  for (const Shape& s : shapes) {
    const Tensor w = rand_bf16({s.n, s.k}, stream_key(21, s.name), 0.02f);
    for (size_t mi = 0; mi < o.ms.size(); ++mi) {
      const int64_t M = o.ms[mi];
      const Tensor x = rand_bf16({M, s.k}, stream_key(22, s.name), 1.0f);
      Tensor out = Tensor::empty({M, s.n}, DType::bf16, Device::cuda);
      // Median of three timings; -1 where that algorithm is not offered or refuses M.
      auto time_algo = [&](int64_t qm, int idx) {
        if (!ops::cuda::linear_lab_algo(x, w, out, qm, idx)) return -1.0;
        std::vector<double> t;
        for (int r = 0; r < 3; ++r) t.push_back(per_call(o.iters, [&](int) { ops::cuda::linear_lab_algo(x, w, out, qm, idx); }));
        std::sort(t.begin(), t.end());
        return t[1];
      };
      const int64_t hi = pow2_above(M), lo = hi / 2 + 1;
      const double te = time_algo(M, 0), tp = time_algo(hi, 0), tl = time_algo(std::min<int64_t>(lo, M), 0);
      double tb = -1;
      int bi = -1;
      for (int i = 0; i < o.candidates; ++i) {
        const double t = time_algo(M, i);
        if (t > 0 && (tb < 0 || t < tb)) tb = t, bi = i;
      }
      const double flop = 2.0 * double(M) * double(s.n) * double(s.k);
      auto us = [](double t) { return t > 0 ? fmt::format("{:.1f}", t * 1e6) : std::string("-"); };
      md += fmt::format("| {} | {} | {} | {:.0f} | {} | {} | {} | {} |\n", s.name, M, us(te), te > 0 ? flop / te / 1e12 : 0.0,
                        us(tp), us(tl), us(tb), bi);
      Sum& u = sums[mi];
      u.exact += te, u.pow2 += tp, u.low += tl, u.best += tb;
    }
  }
  md += fmt::format("\n### One forward's four GEMMs x {} layers (ms)\n\n| M | exact | pow2 | low | best | exact / best |\n"
                    "|---|---|---|---|---|---|\n", o.layers);
  for (size_t mi = 0; mi < o.ms.size(); ++mi) {
    const Sum& u = sums[mi];
    md += fmt::format("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.3f} |\n", o.ms[mi], 1e3 * o.layers * u.exact,
                      1e3 * o.layers * u.pow2, 1e3 * o.layers * u.low, 1e3 * o.layers * u.best,
                      u.best > 0 ? u.exact / u.best : 0.0);
  }
  return md;
}

namespace {

// Stored experts [E, R, K] from one 2-D weight [E * R, K] (rows of an expert contiguous).
ops::LinearWeight as_experts(ops::LinearWeight w, int64_t E) {
  const int64_t R = w.size(0) / E;
  ops::LinearWeight e(w.view({E, R, w.size(1)}));
  e.dtype = w.dtype;
  e.quant = w.quant;
  e.quant.scale = w.quant.scale.view({E, w.quant.scale.size(0) / E, w.quant.scale.size(1)});
  if (w.quant.scale2.data) e.quant.scale2 = w.quant.scale2.view({E, R});
  return e;
}

}  // namespace

std::string run_moe_lab(const MoeLabOptions& o) {
  std::fprintf(stderr, "moe lab: measuring the copy ceiling...\n");
  const double copy = measure_copy_gbs(Device::cuda, o.copy_bytes, 20);
  const int64_t E = o.experts, k = o.top_k, H = o.hidden, I = o.inter;
  std::fprintf(stderr, "moe lab: random experts (E %ld, H %ld, I %ld)...\n", long(E), long(H), long(I));
  const Tensor gu_b = rand_bf16({E, 2 * I, H}, stream_key(11, "moe"), 0.02f);
  const Tensor dn_b = rand_bf16({E, H, I}, stream_key(12, "moe"), 0.02f);
  const ops::LinearWeight gu_q = as_experts(fp8_weight(E * 2 * I, H, 7, 7, stream_key(13, "moe")), E);
  const ops::LinearWeight dn_q = as_experts(fp8_weight(E * H, I, 7, 7, stream_key(14, "moe")), E);
  const ops::LinearWeight gu_4 = as_experts(nvfp4_weight(E * 2 * I, H, stream_key(15, "moe")), E);
  const ops::LinearWeight dn_4 = as_experts(nvfp4_weight(E * H, I, stream_key(16, "moe")), E);
  const double per_b = double(3 * I * H * 2);
  const double per_q = double(gu_q.stored_bytes() + dn_q.stored_bytes()) / double(E);
  const double per_4 = double(gu_4.stored_bytes() + dn_4.stored_bytes()) / double(E);
  std::string md = fmt::format(
      "## MoE routed experts, bf16 vs kept as stored: {} experts, top-{}, hidden {}, intermediate {} (Qwen3-30B-A3B "
      "layer; copy ceiling {:.0f} GB/s read+write)\n\n"
      "us = one layer's ops::moe_experts (sort, gate_up + SiLU, down, combine); GB/s = bytes of the distinct "
      "experts routed to (as stored: FP8 values + f32 block scales; NVFP4 nibbles + E4M3 + f32) / time; "
      "routing random per call. gemv / mma / tiles, forced: the grouped CUDA-core GEMV over the stored bytes, the "
      "grouped tensor-core MMA over the stored bytes (unpacked in registers), the dequantized chunks + bf16 grouped "
      "GEMM.\n\n"
      "| M | experts read | bf16 us | bf16 GB/s | % copy | fp8 auto us | fp8 GB/s | % copy | x bf16 | fp8 gemv us | "
      "fp8 mma us | fp8 tiles us | nvfp4 auto us | nvfp4 GB/s | % copy | nvfp4 gemv us | nvfp4 mma us |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      E, k, H, I, copy);
  ops::GluAct act;
  for (int M : o.ms) {
    // A pool of random routings (sorted distinct ids per token), one per call, cycled.
    constexpr int kRoutings = 16;
    std::vector<Tensor> ids;
    double distinct = 0;
    uint64_t r = stream_key(17, "moe") + uint64_t(M);
    for (int c = 0; c < kRoutings; ++c) {
      Tensor h = Tensor::empty({M, k}, DType::i32);
      std::vector<char> used(size_t(E), 0);
      for (int64_t t = 0; t < M; ++t) {
        std::vector<int32_t> pick;
        while (int64_t(pick.size()) < k) {
          r = splitmix64(r);
          const int32_t e = int32_t(r % uint64_t(E));
          if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        std::sort(pick.begin(), pick.end());
        for (int64_t j = 0; j < k; ++j) {
          h.ptr<int32_t>()[t * k + j] = pick[size_t(j)];
          used[size_t(pick[size_t(j)])] = 1;
        }
      }
      distinct += double(std::count(used.begin(), used.end(), 1)) / kRoutings;
      ids.push_back(h.to(Device::cuda));
    }
    Tensor wts = Tensor::empty({M, k}, DType::f32);
    for (int64_t i = 0; i < M * k; ++i) wts.ptr<float>()[i] = 1.0f / float(k);
    wts = wts.to(Device::cuda);
    Tensor x = rand_bf16({M, H}, stream_key(18, "moe"), 1.0f);
    Tensor out = Tensor::empty({M, H}, DType::bf16, Device::cuda);
    auto time = [&](const ops::LinearWeight& gu, const ops::LinearWeight& dn, ops::LinearPath p) {
      const ops::KernelPolicy pol{.linear = p};
      return per_call(o.iters, [&](int i) {
        ops::cuda::moe_experts_stored(x, ids[size_t(i % kRoutings)], wts, gu, dn, act, out, pol);
      });
    };
    using P = ops::LinearPath;
    const double tb = time(gu_b, dn_b, P::automatic), tq = time(gu_q, dn_q, P::automatic);
    const double tg = time(gu_q, dn_q, P::gemv), tt = time(gu_q, dn_q, P::cublaslt), t4 = time(gu_4, dn_4, P::automatic);
    const double tm = time(gu_q, dn_q, P::mma), t4g = time(gu_4, dn_4, P::gemv), t4m = time(gu_4, dn_4, P::mma);
    const double gb = distinct * per_b / tb / 1e9, gq = distinct * per_q / tq / 1e9, g4 = distinct * per_4 / t4 / 1e9;
    md += fmt::format(
        "| {} | {:.1f} | {:.1f} | {:.0f} | {:.0f}% | {:.1f} | {:.0f} | {:.0f}% | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | "
        "{:.0f} | {:.0f}% | {:.1f} | {:.1f} |\n",
        M, distinct, tb * 1e6, gb, 100.0 * gb / copy, tq * 1e6, gq, 100.0 * gq / copy, tb / tq, tg * 1e6, tm * 1e6,
        tt * 1e6, t4 * 1e6, g4, 100.0 * g4 / copy, t4g * 1e6, t4m * 1e6);
  }
  return md;
}

#else

std::string run_linear_lab(const LinearLabOptions&) { fail("--linear-lab needs a CUDA build"); }
std::string run_moe_lab(const MoeLabOptions&) { fail("--moe-lab needs a CUDA build"); }
std::string run_gemm_lab(const GemmLabOptions&) { fail("--gemm-lab needs a CUDA build"); }

#endif

}  // namespace ts::bench
