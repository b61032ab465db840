// `tokenspeed bench --attention-lab`: the split-KV decode attention kernel at Llama-3.1-8B's
// attention shapes (32 q heads, 8 KV heads, head dim 128, paged blocks of 64) per (batch,
// context): the default split count (one wave for this batch) next to the batch-invariant
// splits (each sequence cut by its own length: ops::cuda::SplitKvOptions, ops/cuda/split_kv.h),
// with the copy ceiling of the same run. Reported: us per call, GB/s of the K/V bytes read, % of
// copy, and each variant's relative difference from the default's output. KV caches rotate
// through enough copies to miss the L2, as a model's layers do.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace ts::bench {

struct AttentionLabOptions {
  std::vector<std::pair<int, int>> cases{{1, 1024}, {1, 8192}, {1, 32768}, {8, 32768}, {16, 32768},
                                         {64, 1024}, {64, 8192}};  // (batch, context)
  int iters = 20;
  size_t copy_bytes = size_t(1) << 30;
};

// Markdown table (CUDA builds only; otherwise an error).
std::string run_attention_lab(const AttentionLabOptions& o);

}  // namespace ts::bench
