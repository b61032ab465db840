#include "models/blocks.h"

#include <cmath>
#include <optional>

#include "ops/lm_head.h"

#include "ops/graph_hooks.h"

namespace ts::models {

void check_sharded_load(const io::ModelConfig& cfg, const LoadOptions& opts) {
  const parallel::Mapping& m = opts.mapping;
  TS_CHECK(m.world == 1 || (opts.groups && opts.comm && opts.comm->size() == m.tp_size),
           "{}: communicators do not match {}", cfg.path, m.str());
}


Tensor as_heads(const Tensor& x, int64_t heads, int64_t hd) {
  TS_CHECK(x.size(-1) == heads * hd, "as_heads: width {} != {} x {}", x.size(-1), heads, hd);
  Tensor t = x;
  int64_t rs = x.rows() ? x.row_stride() : heads * hd;
  t.ndim = 3;
  t.shape = {x.rows(), heads, hd, 0};
  t.stride = {rs, hd, 1, 0};
  return t;
}

void attention_block(const Tensor& h, const AttentionWeights& w, const AttentionShape& s, const ops::Rope& rope,
                     ForwardBatch& batch, Tensor& kv_k, Tensor& kv_v, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), qw = s.num_heads * s.head_dim, kw = s.num_kv_heads * s.head_dim;
  Tensor qkv = ws.alloc({t_n, qw + 2 * kw + (w.output_gate ? qw : 0)}, h.dtype);
  ops::linear(h, w.qkv, qkv, w.qkv_bias.data ? &w.qkv_bias : nullptr);
  Tensor q = as_heads(qkv.narrow(1, 0, qw), s.num_heads, s.head_dim);
  Tensor k = as_heads(qkv.narrow(1, qw, kw), s.num_kv_heads, s.head_dim);
  Tensor v = as_heads(qkv.narrow(1, qw + kw, kw), s.num_kv_heads, s.head_dim);
  // (q/k norm +) RoPE + the paged K/V write in one op (#22 decode fusion).
  const bool qk_norm = w.q_norm.data != nullptr;
  ops::rope_kv_write(q, k, v, qk_norm ? &w.q_norm : nullptr, qk_norm ? &w.k_norm : nullptr, s.eps, batch.positions,
                     rope, kv_k, kv_v, batch.slot_mapping, w.kv_scales);
  Tensor attn = ws.alloc({t_n, s.num_heads, s.head_dim}, h.dtype);
  ops::paged_attention(q, kv_k, kv_v, batch.attn, s.scale, attn, w.kv_scales, w.window);
  Tensor flat = attn.view({t_n, qw});
  if (w.output_gate) ops::sigmoid_gate(flat, qkv.narrow(1, qw + 2 * kw, qw));
  ops::linear(flat, w.o, out, w.o_bias.data ? &w.o_bias : nullptr);
}

void mlp_block(const Tensor& h, const MlpWeights& w, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), inter = w.down.in_features();
  Tensor gu = ws.alloc({t_n, 2 * inter}, h.dtype);  // only written where the op does not fuse
  Tensor act = ws.alloc({t_n, inter}, h.dtype);
  ops::linear_silu_mul(h, w.gate_up, act, gu);  // gate_up GEMV + SiLU-mul (#22 decode fusion; FP8 too)
  ops::linear(act, w.down, out);
}

void attention_block_residual(Tensor& residual, const Tensor& in_norm, float eps, const AttentionWeights& w,
                              const AttentionShape& s, const ops::Rope& rope, ForwardBatch& batch, Tensor& kv_k,
                              Tensor& kv_v, Workspace& ws) {
  WorkspaceScope scope(ws);
  const int64_t t_n = residual.rows(), hdim = residual.size(-1), qw = s.num_heads * s.head_dim,
                kw = s.num_kv_heads * s.head_dim;
  Tensor qkv = ws.alloc({t_n, qw + 2 * kw + (w.output_gate ? qw : 0)}, residual.dtype);
  Tensor xs = ws.alloc({t_n, hdim}, residual.dtype);  // scratch: written only where the op does not fuse
  const Tensor* qkv_bias = w.qkv_bias.data ? &w.qkv_bias : nullptr;
  // The fused decode GEMVs take bf16, FP8 and NVFP4 weights; MXFP8 runs the ops unfused.
  ops::rmsnorm_linear(residual, in_norm, eps, w.qkv, qkv, qkv_bias, xs);
  Tensor q = as_heads(qkv.narrow(1, 0, qw), s.num_heads, s.head_dim);
  Tensor k = as_heads(qkv.narrow(1, qw, kw), s.num_kv_heads, s.head_dim);
  Tensor v = as_heads(qkv.narrow(1, qw + kw, kw), s.num_kv_heads, s.head_dim);
  const bool qk_norm = w.q_norm.data != nullptr;
  ops::rope_kv_write(q, k, v, qk_norm ? &w.q_norm : nullptr, qk_norm ? &w.k_norm : nullptr, s.eps, batch.positions,
                     rope, kv_k, kv_v, batch.slot_mapping, w.kv_scales);
  Tensor attn = ws.alloc({t_n, s.num_heads, s.head_dim}, residual.dtype);
  ops::paged_attention(q, kv_k, kv_v, batch.attn, s.scale, attn, w.kv_scales, w.window);
  Tensor flat = attn.view({t_n, qw});
  if (w.output_gate) ops::sigmoid_gate(flat, qkv.narrow(1, qw + 2 * kw, qw));
  if (w.o_bias.data) {  // o_proj's output rounded with its bias, then the residual add (as unfused)
    ops::linear(flat, w.o, xs, &w.o_bias);
    ops::add_inplace(residual, xs);
  } else {
    ops::linear_add(flat, w.o, residual, xs);
  }
}

void mlp_block_residual(Tensor& residual, const Tensor& in_norm, float eps, const MlpWeights& w, Workspace& ws) {
  WorkspaceScope scope(ws);
  const int64_t t_n = residual.rows(), hdim = residual.size(-1), inter = w.down.in_features();
  Tensor gu = ws.alloc({t_n, 2 * inter}, residual.dtype);  // scratch, as xs
  Tensor xs = ws.alloc({t_n, hdim}, residual.dtype);
  Tensor act = ws.alloc({t_n, inter}, residual.dtype);
  ops::linear_silu_mul(residual, w.gate_up, act, gu, &in_norm, eps, &xs);
  ops::linear_add(act, w.down, residual, xs);
}

void layer_input(ForwardBatch& b, int64_t l, Tensor& residual, Tensor& x, Tensor& h, const Tensor& norm_w, float eps,
                 int slot) {
  if (l == 0) {
    capture_aux(b, residual, slot);
    ops::rmsnorm(residual, norm_w, eps, h);
  } else {
    ops::fused_add_rmsnorm(x, residual, norm_w, eps);  // residual = input of layer l
    capture_aux(b, residual, slot);
    h = x;
  }
}

void capture_aux(ForwardBatch& batch, const Tensor& residual, int slot) {
  if (!batch.capture_aux || slot < 0) return;
  int64_t hdim = residual.size(-1);
  Tensor dst = batch.aux_hidden.narrow(1, slot * hdim, hdim);
  ops::copy_rows(residual, dst);
}

Tensor lm_head_logits(ForwardBatch& batch, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& head,
                      Workspace& ws) {
  ops::graph_segment_end();  // the LM head runs eagerly: its row count changes per batch
  int64_t n = batch.num_logits, hdim = x.size(-1), vocab = head.size(0);
  batch.greedy_done = false;
  Tensor rows = ws.alloc({n, hdim}, x.dtype);
  const bool all = batch.logits_all_rows && n == x.rows();
  if (batch.greedy_ids.data && n > 0 && ops::lm_head_argmax_fusable(rows, nullptr, head)) {
    // Greedy rows only: the LM head GEMV and the argmax in one launch, no [n, vocab] logits. The
    // final norm stays its own launch: in the GEMV's prologue every one of the head's 16k blocks
    // would re-normalise the rows (measured on H200: bs2 35 us slower than unfused); so the ids
    // are exactly the argmax of the unfused path's logits.
    if (all) {
      ops::rmsnorm(x, norm_w, eps, rows);
    } else {
      ops::gather_rows(x, batch.logits_index, rows);
      ops::rmsnorm(rows, norm_w, eps, rows);
    }
    ops::lm_head_argmax(rows, nullptr, eps, head, batch.greedy_ids, batch.greedy_scratch);
    batch.greedy_done = true;
    return Tensor();
  }
  if (all) {
    ops::rmsnorm(x, norm_w, eps, rows);  // every row: no gather
  } else {
    ops::gather_rows(x, batch.logits_index, rows);
    ops::rmsnorm(rows, norm_w, eps, rows);
  }
  // Logits come out of the GEMM in f32 on every backend: bf16 logits (3 significant digits)
  // would flip near-tied greedy choices.
  Tensor logits = ws.alloc({n, vocab}, DType::f32);
  ops::linear(rows, head, logits);
  return logits;
}

Tensor lm_head_logits_tp(ForwardBatch& batch, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& head_shard,
                         int64_t vocab, parallel::Comm& comm, Workspace& ws) {
  ops::graph_segment_end();  // eager, as lm_head_logits
  const int tp = comm.size();
  const int64_t n = batch.num_logits, hdim = x.size(-1);
  const parallel::VocabShard mine = parallel::shard_vocab(vocab, tp, comm.rank());
  TS_CHECK(head_shard.size(0) == mine.count, "LM head shard has {} rows, rank {} owns {}", head_shard.size(0), comm.rank(),
           mine.count);
  Tensor rows = ws.alloc({n, hdim}, x.dtype);
  if (batch.logits_all_rows && n == x.rows()) {
    ops::rmsnorm(x, norm_w, eps, rows);
  } else {
    ops::gather_rows(x, batch.logits_index, rows);
    ops::rmsnorm(rows, norm_w, eps, rows);
  }
  // Every shard is gathered at the padded width; columns past a shard's count are not read.
  Tensor local = ws.alloc({n, mine.padded}, DType::f32);
  Tensor cols = local.narrow(1, 0, mine.count);
  ops::linear(rows, head_shard, cols);
  Tensor gathered = ws.alloc({int64_t(tp), n, mine.padded}, DType::f32);
  comm.all_gather(local, gathered);
  Tensor logits = ws.alloc({n, vocab}, DType::f32);
  if (n == 0) return logits;
  for (int p = 0; p < tp; ++p) {
    parallel::VocabShard v = parallel::shard_vocab(vocab, tp, p);
    if (v.count == 0) continue;
    Tensor src = gathered.row(p).narrow(1, 0, v.count);
    Tensor dst = logits.narrow(1, v.start, v.count);
    ops::copy_rows(src, dst);
  }
  return logits;
}

AttentionWeights load_attention_shard(WeightLoader& wl, const std::string& pre, int64_t H, int64_t heads,
                                      int64_t kv_heads, int64_t hd, bool qkv_bias, bool qk_norm,
                                      const parallel::HeadShard& hs) {
  using Part = WeightLoader::Part;
  const int64_t qw = heads * hd, kw = kv_heads * hd;
  const int64_t q0 = hs.q.start * hd, qn = hs.q.count * hd, k0 = hs.kv.start * hd, kn = hs.kv.count * hd;
  AttentionWeights a;
  a.qkv = wl.load_linear({Part{pre + "self_attn.q_proj.weight", {qw, H}, 0, q0, qn},
                         Part{pre + "self_attn.k_proj.weight", {kw, H}, 0, k0, kn},
                         Part{pre + "self_attn.v_proj.weight", {kw, H}, 0, k0, kn}});
  if (qkv_bias)
    a.qkv_bias = wl.load_parts({Part{pre + "self_attn.q_proj.bias", {qw}, 0, q0, qn},
                                Part{pre + "self_attn.k_proj.bias", {kw}, 0, k0, kn},
                                Part{pre + "self_attn.v_proj.bias", {kw}, 0, k0, kn}});
  a.o = wl.load_linear({Part{pre + "self_attn.o_proj.weight", {H, qw}, 1, q0, qn}});
  if (wl.has(pre + "self_attn.o_proj.bias") && hs.q.start == 0) a.o_bias = wl.load(pre + "self_attn.o_proj.bias", {H});
  if (qk_norm) {
    a.q_norm = wl.load(pre + "self_attn.q_norm.weight", {hd});
    a.k_norm = wl.load(pre + "self_attn.k_norm.weight", {hd});
  }
  a.kv_scales = load_kv_scales(wl, pre);
  return a;
}

ops::KvScales load_kv_scales(const WeightLoader& wl, const std::string& pre) {
  const std::string a = pre + "self_attn.";
  auto scalar = [&](const std::string& name) -> std::optional<float> {
    if (!wl.has(name)) return std::nullopt;
    const Tensor t = wl.raw(name);
    TS_CHECK(t.numel() == 1 && (t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16),
             "{}: KV cache scale {} must be a float scalar, has {} {}", wl.checkpoint().file_of(name), name,
             dtype_name(t.dtype), t.shape_str());
    const float v = t.to_f32().ptr<float>()[0];
    TS_CHECK(v > 0 && std::isfinite(v), "{}: KV cache scale {} = {} must be positive and finite",
             wl.checkpoint().file_of(name), name, v);
    return v;
  };
  auto first = [&](std::initializer_list<std::string> names) -> std::optional<float> {
    for (const std::string& n : names)
      if (auto v = scalar(n)) return v;
    return std::nullopt;
  };
  const std::optional<float> both = scalar(a + "kv_scale");
  ops::KvScales s;
  s.k = first({a + "k_scale", a + "k_proj.k_scale", a + "k_proj.output_scale"}).value_or(both.value_or(1.0f));
  s.v = first({a + "v_scale", a + "v_proj.v_scale", a + "v_proj.output_scale"}).value_or(both.value_or(1.0f));
  return s;
}

MlpWeights load_mlp_shard(WeightLoader& wl, const std::string& pre, int64_t H, int64_t inter, const parallel::Range& ir) {
  using Part = WeightLoader::Part;
  MlpWeights m;
  // Column-parallel gate|up: this shard's gate rows, then its up rows.
  m.gate_up = wl.load_linear({Part{pre + "gate_proj.weight", {inter, H}, 0, ir.start, ir.count},
                             Part{pre + "up_proj.weight", {inter, H}, 0, ir.start, ir.count}});
  m.down = wl.load_linear({Part{pre + "down_proj.weight", {H, inter}, 1, ir.start, ir.count}});
  return m;
}

EmbedHead load_embed_head(WeightLoader& wl, int64_t vocab, int64_t H, bool tied, int tp, int rank, int embed_tp,
                          const std::string& root) {
  using Part = WeightLoader::Part;
  TS_CHECK(embed_tp == 1 || embed_tp == tp, "embedding tp size {} must be 1 or {}", embed_tp, tp);
  const parallel::VocabShard ev = parallel::shard_vocab(vocab, embed_tp, embed_tp == 1 ? 0 : rank);
  const parallel::VocabShard hv = parallel::shard_vocab(vocab, tp, rank);
  EmbedHead e;
  e.embed_tp = embed_tp;
  e.embed_start = ev.start;
  const std::string table = root + "embed_tokens.weight";
  e.embed = wl.load_parts({Part{table, {vocab, H}, 0, ev.start, ev.count}});
  // Tied checkpoints usually omit lm_head.weight; some ship it anyway (then it must match).
  const std::string head_name = (tied && !wl.has("lm_head.weight")) ? table : "lm_head.weight";
  if (head_name == table && ev.start == hv.start && ev.count == hv.count) e.head = e.embed;
  else if (head_name == table && embed_tp == 1) e.head = e.embed.narrow(0, hv.start, hv.count);
  else e.head = wl.load_parts({Part{head_name, {vocab, H}, 0, hv.start, hv.count}});
  return e;
}

}  // namespace ts::models
