// EAGLE3 draft head (LlamaForCausalLMEagle3): fc over the target's aux hidden states, one
// decoder layer whose attention reads [input_layernorm(embed) | hidden_norm(h)] (width 2H),
// final norm and a small-vocabulary LM head. Semantics: shared/docs/EAGLE3.md.
// The token embedding is the target's. Not a Model: it has its own forward signature.
#pragma once
#include <memory>
#include <string>

#include "core/workspace.h"
#include "models/blocks.h"
#include "models/model.h"

namespace ts::models {

// The draft runs unsharded (on rank 0 under tensor parallelism), so its default embedding
// layout is the replicated table [vocab, hidden]. Given the shape of the target's table on
// rank 0: share it when it is the replicated table; rebuild the draft's own replicated table
// (loaded from the target checkpoint) when it is the target's vocab-parallel shard
// [ceil(vocab / target_tp), hidden]; any other shape is an error naming both expected shapes.
enum class DraftEmbed { share, rebuild };
DraftEmbed resolve_draft_embed(int64_t rows, int64_t cols, int64_t vocab, int64_t hidden, int target_tp);

class Eagle3Draft {
 public:
  // Loads DIR, sharing `target`'s embedding (and LM head when the draft has no own vocab).
  Eagle3Draft(const std::string& dir, const Model& target);
  int64_t hidden() const { return hidden_; }
  int64_t aux_width() const { return fc_.size(1); }  // k * H_target
  int64_t draft_vocab() const { return head_.size(0); }
  KvSpec kv_spec() const { return {1, int(shape_.num_kv_heads), int(shape_.head_dim), int(shape_.num_kv_heads), int(shape_.head_dim)}; }
  // Captured target layers ("input of layer i") from eagle_aux_hidden_state_layer_ids.
  const std::vector<int>& aux_layer_inputs() const { return aux_layers_; }
  // out [n, H] = fc(aux [n, k*H_t]) (with the per-chunk fc norms when the checkpoint has them).
  void project(const Tensor& aux, Tensor& out);
  // One draft forward over batch rows: ids/positions/slots/attn in `b`, h_in [T, H] (fc'd aux
  // or the previous step's r). Writes r_out [T, H] (pre-norm hidden for the next step) and
  // returns f32 draft logits [b.num_logits, draft_vocab] for b.logits_index rows.
  Tensor forward(ForwardBatch& b, KvPool& kv, const Tensor& h_in, Tensor& r_out);
  // Maps a draft-vocabulary id to the target vocabulary.
  int32_t to_target(int32_t d) const { return d2t_.empty() ? d : d + int32_t(d2t_[size_t(d)]); }
  // The same map as i32 offsets on the draft's device (ops::argmax_rows); null without d2t.
  const Tensor* target_offsets() const { return d2t_off_.data ? &d2t_off_ : nullptr; }
  // Scratch arena of forward()/project(): sized and frozen before CUDA-graph capture.
  Workspace& workspace() { return ws_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

 private:
  Device device_;
  DType dtype_;
  int64_t hidden_ = 0;
  float eps_ = 1e-6f;
  Tensor embed_, fc_, input_norm_, hidden_norm_, post_norm_, norm_, head_;
  std::vector<Tensor> fc_norms_;  // one per aux chunk, or empty
  AttentionWeights attn_;
  MlpWeights mlp_;
  AttentionShape shape_{};
  ops::Rope rope_;
  std::vector<int64_t> d2t_;
  Tensor d2t_off_;  // i32 [draft_vocab]
  std::vector<int> aux_layers_;
  Workspace ws_;
};

}  // namespace ts::models
