#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/device_memory.h"
#include "ops/graph_hooks.h"
#include "ops/moe_experts.h"

namespace ts::models {

void glu_mlp_block(const Tensor& h, const MlpWeights& w, const ops::GluAct& act, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), inter = w.down.in_features();
  Tensor gu = ws.alloc({t_n, 2 * inter}, h.dtype);
  ops::linear(h, w.gate_up, gu);
  Tensor a = ws.alloc({t_n, inter}, h.dtype);
  ops::glu(gu, a, act);
  ops::linear(a, w.down, out);
}

void moe_route_step(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& ids,
                    Tensor& weights) {
  int64_t t_n = h.rows(), e_n = w.router.size(0);
  Tensor logits = ws.alloc({t_n, e_n}, DType::f32);
  ops::linear(h, w.router, logits);
  const Tensor* bias = w.router_bias.data ? &w.router_bias : nullptr;
  ops::moe_route(logits, bias, s.routing, ids, weights);
  if (MoeRouteHook* hook = moe_route_hook()) {
    TS_CHECK(!ops::graph_hooks(), "moe route hook: eager forwards only (a CUDA graph cannot replay its copies)");
    hook->on_route(hook->calls++, logits, bias, s.routing, ids, weights);
  }
}

void moe_block(const Tensor& h, const MoeWeights& w, const MoeShape& s, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  int64_t t_n = h.rows(), k = s.routing.top_k;
  Tensor ids = ws.alloc({t_n, k}, DType::i32);
  Tensor weights = ws.alloc({t_n, k}, DType::f32);
  moe_route_step(h, w, s, ws, ids, weights);
  ops::moe_experts(h, ids, weights, w.gate_up, w.down, s.act, out);
  if (w.shared.gate_up.data) {
    Tensor sh = ws.alloc({t_n, h.size(-1)}, h.dtype);
    glu_mlp_block(h, w.shared, s.act, ws, sh);
    ops::add_inplace(out, sh);
  }
}

bool moe_block_parallel(const Tensor& h, const MoeWeights& w, const MoeShape& s, const parallel::ParallelGroups& g,
                        parallel::MoeParallel& mp, Workspace& ws, Tensor& out) {
  WorkspaceScope scope(ws);
  const int64_t t_n = h.rows(), k = s.routing.top_k;
  Tensor ids = ws.alloc({t_n, k}, DType::i32);
  Tensor weights = ws.alloc({t_n, k}, DType::f32);
  moe_route_step(h, w, s, ws, ids, weights);
  const parallel::PlainExperts experts{w.gate_up, w.down, s.act};
  auto shared_fn = [&](const Tensor& x, Tensor& y) { glu_mlp_block(x, w.shared, s.act, ws, y); };
  // MoE TP shards the shared experts like the routed ones; EP keeps them whole.
  const parallel::SharedRef shared = w.shared.gate_up.data
                                         ? parallel::SharedRef::of(shared_fn, g.mapping.moe_ep == 1)
                                         : parallel::SharedRef{};
  // The CPU folds every token's slots in slot order (bit-exact with one rank); CUDA sums the
  // ranks' partial outputs (no host sync: capturable).
  const parallel::EpCombine combine = h.device == Device::cpu ? parallel::EpCombine::exact : parallel::EpCombine::partial;
  const parallel::MoeOut r = parallel::moe_forward(g, mp, h, ids, weights, experts.ref(), shared, combine, out, ws);
  if (r == parallel::MoeOut::complete) return false;
  parallel::Comm& m = g.moe();
  if (m.size() == g.attn_tp->size()) return true;  // the attention group itself (data parallel 1)
  m.all_reduce(out);  // a smaller group inside the attention group: complete after its sum
  return false;
}

MoeRouteHook*& moe_route_hook() {
  static thread_local MoeRouteHook* h = nullptr;
  return h;
}

void RouteTape::on_route(int layer, const Tensor& logits, const Tensor* bias, const ops::MoeRouting& r, Tensor& ids,
                         Tensor& weights) {
  TS_CHECK(layer == int(seen.size()), "route tape: layer {} after {} recorded (call start() before each forward)", layer,
           seen.size());
  RouteRecord rec;
  // Host copies (to() copies even from the host): the workspace is reused by the next layer.
  rec.logits = logits.to(Device::cpu);
  rec.ids = ids.to(Device::cpu);
  rec.weights = weights.to(Device::cpu);
  if (bias) rec.bias = bias->to_f32();
  rec.routing = r;
  seen.push_back(std::move(rec));
  if (forced.empty()) return;
  TS_CHECK(layer < int(forced.size()), "route tape: no forced routing for MoE layer {} ({} given)", layer, forced.size());
  const RouteRecord& f = forced[size_t(layer)];
  TS_CHECK(f.ids.dims() == ids.dims() && f.weights.dims() == weights.dims() && f.ids.dtype == DType::i32 &&
               f.weights.dtype == DType::f32 && ids.is_contiguous() && weights.is_contiguous(),
           "route tape: forced layer {} has ids {} weights {}, the model routes ids {} weights {}", layer,
           f.ids.shape_str(), f.weights.shape_str(), ids.shape_str(), weights.shape_str());
  // Synchronous copies: on CUDA they are ordered with the op stream (a blocking stream).
  device_copy(ids.data, ids.device, f.ids.data, Device::cpu, ids.nbytes());
  device_copy(weights.data, weights.device, f.weights.data, Device::cpu, weights.nbytes());
}

std::vector<float> route_selection_scores(const float* logits, const float* bias, int64_t experts,
                                          const ops::MoeRouting& r, std::vector<float>* group_scores) {
  const size_t n = size_t(experts);
  std::vector<float> choice(n);
  if (r.scoring == ops::MoeScoring::softmax) {
    const float mx = *std::max_element(logits, logits + n);
    double sum = 0;
    for (size_t e = 0; e < n; ++e) sum += std::exp(double(logits[e] - mx));
    for (size_t e = 0; e < n; ++e) choice[e] = float(std::exp(double(logits[e] - mx)) / sum);
    return choice;
  }
  for (size_t e = 0; e < n; ++e) choice[e] = 1.0f / (1.0f + std::exp(-logits[e])) + (bias ? bias[e] : 0.0f);
  if (r.n_group <= 1) return choice;
  // Group score = its two best choices; the topk_group best groups are kept.
  const size_t groups = size_t(r.n_group), gsize = n / groups;
  std::vector<float> gs(groups);
  for (size_t g = 0; g < groups; ++g) {
    std::vector<float> v(choice.begin() + long(g * gsize), choice.begin() + long((g + 1) * gsize));
    std::sort(v.begin(), v.end(), std::greater<float>());
    gs[g] = v[0] + (gsize >= 2 ? v[1] : 0.0f);
  }
  std::vector<size_t> order(groups);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gs[a] > gs[b]; });
  std::vector<char> kept(groups, 0);
  for (int i = 0; i < r.topk_group; ++i) kept[order[size_t(i)]] = 1;
  for (size_t e = 0; e < n; ++e)
    if (!kept[e / gsize]) choice[e] = 0.0f;
  if (group_scores) *group_scores = gs;
  return choice;
}

namespace {

// gate_up and down of the routed experts, both kept as stored or both dequantized (the kernels
// take them alike; a MoE TP cut inside a k block of down keeps only gate_up's parts).
void load_expert_pair(WeightLoader& wl, const std::vector<std::vector<WeightLoader::Part>>& gu,
                      const std::vector<std::vector<WeightLoader::Part>>& down, MoeWeights& w) {
  w.gate_up = wl.load_experts(gu);
  w.down = wl.load_experts(down);
  if (w.gate_up.quantized() && !w.down.quantized()) w.gate_up = wl.load_experts(gu, false);
  if (w.down.quantized() && !w.gate_up.quantized()) w.down = wl.load_experts(down, false);
}

}  // namespace

void load_experts(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                  MoeWeights& w) {
  if (wl.has(prefix + ".gate_up_proj")) {
    w.gate_up = wl.load(prefix + ".gate_up_proj", {experts, 2 * inter, hidden});
    w.down = wl.load(prefix + ".down_proj", {experts, hidden, inter});
    return;
  }
  // One tensor per expert: kept as stored on CUDA where the checkpoint is FP8 / NVFP4.
  using Part = WeightLoader::Part;
  std::vector<std::vector<Part>> gu(static_cast<size_t>(experts)), down(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    std::string pe = prefix + "." + std::to_string(e) + ".";
    gu[size_t(e)] = {Part{pe + "gate_proj.weight", {inter, hidden}}, Part{pe + "up_proj.weight", {inter, hidden}}};
    down[size_t(e)] = {Part{pe + "down_proj.weight", {hidden, inter}}};
  }
  load_expert_pair(wl, gu, down, w);
}

void load_experts_shard(WeightLoader& wl, const std::string& prefix, int64_t experts, int64_t inter, int64_t hidden,
                        const parallel::Range& er, const parallel::Range& ir, MoeWeights& w) {
  if (er.start == 0 && er.count == experts && ir.start == 0 && ir.count == inter) {
    load_experts(wl, prefix, experts, inter, hidden, w);
    return;
  }
  if (wl.has(prefix + ".gate_up_proj")) {  // fused [E, 2I, H] (gate rows then up rows) and [E, H, I]
    w.gate_up = wl.load_blocks3(prefix + ".gate_up_proj", {experts, 2 * inter, hidden}, er.start, er.count,
                                {{ir.start, ir.count}, {inter + ir.start, ir.count}}, 0, hidden);
    w.down = wl.load_blocks3(prefix + ".down_proj", {experts, hidden, inter}, er.start, er.count, {{0, hidden}},
                             ir.start, ir.count);
    return;
  }
  using Part = WeightLoader::Part;
  std::vector<std::vector<Part>> gu, down;
  for (int64_t e = er.start; e < er.end(); ++e) {
    std::string pe = prefix + "." + std::to_string(e) + ".";
    gu.push_back({Part{pe + "gate_proj.weight", {inter, hidden}, 0, ir.start, ir.count},
                  Part{pe + "up_proj.weight", {inter, hidden}, 0, ir.start, ir.count}});
    down.push_back({Part{pe + "down_proj.weight", {hidden, inter}, 1, ir.start, ir.count}});
  }
  load_expert_pair(wl, gu, down, w);
}

}  // namespace ts::models
