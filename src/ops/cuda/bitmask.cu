// Structured outputs: the token bitmask applied to device logits before sampling.
// logits [B, V] f32 (row stride ld), bitmask [B, W = ceil(V/32)] u32: one thread per 32-id word,
// so each thread reads one mask word and writes at most 32 logits. Grid (ceil(W/256), B); fixed
// shapes and no host sync, so a decode graph can capture it reading a persistent mask buffer
// that the host refreshes before each replay.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {
constexpr int kThreads = 256;

__global__ void bitmask_kernel(float* logits, int64_t ld, const uint32_t* mask, int64_t V, int64_t W) {
  const int64_t b = blockIdx.y;
  const int64_t w = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (w >= W) return;
  const uint32_t bits = mask[b * W + w];
  if (bits == 0xffffffffu) return;  // all allowed: the common case for rows without a grammar
  float* row = logits + b * ld;
  const int64_t base = w * 32;
  for (int k = 0; k < 32 && base + k < V; ++k)
    if (!((bits >> k) & 1u)) row[base + k] = -INFINITY;
}
}  // namespace

void apply_token_bitmask(Tensor& logits, const Tensor& bitmask) {
  const int64_t B = logits.size(0), V = logits.size(1), W = bitmask.size(1);
  if (B == 0 || V == 0) return;
  launch(bitmask_kernel, dim3(unsigned((W + kThreads - 1) / kThreads), unsigned(B)), dim3(kThreads), 0, false,
         logits.ptr<float>(), logits.row_stride(), bitmask.ptr<uint32_t>(), V, W);
}

}  // namespace ts::ops::cuda
