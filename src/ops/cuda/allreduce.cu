// One-shot all-reduce fused with residual add + RMSNorm over peer-mapped buffers, for the small
// token counts where NCCL's latency dominates (see comm_ops.h for the contract).
//
// Protocol of one call (every rank launches the same grid: G = min(T, kBlocks) blocks, block b
// owning rows b, b + G, ...):
//  1. epoch e = (completed calls on this rank) + 1, read from device memory (graph replays
//     advance it); buffer parity p = e & 1.
//  2. Block b copies its rows of x into data[p] of this rank, fences (system scope), then
//     stores e into flags[rank][b] of EVERY rank (release, system scope).
//  3. Block b spins until flags[q][b] >= e on its own rank for every q (acquire), i.e. every
//     peer's block b staged the same rows.
//  4. Block b sums its rows over the ranks in rank order (identical on every rank, so all
//     ranks produce bit-identical results), adds the residual, normalises.
//  5. The last block to finish bumps the epoch counter (all blocks have read it by then).
// Why a rank never overwrites data a peer still reads: rank r writes data[p] of call e + 2 only
// after its call e + 1 kernel finished, i.e. after every peer raised its call e + 1 flags,
// which a peer does only inside its call e + 1 kernel — launched after its call e kernel (the
// last reader of data[p] for call e) completed. Flags only grow, so a late reader comparing
// with >= never misses an epoch.
// Deadlock freedom: all G blocks are resident together (G <= kBlocks <= SMs, one block of
// <= 1024 threads each) and the kernel is launched without PDL.
#include <algorithm>

#include "ops/cuda/comm_ops.h"
#include "ops/cuda/common.cuh"

namespace ts::cuda {

namespace {

constexpr int kMaxRanks = 8;
constexpr int kBlocks = 64;  // blocks per call (rows are strided over them)

struct OneShotParams {
  const __nv_bfloat16* data[kMaxRanks];  // each rank's staging buffer (2 parities)
  uint32_t* flags[kMaxRanks];            // each rank's flags [kMaxRanks][kBlocks]
  uint32_t* counter;                     // this rank: [0] completed calls, [1] finished blocks
  __nv_bfloat16* my_data;                // data[rank]
  int rank, world;
  int64_t parity_stride;  // elements per parity
  __nv_bfloat16* x;
  int64_t x_ld;
  __nv_bfloat16* res;
  int64_t r_ld;
  const __nv_bfloat16* w;
  int T, H;
  float eps;
  int residual_init;
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(1024) oneshot_add_rmsnorm_kernel(OneShotParams p) {
  __shared__ float red[32];
  __shared__ uint32_t s_epoch;
  if (threadIdx.x == 0) s_epoch = ld_acquire_sys(p.counter) + 1u;
  __syncthreads();
  const uint32_t e = s_epoch;
  const int64_t par = int64_t(e & 1u) * p.parity_stride;
  const int nv = p.H / 8;
  // 1. Stage this block's rows.
  for (int t = blockIdx.x; t < p.T; t += gridDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(p.x + int64_t(t) * p.x_ld);
    uint4* dst = reinterpret_cast<uint4*>(p.my_data + par + int64_t(t) * p.H);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) dst[i] = src[i];
  }
  __threadfence_system();
  __syncthreads();
  // 2. Raise this block's flag on every rank; 3. wait for every rank's flag on this rank.
  if (threadIdx.x < p.world) {
    st_release_sys(p.flags[threadIdx.x] + p.rank * kBlocks + blockIdx.x, e);
    const uint32_t* f = p.flags[p.rank] + threadIdx.x * kBlocks + blockIdx.x;
    while (int32_t(ld_acquire_sys(f) - e) < 0) {
    }
    __threadfence_system();
  }
  __syncthreads();
  // 4. Sum over ranks (rank order), add the residual, normalise.
  for (int t = blockIdx.x; t < p.T; t += gridDim.x) {
    __nv_bfloat16* xr = p.x + int64_t(t) * p.x_ld;
    __nv_bfloat16* rr = p.res + int64_t(t) * p.r_ld;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int q = 0; q < p.world; ++q) {
        BF8 v;
        v.u = __ldcv(reinterpret_cast<const uint4*>(p.data[q] + par + int64_t(t) * p.H) + i);
        float f[8];
        bf8_to_f32(v, f);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += f[k];
      }
      BF8 s = f32_to_bf8(acc);  // the all-reduced value, rounded as a bf16 all-reduce would
      float sf[8];
      bf8_to_f32(s, sf);
      if (!p.residual_init) {
        BF8 r;
        r.u = reinterpret_cast<const uint4*>(rr)[i];
        float rf[8];
        bf8_to_f32(r, rf);
#pragma unroll
        for (int k = 0; k < 8; ++k) sf[k] += rf[k];
        s = f32_to_bf8(sf);
        bf8_to_f32(s, sf);
      }
      reinterpret_cast<uint4*>(rr)[i] = s.u;
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += sf[k] * sf[k];
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / float(p.H) + p.eps);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {  // re-reads only its own writes
      BF8 r, wv;
      r.u = reinterpret_cast<const uint4*>(rr)[i];
      wv.u = reinterpret_cast<const uint4*>(p.w)[i];
      float f[8], g[8];
      bf8_to_f32(r, f);
      bf8_to_f32(wv, g);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = f[k] * inv * g[k];
      reinterpret_cast<uint4*>(xr)[i] = f32_to_bf8(f).u;
    }
  }
  // 5. The last block out advances the epoch.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const uint32_t done = atomicAdd(p.counter + 1, 1u);
    if (done == gridDim.x - 1) {
      p.counter[1] = 0;
      __threadfence();
      atomicExch(p.counter, e);
    }
  }
}

}  // namespace

struct OneShotAllReduce::Shared {
  int world = 1;
  std::vector<std::shared_ptr<void>> data, flags;  // per rank, on its device
  std::vector<void*> data_ptr, flag_ptr;
};

std::vector<std::unique_ptr<OneShotAllReduce>> OneShotAllReduce::create(int n, int64_t max_tokens, int64_t hidden) {
  TS_CHECK(n >= 2 && n <= kMaxRanks, "one-shot all-reduce: {} ranks (2..{} supported)", n, kMaxRanks);
  TS_CHECK(n <= device_count(), "one-shot all-reduce: {} ranks but {} GPUs", n, device_count());
  TS_CHECK(hidden % 8 == 0 && hidden > 0 && max_tokens > 0, "one-shot all-reduce: hidden {} must be a multiple of 8",
           hidden);
  int cur = 0;
  TS_CUDA_CHECK(cudaGetDevice(&cur));
  auto sh = std::make_shared<Shared>();
  sh->world = n;
  const size_t data_bytes = size_t(2 * max_tokens * hidden) * sizeof(__nv_bfloat16);
  const size_t flag_bytes = (size_t(kMaxRanks) * kBlocks + 2) * sizeof(uint32_t);
  for (int r = 0; r < n; ++r) {
    TS_CUDA_CHECK(cudaSetDevice(r));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      int ok = 0;
      TS_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, r, q));
      TS_CHECK(ok, "one-shot all-reduce: GPU {} cannot access GPU {} (no peer access)", r, q);
      cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else TS_CUDA_CHECK(e);
    }
    void* d = nullptr;
    void* f = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&d, data_bytes));
    TS_CUDA_CHECK(cudaMalloc(&f, flag_bytes));
    TS_CUDA_CHECK(cudaMemset(f, 0, flag_bytes));
    TS_CUDA_CHECK(cudaDeviceSynchronize());
    auto del = [r](void* q) {
      int c = 0;
      if (cudaGetDevice(&c) != cudaSuccess) return;
      cudaSetDevice(r);
      cudaFree(q);
      cudaSetDevice(c);
    };
    sh->data.emplace_back(d, del);
    sh->flags.emplace_back(f, del);
    sh->data_ptr.push_back(d);
    sh->flag_ptr.push_back(f);
  }
  TS_CUDA_CHECK(cudaSetDevice(cur));
  std::vector<std::unique_ptr<OneShotAllReduce>> out;
  for (int r = 0; r < n; ++r) {
    std::unique_ptr<OneShotAllReduce> o(new OneShotAllReduce());
    o->rank_ = r;
    o->world_ = n;
    o->max_tokens_ = max_tokens;
    o->hidden_ = hidden;
    o->shared_ = sh;
    out.push_back(std::move(o));
  }
  return out;
}

OneShotAllReduce::~OneShotAllReduce() = default;

void OneShotAllReduce::add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init) {
  check_dev(x, DType::bf16, "one-shot all-reduce x");
  check_dev(residual, DType::bf16, "one-shot all-reduce residual");
  check_dev(w, DType::bf16, "one-shot all-reduce w");
  TS_CHECK(current_device() == rank_, "one-shot all-reduce: rank {} called from a thread driving GPU {}", rank_,
           current_device());
  const int64_t T = x.rows(), H = x.size(-1);
  TS_CHECK(H == hidden_ && residual.rows() == T && residual.size(-1) == H && w.numel() == H,
           "one-shot all-reduce: x {} residual {} w {} (hidden {})", x.shape_str(), residual.shape_str(), w.shape_str(),
           hidden_);
  TS_CHECK(T <= max_tokens_, "one-shot all-reduce: {} tokens > {} (use the NCCL path)", T, max_tokens_);
  TS_CHECK(vec8_ok(x.data, H, x.row_stride()) && vec8_ok(residual.data, H, residual.row_stride()) && aligned16(w.data),
           "one-shot all-reduce: rows must be 16-byte aligned");
  if (T == 0) return;
  OneShotParams p{};
  for (int q = 0; q < world_; ++q) {
    p.data[q] = static_cast<const __nv_bfloat16*>(shared_->data_ptr[size_t(q)]);
    p.flags[q] = static_cast<uint32_t*>(shared_->flag_ptr[size_t(q)]);
  }
  p.counter = p.flags[rank_] + kMaxRanks * kBlocks;
  p.my_data = static_cast<__nv_bfloat16*>(shared_->data_ptr[size_t(rank_)]);
  p.rank = rank_;
  p.world = world_;
  p.parity_stride = max_tokens_ * hidden_;
  p.x = x.ptr<__nv_bfloat16>();
  p.x_ld = x.row_stride();
  p.res = residual.ptr<__nv_bfloat16>();
  p.r_ld = residual.row_stride();
  p.w = w.ptr<__nv_bfloat16>();
  p.T = int(T);
  p.H = int(H);
  p.eps = eps;
  p.residual_init = residual_init ? 1 : 0;
  const int grid = int(std::min<int64_t>(T, kBlocks));
  const int threads = int(std::min<int64_t>(1024, std::max<int64_t>(32, ceil_div(H / 8, 32) * 32)));
  launch(oneshot_add_rmsnorm_kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), 0, /*pdl=*/false, p);
}

}  // namespace ts::cuda
