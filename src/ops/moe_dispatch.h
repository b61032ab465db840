// Expert-parallel dispatch / combine ops (the data flow that uses them: parallel/moe.h). Experts
// are owned by `ranks` ranks in contiguous blocks of E / ranks (rank r: experts [r E/R, (r+1) E/R)).
// Same conventions as ops/ops.h: dispatch on the first tensor's device (CPU reference, CUDA
// kernels), i32 indices, f32 routing weights, zero rows do nothing. Positions are deterministic
// (token order, then slot order), never the order atomics happen to land in.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace ts::ops {

// Routing ids [T, k] (valid global expert ids) ->
//   counts    i32 [2, R]: [0][r] = send rows to rank r (tokens with at least one expert there),
//                         [1][r] = slots (token, j) whose expert rank r owns;
//   row_pos   i32 [T, k]: at the first slot (in slot order) of each (token, owner) pair: that
//                         pair's send row — rank r's rows come after lower ranks' rows, in token
//                         order; -1 at the token's later slots with the same owner;
//   slot_pos  i32 [T, k]: slot (t, j)'s place among its owner's slots in (token, slot) order,
//                         after lower ranks' slots — i.e. its row in the owners' concatenated
//                         per-slot outputs;
//   row_token i32 [>= T * min(k, R)]: the token of each send row (rows past the total: untouched).
void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token);

// Send buffers for rows [0, S), S = sum counts[0] (host value: rows of send_x): send_x[p] =
// x[row_token[p]]; send_ids[p, j] = slot j's id local to its owner (e - owner * E/R) when the owner
// is row p's destination, else -1; send_w[p, j] = weights[t, j]. counts as from ep_plan.
void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w);

// The valid (>= 0) slots of ids [N, k] in (row, slot) order: exp_row[m] = its row, exp_id[m] = its
// id (as [M, 1]), exp_w[m] = 1 (as [M, 1]); exp_pos [N, k] = m, or -1 at invalid slots. exp_row /
// exp_id / exp_w hold exactly M = (number of valid slots) rows; the caller knows M (from the
// plan's counts) and sizes them.
void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos);

// out[n] = sum over j with pos[n, j] >= 0, in j order, of weights[n, j] * y[pos[n, j]] (weights
// null: 1), accumulated in f32 from zero: the weighted combine of ops::moe_experts, over rows placed
// anywhere in y. Rows without a valid slot are zero. y, out [*, H] of the model dtype.
void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out);

// local[t, j] = ids[t, j] - e0 when e0 <= ids[t, j] < e0 + n, else -1 (ids of this rank's experts).
void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local);

namespace cpu {
void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token);
void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w);
void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos);
void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out);
void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local);
}  // namespace cpu

namespace cuda {
void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token);
void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w);
void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos);
void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out);
void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local);
}  // namespace cuda

}  // namespace ts::ops
