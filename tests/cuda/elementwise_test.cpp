// CUDA elementwise/row ops vs the CPU reference: embedding, silu_mul, add_inplace, gather_rows,
// copy_rows, cast, kv_write. Strided outputs are column slices of wider buffers pre-filled with
// random data on both sides, so writes outside the slice or missed elements show up.
#include "cuda_test_util.h"

using namespace ts;
using namespace ts::test;

TEST(CudaOps, Embedding) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {64, 20, 4096}) {
    for (int64_t T : {0, 1, 7}) {
      for (int64_t vs : {0, 10}) {
        const int64_t V = 100, pad = 16;
        Pair table = Pair::rand({V, H});
        std::vector<int32_t> ids;
        for (int64_t t = 0; t < T; ++t) ids.push_back(int32_t((t * 37 + 3) % (V + 20)));
        Tensor ids_h = i32_host(ids), ids_d = to_dev(ids_h);
        Pair buf = Pair::rand({T, H + pad});
        Tensor oh = buf.h.narrow(1, 8, H), od = buf.d.narrow(1, 8, H);
        ops::cpu::embedding(ids_h, table.h, oh, vs);
        ops::cuda::embedding(ids_d, table.d, od, vs);
        EXPECT_CLOSE(buf.back(), buf.h, fmt::format("embedding H={} T={} vs={}", H, T, vs));
      }
    }
  }
}

TEST(CudaOps, SiluMul) {
  TS_REQUIRE_CUDA();
  for (int64_t I : {8, 100, 1536}) {
    for (int64_t T : {0, 1, 3, 17}) {
      Pair x = Pair::rand({T, 2 * I}, 4.0f);
      Pair buf = Pair::rand({T, I + 8});
      Tensor oh = buf.h.narrow(1, 8, I), od = buf.d.narrow(1, 8, I);
      ops::cpu::silu_mul(x.h, oh);
      ops::cuda::silu_mul(x.d, od);
      EXPECT_CLOSE(buf.back(), buf.h, fmt::format("silu_mul I={} T={}", I, T));
    }
  }
}

TEST(CudaOps, AddInplace) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {8, 33, 4096}) {
    for (int64_t T : {0, 1, 9}) {
      Pair y = Pair::rand({T, H}), x = Pair::rand({T, H + 8});
      Tensor xh = x.h.narrow(1, 0, H), xd = x.d.narrow(1, 0, H);
      ops::cpu::add_inplace(y.h, xh);
      ops::cuda::add_inplace(y.d, xd);
      EXPECT_CLOSE(y.back(), y.h, fmt::format("add_inplace H={} T={}", H, T));
    }
  }
}

TEST(CudaOps, GatherCopyCast) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {8, 13, 4096}) {
    for (int64_t N : {0, 1, 5}) {
      const int64_t R = 11;
      Pair x = Pair::rand({R, H});
      std::vector<int32_t> idx;
      for (int64_t i = 0; i < N; ++i) idx.push_back(int32_t((i * 7 + 2) % R));
      Tensor ih = i32_host(idx), id = to_dev(ih);
      Pair out = Pair::rand({N, H + 4});
      Tensor oh = out.h.narrow(1, 2, H), od = out.d.narrow(1, 2, H);
      ops::cpu::gather_rows(x.h, ih, oh);
      ops::cuda::gather_rows(x.d, id, od);
      EXPECT_CLOSE(out.back(), out.h, fmt::format("gather_rows bf16 H={} N={}", H, N));

      // f32 gather (logits rows) and casts both ways.
      Tensor xf = Tensor::empty({R, H}, DType::f32, Device::cuda);
      ops::cuda::cast(x.d, xf);
      Tensor gf = Tensor::empty({N, H}, DType::f32, Device::cuda);
      ops::cuda::gather_rows(xf, id, gf);
      Tensor gh = Tensor::empty({N, H}, DType::f32);
      ops::cpu::gather_rows(x.h, ih, gh);
      EXPECT_CLOSE(to_host_f32(gf), gh, fmt::format("gather_rows f32 H={} N={}", H, N));
      Tensor back = Tensor::empty({R, H}, DType::bf16, Device::cuda);
      ops::cuda::cast(xf, back);
      EXPECT_EQ(rel_err(to_host_f32(back), x.h), 0.0) << "bf16 -> f32 -> bf16 round trip";

      Pair cbuf = Pair::rand({R, H + 8});
      Tensor ch = cbuf.h.narrow(1, 3, H), cd = cbuf.d.narrow(1, 3, H);
      ops::cpu::copy_rows(x.h, ch);
      ops::cuda::copy_rows(x.d, cd);
      EXPECT_CLOSE(cbuf.back(), cbuf.h, fmt::format("copy_rows H={}", H));
    }
  }
}

TEST(CudaOps, KvWrite) {
  TS_REQUIRE_CUDA();
  for (int64_t hd : {16, 64, 128}) {
    for (int64_t T : {0, 1, 6}) {
      const int64_t nh = 4, nkv = 2, blocks = 5, bs = 16;
      const int64_t W = (nh + 2 * nkv) * hd;
      Pair qkv = Pair::rand({T, W});
      Tensor kh = heads_view(qkv.h, nh * hd, nkv, hd), kd = heads_view(qkv.d, nh * hd, nkv, hd);
      Tensor vh = heads_view(qkv.h, (nh + nkv) * hd, nkv, hd),
             vd = heads_view(qkv.d, (nh + nkv) * hd, nkv, hd);
      Pair kc = Pair::rand({blocks, bs, nkv, hd}), vc = Pair::rand({blocks, bs, nkv, hd});
      std::vector<int32_t> slots;
      for (int64_t t = 0; t < T; ++t) slots.push_back(t == 2 ? -1 : int32_t((t * 13 + 5) % (blocks * bs)));
      Tensor sh = i32_host(slots), sd = to_dev(sh);
      ops::cpu::kv_write(kh, vh, kc.h, vc.h, sh);
      ops::cuda::kv_write(kd, vd, kc.d, vc.d, sd);
      EXPECT_EQ(rel_err(kc.back(), kc.h), 0.0) << "k cache hd=" << hd << " T=" << T;
      EXPECT_EQ(rel_err(vc.back(), vc.h), 0.0) << "v cache hd=" << hd << " T=" << T;
    }
  }
}

// FP8 (e4m3) caches: the device writes exactly the CPU oracle's bytes, e4m3(x x (1 / scale))
// rounded to nearest and saturating (scale 0.05 pushes values past 448), through the vectorised
// path (head dims multiples of 8) and the scalar one (hd 20).
TEST(CudaOps, KvWriteFp8) {
  TS_REQUIRE_CUDA();
  for (const ops::KvScales s : {ops::KvScales{}, ops::KvScales{0.05f, 3.0f}})
    for (int64_t hd : {16, 20, 64, 128})
      for (int64_t T : {0, 1, 6}) {
        const int64_t nh = 4, nkv = 2, blocks = 5, bs = 16;
        const int64_t W = (nh + 2 * nkv) * hd;
        Pair qkv = Pair::rand({T, W}, 30.0f);
        Tensor kh = heads_view(qkv.h, nh * hd, nkv, hd), kd = heads_view(qkv.d, nh * hd, nkv, hd);
        Tensor vh = heads_view(qkv.h, (nh + nkv) * hd, nkv, hd), vd = heads_view(qkv.d, (nh + nkv) * hd, nkv, hd);
        Tensor kch = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3), vch = Tensor::zeros({blocks, bs, nkv, hd}, DType::f8_e4m3);
        Tensor kcd = to_dev(kch), vcd = to_dev(vch);
        std::vector<int32_t> slots;
        for (int64_t t = 0; t < T; ++t) slots.push_back(t == 2 ? -1 : int32_t((t * 13 + 5) % (blocks * bs)));
        Tensor sh = i32_host(slots), sd = to_dev(sh);
        ops::cpu::kv_write(kh, vh, kch, vch, sh, s);
        ops::cuda::kv_write(kd, vd, kcd, vcd, sd, s);
        const Tensor kb = kcd.to(Device::cpu), vb = vcd.to(Device::cpu);
        EXPECT_EQ(std::memcmp(kb.data, kch.data, size_t(kch.numel())), 0) << "k cache hd=" << hd << " T=" << T << " scale " << s.k;
        EXPECT_EQ(std::memcmp(vb.data, vch.data, size_t(vch.numel())), 0) << "v cache hd=" << hd << " T=" << T << " scale " << s.v;
      }
}
