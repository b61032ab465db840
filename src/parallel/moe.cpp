#include "parallel/moe.h"

#include <algorithm>

#include "core/device_memory.h"
#include "core/error.h"
#include "ops/moe_dispatch.h"
#include "ops/moe_experts.h"
#include "ops/ops.h"
#include "parallel/layers.h"

namespace ts::parallel {

void PlainExperts::operator()(const Tensor& x, const Tensor& ids, const Tensor& w, Tensor& out) const {
  ops::moe_experts(x, ids, w, gate_up, down, act, out);
}

MoeParallel::MoeParallel(int64_t experts, int ep, int ep_rank) : experts_(experts), ep_(ep), rank_(ep_rank) {
  const Range r = expert_range(experts, ep, ep_rank);
  first_ = r.start;
  local_ = r.count;
}

namespace {

// Host copy of a small i32 tensor (device: a synchronous copy ordered with the op stream).
void read_i32(const Tensor& t, std::vector<int32_t>& out) {
  out.resize(size_t(t.numel()));
  if (t.numel()) device_copy(out.data(), Device::cpu, t.data, t.device, t.nbytes());
}

void add_shared(const SharedRef& shared, const Tensor& x, Tensor& out, Workspace& ws) {
  if (!shared || x.rows() == 0) return;
  WorkspaceScope scope(ws);
  Tensor sh = ws.alloc({x.rows(), out.size(-1)}, out.dtype);
  shared.fn(shared.obj, x, sh);
  ops::add_inplace(out, sh);
}

template <class F>
void maybe_eager(bool eager, F&& f) {
  if (eager) run_eager(f);
  else f();
}

}  // namespace

// Expands local_ids [T, k] (ids of this rank's experts or -1) into one row per valid slot in
// (token, slot) order and runs the experts on them: y [slots, H] unweighted per-slot outputs,
// exp_pos [T, k] each slot's row of y (or -1).
void MoeParallel::run_local_slots(const Tensor& x, const Tensor& local_ids, const ExpertsRef& experts, int64_t slots,
                                  Tensor& y, Tensor& exp_pos, Workspace& ws) {
  const int64_t H = x.size(-1);
  Tensor exp_row = ws.alloc({slots}, DType::i32);
  Tensor exp_id = ws.alloc({slots, 1}, DType::i32);
  Tensor exp_w = ws.alloc({slots, 1}, DType::f32);
  ops::ep_expand(local_ids, exp_row, exp_id, exp_w, exp_pos);
  Tensor xe = ws.alloc({slots, H}, x.dtype);
  ops::gather_rows(x, exp_row, xe);
  experts(xe, exp_id, exp_w, y);
}

MoeOut MoeParallel::forward_replicated(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                       const ExpertsRef& experts, const SharedRef& shared, EpCombine combine, Comm& ep,
                                       Tensor& out, Workspace& ws) {
  TS_CHECK(ep.size() == ep_ && ep.rank() == rank_, "MoE EP: rank {} of {} given a group's rank {} of {}", rank_, ep_,
           ep.rank(), ep.size());
  const int64_t T = x.rows(), k = ids.size(-1), H = x.size(-1);
  TS_CHECK(ids.rows() == T && weights.rows() == T && weights.size(-1) == k && out.rows() == T && out.size(-1) == H,
           "MoE EP: x {} ids {} weights {} out {}", x.shape_str(), ids.shape_str(), weights.shape_str(),
           out.shape_str());
  const bool gpu = x.device == Device::cuda;
  if (combine == EpCombine::partial && experts.skips_invalid()) {
    // One remap and the experts op: no host sync, capturable.
    WorkspaceScope scope(ws);
    Tensor local = ws.alloc({T, k}, DType::i32);
    ops::ep_local_ids(ids, first_, local_, local);
    experts(x, local, weights, out);
  } else {
    maybe_eager(gpu, [&] {
      WorkspaceScope scope(ws);
      Tensor counts = ws.alloc({2, int64_t(ep_)}, DType::i32);
      Tensor row_pos = ws.alloc({T, k}, DType::i32);
      Tensor slot_pos = ws.alloc({T, k}, DType::i32);
      Tensor row_token = ws.alloc({std::max<int64_t>(1, T * std::min<int64_t>(k, ep_))}, DType::i32);
      ops::ep_plan(ids, experts_, ep_, counts, row_pos, slot_pos, row_token);
      std::vector<int32_t>& c = counts_host_;
      read_i32(counts, c);
      Tensor local = ws.alloc({T, k}, DType::i32);
      ops::ep_local_ids(ids, first_, local_, local);
      const int64_t mine = c[size_t(ep_ + rank_)];
      Tensor y = ws.alloc({mine, H}, x.dtype);
      Tensor exp_pos = ws.alloc({T, k}, DType::i32);
      run_local_slots(x, local, experts, mine, y, exp_pos, ws);
      if (combine == EpCombine::partial) {
        ops::ep_fold(y, exp_pos, &weights, out);
        return;
      }
      // Exact: every rank's per-slot outputs, rank-major = the order slot_pos numbers them.
      gather_rows_.resize(size_t(ep_));
      int64_t all = 0;
      for (int r = 0; r < ep_; ++r) all += (gather_rows_[size_t(r)] = c[size_t(ep_ + r)]);
      Tensor gathered = ws.alloc({all, H}, x.dtype);
      ep.all_gather_v(y, gather_rows_, gathered);
      ops::ep_fold(gathered, slot_pos, &weights, out);
    });
  }
  if (combine == EpCombine::exact || ep.size() == 1) {
    TS_CHECK(!shared || !shared.sharded || ep.size() == 1,
             "MoE EP: TP-sharded shared experts need the partial combine (their output is a partial sum)");
    add_shared(shared, x, out, ws);
    return MoeOut::complete;
  }
  // Partial: a sharded shared MLP adds its partial on every rank; a replicated one once.
  if (shared && (shared.sharded || rank_ == 0)) add_shared(shared, x, out, ws);
  return MoeOut::partial;
}

MoeOut MoeParallel::forward_dispatch(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                     const ExpertsRef& experts, const SharedRef& shared, EpCombine combine, Comm& ep,
                                     Tensor& out, Workspace& ws) {
  TS_CHECK(ep.size() == ep_ && ep.rank() == rank_, "MoE EP: rank {} of {} given a group's rank {} of {}", rank_, ep_,
           ep.rank(), ep.size());
  TS_CHECK(!shared || !shared.sharded, "MoE EP dispatch: shared experts must be replicated (each rank has its own "
           "tokens)");
  const int64_t T = x.rows(), k = ids.size(-1), H = x.size(-1);
  TS_CHECK(ids.rows() == T && weights.rows() == T && weights.size(-1) == k && out.rows() == T && out.size(-1) == H,
           "MoE EP: x {} ids {} weights {} out {}", x.shape_str(), ids.shape_str(), weights.shape_str(),
           out.shape_str());
  const Device dev = x.device;
  maybe_eager(dev == Device::cuda, [&] {
    WorkspaceScope scope(ws);
    const int R = ep_;
    // 1. Plan: rows and slots per destination, positions in token / slot order.
    Tensor counts = ws.alloc({2, int64_t(R)}, DType::i32);
    Tensor row_pos = ws.alloc({T, k}, DType::i32);
    Tensor slot_pos = ws.alloc({T, k}, DType::i32);
    Tensor row_token = ws.alloc({std::max<int64_t>(1, T * std::min<int64_t>(k, R))}, DType::i32);
    ops::ep_plan(ids, experts_, R, counts, row_pos, slot_pos, row_token);
    std::vector<int32_t>& c = counts_host_;
    read_i32(counts, c);
    // 2. Exchange the counts: to rank p goes [rows, slots] for p.
    xchg_host_.resize(size_t(2 * R));
    for (int p = 0; p < R; ++p) {
      xchg_host_[size_t(2 * p)] = c[size_t(p)];
      xchg_host_[size_t(2 * p + 1)] = c[size_t(R + p)];
    }
    Tensor xs = ws.alloc({int64_t(R), 2}, DType::i32), xr = ws.alloc({int64_t(R), 2}, DType::i32);
    device_copy(xs.data, xs.device, xchg_host_.data(), Device::cpu, xs.nbytes());
    ep.all_to_all(xs, xr);
    read_i32(xr, xchg_back_);
    send_rows_.assign(size_t(R), 0);
    recv_rows_.assign(size_t(R), 0);
    send_slots_.assign(size_t(R), 0);
    recv_slots_.assign(size_t(R), 0);
    int64_t S = 0, N = 0, S_slots = 0, N_slots = 0;
    for (int p = 0; p < R; ++p) {
      S += send_rows_[size_t(p)] = c[size_t(p)];
      S_slots += send_slots_[size_t(p)] = c[size_t(R + p)];
      N += recv_rows_[size_t(p)] = xchg_back_[size_t(2 * p)];
      N_slots += recv_slots_[size_t(p)] = xchg_back_[size_t(2 * p + 1)];
    }
    // 3. Dispatch rows with their slots' local ids and weights.
    Tensor send_x = ws.alloc({S, H}, x.dtype), send_ids = ws.alloc({S, k}, DType::i32),
           send_w = ws.alloc({S, k}, DType::f32);
    ops::ep_pack(x, ids, weights, row_token, counts, experts_, send_x, send_ids, send_w);
    Tensor recv_x = ws.alloc({N, H}, x.dtype), recv_ids = ws.alloc({N, k}, DType::i32),
           recv_w = ws.alloc({N, k}, DType::f32);
    ep.all_to_all_v(send_x, send_rows_, recv_x, recv_rows_);
    ep.all_to_all_v(send_ids, send_rows_, recv_ids, recv_rows_);
    ep.all_to_all_v(send_w, send_rows_, recv_w, recv_rows_);
    // 4. Local experts, 5. back and combine.
    if (combine == EpCombine::partial && experts.skips_invalid()) {
      Tensor part = ws.alloc({N, H}, x.dtype);
      experts(recv_x, recv_ids, recv_w, part);
      Tensor ret = ws.alloc({S, H}, x.dtype);
      ep.all_to_all_v(part, recv_rows_, ret, send_rows_);
      ops::ep_fold(ret, row_pos, nullptr, out);
      return;
    }
    Tensor y = ws.alloc({N_slots, H}, x.dtype);
    Tensor exp_pos = ws.alloc({N, k}, DType::i32);
    run_local_slots(recv_x, recv_ids, experts, N_slots, y, exp_pos, ws);
    if (combine == EpCombine::exact) {
      Tensor ret = ws.alloc({S_slots, H}, x.dtype);
      ep.all_to_all_v(y, recv_slots_, ret, send_slots_);
      ops::ep_fold(ret, slot_pos, &weights, out);
    } else {
      Tensor part = ws.alloc({N, H}, x.dtype);
      ops::ep_fold(y, exp_pos, &recv_w, part);
      Tensor ret = ws.alloc({S, H}, x.dtype);
      ep.all_to_all_v(part, recv_rows_, ret, send_rows_);
      ops::ep_fold(ret, row_pos, nullptr, out);
    }
  });
  add_shared(shared, x, out, ws);
  return MoeOut::complete;
}

MoeOut moe_tp_forward(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertsRef& experts,
                      const SharedRef& shared, Comm& tp, Tensor& out, Workspace& ws) {
  experts(x, ids, weights, out);
  if (tp.size() == 1) {
    add_shared(shared, x, out, ws);
    return MoeOut::complete;
  }
  if (shared && (shared.sharded || tp.rank() == 0)) add_shared(shared, x, out, ws);
  return MoeOut::partial;
}

MoeOut moe_forward(const ParallelGroups& g, MoeParallel& moe, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const ExpertsRef& experts, const SharedRef& shared, EpCombine combine, Tensor& out, Workspace& ws) {
  const Mapping& m = g.mapping;
  if (m.moe_ep == 1) {
    if (m.moe_tokens_replicated()) return moe_tp_forward(x, ids, weights, experts, shared, *g.moe_tp, out, ws);
    // MoE TP over whole attention groups: their tokens and routing gathered, the experts' shard
    // on all of them, the group's sum, this rank's rows back.
    TS_CHECK(out.is_contiguous(), "moe_forward: out must be contiguous ({})", out.shape_str());
    Comm& tp = *g.moe_tp;
    run_eager([&] {
      WorkspaceScope scope(ws);
      SpanGather& span = moe.span_;
      span.plan(tp, m.attn_tp, m.attn_tp_rank, x.rows(), ws);
      const int64_t N = span.total(), H = x.size(-1), k = ids.size(-1);
      Tensor xs = ws.alloc({N, H}, x.dtype), is = ws.alloc({N, k}, ids.dtype), wsg = ws.alloc({N, k}, weights.dtype);
      span.gather(tp, x, xs);
      span.gather(tp, ids, is);
      span.gather(tp, weights, wsg);
      Tensor os = ws.alloc({N, out.size(-1)}, out.dtype);
      if (moe_tp_forward(xs, is, wsg, experts, shared, tp, os, ws) == MoeOut::partial) tp.all_reduce(os);
      span.take_mine(os, out);
    });
    return MoeOut::complete;
  }
  if (m.moe_tokens_replicated())
    return moe.forward_replicated(x, ids, weights, experts, shared, combine, *g.moe_ep, out, ws);
  if (m.attn_tp == 1) return moe.forward_dispatch(x, ids, weights, experts, shared, combine, *g.moe_ep, out, ws);
  // The attention group's ranks hold the same tokens: each dispatches its slice, then the
  // slices are all-gathered back (every rank ends with every token's output).
  const int64_t T = x.rows(), H = x.size(-1);
  TS_CHECK(out.is_contiguous(), "moe_forward: out must be contiguous ({})", out.shape_str());
  const Range mine = token_slice(T, m.attn_tp, m.attn_tp_rank);
  WorkspaceScope scope(ws);
  Tensor xs = x.narrow(0, mine.start, mine.count), is = ids.narrow(0, mine.start, mine.count),
         wsl = weights.narrow(0, mine.start, mine.count);
  Tensor os = ws.alloc({mine.count, H}, out.dtype);
  moe.forward_dispatch(xs, is, wsl, experts, shared, combine, *g.moe_ep, os, ws);
  std::vector<int64_t>& rows = moe.slice_rows_;
  rows.resize(size_t(m.attn_tp));
  for (int p = 0; p < m.attn_tp; ++p) rows[size_t(p)] = token_slice(T, m.attn_tp, p).count;
  g.attn_tp->all_gather_v(os, rows, out);
  return MoeOut::complete;
}

}  // namespace ts::parallel
