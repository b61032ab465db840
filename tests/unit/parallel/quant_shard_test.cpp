// Scales follow the weight's shard: block-128 FP8 [ceil(N/128), ceil(K/128)], per-channel [N, 1],
// NVFP4 [N, K/16] group scales with packed bytes, per-tensor scalars; shards that split a block
// are rejected naming the tensor, unless split blocks are allowed (CPU dequantization).
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/quant_shard.h"

using namespace ts;
using namespace ts::parallel;

namespace {
ScaleSpec block128() {
  ScaleSpec s;
  s.layout = ScaleLayout::block;
  return s;
}
}  // namespace

TEST(QuantShard, Block128RowsAndColumns) {
  // Llama-3-8B gate_proj [14336, 4096] over 4: 3584 rows = 28 blocks each.
  QuantShard q = shard_quantized_rows(block128(), 14336, 4096, {3584 * 2, 3584}, "mlp.gate_proj.weight");
  EXPECT_EQ(q.scale_rows, (Range{56, 28}));
  EXPECT_EQ(q.scale_cols, (Range{0, 32}));
  EXPECT_EQ(q.row_phase, 0);
  // down_proj [4096, 14336] column shard.
  QuantShard d = shard_quantized_cols(block128(), 4096, 14336, {3584 * 3, 3584}, "mlp.down_proj.weight");
  EXPECT_EQ(d.scale_rows, (Range{0, 32}));
  EXPECT_EQ(d.scale_cols, (Range{84, 28}));
  // A partial edge block: DeepSeek's kv_a_proj 576 rows -> 5 scale rows; the whole tensor is fine,
  // and a shard ending at N keeps the partial block.
  EXPECT_EQ(shard_quantized_rows(block128(), 576, 7168, {0, 576}, "kv_a").scale_rows, (Range{0, 5}));
  EXPECT_EQ(shard_quantized_rows(block128(), 576, 7168, {512, 64}, "kv_a").scale_rows, (Range{4, 1}));
}

TEST(QuantShard, SplitBlocksAreRejectedUnlessAllowed) {
  // MoE intermediate 768 over 8 ranks: 96 rows per rank splits the 128-row blocks.
  try {
    shard_quantized_rows(block128(), 768, 2048, {96, 96}, "model.layers.3.mlp.experts.0.gate_proj.weight");
    FAIL() << "a split block was accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("experts.0.gate_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("splits the 128-wide scale block 0 at 96"), std::string::npos) << m;
  }
  // Allowed (CPU dequantizes at load): the shared blocks, and where the slice starts in them.
  QuantShard q = shard_quantized_rows(block128(), 768, 2048, {96, 96}, "w", true);
  EXPECT_EQ(q.scale_rows, (Range{0, 2}));
  EXPECT_EQ(q.row_phase, 96);
  // KV heads of 64 rows replicated over ranks split blocks too.
  EXPECT_THROW(shard_quantized_rows(block128(), 512, 4096, {64, 64}, "k_proj"), Error);
  // A checkpoint with 64-wide blocks allows it.
  ScaleSpec b64 = block128();
  b64.block_n = b64.block_k = 64;
  EXPECT_EQ(shard_quantized_rows(b64, 512, 4096, {64, 64}, "k_proj").scale_rows, (Range{1, 1}));
}

TEST(QuantShard, PerChannelAndPerTensor) {
  ScaleSpec ch;
  ch.layout = ScaleLayout::per_channel;
  QuantShard r = shard_quantized_rows(ch, 4096, 4096, {1024, 1024}, "q_proj");
  EXPECT_EQ(r.scale_rows, (Range{1024, 1024}));
  EXPECT_EQ(r.scale_cols, (Range{0, 1}));
  QuantShard c = shard_quantized_cols(ch, 4096, 4096, {1024, 1024}, "o_proj");
  EXPECT_EQ(c.scale_rows, (Range{0, 4096}));  // every output row keeps its multiplier
  ScaleSpec t;
  t.layout = ScaleLayout::per_tensor;
  EXPECT_TRUE(shard_quantized_cols(t, 4096, 4096, {0, 2048}, "o_proj").scale_replicated);
  // Per-channel rows may split anywhere.
  EXPECT_EQ(shard_quantized_rows(ch, 100, 64, {33, 17}, "x").scale_rows, (Range{33, 17}));
}

TEST(QuantShard, Nvfp4GroupScalesAndPackedBytes) {
  ScaleSpec fp4;
  fp4.layout = ScaleLayout::group_k;
  fp4.group = 16;
  fp4.packed_fp4 = true;
  // down_proj [2048, 768] over 4: 192 columns = 12 groups, 96 bytes.
  QuantShard q = shard_quantized_cols(fp4, 2048, 768, {192, 192}, "down_proj");
  EXPECT_EQ(q.scale_rows, (Range{0, 2048}));
  EXPECT_EQ(q.scale_cols, (Range{12, 12}));
  EXPECT_EQ(q.packed_cols, (Range{96, 96}));
  // Rows: scales [N, K/16] follow.
  QuantShard r = shard_quantized_rows(fp4, 2048, 768, {512, 512}, "gate_proj");
  EXPECT_EQ(r.scale_rows, (Range{512, 512}));
  EXPECT_EQ(r.scale_cols, (Range{0, 48}));
  EXPECT_EQ(r.packed_cols, (Range{0, 384}));
  // A column shard inside a group is never allowed (even on the CPU).
  EXPECT_THROW(shard_quantized_cols(fp4, 2048, 768, {8, 16}, "down_proj", true), Error);
  // MXFP8: groups of 32.
  ScaleSpec mx;
  mx.layout = ScaleLayout::group_k;
  mx.group = 32;
  EXPECT_EQ(shard_quantized_cols(mx, 64, 256, {128, 128}, "o").scale_cols, (Range{4, 4}));
  EXPECT_THROW(shard_quantized_cols(mx, 64, 256, {16, 128}, "o"), Error);
}

TEST(QuantShard, OutOfRangeShardsAreErrors) {
  EXPECT_THROW(shard_quantized_rows(block128(), 256, 256, {200, 100}, "w"), Error);
}
