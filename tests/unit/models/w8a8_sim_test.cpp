// The CPU's simulation of CUDA's W8A8 prefill (LoadOptions::simulate_w8a8): a random FP8 block-128
// checkpoint with dynamic activations and K % 512 == 0 (make-random-model --quant fp8). Loaded to
// simulate, forwards of ops::kW8A8MinRows rows or more quantize the activations of its linears
// (per token and 128 channels, e4m3) and so move the logits; shorter forwards do not; without
// the option nothing changes. The CUDA side is tests/cuda/w8a8_model_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/fp8.h"
#include "models/model.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/linear_weight.h"
#include "runtime/model_runner.h"
#include "model_test_util.h"

using namespace ts;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path path = fs::temp_directory_path() / ("ts_w8a8_sim_" + std::to_string(::getpid()));
  TmpDir() { fs::remove_all(path), fs::create_directories(path); }
  ~TmpDir() { fs::remove_all(path); }
};

std::string fp8_model(const TmpDir& d, const std::string& quant) {
  const std::string dir = (d.path / quant).string();
  test::write_small_llama(dir, quant, 1, 1024);
  return dir;
}


}  // namespace

TEST(W8A8Sim, FakeQuantizedActivationsAreTheCodesTimesTheScales) {
  Tensor x = Tensor::empty({3, 256}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = std::sin(0.37f * float(i)) * float(1 + i % 5);
  for (int64_t k = 0; k < 128; ++k) x.ptr<float>()[2 * 256 + k] = 0.0f;  // an all-zero group: scale 1
  Tensor q = Tensor::empty({3, 256}, DType::u8), s = Tensor::empty({3, 2}, DType::f32), f = Tensor::empty({3, 256}, DType::f32);
  ops::cpu::quantize_act_fp8(x, q, s);
  ops::cpu::fake_quantize_act_fp8(x, f);
  double worst = 0;
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t k = 0; k < 256; ++k) {
      const int64_t i = m * 256 + k;
      EXPECT_EQ(f.ptr<float>()[i], e4m3_to_f32(q.ptr<uint8_t>()[i]) * s.ptr<float>()[m * 2 + k / 128]);
      worst = std::max(worst, double(std::fabs(f.ptr<float>()[i] - x.ptr<float>()[i]) / (1.0 + std::fabs(x.ptr<float>()[i]))));
    }
  EXPECT_GT(worst, 0.0);  // e4m3 rounds
  EXPECT_LT(worst, 0.07);  // ... within its 3 mantissa bits
}

TEST(W8A8Sim, LongForwardsQuantizeActivationsOnlyWhenAsked) {
  TmpDir d;
  const std::string dir = fp8_model(d, "fp8");
  models::LoadOptions lo;
  std::shared_ptr<models::Model> exact = models::load_model(dir, lo);
  lo.simulate_w8a8 = true;
  std::shared_ptr<models::Model> sim = models::load_model(dir, lo);
  const int n = int(ops::kW8A8MinRows);
  const double d_long = test::max_abs_diff(test::prefill_logits(exact, n), test::prefill_logits(sim, n));
  const double d_short = test::max_abs_diff(test::prefill_logits(exact, n - 1), test::prefill_logits(sim, n - 1));
  std::printf("W8A8 simulation: max |sim - exact| %.3g over %d rows, %.3g over %d rows\n", d_long, n, d_short, n - 1);
  EXPECT_GT(d_long, 1e-5) << "the simulation did not quantize the activations of a " << n << "-row forward";
  EXPECT_EQ(d_short, 0.0) << "a " << n - 1 << "-row forward stays W8A16 on CUDA: no simulation";
  // Per-channel FP8 stays weight-only on CUDA: the simulation leaves it alone.
  const std::string ch = fp8_model(d, "fp8-channel");
  models::LoadOptions plain;
  std::shared_ptr<models::Model> ch_exact = models::load_model(ch, plain), ch_sim = models::load_model(ch, lo);
  EXPECT_EQ(test::max_abs_diff(test::prefill_logits(ch_exact, n), test::prefill_logits(ch_sim, n)), 0.0);
}
