// Sampling on the GPU with the CPU sampler's exact semantics (ops/cpu/sample.cpp):
//   greedy (temperature <= 0): argmax, ties to the lowest id;
//   otherwise probs = exp((l - max) / T) / sum (f32 probs, f64 sum), candidates ordered by
//   (prob desc, id asc); top-k, then top-p (smallest prefix whose mass reaches top_p), then min-p
//   (prob >= min_p * max prob, at least one), then inverse CDF with sampling_uniform(seed, counter).
// Every "prefix of the sorted order" is found without sorting: a radix select over the 64-bit key
// (prob bits << 32 | ~id), which orders exactly like the CPU comparator, with per-digit
// histograms of count and mass. One block per row.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr int kSThreads = 1024;

struct ParamPtrs {
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const uint64_t* seed;
  const uint64_t* counter;
};

__device__ __forceinline__ uint64_t make_key(float p, int i) {
  return (uint64_t(__float_as_uint(p)) << 32) | uint64_t(0xffffffffu - uint32_t(i));
}
__device__ __forceinline__ int key_id(uint64_t k) { return int(0xffffffffu - uint32_t(k)); }

struct SelShared {
  int cnt[256];
  double mass[256];
  // broadcast slots
  uint64_t prefix;
  double above_mass;
  long long above_cnt;
  int found;
  double dred[32];
  float fred[32];
  int ired[32];
  uint64_t kred[32];
};

__device__ double block_sum_d(double v, SelShared& s) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) s.dred[wid] = v;
  __syncthreads();
  v = lane < nw ? s.dred[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float block_max_f(float v, SelShared& s) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) s.fred[wid] = v;
  __syncthreads();
  v = lane < nw ? s.fred[lane] : -INFINITY;
  return warp_max(v);
}

// Max / min of 64-bit keys over the block.
__device__ uint64_t block_max_key(uint64_t v, SelShared& s) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  __syncthreads();
  if (lane == 0) s.kred[wid] = v;
  __syncthreads();
  v = lane < nw ? s.kred[lane] : 0ull;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
__device__ uint64_t block_min_key(uint64_t v, SelShared& s) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  __syncthreads();
  if (lane == 0) s.kred[wid] = v;
  __syncthreads();
  v = lane < nw ? s.kred[lane] : ~0ull;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  return v;
}

enum SelMode { kRank = 0, kMassGE = 1, kMassGT = 2 };

// Finds, among candidates (key >= lo), the first element e in descending key order such that
//   kRank:   count(key > e) == R            (the element of rank R)
//   kMassGE: mass(key >= e) >= X            (cumulative mass reaches X)
//   kMassGT: mass(key >= e) >  X
// Returns its key and sets found; when no element qualifies (mass modes), found = 0.
__device__ uint64_t radix_select(const float* probs, int V, uint64_t lo, int mode, double X,
                                 long long R, SelShared& s, bool& found) {
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid == 0) {
    s.prefix = 0;
    s.above_mass = 0.0;
    s.above_cnt = 0;
    s.found = 1;
  }
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    for (int i = tid; i < 256; i += blockDim.x) {
      s.cnt[i] = 0;
      s.mass[i] = 0.0;
    }
    __syncthreads();
    const uint64_t prefix = s.prefix;
    for (int i = tid; i < V; i += blockDim.x) {
      const float p = probs[i];
      const uint64_t k = make_key(p, i);
      if (k < lo) continue;
      if (pass > 0 && (k >> (shift + 8)) != (prefix >> (shift + 8))) continue;
      const int d = int((k >> shift) & 255);
      atomicAdd(&s.cnt[d], 1);
      atomicAdd(&s.mass[d], double(p));
    }
    __syncthreads();
    // Warp 0 scans the bins from the top: lane L owns bins 255-8L .. 248-8L.
    if (tid < 32) {
      long long c_l = 0;
      double m_l = 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c_l += s.cnt[255 - 8 * lane - j];
        m_l += s.mass[255 - 8 * lane - j];
      }
      // Exclusive prefix over lanes (lane 0 = highest bins).
      long long c_ex = c_l;
      double m_ex = m_l;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        long long c = __shfl_up_sync(0xffffffffu, c_ex, o);
        double m = __shfl_up_sync(0xffffffffu, m_ex, o);
        if (lane >= o) {
          c_ex += c;
          m_ex += m;
        }
      }
      c_ex -= c_l;
      m_ex -= m_l;
      const long long ac0 = s.above_cnt;
      const double am0 = s.above_mass;
      long long ac = ac0 + c_ex;
      double am = am0 + m_ex;
      int hit = -1, last = -1;
      long long ac_hit = 0, ac_last = 0;
      double am_hit = 0.0, am_last = 0.0;
      for (int j = 0; j < 8; ++j) {
        const int bin = 255 - 8 * lane - j;
        const int c = s.cnt[bin];
        if (c == 0) continue;
        const double m = s.mass[bin];
        const bool ok = mode == kRank ? (ac + c > R) : mode == kMassGE ? (am + m >= X) : (am + m > X);
        if (ok) {
          hit = bin;
          ac_hit = ac;
          am_hit = am;
          break;
        }
        last = bin;
        ac_last = ac;
        am_last = am;
        ac += c;
        am += m;
      }
      const unsigned hits = __ballot_sync(0xffffffffu, hit >= 0);
      const unsigned lasts = __ballot_sync(0xffffffffu, last >= 0);
      if (hits) {
        const int src = __ffs(hits) - 1;  // highest bins first
        const int b = __shfl_sync(0xffffffffu, hit, src);
        const long long a = __shfl_sync(0xffffffffu, ac_hit, src);
        const double m = __shfl_sync(0xffffffffu, am_hit, src);
        if (lane == 0) {
          s.prefix |= uint64_t(b) << shift;
          s.above_cnt = a;
          s.above_mass = m;
        }
      } else if (lasts) {
        // No bin qualifies. On the first pass the target lies past every candidate; later it is
        // only rounding of the mass sums: continue in the lowest non-empty bin.
        const int src = 31 - __clz(int(lasts));  // lowest bins last
        const int b = __shfl_sync(0xffffffffu, last, src);
        const long long a = __shfl_sync(0xffffffffu, ac_last, src);
        const double m = __shfl_sync(0xffffffffu, am_last, src);
        if (lane == 0) {
          if (pass == 0) s.found = 0;
          s.prefix |= uint64_t(b) << shift;
          s.above_cnt = a;
          s.above_mass = m;
        }
      } else if (lane == 0) {
        s.found = 0;  // no candidates at all
      }
    }
    __syncthreads();
    if (!s.found) break;
  }
  __syncthreads();
  found = s.found != 0;
  const uint64_t r = s.prefix;
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kSThreads)
sample_kernel(const float* __restrict__ logits, int64_t ld, int V, ParamPtrs prm, float* probs_ws,
              int32_t* __restrict__ out) {
  __shared__ SelShared s;
  pdl_wait();
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* l = logits + int64_t(row) * ld;
  const float temp = prm.temperature[row];
  if (!(temp > 0.0f)) {
    // argmax, first (lowest id) maximum; key = (monotone float bits, ~id).
    uint64_t best = 0;
    for (int i = tid; i < V; i += blockDim.x) {
      const uint32_t u = __float_as_uint(l[i]);
      const uint32_t mono = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
      const uint64_t k = (uint64_t(mono) << 32) | uint64_t(0xffffffffu - uint32_t(i));
      best = k > best ? k : best;
    }
    best = block_max_key(best, s);
    if (tid == 0) out[row] = key_id(best);
    return;
  }
  float* probs = probs_ws + int64_t(row) * V;
  float mx = -INFINITY;
  for (int i = tid; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_max_f(mx, s);
  double sum = 0.0;
  for (int i = tid; i < V; i += blockDim.x) {
    const float e = float(exp(double((l[i] - mx) / temp)));  // correctly rounded like std::exp
    probs[i] = e;
    sum += double(e);
  }
  sum = block_sum_d(sum, s);
  for (int i = tid; i < V; i += blockDim.x) probs[i] = float(double(probs[i]) / sum);
  __syncthreads();

  const int top_k = prm.top_k[row];
  const float top_p = prm.top_p[row], min_p = prm.min_p[row];
  uint64_t lo = 0;  // candidates: key >= lo (always a prefix of the sorted order)
  bool found = false;
  if (top_k > 0 && top_k < V) lo = radix_select(probs, V, 0, kRank, 0.0, top_k - 1, s, found);
  if (top_p < 1.0f) {
    const uint64_t k = radix_select(probs, V, lo, kMassGE, double(top_p), 0, s, found);
    if (found) lo = k;
  }
  if (min_p > 0.0f) {
    uint64_t top = 0;
    for (int i = tid; i < V; i += blockDim.x) {
      const uint64_t k = make_key(probs[i], i);
      top = k > top ? k : top;
    }
    top = block_max_key(top, s);
    const float thr = min_p * __uint_as_float(uint32_t(top >> 32));
    uint64_t thr_key = uint64_t(__float_as_uint(thr)) << 32;
    if (thr_key > top) thr_key = top;  // at least one candidate
    if (thr_key > lo) lo = thr_key;
  }
  double total = 0.0;
  uint64_t last = ~0ull;
  for (int i = tid; i < V; i += blockDim.x) {
    const uint64_t k = make_key(probs[i], i);
    if (k >= lo) {
      total += double(probs[i]);
      last = k < last ? k : last;
    }
  }
  total = block_sum_d(total, s);
  last = block_min_key(last, s);
  const double u = double(uniform_draw(prm.seed[row], prm.counter[row])) * total;
  const uint64_t k = radix_select(probs, V, lo, kMassGT, u, 0, s, found);
  if (tid == 0) out[row] = key_id(found ? k : last);
}

void launch_sample(const Tensor& logits, const ParamPtrs& prm, float* probs, int32_t* out) {
  const int64_t B = logits.rows(), V = logits.size(-1);
  TS_CHECK(V > 0 && V < 0x7fffffff && B <= 0x7fffffff, "sample: bad logits shape {}",
           logits.shape_str());
  launch(sample_kernel, dim3(unsigned(B)), dim3(kSThreads), 0, true, logits.ptr<float>(),
         logits.row_stride(), int(V), prm, probs, out);
}

}  // namespace

void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out) {
  check_dev(logits, DType::f32, "sample logits");
  const int64_t B = logits.rows(), V = logits.size(-1);
  TS_CHECK(int64_t(rows.size()) == B, "sample: {} rows of params for {} logits rows", rows.size(), B);
  out.resize(size_t(B));
  if (B == 0) return;
  // One staging buffer: params (8-byte fields first), ids, then probs.
  const size_t b = size_t(B);
  // Pinned staging (reused; this call synchronises before returning): params, then the ids.
  const size_t host_bytes = b * (8 + 8 + 4 + 4 + 4 + 4);
  auto* host = static_cast<unsigned char*>(host_staging().get(host_bytes + b * 4));
  auto* seed = reinterpret_cast<uint64_t*>(host);
  auto* counter = seed + b;
  auto* temperature = reinterpret_cast<float*>(counter + b);
  auto* top_k = reinterpret_cast<int32_t*>(temperature + b);
  auto* top_p = reinterpret_cast<float*>(top_k + b);
  auto* min_p = top_p + b;
  for (size_t i = 0; i < b; ++i) {
    seed[i] = rows[i].seed;
    counter[i] = rows[i].counter;
    temperature[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    min_p[i] = rows[i].min_p;
  }
  const size_t param_bytes = (host_bytes + 255) / 256 * 256;
  const size_t id_bytes = (b * 4 + 255) / 256 * 256;
  const size_t probs_bytes = b * size_t(V) * sizeof(float);
  auto* ws = static_cast<unsigned char*>(workspace(1).get(param_bytes + id_bytes + probs_bytes));
  TS_CUDA_CHECK(cudaMemcpyAsync(ws, host, host_bytes, cudaMemcpyHostToDevice, stream()));
  ParamPtrs prm;
  prm.seed = reinterpret_cast<const uint64_t*>(ws);
  prm.counter = prm.seed + b;
  prm.temperature = reinterpret_cast<const float*>(prm.counter + b);
  prm.top_k = reinterpret_cast<const int32_t*>(prm.temperature + b);
  prm.top_p = reinterpret_cast<const float*>(prm.top_k + b);
  prm.min_p = prm.top_p + b;
  int32_t* ids = reinterpret_cast<int32_t*>(ws + param_bytes);
  float* probs = reinterpret_cast<float*>(ws + param_bytes + id_bytes);
  launch_sample(logits, prm, probs, ids);
  int32_t* host_ids = reinterpret_cast<int32_t*>(host + host_bytes);
  TS_CUDA_CHECK(cudaMemcpyAsync(host_ids, ids, b * 4, cudaMemcpyDeviceToHost, stream()));
  TS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  std::copy(host_ids, host_ids + b, out.begin());
}

void sample_device(const Tensor& logits, const DeviceSamplingParams& p, Tensor& out_ids) {
  check_dev(logits, DType::f32, "sample_device logits");
  check_dev(out_ids, DType::i32, "sample_device out_ids");
  check_dev(p.temperature, DType::f32, "sample_device temperature");
  check_dev(p.top_k, DType::i32, "sample_device top_k");
  check_dev(p.top_p, DType::f32, "sample_device top_p");
  check_dev(p.min_p, DType::f32, "sample_device min_p");
  check_dev(p.seed, DType::i64, "sample_device seed");
  check_dev(p.counter, DType::i64, "sample_device counter");
  const int64_t B = logits.rows(), V = logits.size(-1);
  for (const Tensor* t : {&p.temperature, &p.top_k, &p.top_p, &p.min_p, &p.seed, &p.counter,
                          static_cast<const Tensor*>(&out_ids)})
    TS_CHECK(t->numel() >= B && t->is_contiguous(), "sample_device: parameter arrays need {} entries",
             B);
  if (B == 0) return;
  float* probs = static_cast<float*>(workspace(1).get(size_t(B) * size_t(V) * sizeof(float)));
  ParamPtrs prm;
  prm.temperature = p.temperature.ptr<float>();
  prm.top_k = p.top_k.ptr<int32_t>();
  prm.top_p = p.top_p.ptr<float>();
  prm.min_p = p.min_p.ptr<float>();
  prm.seed = p.seed.ptr<uint64_t>();
  prm.counter = p.counter.ptr<uint64_t>();
  launch_sample(logits, prm, probs, out_ids.ptr<int32_t>());
}

}  // namespace ts::ops::cuda
