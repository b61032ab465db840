// The mapping table: how the flags resolve for every rank, which combinations are errors (and
// that the errors say why), and the shard arithmetic of every layer kind.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "parallel/mapping.h"

using namespace ts;
using namespace ts::parallel;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ParallelOptions opts(int tp, int dp = 1, int ep = 1) {
  ParallelOptions o;
  o.tp_size = tp;
  o.dp_size = dp;
  o.ep_size = ep;
  return o;
}

}  // namespace

TEST(Mapping, AttnTp4MoeEp4) {
  // The seed's flagship: --attn-tp-size 4 --ep-size 4 on 4 GPUs.
  ParallelOptions o;
  o.attn_tp_size = 4;
  o.ep_size = 4;
  for (int r = 0; r < 4; ++r) {
    Mapping m = Mapping::resolve(o, r);
    EXPECT_EQ(m.world, 4);
    EXPECT_EQ(m.attn_tp, 4);
    EXPECT_EQ(m.attn_tp_rank, r);
    EXPECT_EQ(m.attn_dp, 1);
    EXPECT_EQ(m.dense_tp, 4);
    EXPECT_EQ(m.moe_ep, 4);
    EXPECT_EQ(m.moe_tp, 1);
    EXPECT_EQ(m.moe_ep_rank, r);
    EXPECT_EQ(m.tp_size, 4);  // the attention view the existing callers read
    EXPECT_TRUE(m.moe_tokens_replicated());  // EP inside the attention group: all-reduce, no all-to-all
  }
  // Same with --tp-size, and with --enable-expert-parallel.
  ParallelOptions p = opts(4);
  p.enable_expert_parallel = true;
  EXPECT_EQ(Mapping::resolve(p, 2).moe_ep, 4);
  EXPECT_EQ(Mapping::resolve(opts(4, 1, 4), 3).moe_ep_rank, 3);
}

TEST(Mapping, DefaultsAttnTp4MoeTp4) {
  Mapping m = Mapping::resolve(opts(4), 1);
  EXPECT_EQ(m.moe_tp, 4);
  EXPECT_EQ(m.moe_ep, 1);
  EXPECT_EQ(m.moe_tp_rank, 1);
  EXPECT_EQ(m.dense_tp_rank, 1);
}

TEST(Mapping, AttentionDataParallelForMla) {
  // DeepSeek-style: attention DP 4 (attention TP 1), experts over all 4 ranks.
  ParallelOptions o = opts(1, 4, 4);
  std::set<int> ep_ranks;
  for (int r = 0; r < 4; ++r) {
    Mapping m = Mapping::resolve(o, r);
    EXPECT_EQ(m.world, 4);
    EXPECT_EQ(m.attn_tp, 1);
    EXPECT_EQ(m.attn_dp_rank, r);
    EXPECT_EQ(m.dense_tp, 1);  // dense layers follow attention: no communication
    EXPECT_FALSE(m.moe_tokens_replicated());  // tokens differ per rank: all-to-all dispatch
    ep_ranks.insert(m.moe_ep_rank);
  }
  EXPECT_EQ(ep_ranks.size(), 4u);
  // attention TP 2 x DP 2 with EP 4: groups {0,1} and {2,3}.
  Mapping m = Mapping::resolve(opts(2, 2, 4), 3);
  EXPECT_EQ(m.attn_tp_rank, 1);
  EXPECT_EQ(m.attn_dp_rank, 1);
  EXPECT_EQ(m.attn_tp_color(), 1);
  EXPECT_EQ(m.moe_ep_rank, 3);
  EXPECT_FALSE(m.moe_tokens_replicated());
  // EP 2 inside attention TP 4 x DP 2: each EP pair lies inside an attention group.
  Mapping n = Mapping::resolve(opts(4, 2, 2), 5);
  EXPECT_EQ(n.moe_ep, 2);
  EXPECT_EQ(n.moe_dp, 4);
  EXPECT_EQ(n.moe_ep_rank, 1);
  EXPECT_TRUE(n.moe_tokens_replicated());
}

TEST(Mapping, DenseTpAndNodes) {
  ParallelOptions o = opts(4, 2);
  o.dense_tp_size = 8;
  o.nnodes = 2;
  o.node_rank = 1;
  Mapping m = Mapping::resolve(o, 6);
  EXPECT_EQ(m.dense_tp, 8);
  EXPECT_EQ(m.dense_tp_rank, 6);
  EXPECT_FALSE(m.dense_tokens_replicated());
  EXPECT_EQ(m.ranks_per_node, 4);
  EXPECT_EQ(m.node_rank(), 1);
  EXPECT_EQ(m.local_rank(), 2);
  o.dense_tp_size = 1;
  EXPECT_TRUE(Mapping::resolve(o, 0).dense_tokens_replicated());
}

TEST(Mapping, InvalidCombinationsSayWhy) {
  ParallelOptions both = opts(4);
  both.moe_tp_size = 2;
  both.ep_size = 2;
  EXPECT_NE(error_of([&] { Mapping::resolve(both, 0); }).find("cannot both be > 1"), std::string::npos);
  EXPECT_NE(error_of([&] { Mapping::resolve(opts(4, 1, 3), 0); }).find("--ep-size 3 does not divide the world size 4"),
            std::string::npos);
  ParallelOptions nodes = opts(3, 2);
  nodes.nnodes = 4;
  EXPECT_NE(error_of([&] { Mapping::resolve(nodes, 0); }).find("does not split evenly over --nnodes 4"),
            std::string::npos);
  ParallelOptions alias = opts(2);
  alias.attn_tp_size = 4;
  EXPECT_NE(error_of([&] { Mapping::resolve(alias, 0); }).find("disagree"), std::string::npos);
  ParallelOptions dense = opts(4, 3);
  dense.dense_tp_size = 6;
  EXPECT_NE(error_of([&] { Mapping::resolve(dense, 0); }).find("do not nest"), std::string::npos);
  ParallelOptions epx = opts(4);
  epx.ep_size = 2;
  epx.enable_expert_parallel = true;
  EXPECT_NE(error_of([&] { Mapping::resolve(epx, 0); }).find("--enable-expert-parallel"), std::string::npos);
  EXPECT_THROW(Mapping::resolve(opts(2), 2), Error);  // rank outside the world
  EXPECT_THROW(Mapping::resolve(opts(0), 0), Error);
  ParallelOptions mt = opts(4);
  mt.moe_tp_size = 3;
  EXPECT_THROW(Mapping::resolve(mt, 0), Error);
}

TEST(Mapping, ModelShapesThatDoNotDivideAreErrors) {
  Mapping tp4 = Mapping::resolve(opts(4), 0);
  ModelShape s;
  s.name = "cfg.json";
  s.heads = 6;
  s.kv_heads = 2;
  EXPECT_NE(error_of([&] { check_model_fits(tp4, s); }).find("num_attention_heads 6 is not divisible"), std::string::npos);
  s.heads = 12;
  s.kv_heads = 3;
  EXPECT_NE(error_of([&] { check_model_fits(tp4, s); }).find("num_key_value_heads 3"), std::string::npos);
  s.kv_heads = 2;  // replicated KV heads: fine
  EXPECT_EQ(error_of([&] { check_model_fits(tp4, s); }), "");
  s.experts = 6;
  s.moe_inter = 64;
  Mapping ep4 = Mapping::resolve(opts(4, 1, 4), 0);
  EXPECT_NE(error_of([&] { check_model_fits(ep4, s); }).find("6 experts are not divisible by --ep-size 4"),
            std::string::npos);
  s.experts = 8;
  s.moe_inter = 30;  // MoE TP 4 (default) cannot split 30
  EXPECT_NE(error_of([&] { check_model_fits(tp4, s); }).find("moe_intermediate_size 30"), std::string::npos);
  EXPECT_EQ(error_of([&] { check_model_fits(ep4, s); }), "");  // EP keeps experts whole
  ModelShape dense;
  dense.name = "d";
  dense.heads = 8;
  dense.kv_heads = 8;
  dense.dense_inter = 102;
  EXPECT_NE(error_of([&] { check_model_fits(tp4, dense); }).find("intermediate_size 102"), std::string::npos);
  dense.dense_inter = 128;
  EXPECT_NE(error_of([&] { check_model_fits(ep4, dense); }).find("needs a mixture-of-experts model"), std::string::npos);
  ModelShape m3;
  m3.name = "m3";
  m3.heads = 8;
  m3.kv_heads = 4;
  m3.index_heads = 3;
  EXPECT_NE(error_of([&] { check_model_fits(tp4, m3); }).find("index_n_heads 3"), std::string::npos);
  ModelShape mla;
  mla.name = "dsv3";
  mla.heads = 16;
  mla.mla = true;
  EXPECT_EQ(error_of([&] { check_model_fits(tp4, mla); }), "");
  ModelShape gdn;
  gdn.name = "q35";
  gdn.heads = 8;
  gdn.kv_heads = 2;
  gdn.linear_k_heads = 2;
  gdn.linear_v_heads = 6;
  EXPECT_NE(error_of([&] { check_model_fits(tp4, gdn); }).find("linear_num_value_heads 6"), std::string::npos);
}

TEST(Sharding, FusedQkvAndGateUp) {
  // 8 q / 2 kv heads of 16 over 4 ranks: kv replicated, rank 3 reads kv head 1.
  QkvShard s = shard_qkv(8, 2, 16, 4, 3);
  EXPECT_EQ(s.q, (Range{96, 32}));
  EXPECT_EQ(s.k, (Range{16, 16}));
  EXPECT_EQ(s.v, (Range{16, 16}));
  QkvShard f = shard_fused_qkv(8, 2, 16, 4, 3);
  EXPECT_EQ(f.q, (Range{96, 32}));
  EXPECT_EQ(f.k, (Range{128 + 16, 16}));
  EXPECT_EQ(f.v, (Range{128 + 32 + 16, 16}));
  GateUpShard g = shard_gate_up(768, 4, 1);
  EXPECT_EQ(g.gate, (Range{192, 192}));
  EXPECT_EQ(g.up, (Range{768 + 192, 192}));
}

TEST(Sharding, ExpertsMlaIndexerLinearAttention) {
  EXPECT_EQ(expert_range(256, 8, 3), (Range{96, 32}));
  EXPECT_EQ(expert_owner(95, 256, 8), 2);
  EXPECT_EQ(expert_owner(96, 256, 8), 3);
  EXPECT_THROW(expert_range(6, 4, 0), Error);
  // DeepSeek-V3 MLA: 128 heads, nope 128, rope 64, v 128 over 8.
  MlaShard m = shard_mla(128, 128, 64, 128, 8, 2);
  EXPECT_EQ(m.heads, (Range{32, 16}));
  EXPECT_EQ(m.q_rows, (Range{32 * 192, 16 * 192}));
  EXPECT_EQ(m.kv_b_rows, (Range{32 * 256, 16 * 256}));
  EXPECT_EQ(m.o_cols, (Range{32 * 128, 16 * 128}));
  // M3 indexer: 8 q heads, 4 index heads of 32: over 2 -> 2 each; over 8 -> replicated.
  IndexerShard a = shard_indexer(8, 4, 32, 2, 1);
  EXPECT_EQ(a.heads, (Range{2, 2}));
  EXPECT_EQ(a.q_rows, (Range{64, 64}));
  EXPECT_FALSE(a.replicated);
  IndexerShard b = shard_indexer(8, 4, 32, 8, 5);
  EXPECT_EQ(b.heads, (Range{2, 1}));
  EXPECT_TRUE(b.replicated);
  // Qwen3.5 GDN: 2 key heads (dk 4), 6 value heads (dv 8) over 2.
  LinearAttnShard l = shard_linear_attn(2, 6, 4, 8, 2, 1);
  EXPECT_EQ(l.k_heads, (Range{1, 1}));
  EXPECT_EQ(l.v_heads, (Range{3, 3}));
  EXPECT_EQ(l.q_rows, (Range{4, 4}));
  EXPECT_EQ(l.k_rows, (Range{8 + 4, 4}));
  EXPECT_EQ(l.v_rows, (Range{16 + 24, 24}));
  EXPECT_EQ(l.z_rows, (Range{24, 24}));
}

TEST(Sharding, TokenSlicesCoverEveryTokenOnce) {
  for (int64_t T : {0, 1, 5, 8, 13})
    for (int tp : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int r = 0; r < tp; ++r) {
        Range s = token_slice(T, tp, r);
        EXPECT_EQ(s.start, next);
        next = s.end();
        EXPECT_LE(s.count, T / tp + 1);
      }
      EXPECT_EQ(next, T);
    }
}
