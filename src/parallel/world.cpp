#include "parallel/world.h"

#include "core/error.h"
#include "parallel/cpu_transport.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts::parallel {

DistInit dist_init(const ParallelOptions& o) {
  DistInit d;
  d.nnodes = o.nnodes;
  d.node_rank = o.node_rank;
  d.addr = o.dist_init_addr;
  d.timeout = std::chrono::seconds(o.dist_timeout_s);
  return d;
}

std::vector<std::shared_ptr<Comm>> make_cpu_world(const ParallelOptions& o) {
  const int per_node = o.ranks_per_node();
  const DistInit d = dist_init(o);
  check_dist_init(d);
  if (o.nnodes == 1) return make_cpu_comms(CpuTransport::local(per_node, d.timeout));
  return make_cpu_comms(CpuTransport::connect(d, per_node));
}

std::shared_ptr<CommGroup> make_nccl_world(const ParallelOptions& o, int64_t hidden) {
  const int per_node = o.ranks_per_node();
  const DistInit d = dist_init(o);
  check_dist_init(d);
  const int world = o.world_size();
  if (o.nnodes == 1) return CommGroup::create(world, o.comm_fusion_max_num_tokens, hidden);
#ifdef TS_WITH_CUDA
  TS_CHECK(cuda::device_count() >= per_node, "node {}: {} ranks per node but {} GPUs visible", o.node_rank, per_node,
           cuda::device_count());
#endif
  // Node 0 makes the id; the rendezvous hands it to every node (the others send nothing).
  const std::string id = o.node_rank == 0 ? nccl_unique_id() : std::string();
  const std::vector<std::string> blobs = rendezvous_all_gather(d, id);
  std::vector<int> devices;
  for (int i = 0; i < per_node; ++i) devices.push_back(i);
  return CommGroup::create_ranks(blobs[0], world, o.node_rank * per_node, devices, o.comm_fusion_max_num_tokens,
                                 hidden);
}

ParallelGroups ParallelGroups::create(const ParallelOptions& o, std::shared_ptr<Comm> world) {
  TS_CHECK(world, "ParallelGroups: no world communicator");
  ParallelGroups g;
  g.mapping = Mapping::resolve(o, world->rank());
  TS_CHECK(world->size() == g.mapping.world, "ParallelGroups: a world of {} ranks for a mapping of {}", world->size(),
           g.mapping.world);
  const Mapping& m = g.mapping;
  g.world = world;
  // The same sequence of splits on every rank (decided by sizes only, which all ranks share).
  auto group = [&](int size, int color, int key) -> std::shared_ptr<Comm> {
    if (size == m.world) return world;
    if (size == 1) return make_single_comm();
    auto c = world->split(color, key);
    TS_CHECK(c && c->size() == size, "ParallelGroups: split gave a group of {} ranks, expected {}", c ? c->size() : 0,
             size);
    return c;
  };
  g.attn_tp = group(m.attn_tp, m.attn_tp_color(), m.attn_tp_rank);
  g.dense_tp = group(m.dense_tp, m.dense_tp_color(), m.dense_tp_rank);
  g.moe_tp = group(m.moe_tp, m.moe_tp_color(), m.moe_tp_rank);
  g.moe_ep = group(m.moe_ep, m.moe_ep_color(), m.moe_ep_rank);
  return g;
}

}  // namespace ts::parallel
