// CUDA linears over quantized weights kept as stored (ops/linear_weight.h). Plain C++ header.
//  Decode (small M): FP8 rows streamed with 16-byte loads and dequantized in registers (W8A16,
//   fp32 accumulation): the tensor-core decode GEMV for 1..8 rows (also the decode fusions'
//   kernel, quant_decode_gemv), a CUDA-core GEMV, or the tensor-core mma kernel to 64 rows: decode
//   reads 1 byte per weight. Policy gemv forces the GEMV (M <= 16), cublaslt the tiles.
//  Otherwise (prefill): row tiles of W are dequantized to bf16 into scratch (workspace(3), at most
//   64 MB) and multiplied by the bf16 GEMM (cuBLASLt).
#pragma once
#include "ops/kernel_policy.h"
#include "ops/linear_weight.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace ts::ops::cuda {

// x bf16 [M, K]; w f8_e4m3 [N, K] with w.quant; out bf16 or f32 [M, N] (strided rows allowed);
// bias bf16 [N] or null.
void quant_linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias = nullptr,
                  const KernelPolicy& policy = {});
// The kernels, for tests and the lab: gemv (CUDA cores, M <= 16), mma (tensor cores, M <= 64,
// k blocks >= 64), tiles (dequantize + cuBLASLt); one that does not apply falls back to tiles.
// fp8gemm: W8A8 — activations quantized per token and 128 channels, then the block-scaled FP8
// GEMM (cuBLASLt; 128x128 weight blocks of a checkpoint that declares dynamic FP8 activations,
// K % 128 == 0, bf16 out); automatic from kFp8GemmAutoM rows (quant_linear.cu).
// tc: the tensor-core decode GEMV (quant_decode_gemv below, store epilogue; M <= 8, bf16 out; FP8
// and NVFP4).
enum class QuantKernel { automatic, gemv, mma, tiles, fp8gemm, tc };
void quant_linear_kernel(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias, QuantKernel kernel);
// The decode fusions over FP8 and NVFP4 weights kept as stored (ops::rmsnorm_linear,
// linear_silu_mul, linear_add; fused.cu): one tensor-core W8A16 / W4A16 GEMV launch
// (quant_linear.cu), also QuantKernel::tc, with
//  store:    out [M, N] = bf16(acc + bias);
//  silu_mul: w [2N, K] (gate rows then up rows), out [M, N] = bf16(silu(bf16(gate)) * bf16(up));
//  add_into: out [M, N] = bf16(out + bf16(acc)) (the residual add);
// where acc = x @ W^T, x first RMS-normalised (times *norm_w, eps) when norm_w is given.
enum class DecodeEpilogue { store, silu_mul, add_into };
// Whether quant_decode_gemv takes x [M, K] (bf16, 1 <= M <= 8, 16-byte aligned rows) times w: FP8
// with k blocks of >= 64 (block-128, per-channel, per-tensor; not MXFP8) or NVFP4, K % 64 == 0;
// with the norm prologue also M * K * 2 bytes <= 48 KB (shared memory).
bool quant_decode_applies(const Tensor& x, const LinearWeight& w, bool norm);
// Whether QuantKernel::automatic and the decode fusions take it: wherever it applies, except
// NVFP4 at one row, which keeps the CUDA-core W4A16 GEMV (as fast per layer, faster end to end on
// the H200; quant_linear.cu).
bool quant_decode_automatic(const Tensor& x, const LinearWeight& w, bool norm);
void quant_decode_gemv(const Tensor& x, const LinearWeight& w, const Tensor* norm_w, float eps, DecodeEpilogue epi,
                     Tensor& out, const Tensor* bias = nullptr);
// Whether the fp8gemm kernel applies to w (weight-side conditions; M and the device's cuBLASLt
// decide at the call, falling back to tiles).
bool fp8_gemm_applies(const LinearWeight& w);
// Whether QuantKernel::automatic picks fp8gemm (W8A8) for weights it applies to: on. It was off
// after verify-golden llama3_fp8 --device cuda gave logit diffs of 6.09 with it on: cuBLASLt read
// a scale grid of fewer than 4 k blocks (K = 256) misaligned (CudaFp8Gemm.ScaleGridOfFewerThanFour
// KBlocks), so fp8_gemm_applies refuses K % 512 != 0. The in-model check is
// CudaW8A8Model.PrefillWithinTheSimulatedW8A8Error: a random FP8 checkpoint with K % 512 == 0 on
// CUDA against the CPU, exact and loaded with simulate_w8a8 (the rule: within 1.5x the
// simulated W8A8 error).
bool fp8_gemm_automatic();
// The activation side of fp8gemm, for tests and the lab: x bf16 [M, K] (K % 128 == 0, rows 8-byte
// aligned) -> q u8 [M, K] e4m3 codes (contiguous) and f32 scales at scale[kb * scale_ld + m]
// (token-major) or scale[m * K/128 + kb] (k_major); bit-equal to ops::cpu::quantize_act_fp8.
void quantize_act_fp8(const Tensor& x, Tensor& q, float* scale, int64_t scale_ld, bool k_major);
// The scale orders fp8gemm passes to ops::cuda::fp8_block_matmul (cuda_ops.h).
Fp8ScaleOrder fp8_scale_order();
// Allocates the prefill path's scratch (workspace(3)) now (the loader calls it), not during a graph
// capture: at least `bytes` (the routed experts' dequantized chunk, expert_chunk below).
void reserve_quant_scratch(size_t bytes = 0);
// Experts per chunk when moe_experts dequantizes stored experts of per_expert bf16 bytes for
// prefill (a 1 GB budget, at least one expert; at most `experts`). Every chunk's GEMM launch
// covers the whole sort's work items (those of other chunks exit at once), so fewer, larger
// chunks cost less.
int64_t expert_chunk(int64_t experts, size_t per_expert);
// reserve_quant_scratch for any expert_chunk of `experts` experts of at most per_expert bf16 bytes.
void reserve_expert_scratch(int64_t experts, size_t per_expert);
// Rows [row0, row0 + rows) of w dequantized into out bf16 [rows, K] (contiguous, on the GPU).
// group_offsets (device, optional): rows come in groups of group_rows (experts: rows n of group
// n / group_rows) and a group g with group_offsets[g + 1] == group_offsets[g] (no tokens routed
// to it) is skipped, its rows of out left as they were.
void dequantize_rows(const LinearWeight& w, int64_t row0, int64_t rows, Tensor& out,
                     const int32_t* group_offsets = nullptr, int64_t group_rows = 0);

// ops::moe_experts over routed experts kept as stored (ops/moe_experts.h; src/ops/cuda/moe.cu):
// x bf16 [T, H], ids i32 / weights f32 [T, k], gate_up [E, 2I, H] and down [E, H, I] both FP8 or
// both NVFP4, out bf16 [T, H]. policy.linear: gemv forces the grouped GEMV over the stored bytes
// (decode), cublaslt the dequantized chunks + bf16 grouped GEMM (prefill); auto picks by the
// expected rows per active expert.
void moe_experts_stored(const Tensor& x, const Tensor& ids, const Tensor& weights, const LinearWeight& gate_up,
                        const LinearWeight& down, const GluAct& act, Tensor& out, const KernelPolicy& policy = {});

}  // namespace ts::ops::cuda
