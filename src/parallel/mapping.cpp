#include "parallel/mapping.h"

#include <algorithm>

#include "core/error.h"

namespace ts::parallel {

int ParallelOptions::attention_tp() const {
  TS_CHECK(tp_size >= 1, "--tp-size must be at least 1 (got {})", tp_size);
  TS_CHECK(attn_tp_size >= 0, "--attn-tp-size must be at least 1 (got {})", attn_tp_size);
  if (attn_tp_size == 0) return tp_size;
  TS_CHECK(tp_size == 1 || tp_size == attn_tp_size,
           "--tp-size {} and --attn-tp-size {} disagree (both set the attention tensor-parallel size)", tp_size,
           attn_tp_size);
  return attn_tp_size;
}

int ParallelOptions::world_size() const {
  TS_CHECK(dp_size >= 1, "--data-parallel-size must be at least 1 (got {})", dp_size);
  return attention_tp() * dp_size;
}

int ParallelOptions::ranks_per_node() const {
  const int w = world_size();
  TS_CHECK(nnodes >= 1, "--nnodes must be at least 1 (got {})", nnodes);
  TS_CHECK(w % nnodes == 0,
           "the world of {} ranks (attention TP {} x data parallel {}) does not split evenly over --nnodes {}", w,
           attention_tp(), dp_size, nnodes);
  return w / nnodes;
}

namespace {

// Groups of size a and b (contiguous, tensor-parallel-innermost ranks) nest when one divides the
// other: then every group of the smaller size lies inside one group of the larger.
void check_nested(int a, const char* a_flag, int b, const char* b_flag) {
  TS_CHECK(a % b == 0 || b % a == 0,
           "{} {} and {} {} do not nest (one must divide the other, so that each group of one lies inside a group of "
           "the other)",
           a_flag, a, b_flag, b);
}

}  // namespace

Mapping Mapping::resolve(const ParallelOptions& o, int rank) {
  const int attn_tp = o.attention_tp();
  const int world = o.world_size();
  const int per_node = o.ranks_per_node();
  TS_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} is outside 0..{} (--nnodes {})", o.node_rank,
           o.nnodes - 1, o.nnodes);
  TS_CHECK(rank >= 0 && rank < world, "rank {} outside the world of {} ranks", rank, world);
  Mapping m;
  m.world = world;
  m.rank = rank;
  m.nnodes = o.nnodes;
  m.ranks_per_node = per_node;
  m.attn_tp = attn_tp;
  m.attn_dp = o.dp_size;
  m.attn_tp_rank = rank % attn_tp;
  m.attn_dp_rank = rank / attn_tp;

  TS_CHECK(o.dense_tp_size >= 0, "--dense-tp-size must be at least 1 (got {})", o.dense_tp_size);
  m.dense_tp = o.dense_tp_size == 0 ? attn_tp : o.dense_tp_size;
  TS_CHECK(world % m.dense_tp == 0, "--dense-tp-size {} does not divide the world size {} (attention TP {} x data "
           "parallel {})", m.dense_tp, world, attn_tp, o.dp_size);
  check_nested(m.dense_tp, "--dense-tp-size", attn_tp, "attention TP size");
  m.dense_dp = world / m.dense_tp;
  m.dense_tp_rank = rank % m.dense_tp;

  TS_CHECK(o.ep_size >= 1, "--ep-size must be at least 1 (got {})", o.ep_size);
  TS_CHECK(o.moe_tp_size >= 0, "--moe-tp-size must be at least 1 (got {})", o.moe_tp_size);
  int ep = o.ep_size;
  if (o.enable_expert_parallel) {
    TS_CHECK(ep == 1 || ep == world, "--enable-expert-parallel sets the EP size to the world size {}, but --ep-size is {}",
             world, ep);
    ep = world;
  }
  TS_CHECK(world % ep == 0, "--ep-size {} does not divide the world size {} (attention TP {} x data parallel {})", ep,
           world, attn_tp, o.dp_size);
  // Default: experts TP-sharded over the world, or — with expert parallelism — kept whole (EP
  // groups repeat over the rest of the world: moe_dp = world / ep).
  const int moe_tp = o.moe_tp_size != 0 ? o.moe_tp_size : (ep > 1 ? 1 : world);
  TS_CHECK(!(moe_tp > 1 && ep > 1),
           "MoE tensor parallelism ({}) and expert parallelism ({}) cannot both be > 1: with --ep-size {} the experts "
           "are split whole (set --moe-tp-size 1, or drop --ep-size for MoE TP)",
           moe_tp, ep, ep);
  TS_CHECK(world % (moe_tp * ep) == 0, "--moe-tp-size {} x --ep-size {} does not divide the world size {}", moe_tp, ep,
           world);
  if (ep > 1) check_nested(ep, "--ep-size", attn_tp, "attention TP size");
  if (moe_tp > 1) check_nested(moe_tp, "--moe-tp-size", attn_tp, "attention TP size");
  m.moe_ep = ep;
  m.moe_tp = moe_tp;
  m.moe_dp = world / (moe_tp * ep);
  m.moe_tp_rank = rank % moe_tp;
  m.moe_ep_rank = (rank / moe_tp) % ep;
  m.moe_dp_rank = rank / (moe_tp * ep);

  m.tp_size = attn_tp;
  m.tp_rank = m.attn_tp_rank;
  return m;
}

Mapping Mapping::make(int tp_size, int tp_rank, int ep_size) {
  TS_CHECK(tp_size >= 1, "--tp-size must be at least 1 (got {})", tp_size);
  TS_CHECK(tp_rank >= 0 && tp_rank < tp_size, "tp rank {} outside 0..{}", tp_rank, tp_size - 1);
  TS_CHECK(ep_size >= 1, "--ep-size must be at least 1 (got {})", ep_size);
  ParallelOptions o;
  o.tp_size = tp_size;
  o.ep_size = ep_size;
  return resolve(o, tp_rank);
}

bool Mapping::moe_tokens_replicated() const { return std::max(moe_ep, moe_tp) <= attn_tp; }

std::string Mapping::str() const {
  return fmt::format("world {} (rank {}{}): attention tp {} x dp {}, dense tp {}, moe tp {} x ep {} x dp {}", world,
                     rank, nnodes > 1 ? fmt::format(", node {} of {}", node_rank(), nnodes) : std::string(), attn_tp,
                     attn_dp, dense_tp, moe_tp, moe_ep, moe_dp);
}

void check_model_fits(const Mapping& m, const ModelShape& s) {
  const char* n = s.name.c_str();
  if (s.heads > 0) {
    TS_CHECK(s.heads % m.attn_tp == 0, "{}: num_attention_heads {} is not divisible by the attention TP size {} "
             "(--tp-size / --attn-tp-size)", n, s.heads, m.attn_tp);
    if (!s.mla && s.kv_heads > 0) {
      TS_CHECK(s.heads % s.kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", n,
               s.heads, s.kv_heads);
      TS_CHECK(s.kv_heads % m.attn_tp == 0 || m.attn_tp % s.kv_heads == 0,
               "{}: num_key_value_heads {} and the attention TP size {} do not divide one another (KV heads are split "
               "evenly, or replicated when the TP size is a multiple of them)",
               n, s.kv_heads, m.attn_tp);
    }
  }
  if (s.index_heads > 0) {
    TS_CHECK(s.index_heads % m.attn_tp == 0 || m.attn_tp % s.index_heads == 0,
             "{}: index_n_heads {} and the attention TP size {} do not divide one another", n, s.index_heads, m.attn_tp);
    TS_CHECK(s.heads % s.index_heads == 0, "{}: num_attention_heads {} is not a multiple of index_n_heads {}", n,
             s.heads, s.index_heads);
  }
  if (s.linear_v_heads > 0) {
    TS_CHECK(s.linear_v_heads % m.attn_tp == 0, "{}: linear_num_value_heads {} is not divisible by the attention TP "
             "size {}", n, s.linear_v_heads, m.attn_tp);
    TS_CHECK(s.linear_k_heads % m.attn_tp == 0 || m.attn_tp % s.linear_k_heads == 0,
             "{}: linear_num_key_heads {} and the attention TP size {} do not divide one another", n, s.linear_k_heads,
             m.attn_tp);
  }
  if (s.dense_inter > 0)
    TS_CHECK(s.dense_inter % m.dense_tp == 0, "{}: intermediate_size {} is not divisible by the dense TP size {} "
             "(--dense-tp-size)", n, s.dense_inter, m.dense_tp);
  if (s.experts > 0) {
    TS_CHECK(s.experts % m.moe_ep == 0, "{}: {} experts are not divisible by --ep-size {}", n, s.experts, m.moe_ep);
    TS_CHECK(s.moe_inter % m.moe_tp == 0, "{}: moe_intermediate_size {} is not divisible by the MoE TP size {} "
             "(--moe-tp-size)", n, s.moe_inter, m.moe_tp);
    if (s.shared_inter > 0)
      TS_CHECK(s.shared_inter % m.moe_tp == 0, "{}: the shared experts' intermediate size {} is not divisible by the "
               "MoE TP size {}", n, s.shared_inter, m.moe_tp);
  } else {
    // A dense model has no MoE layer to apply --ep-size to.
    TS_CHECK(m.moe_ep == 1, "{}: --ep-size {} needs a mixture-of-experts model (this one has no experts)", n, m.moe_ep);
  }
}

Range even_shard(int64_t n, int tp, int rank, const char* what) {
  TS_CHECK(tp >= 1 && rank >= 0 && rank < tp, "shard: rank {} of {}", rank, tp);
  TS_CHECK(n % tp == 0, "{} ({}) is not divisible by the tensor-parallel size {}", what, n, tp);
  int64_t c = n / tp;
  return {c * rank, c};
}

HeadShard shard_heads(int64_t nh, int64_t nkv, int tp, int rank) {
  TS_CHECK(nkv >= 1 && nh % nkv == 0, "attention: {} heads are not a multiple of {} kv heads", nh, nkv);
  HeadShard s;
  s.q = even_shard(nh, tp, rank, "num_attention_heads");
  if (tp <= nkv) {
    s.kv = even_shard(nkv, tp, rank, "num_key_value_heads");
  } else {
    TS_CHECK(tp % nkv == 0, "tensor-parallel size {} must be a multiple of num_key_value_heads {} to replicate KV heads", tp,
             nkv);
    s.kv = {rank / (tp / nkv), 1};
    s.kv_replicated = true;
  }
  // GQA: the q heads of this rank must all read this rank's kv heads.
  int64_t group = nh / nkv;
  TS_CHECK(s.q.start / group >= s.kv.start && (s.q.end() - 1) / group < s.kv.end(),
           "attention sharding: q heads [{}, {}) do not map onto kv heads [{}, {})", s.q.start, s.q.end(), s.kv.start,
           s.kv.end());
  return s;
}

QkvShard shard_qkv(int64_t nh, int64_t nkv, int64_t hd, int tp, int rank) {
  const HeadShard h = shard_heads(nh, nkv, tp, rank);
  QkvShard s;
  s.q = {h.q.start * hd, h.q.count * hd};
  s.k = {h.kv.start * hd, h.kv.count * hd};
  s.v = s.k;
  return s;
}

QkvShard shard_fused_qkv(int64_t nh, int64_t nkv, int64_t hd, int tp, int rank) {
  QkvShard s = shard_qkv(nh, nkv, hd, tp, rank);
  s.k.start += nh * hd;
  s.v.start += nh * hd + nkv * hd;
  return s;
}

GateUpShard shard_gate_up(int64_t inter, int tp, int rank) {
  const Range i = even_shard(inter, tp, rank, "intermediate_size");
  return {i, {inter + i.start, i.count}};
}

Range expert_range(int64_t experts, int ep, int ep_rank) {
  TS_CHECK(experts >= 1 && experts % ep == 0, "{} experts are not divisible by the expert-parallel size {}", experts, ep);
  return even_shard(experts, ep, ep_rank, "experts");
}

int expert_owner(int64_t expert, int64_t experts, int ep) {
  TS_CHECK(expert >= 0 && expert < experts && experts % ep == 0, "expert {} of {} over {} ranks", expert, experts, ep);
  return int(expert / (experts / ep));
}

MlaShard shard_mla(int64_t heads, int64_t nope, int64_t rope_dim, int64_t v_dim, int tp, int rank) {
  MlaShard s;
  s.heads = even_shard(heads, tp, rank, "num_attention_heads");
  const int64_t qd = nope + rope_dim, kvd = nope + v_dim;
  s.q_rows = {s.heads.start * qd, s.heads.count * qd};
  s.kv_b_rows = {s.heads.start * kvd, s.heads.count * kvd};
  s.o_cols = {s.heads.start * v_dim, s.heads.count * v_dim};
  return s;
}

IndexerShard shard_indexer(int64_t q_heads, int64_t index_heads, int64_t index_dim, int tp, int rank) {
  // The selection heads follow the q heads exactly as KV heads do under GQA.
  const HeadShard h = shard_heads(q_heads, index_heads, tp, rank);
  IndexerShard s;
  s.heads = h.kv;
  s.replicated = h.kv_replicated;
  s.q_rows = {h.kv.start * index_dim, h.kv.count * index_dim};
  return s;
}

LinearAttnShard shard_linear_attn(int64_t nk, int64_t nv, int64_t dk, int64_t dv, int tp, int rank) {
  // Value heads play the q heads' part, key heads the KV heads' (nv % nk == 0: GVA).
  const HeadShard h = shard_heads(nv, nk, tp, rank);
  LinearAttnShard s;
  s.v_heads = h.q;
  s.k_heads = h.kv;
  s.k_replicated = h.kv_replicated;
  s.q_rows = {h.kv.start * dk, h.kv.count * dk};
  s.k_rows = {nk * dk + h.kv.start * dk, h.kv.count * dk};
  s.v_rows = {2 * nk * dk + h.q.start * dv, h.q.count * dv};
  s.z_rows = {h.q.start * dv, h.q.count * dv};
  return s;
}

VocabShard shard_vocab(int64_t vocab, int tp, int rank) {
  TS_CHECK(tp >= 1 && rank >= 0 && rank < tp && vocab >= 1, "vocab shard: rank {} of {}, vocab {}", rank, tp, vocab);
  VocabShard v;
  v.padded = (vocab + tp - 1) / tp;
  v.start = std::min<int64_t>(vocab, v.padded * rank);
  v.count = std::min<int64_t>(v.padded, vocab - v.start);
  return v;
}

int64_t embed_bytes_per_gpu(int64_t vocab, int64_t hidden, int tp, size_t elem) {
  return shard_vocab(vocab, tp, 0).padded * hidden * int64_t(elem);
}

Range token_slice(int64_t tokens, int tp, int rank) {
  TS_CHECK(tp >= 1 && rank >= 0 && rank < tp && tokens >= 0, "token slice: rank {} of {}, {} tokens", rank, tp, tokens);
  const int64_t base = tokens / tp, extra = tokens % tp;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace ts::parallel
