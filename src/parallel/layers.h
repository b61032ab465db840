// Parallel layer primitives: pure functions over Tensors and a Comm, usable from every model
// file (the model decides the shard layout with mapping.h / quant_shard.h at load time, and
// calls these in its forward — the same forward at TP 1, where the Comm is a group of one).
//
// Linears are taken as an opaque LinearRef: anything with `apply(const Tensor& x, Tensor& out)
// const` computing out = x @ W_shard^T (+ bias), e.g. a quantized linear with its own scales, or
// a plain weight tensor through ops::linear. The primitives never look inside the weight.
//
// All collectives are over the Comm of the layer's group (attention TP for attention and the
// vocab-parallel embedding / LM head, dense TP for dense MLPs); see ParallelGroups (world.h).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/workspace.h"
#include "parallel/comm.h"
#include "parallel/mapping.h"

namespace ts::parallel {

// A non-owning reference to one rank's linear (no allocation, cheap to copy).
class LinearRef {
 public:
  // A plain weight [N_shard, K] (+ optional bias [N_shard]) applied with ops::linear.
  LinearRef(const Tensor& w, const Tensor* bias = nullptr) : w_(&w), bias_(bias) {}  // NOLINT: implicit by design
  // Any object with `void apply(const Tensor& x, Tensor& out) const`.
  template <class L>
    requires requires(const L& l, const Tensor& x, Tensor& y) { l.apply(x, y); }
  LinearRef(const L& l)  // NOLINT: implicit by design
      : obj_(&l), fn_([](const void* o, const Tensor& x, Tensor& y) { static_cast<const L*>(o)->apply(x, y); }) {}
  void operator()(const Tensor& x, Tensor& out) const;
  // out = x @ W^T + extra_bias [N] (plain weights: in the GEMM's epilogue; opaque linears: added
  // after, row by row).
  void apply_with_bias(const Tensor& x, Tensor& out, const Tensor& extra_bias) const;
  bool has_bias() const { return bias_ && bias_->data; }

 private:
  const void* obj_ = nullptr;
  void (*fn_)(const void*, const Tensor&, Tensor&) = nullptr;
  const Tensor* w_ = nullptr;
  const Tensor* bias_ = nullptr;
};

// --- column / row parallel linear ------------------------------------------------------------

// Column-parallel: out [T, N/tp] = x [T, K] @ W_shard^T — this rank's output columns, no
// communication (the next row-parallel linear consumes them). Fused projections (q|k|v, gate|up)
// are one column-parallel linear whose shard stacks each part's rows (mapping.h).
void column_parallel(const Tensor& x, LinearRef w, Tensor& out);
// Column-parallel with the output gathered: out [T, N] = every rank's columns side by side
// (all_gather + placement); scratch from ws. N = tp * (columns per rank).
void column_parallel_gather(const Tensor& x, LinearRef w, Comm& comm, Tensor& out, Workspace& ws);

// Row-parallel: out [T, N] = sum over ranks of x_shard [T, K/tp] @ W_shard^T (+ bias, added once:
// on rank 0 before the sum). w carries no bias (it would be summed tp times).
enum class Reduce : uint8_t {
  now,       // all-reduce here: out is the full result
  deferred,  // out is this rank's partial sum; the caller reduces later (fused add + norm)
};
void row_parallel(const Tensor& x_shard, LinearRef w, Comm& comm, Tensor& out, Reduce reduce = Reduce::now,
                  const Tensor* bias = nullptr);
// Row-parallel ending in the fused all-reduce + residual add + RMSNorm (Comm::all_reduce_add_rmsnorm):
// out = partial, then residual = (residual_init ? 0 : residual) + sum, out = rmsnorm(residual) * norm_w.
void row_parallel_add_rmsnorm(const Tensor& x_shard, LinearRef w, Comm& comm, Tensor& out, Tensor& residual,
                              const Tensor& norm_w, float eps, bool residual_init = false,
                              const Tensor* bias = nullptr);

// --- embedding and LM head -----------------------------------------------------------------

// This rank's embedding table: tp_size 1 = replicated (the whole vocabulary, no mask, no
// all-reduce); tp_size > 1 = vocab-parallel rows [vocab_start, vocab_start + rows(table)).
struct EmbedShard {
  Tensor table;  // [rows, H]
  int tp_size = 1;
  int64_t vocab_start = 0;
};
// The shard of `vocab` rows for attention-TP rank `rank` of `tp` (replicate: tp 1): which rows
// to load (VocabShard.start / count; the table holds `padded` rows when the LM head shares it).
VocabShard embed_rows(int64_t vocab, int tp, int rank, bool replicate);

// out [T, H] = embedding of ids. Vocab-parallel: masked lookup of this rank's rows (zeros
// elsewhere) then the all-reduce — skipped when reduce is false (out holds partial rows for a
// fused first norm). Replicated: a plain lookup, never a collective.
void embed(const Tensor& ids, const EmbedShard& e, Comm& comm, Tensor& out, bool reduce = true);
// The seed's rule: the embedding's all-reduce is fused into the first layer's norm only when
// the table is actually sharded.
inline bool fuse_embed_reduce(const EmbedShard& e) { return e.tp_size > 1; }
// Embedding + the first layer's input norm: residual [T, H] = embedding, h [T, H] =
// rmsnorm(residual) * norm_w. Sharded table: lookup into h, then one fused
// all_reduce_add_rmsnorm (residual_init); replicated: lookup into residual and a plain norm.
void embed_first_norm(const Tensor& ids, const EmbedShard& e, Comm& comm, const Tensor& norm_w, float eps,
                      Tensor& residual, Tensor& h);

// This rank's LM head: tp_size 1 = the whole head [vocab, H]; tp_size > 1 = vocab-parallel rows
// of shard_vocab(vocab, tp, rank) (count rows; the gather pads each shard to `padded`).
struct LmHead {
  LinearRef w;
  int tp_size = 1;
  int64_t vocab = 0;
};
// logits [N, vocab] f32 from normed rows [N, H]: the local logits of this rank's vocabulary
// rows, all-gathered over comm and placed by shard (replicated: one linear). Every rank gets
// the full logits. Scratch (and the returned tensor) from ws.
Tensor lm_head_logits(const Tensor& rows, const LmHead& head, Comm& comm, Workspace& ws);

// --- layers over a group wider than the attention group (attention data parallelism) ------

// Dense TP or MoE TP over a group g made of whole attention groups (--dense-tp-size / MoE TP
// larger than the attention TP size, under --data-parallel-size > 1): the attention groups hold
// different tokens, so g first gathers them. Every rank contributes its token_slice of its
// attention group's T rows (the group's ranks hold the same rows), so the gathered [N, W] holds
// each attention group's rows exactly once, in token order, attention groups in rank order;
// after the sharded layer and g's all-reduce every rank takes back its attention group's T rows.
// Precondition: g is contiguous in ranks, tensor-parallel innermost (ParallelGroups' splits), so
// an attention group's ranks are adjacent in g. Host scratch keeps its capacity.
class SpanGather {
 public:
  // Collective over g: exchanges the row counts (one small device-to-host copy on a GPU: call it
  // in an eager region). attn_tp / attn_rank: this rank's attention TP size and rank; T: its rows.
  void plan(Comm& g, int attn_tp, int attn_rank, int64_t T, Workspace& ws);
  int64_t total() const { return total_; }
  // out [total(), W] = every rank's slice of its rows of x [T, W], rank-major.
  void gather(Comm& g, const Tensor& x, Tensor& out) const;
  // out [T, W] = this rank's attention group's rows of full [total(), W].
  void take_mine(const Tensor& full, Tensor& out) const;

 private:
  std::vector<int64_t> rows_;  // per rank of g
  std::vector<int32_t> host_;
  Range slice_;
  int64_t total_ = 0, mine_start_ = 0, rows_mine_ = 0;
};

// A layer sharded over group g run for this rank's rows x [T, H] (replicated over its attention
// group `attn`): f(x_in, y_out) writes this rank's partial sum over g for x_in's rows (y_out
// [rows(x_in), H]). Groups nest (Mapping::resolve checks it), so exactly one of:
//  - g is the attention group (same size): y = f(x), a partial sum; returns true (the caller
//    fuses its all-reduce into the next residual add + norm);
//  - g lies inside the attention group (smaller): y = all_reduce over g of f(x); returns false;
//  - g is made of whole attention groups (larger): SpanGather, f on the gathered rows, g's
//    all-reduce, this rank's rows back (an eager region under CUDA graphs); returns false.
template <class F>
bool group_sharded_forward(Comm& g, Comm& attn, SpanGather& span, const Tensor& x, Tensor& y, Workspace& ws, F&& f);

// --- eager regions -------------------------------------------------------------------------

// Runs f eagerly even inside a breakable CUDA graph (ops/graph_hooks.h): the segment before is
// closed (capture) or replayed (replay), the hooks are lifted while f runs (so every op in it
// executes), then the next segment starts. For work whose shapes or host counts change per
// batch — the expert-parallel all-to-all. f's scratch must not outlive the region (use a
// WorkspaceScope inside f).
template <class F>
void run_eager(F&& f);

}  // namespace ts::parallel

#include "ops/graph_hooks.h"

template <class F>
void ts::parallel::run_eager(F&& f) {
  ops::GraphHooks* h = ops::graph_hooks();
  if (!h || !h->in_segment()) {
    f();
    return;
  }
  h->before_break();
  ops::graph_hooks() = nullptr;
  try {
    f();
  } catch (...) {
    ops::graph_hooks() = h;
    throw;
  }
  ops::graph_hooks() = h;
  h->after_break();
}

template <class F>
bool ts::parallel::group_sharded_forward(Comm& g, Comm& attn, SpanGather& span, const Tensor& x, Tensor& y,
                                         Workspace& ws, F&& f) {
  if (g.size() == attn.size()) {
    f(x, y);
    return true;
  }
  if (g.size() < attn.size()) {
    f(x, y);
    if (g.size() > 1) g.all_reduce(y);
    return false;
  }
  run_eager([&] {
    WorkspaceScope scope(ws);
    span.plan(g, attn.size(), attn.rank(), x.rows(), ws);
    Tensor xs = ws.alloc({span.total(), x.size(-1)}, x.dtype);
    span.gather(g, x, xs);
    Tensor ys = ws.alloc({span.total(), y.size(-1)}, y.dtype);
    f(xs, ys);
    g.all_reduce(ys);
    span.take_mine(ys, y);
  });
  return false;
}
