// bench-decode: prefill throughput and batch-1 decode speed of one model, with the achieved
// memory bandwidth (weights + KV bytes read per decoded token / time). With --graphs it
// measures eager and CUDA-graph execution side by side (decode ms/token; prefill latency of
// new tokens after a cached prefix, the common agentic turn) and reports capture time.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/engine_flags.h"
#include "models/model.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/model_runner.h"
#include "runtime/tp_workers.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace {

using namespace ts;
using Clock = std::chrono::steady_clock;

void sync(Device d) {
#ifdef TS_WITH_CUDA
  if (d == Device::cuda) cuda::synchronize();
#else
  (void)d;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Setup {
  std::shared_ptr<models::Model> model;
  std::vector<int32_t> table;
  int bs = 64;
};

// Runs `n` tokens at `pos` through `r` (logits of the last row stay on the device).
double time_chunk(ModelRunner& r, Setup& s, std::vector<int32_t>& ids, int pos, int n, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    sync(s.model->device());
    auto a = Clock::now();
    r.run({{ids.data(), n, pos, &s.table, SeqChunk::Logits::last}}, false, false);
    sync(s.model->device());
    if (i) t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  return median(t);
}

double time_decode(ModelRunner& r, Setup& s, int pos, int steps) {
  int32_t tok = 1;
  std::vector<double> t;
  for (int i = 0; i < steps; ++i) {
    auto a = Clock::now();
    r.run({{&tok, 1, pos + i, &s.table, SeqChunk::Logits::last}}, false, false);
    sync(s.model->device());
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  return median(t);
}

int cmd_bench_decode(int argc, char** argv) {
  CLI::App app{"Benchmark prefill and batch-1 decode of a model (tok/s and GB/s), eager vs CUDA graphs"};
  std::string model_dir = cli::default_model_dir(), device = "auto", new_tokens_s = "64,256,800,2048";
  int prompt_tokens = 512, gen_tokens = 128, cached_prefix = 0;
  bool graphs = false;
  app.add_option("--model,--model-path", model_dir, "model directory (default: the bundled demo model)");
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length");
  app.add_option("--gen-tokens", gen_tokens, "tokens decoded after the prompt");
  app.add_option("--device", device, "auto | cpu | cuda");
  parallel::ParallelOptions po;  // --tp-size, --ep-size, --replicate-embedding, ... (engine_flags.h)
  cli::add_parallel_flags(app, po);
  app.add_flag("--graphs", graphs, "also run with CUDA graphs (decode + breakable prefill) and compare");
  app.add_option("--cached-prefix", cached_prefix, "with --graphs: prefill latency of new tokens after this many cached tokens");
  app.add_option("--new-tokens", new_tokens_s, "with --cached-prefix: new-token counts to time");
  CLI11_PARSE(app, argc, argv);
  TS_CHECK(prompt_tokens >= 1 && gen_tokens >= 1, "--prompt-tokens and --gen-tokens must be >= 1");
  models::LoadOptions lo;
  lo.device = cli::parse_device(device);
  Setup s;
  parallel::Mapping::resolve(po, 0);  // invalid combinations: an error naming the flags
  const int tp_size = po.world_size();
  const bool replicate = po.replicate_embedding;
  lo.replicate_embedding = replicate;
  TpModels tpm;
  if (tp_size > 1) {
    tpm = load_tp_models(io::load_config(model_dir), lo, po);
    s.model = tpm.shards[0];
  } else {
    s.model = models::load_model(model_dir, lo);
  }
  std::vector<int32_t> news = cli::parse_ids(new_tokens_s);
  int max_new = news.empty() ? 0 : *std::max_element(news.begin(), news.end());
  int64_t total = std::max<int64_t>(prompt_tokens + gen_tokens + 1, cached_prefix + max_new + 1);
  TS_CHECK(total <= s.model->config().max_position_embeddings, "{} tokens exceed the model context {}", total,
           s.model->config().max_position_embeddings);
  int64_t blocks = (total + s.bs - 1) / s.bs + 1;
  for (int64_t b = 0; b < blocks; ++b) s.table.push_back(int32_t(b));
  std::mt19937 rng(1);
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(prompt_tokens, cached_prefix + max_new)));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(s.model->config().vocab_size));

  double wbytes = double(s.model->weight_bytes());
  double kv_tok = double(ModelRunner::kv_bytes_per_token(*s.model));
  std::printf("model %s on %s: %.1f M params (%.1f MB of weights in %s)\n", model_dir.c_str(), device_name(s.model->device()),
              wbytes / double(dtype_size(s.model->dtype())) / 1e6, wbytes / 1e6, dtype_name(s.model->dtype()));
  bool with_graphs = graphs && s.model->device() == Device::cuda;
  for (int pass = 0; pass < (with_graphs ? 2 : 1); ++pass) {
    std::unique_ptr<ModelRunner> rp =
        tp_size > 1 ? make_tp_runner(tpm, blocks, s.bs) : std::make_unique<ModelRunner>(s.model, blocks, s.bs);
    ModelRunner& r = *rp;
    const char* mode = pass ? "cuda graphs" : "eager";
    if (pass) {
      GraphOptions g;
      g.max_bs = 8;
      g.max_prefill_tokens = 2048;
      g.max_context = int(blocks * s.bs);
      g.eager_max_tokens = std::max(prompt_tokens, 2048);
      r.enable_graphs(g);
      std::printf("[%s] capture %.2f s for %d decode + %d prefill buckets, shared pool %.1f MiB\n", mode,
                  r.graphs()->capture_seconds(), r.graphs()->decode_graphs(), r.graphs()->prefill_graphs(),
                  double(r.graphs()->pool_bytes()) / (1 << 20));
    }
    double pre = time_chunk(r, s, ids, 0, prompt_tokens, 3);
    double dec = time_decode(r, s, prompt_tokens, gen_tokens);
    double kv_read = kv_tok * (prompt_tokens + gen_tokens / 2.0);
#ifdef TS_WITH_CUDA
    if (tp_size > 1) {  // memory in use on every GPU (weights + KV pool + graphs + workspaces)
      std::vector<double> used(size_t(tp_size), 0);
      tpm.workers->run([&](int rank) { used[size_t(rank)] = double(cuda::total_memory() - cuda::free_memory()) / double(1 << 30); });
      models::EmbedLayout el = s.model->embed_layout();
      for (int rank = 0; rank < tp_size; ++rank)
        std::printf("[%s] tp %d (%s embedding, %.1f MiB per GPU): GPU %d uses %.2f GiB\n", mode, tp_size,
                    el.tp_size > 1 ? "vocab-parallel" : "replicated",
                    double(el.rows * s.model->config().hidden_size * int64_t(dtype_size(s.model->dtype()))) / double(1 << 20),
                    rank, used[size_t(rank)]);
    }
#endif
    std::printf("[%s] prefill %d tokens: %.2f ms, %.0f tok/s\n", mode, prompt_tokens, pre * 1e3, prompt_tokens / pre);
    std::printf("[%s] decode batch 1 at %d context: %.3f ms/token, %.1f tok/s, %.1f GB/s (weights %.1f MB + KV %.2f MB per token)\n",
                mode, prompt_tokens, dec * 1e3, 1.0 / dec, (wbytes + kv_read) / dec / 1e9, wbytes / 1e6, kv_read / 1e6);
    if (cached_prefix > 0) {
      for (int off = 0; off < cached_prefix; off += 8192) {
        int n = std::min(8192, cached_prefix - off);
        r.run({{ids.data() + off, n, off, &s.table, SeqChunk::Logits::none}}, false, false);
      }
      for (int n : news) {
        double t = time_chunk(r, s, ids, cached_prefix, n, 5);
        std::printf("[%s] prefill %d new tokens after %d cached: %.3f ms\n", mode, n, cached_prefix, t * 1e3);
      }
    }
  }
  return 0;
}

}  // namespace

TS_COMMAND("bench-decode", "benchmark prefill and batch-1 decode (tok/s, GB/s), eager vs CUDA graphs", cmd_bench_decode);
