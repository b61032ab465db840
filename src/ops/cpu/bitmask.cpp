// Structured outputs: the token bitmask applied to logits rows (the oracle of the CUDA kernel).
#include <cmath>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

void apply_token_bitmask(Tensor& logits, const Tensor& bitmask) {
  const int64_t B = logits.size(0), V = logits.size(1), W = bitmask.size(1);
  for (int64_t b = 0; b < B; ++b) {
    float* l = logits.ptr<float>() + b * logits.row_stride();
    const uint32_t* m = bitmask.ptr<uint32_t>() + b * W;
    for (int64_t i = 0; i < V; ++i)
      if (!((m[i >> 5] >> (i & 31)) & 1u)) l[i] = -INFINITY;
  }
}

}  // namespace ts::ops::cpu
