// route-diff DIR: does the device (bf16) pick different experts — or, on MiniMax-M3's sparse
// attention layers, different key blocks — than the CPU (fp32) reference, and does that explain
// its logit error? Per golden prompt, runs through moe_block's route hook (models/moe.h) and the
// lightning indexer's block-selection hook (models/block_select.h):
//  1. CPU fp32, recording every MoE layer's router logits / expert ids / weights and every sparse
//     layer's index queries / keys / picked blocks, and the residual stream entering each layer;
//  2. the device, recording the same: per layer, how many tokens' top-k expert SET (queries' block
//     set) differs, and for the first such the CPU's gap between its k-th and (k+1)-th score next
//     to the device's scores; on sparse layers also the device's indexer and sparse attention
//     against the CPU ops on the very inputs the device fed them (a kernel check);
//  3. the device with the CPU's routing forced into every MoE layer;
//  4. (sparse models) the device with the CPU's routing and block selection both forced.
// The logit error against the golden (verify-golden's measure) of runs 2-4 for every prompt, then
// the details of one: if forcing brings the error down to the other prompts' level, the flips
// explain it; if not, the per-layer hidden-state error shows where it starts.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/golden.h"
#include "models/block_select.h"
#include "models/moe.h"
#include "runtime/model_runner.h"

namespace {

using namespace ts;

// One forward of a prompt: host logits [T, V] f32, the residual stream entering every layer
// (and the final one) [T, (L + 1) * H] f32, and what the hooks recorded.
struct Run {
  Tensor logits, hidden;
  models::RouteTape routes;
  models::BlockTape blocks;
  double diff = 0;  // max abs logit diff vs the golden
};

// Runs the prompt (all logit rows) as one chunk from position 0 through a fresh runner, with
// the CPU's routing / blocks forced when given; check: the sparse-kernel check on every layer.
void run_prompt(const std::shared_ptr<models::Model>& model, const std::vector<int32_t>& prompt,
                const std::vector<models::RouteRecord>* routes, const std::vector<models::BlockRecord>* blocks, bool check,
                Run& out) {
  const int bs = 16;
  const int64_t n_blocks = (int64_t(prompt.size()) + bs - 1) / bs + 1;
  ModelRunner runner(model, n_blocks, bs);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t(b);
  SeqChunk c{prompt.data(), int(prompt.size()), 0, &table, SeqChunk::Logits::all};
  if (routes) out.routes.forced = *routes;
  if (blocks) out.blocks.forced = *blocks;
  out.blocks.check = check;
  models::ScopedMoeRouteHook on_routes(&out.routes);
  models::ScopedBlockSelectHook on_blocks(&out.blocks);
  out.routes.start();
  out.blocks.start();
  out.logits = runner.run({c}, true).to_f32();
  out.hidden = runner.last_aux().to_f32();
}

std::vector<int32_t> expert_set(const models::RouteRecord& r, int64_t t) {
  const int64_t k = r.ids.size(1);
  const int32_t* p = r.ids.ptr<int32_t>() + t * k;
  std::vector<int32_t> s(p, p + k);
  std::sort(s.begin(), s.end());
  return s;
}

std::string set_str(const std::vector<int32_t>& s) {
  std::string o = "{";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "}";
}

// Experts of one token ordered by selection score (descending; ties: lower id first).
std::vector<int> ranked(const std::vector<float>& score) {
  std::vector<int> idx(score.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  return idx;
}

std::vector<float> scores_of(const models::RouteRecord& r, int64_t t, std::vector<float>* groups = nullptr) {
  const int64_t e_n = r.logits.size(1);
  return models::route_selection_scores(r.logits.ptr<float>() + t * e_n, r.bias.data ? r.bias.ptr<float>() : nullptr,
                                        e_n, r.routing, groups);
}

// CPU gap between the k-th and (k+1)-th selection score of token t (k = top_k).
float cpu_gap(const models::RouteRecord& c, int64_t t) {
  const int k = c.routing.top_k;
  std::vector<float> s = scores_of(c, t);
  if (int(s.size()) <= k) return INFINITY;
  std::vector<int> o = ranked(s);
  return s[size_t(o[size_t(k - 1)])] - s[size_t(o[size_t(k)])];
}

struct LayerDiff {
  int64_t tokens = 0, differ = 0;
  double max_logit_diff = 0;  // router logits
  float max_gap_differ = 0;   // largest CPU k / k+1 gap among the differing tokens
  int64_t first = -1;         // first differing token
};

LayerDiff compare(const models::RouteRecord& c, const models::RouteRecord& d) {
  TS_CHECK(c.ids.dims() == d.ids.dims() && c.logits.dims() == d.logits.dims(),
           "route-diff: the CPU routed ids {} (logits {}), the device {} ({})", c.ids.shape_str(), c.logits.shape_str(),
           d.ids.shape_str(), d.logits.shape_str());
  LayerDiff r;
  r.tokens = c.ids.size(0);
  const int64_t n = c.logits.numel();
  for (int64_t i = 0; i < n; ++i)
    r.max_logit_diff = std::max(r.max_logit_diff, double(std::fabs(c.logits.ptr<float>()[i] - d.logits.ptr<float>()[i])));
  for (int64_t t = 0; t < r.tokens; ++t) {
    if (expert_set(c, t) == expert_set(d, t)) continue;
    if (r.first < 0) r.first = t;
    ++r.differ;
    r.max_gap_differ = std::max(r.max_gap_differ, cpu_gap(c, t));
  }
  return r;
}

void print_first(int layer, int64_t t, const models::RouteRecord& c, const models::RouteRecord& d) {
  const int k = c.routing.top_k;
  std::vector<float> cg, dg;
  std::vector<float> cs = scores_of(c, t, &cg), ds = scores_of(d, t, &dg);
  std::vector<int> co = ranked(cs);
  std::vector<int32_t> a = expert_set(c, t), b = expert_set(d, t);
  std::printf("first differing: MoE layer %d, token %lld: cpu picks %s, device picks %s\n", layer, (long long)t,
              set_str(a).c_str(), set_str(b).c_str());
  const int ek = co[size_t(k - 1)], ek1 = co[size_t(k)];
  std::printf("  cpu selection scores (%s): k-th e%d %.7g, (k+1)-th e%d %.7g, gap %.3g\n",
              c.routing.scoring == ops::MoeScoring::softmax ? "softmax" : "sigmoid + bias", ek, double(cs[size_t(ek)]), ek1,
              double(cs[size_t(ek1)]), double(cs[size_t(ek)] - cs[size_t(ek1)]));
  // The device's scores (from its own router logits) of every expert either side picked alone,
  // plus the CPU's k-th and (k+1)-th.
  std::vector<int32_t> show = {ek, ek1};
  for (int32_t e : a)
    if (!std::binary_search(b.begin(), b.end(), e)) show.push_back(e);
  for (int32_t e : b)
    if (!std::binary_search(a.begin(), a.end(), e)) show.push_back(e);
  std::sort(show.begin(), show.end());
  show.erase(std::unique(show.begin(), show.end()), show.end());
  std::string cl, dl;
  for (int32_t e : show) {
    cl += fmt::format(" e{} {:.7g}", e, cs[size_t(e)]);
    dl += fmt::format(" e{} {:.7g}", e, ds[size_t(e)]);
  }
  std::printf("  cpu    scores:%s\n  device scores:%s\n", cl.c_str(), dl.c_str());
  if (c.routing.n_group > 1 && !cg.empty()) {
    std::vector<int> go = ranked(cg);
    const int kg = c.routing.topk_group;
    std::string gl;
    for (size_t g = 0; g < cg.size(); ++g) gl += fmt::format(" g{} {:.7g}/{:.7g}", g, cg[g], dg[g]);
    std::printf("  group scores cpu/device:%s (cpu gap between its %d-th and %d-th best group: %.3g)\n", gl.c_str(), kg, kg + 1,
                kg < int(cg.size()) ? double(cg[size_t(go[size_t(kg - 1)])] - cg[size_t(go[size_t(kg)])]) : 0.0);
  }
}

// --- block selection (sparse attention layers) ---------------------------------------------
std::vector<int32_t> block_set(const models::BlockRecord& r, int64_t t, int64_t h) {
  const int64_t w = r.sel.size(2);
  const int32_t* p = r.sel.ptr<int32_t>() + (t * r.sel.size(1) + h) * w;
  std::vector<int32_t> s;
  for (int64_t i = 0; i < w; ++i)
    if (p[i] >= 0) s.push_back(p[i]);
  return s;  // ascending (block_indexer's order)
}

// CPU gap between the k-th and (k+1)-th block score of query t / index head h.
float block_gap(const models::BlockRecord& c, int64_t t, int64_t h) {
  std::vector<float> s = models::block_scores(c, t, h);
  const size_t k = block_set(c, t, h).size();
  if (s.size() <= k || k == 0) return INFINITY;
  std::vector<int> o = ranked(s);
  return s[size_t(o[k - 1])] - s[size_t(o[k])];
}

struct BlockDiff {
  int64_t queries = 0, differ = 0, pairs_differ = 0;  // queries: any index head's set differs
  float max_gap_differ = 0;
  int64_t first = -1, first_head = -1;
};

BlockDiff compare_blocks(const models::BlockRecord& c, const models::BlockRecord& d) {
  TS_CHECK(c.sel.dims() == d.sel.dims(), "route-diff: the CPU selected blocks {}, the device {}", c.sel.shape_str(),
           d.sel.shape_str());
  BlockDiff r;
  r.queries = c.sel.size(0);
  for (int64_t t = 0; t < r.queries; ++t) {
    bool any = false;
    for (int64_t h = 0; h < c.sel.size(1); ++h) {
      if (block_set(c, t, h) == block_set(d, t, h)) continue;
      any = true;
      ++r.pairs_differ;
      r.max_gap_differ = std::max(r.max_gap_differ, block_gap(c, t, h));
      if (r.first < 0) {
        r.first = t;
        r.first_head = h;
      }
    }
    r.differ += any;
  }
  return r;
}

void print_first_block(int layer, const BlockDiff& f, const models::BlockRecord& c, const models::BlockRecord& d) {
  const int64_t t = f.first, h = f.first_head;
  std::vector<int32_t> a = block_set(c, t, h), b = block_set(d, t, h);
  std::vector<float> cs = models::block_scores(c, t, h), ds = models::block_scores(d, t, h);
  std::vector<int> co = ranked(cs);
  const size_t k = a.size();
  std::printf("first differing block set: sparse layer %d, query %lld, index head %lld: cpu picks %s, device picks %s\n",
              layer, (long long)t, (long long)h, set_str(a).c_str(), set_str(b).c_str());
  if (cs.size() > k && k > 0) {
    const int bk = co[k - 1], bk1 = co[k];
    std::printf("  cpu block scores: k-th b%d %.7g, (k+1)-th b%d %.7g, gap %.3g\n", bk, double(cs[size_t(bk)]), bk1,
                double(cs[size_t(bk1)]), double(cs[size_t(bk)] - cs[size_t(bk1)]));
  }
  std::vector<int32_t> show;
  for (int32_t x : a)
    if (!std::binary_search(b.begin(), b.end(), x)) show.push_back(x);
  for (int32_t x : b)
    if (!std::binary_search(a.begin(), a.end(), x)) show.push_back(x);
  std::sort(show.begin(), show.end());
  std::string cl, dl;
  for (int32_t x : show) {
    cl += fmt::format(" b{} {:.7g}", x, cs[size_t(x)]);
    dl += fmt::format(" b{} {:.7g}", x, ds[size_t(x)]);
  }
  std::printf("  cpu    scores:%s\n  device scores:%s\n", cl.c_str(), dl.c_str());
}

// --- one prompt, every run ------------------------------------------------------------------
struct PromptRuns {
  size_t idx = 0;
  int64_t tokens = 0;
  std::vector<int64_t> rows;
  Run cpu, free, forced, both;  // both: routing and blocks forced (sparse models only)
  bool sparse = false;
  int64_t route_flips = 0, block_flips = 0;  // free run: (layer, token) / (layer, query) pairs
  float route_gap = NAN, block_gap_first = NAN;  // the CPU's gap at the first flip
};

void analyse(const cli::Golden& g, size_t pi, const std::shared_ptr<models::Model>& cpu_model,
             const std::shared_ptr<models::Model>& dev_model, PromptRuns& p) {
  p.idx = pi;
  const std::vector<int32_t> prompt = g.prompt(pi);
  p.tokens = int64_t(prompt.size());
  p.rows = g.logit_rows(pi);
  const Tensor ref = g.logits(pi);
  run_prompt(cpu_model, prompt, nullptr, nullptr, false, p.cpu);
  TS_CHECK(!p.cpu.routes.seen.empty(), "no MoE layer ran (not a mixture-of-experts model?)");
  p.sparse = !p.cpu.blocks.seen.empty();
  run_prompt(dev_model, prompt, nullptr, nullptr, p.sparse, p.free);
  run_prompt(dev_model, prompt, &p.cpu.routes.seen, nullptr, p.sparse, p.forced);
  if (p.sparse) run_prompt(dev_model, prompt, &p.cpu.routes.seen, &p.cpu.blocks.seen, true, p.both);
  for (Run* r : {&p.cpu, &p.free, &p.forced, &p.both})
    if (r->logits.data) r->diff = cli::max_logit_diff(r->logits, ref, p.rows);
  TS_CHECK(p.free.routes.seen.size() == p.cpu.routes.seen.size() && p.free.blocks.seen.size() == p.cpu.blocks.seen.size(),
           "route-diff: {} MoE / {} sparse layers on the CPU, {} / {} on the device", p.cpu.routes.seen.size(),
           p.cpu.blocks.seen.size(), p.free.routes.seen.size(), p.free.blocks.seen.size());
  for (size_t l = 0; l < p.cpu.routes.seen.size(); ++l) {
    LayerDiff f = compare(p.cpu.routes.seen[l], p.free.routes.seen[l]);
    if (std::isnan(p.route_gap) && f.first >= 0) p.route_gap = cpu_gap(p.cpu.routes.seen[l], f.first);
    p.route_flips += f.differ;
  }
  for (size_t l = 0; l < p.cpu.blocks.seen.size(); ++l) {
    BlockDiff f = compare_blocks(p.cpu.blocks.seen[l], p.free.blocks.seen[l]);
    if (std::isnan(p.block_gap_first) && f.first >= 0)
      p.block_gap_first = block_gap(p.cpu.blocks.seen[l], f.first, f.first_head);
    p.block_flips += f.differ;
  }
}

std::string num(double v) { return std::isnan(v) ? "-" : fmt::format("{:.3g}", v); }

// Max |device - cpu| of the residual entering layer l (slot l of the hidden capture), and the
// token where it is largest.
std::pair<double, int64_t> hidden_diff(const Run& cpu, const Run& dev, int64_t l, int64_t H) {
  if (!dev.hidden.data) return {NAN, -1};
  const int64_t T = cpu.hidden.size(0), W = cpu.hidden.size(1);
  double best = 0;
  int64_t at = -1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = l * H; i < (l + 1) * H; ++i) {
      const double d = std::fabs(double(cpu.hidden.ptr<float>()[t * W + i]) - double(dev.hidden.ptr<float>()[t * W + i]));
      if (d > best) {
        best = d;
        at = t;
      }
    }
  return {best, at};
}

// Per-layer and first-flip details of one prompt.
void print_details(const std::string& dir, const PromptRuns& p, const char* dn, int64_t layers, int64_t H) {
  const auto& cs = p.cpu.routes.seen;
  std::printf("\n=== details: %s, prompt %zu (%lld tokens), %zu MoE layers, top-%d; %s vs the cpu reference\n", dir.c_str(),
              p.idx, (long long)p.tokens, cs.size(), cs[0].routing.top_k, dn);
  std::printf("%-6s %-7s %-22s %-24s %-18s %s\n", "layer", "tokens", "free: set differs", "max cpu gap there", "router logit diff",
              "forced upstream: would differ");
  int first_layer = -1;
  for (size_t l = 0; l < cs.size(); ++l) {
    LayerDiff f = compare(cs[l], p.free.routes.seen[l]);
    // With the CPU's routing forced in the layers before, this layer's own choice (recorded
    // before the override) isolates the flips that this layer's arithmetic causes.
    LayerDiff o = compare(cs[l], p.forced.routes.seen[l]);
    if (first_layer < 0 && f.first >= 0) first_layer = int(l);
    std::printf("%-6zu %-7lld %-22s %-24s %-18.3g %s\n", l, (long long)f.tokens,
                fmt::format("{} ({:.2f}%)", f.differ, 100.0 * double(f.differ) / double(std::max<int64_t>(f.tokens, 1))).c_str(),
                f.differ ? fmt::format("{:.3g}", f.max_gap_differ).c_str() : "-", f.max_logit_diff,
                o.differ ? fmt::format("{} (max cpu gap there {:.3g})", o.differ, o.max_gap_differ).c_str() : "0");
  }
  if (first_layer >= 0) {
    const size_t l = size_t(first_layer);
    print_first(first_layer, compare(cs[l], p.free.routes.seen[l]).first, cs[l], p.free.routes.seen[l]);
  } else {
    std::printf("no token's expert set differs in any MoE layer\n");
  }

  if (p.sparse) {
    const auto& cb = p.cpu.blocks.seen;
    const auto& ix = cb[0].indexer;
    std::printf("block selection: %zu sparse layers, %lld index heads, top-%d of %d-token blocks (%d local); a query "
                "differs when any index head's block set does\n",
                cb.size(), (long long)cb[0].sel.size(1), ix.top_k, ix.block_size, ix.local_blocks);
    std::printf("%-7s %-26s %-18s %-26s %s\n", "sparse", "free: queries differ", "max cpu gap there",
                "routes forced: differ", "routes+blocks forced: differ (own pick)");
    int first_sparse = -1;
    BlockDiff first_diff;
    for (size_t l = 0; l < cb.size(); ++l) {
      BlockDiff f = compare_blocks(cb[l], p.free.blocks.seen[l]);
      BlockDiff o = compare_blocks(cb[l], p.forced.blocks.seen[l]);
      BlockDiff b = compare_blocks(cb[l], p.both.blocks.seen[l]);
      if (first_sparse < 0 && f.first >= 0) {
        first_sparse = int(l);
        first_diff = f;
      }
      std::printf("%-7zu %-26s %-18s %-26s %s\n", l,
                  fmt::format("{} ({:.2f}%), {} pairs", f.differ, 100.0 * double(f.differ) / double(std::max<int64_t>(f.queries, 1)),
                              f.pairs_differ).c_str(),
                  f.differ ? fmt::format("{:.3g}", f.max_gap_differ).c_str() : "-",
                  o.differ ? fmt::format("{} (max gap {:.3g})", o.differ, o.max_gap_differ).c_str() : "0",
                  b.differ ? fmt::format("{} (max gap {:.3g})", b.differ, b.max_gap_differ).c_str() : "0");
    }
    if (first_sparse >= 0) print_first_block(first_sparse, first_diff, cb[size_t(first_sparse)], p.free.blocks.seen[size_t(first_sparse)]);
    else std::printf("no query's block set differs in any sparse layer\n");
    // The device kernels vs the CPU ops on the device's own inputs: the indexer's pick may
    // differ only on exact ties of fp32 rounding; attention only by bf16 output rounding.
    std::printf("sparse kernel check (device kernels vs CPU ops on the device's own inputs):\n");
    std::printf("%-7s %-12s %-30s %s\n", "sparse", "run", "indexer pick differs (pairs)", "attention max |diff| / max |out|");
    for (const auto* r : {&p.free, &p.forced, &p.both}) {
      const char* name = r == &p.free ? "free" : r == &p.forced ? "routes" : "both";
      for (size_t l = 0; l < r->blocks.checks.size(); ++l) {
        const auto& c = r->blocks.checks[l];
        std::printf("%-7zu %-12s %-30s %.3g / %.3g (%.2g)\n", l, name, fmt::format("{} of {}", c.sel_differ, c.pairs).c_str(),
                    c.out_diff, c.out_max, c.out_max > 0 ? c.out_diff / c.out_max : 0.0);
      }
    }
  }

  // Where the error starts: the residual entering each layer (layer L: the final one).
  std::printf("hidden state: max |%s - cpu| of the residual entering each layer (@ token)\n", dn);
  std::printf("%-6s %-10s %-16s %-16s %s\n", "layer", "max |cpu|", "free", "routes forced", p.sparse ? "routes+blocks forced" : "");
  for (int64_t l = 0; l <= layers; ++l) {
    double mx = 0;
    const int64_t T = p.cpu.hidden.size(0), W = p.cpu.hidden.size(1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = l * H; i < (l + 1) * H; ++i) mx = std::max(mx, double(std::fabs(p.cpu.hidden.ptr<float>()[t * W + i])));
    auto cell = [&](const Run& r) {
      auto [d, at] = hidden_diff(p.cpu, r, l, H);
      return std::isnan(d) ? std::string("") : at < 0 ? std::string("0") : fmt::format("{:.3g} @{}", d, at);
    };
    std::printf("%-6s %-10.3g %-16s %-16s %s\n", l == layers ? "final" : std::to_string(l).c_str(), mx, cell(p.free).c_str(),
                cell(p.forced).c_str(), cell(p.both).c_str());
  }
}

int cmd_route_diff(int argc, char** argv) {
  CLI::App app{"Does the device pick other experts (MoE) or key blocks (MiniMax-M3 sparse attention) than the CPU "
               "reference, and does that explain its logit error? Records every MoE layer's routing and every sparse "
               "layer's block selection on the CPU (fp32) and the device, counts the flips, reruns the device with the "
               "CPU's routing (then routing and blocks) forced, checks the device's sparse kernels against the CPU ops "
               "on the same inputs, and compares every run's logits with the golden, for every prompt"};
  std::string dir, device = "auto", prompt_arg = "all";
  app.add_option("dir", dir, "fixture directory holding golden.json (a MoE model)")->required();
  app.add_option("--prompt", prompt_arg,
                 "all (default): a table of every prompt, details of the worst | N: details of golden prompt N");
  app.add_option("--device", device, "auto | cpu | cuda: the device compared with the CPU reference");
  CLI11_PARSE(app, argc, argv);

  cli::Golden g(dir);
  int detail = -1;
  if (prompt_arg != "all") {
    detail = std::stoi(prompt_arg);
    TS_CHECK(detail >= 0 && size_t(detail) < g.num_prompts(), "--prompt {}: the golden has {} prompts", detail,
             g.num_prompts());
  }
  const Device dev = cli::parse_device(device);
  const char* dn = device_name(dev);
  // Capture the residual entering every layer and the final one (the EAGLE3 aux capture).
  const io::ModelConfig cfg = io::load_config(dir);
  models::LoadOptions lo;
  for (int l = 0; l <= int(cfg.num_layers); ++l) lo.capture_layers.push_back(l);
  lo.device = Device::cpu;
  std::shared_ptr<models::Model> cpu_model = models::load_model(dir, lo);
  lo.device = dev;
  std::shared_ptr<models::Model> dev_model = models::load_model(dir, lo);

  std::vector<PromptRuns> runs(g.num_prompts());
  for (size_t i = 0; i < g.num_prompts(); ++i) analyse(g, i, cpu_model, dev_model, runs[i]);
  if (detail < 0) {  // the worst prompt on the device
    detail = 0;
    for (size_t i = 1; i < runs.size(); ++i)
      if (runs[i].free.diff > runs[size_t(detail)].free.diff) detail = int(i);
  }
  const PromptRuns& d = runs[size_t(detail)];

  std::printf("route-diff %s: %zu prompts, %s vs the cpu reference; max abs logit diff vs golden per prompt\n", dir.c_str(),
              runs.size(), dn);
  std::printf("%-7s %-7s %-9s %-12s %-13s%s %-9s %-14s%s\n", "prompt", "tokens", "cpu", "route flips", "gap at first",
              d.sparse ? " block flips  gap      " : "", dn, "routes forced", d.sparse ? " routes+blocks forced" : "");
  for (const PromptRuns& p : runs)
    std::printf("%-7zu %-7lld %-9.3g %-12lld %-13s%s %-9.3g %-14.3g%s\n", p.idx, (long long)p.tokens, p.cpu.diff,
                (long long)p.route_flips, num(p.route_gap).c_str(),
                p.sparse ? fmt::format(" {:<12} {:<8}", p.block_flips, num(p.block_gap_first)).c_str() : "", p.free.diff,
                p.forced.diff, p.sparse ? fmt::format(" {:.3g}", p.both.diff).c_str() : "");
  print_details(dir, d, dn, cfg.num_layers, cfg.hidden_size);

  // The device's error on the other prompts: the level its precision alone gives.
  double other = 0;
  for (const PromptRuns& p : runs)
    if (p.idx != d.idx) other = std::max(other, p.free.diff);
  std::printf("max abs logit diff vs golden, prompt %zu (%zu rows):\n", d.idx, d.rows.size());
  std::printf("  %-36s %.3g\n", "cpu reference", d.cpu.diff);
  std::printf("  %-36s %.3g\n", dn, d.free.diff);
  std::printf("  %-36s %.3g\n", fmt::format("{}, cpu routing forced", dn).c_str(), d.forced.diff);
  if (d.sparse) std::printf("  %-36s %.3g\n", fmt::format("{}, cpu routing + blocks forced", dn).c_str(), d.both.diff);
  std::printf("  %-36s %.3g\n", fmt::format("{}, other prompts (max)", dn).c_str(), other);
  // Precision alone gives about the other prompts' level; allow 2x of it (at least 0.05).
  const double level = std::max(0.05, 2.0 * other);
  const bool flips = d.route_flips + d.block_flips > 0;
  std::string verdict;
  if (d.free.diff <= level) verdict = "the error is at the other prompts' level";
  else if (!flips) verdict = "no routing or block-selection difference: flips do not explain the error";
  else if (d.forced.diff <= level) verdict = "routing flips explain the error (forcing the cpu routing brings it to the other prompts' level)";
  else if (d.sparse && d.both.diff <= level)
    verdict = "routing + block-selection flips explain the error (forcing both brings it to the other prompts' level)";
  else
    verdict = fmt::format("flips do not explain the error (it stays above the other prompts' level with the cpu {} forced): "
                          "see the hidden-state table{}",
                          d.sparse ? "routing and blocks" : "routing", d.sparse ? " and the sparse kernel check" : "");
  std::printf("verdict: %s\n", verdict.c_str());
  if (d.sparse) {
    // Same inputs, so the kernels may differ from the CPU ops by bf16 output rounding (~0.4% of
    // |out|) and the indexer on exact fp32 ties only.
    double worst_rel = 0;
    int64_t sel_differ = 0;
    for (const auto* r : {&d.free, &d.forced, &d.both})
      for (const auto& c : r->blocks.checks) {
        worst_rel = std::max(worst_rel, c.out_max > 0 ? c.out_diff / c.out_max : 0.0);
        sel_differ += c.sel_differ;
      }
    std::printf("kernel check: %s (attention max rel diff %.2g, indexer picks differing %lld)\n",
                worst_rel <= 0.02 && sel_differ == 0 ? "the device sparse kernels agree with the CPU ops on the same inputs"
                                                     : "the device sparse kernels DISAGREE with the CPU ops on the same inputs",
                worst_rel, (long long)sel_differ);
  }
  return 0;
}

}  // namespace

TS_COMMAND("route-diff",
           "MoE / sparse attention: compare the device's expert routing and key-block selection with the CPU's, force "
           "them, check the sparse kernels (bf16 error diagnosis)",
           cmd_route_diff);
