// CUDA logits processing from per-slot token counts (layout: ops/logits_proc.h). All launches on
// the current stream, fixed shapes, no host synchronisation: graph-capturable.
#pragma once
#include "core/tensor.h"
#include "ops/logits_proc.h"

namespace ts::ops::cuda {

// Device state of S slots over a vocabulary of V ids.
// Why dense counts: one i32 per (slot, id) is a plain indexed read in the apply kernel (no
// search, no hashing), an atomic-free increment per sampled id, and a fixed address set that a
// graph can capture. It costs S*V*4 bytes, so only requests that ask for processing hold a slot
// (runtime/device_logits.h: 64 slots, 32 MiB at V = 128k) instead of every running sequence
// (256 x 128k x 4 = 128 MiB). i32, not u16: a frequency penalty needs exact counts, and a long
// output can repeat one id more than 65535 times. Prompt tokens (repetition only) are a bitmask.
struct LogitsProcState {
  int64_t slots = 0, vocab = 0, rows_cap = 0;
  Tensor counts;  // i32 [S, V]: output-token counts
  Tensor prompt;  // i32 (u32 bits) [S, ceil(V/32)]: prompt tokens
  Tensor info;    // i32 [S, kLogitsSlotInfo]
  Tensor rows;    // i32 [rows_cap, 8]: LogitsProcRow per batch row
  Tensor ids;     // i32 [rows_cap]: sampled ids of an eager step (host upload), for count()
  // Allocates (and clears) the buffers; rows all slot = -1.
  static LogitsProcState create(int64_t slots, int64_t vocab, int64_t rows_cap);
};

// logits f32 [B, V] (contiguous rows, B <= rows_cap): for each row b with rows[b].slot >= 0,
// in the CPU sampler's order: repetition, presence/frequency, logit_bias, then the min_tokens
// stop ids -> -inf when ban_stop. Bit-exact with runtime::apply_penalties +
// LogitsConstraints::apply (IEEE round-to-nearest, no contraction).
void logits_process(Tensor& logits, const LogitsProcState& s);
// counts[rows[b].slot, ids[b]] += 1 for rows with a slot and 0 <= id < V. ids i32 [B].
void logits_count(const Tensor& ids, const LogitsProcState& s);
// Seeds slot `slot` from a request's tokens (i32 [n] on the device: prompt_len prompt ids, then
// its output ids): clears the slot's counts and prompt bits, then sets them.
void logits_seed(const LogitsProcState& s, int slot, const Tensor& tokens, int64_t n, int64_t prompt_len);

}  // namespace ts::ops::cuda
