// `tokenspeed bench`: a model's prefill and decode speed next to this machine's ceilings, all
// measured in one run (see ceilings.h). Figures:
//  - prefill at each prompt length: one ModelRunner::run of one sequence, tok/s and TFLOP/s
//    (FLOPs = 2*P_layers*T + 2*P_head + 2*L*heads*hd*T^2, the last term causal attention
//    QK^T + PV) as a share of the GEMM ceiling;
//  - batch-1 decode after that prefill, and decode at batch B with context C: tok/s and GB/s
//    (bytes = weights read per step + B * ctx * KV bytes per token) as a share of the copy ceiling.
// Decode grid caches are not prefilled: each sequence gets C tokens' worth of blocks whose
// contents are whatever the pool holds (zeros or earlier data). Attention reads all C tokens
// either way, so the timing equals a real cache's, without the prefill cost.
// Times are wall time of ModelRunner::run (batch build, host->device metadata, forward) plus
// greedy sampling where the logits are — on the device, as the engine's eager steps (host_logits:
// logits to the host and sampled there, as for requests with logprobs or penalties) —
// device-synchronised, after warm-up; forward_only times the batch build and Model::forward
// alone. profile (CUDA) adds one step per decode row with the device time of every op.
// mixed_chunks adds, per decode row and chunk size P, a step of the row's decodes plus a P-token
// prefill chunk (the scheduler's order: decodes first), the chunk alone, and their ratio
// mixed / (decode + chunk): below 1 the chunk rides along with the decodes' weight reads.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ts::bench {

struct BenchOptions {
  std::string model_dir;
  Device device = Device::cpu;
  std::vector<int> prompt_lens = {1024, 8192};
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> contexts = {1024, 8192};
  int decode_steps = 32;
  int prefill_repeats = 3;
  int block_size = 64;
  double mem_fraction = 0.9;  // CUDA: share of GPU memory for weights + KV pool
  double cpu_kv_gb = 2.0;     // CPU: KV pool limit
  int64_t kv_tokens = 0;      // explicit KV pool size (0: from memory)
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto | bf16 | fp8 | fp8_e4m3
  int64_t gemm_size = 0;      // GEMM ceiling M = N = K (0: default)
  size_t copy_bytes = 0;      // copy ceiling buffer (0: default)
  uint64_t seed = 1;
  bool forward_only = false;  // time BatchBuilder + Model::forward instead of ModelRunner::run
  bool host_logits = false;   // steps copy the logits to the host and sample there
  bool profile = false;       // CUDA: one extra step per decode row with per-op device times
  bool unfused_head = false;  // greedy steps compute logits + sample instead of the fused LM head + argmax
  // CUDA: steps run through the engine's CUDA graphs (decode graphs per batch bucket, breakable
  // prefill graphs up to graph_prefill_tokens), as `serve` runs them, instead of eagerly. Mixed
  // steps then take the prefill graph of their padded token bucket, as served mixed steps do.
  bool graphs = false;
  int graph_prefill_tokens = 2048;
  // CUDA: the model's steps run with serve's --enable-deterministic-inference kernels
  // (LaunchConfig::batch_invariant; the ceilings are measured before, in the default mode), so
  // a run with and one without give that mode's cost.
  bool deterministic = false;
  // CUDA: serve's --gemm-autotune (LaunchConfig::gemm_autotune).
  bool gemm_autotune = false;
  // Mixed steps (--enable-mixed-batch): after each decode row (B, C), one step of its B decodes
  // plus one P-token prefill chunk of a fresh sequence, per P here, next to that chunk alone; the
  // figure is how much of the prefill rides along with the bandwidth-bound decodes
  // (mixed vs decode-only + prefill-only, all in this run).
  std::vector<int> mixed_chunks;
};

struct BenchResult {
  nlohmann::json json;   // everything, machine-readable
  std::string markdown;  // the report table
};

BenchResult run_model_bench(const BenchOptions& o);

}  // namespace ts::bench
