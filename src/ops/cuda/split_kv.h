// Batch-invariant split-KV decode attention (#22; the deterministic mode's need): with
// target > 0 the split-KV decode kernel cuts each sequence's KV by its own length — tiles of 64
// tokens per split = max(min_tiles, ceil(tiles / target)), at most `target` splits — never by
// the batch, and merges its partials in a fixed order, so a sequence's output rows are
// bit-identical alone, in any batch, and under any max_kv_len bound (CUDA graph buckets).
// target 0: the default split count (one wave of blocks for this batch: fastest at a given
// batch, but it changes with the batch). `tokenspeed bench --attention-lab` times both.
#pragma once
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {

struct SplitKvOptions {
  int target = 0;
  int min_tiles = 0;
  // The deterministic mode (`--enable-deterministic-inference`, LaunchConfig::batch_invariant;
  // target / min_tiles unused): every row, of any query length, through the split-KV kernel
  // with 16 rows per block and fixed 1024-token splits from token 0 folded in order by one
  // running merge (attention_v2.cuh, "uniform mode"; decode rows: a block per split, then the
  // merge kernel; longer queries: one block walks its splits): a row's output depends on its
  // own query, position and KV only -- not on the batch, the chunking of its prompt, a mixed
  // batch's decode/prefill split or the graph bucket. Its cost: prefill on a decode kernel, and
  // splits fixed by length rather than sized to fill the GPU. Needs the v2 head dims (64/128,
  // hd_v == hd).
  bool uniform = false;
};

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out, const KernelPolicy& policy, const SplitKvOptions& split, const KvScales& kvs = {},
                     int window = 0);

}  // namespace ts::ops::cuda
