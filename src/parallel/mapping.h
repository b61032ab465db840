// Mapping: how one model is split over the GPUs of a host (one process, one thread per GPU),
// and the sharding arithmetic every parallel layer uses. Plain C++ (CPU unit-tested).
//  - attention TP (attn_tp): q heads split evenly; KV heads split evenly, or replicated when
//    attn_tp > num_kv_heads so that every rank holds exactly one KV head;
//  - dense TP (dense_tp): column-parallel gate|up (gate and up rows of each shard stacked),
//    row-parallel o_proj / down_proj (columns split) followed by an all-reduce;
//  - vocab parallel embedding / LM head: ranks own ceil(V / tp) rows each (the last shard is
//    zero-padded to that size so all-gathers are uniform);
//  - MoE EP (moe_ep): experts per rank (not used by the dense models yet).
#pragma once
#include <cstdint>
#include <string>

namespace ts::parallel {

struct Mapping {
  int tp_size = 1, tp_rank = 0;
  int attn_tp = 1, dense_tp = 1, moe_ep = 1;

  // attn_tp = dense_tp = tp_size, moe_ep = ep_size (for now). Checks the sizes.
  static Mapping make(int tp_size, int tp_rank, int ep_size = 1);
  bool parallel() const { return tp_size > 1; }
  std::string str() const;
};

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

// Vocabulary rows of one rank: rows [start, start + count) are real, the shard holds `padded`
// rows (count <= padded; rows past count are zero). Replicated (tp 1): the whole vocabulary.
struct VocabShard {
  int64_t start = 0, count = 0, padded = 0;
};
VocabShard shard_vocab(int64_t vocab, int tp, int rank);

// Bytes of an embedding table [vocab, hidden] of `elem` bytes per element on one GPU.
int64_t embed_bytes_per_gpu(int64_t vocab, int64_t hidden, int tp, size_t elem);

}  // namespace ts::parallel
