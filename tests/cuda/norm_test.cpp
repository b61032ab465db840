// CUDA norms and rotary embeddings vs the CPU reference.
#include "cuda_test_util.h"

using namespace ts;
using namespace ts::test;

TEST(CudaOps, RmsNorm) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {64, 100, 4096, 5120}) {
    for (int64_t T : {0, 1, 5, 33}) {
      Pair x = Pair::rand({T, H}, 2.0f), w = Pair::rand({H});
      // Strided output.
      Pair buf = Pair::rand({T, H + 16});
      Tensor oh = buf.h.narrow(1, 8, H), od = buf.d.narrow(1, 8, H);
      ops::cpu::rmsnorm(x.h, w.h, 1e-6f, oh);
      ops::cuda::rmsnorm(x.d, w.d, 1e-6f, od);
      EXPECT_CLOSE(buf.back(), buf.h, fmt::format("rmsnorm H={} T={}", H, T));
      // In place.
      ops::cpu::rmsnorm(x.h, w.h, 1e-6f, x.h);
      ops::cuda::rmsnorm(x.d, w.d, 1e-6f, x.d);
      EXPECT_CLOSE(x.back(), x.h, fmt::format("rmsnorm in place H={} T={}", H, T));
    }
  }
}

TEST(CudaOps, FusedAddRmsNorm) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {64, 100, 4096}) {
    for (int64_t T : {0, 1, 7}) {
      Pair x = Pair::rand({T, H}), r = Pair::rand({T, H}), w = Pair::rand({H});
      ops::cpu::fused_add_rmsnorm(x.h, r.h, w.h, 1e-5f);
      ops::cuda::fused_add_rmsnorm(x.d, r.d, w.d, 1e-5f);
      EXPECT_CLOSE(r.back(), r.h, fmt::format("fused_add_rmsnorm residual H={} T={}", H, T));
      EXPECT_CLOSE(x.back(), x.h, fmt::format("fused_add_rmsnorm x H={} T={}", H, T));
    }
  }
}

TEST(CudaOps, RmsNormPair) {
  TS_REQUIRE_CUDA();
  for (int64_t T : {0, 1, 6}) {
    const int64_t Ha = 1536, Hb = 512, W = Ha + Hb + 64;
    Pair a = Pair::rand({T, Ha}), b = Pair::rand({T, Hb}), wa = Pair::rand({Ha}), wb = Pair::rand({Hb});
    Pair buf = Pair::rand({T, W});
    Tensor oah = buf.h.narrow(1, 0, Ha), oad = buf.d.narrow(1, 0, Ha);
    Tensor obh = buf.h.narrow(1, Ha + 64, Hb), obd = buf.d.narrow(1, Ha + 64, Hb);
    ops::cpu::rmsnorm_pair(a.h, b.h, wa.h, wb.h, 1e-6f, oah, obh);
    ops::cuda::rmsnorm_pair(a.d, b.d, wa.d, wb.d, 1e-6f, oad, obd);
    EXPECT_CLOSE(buf.back(), buf.h, fmt::format("rmsnorm_pair T={}", T));
  }
}

namespace {
// cos/sin table [max_pos, rot] as the model builds it (cos in the first half, sin in the second).
Tensor rope_table(int64_t max_pos, int64_t rot, double theta = 10000.0) {
  Tensor t = Tensor::empty({max_pos, rot}, DType::f32);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < rot / 2; ++i) {
      double inv = std::pow(theta, -2.0 * double(i) / double(rot));
      t.ptr<float>()[p * rot + i] = float(std::cos(double(p) * inv));
      t.ptr<float>()[p * rot + rot / 2 + i] = float(std::sin(double(p) * inv));
    }
  return t;
}
}  // namespace

TEST(CudaOps, RopeAndQkNorm) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {16, 64, 128}) {
    for (bool partial : {false, true}) {
      for (bool inter : {false, true}) {
        for (int64_t T : {0, 1, 5}) {
          const int64_t nh = 4, nkv = 2, max_pos = 4096, rot = partial ? hd / 2 : hd;
          const int64_t W = (nh + 2 * nkv) * hd;
          Tensor table = rope_table(max_pos, rot);
          ops::Rope rh{table, int(rot), inter}, rd{table.to(Device::cuda), int(rot), inter};
          std::vector<int32_t> pos;
          for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t((t * 977 + 1) % max_pos));
          Tensor ph = i32_host(pos), pd = to_dev(ph);
          for (bool norm : {false, true}) {
            Pair qkv = Pair::rand({T, W}, 2.0f), wq = Pair::rand({hd}), wk = Pair::rand({hd});
            Tensor qh = heads_view(qkv.h, 0, nh, hd), qd = heads_view(qkv.d, 0, nh, hd);
            Tensor kh = heads_view(qkv.h, nh * hd, nkv, hd), kd = heads_view(qkv.d, nh * hd, nkv, hd);
            if (norm) {
              ops::cpu::qk_norm_rope(qh, kh, wq.h, wk.h, 1e-6f, ph, rh);
              ops::cuda::qk_norm_rope(qd, kd, wq.d, wk.d, 1e-6f, pd, rd);
            } else {
              ops::cpu::rope(qh, kh, ph, rh);
              ops::cuda::rope(qd, kd, pd, rd);
            }
            EXPECT_CLOSE(qkv.back(), qkv.h,
                         fmt::format("{} hd={} rot={} interleaved={} T={}",
                                     norm ? "qk_norm_rope" : "rope", hd, rot, inter, T));
          }
          // k only (q undefined).
          Pair qkv = Pair::rand({T, W});
          Tensor none;
          Tensor kh = heads_view(qkv.h, nh * hd, nkv, hd), kd = heads_view(qkv.d, nh * hd, nkv, hd);
          if (T > 0) {
            ops::cpu::rope(none, kh, ph, rh);
            ops::cuda::rope(none, kd, pd, rd);
            EXPECT_CLOSE(qkv.back(), qkv.h, fmt::format("rope k only hd={}", hd));
          }
        }
      }
    }
  }
}
