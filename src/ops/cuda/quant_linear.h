// CUDA linears over quantized weights kept as stored (ops/linear_weight.h). Plain C++ header.
//  Decode (small M): a GEMV that streams the FP8 rows with 16-byte loads and dequantizes in
//   registers (W8A16, fp32 accumulation), or its tensor-core form for a few to 64 rows: decode
//   reads 1 byte per weight. Policy gemv forces the GEMV (M <= 16), cublaslt the tiles.
//  Otherwise (prefill): row tiles of W are dequantized to bf16 into scratch (workspace(3), at most
//   64 MB) and multiplied by the bf16 GEMM (cuBLASLt).
#pragma once
#include "ops/kernel_policy.h"
#include "ops/linear_weight.h"

namespace ts::ops::cuda {

// x bf16 [M, K]; w f8_e4m3 [N, K] with w.quant; out bf16 or f32 [M, N] (strided rows allowed);
// bias bf16 [N] or null.
void quant_linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias = nullptr,
                  const KernelPolicy& policy = {});
// The kernels, for tests and the lab: gemv (CUDA cores, M <= 16), mma (tensor cores, M <= 64,
// k blocks >= 64), tiles (dequantize + cuBLASLt); one that does not apply falls back to tiles.
enum class QuantKernel { automatic, gemv, mma, tiles };
void quant_linear_kernel(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias, QuantKernel kernel);
// Allocates the prefill path's scratch now (the loader calls it), not during a graph capture.
void reserve_quant_scratch();
// Rows [row0, row0 + rows) of w dequantized into out bf16 [rows, K] (contiguous, on the GPU).
void dequantize_rows(const LinearWeight& w, int64_t row0, int64_t rows, Tensor& out);

}  // namespace ts::ops::cuda
