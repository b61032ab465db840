// Kernel choices made explicit. Production code passes the default KernelPolicy{} (every field
// "auto": the lab-chosen per-shape defaults inside each op); the kernel labs (bench/kernels) and
// the CUDA tests pass a policy to force one path. No op reads mutable global state to pick a
// kernel, so two engines (or a test and an engine) in one process cannot steer each other.
#pragma once
#include <cstdint>

namespace ts::ops {

// linear: 0 auto, 1 force cuBLASLt, 2 force GEMV (only where the GEMV kernel applies;
// otherwise cuBLASLt), 3 force the tensor-core small-batch form over weights kept as stored
// (quantized linears: QuantKernel::mma; routed experts: the grouped MMA over stored experts;
// bf16 weights: as auto).
enum class LinearPath : uint8_t { automatic = 0, cublaslt = 1, gemv = 2, mma = 3 };

struct KernelPolicy {
  LinearPath linear = LinearPath::automatic;
  // moe_experts token tile: rows of a work item go through the tensor cores moe_tile*8 at a time
  // (1, 2, 4 or 8; 0: chosen from the expected rows per expert). Results do not depend on it.
  int moe_tile = 0;
  // paged_attention: 0 auto, 1 force the generic (CUDA-core, split-KV) kernel; where the head
  // dim allows (64/128, hd_v == hd; otherwise generic): 2 the v1 tensor-core kernel, 3 the
  // split-KV flash-decoding kernel (any q_len), 4 the FA2-style prefill kernel with 64-row
  // blocks, 5 with 128-row blocks and 32-token score slices, 6 with 128-row blocks and 64-token
  // slices.
  int attn_path = 0;
  // > 0 forces the split count of the generic and split-KV attention kernels (0: heuristic).
  int attn_splits = 0;
};

}  // namespace ts::ops
