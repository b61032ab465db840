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
// NVFP4 (nvfp4 = true): data u8 [N, K/2] (e2m1, element 2i in the low nibble), element (n, k) =
// e2m1 x scale[n, k / 16] x scale2[n] with scale f8_e4m3 codes [N, K/16] (block 1 x 16) and
// scale2 f32 [N] (weight_scale_2 per row: stacked q|k|v parts each bring their own).
struct QuantScales {
  Tensor scale;  // f32 [ceil(N / 2^block_n_log2), ceil(K / 2^block_k_log2)], the weight's device
  int block_n_log2 = 0, block_k_log2 = 0;
  const char* format = "";  // what the checkpoint stored (io::weight_format_name), for logs
  bool nvfp4 = false;
  Tensor scale2;
  // The checkpoint declares dynamic FP8 activations (quant_method fp8 activation_scheme dynamic,
  // compressed-tensors dynamic per-token): prefill may quantize activations (W8A8), as the
  // checkpoint was made to be served; otherwise linears stay weight-only.
  bool act_fp8 = false;
  // CPU only (the oracle of CUDA's W8A8): this dequantized weight was stored in a form whose CUDA
  // linear takes W8A8 (w8a8_weight_form below), and the model was loaded to simulate it
  // (LoadOptions::simulate_w8a8, verify-golden --simulate-w8a8): forwards of kW8A8MinRows rows or
  // more quantize the activations as CUDA does (per token and 128 channels, e4m3, amax / 448)
  // before the fp32 product.
  bool sim_w8a8 = false;
};

// CUDA runs a linear as W8A8 (FP8 activations x FP8 weights on the tensor cores) from this many
// rows, where its weight allows it; fewer rows keep the W8A16 kernels (src/ops/cuda/quant_linear.cu).
constexpr int64_t kW8A8MinRows = 32;

// The weight-side conditions of W8A8 for a stored FP8 weight with in_features K: a checkpoint
// made for dynamic FP8 activations, 128 x 128 scale blocks, K % 512 == 0 (cuBLASLt reads a scale
// grid of fewer than 4 k blocks misaligned; see quant_linear.h). Both backends decide with it.
inline bool w8a8_weight_form(const QuantScales& q, int64_t K) {
  return !q.nvfp4 && q.act_fp8 && q.block_n_log2 == 7 && q.block_k_log2 == 7 && K % 512 == 0;
}

struct LinearWeight : Tensor {
  QuantScales quant;  // quant.scale undefined: a plain weight
  LinearWeight() = default;
  LinearWeight(Tensor t) : Tensor(std::move(t)) {}  // NOLINT: plain weights convert implicitly
  bool quantized() const { return quant.scale.data != nullptr; }
  // Bytes a pass over the weight reads (stored values + scales).
  size_t stored_bytes() const {
    return nbytes() + (quantized() ? quant.scale.nbytes() : 0) + (quant.scale2.data ? quant.scale2.nbytes() : 0);
  }
  int64_t out_features() const { return size(0); }
  int64_t in_features() const { return quant.nvfp4 ? size(1) * 2 : size(1); }
};

// out = x @ W^T (+ bias) for a plain or quantized weight (ops::linear for plain ones).
void linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias = nullptr);

}  // namespace ts::ops
