#include "parallel/mapping.h"

#include <algorithm>

#include "core/error.h"

namespace ts::parallel {

Mapping Mapping::make(int tp_size, int tp_rank, int ep_size) {
  TS_CHECK(tp_size >= 1, "--tp-size must be at least 1 (got {})", tp_size);
  TS_CHECK(tp_rank >= 0 && tp_rank < tp_size, "tp rank {} outside 0..{}", tp_rank, tp_size - 1);
  TS_CHECK(ep_size >= 1, "--ep-size must be at least 1 (got {})", ep_size);
  Mapping m;
  m.tp_size = tp_size;
  m.tp_rank = tp_rank;
  m.attn_tp = tp_size;
  m.dense_tp = tp_size;
  m.moe_ep = ep_size;
  return m;
}

std::string Mapping::str() const {
  return fmt::format("tp {} (rank {}), attn tp {}, dense tp {}, moe ep {}", tp_size, tp_rank, attn_tp, dense_tp, moe_ep);
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

}  // namespace ts::parallel
