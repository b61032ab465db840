// How a quantized weight's scales follow its shard. A linear's weight W [N, K] (HF layout: N
// output rows, K input columns) is sharded by rows (column-parallel: q/k/v, gate/up, experts'
// gate_up) or by columns (row-parallel: o_proj, down_proj); its scales must be sliced so that
// every rank dequantizes its slice exactly as the whole weight would be:
//   per_tensor   scalar (weight_scale, weight_scale_2, input_scale)      -> replicated
//   per_channel  [N, 1] (compressed-tensors channel)                    -> rows follow W's rows;
//                                                                          column shards keep all
//   block        [ceil(N/bn), ceil(K/bk)] (DeepSeek/Qwen FP8, 128x128)  -> the blocks W's slice
//                                                                          covers
//   group_k      [N, K/g] (NVFP4 g = 16 e4m3 scales, MXFP8 g = 32 UE8M0) -> rows follow; columns
//                                                                          K/g per group
// A shard boundary inside a scale block (or a K group) would leave two ranks sharing a block
// whose kernel grid starts at the shard's first row: that is rejected with an error naming the
// tensor, the boundary and the block size — unless the caller allows split blocks (the CPU
// backend, which dequantizes at load: then `phase` says where the slice starts inside its
// first block, and the scale rows/cols include the shared blocks). Packed FP4 weights
// (U8 [N, K/2], two e2m1 codes per byte) also get their byte-column range.
//
// For fused projections (q|k|v, gate|up) shard each source tensor separately with these rules
// and stack the results in the same order as the weights.
#pragma once
#include <cstdint>
#include <string>

#include "parallel/mapping.h"

namespace ts::parallel {

enum class ScaleLayout : uint8_t { none, per_tensor, per_channel, block, group_k };

struct ScaleSpec {
  ScaleLayout layout = ScaleLayout::none;
  int64_t block_n = 128, block_k = 128;  // block: weight_block_size [bn, bk]
  int64_t group = 16;                    // group_k: elements of K per scale (NVFP4 16, MXFP8 32)
  bool packed_fp4 = false;               // weight bytes hold two K elements (NVFP4)
};

struct QuantShard {
  Range rows, cols;             // the weight's slice, in elements of W [N, K]
  Range scale_rows, scale_cols;  // the scale tensor's slice (empty ranges for none/per_tensor)
  int64_t row_phase = 0, col_phase = 0;  // offset of the slice inside its first block (split blocks)
  bool scale_replicated = false;         // per_tensor: every rank loads the whole scalar
  Range packed_cols;                     // packed_fp4: byte columns of the stored weight
};

// Slice `rows` x `cols` of W [N, K] under `spec`. `name` names the tensor in errors.
QuantShard shard_quantized(const ScaleSpec& spec, int64_t N, int64_t K, Range rows, Range cols, const std::string& name,
                           bool allow_split_blocks = false);
// Shorthands: column-parallel (rows sharded, all columns) and row-parallel (columns sharded).
QuantShard shard_quantized_rows(const ScaleSpec& spec, int64_t N, int64_t K, Range rows, const std::string& name,
                                bool allow_split_blocks = false);
QuantShard shard_quantized_cols(const ScaleSpec& spec, int64_t N, int64_t K, Range cols, const std::string& name,
                                bool allow_split_blocks = false);

}  // namespace ts::parallel
