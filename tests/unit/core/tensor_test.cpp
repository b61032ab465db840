#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace ts;

TEST(Tensor, Bf16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.14159f, 1e-20f, 65504.0f}) {
    float back = bf16_to_f32(f32_to_bf16(f));
    EXPECT_NEAR(back, f, std::abs(f) / 128 + 1e-30f);
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // Round to nearest even: 1 + 2^-8 is halfway between two bf16 values and rounds down to 1.
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
}

TEST(Tensor, F16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.000061035156f, 65504.0f, 5.96e-8f})
    EXPECT_NEAR(f16_to_f32(f32_to_f16(f)), f, std::abs(f) / 1024 + 1e-7f);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 6}, DType::f32);
  Tensor s = t.narrow(1, 2, 3);  // columns 2..4 of every row
  EXPECT_EQ(s.row_stride(), 6);
  EXPECT_FALSE(s.is_contiguous());
  s.ptr<float>()[0] = 7.0f;
  EXPECT_EQ(t.ptr<float>()[2], 7.0f);
  Tensor r = t.slice_rows(1, 3);
  EXPECT_EQ(r.size(0), 2);
  EXPECT_EQ(r.ptr<float>() - t.ptr<float>(), 6);
  EXPECT_THROW(t.narrow(0, 3, 2), Error);
  EXPECT_EQ(t.view({-1}).size(0), 24);
  EXPECT_THROW(t.view({5, 5}), Error);
}

TEST(Tensor, ZeroSized) {
  Tensor t = Tensor::empty({0, 8}, DType::bf16);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.rows(), 0);
}
