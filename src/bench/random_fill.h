// Fast deterministic random numbers for synthetic weights and benchmark inputs.
// Counter-based: element i of a stream `key` depends only on (key, i), so any range of a tensor
// can be generated independently (in parallel, in chunks, in any order) with identical results.
// Normal samples come from a 65536-entry table of normal quantiles (inverse-CDF sampling with
// 16 random bits per sample, |x| <= 4.3 sigma): about 1 ns per value, no transcendental calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace ts::bench {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Stream key for a named tensor under a seed (FNV-1a of the name mixed with the seed).
uint64_t stream_key(uint64_t seed, std::string_view name);

// Writes elements [first, first + n) of the N(0, std^2) stream `key` into dst, converted to
// `dt` (f32, bf16 or f16). dst points at element `first`. Single-threaded (callers split work);
// fill_normal_parallel splits one range over the OpenMP threads.
void fill_normal(void* dst, DType dt, uint64_t key, uint64_t first, size_t n, float std);
void fill_normal_parallel(void* dst, DType dt, uint64_t key, size_t n, float std);
// dst[0..n) = value in dtype dt (f32, bf16, f16).
void fill_constant(void* dst, DType dt, size_t n, float value);

// A host tensor of N(0, std^2) values (f32, bf16 or f16).
Tensor random_normal(std::vector<int64_t> shape, DType dt, uint64_t key, float std = 1.0f);

}  // namespace ts::bench
