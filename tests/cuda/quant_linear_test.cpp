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
  return k == QuantKernel::gemv ? "gemv" : k == QuantKernel::mma ? "mma" : k == QuantKernel::tiles ? "tiles" : "auto";
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
  for (int64_t M : {1, 4, 5, 100}) check_fp4(M, 1000, 512, QuantKernel::automatic, M == 5, false);
  check_fp4(16, 576, 1024, QuantKernel::tiles, true, true);
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
