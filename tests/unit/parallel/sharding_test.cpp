// Sharding arithmetic of tensor parallelism (CPU only): which rows / columns / heads / vocab
// rows each rank loads, KV-head replication, and the EAGLE3 draft's embedding resolution.
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/eagle3_draft.h"
#include "parallel/mapping.h"

using namespace ts;
using namespace ts::parallel;

TEST(Mapping, SizesFollowTp) {
  Mapping m = Mapping::make(4, 2, 1);
  EXPECT_EQ(m.attn_tp, 4);
  EXPECT_EQ(m.dense_tp, 4);
  EXPECT_EQ(m.moe_ep, 1);
  EXPECT_TRUE(m.parallel());
  EXPECT_FALSE(Mapping::make(1, 0).parallel());
  EXPECT_THROW(Mapping::make(2, 2), Error);
  EXPECT_THROW(Mapping::make(0, 0), Error);
}

TEST(Sharding, EvenRowsAndColumns) {
  // MLP: intermediate 11008 over 2 ranks -> gate/up rows and down columns [5504 r, 5504 (r+1)).
  EXPECT_EQ(even_shard(11008, 2, 0, "i"), (Range{0, 5504}));
  EXPECT_EQ(even_shard(11008, 2, 1, "i"), (Range{5504, 5504}));
  EXPECT_EQ(even_shard(7, 1, 0, "i"), (Range{0, 7}));
  try {
    even_shard(10, 4, 0, "intermediate_size");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size"), std::string::npos);
  }
}

TEST(Sharding, HeadsSplitWithGqa) {
  // pycoder: 6 heads, 2 kv heads, tp 2: 3 q heads + 1 kv head per rank.
  HeadShard a = shard_heads(6, 2, 2, 0), b = shard_heads(6, 2, 2, 1);
  EXPECT_EQ(a.q, (Range{0, 3}));
  EXPECT_EQ(a.kv, (Range{0, 1}));
  EXPECT_EQ(b.q, (Range{3, 3}));
  EXPECT_EQ(b.kv, (Range{1, 1}));
  EXPECT_FALSE(a.kv_replicated);
  // Llama-3-8B: 32 / 8 over 4.
  HeadShard c = shard_heads(32, 8, 4, 3);
  EXPECT_EQ(c.q, (Range{24, 8}));
  EXPECT_EQ(c.kv, (Range{6, 2}));
}

TEST(Sharding, KvHeadsReplicatedWhenTpExceedsThem) {
  // 8 q heads, 2 kv heads over 4 ranks: each rank keeps one kv head, ranks {0,1} head 0,
  // ranks {2,3} head 1; rank r's q heads [2r, 2r+2) all read that head (group 4).
  for (int r = 0; r < 4; ++r) {
    HeadShard s = shard_heads(8, 2, 4, r);
    EXPECT_EQ(s.q, (Range{2 * r, 2}));
    EXPECT_EQ(s.kv, (Range{r / 2, 1}));
    EXPECT_TRUE(s.kv_replicated);
  }
  // MQA (1 kv head) over 2 ranks.
  EXPECT_EQ(shard_heads(4, 1, 2, 1).kv, (Range{0, 1}));
  // 3 kv heads cannot be replicated evenly over 4 ranks.
  EXPECT_THROW(shard_heads(12, 3, 4, 0), Error);
  // 6 q heads do not split over 4 ranks.
  EXPECT_THROW(shard_heads(6, 2, 4, 0), Error);
}

TEST(Sharding, VocabRanges) {
  // 32000 over 2: [0,16000) and [16000,32000).
  VocabShard a = shard_vocab(32000, 2, 0), b = shard_vocab(32000, 2, 1);
  EXPECT_EQ(a.start, 0);
  EXPECT_EQ(a.count, 16000);
  EXPECT_EQ(b.start, 16000);
  EXPECT_EQ(b.count, 16000);
  EXPECT_EQ(a.padded, 16000);
  // Uneven: 10 over 4 -> padded 3: [0,3) [3,6) [6,9) [9,10).
  int64_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    VocabShard v = shard_vocab(10, 4, r);
    EXPECT_EQ(v.padded, 3);
    EXPECT_EQ(v.start, covered);
    EXPECT_LE(v.count, v.padded);
    covered += v.count;
  }
  EXPECT_EQ(covered, 10);
  EXPECT_EQ(shard_vocab(10, 4, 3).count, 1);
  // Replicated: the whole table.
  VocabShard f = shard_vocab(128256, 1, 0);
  EXPECT_EQ(f.count, 128256);
  // Memory: Llama-3 table (128256 x 4096 bf16) replicated vs sharded over 2.
  EXPECT_EQ(embed_bytes_per_gpu(128256, 4096, 1, 2), int64_t(128256) * 4096 * 2);
  EXPECT_EQ(embed_bytes_per_gpu(128256, 4096, 2, 2), int64_t(64128) * 4096 * 2);
}

TEST(DraftEmbed, SharesReplicatedRebuildsShardedRejectsOthers) {
  using models::DraftEmbed;
  EXPECT_EQ(models::resolve_draft_embed(1000, 64, 1000, 64, 1), DraftEmbed::share);
  EXPECT_EQ(models::resolve_draft_embed(1000, 64, 1000, 64, 2), DraftEmbed::share);  // replicated target under TP
  EXPECT_EQ(models::resolve_draft_embed(500, 64, 1000, 64, 2), DraftEmbed::rebuild);  // vocab-parallel target
  try {
    models::resolve_draft_embed(333, 64, 1000, 64, 2);  // a fake shape that matches neither
    FAIL() << "a mismatched shape must raise";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[333, 64]"), std::string::npos) << m;
    EXPECT_NE(m.find("[1000, 64] (replicated)"), std::string::npos) << m;
    EXPECT_NE(m.find("[500, 64] (vocab-parallel"), std::string::npos) << m;
  }
  EXPECT_THROW(models::resolve_draft_embed(1000, 32, 1000, 64, 1), Error);  // hidden mismatch
}
