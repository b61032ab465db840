// CUDA linear (GEMV and cuBLASLt paths) vs the CPU reference.
#include <optional>

#include "cuda_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {
void check_linear(int64_t M, int64_t N, int64_t K, bool bias, bool strided, int path) {
  Pair x = Pair::rand({M, K}), w = Pair::rand({N, K}, 0.1f), b = Pair::rand({N});
  const int64_t pad = strided ? 8 : 0;
  Pair buf = Pair::rand({M, N + pad});
  Tensor oh = buf.h.narrow(1, 0, N), od = buf.d.narrow(1, 0, N);
  ops::cpu::linear(x.h, w.h, oh, bias ? &b.h : nullptr);
  ops::cuda::linear(x.d, w.d, od, bias ? &b.d : nullptr, ops::KernelPolicy{.linear = ops::LinearPath(path)});
  EXPECT_CLOSE(buf.back(), buf.h,
               fmt::format("linear M={} N={} K={} bias={} strided={} path={}", M, N, K, bias,
                           strided, path));
}
}  // namespace

TEST(CudaOps, LinearSmallM) {
  TS_REQUIRE_CUDA();
  for (int path : {0, 1, 2})
    for (int64_t M : {0, 1, 2, 3, 5, 8})
      for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {100, 24}, {4096, 4096}, {256, 20}})
        for (bool bias : {false, true}) check_linear(M, N, K, bias, M % 2 == 1, path);
}

TEST(CudaOps, LinearLargeM) {
  TS_REQUIRE_CUDA();
  for (int64_t M : {9, 17, 64, 130, 1000})
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {1000, 256}, {4096, 4096}})
      for (bool bias : {false, true}) check_linear(M, N, K, bias, M % 2 == 0, 0);
}

TEST(CudaOps, LinearLlamaShapes) {
  TS_REQUIRE_CUDA();
  // Batch-1 decode shapes of Llama-3.1-8B (the LM head is covered with a smaller K).
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{6144, 4096}, {28672, 4096}, {4096, 14336}})
    for (int64_t M : {1, 4}) check_linear(M, N, K, false, false, 0);
  check_linear(1, 128256, 512, false, false, 0);
}

TEST(CudaOps, LinearAlgorithmPerExactRowCount) {
  TS_REQUIRE_CUDA();
  // The algorithm cache is keyed by the exact shape: sizes asked largest first (as the prefill
  // graphs are captured) and then smaller ones of the same power-of-two range, odd ones included,
  // each get a correct product; bench --gemm-lab times the choices.
  for (int64_t M : {1024, 640, 581, 576, 561, 513})
    check_linear(M, 512, 256, M % 2 == 1, false, 0);
}

TEST(CudaOps, LinearLabAlgorithmsMatchTheCpu) {
  TS_REQUIRE_CUDA();
  // bench --gemm-lab's entry: the heuristic's first algorithms for another row count, run at x's.
  Pair x = Pair::rand({96, 256}), w = Pair::rand({384, 256}, 0.1f), o = Pair::rand({96, 384});
  ops::cpu::linear(x.h, w.h, o.h, nullptr);
  int ran = 0;
  for (int64_t qm : {96, 128, 64})
    for (int idx = 0; idx < 4; ++idx) {
      if (!ops::cuda::linear_lab_algo(x.d, w.d, o.d, qm, idx)) continue;
      ++ran;
      EXPECT_CLOSE(o.back(), o.h, fmt::format("linear_lab_algo query_m={} index={}", qm, idx));
    }
  EXPECT_GE(ran, 3);  // at least the first pick for each query size
}

TEST(CudaOps, LinearAutotuneTimesCandidatesOncePerShape) {
  TS_REQUIRE_CUDA();
  // LaunchConfig::gemm_autotune (--gemm-autotune): a new shape of <= 256 rows times the heuristic's
  // candidates and caches the fastest; the product is right whichever wins. Shapes no other test
  // uses, so the cache is cold for them.
  std::optional<cuda::ScopedLaunchConfig> on(std::in_place, cuda::LaunchConfig{.gemm_autotune = true});
  const ops::cuda::GemmAlgoStats s0 = ops::cuda::gemm_algo_stats();
  check_linear(48, 776, 520, true, false, 0);
  const ops::cuda::GemmAlgoStats s1 = ops::cuda::gemm_algo_stats();
  EXPECT_EQ(s1.tuned_shapes, s0.tuned_shapes + 1);
  EXPECT_GE(s1.candidates_timed - s0.candidates_timed, 2);
  check_linear(48, 776, 520, true, false, 0);  // cached: nothing timed again
  const ops::cuda::GemmAlgoStats s2 = ops::cuda::gemm_algo_stats();
  EXPECT_EQ(s2.tuned_shapes, s1.tuned_shapes);
  EXPECT_EQ(s2.candidates_timed, s1.candidates_timed);
  // Past 256 rows, and without the flag: the heuristic's first pick, untimed.
  check_linear(300, 776, 520, false, false, 0);
  on.reset();
  check_linear(47, 776, 520, false, false, 0);
  const ops::cuda::GemmAlgoStats s3 = ops::cuda::gemm_algo_stats();
  EXPECT_EQ(s3.tuned_shapes, s2.tuned_shapes);
  EXPECT_EQ(s3.heuristic_shapes, s2.heuristic_shapes + 2);
  EXPECT_EQ(s3.candidates_timed, s2.candidates_timed);
}
