// Mixture of experts over a group of ranks: expert parallelism (experts split whole) and MoE
// tensor parallelism (every expert's intermediate dim split). The router runs before, on every
// rank's own tokens (ops::moe_route: top-k ids sorted by expert id and their weights, softmax or
// sigmoid + bias with grouped top-k), exactly as without parallelism.
//
// Expert parallelism, two data flows (the Mapping decides which; see moe_forward below):
//  replicated — the EP group lies inside one attention TP group, so every rank holds the same
//    tokens. Each rank runs its own experts on the slots routed to them; then either
//      combine partial: out = this rank's weighted sum, the caller all-reduces it over the EP
//        group (fused into the next residual add + RMSNorm like a row-parallel output) — within
//        fp32 rounding of the single-rank output (the rank sums are added in another order), or
//      combine exact: the per-slot expert outputs are all-gathered and every rank folds all k
//        slots of a token in slot order — the single-rank moe_experts arithmetic, bit-exact on
//        the CPU.
//    On CUDA with an experts op that skips id -1 (ops::moe_experts does) the partial flow is one
//    id remap + the experts op: no host sync, capturable into CUDA graphs.
//  dispatch — tokens differ across the EP group (attention DP). Each rank plans its tokens'
//    destinations (one row per (token, owner rank), in token order), sends rows + their slots'
//    local expert ids and weights with all_to_all_v, the owners run their experts on the
//    received slots, the outputs go back with all_to_all_v and are combined in a fixed order:
//    exact (per-slot outputs returned, folded in slot order — bit-exact on the CPU) or partial
//    (each owner returns one weighted row per token, summed in rank order — fp32 rounding).
//    Host counts: an eager region under CUDA graphs (run_eager), one D2H copy of the counts.
//  Shared experts run on every rank for its own tokens: replicated weights, or — in the
//  replicated-partial flow — TP-sharded over the EP group (their partial joins the all-reduce).
//
// MoE TP: every rank runs all experts on its intermediate shard for all tokens; the output is a
// partial sum for the group's all-reduce, like a dense row-parallel MLP. A MoE TP group made of
// several attention groups (attention DP without --ep-size: the default MoE TP is the world)
// first gathers the groups' tokens with their routing (SpanGather, layers.h), all-reduces the
// gathered output and keeps its own rows: complete.
//
// Scratch comes from the caller's Workspace (released on return) and member vectors that keep
// their capacity: after the first call of a given size the host side allocates nothing.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "core/workspace.h"
#include "ops/ops.h"
#include "ops/linear_weight.h"
#include "parallel/comm.h"
#include "parallel/layers.h"
#include "parallel/world.h"

namespace ts::parallel {

// This rank's routed experts as the MoE layer sees them: out [M, H] = for each row of x [M, H],
// the sum over its slots j (in slot order) of weights[m, j] * expert_{ids[m, j]}(x[m]), ids local
// to this rank's experts. skips_invalid: the callable ignores slots with id -1 (the CUDA
// ops::moe_experts does; the CPU one requires valid ids — then the layer only passes valid ones).
class ExpertsRef {
 public:
  template <class F>
    requires requires(const F& f, const Tensor& x, const Tensor& i, const Tensor& w, Tensor& o) { f(x, i, w, o); }
  ExpertsRef(const F& f, bool skips_invalid)  // NOLINT
      : obj_(&f),
        fn_([](const void* o, const Tensor& x, const Tensor& i, const Tensor& w, Tensor& y) {
          (*static_cast<const F*>(o))(x, i, w, y);
        }),
        skips_invalid_(skips_invalid) {}
  void operator()(const Tensor& x, const Tensor& ids, const Tensor& w, Tensor& out) const { fn_(obj_, x, ids, w, out); }
  bool skips_invalid() const { return skips_invalid_; }

 private:
  const void* obj_;
  void (*fn_)(const void*, const Tensor&, const Tensor&, const Tensor&, Tensor&);
  bool skips_invalid_;
};

// The expert weights of this rank through ops::moe_experts: gate_up [E_local, 2I, H] (gate rows
// then up rows), down [E_local, H, I], plain or (CUDA) kept as stored. MoE TP: the rank's
// intermediate shard.
struct PlainExperts {
  ops::LinearWeight gate_up, down;
  ops::GluAct act;
  void operator()(const Tensor& x, const Tensor& ids, const Tensor& w, Tensor& out) const;
  // ops::moe_experts skips id -1 on CUDA only.
  ExpertsRef ref() const { return ExpertsRef(*this, gate_up.device == Device::cuda); }
};

// A shared-expert MLP (x [T, H] -> out [T, H]); null fn: none.
struct SharedRef {
  const void* obj = nullptr;
  void (*fn)(const void*, const Tensor&, Tensor&) = nullptr;
  bool sharded = false;  // TP-sharded over the MoE group (its output is a partial sum)
  template <class F>
  static SharedRef of(const F& f, bool sharded) {
    return {&f, [](const void* o, const Tensor& x, Tensor& y) { (*static_cast<const F*>(o))(x, y); }, sharded};
  }
  explicit operator bool() const { return fn != nullptr; }
};

enum class EpCombine : uint8_t { exact, partial };

// What a MoE forward left in `out`.
enum class MoeOut : uint8_t {
  complete,  // the layer's output (no collective left)
  partial,   // this rank's partial sum: all-reduce it over the MoE group (fusable)
};

class MoeParallel {
 public:
  // experts: the global expert count E; ep: ranks the experts are split over; ep_rank: this one.
  MoeParallel(int64_t experts, int ep, int ep_rank);
  int64_t local_experts() const { return local_; }
  int64_t first_expert() const { return first_; }

  // Replicated tokens (EP group inside the attention group): x [T, H] and the routing ids /
  // weights [T, k] are the same on every rank of `ep`.
  MoeOut forward_replicated(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertsRef& experts,
                            const SharedRef& shared, EpCombine combine, Comm& ep, Tensor& out, Workspace& ws);
  // Tokens differ per rank: dispatch / combine with all_to_all_v over `ep`. Always complete.
  MoeOut forward_dispatch(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertsRef& experts,
                          const SharedRef& shared, EpCombine combine, Comm& ep, Tensor& out, Workspace& ws);

 private:
  void run_local_slots(const Tensor& x, const Tensor& local_ids, const ExpertsRef& experts, int64_t slots, Tensor& y,
                       Tensor& exp_pos, Workspace& ws);
  friend MoeOut moe_forward(const ParallelGroups&, MoeParallel&, const Tensor&, const Tensor&, const Tensor&,
                            const ExpertsRef&, const SharedRef&, EpCombine, Tensor&, Workspace&);
  int64_t experts_, local_, first_;
  int ep_, rank_;
  // Host scratch that keeps its capacity across calls.
  std::vector<int64_t> send_rows_, recv_rows_, send_slots_, recv_slots_, gather_rows_, slice_rows_;
  std::vector<int32_t> counts_host_, xchg_host_, xchg_back_;
  SpanGather span_;  // MoE TP over whole attention groups (attention DP)
};

// MoE TP: all experts on this rank's intermediate shard; out is a partial sum (shared experts
// must be sharded the same way). Returns MoeOut::partial (complete when the group is one rank).
MoeOut moe_tp_forward(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertsRef& experts,
                      const SharedRef& shared, Comm& tp, Tensor& out, Workspace& ws);

// The whole MoE layer for rank `g.mapping`: picks MoE TP, EP replicated or EP dispatch, and
// for dispatch under attention TP > 1 splits the attention group's tokens (token_slice), runs
// the dispatch on this rank's slice and all-gathers the slices back over the attention group.
// x, ids, weights: this rank's (attention-group-replicated) tokens. When it returns
// MoeOut::partial, the caller reduces `out` over g.moe() (e.g. Comm::all_reduce_add_rmsnorm).
MoeOut moe_forward(const ParallelGroups& g, MoeParallel& moe, const Tensor& x, const Tensor& ids,
                   const Tensor& weights, const ExpertsRef& experts, const SharedRef& shared, EpCombine combine,
                   Tensor& out, Workspace& ws);

}  // namespace ts::parallel
