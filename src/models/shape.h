// The parallel-sharding shape of a model from its config alone (no weights): what
// parallel::check_model_fits checks before any communicator or weight is made.
#pragma once
#include "io/config.h"
#include "parallel/mapping.h"

namespace ts::models {

// Heads, KV heads, MLA, dense / expert / shared intermediate sizes, experts, index heads and
// linear-attention heads of the architecture in cfg (registry.cpp).
parallel::ModelShape model_shape(const io::ModelConfig& cfg);

}  // namespace ts::models
