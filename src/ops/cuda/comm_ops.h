// Multi-GPU communication primitives of the CUDA backend (plain C++ header, no CUDA/NCCL
// includes): NCCL communicators and collectives, and the one-shot all-reduce fused with the
// residual add and RMSNorm. All collectives are enqueued on the calling thread's stream
// (ts::cuda::stream()) and never synchronise the host; they are legal inside CUDA graph capture.
// Every rank must issue the same collectives in the same order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

// Multi-process / multi-node groups (parallel::CommGroup::create_ranks).
// A fresh ncclUniqueId as bytes (made once, on global rank 0, and shared out of band).
std::string nccl_unique_id();
// Communicators of global ranks [first, first + devices.size()) of `world` (device devices[i]
// for rank first + i), from one thread in one NCCL group call.
std::vector<void*> nccl_init_ranks(const std::string& unique_id, int world, int first, const std::vector<int>& devices);
// ncclCommSplit: collective over comm; color < 0 gives null (NCCL_SPLIT_NOCOLOR).
void* nccl_split(void* comm, int color, int key);
int nccl_size(void* comm);
int nccl_rank(void* comm);
// in = size equal chunks, out = the sum of every rank's chunk number rank (contiguous).
void nccl_reduce_scatter_sum(void* comm, const Tensor& in, Tensor& out);
// x of root to every rank, in place.
void nccl_broadcast(void* comm, Tensor& x, int root);
// Uneven all-to-all of dim-0 rows (host counts, n = group size entries each), as grouped
// ncclSend/ncclRecv; the rank's own segment is a device copy. Both tensors contiguous, same
// dtype and row width.
void nccl_all_to_all_v(void* comm, const Tensor& in, const int64_t* send_rows, Tensor& out, const int64_t* recv_rows);
// Uneven all-gather of dim-0 rows: rank p contributes rows[p]; one grouped ncclBroadcast per rank.
void nccl_all_gather_v(void* comm, const Tensor& in, const int64_t* rows, Tensor& out);
// A one-element all-reduce on `scratch` (device i32 [1]) followed by a stream synchronise.
void nccl_barrier(void* comm, Tensor& scratch);
// True while the calling thread's stream is being captured into a CUDA graph (runtime.cu).
bool stream_capturing();

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
