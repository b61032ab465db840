// bench-decode: prefill throughput and batch-1 decode speed of one model, with the achieved
// memory bandwidth (weights + KV bytes read per decoded token / time).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "models/model.h"
#include "runtime/model_runner.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/runtime.h"
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

int cmd_bench_decode(int argc, char** argv) {
  CLI::App app{"Benchmark prefill and batch-1 decode of a model (tok/s and GB/s)"};
  std::string model_dir = cli::default_model_dir(), device = "auto";
  int prompt_tokens = 512, gen_tokens = 128, repeats = 3;
  app.add_option("--model,--model-path", model_dir, "model directory (default: the bundled demo model)");
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length");
  app.add_option("--gen-tokens", gen_tokens, "tokens decoded after the prompt");
  app.add_option("--repeats", repeats, "runs; the best is reported");
  app.add_option("--device", device, "auto | cpu | cuda");
  CLI11_PARSE(app, argc, argv);
  TS_CHECK(prompt_tokens >= 1 && gen_tokens >= 1, "--prompt-tokens and --gen-tokens must be >= 1");
  models::LoadOptions lo;
  lo.device = cli::parse_device(device);
  std::shared_ptr<models::Model> model = models::load_model(model_dir, lo);
  const int bs = 64;
  int64_t total = prompt_tokens + gen_tokens;
  TS_CHECK(total <= model->config().max_position_embeddings, "prompt + gen tokens {} exceed the model context {}", total,
           model->config().max_position_embeddings);
  int64_t blocks = (total + bs - 1) / bs + 1;
  ModelRunner runner(model, blocks, bs);
  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(int32_t(b));
  std::mt19937 rng(1);
  std::vector<int32_t> ids(static_cast<size_t>(prompt_tokens));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(model->config().vocab_size));
  double best_prefill = 1e30, best_decode = 1e30;
  for (int rep = 0; rep < repeats; ++rep) {
    auto t0 = Clock::now();
    runner.run({{ids.data(), prompt_tokens, 0, &table, SeqChunk::Logits::last}});
    sync(model->device());
    auto t1 = Clock::now();
    int32_t tok = 1;
    for (int i = 0; i < gen_tokens; ++i) {
      const Tensor& l = runner.run({{&tok, 1, prompt_tokens + i, &table, SeqChunk::Logits::last}});
      const float* p = l.ptr<float>();
      int64_t v = l.size(1), b = 0;
      for (int64_t j = 1; j < v; ++j)
        if (p[j] > p[b]) b = j;
      tok = int32_t(b);
    }
    sync(model->device());
    auto t2 = Clock::now();
    best_prefill = std::min(best_prefill, std::chrono::duration<double>(t1 - t0).count());
    best_decode = std::min(best_decode, std::chrono::duration<double>(t2 - t1).count());
  }
  double wbytes = double(model->weight_bytes());
  // Tied embeddings: the table is read once per token as the LM head, not counted twice;
  // the embedding lookup itself reads one row.
  double kv_per_tok = double(ModelRunner::kv_bytes_per_token(*model)) * (prompt_tokens + gen_tokens / 2.0);
  double per_token_bytes = wbytes + kv_per_tok;
  double dec_s = best_decode / gen_tokens;
  std::printf("model %s on %s: %.1f M params (%.1f MB of weights in %s)\n", model_dir.c_str(), device_name(model->device()),
              wbytes / double(dtype_size(model->dtype())) / 1e6, wbytes / 1e6, dtype_name(model->dtype()));
  std::printf("prefill %d tokens: %.1f ms, %.0f tok/s\n", prompt_tokens, best_prefill * 1e3, prompt_tokens / best_prefill);
  std::printf("decode batch 1, %d tokens: %.3f ms/token, %.1f tok/s, %.2f GB/s (weights %.1f MB + KV %.2f MB per token)\n",
              gen_tokens, dec_s * 1e3, 1.0 / dec_s, per_token_bytes / dec_s / 1e9, wbytes / 1e6, kv_per_tok / 1e6);
  return 0;
}

}  // namespace

TS_COMMAND("bench-decode", "benchmark prefill and batch-1 decode (tok/s, GB/s)", cmd_bench_decode);
