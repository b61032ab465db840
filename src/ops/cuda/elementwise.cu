// Memory-bound row kernels: embedding, silu_mul, add_inplace, gather_rows, kv_write, casts.
// Each uses 16-byte vectors when every row start is 16-byte aligned, scalar code otherwise.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kv_fp8.cuh"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

constexpr int kThreads = 256;

// ---- embedding ---------------------------------------------------------------------------------
template <bool VEC>
__global__ void embedding_kernel(const int32_t* __restrict__ ids,
                                 const __nv_bfloat16* __restrict__ table, int64_t vocab_start,
                                 int64_t vocab_rows, int64_t table_ld, __nv_bfloat16* out,
                                 int64_t out_ld, int H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int64_t id = int64_t(ids[t]) - vocab_start;
  const bool inside = id >= 0 && id < vocab_rows;
  const __nv_bfloat16* src = table + (inside ? id : 0) * table_ld;
  __nv_bfloat16* dst = out + t * out_ld;
  if (VEC) {
    const int nv = H / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      uint4 v = inside ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
      reinterpret_cast<uint4*>(dst)[i] = v;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x)
      dst[i] = inside ? src[i] : __float2bfloat16(0.0f);
  }
  pdl_trigger();
}

// ---- silu_mul ------------------------------------------------------------------------------------
__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

template <bool VEC>
__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld,
                                __nv_bfloat16* __restrict__ out, int64_t out_ld, int I) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* g = x + t * x_ld;
  const __nv_bfloat16* u = g + I;
  __nv_bfloat16* o = out + t * out_ld;
  if (VEC) {
    const int nv = I / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      BF8 gv, uv;
      gv.u = reinterpret_cast<const uint4*>(g)[i];
      uv.u = reinterpret_cast<const uint4*>(u)[i];
      float gf[8], uf[8], of[8];
      bf8_to_f32(gv, gf);
      bf8_to_f32(uv, uf);
#pragma unroll
      for (int j = 0; j < 8; ++j) of[j] = silu(gf[j]) * uf[j];
      reinterpret_cast<uint4*>(o)[i] = f32_to_bf8(of).u;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < I; i += gridDim.y * blockDim.x)
      o[i] = __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
  }
  pdl_trigger();
}

// ---- add_inplace -----------------------------------------------------------------------------------
template <bool VEC>
__global__ void add_kernel(__nv_bfloat16* y, int64_t y_ld, const __nv_bfloat16* x, int64_t x_ld,
                           int H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __nv_bfloat16* yr = y + t * y_ld;
  const __nv_bfloat16* xr = x + t * x_ld;
  if (VEC) {
    const int nv = H / 8;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nv; i += gridDim.y * blockDim.x) {
      BF8 a, b;
      a.u = reinterpret_cast<const uint4*>(yr)[i];
      b.u = reinterpret_cast<const uint4*>(xr)[i];
      float af[8], bf[8];
      bf8_to_f32(a, af);
      bf8_to_f32(b, bf);
#pragma unroll
      for (int j = 0; j < 8; ++j) af[j] += bf[j];
      reinterpret_cast<uint4*>(yr)[i] = f32_to_bf8(af).u;
    }
  } else {
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x)
      yr[i] = __float2bfloat16(__bfloat162float(yr[i]) + __bfloat162float(xr[i]));
  }
  pdl_trigger();
}

// ---- gather_rows: byte rows, copied in units of U (uint4 / uint32 / uint16 / uint8) ----------------
template <typename U>
__global__ void gather_kernel(const char* __restrict__ x, int64_t x_ld_bytes, int64_t x_rows,
                              const int32_t* __restrict__ index, char* __restrict__ out,
                              int64_t out_ld_bytes, int64_t row_bytes) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int64_t src_row = index[i];
  const bool inside = src_row >= 0 && src_row < x_rows;
  const U* src = reinterpret_cast<const U*>(x + (inside ? src_row : 0) * x_ld_bytes);
  U* dst = reinterpret_cast<U*>(out + i * out_ld_bytes);
  const int64_t n = row_bytes / int64_t(sizeof(U));
  for (int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; j < n;
       j += int64_t(gridDim.y) * blockDim.x) {
    U v;
    if (inside) v = src[j];
    else v = U{};
    dst[j] = v;
  }
  pdl_trigger();
}

// ---- copy_rows: same as gather with the identity index ---------------------------------------------
template <typename U>
__global__ void copy_kernel(const char* __restrict__ x, int64_t x_ld_bytes, char* __restrict__ out,
                            int64_t out_ld_bytes, int64_t row_bytes) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const U* src = reinterpret_cast<const U*>(x + i * x_ld_bytes);
  U* dst = reinterpret_cast<U*>(out + i * out_ld_bytes);
  const int64_t n = row_bytes / int64_t(sizeof(U));
  for (int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; j < n;
       j += int64_t(gridDim.y) * blockDim.x)
    dst[j] = src[j];
  pdl_trigger();
}

// ---- kv_write --------------------------------------------------------------------------------------
// blockIdx.x: token, blockIdx.y: 0 = k, 1 = v. Source heads at (token * s0 + head * s1);
// destination slot rows are packed [nkv, hd]. CacheT: bf16 (copied), or uint8_t for an FP8 cache
// (each value times its cache's inverse scale, stored as e4m3: kv_fp8.cuh). VEC: 8 values per
// step (one 16-byte load).
template <bool VEC, typename CacheT>
__global__ void kv_write_kernel(const __nv_bfloat16* __restrict__ k, int64_t k_s0, int64_t k_s1,
                                int hd_k, const __nv_bfloat16* __restrict__ v, int64_t v_s0,
                                int64_t v_s1, int hd_v, int nkv, CacheT* k_cache,
                                CacheT* v_cache, const int32_t* __restrict__ slots, float inv_k, float inv_v) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot >= 0) {
    const bool is_v = blockIdx.y == 1;
    const __nv_bfloat16* src = is_v ? v : k;
    const int64_t s0 = is_v ? v_s0 : k_s0, s1 = is_v ? v_s1 : k_s1;
    const int hd = is_v ? hd_v : hd_k;
    const float inv = is_v ? inv_v : inv_k;
    CacheT* dst = (is_v ? v_cache : k_cache) + slot * int64_t(nkv) * hd;
    if (VEC) {
      const int per_head = hd / 8, n = nkv * per_head;
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int h = i / per_head, c = i - h * per_head;
        kvfp8::store8(dst + i * 8, *reinterpret_cast<const uint4*>(src + t * s0 + h * s1 + c * 8), inv);
      }
    } else {
      const int n = nkv * hd;
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int h = i / hd, c = i - h * hd;
        kvfp8::store(dst + i, src[t * s0 + h * s1 + c], inv);
      }
    }
  }
  pdl_trigger();
}

// ---- casts -----------------------------------------------------------------------------------------
__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld,
                                   float* __restrict__ out, int64_t out_ld, int64_t n) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.y) * blockDim.x)
    out[t * out_ld + i] = __bfloat162float(x[t * x_ld + i]);
  pdl_trigger();
}
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, int64_t x_ld,
                                   __nv_bfloat16* __restrict__ out, int64_t out_ld, int64_t n) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.y) * blockDim.x)
    out[t * out_ld + i] = __float2bfloat16(x[t * x_ld + i]);
  pdl_trigger();
}

// Grid for "one block row per tensor row, columns split over blockIdx.y".
dim3 row_grid(int64_t rows, int64_t units) {
  TS_CHECK(rows <= 0x7fffffff, "cuda op: too many rows ({})", rows);
  int64_t y = ceil_div(units, kThreads);
  if (y < 1) y = 1;
  if (y > 65535) y = 65535;
  return dim3(unsigned(rows), unsigned(y));
}

void check_same_rows(const Tensor& a, const Tensor& b, const char* what) {
  TS_CHECK(a.rows() == b.rows() && a.size(-1) == b.size(-1), "{}: shape mismatch {} vs {}", what,
           a.shape_str(), b.shape_str());
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  check_dev(ids, DType::i32, "embedding ids");
  check_dev(table, DType::bf16, "embedding table");
  check_dev(out, DType::bf16, "embedding out");
  TS_CHECK(ids.is_contiguous(), "embedding: ids must be contiguous");
  TS_CHECK(table.ndim == 2 && out.size(-1) == table.size(1) && out.rows() == ids.numel(),
           "embedding: ids {} table {} out {}", ids.shape_str(), table.shape_str(),
           out.shape_str());
  const int64_t T = ids.numel(), H = table.size(1);
  if (T == 0 || H == 0) return;
  const int64_t tld = table.row_stride(), old = out.row_stride();
  if (vec8_ok(table.data, H, tld) && vec8_ok(out.data, H, old)) {
    launch(embedding_kernel<true>, row_grid(T, H / 8), dim3(kThreads), 0, true,
           ids.ptr<int32_t>(), table.ptr<__nv_bfloat16>(), vocab_start, table.size(0), tld,
           out.ptr<__nv_bfloat16>(), old, int(H));
  } else {
    launch(embedding_kernel<false>, row_grid(T, H), dim3(kThreads), 0, true, ids.ptr<int32_t>(),
           table.ptr<__nv_bfloat16>(), vocab_start, table.size(0), tld, out.ptr<__nv_bfloat16>(),
           old, int(H));
  }
}

void silu_mul(const Tensor& x, Tensor& out) {
  check_dev(x, DType::bf16, "silu_mul x");
  check_dev(out, DType::bf16, "silu_mul out");
  const int64_t I = out.size(-1);
  TS_CHECK(x.size(-1) == 2 * I && x.rows() == out.rows(), "silu_mul: x {} out {}", x.shape_str(),
           out.shape_str());
  const int64_t T = x.rows();
  if (T == 0 || I == 0) return;
  const int64_t xld = x.row_stride(), old = out.row_stride();
  if (vec8_ok(x.data, I, xld) && vec8_ok(out.data, I, old)) {
    launch(silu_mul_kernel<true>, row_grid(T, I / 8), dim3(kThreads), 0, true,
           x.ptr<__nv_bfloat16>(), xld, out.ptr<__nv_bfloat16>(), old, int(I));
  } else {
    launch(silu_mul_kernel<false>, row_grid(T, I), dim3(kThreads), 0, true,
           x.ptr<__nv_bfloat16>(), xld, out.ptr<__nv_bfloat16>(), old, int(I));
  }
}

void add_inplace(Tensor& y, const Tensor& x) {
  check_dev(y, DType::bf16, "add_inplace y");
  check_dev(x, DType::bf16, "add_inplace x");
  check_same_rows(y, x, "add_inplace");
  const int64_t T = y.rows(), H = y.size(-1);
  if (T == 0 || H == 0) return;
  const int64_t yld = y.row_stride(), xld = x.row_stride();
  if (vec8_ok(y.data, H, yld) && vec8_ok(x.data, H, xld)) {
    launch(add_kernel<true>, row_grid(T, H / 8), dim3(kThreads), 0, true, y.ptr<__nv_bfloat16>(),
           yld, x.ptr<__nv_bfloat16>(), xld, int(H));
  } else {
    launch(add_kernel<false>, row_grid(T, H), dim3(kThreads), 0, true, y.ptr<__nv_bfloat16>(),
           yld, x.ptr<__nv_bfloat16>(), xld, int(H));
  }
}

void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) {
  TS_CHECK(x.device == Device::cuda && out.device == Device::cuda, "gather_rows: GPU tensors");
  check_dev(index, DType::i32, "gather_rows index");
  TS_CHECK(x.dtype == out.dtype, "gather_rows: dtype mismatch");
  TS_CHECK(index.is_contiguous() && out.rows() == index.numel() && out.size(-1) == x.size(-1),
           "gather_rows: x {} index {} out {}", x.shape_str(), index.shape_str(), out.shape_str());
  const int64_t N = index.numel();
  const int64_t es = int64_t(dtype_size(x.dtype));
  const int64_t row_bytes = x.size(-1) * es;
  if (N == 0 || row_bytes == 0) return;
  const int64_t xld = x.row_stride() * es, old = out.row_stride() * es;
  const uintptr_t all = reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(out.data) |
                        uintptr_t(xld) | uintptr_t(old) | uintptr_t(row_bytes);
  auto go = [&](auto unit) {
    using U = decltype(unit);
    launch(gather_kernel<U>, row_grid(N, row_bytes / int64_t(sizeof(U))), dim3(kThreads), 0, true,
           static_cast<const char*>(x.data), xld, x.rows(), index.ptr<int32_t>(),
           static_cast<char*>(out.data), old, row_bytes);
  };
  if ((all & 15) == 0) go(uint4{});
  else if ((all & 3) == 0) go(uint32_t{});
  else if ((all & 1) == 0) go(uint16_t{});
  else go(uint8_t{});
}

void copy_rows(const Tensor& src, Tensor& dst) {
  TS_CHECK(src.device == Device::cuda && dst.device == Device::cuda, "copy_rows: GPU tensors");
  TS_CHECK(src.dtype == dst.dtype, "copy_rows: dtype mismatch");
  check_same_rows(src, dst, "copy_rows");
  const int64_t N = src.rows(), es = int64_t(dtype_size(src.dtype)), row_bytes = src.size(-1) * es;
  if (N == 0 || row_bytes == 0) return;
  const int64_t xld = src.row_stride() * es, old = dst.row_stride() * es;
  const uintptr_t all = reinterpret_cast<uintptr_t>(src.data) |
                        reinterpret_cast<uintptr_t>(dst.data) | uintptr_t(xld) | uintptr_t(old) |
                        uintptr_t(row_bytes);
  auto go = [&](auto unit) {
    using U = decltype(unit);
    launch(copy_kernel<U>, row_grid(N, row_bytes / int64_t(sizeof(U))), dim3(kThreads), 0, true,
           static_cast<const char*>(src.data), xld, static_cast<char*>(dst.data), old, row_bytes);
  };
  if ((all & 15) == 0) go(uint4{});
  else if ((all & 3) == 0) go(uint32_t{});
  else if ((all & 1) == 0) go(uint16_t{});
  else go(uint8_t{});
}

void cast(const Tensor& src, Tensor& dst) {
  if (src.dtype == dst.dtype) return copy_rows(src, dst);
  if (src.dtype == DType::bf16 && dst.dtype == DType::f32) return cast_bf16_to_f32(src, dst);
  if (src.dtype == DType::f32 && dst.dtype == DType::bf16) return cast_f32_to_bf16(src, dst);
  fail("cast: {} -> {} not supported on CUDA", dtype_name(src.dtype), dtype_name(dst.dtype));
}

void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
              const Tensor& slot_mapping, const KvScales& kvs) {
  // v / v_cache may be undefined (MLA keeps one latent cache in k).
  const bool has_v = v.defined() && v.ndim == 3 && v_cache.defined() && v_cache.ndim == 4;
  const bool f8 = k_cache.dtype == DType::f8_e4m3;
  const DType ct = f8 ? DType::f8_e4m3 : DType::bf16;
  check_dev(k, DType::bf16, "kv_write k");
  check_dev(k_cache, ct, "kv_write k_cache");
  check_dev(slot_mapping, DType::i32, "kv_write slot_mapping");
  if (has_v) {
    check_dev(v, DType::bf16, "kv_write v");
    check_dev(v_cache, ct, "kv_write v_cache");
  }
  if (f8)
    check_kv_scales(kvs, "kv_write");
  TS_CHECK(k.ndim == 3 && k_cache.ndim == 4,
           "kv_write: k must be [T, nkv, hd], caches [blocks, block_size, nkv, hd]");
  TS_CHECK(k_cache.is_contiguous() && slot_mapping.is_contiguous() &&
               (!has_v || v_cache.is_contiguous()),
           "kv_write: caches and slot mapping must be contiguous");
  const int64_t T = k.size(0), nkv = k.size(1), hdk = k.size(2), hdv = has_v ? v.size(2) : 0;
  TS_CHECK(k_cache.size(2) == nkv && k_cache.size(3) == hdk && slot_mapping.numel() == T &&
               (!has_v || (v.size(0) == T && v.size(1) == nkv && v_cache.size(2) == nkv &&
                           v_cache.size(3) == hdv && v_cache.size(0) * v_cache.size(1) ==
                                                         k_cache.size(0) * k_cache.size(1))),
           "kv_write: k {} v {} k_cache {} v_cache {} slots {}", k.shape_str(), v.shape_str(),
           k_cache.shape_str(), v_cache.shape_str(), slot_mapping.shape_str());
  TS_CHECK(k.stride[2] == 1 && (!has_v || v.stride[2] == 1), "kv_write: head dim must be contiguous");
  if (T == 0 || nkv == 0) return;
  TS_CHECK(T <= 0x7fffffff, "kv_write: too many tokens");
  const __nv_bfloat16* vp = has_v ? v.ptr<__nv_bfloat16>() : nullptr;
  const int64_t vs0 = has_v ? v.stride[0] : 0, vs1 = has_v ? v.stride[1] : 0;
  bool vec = aligned16(k.data) && aligned16(k_cache.data) && hdk % 8 == 0 && k.stride[0] % 8 == 0 &&
             k.stride[1] % 8 == 0;
  if (has_v)
    vec = vec && aligned16(v.data) && aligned16(v_cache.data) && hdv % 8 == 0 && vs0 % 8 == 0 &&
          vs1 % 8 == 0;
  const int64_t maxrow = nkv * std::max(hdk, hdv) / (vec ? 8 : 1);
  const int threads =
      int(std::min<int64_t>(kThreads, std::max<int64_t>(32, ceil_div(maxrow, 32) * 32)));
  auto go = [&](auto* kc, auto* vc) {
    using C = std::remove_pointer_t<decltype(kc)>;
    auto kern = vec ? kv_write_kernel<true, C> : kv_write_kernel<false, C>;
    launch(kern, dim3(unsigned(T), has_v ? 2u : 1u), dim3(threads), 0, true, k.ptr<__nv_bfloat16>(), k.stride[0],
           k.stride[1], int(hdk), vp, vs0, vs1, int(hdv), int(nkv), kc, vc, slot_mapping.ptr<int32_t>(), 1.0f / kvs.k,
           1.0f / kvs.v);
  };
  if (f8) go(k_cache.ptr<uint8_t>(), has_v ? v_cache.ptr<uint8_t>() : nullptr);
  else go(k_cache.ptr<__nv_bfloat16>(), has_v ? v_cache.ptr<__nv_bfloat16>() : nullptr);
}

void cast_bf16_to_f32(const Tensor& x, Tensor& out) {
  check_dev(x, DType::bf16, "cast x");
  check_dev(out, DType::f32, "cast out");
  check_same_rows(x, out, "cast_bf16_to_f32");
  const int64_t T = x.rows(), n = x.size(-1);
  if (T == 0 || n == 0) return;
  launch(bf16_to_f32_kernel, row_grid(T, n), dim3(kThreads), 0, true, x.ptr<__nv_bfloat16>(),
         x.row_stride(), out.ptr<float>(), out.row_stride(), n);
}

void cast_f32_to_bf16(const Tensor& x, Tensor& out) {
  check_dev(x, DType::f32, "cast x");
  check_dev(out, DType::bf16, "cast out");
  check_same_rows(x, out, "cast_f32_to_bf16");
  const int64_t T = x.rows(), n = x.size(-1);
  if (T == 0 || n == 0) return;
  launch(f32_to_bf16_kernel, row_grid(T, n), dim3(kThreads), 0, true, x.ptr<float>(),
         x.row_stride(), out.ptr<__nv_bfloat16>(), out.row_stride(), n);
}

}  // namespace ts::ops::cuda
