// Greedy decode head (#22): ids[m] = argmax_v of the f32 logits rmsnorm(x[m]) * norm_w @ head^T
// (x itself when norm_w is null), ties to the lowest id as argmax_rows and the sampler. On CUDA
// one GEMV launch (ops/cuda/fused.cu) that never writes the [M, vocab] logits: per-block maxima,
// one atomicMax per block into scratch, the grid's last block writes the ids and zeroes the
// scratch again (graph-safe). x [M, K] bf16; head [V, K]; ids i32 [>= M]; scratch i64
// [>= kLmArgmaxScratch], zeroed once by its owner.
// Only where lm_head_argmax_fusable says so: CUDA, 1-2 rows (where linear's GEMV serves the LM
// head; cuBLASLt is faster beyond), K % 8 == 0, the norm fitting the prologue. Never on the CPU,
// whose engine keeps logits + sample; the CPU version is the tests' reference.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace ts::ops {

constexpr int64_t kLmArgmaxScratch = 4;
bool lm_head_argmax_fusable(const Tensor& x, const Tensor* norm_w, const Tensor& head);
void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor& scratch);

namespace cpu {
void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor& scratch);
}
namespace cuda {
bool lm_head_argmax_fusable(const Tensor& x, const Tensor* norm_w, const Tensor& head);
void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor& scratch);
}  // namespace cuda

}  // namespace ts::ops
