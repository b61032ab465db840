// NCCL communicators and collectives (see comm_ops.h). Without NCCL in the build every entry
// point but nccl_available fails with a clear message.
#include <cstdlib>

#include "ops/cuda/comm_ops.h"
#include "ops/cuda/common.cuh"

#ifdef TS_WITH_NCCL
#include <nccl.h>
#define TS_NCCL_CHECK(expr)                                                                       \
  do {                                                                                            \
    ncclResult_t r_ = (expr);                                                                     \
    if (r_ != ncclSuccess) ::ts::fail("NCCL error {} at {}:{}: {}", int(r_), __FILE__, __LINE__, \
                                      ncclGetErrorString(r_));                                    \
  } while (0)
#endif

namespace ts::cuda {

#ifdef TS_WITH_NCCL
namespace {
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::bf16: return ncclBfloat16;
    case DType::f32: return ncclFloat32;
    case DType::i32: return ncclInt32;
    default: fail("NCCL: dtype {} not supported", dtype_name(dt));
  }
}
}  // namespace

bool nccl_available() { return true; }

std::vector<void*> nccl_init_all(int n) {
  TS_CHECK(n >= 1 && n <= device_count(), "NCCL: {} ranks but {} GPUs visible", n, device_count());
  // NVLink SHARP (multicast objects) stays off in this project.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<ncclComm_t> comms;
  comms.assign(size_t(n), nullptr);
  std::vector<int> devs;
  devs.resize(size_t(n));
  for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
  int cur = 0;
  TS_CUDA_CHECK(cudaGetDevice(&cur));
  TS_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
  TS_CUDA_CHECK(cudaSetDevice(cur));
  std::vector<void*> out;
  for (auto c : comms) out.push_back(static_cast<void*>(c));
  return out;
}

void nccl_destroy(void* comm) {
  if (comm) ncclCommDestroy(static_cast<ncclComm_t>(comm));
}

void nccl_all_reduce_sum(void* comm, Tensor& x) {
  TS_CHECK(comm, "NCCL all-reduce: no communicator");
  TS_CHECK(x.device == Device::cuda && x.is_contiguous(), "NCCL all-reduce: x must be a contiguous GPU tensor ({})",
           x.shape_str());
  if (x.numel() == 0) return;
  TS_NCCL_CHECK(ncclAllReduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), ncclSum,
                              static_cast<ncclComm_t>(comm), stream()));
}

void nccl_all_gather(void* comm, const Tensor& in, Tensor& out) {
  TS_CHECK(comm, "NCCL all-gather: no communicator");
  int n = 0;
  TS_NCCL_CHECK(ncclCommCount(static_cast<ncclComm_t>(comm), &n));
  TS_CHECK(in.device == Device::cuda && out.device == Device::cuda && in.is_contiguous() && out.is_contiguous() &&
               in.dtype == out.dtype && out.numel() == int64_t(n) * in.numel(),
           "NCCL all-gather: in {} out {} over {} ranks", in.shape_str(), out.shape_str(), n);
  if (in.numel() == 0) return;
  TS_NCCL_CHECK(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype),
                              static_cast<ncclComm_t>(comm), stream()));
}

#else

bool nccl_available() { return false; }
std::vector<void*> nccl_init_all(int) { fail("tensor parallelism needs NCCL, which this build does not link"); }
void nccl_destroy(void*) {}
void nccl_all_reduce_sum(void*, Tensor&) { fail("NCCL all-reduce: this build does not link NCCL"); }
void nccl_all_gather(void*, const Tensor&, Tensor&) { fail("NCCL all-gather: this build does not link NCCL"); }

#endif

}  // namespace ts::cuda
