// NCCL communicators and collectives (see comm_ops.h). Without NCCL in the build every entry
// point but nccl_available fails with a clear message.
#include <cstdlib>
#include <cstring>

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
    case DType::i64: return ncclInt64;
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

namespace {
ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
int comm_size(void* c) {
  int n = 0;
  TS_NCCL_CHECK(ncclCommCount(as_comm(c), &n));
  return n;
}
int comm_rank(void* c) {
  int r = 0;
  TS_NCCL_CHECK(ncclCommUserRank(as_comm(c), &r));
  return r;
}
void check_rows(const Tensor& t, const char* what) {
  TS_CHECK(t.device == Device::cuda && t.is_contiguous() && t.ndim >= 1, "{}: {} must be a contiguous GPU tensor",
           what, t.shape_str());
}
size_t row_bytes(const Tensor& t) {
  return t.size(0) == 0 ? 0 : t.nbytes() / size_t(t.size(0));
}
}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  TS_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

std::vector<void*> nccl_init_ranks(const std::string& unique_id, int world, int first, const std::vector<int>& devices) {
  TS_CHECK(unique_id.size() == sizeof(ncclUniqueId), "NCCL: unique id has {} bytes, expected {}", unique_id.size(),
           sizeof(ncclUniqueId));
  TS_CHECK(!devices.empty() && first >= 0 && first + int(devices.size()) <= world, "NCCL: ranks [{}, {}) of {}", first,
           first + int(devices.size()), world);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  int cur = 0;
  TS_CUDA_CHECK(cudaGetDevice(&cur));
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  TS_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < devices.size(); ++i) {
    TS_CUDA_CHECK(cudaSetDevice(devices[i]));
    TS_NCCL_CHECK(ncclCommInitRank(&comms[i], world, id, first + int(i)));
  }
  TS_NCCL_CHECK(ncclGroupEnd());
  TS_CUDA_CHECK(cudaSetDevice(cur));
  std::vector<void*> out;
  for (auto c : comms) out.push_back(static_cast<void*>(c));
  return out;
}

void* nccl_split(void* comm, int color, int key) {
  TS_CHECK(comm, "NCCL split: no communicator");
  ncclComm_t out = nullptr;
  TS_NCCL_CHECK(ncclCommSplit(as_comm(comm), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, nullptr));
  return static_cast<void*>(out);
}

int nccl_size(void* comm) { return comm_size(comm); }
int nccl_rank(void* comm) { return comm_rank(comm); }

void nccl_reduce_scatter_sum(void* comm, const Tensor& in, Tensor& out) {
  TS_CHECK(comm, "NCCL reduce-scatter: no communicator");
  const int n = comm_size(comm);
  TS_CHECK(in.device == Device::cuda && out.device == Device::cuda && in.is_contiguous() && out.is_contiguous() &&
               in.dtype == out.dtype && in.numel() == int64_t(n) * out.numel(),
           "NCCL reduce-scatter: in {} out {} over {} ranks", in.shape_str(), out.shape_str(), n);
  if (out.numel() == 0) return;
  TS_NCCL_CHECK(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype), ncclSum, as_comm(comm),
                                  stream()));
}

void nccl_broadcast(void* comm, Tensor& x, int root) {
  TS_CHECK(comm, "NCCL broadcast: no communicator");
  TS_CHECK(x.device == Device::cuda && x.is_contiguous(), "NCCL broadcast: x {} must be a contiguous GPU tensor",
           x.shape_str());
  if (x.numel() == 0) return;
  TS_NCCL_CHECK(ncclBroadcast(x.data, x.data, x.nbytes(), ncclInt8, root, as_comm(comm), stream()));
}

void nccl_all_to_all_v(void* comm, const Tensor& in, const int64_t* send_rows, Tensor& out, const int64_t* recv_rows) {
  TS_CHECK(comm, "NCCL all-to-all: no communicator");
  check_rows(in, "NCCL all-to-all in");
  check_rows(out, "NCCL all-to-all out");
  const int n = comm_size(comm), me = comm_rank(comm);
  const size_t rb = in.size(0) ? row_bytes(in) : row_bytes(out);
  TS_CHECK(in.dtype == out.dtype && (in.size(0) == 0 || out.size(0) == 0 || row_bytes(in) == row_bytes(out)),
           "NCCL all-to-all: in {} and out {} rows differ", in.shape_str(), out.shape_str());
  int64_t st = 0, rt = 0;
  for (int p = 0; p < n; ++p) {
    TS_CHECK(send_rows[p] >= 0 && recv_rows[p] >= 0, "NCCL all-to-all: negative count for rank {}", p);
    st += send_rows[p];
    rt += recv_rows[p];
  }
  TS_CHECK(st <= in.size(0) && rt <= out.size(0), "NCCL all-to-all: {} rows to send from {}, {} to receive into {}", st,
           in.shape_str(), rt, out.shape_str());
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  int64_t so = 0, ro = 0;
  // The own segment is a device copy; the rest one group of point-to-point calls.
  TS_NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    const size_t sb = size_t(send_rows[p]) * rb, rbytes = size_t(recv_rows[p]) * rb;
    if (p == me) {
      TS_CHECK(sb == rbytes, "NCCL all-to-all: rank {} sends itself {} rows but expects {}", me, send_rows[p],
               recv_rows[p]);
      if (sb) TS_CUDA_CHECK(cudaMemcpyAsync(dst + size_t(ro) * rb, src + size_t(so) * rb, sb, cudaMemcpyDeviceToDevice, stream()));
    } else {
      if (sb) TS_NCCL_CHECK(ncclSend(src + size_t(so) * rb, sb, ncclInt8, p, as_comm(comm), stream()));
      if (rbytes) TS_NCCL_CHECK(ncclRecv(dst + size_t(ro) * rb, rbytes, ncclInt8, p, as_comm(comm), stream()));
    }
    so += send_rows[p];
    ro += recv_rows[p];
  }
  TS_NCCL_CHECK(ncclGroupEnd());
}

void nccl_all_gather_v(void* comm, const Tensor& in, const int64_t* rows, Tensor& out) {
  TS_CHECK(comm, "NCCL all-gather-v: no communicator");
  check_rows(in, "NCCL all-gather-v in");
  check_rows(out, "NCCL all-gather-v out");
  const int n = comm_size(comm), me = comm_rank(comm);
  const size_t rb = out.size(0) ? row_bytes(out) : 0;
  int64_t total = 0;
  for (int p = 0; p < n; ++p) total += rows[p];
  TS_CHECK(in.dtype == out.dtype && in.size(0) >= rows[me] && out.size(0) >= total &&
               (in.size(0) == 0 || row_bytes(in) == rb || total == 0),
           "NCCL all-gather-v: in {} out {} ({} rows in all, {} from this rank)", in.shape_str(), out.shape_str(), total,
           rows[me]);
  char* dst = static_cast<char*>(out.data);
  int64_t off = 0;
  TS_NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    const size_t bytes = size_t(rows[p]) * rb;
    if (bytes) TS_NCCL_CHECK(ncclBroadcast(p == me ? in.data : dst + size_t(off) * rb, dst + size_t(off) * rb, bytes,
                                           ncclInt8, p, as_comm(comm), stream()));
    off += rows[p];
  }
  TS_NCCL_CHECK(ncclGroupEnd());
}

void nccl_barrier(void* comm, Tensor& scratch) {
  TS_CHECK(comm && scratch.device == Device::cuda && scratch.dtype == DType::i32 && scratch.numel() >= 1,
           "NCCL barrier: needs an i32 device scratch element");
  TS_NCCL_CHECK(ncclAllReduce(scratch.data, scratch.data, 1, ncclInt32, ncclSum, as_comm(comm), stream()));
  TS_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

#else

bool nccl_available() { return false; }
std::vector<void*> nccl_init_all(int) { fail("tensor parallelism needs NCCL, which this build does not link"); }
void nccl_destroy(void*) {}
void nccl_all_reduce_sum(void*, Tensor&) { fail("NCCL all-reduce: this build does not link NCCL"); }
void nccl_all_gather(void*, const Tensor&, Tensor&) { fail("NCCL all-gather: this build does not link NCCL"); }
std::string nccl_unique_id() { fail("multi-node NCCL: this build does not link NCCL"); }
std::vector<void*> nccl_init_ranks(const std::string&, int, int, const std::vector<int>&) {
  fail("tensor parallelism needs NCCL, which this build does not link");
}
void* nccl_split(void*, int, int) { fail("NCCL split: this build does not link NCCL"); }
int nccl_size(void*) { fail("NCCL: this build does not link NCCL"); }
int nccl_rank(void*) { fail("NCCL: this build does not link NCCL"); }
void nccl_reduce_scatter_sum(void*, const Tensor&, Tensor&) { fail("NCCL reduce-scatter: this build does not link NCCL"); }
void nccl_broadcast(void*, Tensor&, int) { fail("NCCL broadcast: this build does not link NCCL"); }
void nccl_all_to_all_v(void*, const Tensor&, const int64_t*, Tensor&, const int64_t*) {
  fail("NCCL all-to-all: this build does not link NCCL");
}
void nccl_all_gather_v(void*, const Tensor&, const int64_t*, Tensor&) { fail("NCCL all-gather: this build does not link NCCL"); }
void nccl_barrier(void*, Tensor&) { fail("NCCL barrier: this build does not link NCCL"); }

#endif

}  // namespace ts::cuda
