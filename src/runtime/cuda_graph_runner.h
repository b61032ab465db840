// CudaGraphRunner: CUDA graphs for the ModelRunner.
//  - Decode: one graph per batch-size bucket (1, 2, 4, 8, then steps of 8 up to max_bs) and
//    context bucket, the whole forward captured, inputs in the BatchBuilder's fixed buffers,
//    batches padded with dummy sequences, attention sized for the longest context (kernels read
//    real lengths from device memory); beside it a small graph of its sampling tail (grammar
//    bitmask from the runner's TokenMaskBuffer, logits processing, sampler).
//  - Prefill: "breakable" graphs per total-token bucket (16, then steps of the largest power
//    of two <= size/8, capped at 512, up to max_prefill_tokens). The forward is captured as
//    segments; attention and KV writes run eagerly between segment replays (ops/graph_hooks.h),
//    the embedding before and the LM head after stay eager. One graph serves any mix of
//    sequences whose tokens fit the bucket.
// All buckets share the model's workspace arena (captured largest first; the arena is frozen
// afterwards so captured addresses stay valid). A failed capture leaves that bucket eager.
// Engine-thread only.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "runtime/model_runner.h"

namespace ts {

struct GraphOptions {
  bool decode = true, prefill = true;
  int max_bs = 160;
  int max_prefill_tokens = 2048;
  int max_context = 4096;   // longest sequence (sizes the block-table width and attention grids)
  int eager_max_tokens = 8192;  // largest eager forward (the arena is sized for it before freezing)
  bool progress = true;     // progress bars on stderr (rank 0)
  bool capture_aux = false; // EAGLE3: prefill graphs also copy the aux hidden states
};

std::vector<int> decode_buckets(int max_bs);
// Context bounds of the decode graphs (1k, 4k, 16k, ... then max_context): split-KV grids are
// sized from the bound baked into a graph, so short contexts get their own graphs.
std::vector<int> context_buckets(int max_context);
std::vector<int> prefill_buckets(int max_tokens);

class CudaGraphRunner {
 public:
  CudaGraphRunner(ModelRunner& runner, const GraphOptions& o);
  ~CudaGraphRunner();
  void capture_all();
  // Runs the step through a graph when one fits. Returns false (nothing done) otherwise.
  bool try_run(const std::vector<SeqChunk>& chunks, bool capture_aux, ForwardBatch& batch, Tensor& logits);
  // Decode with sampling inside the graph: one id per chunk (rows[i] samples chunk i). Returns
  // false (nothing done) when no decode graph fits.
  // proc: the rows' device logits processing (runtime/device_logits.h), applied inside the graph
  // before sampling, the counts updated after it (null: none).
  // masks: the rows' grammar masks (runtime/token_mask.h; null: none). Each decode bucket is two
  // graphs, the forward and its sampling tail (token bitmask, logits processing, sampler, counts):
  // the masks are uploaded between the two replays, so the forward is on the device before the
  // host waits for a mask that depends on the previous step's token.
  bool try_run_sampled(const std::vector<SeqChunk>& chunks, const std::vector<ops::SamplingRow>& rows, ForwardBatch& batch,
                       std::vector<int32_t>& ids, const std::vector<ops::LogitsProcRow>* proc = nullptr,
                       const StepMasks* masks = nullptr);
  // Greedy decode without logits (ModelRunner::run_greedy): graphs whose LM head writes the
  // argmax ids (captured for the batch sizes where ops::lm_head_argmax fuses). False (nothing
  // done) when none fits.
  bool try_run_greedy(const std::vector<SeqChunk>& chunks, ForwardBatch& batch, std::vector<int32_t>& ids);
  double capture_seconds() const { return capture_s_; }
  size_t pool_bytes() const;
  int decode_graphs() const;
  int prefill_graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double capture_s_ = 0;
};

}  // namespace ts
