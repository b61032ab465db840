// The #22 decode fusions (ops/cuda/fused.cu) vs the CPU oracle (the composition of the unfused
// ops) and, bit for bit, vs the unfused CUDA chain they replace.
#include "cuda_test_util.h"
#include "models/rope.h"

using namespace ts;
using namespace ts::test;

namespace {

// The rope variants the dense models use: neox (rotate_half) and interleaved pairs, plain theta,
// llama3 scaling (Llama-3.1) and a partial rotary dim.
struct RopeCase {
  const char* name;
  io::RopeScaling scaling;
  bool interleaved;
  bool partial;
};

std::vector<RopeCase> rope_cases() {
  io::RopeScaling plain;
  plain.theta = 10000.0;
  io::RopeScaling llama3;
  llama3.type = "llama3";
  llama3.theta = 500000.0;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position_embeddings = 8192;
  return {{"neox", plain, false, false},
          {"interleaved", plain, true, false},
          {"llama3", llama3, false, false},
          {"neox partial", plain, false, true}};
}

}  // namespace

TEST(CudaOps, FusedRopeKvWrite) {
  TS_REQUIRE_CUDA();
  const int64_t max_pos = 4096;
  for (const RopeCase& rc : rope_cases()) {
    for (int64_t hd : {64, 128}) {
      const int64_t rot = rc.partial ? hd / 2 : hd;
      ops::Rope rh = models::build_rope(rc.scaling, int(rot), max_pos, max_pos, rc.interleaved, Device::cpu);
      ops::Rope rd = rh;
      rd.cos_sin = rh.cos_sin.to(Device::cuda);
      for (int64_t T : {0, 1, 5, 40}) {
        for (bool norm : {false, true}) {
          const int64_t nh = 8, nkv = 2, blocks = 6, bs = 16, W = (nh + 2 * nkv) * hd;
          std::vector<int32_t> pos, slots;
          for (int64_t t = 0; t < T; ++t) {
            pos.push_back(int32_t((t * 977 + 3) % max_pos));
            slots.push_back(t == 2 ? -1 : int32_t((t * 13 + 5) % (blocks * bs)));  // one padding row
          }
          Tensor ph = i32_host(pos), pd = to_dev(ph), sh = i32_host(slots), sd = to_dev(sh);
          Pair qkv = Pair::rand({T, W}, 2.0f), wq = Pair::rand({hd}), wk = Pair::rand({hd});
          Pair kc = Pair::rand({blocks, bs, nkv, hd}), vc = Pair::rand({blocks, bs, nkv, hd});
          // The same inputs again for the unfused CUDA chain.
          Tensor qkv2 = Tensor::empty(qkv.d.dims(), DType::bf16, Device::cuda);
          Tensor kc2 = Tensor::empty(kc.d.dims(), DType::bf16, Device::cuda);
          Tensor vc2 = Tensor::empty(vc.d.dims(), DType::bf16, Device::cuda);
          ops::cuda::copy_rows(qkv.d, qkv2);
          Tensor kc2f = kc2.view({blocks * bs, nkv * hd}), vc2f = vc2.view({blocks * bs, nkv * hd});
          ops::cuda::copy_rows(kc.d.view({blocks * bs, nkv * hd}), kc2f);
          ops::cuda::copy_rows(vc.d.view({blocks * bs, nkv * hd}), vc2f);
          auto views = [&](Tensor& buf) {
            return std::array<Tensor, 3>{heads_view(buf, 0, nh, hd), heads_view(buf, nh * hd, nkv, hd),
                                         heads_view(buf, (nh + nkv) * hd, nkv, hd)};
          };
          auto [qh, kh, vh] = views(qkv.h);
          auto [qd, kd, vd] = views(qkv.d);
          auto [q2, k2, v2] = views(qkv2);
          const Tensor* wqh = norm ? &wq.h : nullptr;
          const Tensor* wkh = norm ? &wk.h : nullptr;
          const Tensor* wqd = norm ? &wq.d : nullptr;
          const Tensor* wkd = norm ? &wk.d : nullptr;
          ops::cpu::rope_kv_write(qh, kh, vh, wqh, wkh, 1e-6f, ph, rh, kc.h, vc.h, sh);
          ops::cuda::rope_kv_write(qd, kd, vd, wqd, wkd, 1e-6f, pd, rd, kc.d, vc.d, sd);
          if (norm) ops::cuda::qk_norm_rope(q2, k2, wq.d, wk.d, 1e-6f, pd, rd);
          else ops::cuda::rope(q2, k2, pd, rd);
          ops::cuda::kv_write(k2, v2, kc2, vc2, sd);
          const std::string what =
              fmt::format("rope_kv_write {} hd={} T={} norm={}", rc.name, hd, T, norm);
          EXPECT_CLOSE(qkv.back(), qkv.h, what + " q/k");
          EXPECT_CLOSE(kc.back(), kc.h, what + " k cache");
          EXPECT_EQ(rel_err(vc.back(), vc.h), 0.0) << what << " v cache";
          // Bit-identical to rope + kv_write on the GPU.
          EXPECT_EQ(rel_err(qkv.back(), to_host_f32(qkv2)), 0.0) << what << " vs unfused q/k";
          EXPECT_EQ(rel_err(kc.back(), to_host_f32(kc2)), 0.0) << what << " vs unfused k cache";
          EXPECT_EQ(rel_err(vc.back(), to_host_f32(vc2)), 0.0) << what << " vs unfused v cache";
        }
      }
    }
  }
}

// FP8 (e4m3) caches with scales: the fused write stores exactly what rope + kv_write store on the
// GPU, and decodes close to the CPU oracle's cache (its rotary runs in f32, the GPU's k is bf16).
TEST(CudaOps, FusedRopeKvWriteFp8) {
  TS_REQUIRE_CUDA();
  const int64_t max_pos = 4096;
  const ops::KvScales s{0.5f, 1.7f};
  for (int64_t hd : {64, 128}) {
    ops::Rope rh = models::build_rope(rope_cases()[0].scaling, int(hd), max_pos, max_pos, false, Device::cpu);
    ops::Rope rd = rh;
    rd.cos_sin = rh.cos_sin.to(Device::cuda);
    for (int64_t T : {1, 40})
      for (bool norm : {false, true}) {
        const int64_t nh = 8, nkv = 2, blocks = 6, bs = 16, W = (nh + 2 * nkv) * hd;
        std::vector<int32_t> pos, slots;
        for (int64_t t = 0; t < T; ++t) {
          pos.push_back(int32_t((t * 977 + 3) % max_pos));
          slots.push_back(t == 2 ? -1 : int32_t((t * 13 + 5) % (blocks * bs)));
        }
        Tensor ph = i32_host(pos), pd = to_dev(ph), sh = i32_host(slots), sd = to_dev(sh);
        Pair qkv = Pair::rand({T, W}, 2.0f), wq = Pair::rand({hd}), wk = Pair::rand({hd});
        Tensor qkv2 = Tensor::empty(qkv.d.dims(), DType::bf16, Device::cuda);
        ops::cuda::copy_rows(qkv.d, qkv2);
        auto views = [&](Tensor& buf) {
          return std::array<Tensor, 3>{heads_view(buf, 0, nh, hd), heads_view(buf, nh * hd, nkv, hd),
                                       heads_view(buf, (nh + nkv) * hd, nkv, hd)};
        };
        auto [qh, kh, vh] = views(qkv.h);
        auto [qd, kd, vd] = views(qkv.d);
        auto [q2, k2, v2] = views(qkv2);
        const std::vector<int64_t> cs{blocks, bs, nkv, hd};
        Tensor kch = Tensor::zeros(cs, DType::f8_e4m3), vch = Tensor::zeros(cs, DType::f8_e4m3);
        Tensor kcd = to_dev(kch), vcd = to_dev(vch), kc2 = to_dev(kch), vc2 = to_dev(vch);
        ops::cpu::rope_kv_write(qh, kh, vh, norm ? &wq.h : nullptr, norm ? &wk.h : nullptr, 1e-6f, ph, rh, kch, vch, sh, s);
        ops::cuda::rope_kv_write(qd, kd, vd, norm ? &wq.d : nullptr, norm ? &wk.d : nullptr, 1e-6f, pd, rd, kcd, vcd, sd, s);
        if (norm) ops::cuda::qk_norm_rope(q2, k2, wq.d, wk.d, 1e-6f, pd, rd);
        else ops::cuda::rope(q2, k2, pd, rd);
        ops::cuda::kv_write(k2, v2, kc2, vc2, sd, s);
        const std::string what = fmt::format("rope_kv_write fp8 hd={} T={} norm={}", hd, T, norm);
        EXPECT_CLOSE(qkv.back(), qkv.h, what + " q/k");
        // k: the CPU rotates in f32, the GPU rounds k to bf16 first, so a value near an e4m3
        // rounding boundary may land one e4m3 step (2^-3 relative, 2^-9 absolute below 2^-6)
        // away; never more.
        {
          const Tensor g = e4m3_to_host_f32(kcd), c = e4m3_to_host_f32(kch);
          int64_t off = 0;
          for (int64_t i = 0; i < g.numel(); ++i) {
            const float x = g.ptr<float>()[i], y = c.ptr<float>()[i];
            off += std::fabs(x - y) > std::max(std::fabs(x), std::fabs(y)) * 0.125f + 0x1p-9f;
          }
          EXPECT_EQ(off, 0) << what << " k cache: values more than one e4m3 step from the CPU's";
          const double e = rel_err(g, c);
          std::printf("  [%s k cache] rel err %.3e (e4m3 steps)\n", what.c_str(), e);
          EXPECT_LT(e, 3e-2) << what;
        }
        EXPECT_CLOSE(e4m3_to_host_f32(vcd, s.v), e4m3_to_host_f32(vch, s.v), what + " v cache");
        const Tensor a = kcd.to(Device::cpu), b = kc2.to(Device::cpu), c = vcd.to(Device::cpu), d = vc2.to(Device::cpu);
        EXPECT_EQ(std::memcmp(a.data, b.data, size_t(a.numel())), 0) << what << " vs unfused k cache";
        EXPECT_EQ(std::memcmp(c.data, d.data, size_t(c.numel())), 0) << what << " vs unfused v cache";
      }
  }
}

TEST(CudaOps, FusedLinearSiluMul) {
  TS_REQUIRE_CUDA();
  // (I, K): a small weight (GEMV fused up to M = 8) and one over 8 MB (fused at M <= 2 only; the
  // larger M take cuBLASLt + silu_mul through the scratch).
  for (auto [I, K] : {std::pair<int64_t, int64_t>{256, 512}, {2304, 2048}}) {
    for (int64_t M : {0, 1, 2, 3, 5, 8, 17}) {
      for (int pol : {0, 1}) {  // auto; forced cuBLASLt (the unfused path)
        Pair x = Pair::rand({M, K}), w = Pair::rand({2 * I, K}, 0.05f);
        Pair out = Pair::rand({M, I}), gu = Pair::rand({M, 2 * I});
        ops::KernelPolicy policy;
        if (pol == 1) policy.linear = ops::LinearPath::cublaslt;
        ops::cpu::linear_silu_mul(x.h, w.h, out.h, gu.h, nullptr, 0.0f, nullptr);
        ops::cuda::linear_silu_mul(x.d, w.d, out.d, gu.d, nullptr, 0.0f, nullptr, policy);
        const std::string what = fmt::format("linear_silu_mul I={} K={} M={} policy={}", I, K, M, pol);
        EXPECT_CLOSE(out.back(), out.h, what);
        // Bit-identical to linear + silu_mul on the GPU with the same kernel choice.
        Tensor gu2 = Tensor::empty({M, 2 * I}, DType::bf16, Device::cuda);
        Tensor out2 = Tensor::empty({M, I}, DType::bf16, Device::cuda);
        ops::cuda::linear(x.d, w.d, gu2, nullptr, policy);
        ops::cuda::silu_mul(gu2, out2);
        if (M > 0) {
          EXPECT_EQ(rel_err(out.back(), to_host_f32(out2)), 0.0) << what << " vs unfused";
        }
      }
    }
  }
}

// The residual-stream fusions: rmsnorm in the GEMV prologue (rmsnorm_linear, linear_silu_mul with
// in_norm) and the residual add in its epilogue (linear_add), fused at M <= 2, unfused above.
TEST(CudaOps, FusedNormGemv) {
  TS_REQUIRE_CUDA();
  EXPECT_TRUE(ops::cuda::fuses_norm_gemv(1));
  EXPECT_TRUE(ops::cuda::fuses_norm_gemv(2));
  EXPECT_FALSE(ops::cuda::fuses_norm_gemv(3));
  for (auto [N, K] : {std::pair<int64_t, int64_t>{384, 512}, {1536, 4096}}) {
    for (int64_t M : {0, 1, 2, 3, 9}) {
      for (bool bias : {false, true}) {
        Pair x = Pair::rand({M, K}, 3.0f), nw = Pair::rand({K}), w = Pair::rand({N, K}, 0.05f), b = Pair::rand({N});
        Pair out = Pair::rand({M, N}), xs = Pair::rand({M, K});
        ops::cpu::rmsnorm_linear(x.h, nw.h, 1e-5f, w.h, out.h, bias ? &b.h : nullptr, xs.h);
        ops::cuda::rmsnorm_linear(x.d, nw.d, 1e-5f, w.d, out.d, bias ? &b.d : nullptr, xs.d);
        EXPECT_CLOSE(out.back(), out.h, fmt::format("rmsnorm_linear N={} K={} M={} bias={}", N, K, M, bias));
      }
      {
        Pair x = Pair::rand({M, K}), w = Pair::rand({N, K}, 0.05f), r = Pair::rand({M, N}, 4.0f);
        Pair sc = Pair::rand({M, N});
        // Unfused CUDA reference from the same residual: linear then add_inplace.
        Tensor r2 = Tensor::empty({M, N}, DType::bf16, Device::cuda), y2 = Tensor::empty({M, N}, DType::bf16, Device::cuda);
        ops::cuda::copy_rows(r.d, r2);
        ops::cpu::linear_add(x.h, w.h, r.h, sc.h);
        ops::cuda::linear_add(x.d, w.d, r.d, sc.d);
        ops::cuda::linear(x.d, w.d, y2, nullptr);
        ops::cuda::add_inplace(r2, y2);
        const std::string what = fmt::format("linear_add N={} K={} M={}", N, K, M);
        EXPECT_CLOSE(r.back(), r.h, what);
        if (M > 0) {
          EXPECT_EQ(rel_err(r.back(), to_host_f32(r2)), 0.0) << what << " vs unfused";
        }
      }
      {
        const int64_t I = N / 2;
        Pair x = Pair::rand({M, K}, 3.0f), nw = Pair::rand({K}), w = Pair::rand({2 * I, K}, 0.05f);
        Pair out = Pair::rand({M, I}), gu = Pair::rand({M, 2 * I}), xs = Pair::rand({M, K});
        ops::cpu::linear_silu_mul(x.h, w.h, out.h, gu.h, &nw.h, 1e-5f, &xs.h);
        ops::cuda::linear_silu_mul(x.d, w.d, out.d, gu.d, &nw.d, 1e-5f, &xs.d);
        EXPECT_CLOSE(out.back(), out.h, fmt::format("linear_silu_mul normed I={} K={} M={}", I, K, M));
      }
    }
  }
}
