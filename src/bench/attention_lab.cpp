#include "bench/attention_lab.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/ceilings.h"
#include "bench/random_fill.h"
#include "core/error.h"
#include "ops/ops.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/split_kv.h"
#endif

namespace ts::bench {

#ifdef TS_WITH_CUDA

std::string run_attention_lab(const AttentionLabOptions& o) {
  std::fprintf(stderr, "attention lab: measuring the copy ceiling...\n");
  const double copy = measure_copy_gbs(Device::cuda, o.copy_bytes, 20);
  constexpr int64_t nh = 32, nkv = 8, hd = 128;
  constexpr int bs = 64;
  struct Variant {
    const char* name;
    int target, min_tiles;
    bool fp8 = false;  // the same values in an e4m3 cache (--kv-cache-dtype fp8; scales 1)
  };
  const Variant vs[] = {{"default (one wave for the batch)", 0, 0},
                        {"invariant target 32, min 4 tiles", 32, 4},
                        {"invariant target 32, min 8 tiles", 32, 8},
                        {"invariant target 32, min 16 tiles", 32, 16},
                        {"invariant target 16, min 8 tiles", 16, 8},
                        {"FP8 e4m3 cache, default splits", 0, 0, true}};
  std::string md = fmt::format(
      "## Split-KV decode attention, Llama-3.1-8B shapes (nh {}, nkv {}, hd {}, block {}; copy ceiling {:.0f} GB/s)\n\n"
      "GB/s = K/V bytes read / time (FP8: 1 byte per value). invariant: every sequence split by its own length "
      "(batch-invariant); diff: relative norm difference from the default's output (FP8: the e4m3 rounding).\n\n"
      "| batch | context | variant | splits (grid) | us | GB/s | % copy | diff |\n|---|---|---|---|---|---|---|---|\n",
      nh, nkv, hd, bs, copy);
  for (auto [B, ctx] : o.cases) {
    const int64_t nb = (ctx + bs - 1) / bs, blocks = int64_t(B) * nb;
    const double kv_bytes = double(B) * double(ctx) * double(nkv) * double(hd) * 2.0 * 2.0;
    // Enough cache copies to stream >= 256 MB per rotation (past the 50 MB L2).
    const int copies = int(std::max<double>(1.0, std::ceil(256e6 / kv_bytes)));
    std::vector<Tensor> kc, vc, kc8, vc8;
    // The e4m3 cache of the same values: kv_write of the bf16 rows (one slot per row).
    auto to_fp8 = [&](const Tensor& c) {
      Tensor out = Tensor::empty(c.dims(), DType::f8_e4m3, Device::cuda);
      const int64_t rows = blocks * bs;
      Tensor slots = Tensor::empty({rows}, DType::i32);
      for (int64_t r = 0; r < rows; ++r) slots.ptr<int32_t>()[r] = int32_t(r);
      Tensor sd = slots.to(Device::cuda), x = c.view({rows, nkv, hd}), none;
      ops::cuda::kv_write(x, none, out, none, sd);
      return out;
    };
    for (int i = 0; i < copies; ++i) {
      kc.push_back(random_normal({blocks, bs, nkv, hd}, DType::bf16, stream_key(uint64_t(i), "k"), 1.0f).to(Device::cuda));
      vc.push_back(random_normal({blocks, bs, nkv, hd}, DType::bf16, stream_key(uint64_t(i), "v"), 1.0f).to(Device::cuda));
      kc8.push_back(to_fp8(kc.back()));
      vc8.push_back(to_fp8(vc.back()));
    }
    Tensor q = random_normal({B, nh, hd}, DType::bf16, stream_key(7, "q"), 1.0f).to(Device::cuda);
    Tensor cu = Tensor::empty({B + 1}, DType::i32), kl = Tensor::empty({B}, DType::i32), bt = Tensor::empty({B, nb}, DType::i32);
    for (int b = 0; b <= B; ++b) cu.ptr<int32_t>()[b] = b;
    for (int b = 0; b < B; ++b) {
      kl.ptr<int32_t>()[b] = ctx;
      for (int64_t j = 0; j < nb; ++j) bt.ptr<int32_t>()[b * nb + j] = int32_t(b * nb + j);
    }
    ops::AttnMeta m;
    m.cu_q = cu.to(Device::cuda);
    m.kv_len = kl.to(Device::cuda);
    m.block_tables = bt.to(Device::cuda);
    m.block_size = bs;
    m.num_seqs = B;
    m.max_q_len = 1;
    m.max_kv_len = ctx;
    const float scale = 1.0f / std::sqrt(float(hd));
    Tensor ref;
    for (const Variant& v : vs) {
      const ops::KernelPolicy kp;
      const ops::cuda::SplitKvOptions sk{v.target, v.min_tiles};
      Tensor out = Tensor::empty({B, nh, hd}, DType::bf16, Device::cuda);
      const std::vector<Tensor>& K = v.fp8 ? kc8 : kc;
      const std::vector<Tensor>& V = v.fp8 ? vc8 : vc;
      auto call = [&](int i) { ops::cuda::paged_attention(q, K[size_t(i % copies)], V[size_t(i % copies)], m, scale, out, kp, sk); };
      for (int i = 0; i < 3; ++i) call(i);
      const double t = time_region_s(Device::cuda, [&] {
                         for (int i = 0; i < o.iters; ++i) call(i);
                       }) / o.iters;
      call(0);  // the output of copy 0, to compare with the default's
      Tensor h = out.to(Device::cpu).to_f32();
      double diff = 0;
      if (!ref.data) {
        ref = h;
      } else {
        double num = 0, den = 0;
        for (int64_t i = 0; i < h.numel(); ++i) {
          const double d = double(h.ptr<float>()[i]) - ref.ptr<float>()[i];
          num += d * d;
          den += double(ref.ptr<float>()[i]) * ref.ptr<float>()[i];
        }
        diff = std::sqrt(num / std::max(den, 1e-30));
      }
      // The grid the dispatcher launches (invariant: min(target, ceil(tiles / min_tiles))).
      const int64_t tiles = (ctx + 63) / 64;
      const std::string grid =
          v.target > 0 ? fmt::format("{}", std::min<int64_t>(v.target, (tiles + v.min_tiles - 1) / v.min_tiles)) : "auto";
      const double gbs = kv_bytes / (v.fp8 ? 2.0 : 1.0) / t / 1e9;
      md += fmt::format("| {} | {} | {} | {} | {:.1f} | {:.0f} | {:.1f}% | {:.1e} |\n", B, ctx, v.name, grid, t * 1e6, gbs,
                        100.0 * gbs / copy, diff);
      std::fprintf(stderr, "attention lab: B=%d ctx=%d %s: %.1f us, %.0f GB/s (%.1f%% of copy), diff %.1e\n", B, ctx, v.name,
                   t * 1e6, gbs, 100.0 * gbs / copy, diff);
    }
  }
  return md;
}

#else

std::string run_attention_lab(const AttentionLabOptions&) { fail("--attention-lab needs a CUDA build"); }

#endif

}  // namespace ts::bench
