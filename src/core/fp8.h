// The small float formats quantized checkpoints store, decoded/encoded on the host:
//   e4m3 (OCP float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, max 448, subnormals 2^-9 steps),
//   e8m0 (UE8M0 power-of-two scale: 2^(e-127), 0xff NaN; MXFP8's per-32 scale),
//   e2m1 (FP4, NVFP4's values: bit 3 sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}).
// Encoders round to nearest (ties to even) and saturate: they write random quantized models and
// the CPU FP8 KV cache, the reference the GPU kernels are checked against.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ts {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE2m1Max = 6.0f;

inline float e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int e = (v >> 3) & 0xf, m = v & 0x7;
  if (e == 0xf && m == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float r = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return neg ? -r : r;
}

// Nearest e4m3 (ties to even), saturating at ±448; NaN -> 0x7f.
inline uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kE4m3Max) return sign | 0x7e;
  // Exponent of a's binade, clamped to the subnormal range (quantum 2^-9 below 2^-6).
  int e = a > 0 ? std::ilogb(a) : -7;
  if (e < -6) e = -6;
  float quantum = std::ldexp(1.0f, e - 3);
  float q = std::nearbyint(a / quantum);  // default rounding mode: ties to even
  float r = q * quantum;
  if (r >= kE4m3Max) return sign | 0x7e;
  // Re-encode r exactly.
  if (r < std::ldexp(1.0f, -6)) return sign | uint8_t(std::lrint(r / std::ldexp(1.0f, -9)));
  int re = std::ilogb(r);
  int m = int(std::lrint(r / std::ldexp(1.0f, re - 3))) - 8;
  return sign | uint8_t(((re + 7) << 3) | m);
}

inline float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(v) - 127);
}

// The smallest power of two >= s (s > 0), as e8m0: an MXFP8 scale that never overflows e4m3.
inline uint8_t f32_to_e8m0_ceil(float s) {
  if (!(s > 0)) return 0;
  int e;
  float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  int p = m == 0.5f ? e - 1 : e;
  p = p < -127 ? -127 : p > 127 ? 127 : p;
  return uint8_t(p + 127);
}

inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float r = kMag[code & 7];
  return (code & 8) ? -r : r;
}

// Nearest e2m1 code (ties to the even code), saturating at ±6.
inline uint8_t f32_to_e2m1(float f) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    float d = std::fabs(a - kMag[c]), bd = std::fabs(a - kMag[best]);
    if (d < bd || (d == bd && (c % 2) == 0)) best = c;
  }
  return sign | best;
}

}  // namespace ts
