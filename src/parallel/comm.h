// Comm: the one collective interface of tensor / expert parallelism, with three backends:
//  - nccl:   GPUs. One process per node, one thread per GPU, one Comm per GPU used only from that
//            GPU's thread. Collectives are enqueued on the thread's stream (ts::cuda::stream()),
//            never synchronise the host (except barrier), and may be captured into CUDA graphs
//            (all but all_to_all_v / all_gather_v, whose host counts would be baked in).
//  - cpu:    ranks are threads of one process, or of several processes ("nodes") joined by TCP
//            (cpu_transport.h). Every collective is deterministic: reductions sum the ranks'
//            contributions in rank order, so every rank gets bit-identical results that do not
//            depend on timing or thread scheduling, run after run.
//  - single: a group of one (no communication; copies where a collective's output is a
//            separate tensor), so layer code never branches on "is there a communicator".
// Rules for every backend: every rank of a group issues the same collectives in the same order
// with matching shapes; tensors are contiguous and on the backend's device; zero-element
// tensors are legal (the collective still synchronises the group's order). A Comm object is
// used by one thread (its rank's); distinct Comms of one group run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace ts::cuda {
class OneShotAllReduce;
}

namespace ts::parallel {

enum class CommBackend : uint8_t { single, cpu, nccl };
const char* backend_name(CommBackend b);

class Comm {
 public:
  virtual ~Comm() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual CommBackend backend() const = 0;

  // x = sum over ranks of x, in place (f32, bf16, i32; the cpu backend also i64).
  virtual void all_reduce(Tensor& x) = 0;
  // out = concat over ranks of in, rank-major: out.numel() == size * in.numel().
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // in = size equal chunks (in.numel() == size * out.numel()); out = sum over ranks of their
  // chunk number rank().
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in and out = size equal chunks; chunk p of in goes to rank p, arriving as chunk rank() of
  // p's out.
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // Uneven all-to-all over rows (dim 0) of width W = numel / size(0), both tensors with the same
  // row width: rows [sum send_rows[<p]], + send_rows[p]) of in go to rank p and land in out at
  // rows [sum recv_rows[<p], + recv_rows[p]). recv_rows[p] must equal what p sends here (an
  // error otherwise, not a hang, on the cpu backend). in / out may hold more rows than the
  // counts use (workspace buffers sized for the worst case). Counts are host values.
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                            const std::vector<int64_t>& recv_rows) = 0;
  // Uneven all-gather over rows: rank p contributes rows[p] rows (in has at least rows[rank()]),
  // out gets them rank-major (at least sum rows).
  virtual void all_gather_v(const Tensor& in, const std::vector<int64_t>& rows, Tensor& out) = 0;
  // x of rank root is copied into x of every rank.
  virtual void broadcast(Tensor& x, int root) = 0;
  // Returns when every rank of the group has entered it (nccl: and its stream has drained).
  virtual void barrier() = 0;

  // Row-parallel sub-layer output x [T, H] (a partial sum on each rank) -> the next norm's input:
  //   s = all_reduce(x); residual = residual_init ? s : residual + s; x = rmsnorm(residual) * w.
  // nccl: up to fusion_max_tokens() rows one fused one-shot kernel over peer buffers (one node);
  // above, and on the other backends, all_reduce then the fused add + RMSNorm op.
  virtual void all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init);
  int fusion_max_tokens() const { return fusion_max_tokens_; }

  // Collective over this group: ranks passing the same color form a new group, ordered by
  // (key, rank). color < 0: this rank joins no group (returns null).
  virtual std::shared_ptr<Comm> split(int color, int key) = 0;

 protected:
  int rank_ = 0, size_ = 1;
  int fusion_max_tokens_ = 0;
};

// A group of one, on any device.
std::shared_ptr<Comm> make_single_comm();

// In-process CPU world: one Comm per rank (threads), index = rank.
std::vector<std::shared_ptr<Comm>> make_cpu_comms(int n);

// NCCL communicators for GPUs 0..n-1 of this process (n >= 2) and, when fusion_max_tokens > 0,
// the peer buffers of the fused one-shot all-reduce (hidden = the residual width). Created from
// one thread; rank(r) hands out rank r's Comm.
class CommGroup : public std::enable_shared_from_this<CommGroup> {
 public:
  static std::shared_ptr<CommGroup> create(int n, int fusion_max_tokens, int64_t hidden);
  // Multi-node: global ranks [first, first + devices.size()) of `world`, device devices[i] for
  // rank first + i, joined through the NCCL unique id `id` (made by nccl_unique_id() on global
  // rank 0 and shared with the rendezvous). The fused one-shot path needs every rank in this
  // process (world == devices.size()); otherwise fusion is off.
  static std::shared_ptr<CommGroup> create_ranks(const std::string& id, int world, int first,
                                                 const std::vector<int>& devices, int fusion_max_tokens,
                                                 int64_t hidden);
  ~CommGroup();
  int size() const { return world_; }              // ranks of the whole group (all processes)
  int local() const { return int(nccl_.size()); }  // ranks in this process
  int first() const { return first_; }
  // The Comm of global rank r, one of this process's: first() <= r < first() + local().
  std::shared_ptr<Comm> rank(int r);

 private:
  friend class NcclComm;
  std::vector<void*> nccl_;
  std::vector<int> devices_;
  std::vector<std::shared_ptr<cuda::OneShotAllReduce>> oneshot_;
  int world_ = 0, first_ = 0;
  int fusion_max_tokens_ = 0;
};

// The NCCL unique id (opaque bytes) for CommGroup::create_ranks; fails without NCCL.
std::string nccl_unique_id();

}  // namespace ts::parallel
