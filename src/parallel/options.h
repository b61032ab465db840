// The parallel flags (the reference system's / SGLang's names), as one struct the CLI fills and
// EngineOptions embeds (`parallel::ParallelOptions parallel;`). Mapping::resolve turns them into
// every rank's place; errors name the flags.
//
//   --tp-size N            attention tensor parallelism (alias --tensor-parallel-size; the same
//                          as --attn-tp-size, which wins if both are given and must then agree)
//   --data-parallel-size D attention data parallelism (--dp-size): D groups of N ranks, each
//                          with its own requests and KV cache (MLA models: no KV-head sharding)
//                          world size = N x D
//   --dense-tp-size        TP size of dense MLP layers (default: the attention TP size)
//   --moe-tp-size          TP size of MoE experts (experts' intermediate dim sharded; default
//                          the world size, or 1 with --ep-size > 1)
//   --ep-size              expert parallelism: experts split over ep ranks
//   --enable-expert-parallel   ep = world size
//   --nnodes, --node-rank, --dist-init-addr host:port, --dist-timeout  multi-node bootstrap
//   --replicate-embedding  every rank keeps the whole embedding table (no vocab mask/all-reduce)
//   --comm-fusion-max-num-tokens  fused one-shot all-reduce + add + RMSNorm up to this many rows
#pragma once
#include <string>

namespace ts::parallel {

struct ParallelOptions {
  int tp_size = 1;       // attention TP
  int attn_tp_size = 0;  // 0: unset (= tp_size)
  int dp_size = 1;       // attention DP
  int dense_tp_size = 0;  // 0: = attention TP
  int moe_tp_size = 0;    // 0: world (ep 1) or 1 (ep > 1)
  int ep_size = 1;
  bool enable_expert_parallel = false;
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;
  int dist_timeout_s = 300;
  bool replicate_embedding = false;
  int comm_fusion_max_num_tokens = 2048;

  // The attention TP size after the --tp-size / --attn-tp-size alias (checked to agree).
  int attention_tp() const;
  // attention TP x data parallel.
  int world_size() const;
  // Ranks of this process (world / nnodes; checked to divide).
  int ranks_per_node() const;
};

}  // namespace ts::parallel
