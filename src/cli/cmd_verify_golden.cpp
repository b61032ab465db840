// verify-golden DIR: runs every prompt of DIR/golden.json through the engine's model path
// (paged KV cache, incremental decode) and compares with transformers' logits and greedy tokens.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/engine_flags.h"
#include "cli/golden.h"
#include "models/model.h"
#include "runtime/model_runner.h"
#include "runtime/tp_workers.h"

namespace {

using namespace ts;

int argmax_row(const Tensor& logits, int64_t r) {
  const float* p = logits.ptr<float>() + r * logits.row_stride();
  int64_t v = logits.size(-1), best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (p[i] > p[best]) best = i;
  return int(best);
}

int cmd_verify_golden(int argc, char** argv) {
  CLI::App app{"Compare the engine with transformers' goldens (DIR/golden.json + golden.safetensors)"};
  std::string dir, device = "cpu";
  double atol = 1e-3;
  app.add_option("dir", dir, "model directory holding golden.json")->required();
  app.add_option("--atol", atol,
                 "max abs logit difference allowed (on a GPU, where golden.json records "
                 "w8a8_simulated_max_abs_diff, at least 1.5x that per prompt: W8A8 prefill of FP8 checkpoints)");
  app.add_option("--device", device, "cpu | cuda | auto");
  std::string only;
  app.add_option("--prompts", only, "check only these prompt indices, e.g. 0,1,2 (default: all)");
  std::string kv_dtype = "auto";
  app.add_option("--kv-cache-dtype", kv_dtype,
                 "auto | bf16 | fp8 | fp8_e4m3: fp8 stores the KV cache as e4m3 (scale 1.0; CPU backend, paged k/v "
                 "models); the greedy check is then teacher-forced with near-ties within atol, as on the GPU");
  // The parallel flags (--tp-size, --ep-size, ...): the model runs as one shard per rank (CPU
  // ranks are threads over the CPU Comm backend), through the engine's TP worker path.
  bool simulate_w8a8 = false;
  app.add_flag("--simulate-w8a8", simulate_w8a8,
               "CPU: FP8 linears whose CUDA form runs W8A8 (block-128, dynamic activations, K % 512 == 0) quantize "
               "their activations as CUDA does in forwards of 32 rows or more (the oracle of that path; the diff "
               "against the golden is then the W8A8 error)");
  parallel::ParallelOptions po;
  cli::add_parallel_flags(app, po);
  CLI11_PARSE(app, argc, argv);

  cli::Golden g(dir);
  TS_CHECK(!simulate_w8a8 || device == "cpu", "--simulate-w8a8 is for the CPU backend, --device cpu (CUDA runs W8A8 itself)");
  models::LoadOptions lo;
  lo.device = cli::parse_device(device);
  lo.simulate_w8a8 = simulate_w8a8;
  const int bs = 16;
  int64_t blocks = (g.max_prompt_len() + 32) / bs + 2;
  parallel::Mapping::resolve(po, 0);  // invalid flag combinations: an error naming them
  TS_CHECK(po.nnodes == 1, "verify-golden: --nnodes {} is not supported (one process)", po.nnodes);
  TpModels tpm;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<ModelRunner> runner_ptr;
  if (po.world_size() > 1) {
    tpm = load_tp_models(io::load_config(dir), lo, po);
    model = tpm.shards[0];
  } else {
    lo.replicate_embedding = po.replicate_embedding;
    model = models::load_model(dir, lo);
  }
  // The same cache the engine builds for --kv-cache-dtype (ops/cpu/attention.cpp reads and
  // writes the F8_E4M3 one); an error naming the flag where this model or device cannot.
  const DType kv_type = ModelRunner::check_kv_dtype(kv_dtype, *model);
  const bool kv_fp8 = kv_type == DType::f8_e4m3;
  runner_ptr = tpm.workers ? make_tp_runner(tpm, blocks, bs, 0, kv_type) : std::make_unique<ModelRunner>(model, blocks, bs, 0, kv_type);
  ModelRunner& runner = *runner_ptr;
  bool ok = true;
  double worst = 0;
  std::vector<int32_t> selected = only.empty() ? std::vector<int32_t>{} : cli::parse_ids(only);
  for (size_t i = 0; i < g.num_prompts(); ++i) {
    if (!selected.empty() && std::find(selected.begin(), selected.end(), int32_t(i)) == selected.end()) continue;
    auto prompt = g.prompt(i);
    auto want = g.greedy(i);
    // Attention DP (--data-parallel-size D): prompt i runs in DP group i % D (block ids of that
    // group's pools); the other groups run zero-token forwards beside it (their MoE collectives).
    const int64_t first_block = int64_t(i % size_t(runner.dp_groups())) * blocks;
    std::vector<int32_t> table;
    for (int64_t b = 0; b < blocks; ++b) table.push_back(int32_t(first_block + b));
    // Hybrid models: one recurrent-state row per prompt (reset by the model at position 0).
    std::shared_ptr<const int> state = runner.has_state() ? runner.take_state_slot() : nullptr;
    const int slot = state ? *state : -1;
    SeqChunk c{prompt.data(), int(prompt.size()), 0, &table, SeqChunk::Logits::all, slot};
    Tensor logits = runner.run({c}).to_f32();  // own copy: the runner reuses its buffers
    double diff = cli::max_logit_diff(logits, g.logits(i), g.logit_rows(i));
    // A GPU may quantize activations to FP8 (W8A8 prefill of checkpoints that declare dynamic
    // activations): the golden's simulated W8A8 difference bounds what that alone adds.
    const double tol = model->device() == Device::cpu ? atol : std::max(atol, 1.5 * g.w8a8_simulated_diff(i));
    // Greedy continuation through the incremental cache. On the CPU (fp32) it runs free and
    // must equal transformers exactly. In bf16 a near-tie may flip, so the GPU check is
    // teacher-forced: each golden token must be our argmax or within atol of our max logit.
    std::vector<int32_t> got;
    int near_ties = 0;
    bool exact = model->device() == Device::cpu && !kv_fp8;
    Tensor step_logits = logits.slice_rows(int64_t(prompt.size()) - 1, int64_t(prompt.size()));
    for (size_t k = 0; k < want.size(); ++k) {
      int32_t a = argmax_row(step_logits, 0);
      if (!exact && a != want[k]) {
        const float* row = step_logits.ptr<float>();
        if (row[a] - row[want[k]] <= tol) {
          ++near_ties;
          a = want[k];
        }
      }
      got.push_back(exact ? a : want[k] == a ? a : -1 - a);
      if (k + 1 == want.size()) break;
      int32_t next = exact ? a : want[k];
      int pos = int(prompt.size() + k);
      SeqChunk d{&next, 1, pos, &table, SeqChunk::Logits::last, slot};
      step_logits = runner.run({d}).to_f32();
    }
    bool tok_ok = got == want, diff_ok = diff <= tol;
    if (near_ties) std::printf("  %d greedy position(s) were near-ties within atol (teacher-forced check)\n", near_ties);
    ok = ok && tok_ok && diff_ok;
    worst = std::max(worst, diff);
    std::printf("prompt %zu: %zu tokens, max abs logit diff %.3g (%s%s), greedy %zu tokens %s\n", i, prompt.size(), diff,
                diff_ok ? "ok" : "FAIL", tol != atol ? fmt::format(", tolerance {:.3g} = 1.5 x w8a8", tol).c_str() : "",
                want.size(), tok_ok ? "match" : "MISMATCH");
    if (!tok_ok) {
      std::string gs, ws;
      for (auto t : got) gs += std::to_string(t) + " ";
      for (auto t : want) ws += std::to_string(t) + " ";
      std::printf("  got:  %s\n  want: %s\n", gs.c_str(), ws.c_str());
    }
  }
  const std::string ranks = po.world_size() > 1 ? " (" + model->mapping().str() + ")" : std::string();
  std::printf("%s: max abs logit diff %.3g (atol %.3g) on %s%s%s — %s\n", dir.c_str(), worst, atol,
              device_name(model->device()), ranks.c_str(), kv_fp8 ? " (FP8 KV cache)" : "", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

TS_COMMAND("verify-golden", "compare logits and greedy tokens with transformers' goldens", cmd_verify_golden);
