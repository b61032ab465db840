// Creating a world's communicators from the parallel flags, and splitting them into the groups
// each layer kind reduces over. The runtime's shape (one process per node, a thread per rank):
//
//   ParallelOptions o = ...;                        // the flags
//   auto comms = make_cpu_world(o);                 // or: auto g = make_nccl_world(o, hidden)
//   // on rank r's own thread (every local rank at once: the splits are collective):
//   ParallelGroups pg = ParallelGroups::create(o, comms[i]);
//   // pg.mapping: the rank's place; pg.attn_tp / dense_tp / moe: the layers' groups.
#pragma once
#include <memory>
#include <vector>

#include "parallel/comm.h"
#include "parallel/mapping.h"
#include "parallel/options.h"
#include "parallel/rendezvous.h"

namespace ts::parallel {

class CpuTransport;

// One CPU Comm per rank of this process over transport t (index = local rank).
std::vector<std::shared_ptr<Comm>> make_cpu_comms(const std::shared_ptr<CpuTransport>& t);

// The bootstrap fields of the flags.
DistInit dist_init(const ParallelOptions& o);

// The CPU world of this process: every rank in-process (nnodes 1), or this node's
// ranks_per_node() ranks joined to the other nodes over TCP (rendezvous at --dist-init-addr).
// Index = local rank; global rank = node_rank * ranks_per_node + index.
std::vector<std::shared_ptr<Comm>> make_cpu_world(const ParallelOptions& o);

// The NCCL world of this process: GPUs 0..ranks_per_node-1 as global ranks node_rank *
// ranks_per_node + i; nnodes > 1 exchanges NCCL's unique id through the rendezvous. hidden: the
// residual width for the fused one-shot all-reduce (single node only).
std::shared_ptr<CommGroup> make_nccl_world(const ParallelOptions& o, int64_t hidden);

// One rank's groups. Groups as large as the world reuse the world Comm (keeping its fused
// one-shot all-reduce); groups of one are single Comms; the rest come from Comm::split.
struct ParallelGroups {
  Mapping mapping;
  std::shared_ptr<Comm> world;
  std::shared_ptr<Comm> attn_tp;   // attention, vocab-parallel embedding and LM head
  std::shared_ptr<Comm> dense_tp;  // dense MLP layers
  std::shared_ptr<Comm> moe_tp;    // MoE experts with the intermediate dim sharded
  std::shared_ptr<Comm> moe_ep;    // MoE experts split whole
  // Collective over the world: every rank calls it from its own thread with its world Comm.
  static ParallelGroups create(const ParallelOptions& o, std::shared_ptr<Comm> world);
  // The group a MoE layer shards over (EP when ep > 1, else MoE TP).
  Comm& moe() const { return mapping.moe_ep > 1 ? *moe_ep : *moe_tp; }
};

}  // namespace ts::parallel
