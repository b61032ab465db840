// Engine flags shared by serve, generate and the benches (SGLang/TokenSpeed names).
#pragma once
#include <CLI/CLI.hpp>

#include "parallel/options.h"
#include "runtime/engine.h"

namespace ts::cli {
void add_engine_flags(CLI::App& app, EngineOptions& o);

// The parallel flags (parallel/options.h): --tp-size, --attn-tp-size, --data-parallel-size,
// --dense-tp-size, --moe-tp-size, --ep-size, --enable-expert-parallel, --nnodes, --node-rank,
// --dist-init-addr, --dist-timeout, --replicate-embedding, --comm-fusion-max-num-tokens.
void add_parallel_flags(CLI::App& app, parallel::ParallelOptions& p);
// Checks the parsed parallel flags (Mapping::resolve) and carries what today's engine runs into
// EngineOptions (tp / ep sizes, embedding replication, fusion); the mappings it cannot run yet
// (attention DP, separate dense / MoE TP sizes, several nodes) are errors that say so.
void apply_parallel_options(const parallel::ParallelOptions& p, EngineOptions& o);

// Multi-node: on a node other than node 0 (--nnodes > 1, --node-rank > 0) loads this node's
// ranks and runs node 0's steps until node 0 quits (no HTTP, no output), then returns true;
// false on node 0 and on one node (the caller goes on to serve / generate).
bool run_if_worker_node(const EngineOptions& o);

// MODEL (optional positional) and --model-path, both into `model`; empty means the demo model.
void add_model_arg(CLI::App& app, std::string& model);
// Fills o.model_dir from `model` (default: the bundled demo); throws ts::Error if not a directory.
void resolve_model(const std::string& model, EngineOptions& o);
}  // namespace ts::cli
