// route-diff DIR: does the device (bf16) pick different experts than the CPU (fp32) reference,
// and does that explain its logit error? Three runs of one golden prompt, all through moe_block's
// route hook (models/moe.h):
//  1. CPU fp32, recording every MoE layer's router logits, expert ids and weights;
//  2. the device, recording the same: per layer, how many tokens' top-k expert SET differs, and
//     for the first such (layer, token) the CPU's gap between its k-th and (k+1)-th selection
//     score next to the device's scores of those experts;
//  3. the device again with the CPU's ids and weights forced into every MoE layer.
// The logit error against the golden (verify-golden's measure) of runs 2 and 3, next to the
// device's error on the other prompts: if forcing brings the error down to that level, routing
// flips explain it; if not, the error comes from elsewhere.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/golden.h"
#include "models/moe.h"
#include "runtime/model_runner.h"

namespace {

using namespace ts;

// Runs prompt (all logit rows) through a fresh runner; returns host logits [T, V] f32 (a copy).
Tensor run_prompt(const std::shared_ptr<models::Model>& model, const std::vector<int32_t>& prompt,
                  models::RouteTape* tape) {
  const int bs = 16;
  const int64_t blocks = (int64_t(prompt.size()) + bs - 1) / bs + 1;
  ModelRunner runner(model, blocks, bs);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[size_t(b)] = int32_t(b);
  SeqChunk c{prompt.data(), int(prompt.size()), 0, &table, SeqChunk::Logits::all};
  models::ScopedMoeRouteHook on(tape);
  if (tape) tape->start();
  return runner.run({c}).to_f32();
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

int cmd_route_diff(int argc, char** argv) {
  CLI::App app{"Does the device pick other experts than the CPU reference, and does that explain its logit error? "
               "Records every MoE layer's routing on the CPU (fp32) and the device, counts per layer the tokens whose "
               "top-k expert set differs, then reruns the device with the CPU's routing forced and compares both "
               "devices runs' logits with the golden"};
  std::string dir, device = "auto";
  int prompt_idx = -1;
  app.add_option("dir", dir, "fixture directory holding golden.json (a MoE model)")->required();
  app.add_option("--prompt", prompt_idx, "golden prompt index (default: the longest prompt)");
  app.add_option("--device", device, "auto | cpu | cuda: the device compared with the CPU reference");
  CLI11_PARSE(app, argc, argv);

  cli::Golden g(dir);
  if (prompt_idx < 0) {
    for (size_t i = 0; i < g.num_prompts(); ++i)
      if (prompt_idx < 0 || g.prompt(i).size() > g.prompt(size_t(prompt_idx)).size()) prompt_idx = int(i);
  }
  TS_CHECK(prompt_idx >= 0 && size_t(prompt_idx) < g.num_prompts(), "--prompt {}: the golden has {} prompts", prompt_idx,
           g.num_prompts());
  const size_t pi = size_t(prompt_idx);
  const std::vector<int32_t> prompt = g.prompt(pi);
  const Tensor ref = g.logits(pi);
  const std::vector<int64_t> rows = g.logit_rows(pi);
  const Device dev = cli::parse_device(device);

  // 1. CPU reference.
  models::RouteTape cpu;
  double cpu_diff;
  {
    models::LoadOptions lo;
    lo.device = Device::cpu;
    cpu_diff = cli::max_logit_diff(run_prompt(models::load_model(dir, lo), prompt, &cpu), ref, rows);
  }
  TS_CHECK(!cpu.seen.empty(), "{}: no MoE layer ran (not a mixture-of-experts model?)", dir);

  // 2. The device, free; 3. the device with the CPU's routing.
  models::LoadOptions lo;
  lo.device = dev;
  std::shared_ptr<models::Model> model = models::load_model(dir, lo);
  models::RouteTape free_run, forced_run;
  const double free_diff = cli::max_logit_diff(run_prompt(model, prompt, &free_run), ref, rows);
  forced_run.forced = cpu.seen;
  const double forced_diff = cli::max_logit_diff(run_prompt(model, prompt, &forced_run), ref, rows);
  TS_CHECK(free_run.seen.size() == cpu.seen.size(), "route-diff: {} MoE layers on the CPU, {} on {}", cpu.seen.size(),
           free_run.seen.size(), device_name(dev));
  // The device's error on the other prompts: the level its precision alone gives.
  double other_diff = 0;
  for (size_t i = 0; i < g.num_prompts(); ++i)
    if (i != pi) other_diff = std::max(other_diff, cli::max_logit_diff(run_prompt(model, g.prompt(i), nullptr), g.logits(i), g.logit_rows(i)));

  std::printf("route-diff %s: prompt %zu (%zu tokens), %zu MoE layers, top-%d; %s vs the cpu reference\n", dir.c_str(),
              pi, prompt.size(), cpu.seen.size(), cpu.seen[0].routing.top_k, device_name(dev));
  std::printf("%-6s %-7s %-22s %-24s %-18s %s\n", "layer", "tokens", "free: set differs", "max cpu gap there", "router logit diff",
              "forced upstream: would differ");
  int first_layer = -1;
  int64_t total_free = 0, total_forced = 0;
  for (size_t l = 0; l < cpu.seen.size(); ++l) {
    LayerDiff f = compare(cpu.seen[l], free_run.seen[l]);
    // With the CPU's routing forced in the layers before, this layer's own choice (recorded
    // before the override) isolates the flips that this layer's arithmetic causes.
    LayerDiff o = compare(cpu.seen[l], forced_run.seen[l]);
    total_free += f.differ;
    total_forced += o.differ;
    if (first_layer < 0 && f.first >= 0) first_layer = int(l);
    std::printf("%-6zu %-7lld %-22s %-24s %-18.3g %s\n", l, (long long)f.tokens,
                fmt::format("{} ({:.2f}%)", f.differ, 100.0 * double(f.differ) / double(std::max<int64_t>(f.tokens, 1))).c_str(),
                f.differ ? fmt::format("{:.3g}", f.max_gap_differ).c_str() : "-", f.max_logit_diff,
                o.differ ? fmt::format("{} (max cpu gap there {:.3g})", o.differ, o.max_gap_differ).c_str() : "0");
  }
  if (first_layer >= 0) {
    const size_t l = size_t(first_layer);
    print_first(first_layer, compare(cpu.seen[l], free_run.seen[l]).first, cpu.seen[l], free_run.seen[l]);
  } else {
    std::printf("no token's expert set differs in any MoE layer\n");
  }
  const char* dn = device_name(dev);
  std::printf("max abs logit diff vs golden (%zu rows):\n", rows.size());
  std::printf("  %-30s %.3g\n", "cpu reference", cpu_diff);
  std::printf("  %-30s %.3g\n", dn, free_diff);
  std::printf("  %-30s %.3g\n", fmt::format("{}, cpu routing forced", dn).c_str(), forced_diff);
  std::printf("  %-30s %.3g\n", fmt::format("{}, other prompts (max)", dn).c_str(), other_diff);
  // Precision alone gives about the other prompts' level; allow 2x of it (at least 0.05).
  const double level = std::max(0.05, 2.0 * other_diff);
  const char* verdict = total_free == 0 ? "no routing difference: routing does not explain the error"
                        : forced_diff <= level && free_diff > level
                            ? "routing flips explain the error (forcing the cpu routing brings it to the other prompts' level)"
                        : forced_diff > level ? "routing does not explain the error (it stays above the other prompts' level with the cpu routing forced)"
                                              : "the error is at the other prompts' level either way";
  std::printf("verdict: %s\n", verdict);
  return 0;
}

}  // namespace

TS_COMMAND("route-diff", "MoE: compare the device's expert routing with the CPU's and force it (bf16 error diagnosis)",
           cmd_route_diff);
