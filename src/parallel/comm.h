// Communicators for tensor parallelism inside one process: one Comm per rank (= GPU), used only
// from that GPU's thread. Collectives are enqueued on the thread's stream (ts::cuda::stream())
// and may be captured into CUDA graphs. Every rank must issue the same collectives in the same
// order (the sharded models do, by construction).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace ts::cuda {
class OneShotAllReduce;
}

namespace ts::parallel {

class CommGroup;

class Comm {
 public:
  int rank() const { return rank_; }
  int size() const { return size_; }
  // x = sum over ranks of x (in place, contiguous).
  void all_reduce(Tensor& x);
  // out = concat over ranks of in (rank-major; out.numel() == size * in.numel()).
  void all_gather(const Tensor& in, Tensor& out);
  // s = all_reduce(x); residual = residual_init ? s : residual + s; x = rmsnorm(residual) * w.
  // Up to fusion_max_tokens rows: one fused one-shot kernel over peer buffers; above: NCCL
  // all-reduce then the fused add + RMSNorm.
  void all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init);
  int fusion_max_tokens() const { return fusion_max_tokens_; }

 private:
  friend class CommGroup;
  int rank_ = 0, size_ = 1;
  int fusion_max_tokens_ = 0;
  void* nccl_ = nullptr;
  std::shared_ptr<cuda::OneShotAllReduce> oneshot_;
  std::shared_ptr<CommGroup> group_;  // keeps the communicators alive
};

class CommGroup : public std::enable_shared_from_this<CommGroup> {
 public:
  // NCCL communicators for GPUs 0..n-1 (n >= 2) and, when fusion_max_tokens > 0, the peer
  // buffers of the fused one-shot all-reduce (hidden = the residual width). One thread.
  static std::shared_ptr<CommGroup> create(int n, int fusion_max_tokens, int64_t hidden);
  ~CommGroup();
  int size() const { return int(nccl_.size()); }
  std::shared_ptr<Comm> rank(int r);

 private:
  std::vector<void*> nccl_;
  std::vector<std::shared_ptr<cuda::OneShotAllReduce>> oneshot_;
  int fusion_max_tokens_ = 0;
};

}  // namespace ts::parallel
