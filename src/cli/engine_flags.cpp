#include "cli/engine_flags.h"

#include <filesystem>

#include "core/error.h"

namespace ts::cli {

std::string default_model_dir() { return std::string(TS_SOURCE_DIR) + "/models/pycoder"; }

void add_model_arg(CLI::App& app, std::string& model) {
  app.add_option("model", model, "model directory (Hugging Face layout; default: the bundled demo models/pycoder)");
  app.add_option("--model-path", model, "same as MODEL");
}

void add_engine_flags(CLI::App& app, EngineOptions& o) {
  app.add_option("--device", o.device, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--block-size", o.block_size, "KV cache block size in tokens")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-total-tokens", o.max_total_tokens, "KV pool size in tokens (0: from --mem-fraction-static)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--mem-fraction-static", o.mem_fraction_static,
                 "fraction of device memory for weights + KV cache (0: the device's default)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--chunked-prefill-size", o.chunked_prefill_size, "per-step token budget (prefill chunk)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-num-seqs,--max-running-requests", o.max_num_seqs, "max requests in the running batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--disable-prefix-cache,--disable-radix-cache", o.disable_prefix_cache, "turn prefix (KV block) reuse off");
  app.add_flag("--enable-cache-report")->description("accepted for compatibility: cached tokens are always reported");
  app.add_option("--context-length", o.context_length, "max tokens per sequence (0: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--speculative-algorithm", o.speculative_algorithm, "speculative decoding: EAGLE3 (empty: off)");
  app.add_option("--speculative-draft-model-path", o.speculative_draft_model_path, "draft model directory");
  app.add_option("--speculative-num-steps", o.speculative_num_steps, "draft steps per verify")->capture_default_str();
  app.add_option("--speculative-eagle-topk", o.speculative_eagle_topk, "draft branching (1: chain)")->capture_default_str();
  app.add_option("--speculative-num-draft-tokens", o.speculative_num_draft_tokens,
                 "tokens verified per step (0: steps + 1)")
      ->capture_default_str();
  app.add_option("--drafter-attention-backend", "accepted for compatibility (one attention backend here)");
  app.add_option("--eagle3-layers-to-capture", o.eagle3_layers_to_capture,
                 "target layers whose hidden states feed the draft (e.g. 1,15,28)")
      ->delimiter(',');
  app.add_flag("--disable-cuda-graph", o.disable_cuda_graph, "run decode eagerly");
  app.add_flag("--disable-prefill-graph", o.disable_prefill_graph, "run prefill eagerly");
  app.add_flag("--enforce-eager", o.enforce_eager, "no CUDA graphs at all");
  app.add_option("--cuda-graph-max-bs", o.cuda_graph_max_bs, "largest decode batch captured in a graph")
      ->capture_default_str();
  app.add_option("--prefill-graph-max-tokens", o.prefill_graph_max_tokens, "largest prefill captured in a graph")
      ->capture_default_str();
  app.add_flag("--disable-pdl", o.disable_pdl, "no programmatic dependent launch");
}

void resolve_model(const std::string& model, EngineOptions& o) {
  o.model_dir = model.empty() ? default_model_dir() : model;
  if (!std::filesystem::is_directory(o.model_dir)) fail("model directory '{}' does not exist", o.model_dir);
}

}  // namespace ts::cli
