// Speculative-decoding helpers of the fixed-shape EAGLE3 step (ops/ops.h; CPU reference
// ops/cpu/spec.cpp). Tiny kernels that keep the draft loop on the device inside one CUDA
// graph: draft argmax -> next inputs, greedy acceptance, and the per-request state select.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr int kArgThreads = 512;

// One block per row: max of (monotone float bits, ~id) keys = first (lowest id) maximum.
__global__ void __launch_bounds__(kArgThreads)
argmax_kernel(const float* __restrict__ logits, int64_t ld, int V, const int32_t* __restrict__ offsets,
              int32_t* __restrict__ out, int64_t out_stride, int32_t* __restrict__ out2) {
  __shared__ uint64_t warp_best[kArgThreads / 32];
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* l = logits + int64_t(row) * ld;
  uint64_t best = 0;
  for (int i = tid; i < V; i += blockDim.x) {
    const uint32_t u = __float_as_uint(l[i]);
    const uint32_t mono = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    const uint64_t k = (uint64_t(mono) << 32) | uint64_t(0xffffffffu - uint32_t(i));
    best = k > best ? k : best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if ((tid & 31) == 0) warp_best[tid >> 5] = best;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kArgThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    const int32_t id = int32_t(0xffffffffu - uint32_t(best & 0xffffffffu));
    const int32_t mapped = id + (offsets ? offsets[id] : 0);
    out[int64_t(row) * out_stride] = mapped;
    if (out2) out2[row] = mapped;
  }
}

__global__ void accept_kernel(const int32_t* __restrict__ v, const int32_t* __restrict__ t, int n, int B,
                              int32_t* __restrict__ acc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  int a = 0;
  while (a < n - 1 && t[i * n + a] == v[i * n + a + 1]) ++a;
  acc[i] = a;
}

// One block per request: copies the accepted row of r into the pool (16-byte units when aligned).
template <typename U>
__global__ void select_kernel(const char* __restrict__ r, int64_t r_ld, const int32_t* __restrict__ next_ids,
                              const int32_t* __restrict__ acc, const int32_t* __restrict__ slots, int n,
                              char* __restrict__ pool, int64_t pool_ld, int64_t pool_rows, int64_t row_bytes,
                              int32_t* __restrict__ next_out) {
  const int i = blockIdx.x;
  const int a = acc[i];
  const int64_t s = slots[i];
  if (a < 0 || a >= n || s < 0 || s >= pool_rows) return;  // cannot happen for well-formed inputs
  const int64_t src = int64_t(i) * n + a;
  const U* from = reinterpret_cast<const U*>(r + src * r_ld);
  U* to = reinterpret_cast<U*>(pool + s * pool_ld);
  for (int64_t j = threadIdx.x; j < row_bytes / int64_t(sizeof(U)); j += blockDim.x) to[j] = from[j];
  if (threadIdx.x == 0) next_out[i] = next_ids[src];
}

}  // namespace

void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride, Tensor* out2) {
  check_dev(logits, DType::f32, "argmax_rows logits");
  check_dev(out, DType::i32, "argmax_rows out");
  const int64_t R = logits.rows(), V = logits.size(-1);
  if (R == 0) return;
  TS_CHECK(out.numel() >= (R - 1) * out_stride + 1, "argmax_rows: out {} too small for {} rows (stride {})", out.shape_str(),
           R, out_stride);
  if (offsets) {
    check_dev(*offsets, DType::i32, "argmax_rows offsets");
    TS_CHECK(offsets->numel() == V, "argmax_rows: offsets must be [{}]", V);
  }
  if (out2) {
    check_dev(*out2, DType::i32, "argmax_rows out2");
    TS_CHECK(out2->numel() >= R, "argmax_rows: out2 {} too small for {} rows", out2->shape_str(), R);
  }
  launch(argmax_kernel, dim3(unsigned(R)), dim3(kArgThreads), 0, false, logits.ptr<float>(), logits.row_stride(), int(V),
         offsets ? offsets->ptr<int32_t>() : static_cast<const int32_t*>(nullptr), out.ptr<int32_t>(), out_stride,
         out2 ? out2->ptr<int32_t>() : static_cast<int32_t*>(nullptr));
}

void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc) {
  check_dev(acc, DType::i32, "spec_accept acc");
  const int64_t B = acc.numel();
  TS_CHECK(verify_ids.numel() >= B * n && target_ids.numel() >= B * n, "spec_accept: {} requests of {} rows", B, n);
  if (B == 0) return;
  launch(accept_kernel, dim3(unsigned(ceil_div(B, 128))), dim3(128), 0, false, verify_ids.ptr<int32_t>(),
         target_ids.ptr<int32_t>(), n, int(B), acc.ptr<int32_t>());
}

void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n, Tensor& h_pool,
                 Tensor& next_out) {
  TS_CHECK(r.device == Device::cuda && h_pool.device == Device::cuda && r.dtype == h_pool.dtype &&
               r.size(-1) == h_pool.size(-1),
           "spec_select: r {} vs pool {}", r.shape_str(), h_pool.shape_str());
  const int64_t B = acc.numel();
  if (B == 0) return;
  const int64_t es = int64_t(dtype_size(r.dtype)), row_bytes = r.size(-1) * es;
  const int64_t rld = r.row_stride() * es, pld = h_pool.row_stride() * es;
  const uintptr_t all = reinterpret_cast<uintptr_t>(r.data) | reinterpret_cast<uintptr_t>(h_pool.data) | uintptr_t(rld) |
                        uintptr_t(pld) | uintptr_t(row_bytes);
  auto go = [&](auto unit) {
    using U = decltype(unit);
    launch(select_kernel<U>, dim3(unsigned(B)), dim3(256), 0, false, static_cast<const char*>(r.data), rld,
           next_ids.ptr<int32_t>(), acc.ptr<int32_t>(), slots.ptr<int32_t>(), n, static_cast<char*>(h_pool.data), pld,
           h_pool.rows(), row_bytes, next_out.ptr<int32_t>());
  };
  if ((all & 15) == 0) go(uint4{});
  else go(uint16_t{});
}

}  // namespace ts::ops::cuda
