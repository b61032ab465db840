// ForwardBatch: everything one model forward needs, built by the ModelRunner from the
// scheduler's decision. Tensors live on the model's device; host mirrors of the small
// metadata are kept for the CPU backend and for CUDA launch configuration.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace ts {

enum class ForwardMode { prefill, decode, mixed, verify, idle };

struct ForwardBatch {
  ForwardMode mode = ForwardMode::idle;
  int num_tokens = 0;
  Tensor input_ids;     // i32 [T]
  Tensor positions;     // i32 [T]
  Tensor slot_mapping;  // i32 [T] (-1: padding, not written)
  ops::AttnMeta attn;   // per-sequence query ranges, kv lengths, block tables
  Tensor logits_index;  // i32 [N]: rows whose logits are needed (last row of each sampling seq)
  int num_logits = 0;
  // i32 [S]: each sequence's recurrent-state row (hybrid models; -1: none, e.g. padding).
  Tensor state_slots;
  bool logits_all_rows = false;  // logits_index is the identity over all T rows (no gather needed)
  // EAGLE3: when set, the model copies the residual stream entering each capture layer into
  // aux_hidden [T, n_capture * H] (the i-th captured layer into column block i).
  bool capture_aux = false;
  Tensor aux_hidden;
  // Greedy decode without logits (#22): when greedy_ids (i32 [>= num_logits], model device) and
  // greedy_scratch (i64 [ops::kLmArgmaxScratch], zeroed) are set by the runner, the LM head may
  // write each logits row's argmax into greedy_ids instead of computing logits
  // (ops::lm_head_argmax); it then sets greedy_done and the forward returns no logits. The
  // runner sets them only when every sampled row is greedy with no logits processing.
  Tensor greedy_ids, greedy_scratch;
  bool greedy_done = false;
};

// Per-layer paged KV storage. k[l], v[l]: [num_blocks, block_size, kv_heads, head_dim].
// MLA stores its compressed latent in k (v unused, undefined). aux[l]: the optional third
// cache of KvSpec (undefined on layers without one).
// Hybrid models also keep per-sequence recurrent state here, one row per state slot, on the
// layers their StateSpec flags (undefined elsewhere): conv[l] [slots, conv_len, conv_dim]
// (model dtype) and ssm[l] [slots, heads, k_dim, v_dim] (f32).
struct KvPool {
  std::vector<Tensor> k, v, aux;
  int block_size = 0;
  int64_t num_blocks = 0;
  std::vector<Tensor> conv, ssm;
  int num_state_slots = 0;
};

}  // namespace ts
