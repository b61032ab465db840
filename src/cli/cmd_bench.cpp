// bench: a model's prefill and decode speed next to the machine's measured ceilings (copy
// bandwidth, GEMM TFLOP/s), as a markdown table and optionally JSON. See src/bench/model_bench.h.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "bench/attention_lab.h"
#include "bench/linear_lab.h"
#include "bench/model_bench.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace {

using namespace ts;

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Benchmark a model against this machine's ceilings: prefill TFLOP/s vs GEMM, decode GB/s vs copy bandwidth"};
  bench::BenchOptions o;
  o.model_dir = cli::default_model_dir();
  std::string device = "auto", json_file;
  double copy_mb = 0;
  app.add_option("--model,--model-path", o.model_dir, "model directory (default: the bundled demo model)");
  app.add_option("--device", device, "auto | cpu | cuda");
  app.add_option("--prompt-lens", o.prompt_lens, "prefill lengths (each followed by a batch-1 decode)")->delimiter(',');
  app.add_option("--batches", o.batches, "decode batch sizes")->delimiter(',');
  app.add_option("--contexts", o.contexts, "cached tokens per sequence for the decode grid")->delimiter(',');
  app.add_option("--decode-steps", o.decode_steps, "timed decode steps per measurement");
  app.add_option("--repeats", o.prefill_repeats, "prefill runs (median reported)");
  app.add_option("--block-size", o.block_size, "tokens per KV-cache block");
  app.add_option("--mem-fraction", o.mem_fraction, "CUDA: share of GPU memory for weights + KV pool");
  app.add_option("--kv-tokens", o.kv_tokens, "KV pool size in tokens (default: from free memory)");
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "auto | bf16 | fp8 | fp8_e4m3: the KV cache's element type, as serve's flag (its bytes count in the "
                 "decode bytes per step)");
  app.add_option("--cpu-kv-gb", o.cpu_kv_gb, "CPU: KV pool limit in GB");
  app.add_option("--gemm-size", o.gemm_size, "GEMM ceiling M = N = K (default 8192 on CUDA, 1024 on the CPU)");
  app.add_option("--copy-mb", copy_mb, "copy ceiling buffer in MiB (default 1024 on CUDA, 256 on the CPU)");
  app.add_option("--seed", o.seed, "seed of the random token ids");
  app.add_flag("--forward-only", o.forward_only,
               "time the batch build + Model::forward only (no logits copy to the host) instead of ModelRunner::run");
  app.add_flag("--host-logits", o.host_logits,
               "steps copy the logits to the host and sample there (requests with logprobs/penalties) instead of "
               "sampling on the device (the engine's usual step)");
  app.add_flag("--unfused-head", o.unfused_head,
               "greedy steps compute the f32 logits and sample them on the device instead of the fused LM head + "
               "argmax (one launch at batch 1-2; the A/B of that fusion)");
  app.add_flag("--profile", o.profile,
               "CUDA: after each decode row, one more step with the device time of every op (CUDA events), the "
               "device's idle gaps, and the logits' copy to the host pageable vs pinned");
  app.add_flag("--graphs", o.graphs,
               "CUDA: run every step through the engine's CUDA graphs (decode graphs per batch bucket, breakable "
               "prefill graphs up to --graph-prefill-tokens; mixed steps take the prefill graph of their padded "
               "bucket), as serve does, instead of eagerly");
  app.add_flag("--deterministic", o.deterministic,
               "CUDA: the model's steps use serve's --enable-deterministic-inference kernels (batch-invariant; the "
               "ceilings stay default): compare with a run without it for that mode's cost");
  app.add_flag("--gemm-autotune", o.gemm_autotune,
               "CUDA: as serve's flag: time cuBLASLt's first 8 algorithms per GEMM shape of <= 256 rows and keep the "
               "fastest (compare with a run without it)");
  app.add_option("--graph-prefill-tokens", o.graph_prefill_tokens,
                 "with --graphs: largest prefill captured in a graph (serve's --prefill-graph-max-tokens)");
  app.add_option("--mixed-chunks", o.mixed_chunks,
                 "after each decode row, time a step of its decodes plus a prefill chunk of each of these sizes (a "
                 "mixed step, --enable-mixed-batch) next to the chunk alone")
      ->delimiter(',');
  app.add_option("--json", json_file, "also write the results as JSON to FILE");
  bool linear_lab = false;
  app.add_flag("--linear-lab", linear_lab,
               "CUDA: instead of a model, time the linear kernels at Llama-3.1-8B shapes over bf16 and FP8 (kept as "
               "stored) weights, GB/s of the stored bytes vs the copy ceiling");
  bool attention_lab = false;
  app.add_flag("--attention-lab", attention_lab,
               "CUDA: instead of a model, time the split-KV decode attention at Llama-3.1-8B shapes per (batch, "
               "context): the default split count next to batch-invariant splits (each sequence cut by its own length) and "
               "an FP8 (e4m3) cache of the same values");
  bool moe_lab = false;
  app.add_flag("--moe-lab", moe_lab,
               "CUDA: instead of a model, time one MoE layer's routed experts at Qwen3-30B-A3B shapes (128 experts, "
               "top-8) over bf16, FP8 block-128 and NVFP4 (kept as stored) experts, per token count: time per layer "
               "and GB/s of the experts actually read vs the copy ceiling");
  bool gemm_lab = false;
  std::vector<int> gemm_ms;
  app.add_flag("--gemm-lab", gemm_lab,
               "CUDA: instead of a model, time the bf16 GEMMs of prefill and mixed steps at Llama-3.1-8B shapes per "
               "row count under cuBLASLt algorithm choices (the heuristic's pick for exactly M, for M's power-of-two "
               "bucket, the fastest of its first 8), TFLOP/s vs the GEMM ceiling");
  app.add_option("--gemm-ms", gemm_ms, "with --gemm-lab: the row counts M")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (gemm_lab) {
    bench::GemmLabOptions go;
    if (!gemm_ms.empty()) go.ms = gemm_ms;
    std::string md = bench::run_gemm_lab(go);
    std::fwrite(md.data(), 1, md.size(), stdout);
    return 0;
  }
  if (moe_lab) {
    bench::MoeLabOptions mo;
    if (copy_mb > 0) mo.copy_bytes = size_t(copy_mb * double(1 << 20));
    std::string md = bench::run_moe_lab(mo);
    std::fwrite(md.data(), 1, md.size(), stdout);
    return 0;
  }
  if (attention_lab) {
    bench::AttentionLabOptions ao;
    if (copy_mb > 0) ao.copy_bytes = size_t(copy_mb * double(1 << 20));
    std::string md = bench::run_attention_lab(ao);
    std::fwrite(md.data(), 1, md.size(), stdout);
    return 0;
  }
  if (linear_lab) {
    bench::LinearLabOptions lo;
    if (copy_mb > 0) lo.copy_bytes = size_t(copy_mb * double(1 << 20));
    std::string md = bench::run_linear_lab(lo);
    std::fwrite(md.data(), 1, md.size(), stdout);
    return 0;
  }
  o.device = cli::parse_device(device);
  if (copy_mb > 0) o.copy_bytes = size_t(copy_mb * double(1 << 20));
  bench::BenchResult r = bench::run_model_bench(o);
  std::fwrite(r.markdown.data(), 1, r.markdown.size(), stdout);
  std::fflush(stdout);
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    TS_CHECK(f.good(), "--json {}: cannot write", json_file);
    f << r.json.dump(2) << "\n";
    TS_CHECK(f.good(), "--json {}: write failed", json_file);
  }
  return 0;
}

}  // namespace

TS_COMMAND("bench", "benchmark prefill/decode against measured copy and GEMM ceilings (markdown + JSON)", cmd_bench);
