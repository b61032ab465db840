#include "parallel/layers.h"

#include "core/device_memory.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ts::parallel {

void LinearRef::operator()(const Tensor& x, Tensor& out) const {
  if (fn_) {
    fn_(obj_, x, out);
    return;
  }
  ops::linear(x, *w_, out, has_bias() ? bias_ : nullptr);
}

void LinearRef::apply_with_bias(const Tensor& x, Tensor& out, const Tensor& extra_bias) const {
  if (!fn_ && !has_bias()) {
    ops::linear(x, *w_, out, &extra_bias);
    return;
  }
  (*this)(x, out);
  Tensor b = extra_bias.view({1, extra_bias.numel()});
  for (int64_t t = 0; t < out.rows(); ++t) {
    Tensor r = out.narrow(0, t, 1);
    ops::add_inplace(r, b);
  }
}

void column_parallel(const Tensor& x, LinearRef w, Tensor& out) { w(x, out); }

void column_parallel_gather(const Tensor& x, LinearRef w, Comm& comm, Tensor& out, Workspace& ws) {
  const int tp = comm.size();
  const int64_t T = x.rows(), N = out.size(-1);
  TS_CHECK(N % tp == 0 && out.rows() == T, "column_parallel_gather: out {} over {} ranks", out.shape_str(), tp);
  if (tp == 1) {
    w(x, out);
    return;
  }
  WorkspaceScope scope(ws);
  const int64_t n = N / tp;
  Tensor local = ws.alloc({T, n}, out.dtype);
  w(x, local);
  Tensor all = ws.alloc({int64_t(tp), T, n}, out.dtype);  // rank-major
  comm.all_gather(local, all);
  for (int p = 0; p < tp; ++p) {
    Tensor src = all.row(p);
    Tensor dst = out.narrow(1, p * n, n);
    ops::copy_rows(src, dst);
  }
}

void row_parallel(const Tensor& x_shard, LinearRef w, Comm& comm, Tensor& out, Reduce reduce, const Tensor* bias) {
  TS_CHECK(!w.has_bias(), "row_parallel: the linear carries a bias, which would be summed over {} ranks (pass it as "
           "`bias`)", comm.size());
  if (bias && bias->data && comm.rank() == 0) w.apply_with_bias(x_shard, out, *bias);
  else w(x_shard, out);
  if (reduce == Reduce::now) comm.all_reduce(out);
}

void row_parallel_add_rmsnorm(const Tensor& x_shard, LinearRef w, Comm& comm, Tensor& out, Tensor& residual,
                              const Tensor& norm_w, float eps, bool residual_init, const Tensor* bias) {
  row_parallel(x_shard, w, comm, out, Reduce::deferred, bias);
  comm.all_reduce_add_rmsnorm(out, residual, norm_w, eps, residual_init);
}

VocabShard embed_rows(int64_t vocab, int tp, int rank, bool replicate) {
  return replicate ? shard_vocab(vocab, 1, 0) : shard_vocab(vocab, tp, rank);
}

void embed(const Tensor& ids, const EmbedShard& e, Comm& comm, Tensor& out, bool reduce) {
  if (e.tp_size == 1) {
    ops::embedding(ids, e.table, out, 0);
    return;
  }
  TS_CHECK(e.tp_size == comm.size(), "embed: a table sharded over {} ranks with a group of {}", e.tp_size, comm.size());
  ops::embedding(ids, e.table, out, e.vocab_start);
  if (reduce) comm.all_reduce(out);
}

void embed_first_norm(const Tensor& ids, const EmbedShard& e, Comm& comm, const Tensor& norm_w, float eps,
                      Tensor& residual, Tensor& h) {
  if (fuse_embed_reduce(e)) {
    embed(ids, e, comm, h, /*reduce=*/false);  // partial rows
    comm.all_reduce_add_rmsnorm(h, residual, norm_w, eps, /*residual_init=*/true);
    return;
  }
  embed(ids, e, comm, residual);
  ops::rmsnorm(residual, norm_w, eps, h);
}

Tensor lm_head_logits(const Tensor& rows, const LmHead& head, Comm& comm, Workspace& ws) {
  const int64_t n = rows.rows();
  Tensor logits = ws.alloc({n, head.vocab}, DType::f32);
  if (head.tp_size == 1) {
    head.w(rows, logits);
    return logits;
  }
  const int tp = comm.size();
  TS_CHECK(head.tp_size == tp, "lm_head: a head sharded over {} ranks with a group of {}", head.tp_size, tp);
  const VocabShard mine = shard_vocab(head.vocab, tp, comm.rank());
  // Every shard is gathered at the padded width; columns past a shard's count are not read.
  const size_t mark = ws.mark();
  Tensor local = ws.alloc({n, mine.padded}, DType::f32);
  Tensor cols = local.narrow(1, 0, mine.count);
  head.w(rows, cols);
  Tensor gathered = ws.alloc({int64_t(tp), n, mine.padded}, DType::f32);
  comm.all_gather(local, gathered);
  if (n > 0)
    for (int p = 0; p < tp; ++p) {
      const VocabShard v = shard_vocab(head.vocab, tp, p);
      if (v.count == 0) continue;
      Tensor src = gathered.row(p).narrow(1, 0, v.count);
      Tensor dst = logits.narrow(1, v.start, v.count);
      ops::copy_rows(src, dst);
    }
  ws.release(mark);  // logits (allocated before the mark) stay
  return logits;
}

void SpanGather::plan(Comm& g, int attn_tp, int attn_rank, int64_t T, Workspace& ws) {
  TS_CHECK(g.size() % attn_tp == 0, "SpanGather: a group of {} ranks is not made of attention groups of {}", g.size(),
           attn_tp);
  slice_ = token_slice(T, attn_tp, attn_rank);
  WorkspaceScope scope(ws);
  Tensor mine = ws.alloc({1}, DType::i32), all = ws.alloc({int64_t(g.size())}, DType::i32);
  host_.assign(1, int32_t(slice_.count));
  device_copy(mine.data, mine.device, host_.data(), Device::cpu, sizeof(int32_t));
  g.all_gather(mine, all);
  host_.resize(size_t(g.size()));
  device_copy(host_.data(), Device::cpu, all.data, all.device, all.nbytes());
  rows_.assign(host_.begin(), host_.end());
  // This rank's attention group: the attn_tp adjacent ranks of g starting at `first`.
  const int first = g.rank() / attn_tp * attn_tp;
  total_ = mine_start_ = rows_mine_ = 0;
  for (int p = 0; p < g.size(); ++p) {
    if (p < first) mine_start_ += rows_[size_t(p)];
    else if (p < first + attn_tp) rows_mine_ += rows_[size_t(p)];
    total_ += rows_[size_t(p)];
  }
  TS_CHECK(rows_mine_ == T, "SpanGather: the attention group's slices hold {} rows, this rank has {}", rows_mine_, T);
}

void SpanGather::gather(Comm& g, const Tensor& x, Tensor& out) const {
  g.all_gather_v(x.narrow(0, slice_.start, slice_.count), rows_, out);
}

void SpanGather::take_mine(const Tensor& full, Tensor& out) const {
  if (rows_mine_ == 0) return;
  Tensor dst = out.narrow(0, 0, rows_mine_);
  ops::copy_rows(full.narrow(0, mine_start_, rows_mine_), dst);
}

}  // namespace ts::parallel
