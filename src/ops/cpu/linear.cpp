// CPU GEMM: out[m, n] = dot(x[m, :], w[n, :]) (+ bias[n]).
// Every output element is one dot() with a fixed lane order, whatever M, the tiling or the
// thread count — so a request's logits are bit-identical alone or in a batch of 32.
// Tiles of 4 x-rows by 4 w-rows keep 16 accumulators in registers; weights are streamed once
// per call (w tiles are the outer, parallel loop) which is what decode needs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                // lanes (0+4, 1+5, 2+6, 3+7)
  __m128 sh = _mm_movehl_ps(s, s);
  s = _mm_add_ps(s, sh);                         // (0+4)+(2+6), (1+5)+(3+7)
  sh = _mm_shuffle_ps(s, s, 1);
  return _mm_cvtss_f32(_mm_add_ss(s, sh));
}

float dot(const float* a, const float* b, int64_t k) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k8 = k & ~int64_t(7);
  for (int64_t i = 0; i < k8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (int64_t i = k8; i < k; ++i) s += a[i] * b[i];
  return s;
}

// MR x NR block with the same per-element arithmetic as dot().
template <int MR, int NR>
static inline void tile(const float* x, int64_t xs, const float* w, int64_t ws, int64_t k, float* o,
                        int64_t os) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k8 = k & ~int64_t(7);
  for (int64_t p = 0; p < k8; p += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * ws + p);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * xs + p);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t p = k8; p < k; ++p) s += x[i * xs + p] * w[j * ws + p];
      o[i * os + j] = s;
    }
}

void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias) {
  TS_CHECK(x.dtype == DType::f32 && w.dtype == DType::f32, "cpu linear: f32 only");
  int64_t m = x.rows(), k = x.size(-1), n = w.size(0);
  TS_CHECK(w.ndim == 2 && w.size(1) == k && out.rows() == m && out.size(-1) == n,
           "linear: x {} w {} out {}", x.shape_str(), w.shape_str(), out.shape_str());
  if (m == 0 || n == 0) return;
  const float* xp = x.ptr<float>();
  const float* wp = w.ptr<float>();
  float* op = out.ptr<float>();
  int64_t xs = x.row_stride(), ws = w.row_stride(), os = out.row_stride();
  constexpr int NR = 4;
  int64_t nblocks = (n + NR - 1) / NR;
#pragma omp parallel for schedule(static) if (m * n * k > 32768)
  for (int64_t nb = 0; nb < nblocks; ++nb) {
    int64_t n0 = nb * NR;
    const float* wb = wp + n0 * ws;
    if (n0 + NR <= n) {
      int64_t i = 0;
      for (; i + 4 <= m; i += 4) tile<4, NR>(xp + i * xs, xs, wb, ws, k, op + i * os + n0, os);
      for (; i < m; ++i) tile<1, NR>(xp + i * xs, xs, wb, ws, k, op + i * os + n0, os);
    } else {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = n0; j < n; ++j) op[i * os + j] = dot(xp + i * xs, wp + j * ws, k);
    }
  }
  if (bias && bias->data) {
    const float* b = bias->ptr<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) op[i * os + j] += b[j];
  }
}

void quantize_act_fp8(const Tensor& x, Tensor& q, Tensor& scale) {
  const int64_t M = x.rows(), K = x.size(-1), G = K / 128;
  TS_CHECK(x.dtype == DType::f32 && K % 128 == 0 && q.dtype == DType::u8 && q.numel() == M * K &&
               scale.dtype == DType::f32 && scale.numel() == M * G,
           "quantize_act_fp8: x {} q {} scale {}", x.shape_str(), q.shape_str(), scale.shape_str());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float* v = x.ptr<float>() + m * x.row_stride() + g * 128;
      float amax = 0.0f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
      scale.ptr<float>()[m * G + g] = s;
      uint8_t* o = q.ptr<uint8_t>() + m * K + g * 128;
      for (int i = 0; i < 128; ++i) o[i] = f32_to_e4m3(v[i] / s);
    }
}

void fake_quantize_act_fp8(const Tensor& x, Tensor& out) {
  const int64_t M = x.rows(), K = x.size(-1), G = K / 128;
  TS_CHECK(out.dtype == DType::f32 && out.numel() == M * K && out.is_contiguous(), "fake_quantize_act_fp8: x {} out {}",
           x.shape_str(), out.shape_str());
  Tensor q = Tensor::empty({M, K}, DType::u8), scale = Tensor::empty({M, G}, DType::f32);
  quantize_act_fp8(x, q, scale);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      out.ptr<float>()[m * K + k] = e4m3_to_f32(q.ptr<uint8_t>()[m * K + k]) * scale.ptr<float>()[m * G + k / 128];
}

}  // namespace ts::ops::cpu
