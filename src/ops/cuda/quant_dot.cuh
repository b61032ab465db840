// The inner dot products of the W8A16 / W4A16 GEMVs, shared by the dense linears
// (quant_linear.cu) and the routed experts kept as stored (moe.cu): one warp streams one stored
// weight row and dots it with M bf16 activation rows, dequantizing in registers.
//
// Dequantizing in registers: an e4m3 byte s eeee mmm becomes the f32 with sign s, exponent field
// 0000eeee and mantissa mmm0...: exactly e4m3 x 2^-120 (subnormals included: e4m3 exponent 0 lands
// on f32 exponent 0, whose denormals the kernels keep, no --use_fast_math). Three integer ops per
// value and no conversion unit; the 2^120 goes into the block scale once per 16 values.
// e2m1 nibble s ee m -> the f32 with sign s, exponent field 000000ee and mantissa m0...: exactly
// e2m1 x 2^-126 (code 1, 0.5, lands on the f32 denormal 2^-127). The 2^126 goes onto each
// 16-value partial sum.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace ts::ops::cuda::qdot {

constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Byte j of v (element j of 4) as e4m3 x 2^-120 in f32.
template <int J>
__device__ __forceinline__ float e4m3_scaled(uint32_t v) {
  const uint32_t t = v << (24 - 8 * J);  // byte j in bits 24..31
  return __uint_as_float((t & 0x80000000u) | ((t >> 4) & 0x07f00000u));
}

// sum_j w[j] * x[j] over 16 values (w: 16 e4m3, x: 16 bf16 as two 16-byte vectors), in units of
// 2^-120.
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x0, const uint4& x1) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t a = xx[2 * q], b = xx[2 * q + 1];  // elements 4q, 4q+1 | 4q+2, 4q+3
    s0 = fmaf(e4m3_scaled<0>(ww[q]), __uint_as_float(a << 16), s0);
    s1 = fmaf(e4m3_scaled<1>(ww[q]), __uint_as_float(a & 0xffff0000u), s1);
    s0 = fmaf(e4m3_scaled<2>(ww[q]), __uint_as_float(b << 16), s0);
    s1 = fmaf(e4m3_scaled<3>(ww[q]), __uint_as_float(b & 0xffff0000u), s1);
  }
  return s0 + s1;
}

template <int J>
__device__ __forceinline__ float e2m1_scaled(uint32_t v) {
  const uint32_t sign = (v << (28 - 4 * J)) & 0x80000000u;
  const uint32_t mag = (J <= 5 ? (v << (22 - 4 * J)) : (v >> (4 * J - 22))) & 0x01c00000u;
  return __uint_as_float(sign | mag);
}

// sum_j w[j] * x[j] over the 8 values of one 32-bit word of nibbles and 8 bf16, in units of 2^-126.
__device__ __forceinline__ float dot8_fp4(uint32_t w, const uint4& x) {
  float s0 = 0.0f, s1 = 0.0f;
  s0 = fmaf(e2m1_scaled<0>(w), __uint_as_float(x.x << 16), s0);
  s1 = fmaf(e2m1_scaled<1>(w), __uint_as_float(x.x & 0xffff0000u), s1);
  s0 = fmaf(e2m1_scaled<2>(w), __uint_as_float(x.y << 16), s0);
  s1 = fmaf(e2m1_scaled<3>(w), __uint_as_float(x.y & 0xffff0000u), s1);
  s0 = fmaf(e2m1_scaled<4>(w), __uint_as_float(x.z << 16), s0);
  s1 = fmaf(e2m1_scaled<5>(w), __uint_as_float(x.z & 0xffff0000u), s1);
  s0 = fmaf(e2m1_scaled<6>(w), __uint_as_float(x.w << 16), s0);
  s1 = fmaf(e2m1_scaled<7>(w), __uint_as_float(x.w & 0xffff0000u), s1);
  return s0 + s1;
}

__device__ __forceinline__ float e4m3_value(uint32_t b) {
  return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f;
}

// acc[m] += this lane's share of sum_k x_m[k] * W[k] for one FP8 row: wr the row's K bytes, sr
// its f32 scales (one per 2^bk_log2 columns, bk_log2 >= 4), xr[m] M bf16 rows of K (all valid,
// 16-byte aligned). Lane l takes 16-value vectors l, l + 32, ...; the caller warp-sums acc.
template <int M>
__device__ __forceinline__ void fp8_row_dot(const uint8_t* __restrict__ wr, const float* __restrict__ sr, int bk_log2,
                                            int K, const __nv_bfloat16* const (&xr)[M], float (&acc)[M], int lane) {
  const int nv = K / 16;
  for (int base = 0; base < nv; base += 32 * kUnroll) {
    uint4 wv[kUnroll];
    float s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      wv[u] = i < nv ? ld_stream(wr + int64_t(i) * 16) : make_uint4(0, 0, 0, 0);
      s[u] = i < nv ? __ldg(sr + ((i * 16) >> bk_log2)) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* xp = reinterpret_cast<const uint4*>(xr[m] + int64_t(i) * 16);
          acc[m] = fmaf(s[u], dot16(wv[u], xp[0], xp[1]) * 0x1p120f, acc[m]);
        }
      }
    }
  }
}

// As fp8_row_dot for one NVFP4 row: wr K/2 bytes of nibbles, sr its K/16 E4M3 block scales; 32
// values (16 bytes, two block scales) per lane load. The row's global scale (scale2) is the
// caller's, applied after the warp sum.
template <int M>
__device__ __forceinline__ void fp4_row_dot(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ sr, int K,
                                            const __nv_bfloat16* const (&xr)[M], float (&acc)[M], int lane) {
  const int nv = K / 32;
  for (int base = 0; base < nv; base += 32 * kUnroll) {
    uint4 wv[kUnroll];
    uint32_t sv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      wv[u] = i < nv ? ld_stream(wr + int64_t(i) * 16) : make_uint4(0, 0, 0, 0);
      sv[u] = i < nv ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(sr) + i)) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nv) {
        // Scales up to 448 x 2^126 would overflow f32: the 2^126 goes on the partial sums instead.
        const float sa = e4m3_value(sv[u] & 0xffu), sb = e4m3_value(sv[u] >> 8);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* xp = reinterpret_cast<const uint4*>(xr[m] + int64_t(i) * 32);
          const float pa = dot8_fp4(wv[u].x, xp[0]) + dot8_fp4(wv[u].y, xp[1]);
          const float pb = dot8_fp4(wv[u].z, xp[2]) + dot8_fp4(wv[u].w, xp[3]);
          acc[m] = fmaf(pa * 0x1p126f, sa, fmaf(pb * 0x1p126f, sb, acc[m]));
        }
      }
    }
  }
}

// c += A (16 x 16, bf16, row) x B (16 x 8, bf16, col), f32 accumulation: one warp's m16n8k16.
__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Bytes (sel: 0x1404 -> bytes 0, 1; 0x3424 -> bytes 2, 3) of v as bf16x2, exact.
template <uint32_t Sel>
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v) {
  const uint32_t t = __byte_perm(v, 0u, Sel);  // the two bytes in bits 8..15 and 24..31
  const uint32_t r = (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);  // e4m3 x 2^-120
  __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&r);
  h = __hmul2(h, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Byte p of v (two e2m1 nibbles: element 2i low, 2i + 1 high) as bf16x2 times f, exactly: the bit
// move gives e2m1 x 2^-126 (bf16 exponent field = e2m1's, subnormal 0.5 included), f = the group
// scale x 2^118 (e4m3 x 2^118 < 2^127, exact in bf16), so the product e2m1 x scale x 2^-8 has at
// most 6 significant bits and a normal exponent: exact; the 2^8 goes onto the row's scale2.
template <int P>
__device__ __forceinline__ uint32_t e2m1x2_bf16x2(uint32_t v, __nv_bfloat162 f) {
  const uint32_t b = v >> (8 * P);
  const uint32_t t = (b & 0xfu) | ((b & 0xf0u) << 12);                            // nibbles at bits 0, 16
  const uint32_t r = ((t & 0x00080008u) << 12) | ((t & 0x00070007u) << 6);      // e2m1 x 2^-126
  __nv_bfloat162 h = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&r), f);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

}  // namespace ts::ops::cuda::qdot
