#include "cli/engine_flags.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <memory>

#include "cli/common.h"
#include "core/error.h"
#include "parallel/mapping.h"

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
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "auto | bf16 | fp8 | fp8_e4m3: KV cache element type (fp8: e4m3, half the bytes of bf16, twice the "
                 "tokens; per-layer k/v scales from the checkpoint (k_scale, v_scale) or 1.0; CPU and CUDA, paged K/V "
                 "models and the EAGLE3 draft)");
  app.add_flag("--disable-kvstore", o.disable_kvstore,
               "no host-memory KV tier (by default blocks evicted from the device prefix cache are kept in host memory "
               "and loaded back on a prefix hit)");
  app.add_option("--kvstore-ratio", o.kvstore_ratio, "host KV tier size as a multiple of the device KV pool")
      ->capture_default_str();
  app.add_option("--kvstore-size", o.kvstore_size_gb, "host KV tier size in GiB (overrides --kvstore-ratio)");
  app.add_option("--kvstore-write-policy", o.kvstore_write_policy,
                 "write_through: copy each prefix block to the host tier in the background once it is computed, so "
                 "evicting it costs no copy; write_back: copy a block when the device evicts it (the step waits)")
      ->check(CLI::IsMember({"write_through", "write_back"}))
      ->capture_default_str();
  app.add_flag("--enable-cache-report")->description("accepted for compatibility: cached tokens are always reported");
  app.add_flag("--disable-overlap-schedule", o.disable_overlap_schedule,
               "plan, run and apply each step in turn (default: plan and launch step N+1 while step N runs)");
  app.add_flag("--disable-jump-forward", o.disable_jump_forward,
               "sample every token of grammar-constrained requests (default: bytes the grammar forces, e.g. "
               "{\"name\":\", are appended as tokens without sampling and computed as one chunk)");
  app.add_flag("--enable-mixed-batch", o.enable_mixed_batch,
               "while requests decode, cap each step's prefill tokens at --mixed-prefill-tokens (decodes never wait "
               "behind a long prefill chunk)");
  app.add_option("--mixed-prefill-tokens", o.mixed_prefill_tokens,
                 "prefill tokens per step while requests decode, with --enable-mixed-batch; 0 (default): automatic, "
                 "from the measured step costs (see --mixed-step-factor) and the prefill backlog");
  app.add_option("--mixed-step-factor", o.mixed_step_factor,
                 "automatic mixed budget: a step with decodes may take this many times a decode-only step (default 2.5)");
  app.add_option("--mixed-min-chunk", o.mixed_min_chunk,
                 "automatic mixed budget: while at least this many prompt tokens wait, a step with decodes takes at "
                 "least this many (GEMMs of a few hundred rows cost about what ~512 do; default 0: off)");
  app.add_option("--mixed-align-tokens", o.mixed_align_tokens,
                 "automatic mixed budget: a step's rows (decodes + prefill) are cut to a multiple of this once they "
                 "reach it, as GEMM time steps with row tiles (e.g. 256; default 0: off)");
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
  app.add_flag("--gemm-autotune", o.gemm_autotune,
               "CUDA: on a new bf16 GEMM shape of <= 256 rows (decode batches, graph buckets) time cuBLASLt's first 8 "
               "heuristic algorithms and keep the fastest, instead of its first pick (off by default: not yet measured "
               "to pay on the GPU)");
  app.add_flag("--enable-deterministic-inference", o.enable_deterministic_inference,
               "batch-invariant kernels: a request's output is bit-identical alone or under any load, chunking or graph "
               "bucket (CUDA: one GEMM algorithm per shape, no GEMV/fused decode kernels, fixed-split attention; slower. "
               "The CPU backend is batch-invariant always)");
  // The parallel flags fill a ParallelOptions owned by the parse callback until EngineOptions
  // embeds one (then: add_parallel_flags(app, o.parallel)).
  auto p = std::make_shared<parallel::ParallelOptions>();
  p->tp_size = o.tp_size;
  p->ep_size = o.ep_size;
  p->replicate_embedding = o.replicate_embedding;
  p->comm_fusion_max_num_tokens = o.comm_fusion_max_num_tokens;
  add_parallel_flags(app, *p);
  app.parse_complete_callback([p, &o] { apply_parallel_options(*p, o); });
}

void add_parallel_flags(CLI::App& app, parallel::ParallelOptions& p) {
  app.add_option("--tp-size,--tensor-parallel-size", p.tp_size,
                 "attention tensor-parallel size: ranks each attention layer is split over (heads; KV heads replicated "
                 "when fewer than ranks)");
  app.add_option("--attn-tp-size", p.attn_tp_size, "same as --tp-size (the reference system's name)");
  app.add_option("--data-parallel-size,--dp-size", p.dp_size,
                 "attention data parallelism: groups of --tp-size ranks with their own requests and KV cache, MoE "
                 "layers over all of them (MLA models; CPU ranks so far); world size = tp x dp");
  app.add_option("--dense-tp-size", p.dense_tp_size,
                 "TP size of dense MLP layers (default: the attention TP size; smaller: inside each attention group, "
                 "larger: over several DP groups, tokens gathered)");
  app.add_option("--moe-tp-size", p.moe_tp_size,
                 "TP size of MoE experts (intermediate dim split; default: the world size, or 1 with --ep-size)");
  app.add_option("--ep-size,--expert-parallel-size", p.ep_size,
                 "expert parallelism: MoE experts split whole over this many ranks (MoE TP and EP are not both > 1)");
  app.add_flag("--enable-expert-parallel", p.enable_expert_parallel, "expert parallelism over the whole world");
  app.add_option("--nnodes", p.nnodes, "nodes (processes) of the world; one per --node-rank");
  app.add_option("--node-rank", p.node_rank, "this node's rank, 0..nnodes-1 (node 0 hosts the rendezvous and serves; others run worker ranks)");
  app.add_option("--dist-init-addr", p.dist_init_addr, "host:port of node 0's rendezvous (multi-node; the step channel uses port + 1)");
  app.add_option("--dist-timeout", p.dist_timeout_s, "seconds to wait for the other nodes and for collectives");
  app.add_flag("--replicate-embedding", p.replicate_embedding,
               "keep the whole embedding table on every GPU (no vocab mask, no all-reduce, more memory)");
  app.add_option("--comm-fusion-max-num-tokens", p.comm_fusion_max_num_tokens,
                 "up to this many tokens, all-reduce + residual add + RMSNorm run as one fused kernel (0: off)");
}

void apply_parallel_options(const parallel::ParallelOptions& p, EngineOptions& o) {
  // The sizes' arithmetic, for every flag; what the engine cannot run on the chosen device or
  // model is checked when it starts (runtime/engine.cpp).
  const parallel::Mapping m = parallel::Mapping::resolve(p, 0);
  o.tp_size = m.attn_tp;
  o.ep_size = m.moe_ep;
  o.replicate_embedding = p.replicate_embedding;
  o.comm_fusion_max_num_tokens = p.comm_fusion_max_num_tokens;
  o.parallel = p;
}

bool run_if_worker_node(const EngineOptions& o) {
  if (o.parallel.nnodes <= 1 || o.parallel.node_rank == 0) return false;
  Engine engine(o);
  spdlog::info("node {} of {}: worker ranks ready, running node 0's steps", o.parallel.node_rank, o.parallel.nnodes);
  engine.run_worker();
  return true;
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
