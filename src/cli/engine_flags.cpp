#include "cli/engine_flags.h"

#include <filesystem>

#include "cli/common.h"
#include "core/error.h"

namespace ts::cli {

void add_engine_flags(CLI::App& app, EngineOptions& o) {
  app.add_option("--device", o.device, "auto | cpu | cuda (auto: cuda when a GPU is present)");
  app.add_option("--block-size", o.block_size, "tokens per KV-cache block");
  app.add_option("--max-total-tokens", o.max_total_tokens, "KV pool size in tokens (default: from memory)");
  app.add_option("--mem-fraction-static", o.mem_fraction_static,
                 "share of memory for weights + KV pool (GPU default 0.85; CPU: share of 24 GiB, default 0.05)");
  app.add_option("--chunked-prefill-size", o.chunked_prefill_size, "token budget per engine step (prefill chunk size)");
  app.add_option("--max-num-seqs,--max-running-requests", o.max_num_seqs, "max requests running at once");
  app.add_flag("--disable-prefix-cache,--disable-radix-cache", o.disable_prefix_cache, "do not reuse cached prefix blocks");
  app.add_flag("--enable-cache-report")->description("accepted for compatibility: cached tokens are always reported");
  app.add_option("--context-length", o.context_length, "max tokens per request (default: model's max_position_embeddings)");
  app.add_option("--speculative-algorithm", o.speculative_algorithm, "EAGLE3 to enable speculative decoding");
  app.add_option("--speculative-draft-model-path", o.speculative_draft_model_path, "EAGLE3 draft checkpoint directory");
  app.add_option("--speculative-num-steps", o.speculative_num_steps, "draft steps per verify");
  app.add_option("--speculative-eagle-topk", o.speculative_eagle_topk, "draft tree width (only 1: chain drafting)");
  app.add_option("--speculative-num-draft-tokens", o.speculative_num_draft_tokens, "tokens per verify (default steps + 1)");
  app.add_option("--drafter-attention-backend", o.drafter_attention_backend, "draft attention backend: paged (cpu) | paged (cuda)");
  app.add_option("--eagle3-layers-to-capture", o.eagle3_layers_to_capture,
                 "target layer ids whose output feeds the draft (default: the draft config's)")
      ->delimiter(',');
  app.add_flag("--disable-cuda-graph", o.disable_cuda_graph, "run decode eagerly");
  app.add_flag("--disable-prefill-graph", o.disable_prefill_graph, "run prefill eagerly");
  app.add_flag("--enforce-eager", o.enforce_eager, "no CUDA graphs at all");
  app.add_option("--cuda-graph-max-bs", o.cuda_graph_max_bs, "largest decode batch captured in a graph");
  app.add_option("--prefill-graph-max-tokens", o.prefill_graph_max_tokens, "largest prefill captured in a graph");
  app.add_flag("--disable-pdl", o.disable_pdl, "no programmatic dependent launch");
  app.add_option("--tp-size,--tensor-parallel-size", o.tp_size, "GPUs the model is split over (tensor parallelism, one process)");
  app.add_option("--ep-size,--expert-parallel-size", o.ep_size, "MoE expert-parallel size (dense models: 1)");
  app.add_flag("--replicate-embedding", o.replicate_embedding,
               "keep the whole embedding table on every GPU (no vocab mask, no all-reduce, more memory)");
  app.add_option("--comm-fusion-max-num-tokens", o.comm_fusion_max_num_tokens,
                 "up to this many tokens, all-reduce + residual add + RMSNorm run as one fused kernel (0: off)");
}

void add_model_arg(CLI::App& app, std::string& model) {
  app.add_option("model", model, "model directory (Hugging Face layout; default: the bundled demo models/pycoder)");
  app.add_option("--model-path", model, "same as MODEL");
}

void resolve_model(const std::string& model, EngineOptions& o) {
  o.model_dir = model.empty() ? default_model_dir() : model;
  if (!std::filesystem::is_directory(o.model_dir)) fail("model directory '{}' does not exist", o.model_dir);
}

}  // namespace ts::cli
