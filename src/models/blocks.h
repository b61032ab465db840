// Shared building blocks for the model files: attention over the paged cache, the gated MLP,
// the embedding + final-norm + LM-head ends of the network, and EAGLE3 aux capture.
#pragma once
#include "core/workspace.h"
#include "models/model.h"
#include "ops/ops.h"
#include "parallel/comm.h"

namespace ts::models {

// [T, heads * hd] (possibly a column slice of a wider buffer) viewed as [T, heads, hd].
Tensor as_heads(const Tensor& x, int64_t heads, int64_t hd);

struct AttentionWeights {
  Tensor qkv;       // [(nh + 2 nkv) * hd, H_in]  q | k | v rows stacked
  Tensor qkv_bias;  // optional [(nh + 2 nkv) * hd]
  Tensor o;         // [H, nh * hd]
  Tensor q_norm, k_norm;  // optional per-head norms [hd] (Qwen3)
  // Qwen3.5: qkv also emits an output gate (nh * hd rows after v); attention output is
  // multiplied by sigmoid(gate) before o.
  bool output_gate = false;
};

struct AttentionShape {
  int64_t num_heads, num_kv_heads, head_dim;
  float scale;
  float eps;
};

// h [T, H_in] normed input -> out [T, H]. Writes this layer's K/V into kv_k/kv_v.
void attention_block(const Tensor& h, const AttentionWeights& w, const AttentionShape& s, const ops::Rope& rope,
                     ForwardBatch& batch, Tensor& kv_k, Tensor& kv_v, Workspace& ws, Tensor& out);

struct MlpWeights {
  Tensor gate_up;  // [2I, H] gate rows then up rows
  Tensor down;     // [H, I]
};
// h [T, H] -> out [T, H]
void mlp_block(const Tensor& h, const MlpWeights& w, Workspace& ws, Tensor& out);

// The residual stream entering layer l, normed into h: layer 0 norms the embedding (residual);
// later layers first add the previous sub-layer output x (fused add + norm; h then aliases x).
// The input of the layer is captured for EAGLE3 into aux slot `slot` (-1: not captured).
void layer_input(ForwardBatch& b, int64_t l, Tensor& residual, Tensor& x, Tensor& h, const Tensor& norm_w, float eps,
                 int slot);

// Copies the residual stream into aux_hidden's column block `slot` when capturing.
void capture_aux(ForwardBatch& batch, const Tensor& residual, int slot);

// Final norm over the rows that need logits, then the LM head: returns f32 logits [N, V].
Tensor lm_head_logits(ForwardBatch& batch, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& head,
                      Workspace& ws);

// Vocab-parallel LM head: every rank computes f32 logits of its vocabulary shard (head_shard:
// rows [shard.start, shard.start + shard.count)), all-gathers them and returns the full
// [N, vocab] logits (on every rank).
Tensor lm_head_logits_tp(ForwardBatch& batch, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& head_shard,
                         int64_t vocab, parallel::Comm& comm, Workspace& ws);

}  // namespace ts::models
