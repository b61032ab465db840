#include "models/eagle3_draft.h"

#include <algorithm>
#include <cmath>

#include "models/rope.h"
#include "models/weights.h"
#include <spdlog/spdlog.h>

namespace ts::models {

DraftEmbed resolve_draft_embed(int64_t rows, int64_t cols, int64_t vocab, int64_t hidden, int target_tp) {
  if (rows == vocab && cols == hidden) return DraftEmbed::share;
  const parallel::VocabShard v = parallel::shard_vocab(vocab, std::max(target_tp, 1), 0);
  if (target_tp > 1 && rows == v.count && cols == hidden) return DraftEmbed::rebuild;
  fail("EAGLE3: cannot share the target embedding of shape [{}, {}]: the draft expects [{}, {}] (replicated) or [{}, {}] "
       "(vocab-parallel over {} GPUs)",
       rows, cols, vocab, hidden, v.count, hidden, target_tp);
}

Eagle3Draft::Eagle3Draft(const std::string& dir, const Model& target)
    : device_(target.device()), dtype_(target.dtype()), ws_(target.device()) {
  io::ModelConfig c = io::load_config(dir);
  TS_CHECK(c.architecture == "LlamaForCausalLMEagle3" || c.architecture == "Eagle3LlamaForCausalLM",
           "{}: architecture {} is not an EAGLE3 draft (expected LlamaForCausalLMEagle3)", c.path, c.architecture);
  TS_CHECK(c.num_layers == 1, "{}: EAGLE3 drafts have one decoder layer (num_hidden_layers {})", c.path, c.num_layers);
  const io::ModelConfig& tc = target.config();
  hidden_ = c.hidden_size;
  eps_ = float(c.rms_norm_eps);
  int64_t H = hidden_, Ht = c.get<int64_t>("target_hidden_size", tc.hidden_size), hd = c.head_dim;
  std::vector<int> ids;
  if (c.raw.contains("eagle_config") && c.raw["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"))
    ids = c.raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>();
  if (ids.empty()) {
    int L = int(tc.num_layers);
    aux_layers_ = {2, L / 2, L - 3};
  } else {
    for (int i : ids) aux_layers_.push_back(i + 1);  // "output of layer id" = input of layer id+1
  }
  int64_t k = int64_t(aux_layers_.size());
  WeightLoader wl(io::Checkpoint::open(dir), device_);
  // The draft shares the target's embedding when the layouts match; a vocab-parallel target
  // table (tensor parallelism) is rebuilt as the draft's own replicated table.
  Tensor te = target.embed_table();
  const bool target_sharded = target.embed_layout().tp_size > 1;
  const bool head_sharded = target.mapping().tp_size > 1;
  DraftEmbed how = resolve_draft_embed(te.size(0), te.size(1), tc.vocab_size, H, target_sharded ? target.mapping().tp_size : 1);
  if (how == DraftEmbed::share) {
    embed_ = te;
  } else {
    WeightLoader tl(io::Checkpoint::open(tc.dir), device_);
    embed_ = tl.load("model.embed_tokens.weight", {tc.vocab_size, H});
    spdlog::info("EAGLE3: the target embedding is vocab-parallel ({}); the draft rebuilt a replicated table [{}, {}]",
                 te.shape_str(), tc.vocab_size, H);
  }
  fc_ = wl.load("fc.weight", {H, k * Ht});
  bool fc_norm = c.get<bool>("fc_norm", false) || c.get<bool>("norm_before_fc", false);
  if (fc_norm)
    for (int64_t i = 0; i < k; ++i) fc_norms_.push_back(wl.load("fc_norm." + std::to_string(i) + ".weight", {Ht}));
  input_norm_ = wl.load("midlayer.input_layernorm.weight", {H});
  hidden_norm_ = wl.load("midlayer.hidden_norm.weight", {H});
  post_norm_ = wl.load("midlayer.post_attention_layernorm.weight", {H});
  int64_t nh = c.num_heads, nkv = c.num_kv_heads;
  attn_.qkv = wl.load_stacked({"midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight"},
                              {{nh * hd, 2 * H}, {nkv * hd, 2 * H}, {nkv * hd, 2 * H}});
  attn_.o = wl.load("midlayer.self_attn.o_proj.weight", {H, nh * hd});
  mlp_.gate_up = wl.load_stacked({"midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"},
                                 {{c.intermediate_size, H}, {c.intermediate_size, H}});
  mlp_.down = wl.load("midlayer.mlp.down_proj.weight", {H, c.intermediate_size});
  norm_ = wl.load("norm.weight", {H});
  int64_t dv = c.get<int64_t>("draft_vocab_size", 0);
  if (dv > 0 && wl.has("lm_head.weight")) {
    head_ = wl.load("lm_head.weight", {dv, H});
    Tensor d2t = wl.raw("d2t");
    TS_CHECK(d2t.dtype == DType::i64 && d2t.numel() == dv, "{}: d2t must be I64 [{}], got {} {}", c.path, dv,
             dtype_name(d2t.dtype), d2t.shape_str());
    d2t_.assign(d2t.ptr<int64_t>(), d2t.ptr<int64_t>() + dv);
    for (int64_t i = 0; i < dv; ++i)
      TS_CHECK(i + d2t_[size_t(i)] >= 0 && i + d2t_[size_t(i)] < tc.vocab_size, "{}: d2t[{}] maps outside the target vocabulary", c.path, i);
    std::vector<int32_t> off(d2t_.begin(), d2t_.end());
    d2t_off_ = Tensor::from_blob(off.data(), {dv}, DType::i32, Device::cpu).to(device_);
  } else if (!head_sharded) {
    head_ = target.lm_head();  // no own vocabulary: share the target's LM head
  } else {
    // The target's head is vocab-parallel: the (unsharded) draft loads the whole head.
    WeightLoader tl(io::Checkpoint::open(tc.dir), device_);
    bool tied = tc.tie_word_embeddings && !tl.has("lm_head.weight");
    head_ = tied ? embed_ : tl.load("lm_head.weight", {tc.vocab_size, H});  // embed_ is the whole table here
  }
  shape_ = {nh, nkv, hd, float(1.0 / std::sqrt(double(hd))), eps_};
  rope_ = build_rope(c.rope, int(hd), c.max_position_embeddings, std::max(c.max_position_embeddings, tc.max_position_embeddings),
                     false, device_);
}

void Eagle3Draft::project(const Tensor& aux, Tensor& out) {
  if (aux.rows() == 0) return;
  if (fc_norms_.empty()) {
    ops::linear(aux, fc_, out);
    return;
  }
  // Per-chunk norms into slices of one buffer: pairs in one rmsnorm_pair launch, an odd last
  // chunk alone — no concat.
  int64_t n = aux.rows(), ht = aux.size(-1) / int64_t(fc_norms_.size());
  WorkspaceScope scope(ws_);  // graph-capturable: no allocation outside the arena
  Tensor normed = ws_.alloc({n, aux.size(-1)}, aux.dtype);
  size_t i = 0;
  for (; i + 1 < fc_norms_.size(); i += 2) {
    Tensor oa = normed.narrow(1, int64_t(i) * ht, ht), ob = normed.narrow(1, int64_t(i + 1) * ht, ht);
    ops::rmsnorm_pair(aux.narrow(1, int64_t(i) * ht, ht), aux.narrow(1, int64_t(i + 1) * ht, ht), fc_norms_[i], fc_norms_[i + 1],
                      eps_, oa, ob);
  }
  if (i < fc_norms_.size()) {
    Tensor o = normed.narrow(1, int64_t(i) * ht, ht);
    ops::rmsnorm(aux.narrow(1, int64_t(i) * ht, ht), fc_norms_[i], eps_, o);
  }
  ops::linear(normed, fc_, out);
}

Tensor Eagle3Draft::forward(ForwardBatch& b, KvPool& kv, const Tensor& h_in, Tensor& r_out) {
  ws_.reset();
  const int64_t T = b.num_tokens, H = hidden_;
  Tensor e = ws_.alloc({T, H}, dtype_);
  ops::embedding(b.input_ids, embed_, e);
  // x = [input_layernorm(e) | hidden_norm(h)] written as two slices of one [T, 2H] buffer.
  Tensor x = ws_.alloc({T, 2 * H}, dtype_);
  Tensor xa = x.narrow(1, 0, H), xb = x.narrow(1, H, H);
  ops::rmsnorm_pair(e, h_in, input_norm_, hidden_norm_, eps_, xa, xb);
  Tensor a = ws_.alloc({T, H}, dtype_);
  attention_block(x, attn_, shape_, rope_, b, kv.k[0], kv.v[0], ws_, a);
  if (r_out.data != h_in.data) ops::copy_rows(h_in, r_out);  // r_out may alias h_in (in place)
  ops::fused_add_rmsnorm(a, r_out, post_norm_, eps_);  // r = h + attn; a = post_norm(r)
  Tensor m = ws_.alloc({T, H}, dtype_);
  mlp_block(a, mlp_, ws_, m);
  // r = r + mlp(post_norm(r)); m = norm(r), the LM head's input. With every row wanted (the
  // fixed-shape speculative step) the head reads m directly.
  ops::fused_add_rmsnorm(m, r_out, norm_, eps_);
  const int64_t n = b.num_logits;
  Tensor logits = ws_.alloc({n, head_.size(0)}, DType::f32);
  if (b.logits_all_rows && n == T) {
    ops::linear(m, head_, logits);
  } else {
    Tensor rows = ws_.alloc({n, H}, dtype_);
    ops::gather_rows(m, b.logits_index, rows);
    ops::linear(rows, head_, logits);
  }
  return logits;
}

}  // namespace ts::models
