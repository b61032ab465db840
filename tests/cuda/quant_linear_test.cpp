// CUDA linears over FP8 and NVFP4 weights kept as stored (ops/cuda/quant_linear.cu) vs the CPU oracle
// (the weight dequantized exactly, fp32 matmul): block-128 (partial edge blocks in N and K),
// per-channel, per-tensor and MXFP8 (per-32) scales; the GEMV (M <= 16) and the dequantized-tile
// GEMM path (prefill); bias, strided output, f32 output.
#include "cuda_test_util.h"

#include "core/fp8.h"
#include "models/weights.h"
#include "ops/cuda/quant_linear.h"

using namespace ts;
using namespace ts::test;

namespace {

int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// A random FP8 weight [N, K] with 2^bn x 2^bk scale blocks, on the GPU.
ops::LinearWeight rand_weight(int64_t N, int64_t K, int bn, int bk, bool one_scale = false) {
  std::uniform_real_distribution<float> ds(0.5e-4f, 2e-4f);
  // Every e4m3 code but NaN (subnormals included).
  Tensor q = Tensor::empty({N, K}, DType::f8_e4m3);
  for (int64_t i = 0; i < q.numel(); ++i) {
    uint8_t c = uint8_t(rng()() & 0xff);
    q.ptr<uint8_t>()[i] = (c & 0x7f) == 0x7f ? uint8_t(c ^ 1) : c;
  }
  const int64_t sr = (N + (int64_t(1) << bn) - 1) >> bn, sc = (K + (int64_t(1) << bk) - 1) >> bk;
  Tensor s = Tensor::empty({sr, sc}, DType::f32);
  const float s0 = ds(rng());
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = one_scale ? s0 : ds(rng());
  ops::LinearWeight w(q.to(Device::cuda));
  w.quant.scale = s.to(Device::cuda);
  w.quant.block_n_log2 = bn;
  w.quant.block_k_log2 = bk;
  w.quant.format = "test";
  return w;
}

struct Layout {
  const char* name;
  int bn, bk;  // bk < 0: per channel (one column)
  bool one_scale;
};
const Layout kLayouts[] = {{"block128", 7, 7, false}, {"channel", 0, -1, false}, {"tensor", 0, -1, true},
                           {"mxfp8", 0, 5, false}};

using ops::cuda::QuantKernel;
const char* kname(QuantKernel k) {
  return k == QuantKernel::gemv ? "gemv" : k == QuantKernel::mma ? "mma" : k == QuantKernel::tiles ? "tiles" : k == QuantKernel::tc ? "tc" : "auto";
}

void check(const Layout& L, int64_t M, int64_t N, int64_t K, QuantKernel kern, bool bias, bool strided, bool f32out) {
  ops::LinearWeight w = rand_weight(N, K, L.bn, L.bk < 0 ? std::max(4, ceil_log2(K)) : L.bk, L.one_scale);
  Tensor wref = models::dequantize_linear(w);  // exact f32
  Pair x = Pair::rand({M, K}), b = Pair::rand({N});
  const int64_t pad = strided ? 8 : 0;
  Tensor oh = Tensor::zeros({M, N + pad}, DType::f32).narrow(1, 0, N);
  ops::cpu::linear(x.h, wref, oh, bias ? &b.h : nullptr);
  Tensor od_buf = Tensor::zeros({M, N + pad}, f32out ? DType::f32 : DType::bf16, Device::cuda);
  Tensor od = od_buf.narrow(1, 0, N);
  ops::cuda::quant_linear_kernel(x.d, w, od, bias ? &b.d : nullptr, kern);
  Tensor got = to_host_f32(od_buf).narrow(1, 0, N);
  EXPECT_CLOSE(got, oh,
               fmt::format("fp8 {} M={} N={} K={} {} bias={} strided={} f32out={}", L.name, M, N, K, kname(kern), bias,
                           strided, f32out));
}

}  // namespace

TEST(CudaOps, QuantLinearFp8Gemv) {
  TS_REQUIRE_CUDA();
  // N=576 (DeepSeek kv_a: a partial row block), K=1008 (7 k blocks and a partial one).
  for (const Layout& L : kLayouts)
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1008}, {4096, 4096}, {40, 64}})
      for (int64_t M : {1, 3, 8, 16}) {
        if (L.bk == 5 && K % 32) continue;
        check(L, M, N, K, QuantKernel::gemv, M == 3, M % 2 == 1, false);
      }
}

TEST(CudaOps, QuantLinearFp8Mma) {
  TS_REQUIRE_CUDA();
  // Tensor cores, 1..64 rows (partial 8-row tiles), partial 16-feature and 64-k chunks; MXFP8
  // (32-wide k blocks) falls back to the tiles and must still match.
  for (const Layout& L : kLayouts)
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1008}, {4096, 4096}, {40, 64}, {1000, 272}})
      for (int64_t M : {1, 3, 8, 13, 16, 33, 64}) {
        if (L.bk == 5 && K % 32) continue;
        check(L, M, N, K, QuantKernel::mma, M == 13, M % 2 == 1, false);
      }
  check(kLayouts[0], 5, 1000, 512, QuantKernel::mma, true, false, true);
}

TEST(CudaOps, QuantLinearFp8TensorCoreDecodeGemv) {
  TS_REQUIRE_CUDA();
  // The tensor-core decode GEMV (QuantKernel::tc), 1..8 rows, partial 16-feature tiles and
  // partial k blocks (K = 576: 4.5 blocks of 128); where it does not apply (MXFP8's 32-wide k
  // blocks, K % 64 != 0, M > 8) the call falls back and must still match.
  for (const Layout& L : kLayouts)
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1008}, {200, 576}, {4096, 4096}, {40, 64}, {1000, 272}})
      for (int64_t M : {1, 2, 3, 8, 9}) {
        if (L.bk == 5 && K % 32) continue;
        check(L, M, N, K, QuantKernel::tc, M == 3, M % 2 == 1, false);
      }
  ops::LinearWeight w = rand_weight(64, 128, 7, 7);
  Tensor x = Tensor::empty({2, 128}, DType::bf16, Device::cuda);
  EXPECT_TRUE(ops::cuda::quant_decode_applies(x, w, true));
  EXPECT_FALSE(ops::cuda::quant_decode_applies(Tensor::empty({9, 128}, DType::bf16, Device::cuda), w, false));
  EXPECT_FALSE(ops::cuda::quant_decode_applies(x, rand_weight(64, 128, 0, 5), false));  // MXFP8
}

TEST(CudaOps, QuantLinearFp8Prefill) {
  TS_REQUIRE_CUDA();
  for (const Layout& L : kLayouts)
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1008}, {1000, 256}})
      for (int64_t M : {3, 16, 100}) check(L, M, N, K, M == 100 ? QuantKernel::automatic : QuantKernel::tiles, M == 16, M == 3, false);
}

TEST(CudaOps, QuantLinearFp8AutoF32OutAndLargeTiles) {
  TS_REQUIRE_CUDA();
  for (int64_t M : {1, 2, 5, 40, 64, 65}) check(kLayouts[0], M, 1000, 512, QuantKernel::automatic, M == 5, false, true);
  for (int64_t M : {1, 4, 16, 64}) check(kLayouts[1], M, 4096, 4096, QuantKernel::automatic, false, M == 4, false);
  // More rows than one 64 MB dequantized tile holds at K=4096 (8192 rows): two tiles.
  check(kLayouts[0], 80, 8192 + 640, 4096, QuantKernel::automatic, true, false, false);
}

TEST(CudaOps, QuantLinearFp8DequantizeRowsIsExact) {
  TS_REQUIRE_CUDA();
  ops::LinearWeight w = rand_weight(300, 272, 7, 7);
  Tensor ref = models::dequantize_linear(w);
  Tensor d = Tensor::empty({200, 272}, DType::bf16, Device::cuda);
  ops::cuda::dequantize_rows(w, 100, 200, d);
  Tensor got = to_host_f32(d);
  int64_t bad = 0;
  for (int64_t r = 0; r < 200; ++r)
    for (int64_t k = 0; k < 272; ++k)
      bad += got.ptr<float>()[r * 272 + k] != bf16_to_f32(f32_to_bf16(ref.ptr<float>()[(100 + r) * 272 + k]));
  EXPECT_EQ(bad, 0) << "values differ from bf16(e4m3 x scale)";
}

namespace {

// A random NVFP4 weight [N, K] (every e2m1 code; E4M3 group scales in [0.25, 8]; per-row scale2).
ops::LinearWeight rand_nvfp4(int64_t N, int64_t K) {
  Tensor q = Tensor::empty({N, K / 2}, DType::u8), s = Tensor::empty({N, K / 16}, DType::f8_e4m3);
  Tensor s2 = Tensor::empty({N}, DType::f32);
  std::uniform_real_distribution<float> ds(0.25f, 8.0f), d2(1e-3f, 4e-3f);
  for (int64_t i = 0; i < q.numel(); ++i) q.ptr<uint8_t>()[i] = uint8_t(rng()() & 0xff);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = f32_to_e4m3(ds(rng()));
  for (int64_t i = 0; i < N; ++i) s2.ptr<float>()[i] = d2(rng());
  ops::LinearWeight w(q.to(Device::cuda));
  w.quant.scale = s.to(Device::cuda);
  w.quant.scale2 = s2.to(Device::cuda);
  w.quant.block_k_log2 = 4;
  w.quant.nvfp4 = true;
  w.quant.format = "NVFP4";
  return w;
}

void check_fp4(int64_t M, int64_t N, int64_t K, QuantKernel kern, bool bias, bool strided) {
  ops::LinearWeight w = rand_nvfp4(N, K);
  Tensor wref = models::dequantize_linear(w);
  Pair x = Pair::rand({M, K}), b = Pair::rand({N});
  const int64_t pad = strided ? 8 : 0;
  Tensor oh = Tensor::zeros({M, N + pad}, DType::f32).narrow(1, 0, N);
  ops::cpu::linear(x.h, wref, oh, bias ? &b.h : nullptr);
  Tensor od_buf = Tensor::zeros({M, N + pad}, DType::bf16, Device::cuda);
  Tensor od = od_buf.narrow(1, 0, N);
  ops::cuda::quant_linear_kernel(x.d, w, od, bias ? &b.d : nullptr, kern);
  Tensor got = to_host_f32(od_buf).narrow(1, 0, N);
  EXPECT_CLOSE(got, oh, fmt::format("nvfp4 M={} N={} K={} {} bias={} strided={}", M, N, K, kname(kern), bias, strided));
}

}  // namespace

TEST(CudaOps, QuantLinearNvfp4) {
  TS_REQUIRE_CUDA();
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1024}, {4096, 4096}, {40, 96}})
    for (int64_t M : {1, 3, 16}) check_fp4(M, N, K, QuantKernel::gemv, M == 3, M == 3);
  for (int64_t M : {1, 4, 5, 24, 64, 100}) check_fp4(M, 1000, 512, QuantKernel::automatic, M == 5, M == 24);
  check_fp4(16, 576, 1024, QuantKernel::tiles, true, true);
  // The small-batch tensor-core kernel over the nibbles (automatic for 9..64 rows): partial
  // 16-feature tiles, K % 64 == 32 (a half chunk), 1..8 row tiles, bias, strided out.
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1024}, {40, 96}, {1000, 4096}})
    for (int64_t M : {1, 9, 17, 33, 64}) check_fp4(M, N, K, QuantKernel::mma, M == 9, M == 17);
  // The dequantized tiles match the oracle bit for bit (same rounding order).
  ops::LinearWeight w = rand_nvfp4(300, 256);
  Tensor ref = models::dequantize_linear(w);
  Tensor d = Tensor::empty({200, 256}, DType::bf16, Device::cuda);
  ops::cuda::dequantize_rows(w, 100, 200, d);
  Tensor got = to_host_f32(d);
  int64_t bad = 0;
  for (int64_t r = 0; r < 200; ++r)
    for (int64_t k = 0; k < 256; ++k)
      bad += got.ptr<float>()[r * 256 + k] != bf16_to_f32(f32_to_bf16(ref.ptr<float>()[(100 + r) * 256 + k]));
  EXPECT_EQ(bad, 0) << "NVFP4 tiles differ from bf16(e2m1 x scale x scale2)";
}

TEST(CudaOps, QuantLinearNvfp4TensorCoreDecodeGemv) {
  TS_REQUIRE_CUDA();
  // NVFP4 through the tensor-core decode GEMV (QuantKernel::tc): 1..8 rows, partial 16-feature
  // tiles; K % 64 != 0 (K = 96) and M > 8 fall back (the GEMV / tiles) and must still match.
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{576, 1024}, {200, 576}, {4096, 4096}, {40, 96}})
    for (int64_t M : {1, 2, 3, 8, 9}) check_fp4(M, N, K, QuantKernel::tc, M == 3, M % 2 == 1);
  // Every positive E4M3 group-scale code (subnormals and 448 included) and every e2m1 code: the
  // in-register product e2m1 x scale x 2^-8 is exact, so the result is the oracle's up to the sums.
  ops::LinearWeight w = rand_nvfp4(256, 2048);
  Tensor s = Tensor::empty({256, 2048 / 16}, DType::f8_e4m3);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = uint8_t(i % 0x7f);
  w.quant.scale = s.to(Device::cuda);
  Tensor wref = models::dequantize_linear(w);
  for (int64_t M : {1, 4}) {
    Pair x = Pair::rand({M, 2048});
    Tensor oh = Tensor::zeros({M, 256}, DType::f32);
    ops::cpu::linear(x.h, wref, oh, nullptr);
    Tensor od = Tensor::zeros({M, 256}, DType::bf16, Device::cuda);
    ops::cuda::quant_linear_kernel(x.d, w, od, nullptr, QuantKernel::tc);
    EXPECT_CLOSE(to_host_f32(od), oh, fmt::format("nvfp4 every scale code M={} tc", M));
  }
}

namespace {

// The decode fusions over weights kept as stored (rmsnorm_linear, linear_silu_mul with and without
// the input norm, linear_add) vs the CPU oracle on the dequantized weight: fused through the
// tensor-core decode GEMV where it applies (1..8 rows, the norm while M x K fits shared memory),
// unfused (rmsnorm + quant_linear + silu_mul / add) elsewhere and under the cuBLASLt policy.
// make(N, K) makes a weight [N, K].
template <class Make>
void check_fusions(const char* name, int64_t N, int64_t K, Make make) {
  const float eps = 1e-5f;
  for (int64_t M : {0, 1, 2, 3, 8})
    for (int pol : {0, 1}) {
      ops::KernelPolicy policy;
      if (pol == 1) policy.linear = ops::LinearPath::cublaslt;
      const std::string tag = fmt::format("{} N={} K={} M={} policy={}", name, N, K, M, pol);
      {
        ops::LinearWeight w = make(N, K);
        Tensor wref = models::dequantize_linear(w);
        Pair x = Pair::rand({M, K}, 3.0f), nw = Pair::rand({K}), b = Pair::rand({N});
        Pair out = Pair::rand({M, N}), xs = Pair::rand({M, K});
        const bool bias = M == 2;
        ops::cpu::rmsnorm_linear(x.h, nw.h, eps, wref, out.h, bias ? &b.h : nullptr, xs.h);
        ops::cuda::rmsnorm_linear(x.d, nw.d, eps, w, out.d, bias ? &b.d : nullptr, xs.d, policy);
        EXPECT_CLOSE(out.back(), out.h, "rmsnorm_linear " + tag);
      }
      {
        ops::LinearWeight w = make(2 * N, K);
        Tensor wref = models::dequantize_linear(w);
        for (bool norm : {false, true}) {
          Pair x = Pair::rand({M, K}, 3.0f), nw = Pair::rand({K});
          Pair out = Pair::rand({M, N}), gu = Pair::rand({M, 2 * N}), xs = Pair::rand({M, K});
          ops::cpu::linear_silu_mul(x.h, wref, out.h, gu.h, norm ? &nw.h : nullptr, eps, norm ? &xs.h : nullptr);
          ops::cuda::linear_silu_mul(x.d, w, out.d, gu.d, norm ? &nw.d : nullptr, eps, norm ? &xs.d : nullptr, policy);
          EXPECT_CLOSE(out.back(), out.h, fmt::format("linear_silu_mul norm={} {}", norm, tag));
        }
      }
      {
        ops::LinearWeight w = make(N, K);
        Tensor wref = models::dequantize_linear(w);
        Pair x = Pair::rand({M, K}), r = Pair::rand({M, N}, 4.0f), sc = Pair::rand({M, N});
        ops::cpu::linear_add(x.h, wref, r.h, sc.h);
        ops::cuda::linear_add(x.d, w, r.d, sc.d, policy);
        EXPECT_CLOSE(r.back(), r.h, "linear_add " + tag);
      }
    }
}

}  // namespace

TEST(CudaOps, QuantLinearFp8DecodeFusions) {
  TS_REQUIRE_CUDA();
  for (const Layout& L : kLayouts)
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{384, 512}, {200, 576}, {1536, 4096}}) {
      if (L.bk == 5 && K % 32) continue;
      const int bk = L.bk < 0 ? std::max(4, ceil_log2(K)) : L.bk;
      check_fusions(L.name, N, K, [&](int64_t n, int64_t k) { return rand_weight(n, k, L.bn, bk, L.one_scale); });
    }
}

TEST(CudaOps, QuantLinearNvfp4DecodeFusions) {
  TS_REQUIRE_CUDA();
  // K = 96 (not a multiple of 64): the unfused fallback (400 outputs: a 40-wide bf16 result's
  // relative error sat at the 1e-2 tolerance on the unfused path itself).
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{384, 512}, {200, 576}, {1536, 4096}, {400, 96}})
    check_fusions("nvfp4", N, K, [](int64_t n, int64_t k) { return rand_nvfp4(n, k); });
}
