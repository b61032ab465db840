// Expert-parallel dispatch / combine kernels (contract: ops/moe_dispatch.h; CPU reference:
// ops/cpu/moe_dispatch.cpp). Positions come from warp scans in token order, never from atomics,
// so every run places every row identically. Invalid expert ids (outside [0, E)) are skipped on
// the GPU (their positions stay -1) where the CPU reference raises.
//
// ep_plan: one warp per destination rank walks the tokens 32 at a time (ballot + shuffle scans);
// a first pass counts, a second places (its offsets are the lower ranks' counts). T x k reads
// per rank: cheap next to the all-to-all it feeds, and launch-bound at decode sizes.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/moe_dispatch.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kMaxRanks = 1024;

dim3 row_grid(int64_t rows, int64_t units) {
  TS_CHECK(rows <= 0x7fffffff, "cuda op: too many rows ({})", rows);
  int64_t y = ceil_div(units, kThreads);
  y = std::clamp<int64_t>(y, 1, 65535);
  return dim3(unsigned(rows), unsigned(y));
}

struct PlanArgs {
  const int32_t* ids;
  int64_t ids_ld;
  int T, k, R;
  int per;  // experts per rank
  int E;
  int32_t* counts;  // [2, R]
  int32_t* row_pos;
  int32_t* slot_pos;  // [T, k] contiguous
  int32_t* row_token;
};

// Slots of token t owned by rank r, and whether t has one.
__device__ __forceinline__ int slots_of(const PlanArgs& a, int t, int r) {
  if (t >= a.T) return 0;
  int n = 0;
  for (int j = 0; j < a.k; ++j) {
    const int e = a.ids[int64_t(t) * a.ids_ld + j];
    n += (e >= 0 && e < a.E && e / a.per == r) ? 1 : 0;
  }
  return n;
}

__device__ __forceinline__ int warp_excl_scan(int v, int lane, int& total) {
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += u;
  }
  total = __shfl_sync(kFull, inc, 31);
  return inc - v;
}

__global__ void ep_count_kernel(PlanArgs a) {
  pdl_wait();
  const int r = blockIdx.x, lane = threadIdx.x;
  int rows = 0, slots = 0;
  for (int base = 0; base < a.T; base += 32) {
    const int n = slots_of(a, base + lane, r);
    rows += __popc(__ballot_sync(kFull, n > 0));
    int tot = 0;
    warp_excl_scan(n, lane, tot);
    slots += tot;
  }
  if (lane == 0) {
    a.counts[r] = rows;
    a.counts[a.R + r] = slots;
  }
}

__global__ void ep_place_kernel(PlanArgs a) {
  pdl_wait();
  const int r = blockIdx.x, lane = threadIdx.x;
  int row_base = 0, slot_base = 0;
  for (int q = lane; q < r; q += 32) {
    row_base += a.counts[q];
    slot_base += a.counts[a.R + q];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    row_base += __shfl_xor_sync(kFull, row_base, o);
    slot_base += __shfl_xor_sync(kFull, slot_base, o);
  }
  for (int base = 0; base < a.T; base += 32) {
    const int t = base + lane;
    const int n = slots_of(a, t, r);
    const unsigned has = __ballot_sync(kFull, n > 0);
    const int row = row_base + __popc(has & ((1u << lane) - 1u));
    int tot = 0;
    int s = slot_base + warp_excl_scan(n, lane, tot);
    if (n > 0) {
      bool first = true;
      for (int j = 0; j < a.k; ++j) {
        const int e = a.ids[int64_t(t) * a.ids_ld + j];
        if (!(e >= 0 && e < a.E && e / a.per == r)) continue;
        a.slot_pos[int64_t(t) * a.k + j] = s++;
        a.row_pos[int64_t(t) * a.k + j] = first ? row : -1;
        first = false;
      }
      a.row_token[row] = t;
    }
    row_base += __popc(has);
    slot_base += tot;
  }
}

// Send row p: its destination from the counts, the token's row and its slot metadata.
template <typename U>
__global__ void ep_pack_kernel(const char* __restrict__ x, int64_t x_ld_bytes, const int32_t* __restrict__ ids,
                               int64_t ids_ld, const float* __restrict__ w, int64_t w_ld,
                               const int32_t* __restrict__ row_token, const int32_t* __restrict__ counts, int R, int per,
                               int k, char* __restrict__ sx, int64_t sx_ld_bytes, int32_t* __restrict__ sids,
                               int64_t sids_ld, float* __restrict__ sw, int64_t sw_ld, int64_t row_bytes) {
  pdl_wait();
  __shared__ int s_dest;
  const int64_t p = blockIdx.x;
  if (threadIdx.x == 0) {
    int off = 0, r = 0;
    for (; r < R; ++r) {
      off += counts[r];
      if (p < off) break;
    }
    s_dest = r;
  }
  __syncthreads();
  const int r = s_dest;
  const int64_t t = row_token[p];
  const U* src = reinterpret_cast<const U*>(x + t * x_ld_bytes);
  U* dst = reinterpret_cast<U*>(sx + p * sx_ld_bytes);
  const int64_t n = row_bytes / int64_t(sizeof(U));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int e = ids[t * ids_ld + j];
    sids[p * sids_ld + j] = (e >= 0 && e / per == r) ? e - r * per : -1;
    sw[p * sw_ld + j] = w[t * w_ld + j];
  }
}

// One block walks the rows a tile at a time: per-row valid counts, a block scan, then the rows'
// expanded entries in (row, slot) order.
__global__ void __launch_bounds__(1024) ep_expand_kernel(const int32_t* __restrict__ ids, int64_t ids_ld, int N, int k,
                                                         int32_t* __restrict__ exp_row, int32_t* __restrict__ exp_id,
                                                         float* __restrict__ exp_w, int32_t* __restrict__ exp_pos,
                                                         int64_t pos_ld, int M) {
  pdl_wait();
  __shared__ int warp_tot[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int base = 0;
  for (int tile = 0; tile < N; tile += blockDim.x) {
    const int n = tile + threadIdx.x;
    int c = 0;
    if (n < N)
      for (int j = 0; j < k; ++j) c += ids[int64_t(n) * ids_ld + j] >= 0 ? 1 : 0;
    int wtot = 0;
    const int wex = warp_excl_scan(c, lane, wtot);
    if (lane == 0) warp_tot[wid] = wtot;
    __syncthreads();
    int before = 0, all = 0;
    for (int q = 0; q < nw; ++q) {
      if (q < wid) before += warp_tot[q];
      all += warp_tot[q];
    }
    int m = base + before + wex;
    if (n < N)
      for (int j = 0; j < k; ++j) {
        const int e = ids[int64_t(n) * ids_ld + j];
        if (e < 0 || m >= M) {
          exp_pos[int64_t(n) * pos_ld + j] = -1;
          continue;
        }
        exp_row[m] = n;
        exp_id[m] = e;
        exp_w[m] = 1.0f;
        exp_pos[int64_t(n) * pos_ld + j] = m++;
      }
    base += all;
    __syncthreads();  // warp_tot is rewritten by the next tile
  }
}

template <bool VEC>
__global__ void ep_fold_bf16_kernel(const __nv_bfloat16* __restrict__ y, int64_t y_ld, const int32_t* __restrict__ pos,
                                    int64_t pos_ld, const float* __restrict__ w, int64_t w_ld, int k,
                                    __nv_bfloat16* __restrict__ out, int64_t out_ld, int H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __nv_bfloat16* o = out + t * out_ld;
  if (VEC) {
    const int nv = H / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < k; ++j) {
        const int p = pos[t * pos_ld + j];
        if (p < 0) continue;
        const float wt = w ? w[t * w_ld + j] : 1.0f;
        BF8 v;
        v.u = reinterpret_cast<const uint4*>(y + int64_t(p) * y_ld)[i];
        float f[8];
        bf8_to_f32(v, f);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[q] += f[q] * wt;
      }
      reinterpret_cast<uint4*>(o)[i] = f32_to_bf8(acc).u;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int p = pos[t * pos_ld + j];
        if (p < 0) continue;
        acc += __bfloat162float(y[int64_t(p) * y_ld + i]) * (w ? w[t * w_ld + j] : 1.0f);
      }
      o[i] = __float2bfloat16(acc);
    }
  }
}

__global__ void ep_fold_f32_kernel(const float* __restrict__ y, int64_t y_ld, const int32_t* __restrict__ pos,
                                   int64_t pos_ld, const float* __restrict__ w, int64_t w_ld, int k,
                                   float* __restrict__ out, int64_t out_ld, int H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int p = pos[t * pos_ld + j];
      if (p < 0) continue;
      acc += y[int64_t(p) * y_ld + i] * (w ? w[t * w_ld + j] : 1.0f);
    }
    out[t * out_ld + i] = acc;
  }
}

__global__ void ep_local_ids_kernel(const int32_t* __restrict__ ids, int64_t ids_ld, int64_t T, int k, int e0, int n,
                                    int32_t* __restrict__ out, int64_t out_ld) {
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T * k; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / k, j = i % k;
    const int e = ids[t * ids_ld + j];
    out[t * out_ld + j] = (e >= e0 && e < e0 + n) ? e - e0 : -1;
  }
}

}  // namespace

void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token) {
  check_dev(ids, DType::i32, "ep_plan ids");
  check_dev(counts, DType::i32, "ep_plan counts");
  check_dev(row_pos, DType::i32, "ep_plan row_pos");
  check_dev(slot_pos, DType::i32, "ep_plan slot_pos");
  check_dev(row_token, DType::i32, "ep_plan row_token");
  const int64_t T = ids.rows(), k = ids.size(-1), R = ranks;
  TS_CHECK(R >= 1 && R <= kMaxRanks && experts >= 1 && experts % R == 0 && experts < (int64_t(1) << 30),
           "ep_plan: {} experts over {} ranks", experts, R);
  TS_CHECK(counts.is_contiguous() && counts.numel() == 2 * R, "ep_plan: counts {} for {} ranks", counts.shape_str(), R);
  TS_CHECK(row_pos.is_contiguous() && slot_pos.is_contiguous() && row_pos.rows() == T && row_pos.size(-1) == k &&
               slot_pos.rows() == T && slot_pos.size(-1) == k,
           "ep_plan: ids {} row_pos {} slot_pos {} (contiguous)", ids.shape_str(), row_pos.shape_str(),
           slot_pos.shape_str());
  TS_CHECK(row_token.numel() >= T * std::min<int64_t>(k, R) && T < (int64_t(1) << 30), "ep_plan: row_token {} for {} tokens",
           row_token.shape_str(), T);
  PlanArgs a{};
  a.ids = ids.ptr<int32_t>();
  a.ids_ld = T ? ids.row_stride() : 0;
  a.T = int(T);
  a.k = int(k);
  a.R = int(R);
  a.per = int(experts / R);
  a.E = int(experts);
  a.counts = counts.ptr<int32_t>();
  a.row_pos = row_pos.ptr<int32_t>();
  a.slot_pos = slot_pos.ptr<int32_t>();
  a.row_token = row_token.ptr<int32_t>();
  if (T > 0) {
    // Slots with invalid ids keep -1.
    TS_CUDA_CHECK(cudaMemsetAsync(row_pos.data, 0xff, row_pos.nbytes(), stream()));
    TS_CUDA_CHECK(cudaMemsetAsync(slot_pos.data, 0xff, slot_pos.nbytes(), stream()));
  }
  launch(ep_count_kernel, dim3(unsigned(R)), dim3(32), 0, true, a);
  if (T > 0) launch(ep_place_kernel, dim3(unsigned(R)), dim3(32), 0, true, a);
}

void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w) {
  TS_CHECK(x.device == Device::cuda && send_x.device == Device::cuda && x.dtype == send_x.dtype,
           "ep_pack: x and send_x must be GPU tensors of one dtype");
  check_dev(ids, DType::i32, "ep_pack ids");
  check_dev(weights, DType::f32, "ep_pack weights");
  check_dev(row_token, DType::i32, "ep_pack row_token");
  check_dev(counts, DType::i32, "ep_pack counts");
  check_dev(send_ids, DType::i32, "ep_pack send_ids");
  check_dev(send_w, DType::f32, "ep_pack send_w");
  const int64_t R = counts.numel() / 2, k = ids.size(-1), S = send_x.rows(), H = x.size(-1);
  TS_CHECK(R >= 1 && R <= kMaxRanks && experts % R == 0, "ep_pack: {} experts over {} ranks", experts, R);
  TS_CHECK(send_ids.rows() == S && send_w.rows() == S && send_ids.size(-1) == k && send_w.size(-1) == k &&
               send_x.size(-1) == H && weights.rows() == ids.rows() && weights.size(-1) == k && row_token.numel() >= S,
           "ep_pack: send_x {} send_ids {} send_w {} (x {}, ids {})", send_x.shape_str(), send_ids.shape_str(),
           send_w.shape_str(), x.shape_str(), ids.shape_str());
  if (S == 0) return;
  TS_CHECK(S <= 0x7fffffff, "ep_pack: {} rows", S);
  const size_t es = dtype_size(x.dtype);
  const int64_t rb = H * int64_t(es), xld = x.row_stride() * int64_t(es), sld = send_x.row_stride() * int64_t(es);
  auto go = [&](auto unit) {
    using U = decltype(unit);
    launch(ep_pack_kernel<U>, dim3(unsigned(S)), dim3(128), 0, true, static_cast<const char*>(x.data), xld,
           ids.ptr<int32_t>(), ids.row_stride(), weights.ptr<float>(), weights.row_stride(), row_token.ptr<int32_t>(),
           counts.ptr<int32_t>(), int(R), int(experts / R), int(k), static_cast<char*>(send_x.data), sld,
           send_ids.ptr<int32_t>(), send_ids.row_stride(), send_w.ptr<float>(), send_w.row_stride(), rb);
  };
  const bool a16 = aligned16(x.data) && aligned16(send_x.data) && rb % 16 == 0 && xld % 16 == 0 && sld % 16 == 0;
  if (a16) go(uint4{});
  else if (rb % 4 == 0 && xld % 4 == 0 && sld % 4 == 0) go(uint32_t{});
  else go(uint16_t{});
}

void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos) {
  check_dev(ids, DType::i32, "ep_expand ids");
  check_dev(exp_row, DType::i32, "ep_expand exp_row");
  check_dev(exp_id, DType::i32, "ep_expand exp_id");
  check_dev(exp_w, DType::f32, "ep_expand exp_w");
  check_dev(exp_pos, DType::i32, "ep_expand exp_pos");
  const int64_t N = ids.rows(), k = ids.size(-1), M = exp_row.numel();
  TS_CHECK(exp_pos.rows() == N && exp_pos.size(-1) == k && exp_id.numel() == M && exp_w.numel() == M &&
               N < (int64_t(1) << 30) && M < (int64_t(1) << 30),
           "ep_expand: ids {} exp_pos {} exp_row {} exp_id {} exp_w {}", ids.shape_str(), exp_pos.shape_str(),
           exp_row.shape_str(), exp_id.shape_str(), exp_w.shape_str());
  if (N == 0) return;
  launch(ep_expand_kernel, dim3(1), dim3(1024), 0, true, ids.ptr<int32_t>(), ids.row_stride(), int(N), int(k),
         exp_row.ptr<int32_t>(), exp_id.ptr<int32_t>(), exp_w.ptr<float>(), exp_pos.ptr<int32_t>(), exp_pos.row_stride(),
         int(M));
}

void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out) {
  check_dev(pos, DType::i32, "ep_fold pos");
  TS_CHECK(y.device == Device::cuda && out.device == Device::cuda && y.dtype == out.dtype &&
               (y.dtype == DType::bf16 || y.dtype == DType::f32),
           "ep_fold: y and out must be bf16 or f32 GPU tensors of one dtype");
  if (weights) check_dev(*weights, DType::f32, "ep_fold weights");
  const int64_t T = out.rows(), H = out.size(-1), k = pos.size(-1);
  TS_CHECK(pos.rows() == T && (y.rows() == 0 || y.size(-1) == H) &&
               (!weights || (weights->rows() == T && weights->size(-1) == k)),
           "ep_fold: y {} pos {} out {}", y.shape_str(), pos.shape_str(), out.shape_str());
  if (T == 0 || H == 0) return;
  const float* w = weights ? weights->ptr<float>() : nullptr;
  const int64_t wld = weights ? weights->row_stride() : 0, yld = y.rows() ? y.row_stride() : 0;
  if (y.dtype == DType::f32) {
    launch(ep_fold_f32_kernel, row_grid(T, H), dim3(kThreads), 0, true, y.ptr<float>(), yld, pos.ptr<int32_t>(),
           pos.row_stride(), w, wld, int(k), out.ptr<float>(), out.row_stride(), int(H));
    return;
  }
  const bool vec = vec8_ok(out.data, H, out.row_stride()) && (y.rows() == 0 || vec8_ok(y.data, H, yld));
  if (vec)
    launch(ep_fold_bf16_kernel<true>, row_grid(T, H / 8), dim3(kThreads), 0, true, y.ptr<__nv_bfloat16>(), yld,
           pos.ptr<int32_t>(), pos.row_stride(), w, wld, int(k), out.ptr<__nv_bfloat16>(), out.row_stride(), int(H));
  else
    launch(ep_fold_bf16_kernel<false>, row_grid(T, H), dim3(kThreads), 0, true, y.ptr<__nv_bfloat16>(), yld,
           pos.ptr<int32_t>(), pos.row_stride(), w, wld, int(k), out.ptr<__nv_bfloat16>(), out.row_stride(), int(H));
}

void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local) {
  check_dev(ids, DType::i32, "ep_local_ids ids");
  check_dev(local, DType::i32, "ep_local_ids local");
  const int64_t T = ids.rows(), k = ids.size(-1);
  TS_CHECK(local.rows() == T && local.size(-1) == k, "ep_local_ids: ids {} local {}", ids.shape_str(), local.shape_str());
  if (T == 0) return;
  const int64_t total = T * k;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(total, kThreads), 4096));
  launch(ep_local_ids_kernel, dim3(blocks), dim3(kThreads), 0, true, ids.ptr<int32_t>(), ids.row_stride(), T, int(k),
         int(e0), int(n), local.ptr<int32_t>(), local.row_stride());
}

}  // namespace ts::ops::cuda
