// The host KV tier's block copies (ops/cuda/kv_copy.h). Grid (n pairs, mirrors): one CTA moves one
// tensor's block of one pair; 256 threads x 16 bytes, 4 accesses in flight per thread, since one
// side is PCIe with ~1-2 us latency per access and the copy must keep enough bytes in flight to
// run at the link's rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/cuda/kv_copy.h"

namespace ts::ops::cuda {

namespace {
constexpr int kThreads = 256, kUnroll = 4;

// A launch's block pairs travel as a kernel parameter (copied at launch): the host keeps no
// buffer alive for the kernel and never waits to reuse one. 4 KB is the portable parameter limit.
constexpr int kPairsPerLaunch = 496;
struct PairList {
  int32_t v[2 * kPairsPerLaunch];
};

__global__ void kv_block_copy_kernel(const KvCopyMirror* __restrict__ mirrors, const PairList pairs, bool to_host) {
  const KvCopyMirror m = mirrors[blockIdx.y];
  const int p = blockIdx.x;
  const int64_t dev_block = pairs.v[2 * p], host_block = pairs.v[2 * p + 1];
  const char* src = reinterpret_cast<const char*>(to_host ? m.dev : m.host) +
                    (to_host ? dev_block : host_block) * int64_t(m.block_bytes);
  char* dst = reinterpret_cast<char*>(to_host ? m.host : m.dev) + (to_host ? host_block : dev_block) * int64_t(m.block_bytes);
  const uint64_t bytes = m.block_bytes;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | bytes) & 15) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const int64_t v = int64_t(bytes / 16);
    int64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < v; i += kUnroll * kThreads) {
      uint4 r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) r[u] = s[i + u * kThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = r[u];
    }
    for (; i < v; i += kThreads) d[i] = s[i];
    return;
  }
  for (uint64_t i = threadIdx.x; i < bytes; i += kThreads) dst[i] = src[i];  // unaligned: bytewise
}
}  // namespace

void kv_block_copy(const KvCopyMirror* mirrors, int num_mirrors, const int32_t* pairs, int64_t n, bool to_host,
                   void* stream) {
  if (n <= 0 || num_mirrors <= 0) return;
  TS_CHECK(num_mirrors <= 65535, "kv_block_copy: {} KV tensors (at most 65535)", num_mirrors);
  PairList list;
  for (int64_t at = 0; at < n; at += kPairsPerLaunch) {
    const int k = int(std::min<int64_t>(kPairsPerLaunch, n - at));
    std::memcpy(list.v, pairs + 2 * at, size_t(2 * k) * sizeof(int32_t));
    kv_block_copy_kernel<<<dim3(unsigned(k), unsigned(num_mirrors)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        mirrors, list, to_host);
    const cudaError_t e = cudaGetLastError();
    TS_CHECK(e == cudaSuccess, "kv_block_copy: launch failed: {}", cudaGetErrorString(e));
  }
}

}  // namespace ts::ops::cuda
