// Host KV tier copies (runtime/kv_store.h) as one kernel per round instead of one cudaMemcpyAsync
// per (block run, KV tensor).
//
// Why a kernel: a round of writebacks or loads touches n blocks in each of the pool's M tensors
// (K and V of every layer: M = 64 for Llama-3-8B). With copy-engine memcpys that is up to n x M
// API calls on the engine thread -- a mixed step that commits 32 prompt blocks issued ~2,000 of
// them, ~5-25 ms of host time during which the next step could not be launched (the device sat
// idle for 10% of a concurrency-256 run). Here the host passes the (device, host) block pairs as
// the kernel's parameter (496 pairs a launch) and launches once per 496 blocks; the kernel moves
// every tensor's bytes of every pair with 16-byte accesses, device memory on one side and pinned
// host memory (UVA-mapped) on the other. SGLang's HiCache does the same by default (its "kernel"
// I/O backend).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ts::ops::cuda {

// One KV tensor and its host mirror: block b of it is block_bytes at dev + b * block_bytes
// (device) and at host + b * block_bytes (pinned host memory, device-visible through UVA).
struct KvCopyMirror {
  uint64_t dev = 0, host = 0, block_bytes = 0;
};

// For every pair p < n and mirror m < num_mirrors: copies mirror m's block pairs[2p] (device)
// to its host block pairs[2p+1] (to_host), or the other way. mirrors: a device array; pairs:
// host memory, copied into the launches' parameters (free to reuse on return). Launched on
// `stream` (a cudaStream_t).
void kv_block_copy(const KvCopyMirror* mirrors, int num_mirrors, const int32_t* pairs, int64_t n, bool to_host,
                   void* stream);

}  // namespace ts::ops::cuda
