#include "bench/model_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

#include "bench/ceilings.h"
#include "core/device_memory.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/model_runner.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/op_profiler.h"
#include "core/cuda/runtime.h"
#endif

namespace ts::bench {
namespace {

using nlohmann::json;

constexpr int kWarmSteps = 2;  // untimed decode steps before each timed run

std::string fmt_time(double s) {
  if (s >= 1.0) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}
std::string fmt_count(double v) { return v >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.1f}", v); }
std::string fmt_gb(double bytes) {
  return bytes >= 1e9 ? fmt::format("{:.2f} GB", bytes / 1e9) : fmt::format("{:.2f} MB", bytes / 1e6);
}

// Parameter counts that the FLOP and byte formulas use (see model_bench.h).
struct Params {
  double layers = 0;         // linear + norm weights of the decoder layers (all experts)
  double head = 0;           // LM head (vocab x hidden)
  double embed = 0;          // embedding table (read one row per token: not counted)
  double expert_layer = 0;   // MoE: params of all experts of all layers (0: dense)
  double experts = 0, top_k = 0;
  // Linear-layer params one token passes through (MoE: only its top-k experts).
  double active_layers() const { return experts > 0 ? layers - expert_layer * (1.0 - top_k / experts) : layers; }
  // Layer params a decode step of B tokens reads: MoE reads the experts hit by any of the B
  // tokens, expected E * (1 - (1 - k/E)^B) per layer with uniform routing.
  double read_layers(int b) const {
    if (experts <= 0) return layers;
    double hit = 1.0 - std::pow(1.0 - top_k / experts, double(b));
    return layers - expert_layer * (1.0 - hit);
  }
};

}  // namespace

BenchResult run_model_bench(const BenchOptions& o) {
  TS_CHECK(!o.prompt_lens.empty() || !o.batches.empty(), "nothing to benchmark (no prompt lengths, no batches)");
  TS_CHECK(o.decode_steps >= 1, "--decode-steps must be >= 1");
  TS_CHECK(o.prefill_repeats >= 1, "--repeats must be >= 1");
  TS_CHECK(o.block_size >= 1 && o.block_size <= 1024, "--block-size must be in 1..1024");
  for (int v : o.prompt_lens) TS_CHECK(v >= 1, "--prompt-lens: lengths must be >= 1 (got {})", v);
  for (int v : o.batches) TS_CHECK(v >= 1, "--batches: sizes must be >= 1 (got {})", v);
  for (int v : o.contexts) TS_CHECK(v >= 0, "--contexts: lengths must be >= 0 (got {})", v);
  for (int v : o.mixed_chunks) TS_CHECK(v >= 1, "--mixed-chunks: sizes must be >= 1 (got {})", v);
  // The op profiler times eager launches; inside graph replays the ops are skipped.
  TS_CHECK(!(o.graphs && o.profile), "--profile times eager ops: run it without --graphs");
  TS_CHECK(!(o.graphs && o.forward_only), "--forward-only calls Model::forward eagerly: run it without --graphs");
  TS_CHECK(o.graph_prefill_tokens >= 16, "--graph-prefill-tokens must be >= 16");
  const Device dev = o.device;
  const int steps = o.decode_steps, bs = o.block_size;

  // 1. Ceilings first, while the memory is still free.
  std::fprintf(stderr, "bench: measuring the ceilings on %s...\n", device_name(dev));
  Ceilings c = measure_ceilings(dev, o.gemm_size, o.copy_bytes);

  // 2. Model and KV pool. Deterministic kernels from here on (load, warm-up, graph capture and
  // every timed step), as serve installs them on its threads.
#ifdef TS_WITH_CUDA
  cuda::LaunchConfig lc = cuda::launch_config();
  lc.batch_invariant = o.deterministic;
  lc.gemm_autotune = o.gemm_autotune;
  cuda::ScopedLaunchConfig launch_scope(lc);
#endif
  std::fprintf(stderr, "bench: loading %s...\n", o.model_dir.c_str());
  models::LoadOptions lo;
  lo.device = dev;
  std::shared_ptr<models::Model> model = models::load_model(o.model_dir, lo);
  const io::ModelConfig& cfg = model->config();
  const double dsize = double(dtype_size(model->dtype()));
  Params p;
  p.embed = double(model->embed_table().numel());
  p.head = double(model->lm_head().numel());
  bool shared_head = model->lm_head().data == model->embed_table().data;
  p.layers = double(model->weight_bytes()) / dsize - p.embed - (shared_head ? 0.0 : p.head);
  if (cfg.has("num_experts") && cfg.get<int64_t>("num_experts", 0) > 0) {
    p.experts = double(cfg.get<int64_t>("num_experts", 0));
    p.top_k = double(cfg.get<int64_t>("num_experts_per_tok", 1));
    double im = double(cfg.get<int64_t>("moe_intermediate_size", cfg.intermediate_size));
    p.expert_layer = double(cfg.num_layers) * p.experts * 3.0 * double(cfg.hidden_size) * im;
  }
  // Quantized checkpoints: the bytes a step reads with the weights kept as stored (what kernels
  // reading FP8 / FP4 + scales read), from the checkpoint's non-embedding tensors, against the
  // bf16 (model dtype) bytes of the same parameters (weight_read). The loaded bytes are no
  // parameter count here (CUDA keeps FP8 / NVFP4 linears and routed experts as stored): the
  // parameters are the checkpoint's weight elements (NVFP4: two a byte), scales left out.
  const io::QuantConfig qc = io::load_quant_config(o.model_dir);
  double stored_ratio = 1.0;
  std::string stored_fmt = "as loaded";
  if (qc.quantized()) {
    io::Checkpoint ck = io::Checkpoint::open(o.model_dir);
    double stored = 0, stored_embed = 0, params = 0;
    auto ends_with = [](const std::string& n, const char* suf) {
      const size_t l = std::strlen(suf);
      return n.size() >= l && n.compare(n.size() - l, l, suf) == 0;
    };
    for (auto& n : ck.names()) {
      const Tensor t = ck.get(n);
      const double nb = double(t.nbytes());
      stored += nb;
      if (n == "model.embed_tokens.weight") stored_embed = nb;
      const bool scale = ends_with(n, "_scale") || ends_with(n, "_scale_inv") || ends_with(n, "_scale_2");
      if (!scale) params += double(t.numel()) * (t.dtype == DType::u8 && io::is_quantized_weight(ck, n) ? 2.0 : 1.0);
    }
    p.layers = params - p.embed - (shared_head ? 0.0 : p.head);
    const double loaded = (p.layers + (shared_head ? p.embed : p.head)) * dsize;
    stored_ratio = (stored - (shared_head ? 0.0 : stored_embed)) / loaded;
    stored_fmt = qc.method + (qc.algo.empty() ? "" : " " + qc.algo);
  }
  // The KV cache's element type as serve builds it (--kv-cache-dtype): its bytes per token count in
  // every decode step's read.
  const DType kv_dtype = ModelRunner::check_kv_dtype(o.kv_cache_dtype, *model);
  const double kv_tok = double(ModelRunner::kv_bytes_per_token(*model, kv_dtype));
  const double attn_coef = 2.0 * double(cfg.num_layers) * double(cfg.num_heads) * double(cfg.head_dim);
  auto weight_read = [&](int b) { return (p.read_layers(b) + p.head) * dsize; };
  auto blocks_for = [&](int64_t tokens) { return (tokens + bs - 1) / bs; };

  int64_t needed = 1, max_prompt = 0, max_mixed = 0;
  for (int t : o.prompt_lens) {
    needed = std::max(needed, blocks_for(t + kWarmSteps + steps));
    max_prompt = std::max<int64_t>(max_prompt, t);
  }
  for (int m : o.mixed_chunks) max_mixed = std::max<int64_t>(max_mixed, m);
  for (int ctx : o.contexts)
    for (int b : o.batches) {
      needed = std::max(needed, b * blocks_for(ctx + kWarmSteps + steps) + blocks_for(max_mixed));
      max_prompt = std::max<int64_t>(max_prompt, b + max_mixed);
    }
  int64_t budget = 0;
  if (o.kv_tokens > 0) {
    budget = o.kv_tokens / bs;
  } else if (dev == Device::cuda) {
#ifdef TS_WITH_CUDA
    // Keep (1 - mem_fraction) of the GPU free, plus room for the prefill activations.
    double total = double(cuda::total_memory()), free = double(cuda::free_memory());
    double act = double(max_prompt) * double(3 * cfg.hidden_size + 3 * cfg.intermediate_size +
                                             (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim) *
                     dsize * 2.0 + double(1ull << 30);
    double avail = free - (1.0 - o.mem_fraction) * total - act;
    budget = avail > 0 ? int64_t(avail / (kv_tok * bs)) : 0;
#endif
  } else {
    budget = int64_t(o.cpu_kv_gb * 1e9 / (kv_tok * bs));
  }
  TS_CHECK(budget >= 1, "no memory left for a KV pool ({} bytes per token)", kv_tok);
  const int64_t pool = std::min(needed, budget);
  ModelRunner runner(model, pool, bs, 0, kv_dtype);
  const double pool_bytes = double(pool) * bs * kv_tok;
  if (o.graphs && dev == Device::cuda) {
    // The engine's graph options (serve's defaults), sized to this run's shapes.
    GraphOptions g;
    g.max_bs = 8;
    for (int b : o.batches) g.max_bs = std::max(g.max_bs, b);
    g.max_prefill_tokens = o.graph_prefill_tokens;
    g.max_context = int(std::min<int64_t>(pool * bs, cfg.max_position_embeddings));
    g.eager_max_tokens = int(std::max<int64_t>(max_prompt, 2048));
    runner.enable_graphs(g);
    std::fprintf(stderr, "bench: CUDA graphs captured in %.2f s (%d decode, %d prefill buckets)\n",
                 runner.graphs()->capture_seconds(), runner.graphs()->decode_graphs(), runner.graphs()->prefill_graphs());
  }
  // One step as the engine's eager step pays it: ModelRunner::run_greedy (the fused LM head +
  // argmax at batch 1-2; elsewhere the logits stay on the device and are argmaxed there, B ids to
  // the host); --unfused-head: ModelRunner::run with greedy sampling of the device logits; with host_logits the logits come to
  // the host and are sampled there (what requests with logprobs or penalties pay). forward_only:
  // the batch build and Model::forward alone.
  ForwardBatch fwd_batch;
  BatchBuilder fwd_builder;
  Tensor last_logits;  // the last step's logits, where run() left them
  std::vector<ops::SamplingRow> greedy;
  std::vector<int32_t> sampled;
  auto run = [&](const std::vector<SeqChunk>& ch) {
    if (o.forward_only) {
      fwd_builder.build(ch, bs, dev, fwd_batch);
      last_logits = model->forward(fwd_batch, runner.kv());
      return;
    }
    // The engine's greedy step: the LM head writes the ids where it fuses (ModelRunner::run_greedy).
    if (!o.host_logits && !o.unfused_head && runner.run_greedy(ch, sampled)) {
      last_logits = Tensor();
      return;
    }
    last_logits = runner.run(ch, false, o.host_logits);
    greedy.assign(size_t(last_logits.size(0)), ops::SamplingRow{});
    ops::sample(last_logits, greedy, sampled);
  };
  std::mt19937 rng(uint32_t(o.seed));
  auto rand_id = [&] { return int32_t(rng() % uint32_t(cfg.vocab_size)); };

  json rows = json::array();
  auto skipped = [&](const char* phase, int b, int ctx, const std::string& why) {
    rows.push_back({{"phase", phase}, {"batch", b}, {"context", ctx}, {"skipped", why}});
    std::fprintf(stderr, "bench: %s batch %d context %d skipped: %s\n", phase, b, ctx, why.c_str());
  };
  // Times `steps` decode steps one by one; the median step is reported (robust to a stray
  // slow step on a shared machine), the mean is kept in the JSON.
  auto time_steps = [&](const std::function<void(int)>& step, int first_pos) {
    std::vector<double> t;
    for (int i = 0; i < steps; ++i) t.push_back(time_region_s(dev, [&] { step(first_pos + i); }));
    double mean = 0;
    for (double x : t) mean += x / steps;
    std::sort(t.begin(), t.end());
    return std::pair<double, double>(t[t.size() / 2], mean);
  };
  const double read_ratio = dev == Device::cuda ? stored_ratio : 1.0;
  auto decode_row = [&](int b, int ctx, std::pair<double, double> med_mean, const char* phase) {
    double step_s = med_mean.first, secs = step_s * steps;
    // kv_len during timed step i is ctx + warm + i + 1; its mean over the timed steps:
    double avg_ctx = double(ctx) + kWarmSteps + (steps + 1) / 2.0;
    // The weight bytes the step really reads: as stored on CUDA (FP8 / NVFP4 kept as stored), as
    // loaded on the CPU (dequantized at load).
    double bytes = weight_read(b) * read_ratio + double(b) * kv_tok * avg_ctx;
    double gbs = bytes / step_s / 1e9;
    json r = {{"phase", phase},          {"batch", b},
              {"context", ctx},          {"steps", steps},
              {"time_s", secs},          {"step_ms", step_s * 1e3}, {"mean_step_ms", med_mean.second * 1e3},
              {"tok_s", b * steps / secs}, {"bytes_per_step", bytes},
              {"weight_bytes_per_step", weight_read(b)}, {"kv_bytes_per_step", double(b) * kv_tok * avg_ctx},
              {"stored_weight_bytes_per_step", weight_read(b) * stored_ratio},
              {"gb_s_counts", read_ratio == 1.0 ? "loaded weight bytes" : "stored weight bytes"},
              {"gb_s", gbs},             {"pct_copy", 100.0 * gbs / c.copy_gbs}};
    rows.push_back(r);
    std::fprintf(stderr, "bench: %s batch %d context %d: %.3f ms/step, %.1f tok/s, %.0f GB/s (%.1f%% of copy)\n", phase, b,
                 ctx, step_s * 1e3, b * steps / secs, gbs, 100.0 * gbs / c.copy_gbs);
  };
  const int64_t max_pos = cfg.max_position_embeddings;

  // --profile: one more eager step of a decode row with every op bracketed by CUDA events —
  // device time per op (linear per weight shape), busy vs the span they cover (the rest is the
  // device waiting on the host), then the logits' trip to the host both ways.
  auto profile_step = [&](json& row, const std::function<void()>& step) {
    if (!o.profile || dev != Device::cuda) return;
#ifdef TS_WITH_CUDA
    ops::cuda::CudaOpProfiler prof;
    ops::OpProfiler* prev = ops::op_profiler();
    ops::op_profiler() = &prof;
    double wall = 0;
    try {
      wall = time_region_s(dev, step);
    } catch (...) {
      ops::op_profiler() = prev;
      throw;
    }
    ops::op_profiler() = prev;
    ops::cuda::OpProfile p = prof.collect();
    std::sort(p.ops.begin(), p.ops.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
    json ops_j = json::array();
    std::fprintf(stderr, "bench: profile %s batch %d context %d: wall %.3f ms; device ops busy %.3f ms over a %.3f ms span "
                 "(%.3f ms of gaps: the device waiting for the host)\n", row["phase"].get<std::string>().c_str(),
                 row["batch"].get<int>(), row["context"].get<int>(), wall * 1e3, p.busy_ms, p.span_ms, p.span_ms - p.busy_ms);
    for (auto& op : p.ops) {
      std::fprintf(stderr, "bench:   %-40s %4d x %9.3f ms  %5.1f%%\n", op.label.c_str(), op.count, op.ms,
                   100.0 * op.ms / std::max(p.busy_ms, 1e-9));
      ops_j.push_back({{"op", op.label}, {"count", op.count}, {"ms", op.ms}});
    }
    // The logits' trip to the host: a fresh pageable buffer each time (Tensor::to, what
    // ModelRunner::run did per step before it kept a pinned buffer) vs one reused pinned buffer.
    double pageable = 0, pinned = 0;
    const size_t lbytes = last_logits.nbytes();
    if (last_logits.device == Device::cuda && lbytes) {
      std::vector<double> a, b;
      std::shared_ptr<void> buf = host_pinned_alloc(lbytes);
      for (int i = 0; i < 5; ++i) {
        a.push_back(time_region_s(dev, [&] { Tensor h = last_logits.to(Device::cpu); }));
        b.push_back(time_region_s(dev, [&] { device_copy(buf.get(), Device::cpu, last_logits.data, dev, lbytes); }));
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      pageable = a[2];
      pinned = b[2];
      std::fprintf(stderr, "bench:   logits to host (%lld x %lld f32, %s): fresh pageable buffer %.3f ms, reused pinned buffer %.3f ms\n",
                   (long long)last_logits.size(0), (long long)last_logits.size(1), fmt_gb(double(lbytes)).c_str(), pageable * 1e3,
                   pinned * 1e3);
    }
    row["profile"] = {{"wall_ms", wall * 1e3}, {"busy_ms", p.busy_ms}, {"span_ms", p.span_ms}, {"ops", ops_j},
                      {"logits_bytes", lbytes}, {"logits_to_host_pageable_ms", pageable * 1e3},
                      {"logits_to_host_pinned_ms", pinned * 1e3}};
#else
    (void)row;
    (void)step;
#endif
  };

  // 3. Prefill, then batch-1 decode continuing the same sequence.
  for (int t : o.prompt_lens) {
    int64_t span = t + kWarmSteps + steps;
    if (span > max_pos) {
      skipped("prefill", 1, t, fmt::format("{} tokens exceed max_position_embeddings {}", span, max_pos));
      continue;
    }
    if (blocks_for(span) > pool) {
      skipped("prefill", 1, t, fmt::format("needs {} of KV, the pool holds {}", fmt_gb(double(span) * kv_tok), fmt_gb(pool_bytes)));
      continue;
    }
    std::vector<int32_t> table(static_cast<size_t>(blocks_for(span)));
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::vector<int32_t> ids(static_cast<size_t>(t));
    for (auto& x : ids) x = rand_id();
    std::vector<SeqChunk> chunk = {{ids.data(), t, 0, &table, SeqChunk::Logits::last}};
    std::fprintf(stderr, "bench: prefill %d tokens...\n", t);
    run(chunk);  // warm-up (workspace growth, GEMM algorithm choice)
    std::vector<double> times;
    for (int r = 0; r < o.prefill_repeats; ++r) times.push_back(time_region_s(dev, [&] { run(chunk); }));
    std::sort(times.begin(), times.end());
    double secs = times[times.size() / 2];
    double flops = 2.0 * p.active_layers() * t + 2.0 * p.head + attn_coef * double(t) * double(t);
    double tflops = flops / secs / 1e12;
    rows.push_back({{"phase", "prefill"},     {"batch", 1},          {"context", t},
                    {"tokens", t},            {"time_s", secs},      {"tok_s", t / secs},
                    {"flops", flops},         {"tflops", tflops},    {"pct_gemm", 100.0 * tflops / c.gemm_tflops},
                    {"repeats", o.prefill_repeats}});
    std::fprintf(stderr, "bench: prefill %d: %.2f ms, %.0f tok/s, %.2f TFLOP/s (%.1f%% of GEMM)\n", t, secs * 1e3, t / secs,
                 tflops, 100.0 * tflops / c.gemm_tflops);
    int32_t tok = rand_id();
    auto step = [&](int pos) { run({{&tok, 1, pos, &table, SeqChunk::Logits::last}}); };
    for (int i = 0; i < kWarmSteps; ++i) step(t + i);
    decode_row(1, t, time_steps(step, t + kWarmSteps), "decode-after-prefill");
    profile_step(rows.back(), [&] { step(t + kWarmSteps + steps - 1); });  // rewrites the last timed position
  }

  // 4. Decode grid: B sequences with C cached tokens each, one new token per sequence per step.
  for (int ctx : o.contexts) {
    for (int b : o.batches) {
      int64_t span = ctx + kWarmSteps + steps, nb = blocks_for(span);
      if (span > max_pos) {
        skipped("decode", b, ctx, fmt::format("{} tokens exceed max_position_embeddings {}", span, max_pos));
        continue;
      }
      if (b * nb > pool) {
        skipped("decode", b, ctx,
                fmt::format("needs {} of KV, the pool holds {}", fmt_gb(double(b * nb * bs) * kv_tok), fmt_gb(pool_bytes)));
        continue;
      }
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b));
      for (int s = 0; s < b; ++s)
        for (int64_t k = 0; k < nb; ++k) tables[size_t(s)].push_back(int32_t(s * nb + k));
      std::vector<int32_t> toks(static_cast<size_t>(b));
      for (auto& x : toks) x = rand_id();
      std::vector<SeqChunk> chunks(static_cast<size_t>(b));
      for (int s = 0; s < b; ++s) chunks[size_t(s)] = {&toks[size_t(s)], 1, 0, &tables[size_t(s)], SeqChunk::Logits::last};
      auto step = [&](int pos) {
        for (auto& ch : chunks) ch.start_pos = pos;
        run(chunks);
      };
      for (int i = 0; i < kWarmSteps; ++i) step(ctx + i);
      decode_row(b, ctx, time_steps(step, ctx + kWarmSteps), "decode");
      profile_step(rows.back(), [&] { step(ctx + kWarmSteps + steps - 1); });
      // Mixed steps: these decodes (at their last timed position, rewritten) plus one prefill
      // chunk of a fresh sequence whose blocks follow theirs, as the scheduler orders a mixed
      // step (decodes first, then the chunk). Medians of `repeats` runs of each, in this order.
      const int last_pos = ctx + kWarmSteps + steps - 1;
      for (int m : o.mixed_chunks) {
        const int64_t mb = blocks_for(m);
        if (b * nb + mb > pool) {
          skipped("mixed", b, ctx, fmt::format("{} decodes + a {}-token chunk need {} blocks, the pool holds {}", b, m,
                                               b * nb + mb, pool));
          continue;
        }
        std::vector<int32_t> mtable(static_cast<size_t>(mb));
        for (int64_t k = 0; k < mb; ++k) mtable[size_t(k)] = int32_t(b * nb + k);
        std::vector<int32_t> mids(static_cast<size_t>(m));
        for (auto& x : mids) x = rand_id();
        const SeqChunk pchunk{mids.data(), m, 0, &mtable, SeqChunk::Logits::last};
        std::vector<SeqChunk> alone = {pchunk}, mixed = chunks;
        for (auto& ch : mixed) ch.start_pos = last_pos;
        mixed.push_back(pchunk);
        std::vector<SeqChunk> dec = mixed;
        dec.pop_back();
        auto median_of = [&](const std::vector<SeqChunk>& ch) {
          run(ch);  // warm-up: workspace growth, GEMM algorithm choice at this M
          std::vector<double> t;
          for (int r = 0; r < std::max(o.prefill_repeats, 3); ++r) t.push_back(time_region_s(dev, [&] { run(ch); }));
          std::sort(t.begin(), t.end());
          return t[t.size() / 2];
        };
        const double t_dec = median_of(dec), t_pre = median_of(alone), t_mix = median_of(mixed);
        const double ratio = t_mix / (t_dec + t_pre);
        rows.push_back({{"phase", "mixed"},          {"batch", b},           {"context", ctx},
                        {"chunk", m},                {"mixed_ms", t_mix * 1e3}, {"decode_ms", t_dec * 1e3},
                        {"chunk_ms", t_pre * 1e3},   {"ratio", ratio},
                        {"step_tok_s", double(b + m) / t_mix},
                        {"ride_along_pct", 100.0 * (t_dec + t_pre - t_mix) / std::max(t_dec, 1e-12)}});
        std::fprintf(stderr,
                     "bench: mixed batch %d context %d + chunk %d: %.3f ms vs decode %.3f + chunk %.3f ms (ratio %.3f; "
                     "%.0f%% of the decode step hidden)\n",
                     b, ctx, m, t_mix * 1e3, t_dec * 1e3, t_pre * 1e3, ratio, 100.0 * (t_dec + t_pre - t_mix) / t_dec);
        profile_step(rows.back(), [&] { run(mixed); });
      }
    }
  }

  // 5. Report.
  BenchResult res;
  json& j = res.json;
  j["model"] = {{"dir", o.model_dir},
                {"architecture", cfg.architecture},
                {"layers", cfg.num_layers},
                {"hidden_size", cfg.hidden_size},
                {"num_heads", cfg.num_heads},
                {"num_kv_heads", cfg.num_kv_heads},
                {"head_dim", cfg.head_dim},
                {"vocab_size", cfg.vocab_size},
                {"dtype", dtype_name(model->dtype())},
                {"weight_bytes", model->weight_bytes()},
                {"params_layers", p.layers},
                {"params_layers_active", p.active_layers()},
                {"params_head", p.head},
                {"params_embed", p.embed},
                {"tied_embeddings", shared_head},
                {"kv_bytes_per_token", kv_tok},
                {"kv_cache_dtype", dtype_name(kv_dtype)},
                {"quantization", stored_fmt},
                {"stored_over_loaded_bytes", stored_ratio}};
  j["device"] = {{"kind", device_name(dev)}, {"description", c.device_desc}};
  j["kv_pool"] = {{"blocks", pool}, {"block_size", bs}, {"tokens", pool * bs}, {"bytes", pool_bytes}};
  j["ceilings"] = {{"copy_gb_s", c.copy_gbs},
                   {"copy_bytes", c.copy_bytes},
                   {"copy_iters", c.copy_iters},
                   {"gemm_tflops", c.gemm_tflops},
                   {"gemm_mnk", {c.gemm_m, c.gemm_n, c.gemm_k}},
                   {"gemm_dtype", dtype_name(c.gemm_dtype)},
                   {"gemm_iters", c.gemm_iters}};
  j["decode_steps"] = steps;
  j["timed"] = o.forward_only   ? "batch build + Model::forward"
               : o.host_logits ? "ModelRunner::run, logits to the host, host greedy sampling"
                               : "ModelRunner::run, logits on the device, device greedy sampling";
  j["graphs"] = o.graphs && dev == Device::cuda;
  j["deterministic"] = o.deterministic;
  j["results"] = rows;
  const char* f_prefill = "prefill FLOPs = 2*P_layers*T + 2*P_head + 2*L*heads*head_dim*T^2 (linear layers over T tokens, "
                          "the LM head on the last row, causal attention QK^T + PV)";
  const char* f_decode = "decode bytes/step = (P_layers + P_head)*dtype_bytes + B*ctx*kv_bytes_per_token (ctx: mean cache "
                         "length over the timed steps; the embedding rows are not counted; a quantized checkpoint on CUDA: the weight "
                         "bytes as stored)";
  j["formulas"] = {{"prefill_flops", f_prefill}, {"decode_bytes", f_decode}};

  std::string& md = res.markdown;
  bool gpu = dev == Device::cuda;
  md += fmt::format("# tokenspeed bench: {}\n\n", o.model_dir);
  md += fmt::format("model: {}, {} layers, hidden {}, {}/{} heads x {}, vocab {}{}\n\n", cfg.architecture, cfg.num_layers,
                    cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size,
                    shared_head ? ", tied embeddings" : "");
  md += fmt::format("weights: {:.3f} B params, {} in {} (a decode step reads {}: all but the embedding table); "
                    "KV {:.1f} KiB/token; KV pool {} tokens ({})\n\n",
                    double(model->weight_bytes()) / dsize / 1e9, fmt_gb(double(model->weight_bytes())),
                    dtype_name(model->dtype()), fmt_gb(weight_read(1)), kv_tok / 1024.0, pool * bs, fmt_gb(pool_bytes));
  if (qc.quantized())
    md += fmt::format("quantized checkpoint ({}): a batch-1 decode step reads {} with the weights as stored vs {} in "
                      "{} (CUDA: FP8 / NVFP4 linears and routed experts kept as stored; CPU: all dequantized); the decode "
                      "rows' GB/s count the bytes {} (the params figure above is loaded bytes / dtype size, not a "
                      "parameter count, for such checkpoints)\n\n",
                      stored_fmt, fmt_gb(weight_read(1) * stored_ratio), fmt_gb(weight_read(1)), dtype_name(model->dtype()),
                      gpu ? "as stored" : fmt::format("in {} (the CPU reads dequantized weights)", dtype_name(model->dtype())));
  md += fmt::format("device: {} ({})\n\n", device_name(dev), c.device_desc);
  if (o.deterministic)
    md += dev == Device::cuda ? "steps: deterministic inference (batch-invariant kernels, serve's "
                                "--enable-deterministic-inference)\n\n"
                              : "steps: deterministic inference (the CPU backend is batch-invariant always: no change)\n\n";
  md += "| ceiling | measured | how |\n|---|---|---|\n";
  md += fmt::format("| memory bandwidth | {:.1f} GB/s | {} of {:.0f} MiB, (read + write) bytes / time, median of {}{} |\n",
                    c.copy_gbs, gpu ? "device-to-device cudaMemcpyAsync" : "multi-threaded memcpy",
                    double(c.copy_bytes) / (1 << 20), c.copy_iters, gpu ? " (CUDA events)" : "");
  md += fmt::format("| GEMM | {:.2f} TFLOP/s | {} ops::linear {}x{}x{}{}, 2*M*N*K / time, median of {} |\n\n", c.gemm_tflops,
                    dtype_name(c.gemm_dtype), c.gemm_m, c.gemm_n, c.gemm_k, gpu ? " (cuBLASLt)" : " (our CPU GEMM)",
                    c.gemm_iters);
  md += "| phase | batch | context | tokens | time | tok/s | achieved | % of ceiling |\n|---|---|---|---|---|---|---|---|\n";
  for (auto& r : rows) {
    std::string phase = r["phase"];
    if (r.contains("skipped")) {
      md += fmt::format("| {} | {} | {} | - | skipped: {} | - | - | - |\n", phase, r["batch"].get<int>(), r["context"].get<int>(),
                        r["skipped"].get<std::string>());
    } else if (phase == "mixed") {
      md += fmt::format("| mixed | {} | {} | {} + {} | {} (decode {} + chunk {}) | {} | ratio {:.3f} | {:.0f}% of the decode hidden |\n",
                        r["batch"].get<int>(), r["context"].get<int>(), r["batch"].get<int>(), r["chunk"].get<int>(),
                        fmt_time(r["mixed_ms"].get<double>() / 1e3), fmt_time(r["decode_ms"].get<double>() / 1e3),
                        fmt_time(r["chunk_ms"].get<double>() / 1e3), fmt_count(r["step_tok_s"].get<double>()),
                        r["ratio"].get<double>(), r["ride_along_pct"].get<double>());
    } else if (phase == "prefill") {
      md += fmt::format("| prefill | 1 | {} | {} | {} | {} | {:.2f} TFLOP/s | {:.1f}% of GEMM |\n", r["context"].get<int>(),
                        r["tokens"].get<int>(), fmt_time(r["time_s"].get<double>()), fmt_count(r["tok_s"].get<double>()), r["tflops"].get<double>(),
                        r["pct_gemm"].get<double>());
    } else {
      md += fmt::format("| {} | {} | {} | {} x {} | {}/step | {} | {:.1f} GB/s | {:.1f}% of copy |\n", phase, r["batch"].get<int>(),
                        r["context"].get<int>(), r["batch"].get<int>(), r["steps"].get<int>(),
                        fmt_time(r["step_ms"].get<double>() / 1e3), fmt_count(r["tok_s"].get<double>()), r["gb_s"].get<double>(),
                        r["pct_copy"].get<double>());
    }
  }
  md += "\n";
  md += fmt::format("- {}; here P_layers = {:.4g}{}, P_head = {:.4g}, L = {}, heads = {}, head_dim = {}.\n", f_prefill,
                    p.active_layers(), p.experts > 0 ? " (active: top-k experts)" : "", p.head, cfg.num_layers,
                    cfg.num_heads, cfg.head_dim);
  md += fmt::format("- {}; here {} bytes/param, {:.0f} bytes of KV per token ({} cache).\n", f_decode, dsize, kv_tok,
                    dtype_name(kv_dtype));
  md += "- decode-after-prefill: batch-1 decode continuing the prefilled sequence. decode: B sequences whose caches hold "
        "`context` tokens, one token each per step; their caches are not prefilled (the blocks keep whatever the pool "
        "holds), which times the same as a real cache.\n";
  if (!o.mixed_chunks.empty())
    md += "- mixed: one step of the row's B decodes plus a P-token prefill chunk of a fresh sequence (decodes first, as "
          "the scheduler orders it), median of the repeats, next to the same decodes alone and the chunk alone; ratio = "
          "mixed / (decode + chunk), tok/s = (B + P) / mixed; '% of the decode hidden' = (decode + chunk - mixed) / "
          "decode: the share of the decode step the chunk rode along with.\n";
  md += fmt::format("- times: wall time of {}, device-synchronised, after warm-up; prefill: median of {}; decode: median of {} "
                    "steps, each timed alone, after {} warm-up steps.\n",
                    o.forward_only ? "the batch build and Model::forward (--forward-only: logits stay on the device)"
                    : o.host_logits ? "ModelRunner::run (batch build, metadata upload, forward, logits to the host) + "
                                      "greedy sampling on the host (--host-logits)"
                                    : "ModelRunner::run (batch build, metadata upload, forward) + greedy sampling where "
                                      "the logits are (on the GPU: the device), as the engine's eager steps",
                    o.prefill_repeats, steps, kWarmSteps);
  if (o.graphs && dev == Device::cuda)
    md += fmt::format("- --graphs: steps replay the engine's CUDA graphs (decode batch buckets; breakable prefill graphs "
                      "padded to their token bucket up to {} tokens), as serve runs them.\n",
                      o.graph_prefill_tokens);
  return res;
}

}  // namespace ts::bench
