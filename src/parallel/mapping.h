// Mapping: how one model is split over the ranks of a world (GPUs: one process per node, one
// thread per GPU; CPU: ranks as threads), and the sharding arithmetic every parallel layer uses.
// Plain C++ (CPU unit-tested).
//
// Rank layout (tensor parallelism innermost, as in the reference system): for a world of W ranks
//  - attention: attn_tp ranks per group, attn_dp = W / attn_tp groups of their own requests;
//    attn_tp_rank = rank % attn_tp, attn_dp_rank = rank / attn_tp. Tokens are replicated inside
//    an attention group (after each all-reduce) and differ between groups.
//  - dense MLP: dense_tp ranks per group, dense_tp_rank = rank % dense_tp.
//  - MoE: moe_tp x moe_ep x moe_dp = W; moe_tp_rank = rank % moe_tp, moe_ep_rank =
//    (rank / moe_tp) % moe_ep. MoE TP and EP are never both > 1.
// Every group is either inside one attention group (its tokens are the same on all its ranks:
// compute on a shard, then all-reduce — fusable into the next add + norm) or a union of whole
// attention groups (tokens differ: MoE EP dispatches them with all-to-all, TP gathers them).
//
// Sharding rules:
//  - attention: q heads split evenly; KV heads split evenly, or replicated when attn_tp >
//    num_kv_heads so that every rank holds exactly one KV head; fused q|k|v rows = this rank's
//    q rows, then its k rows, then its v rows;
//  - dense TP: column-parallel gate|up (this shard's gate rows then its up rows), row-parallel
//    o_proj / down_proj (columns split) followed by an all-reduce;
//  - vocab-parallel embedding / LM head: ranks own ceil(V / tp) rows each (the last shard is
//    zero-padded to that size so all-gathers are uniform); replicated: the whole table;
//  - MoE TP: every expert's intermediate dim split like a dense MLP; MoE EP: rank e owns the
//    contiguous experts [e * E / ep, (e + 1) * E / ep);
//  - MLA: q_b / kv_b rows and o_proj columns split by head; q_a, kv_a and their norms (the
//    latent path) replicated;
//  - MiniMax-M3 lightning indexer: index heads split like KV heads (replicated when fewer than
//    ranks), its single key head replicated;
//  - Gated DeltaNet (Qwen3.5): value heads split, key heads split or replicated like KV heads.
#pragma once
#include <cstdint>
#include <string>

#include "parallel/options.h"

namespace ts::parallel {

struct Mapping {
  // --- the attention view (existing callers): TP size / rank of the attention group ---
  int tp_size = 1, tp_rank = 0;
  int attn_tp = 1, dense_tp = 1, moe_ep = 1;
  // --- the whole mapping ---
  int world = 1, rank = 0;
  int attn_dp = 1, attn_tp_rank = 0, attn_dp_rank = 0;
  int dense_dp = 1, dense_tp_rank = 0;
  int moe_tp = 1, moe_dp = 1, moe_tp_rank = 0, moe_ep_rank = 0, moe_dp_rank = 0;
  int nnodes = 1, ranks_per_node = 1;

  // attn_tp = dense_tp = tp_size, moe_ep = ep_size, moe_tp = tp / ep (ep must be 1 or tp).
  static Mapping make(int tp_size, int tp_rank, int ep_size = 1);
  // Every rank's place from the flags; errors (naming the flags) when the sizes do not multiply
  // to the world size, do not divide it, or nest badly, or when MoE TP and EP are both > 1.
  static Mapping resolve(const ParallelOptions& o, int rank);
  bool parallel() const { return world > 1; }
  int node_rank() const { return rank / ranks_per_node; }
  int local_rank() const { return rank % ranks_per_node; }
  std::string str() const;

  // Comm::split colors of this rank's groups (keys: the rank in the group).
  int attn_tp_color() const { return attn_dp_rank; }
  int dense_tp_color() const { return rank / dense_tp; }
  int moe_tp_color() const { return rank / moe_tp; }
  int moe_ep_color() const { return moe_dp_rank * moe_tp + moe_tp_rank; }

  // The MoE group that shards a layer (EP when moe_ep > 1, else TP) lies inside one attention
  // group: its tokens are identical on its ranks (all-reduce); false: they differ (all-to-all
  // for EP, gather for TP).
  bool moe_tokens_replicated() const;
  bool dense_tokens_replicated() const { return dense_tp <= attn_tp; }
};

// What a model's shapes must divide; 0 / false: the model has no such part. Filled by each
// model file from its config (name = the config path, for messages).
struct ModelShape {
  std::string name;
  int64_t heads = 0, kv_heads = 0;  // attention (kv_heads 0 with mla)
  bool mla = false;                 // heads sharded, latent path replicated
  int64_t dense_inter = 0;          // dense MLP intermediate size
  int64_t experts = 0, moe_inter = 0, shared_inter = 0;
  int64_t index_heads = 0;                          // MiniMax-M3 lightning indexer
  int64_t linear_k_heads = 0, linear_v_heads = 0;  // Gated DeltaNet
};
// Throws, naming the config field and the flag, when `m` cannot shard `s`.
void check_model_fits(const Mapping& m, const ModelShape& s);

// A half-open range [start, start + count) of a dimension.
struct Range {
  int64_t start = 0, count = 0;
  int64_t end() const { return start + count; }
  bool operator==(const Range& o) const { return start == o.start && count == o.count; }
};

// Even split of n over tp ranks (n % tp must be 0: an error names `what` otherwise).
Range even_shard(int64_t n, int tp, int rank, const char* what);

// Attention heads of one rank.
struct HeadShard {
  Range q;          // q heads
  Range kv;         // kv heads (count 1 and shared by tp / num_kv_heads ranks when replicated)
  bool kv_replicated = false;
};
HeadShard shard_heads(int64_t num_heads, int64_t num_kv_heads, int tp, int rank);

// Row ranges of one rank in q_proj [nh*hd, H], k_proj and v_proj [nkv*hd, H]; the fused shard
// is q rows, then k rows, then v rows (also for biases). o_proj's columns are `q`.
struct QkvShard {
  Range q, k, v;
};
QkvShard shard_qkv(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int tp, int rank);
// The same rows inside a checkpoint's fused [q | k | v] tensor (rows offset by the blocks before).
QkvShard shard_fused_qkv(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int tp, int rank);

// Rows of one rank in a fused [gate (I) | up (I)] tensor [2I, H] (gate block then up block);
// with separate gate_proj / up_proj tensors both are `gate` rows. down_proj's columns: `gate`.
struct GateUpShard {
  Range gate, up;
};
GateUpShard shard_gate_up(int64_t inter, int tp, int rank);

// Experts of one EP rank, and the owner of expert e.
Range expert_range(int64_t experts, int ep, int ep_rank);
int expert_owner(int64_t expert, int64_t experts, int ep);

// MLA (DeepSeek-V2/V3): rows of q_b_proj (or q_proj) [nh * (nope + rope), *] and kv_b_proj
// [nh * (nope + v), kv_rank], columns of o_proj [H, nh * v] of this rank's heads.
struct MlaShard {
  Range heads, q_rows, kv_b_rows, o_cols;
};
MlaShard shard_mla(int64_t heads, int64_t nope, int64_t rope_dim, int64_t v_dim, int tp, int rank);

// MiniMax-M3 lightning indexer: this rank's index heads (attention head h reads selection
// h / (heads / index_heads), so the selection heads follow the q heads like KV heads do) and
// the rows of indexer.q_proj [index_heads * dim, H]. indexer.k_proj (one head) is replicated.
struct IndexerShard {
  Range heads, q_rows;
  bool replicated = false;
};
IndexerShard shard_indexer(int64_t q_heads, int64_t index_heads, int64_t index_dim, int tp, int rank);

// Gated DeltaNet (Qwen3.5 linear attention). in_proj_qkv rows [q (nk*dk) | k (nk*dk) | v (nv*dv)]
// and the conv channels in the same order: this rank's q, k (its key heads), v (its value
// heads) rows; z rows [nv*dv] = v-head rows; b / a rows and A_log / dt_bias = value heads;
// out_proj columns = v rows. Key heads replicate when tp > nk (value heads never do).
struct LinearAttnShard {
  Range k_heads, v_heads;
  bool k_replicated = false;
  Range q_rows, k_rows, v_rows;  // in in_proj_qkv (and conv channels)
  Range z_rows;                  // in in_proj_z, and out_proj's columns
};
LinearAttnShard shard_linear_attn(int64_t k_heads, int64_t v_heads, int64_t k_dim, int64_t v_dim, int tp, int rank);

// Vocabulary rows of one rank: rows [start, start + count) are real, the shard holds `padded`
// rows (count <= padded; rows past count are zero). Replicated (tp 1): the whole vocabulary.
struct VocabShard {
  int64_t start = 0, count = 0, padded = 0;
};
VocabShard shard_vocab(int64_t vocab, int tp, int rank);

// Bytes of an embedding table [vocab, hidden] of `elem` bytes per element on one GPU.
int64_t embed_bytes_per_gpu(int64_t vocab, int64_t hidden, int tp, size_t elem);

// Tokens [start, start + count) of T that attention-TP rank `rank` of `tp` handles when a group's
// replicated tokens are split for a dispatch (the first T % tp ranks take one more).
Range token_slice(int64_t tokens, int tp, int rank);

}  // namespace ts::parallel
