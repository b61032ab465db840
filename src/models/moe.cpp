#include "models/moe.h"

namespace ts::models {

void glu_mlp_block(const Tensor& h, const MlpWeights& w, const ops::GluAct& act, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), inter = w.down.size(1);
  Tensor gu = ws.alloc({t_n, 2 * inter}, h.dtype);
  ops::linear(h, w.gate_up, gu);
  Tensor a = ws.alloc({t_n, inter}, h.dtype);
  ops::glu(gu, a, act);
  ops::linear(a, w.down, out);
}

void moe_block(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), e_n = w.router.size(0), k = s.routing.top_k;
  Tensor logits = ws.alloc({t_n, e_n}, DType::f32);
  ops::linear(h, w.router, logits);
  Tensor ids = ws.alloc({t_n, k}, DType::i32);
  Tensor weights = ws.alloc({t_n, k}, DType::f32);
  ops::moe_route(logits, w.router_bias.data ? &w.router_bias : nullptr, s.routing, ids, weights);
  ops::moe_experts(h, ids, weights, w.gate_up, w.down, s.act, out);
  if (w.shared.gate_up.data) {
    Tensor sh = ws.alloc({t_n, h.size(-1)}, h.dtype);
    glu_mlp_block(h, w.shared, s.act, ws, sh);
    ops::add_inplace(out, sh);
  }
}

void load_experts(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                  MoeWeights& w) {
  if (wl.has(prefix + ".gate_up_proj")) {
    w.gate_up = wl.load(prefix + ".gate_up_proj", {experts, 2 * inter, hidden});
    w.down = wl.load(prefix + ".down_proj", {experts, hidden, inter});
    return;
  }
  std::vector<std::string> gu_names, down_names;
  std::vector<std::vector<int64_t>> gu_shapes, down_shapes;
  for (int64_t e = 0; e < experts; ++e) {
    std::string pe = prefix + "." + std::to_string(e) + ".";
    gu_names.push_back(pe + "gate_proj.weight");
    gu_names.push_back(pe + "up_proj.weight");
    gu_shapes.push_back({inter, hidden});
    gu_shapes.push_back({inter, hidden});
    down_names.push_back(pe + "down_proj.weight");
    down_shapes.push_back({hidden, inter});
  }
  w.gate_up = wl.load_stacked(gu_names, gu_shapes).view({experts, 2 * inter, hidden});
  w.down = wl.load_stacked(down_names, down_shapes).view({experts, hidden, inter});
}

}  // namespace ts::models
