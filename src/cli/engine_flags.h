// Engine flags shared by every command that builds an Engine (serve, generate, benches), with
// the SGLang/TokenSpeed names, bound straight onto EngineOptions.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "runtime/engine.h"

namespace ts::cli {

// The bundled demo model: ${TS_SOURCE_DIR}/models/pycoder.
std::string default_model_dir();

// MODEL (optional positional) and --model-path, both into `model`; empty means the demo model.
void add_model_arg(CLI::App& app, std::string& model);

// --device, --block-size, --max-total-tokens, --mem-fraction-static, --chunked-prefill-size,
// --max-num-seqs, --disable-prefix-cache, --enable-cache-report (accepted), --context-length,
// --speculative-algorithm, --speculative-draft-model-path, --speculative-num-steps,
// --speculative-eagle-topk, --speculative-num-draft-tokens, --drafter-attention-backend (accepted),
// --eagle3-layers-to-capture, --disable-cuda-graph, --disable-prefill-graph, --enforce-eager,
// --cuda-graph-max-bs, --prefill-graph-max-tokens, --disable-pdl.
void add_engine_flags(CLI::App& app, EngineOptions& o);

// Fills o.model_dir from `model` (default: the demo model); throws ts::Error if it is not a directory.
void resolve_model(const std::string& model, EngineOptions& o);

}  // namespace ts::cli
