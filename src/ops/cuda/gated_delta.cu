// Gated DeltaNet (Qwen3.5 linear attention) on the GPU: causal conv with its carried window, the
// delta rule's gates, the recurrent delta rule, the gated output norm and the attention output
// gate. Semantics: ops.h; reference: ops/cpu/gated_delta.cpp.
// First versions, correctness first: the delta rule is the recurrent form, one block per
// (value head, sequence) walking the sequence's tokens in order with the [dk, dv] f32 state in
// shared memory (thread j owns column j). Prefill of long chunks is therefore sequential per
// head; the chunked (WY) form is the next step. Launched without PDL.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr int kMaxConvKernel = 8;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Rows [cu_q[S], T) belong to no sequence (graph padding): zero them. Called by the extra
// blockIdx.y == S row of blocks; `cols` columns per row starting at col0 (thread-strided).
__device__ __forceinline__ void zero_tail(__nv_bfloat16* out, int64_t ld, const int32_t* cu, int S, int T, int col) {
  for (int r = cu[S]; r < T; ++r) out[int64_t(r) * ld + col] = __float2bfloat16(0.0f);
}

// grid (ceil(C / 128), S + 1), block 128: thread = one channel of one sequence.
__global__ void causal_conv1d_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, const __nv_bfloat16* __restrict__ w,
                                     __nv_bfloat16* state, const int32_t* __restrict__ slots,
                                     const int32_t* __restrict__ cu, const int32_t* __restrict__ kv_len,
                                     __nv_bfloat16* __restrict__ out, int64_t out_ld, int C, int K, int S, int T) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int b = blockIdx.y;
  if (b == S) {
    zero_tail(out, out_ld, cu, S, T, c);
    return;
  }
  const int row0 = cu[b], q_len = cu[b + 1] - row0, hist = K - 1;
  if (q_len == 0) return;
  const int slot = slots[b];
  const bool carry = slot >= 0 && kv_len[b] - q_len > 0;
  __nv_bfloat16* st = slot >= 0 ? state + int64_t(slot) * hist * C : nullptr;
  float win[kMaxConvKernel], wc[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    win[j] = (j < hist && carry) ? __bfloat162float(st[int64_t(j) * C + c]) : 0.0f;
    wc[j] = j < K ? __bfloat162float(w[int64_t(c) * K + j]) : 0.0f;
  }
  for (int i = 0; i < q_len; ++i) {
    const float xi = __bfloat162float(x[int64_t(row0 + i) * x_ld + c]);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < hist) acc += wc[j] * win[j];
    // wc[hist] multiplies the newest input; read it through the unrolled loop (no dynamic index).
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j == hist) acc += wc[j] * xi;
    out[int64_t(row0 + i) * out_ld + c] = __float2bfloat16(silu_f(acc));
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j)
      if (j < hist) win[j] = (j + 1 < hist) ? win[j + 1] : xi;
  }
  if (st) {
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < hist) st[int64_t(j) * C + c] = __float2bfloat16(win[j]);
  }
}

__global__ void gdn_gates_kernel(const __nv_bfloat16* __restrict__ a, int64_t a_ld, const __nv_bfloat16* __restrict__ b,
                                 int64_t b_ld, const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                 float* __restrict__ g, int64_t g_ld, float* __restrict__ beta, int64_t beta_ld, int T,
                                 int nv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * nv) return;
  const int64_t t = i / nv;
  const int h = int(i % nv);
  const float x = __bfloat162float(a[t * a_ld + h]) + dt_bias[h];
  const float sp = x > 20.0f ? x : log1pf(expf(x));  // torch softplus, threshold 20
  g[t * g_ld + h] = -expf(A_log[h]) * sp;
  beta[t * beta_ld + h] = 1.0f / (1.0f + expf(-__bfloat162float(b[t * b_ld + h])));
}

struct DeltaArgs {
  const __nv_bfloat16 *q, *k, *v;
  int64_t q_s0, q_s1, k_s0, k_s1, v_s0, v_s1;
  const float *g, *beta;
  int64_t g_ld, beta_ld;
  float* state;  // [slots, nv, dk, dv]
  const int32_t *slots, *cu, *kv_len;
  __nv_bfloat16* out;
  int64_t o_s0, o_s1;
  int nk, nv, dk, dv, S, T;
  float q_scale;
};

// grid (nv, S + 1), block >= dv (multiple of 32); dynamic smem: dk * dv + 2 * dk + 2 floats.
__global__ void gated_delta_rule_kernel(DeltaArgs p) {
  extern __shared__ float smem[];
  float* Sm = smem;                  // [dk, dv]
  float* qs = Sm + p.dk * p.dv;      // [dk]
  float* ks = qs + p.dk;             // [dk]
  float* inv = ks + p.dk;            // [2]: q (with the 1/sqrt(dk) scale), k
  const int h = blockIdx.x, b = blockIdx.y, j = threadIdx.x;
  if (b == p.S) {
    if (j < p.dv)
      for (int r = p.cu[p.S]; r < p.T; ++r) p.out[r * p.o_s0 + h * p.o_s1 + j] = __float2bfloat16(0.0f);
    return;
  }
  const int row0 = p.cu[b], q_len = p.cu[b + 1] - row0;
  if (q_len == 0) return;
  const int slot = p.slots[b];
  const bool carry = slot >= 0 && p.kv_len[b] - q_len > 0;
  const int hk = h / (p.nv / p.nk);
  float* st = slot >= 0 ? p.state + (int64_t(slot) * p.nv + h) * p.dk * p.dv : nullptr;
  if (j < p.dv)
    for (int a = 0; a < p.dk; ++a) Sm[a * p.dv + j] = carry ? st[int64_t(a) * p.dv + j] : 0.0f;
  for (int i = 0; i < q_len; ++i) {
    const int64_t r = row0 + i;
    __syncthreads();  // the previous token's readers of qs/ks are done
    for (int a = threadIdx.x; a < p.dk; a += blockDim.x) {
      qs[a] = __bfloat162float(p.q[r * p.q_s0 + hk * p.q_s1 + a]);
      ks[a] = __bfloat162float(p.k[r * p.k_s0 + hk * p.k_s1 + a]);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      float sq = 0.0f, sk = 0.0f;
      for (int a = threadIdx.x; a < p.dk; a += 32) {
        sq += qs[a] * qs[a];
        sk += ks[a] * ks[a];
      }
      sq = warp_sum(sq);
      sk = warp_sum(sk);
      if (threadIdx.x == 0) {
        inv[0] = rsqrtf(sq + 1e-6f) * p.q_scale;
        inv[1] = rsqrtf(sk + 1e-6f);
      }
    }
    __syncthreads();
    if (j < p.dv) {
      const float decay = __expf(p.g[r * p.g_ld + h]), bt = p.beta[r * p.beta_ld + h];
      const float iq = inv[0], ik = inv[1];
      float mem = 0.0f;
      for (int a = 0; a < p.dk; ++a) {
        const float s = Sm[a * p.dv + j] * decay;
        Sm[a * p.dv + j] = s;
        mem += s * (ks[a] * ik);
      }
      const float delta = bt * (__bfloat162float(p.v[r * p.v_s0 + h * p.v_s1 + j]) - mem);
      float o = 0.0f;
      for (int a = 0; a < p.dk; ++a) {
        const float s = Sm[a * p.dv + j] + (ks[a] * ik) * delta;
        Sm[a * p.dv + j] = s;
        o += s * (qs[a] * iq);
      }
      p.out[r * p.o_s0 + h * p.o_s1 + j] = __float2bfloat16(o);
    }
  }
  if (st && j < p.dv)
    for (int a = 0; a < p.dk; ++a) st[int64_t(a) * p.dv + j] = Sm[a * p.dv + j];
}

// One warp per (row, head): out = x / rms(x) * w * silu(z).
__global__ void rmsnorm_gated_kernel(const __nv_bfloat16* x, int64_t x_s0, int64_t x_s1, const __nv_bfloat16* __restrict__ z,
                                     int64_t z_s0, int64_t z_s1, const __nv_bfloat16* __restrict__ w, __nv_bfloat16* out,
                                     int64_t o_s0, int64_t o_s1, int T, int nh, int d, float eps) {
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (item >= int64_t(T) * nh) return;
  const int64_t t = item / nh, h = item % nh;
  const __nv_bfloat16* xr = x + t * x_s0 + h * x_s1;
  const __nv_bfloat16* zr = z + t * z_s0 + h * z_s1;
  __nv_bfloat16* o = out + t * o_s0 + h * o_s1;
  float ss = 0.0f;
  for (int i = lane; i < d; i += 32) {
    const float f = __bfloat162float(xr[i]);
    ss += f * f;
  }
  const float inv = rsqrtf(warp_sum(ss) / float(d) + eps);
  __syncwarp();  // every lane has read x before any lane overwrites it (out may alias x)
  for (int i = lane; i < d; i += 32) {
    const float f = __bfloat162float(xr[i]) * inv * __bfloat162float(w[i]);
    o[i] = __float2bfloat16(f * silu_f(__bfloat162float(zr[i])));
  }
}

__global__ void sigmoid_gate_kernel(__nv_bfloat16* x, int64_t x_ld, const __nv_bfloat16* __restrict__ gate, int64_t g_ld,
                                    int64_t T, int N) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * N) return;
  const int64_t t = i / N, c = i % N;
  const float v = __bfloat162float(x[t * x_ld + c]) * sigmoid_f(__bfloat162float(gate[t * g_ld + c]));
  x[t * x_ld + c] = __float2bfloat16(v);
}

const __nv_bfloat16* bf(const Tensor& t) { return static_cast<const __nv_bfloat16*>(t.data); }
__nv_bfloat16* bf_mut(Tensor& t) { return static_cast<__nv_bfloat16*>(t.data); }
const int32_t* i32p(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

}  // namespace

void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots, const AttnMeta& m,
                   Tensor& out) {
  check_dev(x, DType::bf16, "causal_conv1d x");
  check_dev(w, DType::bf16, "causal_conv1d w");
  check_dev(conv_state, DType::bf16, "causal_conv1d conv_state");
  check_dev(out, DType::bf16, "causal_conv1d out");
  const int64_t T = x.rows(), C = x.size(-1), K = w.size(1);
  TS_CHECK(w.size(0) == C && out.size(-1) == C && out.rows() == T, "causal_conv1d: x {} w {} out {}", x.shape_str(),
           w.shape_str(), out.shape_str());
  TS_CHECK(K >= 2 && K <= kMaxConvKernel, "causal_conv1d: kernel size {} outside 2..{}", K, kMaxConvKernel);
  TS_CHECK(conv_state.ndim == 3 && conv_state.size(1) == K - 1 && conv_state.size(2) == C,
           "causal_conv1d: conv_state {} for kernel {} over {} channels", conv_state.shape_str(), K, C);
  TS_CHECK(w.is_contiguous() && conv_state.is_contiguous(), "causal_conv1d: w and conv_state must be contiguous");
  if (T == 0 || m.num_seqs == 0) return;
  launch(causal_conv1d_kernel, dim3(unsigned(ceil_div(C, 128)), unsigned(m.num_seqs + 1)), dim3(128), 0, false, bf(x),
         x.row_stride(), bf(w), bf_mut(conv_state), i32p(state_slots), i32p(m.cu_q), i32p(m.kv_len), bf_mut(out),
         out.row_stride(), int(C), int(K), m.num_seqs, int(T));
}

void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g, Tensor& beta) {
  check_dev(a, DType::bf16, "gdn_gates a");
  check_dev(b, DType::bf16, "gdn_gates b");
  check_dev(A_log, DType::f32, "gdn_gates A_log");
  check_dev(dt_bias, DType::f32, "gdn_gates dt_bias");
  check_dev(g, DType::f32, "gdn_gates g");
  check_dev(beta, DType::f32, "gdn_gates beta");
  const int64_t T = a.rows(), nv = a.size(-1);
  TS_CHECK(b.rows() == T && b.size(-1) == nv && A_log.numel() == nv && dt_bias.numel() == nv && g.rows() == T &&
               g.size(-1) == nv && beta.rows() == T && beta.size(-1) == nv,
           "gdn_gates: a {} b {} g {} beta {}", a.shape_str(), b.shape_str(), g.shape_str(), beta.shape_str());
  if (T == 0) return;
  const int64_t n = T * nv;
  launch(gdn_gates_kernel, dim3(unsigned(ceil_div(n, 256))), dim3(256), 0, false, bf(a), a.row_stride(), bf(b),
         b.row_stride(), static_cast<const float*>(A_log.data), static_cast<const float*>(dt_bias.data),
         static_cast<float*>(g.data), g.row_stride(), static_cast<float*>(beta.data), beta.row_stride(), int(T), int(nv));
}

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& m, Tensor& out) {
  check_dev(q, DType::bf16, "gated_delta_rule q");
  check_dev(k, DType::bf16, "gated_delta_rule k");
  check_dev(v, DType::bf16, "gated_delta_rule v");
  check_dev(g, DType::f32, "gated_delta_rule g");
  check_dev(beta, DType::f32, "gated_delta_rule beta");
  check_dev(state, DType::f32, "gated_delta_rule state");
  check_dev(out, DType::bf16, "gated_delta_rule out");
  const int64_t T = q.size(0), nk = q.size(1), dk = q.size(2), nv = v.size(1), dv = v.size(2);
  TS_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && k.size(0) == T && v.size(0) == T &&
               k.size(1) == nk && k.size(2) == dk && nv % nk == 0 && out.size(0) == T && out.size(1) == nv &&
               out.size(2) == dv && q.stride[2] == 1 && k.stride[2] == 1 && v.stride[2] == 1 && out.stride[2] == 1,
           "gated_delta_rule: q {} k {} v {} out {}", q.shape_str(), k.shape_str(), v.shape_str(), out.shape_str());
  TS_CHECK(state.ndim == 4 && state.size(1) == nv && state.size(2) == dk && state.size(3) == dv && state.is_contiguous(),
           "gated_delta_rule: state {} for {} heads of {} x {}", state.shape_str(), nv, dk, dv);
  TS_CHECK(dv <= 1024, "gated_delta_rule: value head dim {} above 1024", dv);
  if (T == 0 || m.num_seqs == 0) return;
  DeltaArgs p;
  p.q = bf(q);
  p.k = bf(k);
  p.v = bf(v);
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.k_s0 = k.stride[0];
  p.k_s1 = k.stride[1];
  p.v_s0 = v.stride[0];
  p.v_s1 = v.stride[1];
  p.g = static_cast<const float*>(g.data);
  p.beta = static_cast<const float*>(beta.data);
  p.g_ld = g.row_stride();
  p.beta_ld = beta.row_stride();
  p.state = static_cast<float*>(state.data);
  p.slots = i32p(state_slots);
  p.cu = i32p(m.cu_q);
  p.kv_len = i32p(m.kv_len);
  p.out = bf_mut(out);
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.nk = int(nk);
  p.nv = int(nv);
  p.dk = int(dk);
  p.dv = int(dv);
  p.S = m.num_seqs;
  p.T = int(T);
  p.q_scale = float(1.0 / std::sqrt(double(dk)));
  const int threads = int(std::max<int64_t>(32, ceil_div(dv, 32) * 32));
  const size_t smem = size_t(dk * dv + 2 * dk + 2) * sizeof(float);
  set_smem(gated_delta_rule_kernel, smem);
  launch(gated_delta_rule_kernel, dim3(unsigned(nv), unsigned(m.num_seqs + 1)), dim3(unsigned(threads)), smem, false, p);
}

void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  check_dev(x, DType::bf16, "rmsnorm_gated x");
  check_dev(z, DType::bf16, "rmsnorm_gated z");
  check_dev(w, DType::bf16, "rmsnorm_gated w");
  check_dev(out, DType::bf16, "rmsnorm_gated out");
  const int64_t T = x.size(0), nh = x.size(1), d = x.size(2);
  TS_CHECK(x.ndim == 3 && z.ndim == 3 && out.ndim == 3 && z.size(0) == T && z.size(1) == nh && z.size(2) == d &&
               out.size(0) == T && out.size(1) == nh && out.size(2) == d && w.numel() == d,
           "rmsnorm_gated: x {} z {} w {} out {}", x.shape_str(), z.shape_str(), w.shape_str(), out.shape_str());
  if (T == 0) return;
  const int64_t warps = T * nh;
  launch(rmsnorm_gated_kernel, dim3(unsigned(ceil_div(warps, 4))), dim3(128), 0, false, bf(x), x.stride[0], x.stride[1],
         bf(z), z.stride[0], z.stride[1], bf(w), bf_mut(out), out.stride[0], out.stride[1], int(T), int(nh), int(d), eps);
}

void sigmoid_gate(Tensor& x, const Tensor& gate) {
  check_dev(x, DType::bf16, "sigmoid_gate x");
  check_dev(gate, DType::bf16, "sigmoid_gate gate");
  const int64_t T = x.rows(), N = x.size(-1);
  TS_CHECK(gate.rows() == T && gate.size(-1) == N, "sigmoid_gate: x {} gate {}", x.shape_str(), gate.shape_str());
  if (T == 0) return;
  launch(sigmoid_gate_kernel, dim3(unsigned(ceil_div(T * N, 256))), dim3(256), 0, false, bf_mut(x), x.row_stride(), bf(gate),
         gate.row_stride(), T, int(N));
}

}  // namespace ts::ops::cuda
