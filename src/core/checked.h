// Overflow-safe size arithmetic for sizes that come from files or requests (checkpoint headers,
// config.json, tokenizer.json). A wrapped size is how a bad file turns into a small allocation
// followed by an out-of-bounds write, so every product/sum of untrusted sizes goes through these:
// on overflow they throw ts::Error naming `what` (e.g. "model.safetensors: tensor x: shape").
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "core/error.h"

namespace ts {

// a * b for non-negative int64 (shape dimensions, element counts); throws on overflow.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) fail("{}: size overflow ({} * {})", what, a, b);
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) fail("{}: size overflow ({} + {})", what, a, b);
  return r;
}
inline uint64_t checked_mul_u(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: size overflow ({} * {})", what, a, b);
  return r;
}
inline uint64_t checked_add_u(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: size overflow ({} + {})", what, a, b);
  return r;
}

// Product of dimensions (each must be >= 0), e.g. a tensor's element count.
template <typename Range>
int64_t checked_numel(const Range& dims, std::string_view what) {
  int64_t n = 1;
  for (auto d : dims) {
    if (int64_t(d) < 0) fail("{}: negative dimension {}", what, int64_t(d));
    n = checked_mul(n, int64_t(d), what);
  }
  return n;
}

}  // namespace ts
