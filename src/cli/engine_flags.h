// Engine flags shared by serve, generate and the benches (SGLang/TokenSpeed names).
#pragma once
#include <CLI/CLI.hpp>

#include "runtime/engine.h"

namespace ts::cli {
void add_engine_flags(CLI::App& app, EngineOptions& o);
}  // namespace ts::cli
