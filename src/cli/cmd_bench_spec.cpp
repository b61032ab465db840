// bench-spec: the engine (no HTTP) decoding B requests at once, with and without EAGLE3
// speculation: per-user decode tok/s, total tok/s, mean accepted length and the speculative
// step's device time split into draft model (draft steps + catch-up) and target verify.
// Prompts are deterministic Python-like code (the agentic benchmark's generator), each request
// its own text, so a trained draft sees text like its training data.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/agentic.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/engine_flags.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace ts;
using Clock = std::chrono::steady_clock;

struct Row {
  double per_user = 0, total = 0, accept = 0, draft_ms = 0, verify_ms = 0, graph_frac = 0, host_us = 0;
};

// Prompts: token-id lists from --prompts-json (a list of lists, or spec_golden.json's
// {"traces": [{"prompt": [...]}]}), cycled over the requests; else generated code text.
std::vector<std::vector<int32_t>> make_prompts(const Engine& e, int n, int tokens, const std::string& json_file) {
  std::vector<std::vector<int32_t>> out;
  if (!json_file.empty()) {
    std::ifstream f(json_file);
    TS_CHECK(f.good(), "bench-spec: cannot read {}", json_file);
    nlohmann::json j = nlohmann::json::parse(f);
    if (j.is_object() && j.contains("traces"))
      for (auto& t : j["traces"]) out.push_back(t["prompt"].get<std::vector<int32_t>>());
    else
      for (auto& p : j) out.push_back(p.get<std::vector<int32_t>>());
    TS_CHECK(!out.empty(), "bench-spec: {} holds no prompts", json_file);
    return out;
  }
  bench::CodeTextGen gen;
  for (int i = 0; i < n; ++i) {
    bench::Rng rng(1000 + uint64_t(i));
    std::vector<int32_t> ids = e.tokenizer().encode(gen.code(rng, size_t(tokens) * 6), true);
    if (int(ids.size()) > tokens) ids.resize(size_t(tokens));
    out.push_back(std::move(ids));
  }
  return out;
}

// One level: B requests submitted together; per-user speed = decode tokens after the first /
// time from the first to the last token, averaged over the requests.
Row run_level(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int B, int gen, float temperature) {
  EngineMetrics m0 = e.metrics();
  std::vector<std::shared_ptr<Stream>> st;
  auto t0 = Clock::now();
  for (int i = 0; i < B; ++i) {
    GenerateParams p;
    p.prompt = prompts[size_t(i) % prompts.size()];
    p.max_tokens = gen;
    p.ignore_eos = true;
    p.temperature = temperature;
    p.seed = uint64_t(i);
    st.push_back(e.submit(p));
  }
  // One reader thread per stream: token arrival times are taken as they arrive.
  std::vector<double> user(static_cast<size_t>(B), 0.0);
  std::vector<int64_t> count(size_t(B), 0);
  std::vector<std::string> errors(static_cast<size_t>(B));
  std::vector<std::thread> readers;
  for (int i = 0; i < B; ++i)
    readers.emplace_back([&, i] {
      StreamEvent ev;
      Clock::time_point first{}, last{};
      bool have_first = false;
      while (true) {
        if (!st[size_t(i)]->pop(ev, 600000)) {
          errors[size_t(i)] = "timed out";
          return;
        }
        if (!ev.error.empty()) errors[size_t(i)] = ev.error;
        if (!ev.tokens.empty()) {
          last = Clock::now();
          if (!have_first) first = last, have_first = true;
          count[size_t(i)] += int64_t(ev.tokens.size());
        }
        if (ev.finished) break;
      }
      double dt = std::chrono::duration<double>(last - first).count();
      user[size_t(i)] = dt > 0 ? double(count[size_t(i)] - 1) / dt : 0;
    });
  for (auto& t : readers) t.join();
  double per_user = 0;
  int64_t tokens = 0;
  for (int i = 0; i < B; ++i) {
    TS_CHECK(errors[size_t(i)].empty(), "bench-spec: request {}: {}", i, errors[size_t(i)]);
    per_user += user[size_t(i)];
    tokens += count[size_t(i)];
  }
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  // Metrics are published at the end of the step that sent the final events.
  EngineMetrics m1 = e.metrics();
  for (int i = 0; i < 100 && m1.steps == m0.steps; ++i) m1 = e.metrics();
  Row r;
  r.per_user = per_user / B;
  r.total = double(tokens) / wall;
  int64_t vs = m1.spec_verify_steps - m0.spec_verify_steps, fs = m1.spec_fixed_steps - m0.spec_fixed_steps;
  int64_t ts = m1.spec_timed_steps - m0.spec_timed_steps;
  if (vs > 0) r.accept = double(m1.spec_accepted_tokens - m0.spec_accepted_tokens) / double(vs);
  if (ts > 0) {
    r.draft_ms = 1e3 * (m1.spec_draft_seconds - m0.spec_draft_seconds) / double(ts);
    r.verify_ms = 1e3 * (m1.spec_verify_seconds - m0.spec_verify_seconds) / double(ts);
  }
  if (fs > 0) r.graph_frac = double(m1.spec_graph_steps - m0.spec_graph_steps) / double(fs);
  r.host_us = m1.step_host_us_mean;
  return r;
}

int cmd_bench_spec(int argc, char** argv) {
  CLI::App app{"Benchmark decoding with and without EAGLE3 speculation (engine level, no HTTP): per-user and total "
               "tok/s, accepted length, draft/verify device ms per step"};
  EngineOptions eo;
  std::string model, batches_s = "1,8,32", prompts_json;
  int prompt_tokens = 512, gen_tokens = 256;
  float temperature = 0.0f;
  bool spec_only = false;
  cli::add_model_arg(app, model);
  app.add_option("--batches", batches_s, "concurrent requests per level, comma list");
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length (code text, different per request)");
  app.add_option("--gen-tokens", gen_tokens, "tokens generated per request (EOS ignored)");
  app.add_option("--prompts-json", prompts_json,
                 "prompts as token ids: a JSON list of lists, or spec_golden.json (its traces' prompts), cycled over requests");
  app.add_option("--temperature", temperature, "sampling temperature (0: greedy, the default)");
  app.add_flag("--spec-only", spec_only, "skip the run without speculation");
  cli::add_engine_flags(app, eo);
  CLI11_PARSE(app, argc, argv);
  cli::resolve_model(model, eo);
  std::vector<int> batches;
  for (int32_t b : cli::parse_ids(batches_s)) batches.push_back(int(b));
  TS_CHECK(!batches.empty() && prompt_tokens >= 1 && gen_tokens >= 2, "bench-spec: bad --batches/--prompt-tokens/--gen-tokens");
  const bool have_spec = !eo.speculative_algorithm.empty();
  std::vector<std::pair<std::string, EngineOptions>> modes;
  if (!spec_only) {
    EngineOptions plain = eo;
    plain.speculative_algorithm.clear();
    modes.emplace_back("plain", plain);
  }
  if (have_spec) modes.emplace_back("eagle3", eo);
  TS_CHECK(!modes.empty(), "bench-spec: --spec-only needs --speculative-algorithm EAGLE3");
  std::map<std::pair<std::string, int>, Row> rows;
  for (auto& [name, o] : modes) {
    Engine e(o);
    e.start();
    auto prompts = make_prompts(e, *std::max_element(batches.begin(), batches.end()), prompt_tokens, prompts_json);
    run_level(e, prompts, 1, std::min(gen_tokens, 16), temperature);  // warm-up
    for (int b : batches) {
      if (b != 1) {
        rows[{name, b}] = run_level(e, prompts, b, gen_tokens, temperature);
        continue;
      }
      // Batch 1: one request at a time over (up to) the first 3 prompts, averaged, so one
      // prompt's acceptance does not stand for all.
      Row sum;
      int k = int(std::min<size_t>(prompts.size(), 3));
      for (int i = 0; i < k; ++i) {
        std::vector<std::vector<int32_t>> one{prompts[size_t(i)]};
        Row r = run_level(e, one, 1, gen_tokens, temperature);
        sum.per_user += r.per_user / k, sum.total += r.total / k, sum.accept += r.accept / k;
        sum.draft_ms += r.draft_ms / k, sum.verify_ms += r.verify_ms / k, sum.graph_frac += r.graph_frac / k;
        sum.host_us = r.host_us;
      }
      rows[{name, b}] = sum;
    }
    e.stop();
  }
  std::printf("\nbench-spec: %s on %s, prompt %d tokens, %d generated per request\n", eo.model_dir.c_str(),
              eo.device.c_str(), prompt_tokens, gen_tokens);
  std::printf("%-7s %5s %12s %12s %9s %9s %10s %10s %7s %8s\n", "mode", "batch", "user tok/s", "total tok/s", "speedup",
              "accept", "draft ms", "verify ms", "graphs", "host us");
  for (auto& [name, o] : modes)
    for (int b : batches) {
      const Row& r = rows[{name, b}];
      auto base = rows.find({"plain", b});
      double sp = base != rows.end() && base->second.per_user > 0 ? r.per_user / base->second.per_user : 0;
      std::printf("%-7s %5d %12.1f %12.1f %8.2fx %9.3f %10.3f %10.3f %6.0f%% %8.1f\n", name.c_str(), b, r.per_user, r.total,
                  sp, r.accept, r.draft_ms, r.verify_ms, 100 * r.graph_frac, r.host_us);
    }
  std::printf("(speedup: per-user tok/s over plain at the same batch; accept: tokens per verify step; draft/verify ms: "
              "device time per speculative step;\n host us: engine host time per step, EWMA)\n");
  return 0;
}

}  // namespace

TS_COMMAND("bench-spec", "benchmark decoding with and without EAGLE3 speculation (per-user/total tok/s, accept length, draft/verify ms)",
           cmd_bench_spec);
