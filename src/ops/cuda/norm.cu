// RMSNorm family and RoPE: rmsnorm, fused_add_rmsnorm, rmsnorm_pair, qk_norm_rope, rope.
// One block per row for the norms (two passes over the row; the second hits L1/L2), one warp per
// head for the per-head norm + rotary kernel. All launched with PDL.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_helpers.cuh"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

struct NormJob {
  const __nv_bfloat16* x;  // may alias out (in place)
  int64_t x_ld;
  const __nv_bfloat16* w;
  __nv_bfloat16* out;
  int64_t out_ld;
  int H;
  int vec;  // rows move as 16-byte vectors
};

// blockIdx.x: row, blockIdx.y: job (rmsnorm_pair runs two jobs in one launch).
__global__ void rmsnorm_kernel(NormJob a, NormJob b, float eps) {
  __shared__ float red[32];
  pdl_wait();
  const NormJob& j = blockIdx.y == 0 ? a : b;
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* x = j.x + t * j.x_ld;
  __nv_bfloat16* o = j.out + t * j.out_ld;
  float ss = 0.0f;
  if (j.vec) {
    const int nv = j.H / 8;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      BF8 v;
      v.u = reinterpret_cast<const uint4*>(x)[i];
      float f[8];
      bf8_to_f32(v, f);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += f[k] * f[k];
    }
  } else {
    for (int i = threadIdx.x; i < j.H; i += blockDim.x) {
      float f = __bfloat162float(x[i]);
      ss += f * f;
    }
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(j.H) + eps);
  if (j.vec) {
    const int nv = j.H / 8;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      BF8 v, w;
      v.u = reinterpret_cast<const uint4*>(x)[i];
      w.u = reinterpret_cast<const uint4*>(j.w)[i];
      float f[8], g[8];
      bf8_to_f32(v, f);
      bf8_to_f32(w, g);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = f[k] * inv * g[k];
      reinterpret_cast<uint4*>(o)[i] = f32_to_bf8(f).u;
    }
  } else {
    for (int i = threadIdx.x; i < j.H; i += blockDim.x)
      o[i] = __float2bfloat16(__bfloat162float(x[i]) * inv * __bfloat162float(j.w[i]));
  }
  pdl_trigger();
}

// residual += x (stored as bf16); x = rmsnorm(residual) * w, computed from the stored residual.
__global__ void fused_add_rmsnorm_kernel(__nv_bfloat16* x, int64_t x_ld, __nv_bfloat16* res,
                                         int64_t r_ld, const __nv_bfloat16* __restrict__ w, int H,
                                         float eps, int vec) {
  __shared__ float red[32];
  pdl_wait();
  const int64_t t = blockIdx.x;
  __nv_bfloat16* xr = x + t * x_ld;
  __nv_bfloat16* rr = res + t * r_ld;
  float ss = 0.0f;
  if (vec) {
    const int nv = H / 8;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      BF8 a, b;
      a.u = reinterpret_cast<const uint4*>(xr)[i];
      b.u = reinterpret_cast<const uint4*>(rr)[i];
      float fa[8], fb[8];
      bf8_to_f32(a, fa);
      bf8_to_f32(b, fb);
#pragma unroll
      for (int k = 0; k < 8; ++k) fb[k] += fa[k];
      BF8 s = f32_to_bf8(fb);
      reinterpret_cast<uint4*>(rr)[i] = s.u;
      bf8_to_f32(s, fb);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += fb[k] * fb[k];
    }
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
      __nv_bfloat16 s = __float2bfloat16(__bfloat162float(rr[i]) + __bfloat162float(xr[i]));
      rr[i] = s;
      float f = __bfloat162float(s);
      ss += f * f;
    }
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(H) + eps);
  // Each thread re-reads only the residual elements it wrote itself.
  if (vec) {
    const int nv = H / 8;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      BF8 r, wv;
      r.u = reinterpret_cast<const uint4*>(rr)[i];
      wv.u = reinterpret_cast<const uint4*>(w)[i];
      float f[8], g[8];
      bf8_to_f32(r, f);
      bf8_to_f32(wv, g);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = f[k] * inv * g[k];
      reinterpret_cast<uint4*>(xr)[i] = f32_to_bf8(f).u;
    }
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x)
      xr[i] = __float2bfloat16(__bfloat162float(rr[i]) * inv * __bfloat162float(w[i]));
  }
  pdl_trigger();
}

// One warp per (token, head); heads [0, nh) are q, [nh, nh + nkv) are k. Optional per-head
// RMSNorm, then rotary on the first rot features. Shared memory: hd floats per warp.
template <bool NORM>
__global__ void qk_rope_kernel(__nv_bfloat16* q, int64_t q_s0, int64_t q_s1, int nh,
                               __nv_bfloat16* k, int64_t k_s0, int64_t k_s1, int nkv, int hd,
                               const __nv_bfloat16* __restrict__ wq,
                               const __nv_bfloat16* __restrict__ wk, float eps,
                               const int32_t* __restrict__ pos, const float* __restrict__ cs,
                               int max_pos, int rot, int interleaved, int64_t T) {
  extern __shared__ float smem[];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int heads = nh + nkv;
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (gw >= T * heads) return;
  const int64_t t = gw / heads;
  const int h = int(gw - t * heads);
  const bool is_q = h < nh;
  __nv_bfloat16* p = is_q ? q + t * q_s0 + int64_t(h) * q_s1 : k + t * k_s0 + int64_t(h - nh) * k_s1;
  const __nv_bfloat16* w = is_q ? wq : wk;
  head_norm_rope<NORM>(p, w, hd, eps, smem + warp * hd, pos[t], cs, max_pos, rot, interleaved, lane,
                       [&](int i, float v) { p[i] = __float2bfloat16(v); });
  pdl_trigger();
}

int norm_threads(int64_t units) {
  int64_t t = ceil_div(units, 32) * 32;
  return int(std::clamp<int64_t>(t, 32, 1024));
}

NormJob make_job(const Tensor& x, const Tensor& w, Tensor& out, const char* what) {
  check_dev(x, DType::bf16, what);
  check_dev(w, DType::bf16, what);
  check_dev(out, DType::bf16, what);
  const int64_t H = x.size(-1);
  TS_CHECK(w.numel() == H && out.size(-1) == H && out.rows() == x.rows(),
           "{}: x {} w {} out {}", what, x.shape_str(), w.shape_str(), out.shape_str());
  TS_CHECK(H <= 0x7fffffff, "{}: row too long", what);
  NormJob j;
  j.x = x.ptr<__nv_bfloat16>();
  j.x_ld = x.row_stride();
  j.w = w.ptr<__nv_bfloat16>();
  j.out = out.ptr<__nv_bfloat16>();
  j.out_ld = out.row_stride();
  j.H = int(H);
  j.vec = vec8_ok(j.x, H, j.x_ld) && vec8_ok(j.out, H, j.out_ld) && aligned16(j.w);
  return j;
}

struct RopeArgs {
  const float* cs = nullptr;
  int max_pos = 0, rot = 0, interleaved = 0;
};

RopeArgs rope_args(const Rope& rope, int hd) {
  RopeArgs r;
  if (rope.rot_dim == 0) return r;
  check_dev(rope.cos_sin, DType::f32, "rope cos_sin");
  TS_CHECK(rope.cos_sin.ndim == 2 && rope.cos_sin.size(1) == rope.rot_dim &&
               rope.cos_sin.is_contiguous() && rope.rot_dim % 2 == 0 && rope.rot_dim <= hd,
           "rope: cos_sin {} rot_dim {} head_dim {}", rope.cos_sin.shape_str(), rope.rot_dim, hd);
  r.cs = rope.cos_sin.ptr<float>();
  r.max_pos = int(rope.cos_sin.size(0));
  r.rot = rope.rot_dim;
  r.interleaved = rope.interleaved ? 1 : 0;
  return r;
}

template <bool NORM>
void qk_rope_launch(Tensor* q, Tensor* k, const Tensor* wq, const Tensor* wk, float eps,
                    const Tensor& positions, const Rope& rope) {
  const bool hq = q && q->defined(), hk = k && k->defined();
  TS_CHECK(hq || hk, "rope: neither q nor k given");
  const Tensor& ref = hq ? *q : *k;
  TS_CHECK(ref.ndim == 3, "rope: q/k must be [T, heads, head_dim], got {}", ref.shape_str());
  const int64_t T = ref.size(0), hd = ref.size(2);
  for (const Tensor* t : {hq ? q : nullptr, hk ? k : nullptr}) {
    if (!t) continue;
    check_dev(*t, DType::bf16, "rope q/k");
    TS_CHECK(t->ndim == 3 && t->size(0) == T && t->size(2) == hd && t->stride[2] == 1,
             "rope: q/k {} must be [T, heads, {}] with contiguous head dim", t->shape_str(), hd);
  }
  check_dev(positions, DType::i32, "rope positions");
  TS_CHECK(positions.numel() == T && positions.is_contiguous(), "rope: positions {} for {} tokens",
           positions.shape_str(), T);
  if (NORM) {
    if (hq) TS_CHECK(wq && wq->numel() == hd, "qk_norm_rope: wq must be [{}]", hd);
    if (hk) TS_CHECK(wk && wk->numel() == hd, "qk_norm_rope: wk must be [{}]", hd);
    if (hq) check_dev(*wq, DType::bf16, "qk_norm_rope wq");
    if (hk) check_dev(*wk, DType::bf16, "qk_norm_rope wk");
  }
  RopeArgs ra = rope_args(rope, int(hd));
  const int nh = hq ? int(q->size(1)) : 0, nkv = hk ? int(k->size(1)) : 0;
  const int64_t warps = T * (nh + nkv);
  if (warps == 0 || hd == 0) return;
  constexpr int kWarps = 4;
  const size_t smem = size_t(kWarps) * size_t(hd) * sizeof(float);
  TS_CHECK(smem <= 48 * 1024, "rope: head_dim {} too large", hd);
  const int64_t blocks = ceil_div(warps, kWarps);
  TS_CHECK(blocks <= 0x7fffffff, "rope: too many heads");
  launch(qk_rope_kernel<NORM>, dim3(unsigned(blocks)), dim3(kWarps * 32), smem, true,
         hq ? q->ptr<__nv_bfloat16>() : nullptr, hq ? q->stride[0] : 0, hq ? q->stride[1] : 0, nh,
         hk ? k->ptr<__nv_bfloat16>() : nullptr, hk ? k->stride[0] : 0, hk ? k->stride[1] : 0, nkv,
         int(hd), (NORM && hq) ? wq->ptr<__nv_bfloat16>() : nullptr,
         (NORM && hk) ? wk->ptr<__nv_bfloat16>() : nullptr, eps, positions.ptr<int32_t>(), ra.cs,
         ra.max_pos, ra.rot, ra.interleaved, T);
}

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  NormJob j = make_job(x, w, out, "rmsnorm");
  const int64_t T = x.rows();
  if (T == 0 || j.H == 0) return;
  TS_CHECK(T <= 0x7fffffff, "rmsnorm: too many rows");
  launch(rmsnorm_kernel, dim3(unsigned(T), 1), dim3(norm_threads(j.vec ? j.H / 8 : j.H)), 0, true,
         j, j, eps);
}

void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps,
                  Tensor& out_a, Tensor& out_b) {
  NormJob ja = make_job(a, wa, out_a, "rmsnorm_pair a");
  NormJob jb = make_job(b, wb, out_b, "rmsnorm_pair b");
  TS_CHECK(a.rows() == b.rows(), "rmsnorm_pair: a {} and b {} differ in rows", a.shape_str(),
           b.shape_str());
  const int64_t T = a.rows();
  if (T == 0) return;
  TS_CHECK(T <= 0x7fffffff, "rmsnorm_pair: too many rows");
  unsigned jobs = 2;
  if (ja.H == 0 || jb.H == 0) {  // one half empty: run only the other one
    if (ja.H == 0) ja = jb;
    jobs = 1;
  }
  if (ja.H == 0) return;
  const int units = std::max(ja.vec ? ja.H / 8 : ja.H, jb.vec ? jb.H / 8 : jb.H);
  launch(rmsnorm_kernel, dim3(unsigned(T), jobs), dim3(norm_threads(units)), 0, true, ja, jb, eps);
}

void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  check_dev(x, DType::bf16, "fused_add_rmsnorm x");
  check_dev(residual, DType::bf16, "fused_add_rmsnorm residual");
  check_dev(w, DType::bf16, "fused_add_rmsnorm w");
  const int64_t T = x.rows(), H = x.size(-1);
  TS_CHECK(residual.rows() == T && residual.size(-1) == H && w.numel() == H,
           "fused_add_rmsnorm: x {} residual {} w {}", x.shape_str(), residual.shape_str(),
           w.shape_str());
  if (T == 0 || H == 0) return;
  TS_CHECK(T <= 0x7fffffff && H <= 0x7fffffff, "fused_add_rmsnorm: too large");
  const int64_t xld = x.row_stride(), rld = residual.row_stride();
  const int vec = vec8_ok(x.data, H, xld) && vec8_ok(residual.data, H, rld) && aligned16(w.data);
  launch(fused_add_rmsnorm_kernel, dim3(unsigned(T)), dim3(norm_threads(vec ? H / 8 : H)), 0, true,
         x.ptr<__nv_bfloat16>(), xld, residual.ptr<__nv_bfloat16>(), rld, w.ptr<__nv_bfloat16>(),
         int(H), eps, vec);
}

void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps,
                  const Tensor& positions, const Rope& rope) {
  qk_rope_launch<true>(&q, &k, &wq, &wk, eps, positions, rope);
}

void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& rope) {
  qk_rope_launch<false>(&q, &k, nullptr, nullptr, 0.0f, positions, rope);
}

}  // namespace ts::ops::cuda
