// A linear layer's weight as the model holds it: a plain float tensor (f32 on the CPU, bf16 on
// CUDA), or, on CUDA, a quantized weight kept in its stored form with its scales (FP8 e4m3:
// block-128, per-channel, per-tensor, MXFP8), read by kernels that dequantize in registers
// (src/ops/cuda/quant_linear.cu). The CPU backend (the oracle) always gets dequantized weights.
// LinearWeight is-a Tensor so model code keeps treating plain weights as tensors; a quantized
// one must only reach ops::linear (any other op sees an FP8 tensor and refuses its dtype).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace ts::ops {

// Scales of a quantized W [N, K]: element (n, k) = e4m3(data[n, k]) x
// scale[n >> block_n_log2, k >> block_k_log2] (per-channel: block_k_log2 >= log2 K, so one
// column; per-tensor is stored per channel).
struct QuantScales {
  Tensor scale;  // f32 [ceil(N / 2^block_n_log2), ceil(K / 2^block_k_log2)], the weight's device
  int block_n_log2 = 0, block_k_log2 = 0;
  const char* format = "";  // what the checkpoint stored (io::weight_format_name), for logs
};

struct LinearWeight : Tensor {
  QuantScales quant;  // quant.scale undefined: a plain weight
  LinearWeight() = default;
  LinearWeight(Tensor t) : Tensor(std::move(t)) {}  // NOLINT: plain weights convert implicitly
  bool quantized() const { return quant.scale.data != nullptr; }
  // Bytes a pass over the weight reads (stored values + scales).
  size_t stored_bytes() const { return nbytes() + (quantized() ? quant.scale.nbytes() : 0); }
};

// out = x @ W^T (+ bias) for a plain or quantized weight (ops::linear for plain ones).
void linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias = nullptr);

}  // namespace ts::ops
