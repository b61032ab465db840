// `tokenspeed bench --linear-lab`: the linear kernels over bf16 and FP8 (e4m3, block-128 and
// per-channel scales, kept as stored) weights at Llama-3.1-8B's shapes, side by side, with the
// copy-bandwidth ceiling measured in the same run. Reported per shape and row count M: time per
// call, GB/s of the weight bytes as stored (FP8 values + f32 scales; bf16 values) and that as a
// share of the copy ceiling (read + write bytes, the bench's convention). Weights rotate
// through enough copies to miss the L2 cache, as a model's layers do.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace ts::bench {

struct LinearLabOptions {
  std::vector<int> ms{1, 2, 4, 8, 16, 64, 512};
  int iters = 40;
  size_t copy_bytes = size_t(1) << 30;
};

// Markdown table (CUDA builds only; otherwise an error).
std::string run_linear_lab(const LinearLabOptions& o);

// `tokenspeed bench --gemm-lab`: the bf16 cuBLASLt GEMMs of prefill and mixed steps at
// Llama-3.1-8B's shapes per row count M, under algorithm choices side by side: the heuristic's
// first pick for exactly M; the pick for the power-of-two bucket above M (what an algorithm cache
// keyed by that bucket holds when the bucket's largest size was asked first, as a largest-first
// graph capture does); the pick for the bucket's smallest size; and the fastest of the heuristic's
// first `candidates` for M (and which one). TFLOP/s with the dense GEMM ceiling measured in the
// same run; a per-M total over one 32-layer forward.
struct GemmLabOptions {
  std::vector<int> ms{64, 128, 256, 384, 512, 520, 544, 561, 576, 581, 596, 640, 704, 768, 896, 1024, 1536, 2048};
  int iters = 20;
  int candidates = 8;
  int layers = 32;
};
std::string run_gemm_lab(const GemmLabOptions& o);

// `tokenspeed bench --moe-lab`: one MoE layer's routed experts (ops::moe_experts) at
// Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048, intermediate 768), bf16 vs FP8
// block-128 and NVFP4 kept as stored, per token count M: time per layer, GB/s over the expert
// bytes actually read (distinct routed experts x their stored bytes) and its share of the copy
// ceiling of the same run. Routing is random and changes every call, so experts come from HBM.
struct MoeLabOptions {
  std::vector<int> ms{1, 2, 4, 8, 16, 64, 512};
  int iters = 40;
  size_t copy_bytes = size_t(1) << 30;
  int64_t experts = 128, top_k = 8, hidden = 2048, inter = 768;
};
std::string run_moe_lab(const MoeLabOptions& o);

}  // namespace ts::bench
