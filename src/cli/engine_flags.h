// Engine flags shared by serve, generate and the benches (SGLang/TokenSpeed names).
#pragma once
#include <CLI/CLI.hpp>

#include "runtime/engine.h"

namespace ts::cli {
void add_engine_flags(CLI::App& app, EngineOptions& o);

// MODEL (optional positional) and --model-path, both into `model`; empty means the demo model.
void add_model_arg(CLI::App& app, std::string& model);
// Fills o.model_dir from `model` (default: the bundled demo); throws ts::Error if not a directory.
void resolve_model(const std::string& model, EngineOptions& o);
}  // namespace ts::cli
