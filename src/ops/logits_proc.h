// Device logits processing (penalties, logit_bias, min_tokens) from per-request token counts:
// the shared host/device layout. The kernels are in ops/cuda/logits_proc.h, the request
// bookkeeping in runtime/device_logits.h; the CPU sampler (runtime/sampler.cpp) is the oracle.
#pragma once
#include <cstdint>

namespace ts::ops {

// Per-slot lists, fixed capacity so a slot's data is one row of a static device buffer. OpenAI
// caps logit_bias at 300 entries; a request with more (or more stop ids) uses host logits.
constexpr int kLogitsMaxBias = 320;
constexpr int kLogitsMaxStops = 32;
// One slot's info row, i32 [kLogitsSlotInfo]: n_bias, n_stop, bias ids [kLogitsMaxBias], bias
// values (f32 bits) [kLogitsMaxBias], min_tokens stop ids [kLogitsMaxStops].
constexpr int kLogitsSlotInfo = 2 + 2 * kLogitsMaxBias + kLogitsMaxStops;

// One batch row's parameters (32 bytes; an array [rows] on the device, refreshed by one copy per
// step, so a decode graph replays with new parameters without recapture). slot < 0: the row is
// left untouched (requests without logits processing, graph padding rows).
struct LogitsProcRow {
  int32_t slot = -1;
  int32_t ban_stop = 0;  // 1: the slot's stop ids -> -inf (min_tokens not reached yet)
  float repetition = 1.0f;  // HF: seen (prompt or output) logits: > 0 divided, else multiplied
  float presence = 0.0f;    // OpenAI: output tokens only, once per distinct token
  float frequency = 0.0f;   // OpenAI: output tokens only, times the count
  int32_t pad[3] = {0, 0, 0};
};
static_assert(sizeof(LogitsProcRow) == 32);

}  // namespace ts::ops
