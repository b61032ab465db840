// The shared mixture-of-experts block (Qwen3-MoE, DeepSeek-V3, MiniMax-M3): router -> top-k ->
// routed experts (+ shared experts), and a gated MLP with a chosen activation. Every MoE model
// file builds its sparse layers from these, so routing and expert math live in one place.
#pragma once
#include <string>
#include <vector>

#include "models/blocks.h"
#include "models/weights.h"
#include "parallel/moe.h"

namespace ts::models {

struct MoeWeights {
  Tensor router;       // [E, H]
  Tensor router_bias;  // optional [E]: e_score_correction_bias (selection only)
  // Routed experts, plain or (CUDA, quantized checkpoints) kept as stored with their scales
  // (ops::LinearWeight of ndim 3, linear_weight.h).
  ops::LinearWeight gate_up;  // [E, 2I, H] gate rows then up rows per expert
  ops::LinearWeight down;     // [E, H, I]
  MlpWeights shared;   // optional shared expert(s); shared.gate_up undefined: none
};

struct MoeShape {
  ops::MoeRouting routing;
  ops::GluAct act;  // routed and shared experts alike
};

// h [T, H] normed input -> out [T, H] = routed experts (+ shared experts). With a route hook
// installed (below), the hook sees every call's routing between moe_route and moe_experts.
void moe_block(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& out);

// moe_block's routing: router logits (scratch from ws, not released: the caller scopes it),
// top-k ids / weights [T, k] into the given tensors, then the route hook if one is installed.
void moe_route_step(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& ids,
                    Tensor& weights);

// The MoE layer on a rank of a parallel world (g): the router on every rank (replicated), then
// parallel::moe_forward (MoE TP: every expert's intermediate shard; EP: this rank's experts,
// tokens replicated or dispatched) with the shared experts (replicated under EP, sharded like
// the routed ones under MoE TP). Returns true when out is a partial sum over the attention TP
// group (the caller fuses its all-reduce into the next add + norm), false when complete.
bool moe_block_parallel(const Tensor& h, const MoeWeights& w, const MoeShape& s, const parallel::ParallelGroups& g,
                        parallel::MoeParallel& mp, Workspace& ws, Tensor& out);

// Gated MLP with the given activation: out = down(act(gate_up(h))).
void glu_mlp_block(const Tensor& h, const MlpWeights& w, const ops::GluAct& act, Workspace& ws, Tensor& out);

// Loads the routed experts under `prefix` (e.g. "model.layers.3.mlp.experts") as [E, 2I, H] and
// [E, H, I], from either layout a checkpoint may use: one tensor per expert
// (`{prefix}.{e}.gate_proj.weight`, `up_proj`, `down_proj`) or fused 3-D tensors
// (`{prefix}.gate_up_proj` [E, 2I, H], `{prefix}.down_proj` [E, H, I]).
void load_experts(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                  MoeWeights& w);

// The routed experts of one rank: experts [er] (EP) with every expert's intermediate rows [ir]
// (MoE TP: gate rows ir, up rows ir, down's columns ir) as [E_local, 2 I_local, H] and
// [E_local, H, I_local], from either checkpoint layout. The whole ranges: load_experts.
void load_experts_shard(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                        const parallel::Range& er, const parallel::Range& ir, MoeWeights& w);

// --- route hook: observe or override the routing (route-diff, tests) -------------------------
// Installed per thread; null (the default) costs one thread-local load and a branch per MoE
// layer. The hook copies device tensors to and from the host, so it is for eager forwards only:
// moe_block refuses it under breakable CUDA graphs, and a decode-graph capture fails on the copy.
class MoeRouteHook {
 public:
  virtual ~MoeRouteHook() = default;
  // layer: moe_block calls since `calls` was last set to 0 — the MoE-layer ordinal when it is
  // reset before each forward. logits [T, E] f32; ids [T, k] i32; weights [T, k] f32, all on the
  // model's device and contiguous; bias: the selection bias [E] or null. The hook may overwrite
  // ids and weights; moe_experts then runs with them.
  virtual void on_route(int layer, const Tensor& logits, const Tensor* bias, const ops::MoeRouting& r, Tensor& ids,
                        Tensor& weights) = 0;
  int calls = 0;
};
MoeRouteHook*& moe_route_hook();

// Installs a hook for a scope (restores the previous one).
class ScopedMoeRouteHook {
 public:
  explicit ScopedMoeRouteHook(MoeRouteHook* h) : prev_(moe_route_hook()) { moe_route_hook() = h; }
  ~ScopedMoeRouteHook() { moe_route_hook() = prev_; }
  ScopedMoeRouteHook(const ScopedMoeRouteHook&) = delete;
  ScopedMoeRouteHook& operator=(const ScopedMoeRouteHook&) = delete;

 private:
  MoeRouteHook* prev_;
};

// One MoE layer's routing on the host: logits [T, E] f32, ids [T, k] i32, weights [T, k] f32,
// bias [E] f32 (undefined: none).
struct RouteRecord {
  Tensor logits, ids, weights, bias;
  ops::MoeRouting routing;
};

// The hook route-diff and the tests use. record: keeps a host copy of every layer's routing.
// force: records too (the routing the model chose), then overwrites ids and weights with
// forced[layer] — every layer must have an entry of the same shape.
class RouteTape final : public MoeRouteHook {
 public:
  std::vector<RouteRecord> seen;    // [layer], as moe_route produced them
  std::vector<RouteRecord> forced;  // [layer]; empty: record only
  void start() {  // before each forward
    calls = 0;
    seen.clear();
  }
  void on_route(int layer, const Tensor& logits, const Tensor* bias, const ops::MoeRouting& r, Tensor& ids,
                Tensor& weights) override;
};

// The score moe_route selects experts by, per expert of one token: the softmax probability, or
// sigmoid + bias with the groups that were not kept set to 0 (as the reference masks them).
// logits [E]; bias [E] or null. group_scores (optional) gets [n_group] group scores.
std::vector<float> route_selection_scores(const float* logits, const float* bias, int64_t experts,
                                          const ops::MoeRouting& r, std::vector<float>* group_scores = nullptr);

}  // namespace ts::models
