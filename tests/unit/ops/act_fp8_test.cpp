// ops::cpu::quantize_act_fp8: the oracle of the W8A8 prefill's activation quantization (per token
// and 128 channels, scale = amax / 448). The CUDA kernel is checked against it bit for bit in
// tests/cuda/fp8_gemm_test.cpp; here its own contract: each group's largest value maps to ±448
// exactly, every value comes back within half an e4m3 step, all-zero groups get scale 1 and
// zero codes, groups are independent of each other and of the other tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"

using namespace ts;

namespace {
Tensor rand_x(int64_t M, int64_t K, float scale, uint32_t seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  Tensor x = Tensor::empty({M, K}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(r);
  return x;
}
}  // namespace

TEST(ActFp8, GroupAmaxMapsTo448AndValuesRoundTrip) {
  const int64_t M = 5, K = 384, G = 3;
  Tensor x = rand_x(M, K, 7.0f, 1);
  for (int64_t k = 128; k < 256; ++k) x.ptr<float>()[2 * K + k] = 0.0f;  // token 2, group 1: all zero
  x.ptr<float>()[3 * K + 300] = -1e6f;                                      // token 3, group 2: one huge value
  Tensor q = Tensor::empty({M, K}, DType::u8), s = Tensor::empty({M, G}, DType::f32);
  ops::cpu::quantize_act_fp8(x, q, s);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float sc = s.ptr<float>()[m * G + g];
      float amax = 0.0f;
      for (int64_t k = g * 128; k < g * 128 + 128; ++k) amax = std::max(amax, std::fabs(x.ptr<float>()[m * K + k]));
      if (amax == 0.0f) {
        EXPECT_EQ(sc, 1.0f);
        for (int64_t k = g * 128; k < g * 128 + 128; ++k) EXPECT_EQ(q.ptr<uint8_t>()[m * K + k] & 0x7f, 0);
        continue;
      }
      EXPECT_EQ(sc, amax / kE4m3Max) << m << "," << g;
      bool hit_max = false;
      for (int64_t k = g * 128; k < g * 128 + 128; ++k) {
        const float v = x.ptr<float>()[m * K + k], back = e4m3_to_f32(q.ptr<uint8_t>()[m * K + k]) * sc;
        hit_max = hit_max || std::fabs(e4m3_to_f32(q.ptr<uint8_t>()[m * K + k])) == kE4m3Max;
        // e4m3 has 3 mantissa bits: half a step is 2^-4 of the value (or 2^-10 of the scale for subnormals).
        EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16.0f, sc * 0x1p-10f) * 1.0001f) << m << "," << k;
      }
      EXPECT_TRUE(hit_max) << "token " << m << " group " << g << ": the amax must map to ±448";
    }
}

TEST(ActFp8, TokensAndGroupsAreIndependent) {
  // A token's codes do not depend on the other tokens in the batch (no per-batch scale).
  const int64_t K = 256;
  Tensor x = rand_x(4, K, 3.0f, 2);
  Tensor q4 = Tensor::empty({4, K}, DType::u8), s4 = Tensor::empty({4, 2}, DType::f32);
  ops::cpu::quantize_act_fp8(x, q4, s4);
  for (int64_t m = 0; m < 4; ++m) {
    Tensor one = x.slice_rows(m, m + 1).to(Device::cpu);
    Tensor q1 = Tensor::empty({1, K}, DType::u8), s1 = Tensor::empty({1, 2}, DType::f32);
    ops::cpu::quantize_act_fp8(one, q1, s1);
    EXPECT_EQ(std::memcmp(q1.data, q4.ptr<uint8_t>() + m * K, size_t(K)), 0) << m;
    EXPECT_EQ(std::memcmp(s1.data, s4.ptr<float>() + m * 2, 8), 0) << m;
  }
}

TEST(ActFp8, RefusesKNotAMultipleOf128) {
  Tensor x = rand_x(2, 100, 1.0f, 3), q = Tensor::empty({2, 100}, DType::u8), s = Tensor::empty({2, 1}, DType::f32);
  EXPECT_THROW(ops::cpu::quantize_act_fp8(x, q, s), std::exception);
}
