// Multi-GPU communication primitives of the CUDA backend (plain C++ header, no CUDA/NCCL
// includes): NCCL communicators and collectives, and the one-shot all-reduce fused with the
// residual add and RMSNorm. All collectives are enqueued on the calling thread's stream
// (ts::cuda::stream()) and never synchronise the host; they are legal inside CUDA graph capture.
// Every rank must issue the same collectives in the same order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace ts::cuda {

// True when the build links NCCL.
bool nccl_available();
// One NCCL communicator per device 0..n-1 of this process (ncclCommInitAll, called from one
// thread). NVLink SHARP/multicast is kept off (NCCL_NVLS_ENABLE=0). Handles are opaque.
std::vector<void*> nccl_init_all(int n);
void nccl_destroy(void* comm);
// In place sum over ranks of x (bf16 or f32, contiguous).
void nccl_all_reduce_sum(void* comm, Tensor& x);
// out = concat over ranks of in (rank-major): out.numel() == size * in.numel(), both contiguous.
void nccl_all_gather(void* comm, const Tensor& in, Tensor& out);

// One-shot all-reduce over peer-mapped buffers (one process, peer access between all GPUs),
// fused with the residual add and RMSNorm:
//   s = sum over ranks of x;  residual = residual_init ? s : residual + s;  x = rmsnorm(residual) * w
// (s and residual rounded to bf16 as NCCL + fused_add_rmsnorm would). Each rank stages its x
// in its own buffer, raises a per-block flag in every peer's flag array with this call's epoch
// (a counter in device memory, so graph replays advance it), waits for all peers' flags, then
// reads every peer's buffer directly. Buffers alternate by epoch parity, so a rank never
// overwrites data a peer may still be reading (see allreduce.cu).
class OneShotAllReduce {
 public:
  // Allocates the buffers on every device 0..n-1 and enables peer access; call from one
  // thread before any rank uses its object. max_tokens x hidden bounds every call.
  static std::vector<std::unique_ptr<OneShotAllReduce>> create(int n, int64_t max_tokens, int64_t hidden);
  ~OneShotAllReduce();
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t hidden() const { return hidden_; }
  // Must run on device rank() (the calling thread's device). x, residual: bf16 [T, H].
  void add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init);

  struct Shared;

 private:
  OneShotAllReduce() = default;
  int rank_ = 0, world_ = 1;
  int64_t max_tokens_ = 0, hidden_ = 0;
  std::shared_ptr<Shared> shared_;
};

}  // namespace ts::cuda
