// The shared mixture-of-experts block (Qwen3-MoE, DeepSeek-V3, MiniMax-M3): router -> top-k ->
// routed experts (+ shared experts), and a gated MLP with a chosen activation. Every MoE model
// file builds its sparse layers from these, so routing and expert math live in one place.
#pragma once
#include <string>

#include "models/blocks.h"
#include "models/weights.h"

namespace ts::models {

struct MoeWeights {
  Tensor router;       // [E, H]
  Tensor router_bias;  // optional [E]: e_score_correction_bias (selection only)
  Tensor gate_up;      // [E, 2I, H] gate rows then up rows per expert
  Tensor down;         // [E, H, I]
  MlpWeights shared;   // optional shared expert(s); shared.gate_up undefined: none
};

struct MoeShape {
  ops::MoeRouting routing;
  ops::GluAct act;  // routed and shared experts alike
};

// h [T, H] normed input -> out [T, H] = routed experts (+ shared experts).
void moe_block(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& out);

// Gated MLP with the given activation: out = down(act(gate_up(h))).
void glu_mlp_block(const Tensor& h, const MlpWeights& w, const ops::GluAct& act, Workspace& ws, Tensor& out);

// Loads the routed experts under `prefix` (e.g. "model.layers.3.mlp.experts") as [E, 2I, H] and
// [E, H, I], from either layout a checkpoint may use: one tensor per expert
// (`{prefix}.{e}.gate_proj.weight`, `up_proj`, `down_proj`) or fused 3-D tensors
// (`{prefix}.gate_up_proj` [E, 2I, H], `{prefix}.down_proj` [E, H, I]).
void load_experts(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                  MoeWeights& w);

}  // namespace ts::models
