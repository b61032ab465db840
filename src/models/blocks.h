// Shared building blocks for the model files: attention over the paged cache, the gated MLP,
// the embedding + final-norm + LM-head ends of the network, and EAGLE3 aux capture.
#pragma once
#include <type_traits>

#include "core/workspace.h"
#include "models/model.h"
#include "ops/graph_hooks.h"
#include "ops/linear_weight.h"
#include "ops/ops.h"
#include "models/weights.h"
#include "parallel/comm.h"
#include "parallel/layers.h"
#include "parallel/mapping.h"
#include "parallel/world.h"

namespace ts::models {

// The load-time checks of a model file on the parallel layers: in a world of several ranks the
// rank has its groups and an attention communicator of the mapping's size. Errors name the
// checkpoint and the mapping.
void check_sharded_load(const io::ModelConfig& cfg, const LoadOptions& opts);

// [T, heads * hd] (possibly a column slice of a wider buffer) viewed as [T, heads, hd].
Tensor as_heads(const Tensor& x, int64_t heads, int64_t hd);

struct AttentionWeights {
  ops::LinearWeight qkv;  // [(nh + 2 nkv) * hd, H_in]  q | k | v rows stacked
  Tensor qkv_bias;  // optional [(nh + 2 nkv) * hd]
  ops::LinearWeight o;    // [H, nh * hd]
  // optional [H]: o_proj.bias (transformers' Llama / Qwen3 with attention_bias, which biases
  // o_proj as well as q/k/v). Held by the rank of the first head shard only: the row-parallel
  // o_proj's partial sums are reduced over the attention ranks, so it is added once.
  Tensor o_bias;
  Tensor q_norm, k_norm;  // optional per-head norms [hd] (Qwen3)
  // Qwen3.5: qkv also emits an output gate (nh * hd rows after v); attention output is
  // multiplied by sigmoid(gate) before o.
  bool output_gate = false;
  // The FP8 KV cache's per-tensor scales from the checkpoint (load_kv_scales; 1.0 without).
  ops::KvScales kv_scales;
  // The layer's sliding window (io::ModelConfig::window_of; 0: full causal attention).
  int window = 0;
};

// The FP8 KV cache's scales of the attention module `pre` + "self_attn." as checkpoints ship
// them: vLLM's self_attn.k_scale / v_scale, ModelOpt's k_proj.k_scale / v_proj.v_scale,
// compressed-tensors' k_proj.output_scale / v_proj.output_scale, the old self_attn.kv_scale (both).
// Each a positive finite scalar (a startup error naming the file and tensor otherwise); 1.0 where
// absent. Caches in the model's dtype ignore them.
ops::KvScales load_kv_scales(const WeightLoader& wl, const std::string& pre);

struct AttentionShape {
  int64_t num_heads, num_kv_heads, head_dim;
  float scale;
  float eps;
};

// h [T, H_in] normed input -> out [T, H]. Writes this layer's K/V into kv_k/kv_v.
void attention_block(const Tensor& h, const AttentionWeights& w, const AttentionShape& s, const ops::Rope& rope,
                     ForwardBatch& batch, Tensor& kv_k, Tensor& kv_v, Workspace& ws, Tensor& out);

struct MlpWeights {
  ops::LinearWeight gate_up;  // [2I, H] gate rows then up rows
  ops::LinearWeight down;     // [H, I]
};
// h [T, H] -> out [T, H]
void mlp_block(const Tensor& h, const MlpWeights& w, Workspace& ws, Tensor& out);

// A dense MLP layer on this rank: f(x_in, y_out) runs the rank's shard (the dense TP group's
// columns: load_mlp_shard with even_shard(inter, dense_tp, dense_tp_rank)). g null: one rank,
// y = f(x). Otherwise the dense TP group may equal, lie inside or span several attention groups
// (--dense-tp-size; parallel::group_sharded_forward). Returns true when y is a partial sum over
// the attention group (decoder_forward fuses its all-reduce into the next add + norm), false
// when complete. span: the model's host scratch for the spanning case.
template <class F>
bool dense_mlp(const parallel::ParallelGroups* g, parallel::SpanGather& span, const Tensor& x, Tensor& y,
               Workspace& ws, F&& f) {
  if (!g) {
    f(x, y);
    return true;
  }
  return parallel::group_sharded_forward(*g->dense_tp, *g->attn_tp, span, x, y, ws, f);
}

// The residual-stream forms for decode (#22): the sub-layer reads the residual stream, applies
// its input norm inside the first GEMV's prologue and adds its output into the residual inside
// the last GEMV's epilogue (ops::rmsnorm_linear / linear_silu_mul / linear_add), so no separate
// add + norm launch remains. residual [T, H] is updated in place.
void attention_block_residual(Tensor& residual, const Tensor& in_norm, float eps, const AttentionWeights& w,
                              const AttentionShape& s, const ops::Rope& rope, ForwardBatch& batch, Tensor& kv_k,
                              Tensor& kv_v, Workspace& ws);
void mlp_block_residual(Tensor& residual, const Tensor& in_norm, float eps, const MlpWeights& w, Workspace& ws);

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

// --- this rank's shard at load time (the whole tensors at TP 1) ---------------------------------
// q|k|v rows of this rank's heads (shard_heads: KV heads replicated past num_kv_heads), their
// biases, o_proj's matching columns (its bias on the first head shard's rank) and the optional
// per-head q/k norms (replicated).
AttentionWeights load_attention_shard(WeightLoader& wl, const std::string& pre, int64_t hidden, int64_t heads,
                                      int64_t kv_heads, int64_t head_dim, bool qkv_bias, bool qk_norm,
                                      const parallel::HeadShard& hs);
// Gated MLP under `pre` ("model.layers.3.mlp."): gate|up rows [ir] (column-parallel), down's
// columns [ir] (row-parallel).
MlpWeights load_mlp_shard(WeightLoader& wl, const std::string& pre, int64_t hidden, int64_t inter,
                          const parallel::Range& ir);
// The token embedding and the LM head of attention-TP rank `rank` of `tp`: the table
// vocab-parallel (embed_tp == tp) or replicated (embed_tp 1), the head vocab-parallel at tp > 1 (a
// view of the table when the rows coincide, or a shard of the tied table).
struct EmbedHead {
  Tensor embed, head;
  int embed_tp = 1;
  int64_t embed_start = 0;
};
// root: the tensors' prefix ("model." or a VL checkpoint's "model.language_model.").
EmbedHead load_embed_head(WeightLoader& wl, int64_t vocab, int64_t hidden, bool tied, int tp, int rank, int embed_tp,
                          const std::string& root = "model.");

// Tensor parallelism of one decoder stack (the defaults: one rank, the single-GPU path).
//  attn: the attention TP group; at size > 1 every attention output (row-parallel o_proj) is
//    this rank's partial sum, reduced together with the residual add and the next norm
//    (Comm::all_reduce_add_rmsnorm). The MLP / MoE callable says per layer whether its output is
//    such a partial sum too (returns true; a void callable: always) or already complete.
//  embed_tp / embed_start: the embedding table's layout (EmbedLayout); a sharded table gives
//    partial rows whose all-reduce is fused into layer 0's norm (the seed's rule: only then).
//  head_tp / vocab: the LM head is vocab-parallel over attn when head_tp > 1 (rows of
//    shard_vocab(vocab, head_tp, rank)), its logits all-gathered.
struct DecoderTp {
  parallel::Comm* attn = nullptr;
  int embed_tp = 1;
  int64_t embed_start = 0;
  int head_tp = 1;
  int64_t vocab = 0;
  bool sharded() const { return attn && attn->size() > 1; }
};

// The decoder stack every model file runs (pre-norm residual layers):
//   residual = embed(ids); per layer l: h = input_norm(residual) (layer_input: EAGLE3 capture),
//   attn(l, h, x) writes the attention output [T, H] into x, then residual += x and
//   x = post_norm(residual), mlp(l, x, y) writes the MLP/MoE output [T, H] into y;
//   finally residual += last output and the LM head. norms(l) returns {input_norm, post_norm}.
// `m` supplies the EAGLE3 capture slots. With tp.sharded() the same stack runs on this rank's
// shard (DecoderTp above); otherwise exactly the single-rank path.
struct DecoderDims {
  int64_t layers = 0, hidden = 0;
  float eps = 1e-6f;
  DType dtype = DType::f32;
};
// The dense decoder's fused decode flow (one rank, ops::fuses_norm_gemv at these rows): per layer
// l, layer(l, residual) runs attention_block_residual then mlp_block_residual (the residual
// stream is updated in place, the EAGLE3 capture reads it at every layer's input); then the LM
// head. The same values as decoder_forward's single-rank path up to the order of the norms' sums.
template <class Layer>
Tensor dense_decoder_forward_fused(const Model& m, ForwardBatch& b, Workspace& ws, const DecoderDims& d,
                                   const Tensor& embed, const Tensor& final_norm, const Tensor& head, Layer layer) {
  ws.reset();
  Tensor residual = ws.alloc({b.num_tokens, d.hidden}, d.dtype);
  ops::embedding(b.input_ids, embed, residual);
  ops::graph_segment_begin();
  for (int64_t l = 0; l < d.layers; ++l) {
    capture_aux(b, residual, m.capture_slot(int(l)));
    layer(l, residual);
  }
  capture_aux(b, residual, m.capture_slot(int(d.layers)));
  return lm_head_logits(b, residual, final_norm, d.eps, head, ws);
}

template <class Norms, class Attn, class Mlp>
Tensor decoder_forward(const Model& m, ForwardBatch& b, Workspace& ws, const DecoderDims& d, const Tensor& embed,
                       const Tensor& final_norm, const Tensor& head, Norms norms, Attn attn, Mlp mlp,
                       const DecoderTp& tp = {}) {
  ws.reset();
  const int64_t T = b.num_tokens;
  Tensor residual = ws.alloc({T, d.hidden}, d.dtype);
  Tensor x = ws.alloc({T, d.hidden}, d.dtype);  // sub-layer output, then its normed sum
  Tensor h = ws.alloc({T, d.hidden}, d.dtype);
  Tensor y = ws.alloc({T, d.hidden}, d.dtype);  // ping-pong with x across layers
  if (!tp.sharded()) {
    ops::embedding(b.input_ids, embed, residual);
    ops::graph_segment_begin();  // the embedding stays outside the captured region
    for (int64_t l = 0; l < d.layers; ++l) {
      auto [input_norm, post_norm] = norms(l);
      layer_input(b, l, residual, x, h, input_norm, d.eps, m.capture_slot(int(l)));
      attn(l, h, x);
      ops::fused_add_rmsnorm(x, residual, post_norm, d.eps);
      mlp(l, x, y);
      std::swap(x, y);
    }
    ops::add_inplace(residual, x);  // the final residual stream
    capture_aux(b, residual, m.capture_slot(int(d.layers)));
    return lm_head_logits(b, residual, final_norm, d.eps, head, ws);
  }
  // Tensor parallel: sub-layer outputs that are partial sums over the attention group are
  // all-reduced together with the residual add and the next norm (one fused collective).
  parallel::Comm& comm = *tp.attn;
  const bool embed_sharded = tp.embed_tp > 1;
  if (embed_sharded) ops::embedding(b.input_ids, embed, x, tp.embed_start);  // partial rows
  else ops::embedding(b.input_ids, embed, residual);
  ops::graph_segment_begin();
  bool partial = embed_sharded;  // what x holds entering the next norm
  for (int64_t l = 0; l < d.layers; ++l) {
    auto [input_norm, post_norm] = norms(l);
    if (l == 0 && !embed_sharded) {
      ops::rmsnorm(residual, input_norm, d.eps, h);
    } else {
      if (partial) comm.all_reduce_add_rmsnorm(x, residual, input_norm, d.eps, /*residual_init=*/l == 0);
      else ops::fused_add_rmsnorm(x, residual, input_norm, d.eps);
      h = x;
    }
    capture_aux(b, residual, m.capture_slot(int(l)));
    attn(l, h, y);
    std::swap(x, y);  // x: attention partial sums (h may alias the other buffer)
    comm.all_reduce_add_rmsnorm(x, residual, post_norm, d.eps, false);
    if constexpr (std::is_same_v<decltype(mlp(l, x, y)), bool>) partial = mlp(l, x, y);
    else {
      mlp(l, x, y);
      partial = true;
    }
    std::swap(x, y);
  }
  if (partial) comm.all_reduce(x);
  ops::add_inplace(residual, x);
  capture_aux(b, residual, m.capture_slot(int(d.layers)));
  if (tp.head_tp > 1) return lm_head_logits_tp(b, residual, final_norm, d.eps, head, tp.vocab, comm, ws);
  return lm_head_logits(b, residual, final_norm, d.eps, head, ws);
}

}  // namespace ts::models
