// DeviceLogits: penalties (presence, frequency, repetition), logit_bias and min_tokens applied to
// device logits from per-request token counts, so such requests keep device sampling and the
// decode CUDA graphs (issue #17 item 6). The CPU sampler (runtime/sampler.cpp: apply_penalties,
// LogitsConstraints::apply) is the oracle; tests/cuda/logits_proc_test.cpp compares the two.
//
// Bookkeeping (engine thread): a request that asks for processing takes one of `slots` rows
// (Request::logits_slot, a SlotPool handle dropped when it ends or is retracted) the first time
// it samples; bind() then seeds that row from r.tokens (prompt ids -> bits for repetition, output
// ids -> counts), which also reseeds a retracted request or a reused row, so counts never leak
// between requests. Each step uploads one LogitsProcRow per batch row (slot, min_tokens ban,
// penalty values; one copy), apply() runs before sampling and count() adds the sampled ids to the
// counts (inside the graph: no host round trip). Requests with logprobs or a grammar keep their
// paths (host logits / device masks); when every slot is held, a request uses host logits.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/logits_proc.h"
#include "runtime/request.h"
#include "runtime/slot_pool.h"

namespace ts {

namespace ops::cuda {
struct LogitsProcState;
}

class DeviceLogits {
 public:
  // 64 slots: 64 x V x 4 B of counts (32 MiB at V = 128k); more concurrent requests with
  // penalties than that sample on the host, as before.
  static constexpr int kDefaultSlots = 64;
  // device cuda: allocates the device state (ops/cuda/logits_proc.h); cpu: bookkeeping only
  // (unit tests; seeds are recorded, nothing runs). rows_cap: the most batch rows of one step.
  DeviceLogits(int slots, int64_t vocab, int64_t rows_cap, Device device);
  ~DeviceLogits();
  DeviceLogits(const DeviceLogits&) = delete;
  DeviceLogits& operator=(const DeviceLogits&) = delete;

  // r asks for penalties, logit_bias or min_tokens.
  static bool wants(const Request& r);
  // ... and all of it can be done here: no logprobs (raw logits go to the host), no grammar
  // (its mask keeps its own path), lists within ops::kLogitsMaxBias / kLogitsMaxStops, distinct
  // bias ids (one writer per id on the device).
  static bool supported(const Request& r);

  // Engine thread, when r is planned: takes and seeds a slot for a supported request that holds
  // none. false: r samples on the host this step (unsupported, futures in its tokens, or every
  // slot held; retried at its next step).
  bool acquire(Request& r);
  // The parameters of r's next token (slot -1 when r holds no slot).
  ops::LogitsProcRow row(const Request& r) const;
  int slots() const { return pool_.size(); }
  int free_slots() const { return pool_.available(); }
  int64_t vocab() const { return vocab_; }
  int64_t rows_cap() const { return rows_cap_; }

  // Device (CUDA only). upload(): rows [n <= rows_cap] into the persistent row buffer, then
  // slot -1 for rows n..pad_to-1 (a graph bucket's padding rows); one copy.
  void upload(const std::vector<ops::LogitsProcRow>& rows, int64_t pad_to = 0);
  // logits f32 [n, V] on the device, rows from the last upload.
  void apply(Tensor& logits);
  // The sampled ids of the last upload's rows (host), added to the counts.
  void count(const std::vector<int32_t>& ids);
  // The device state a decode graph captures (apply / count read it at replay).
  const ops::cuda::LogitsProcState& state() const;

  // What the last bind() seeded (tests): slot, prompt length, tokens, info row.
  struct Seed {
    int slot = -1;
    int64_t prompt_len = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> info;  // [ops::kLogitsSlotInfo]
  };
  const Seed& last_seed() const { return seed_; }
  int64_t seeds() const { return n_seeds_; }

  // The info row of a request (n_bias, n_stop, bias ids, bias value bits, stop ids).
  static std::vector<int32_t> slot_info(const Request& r);

 private:
  void seed(int slot, const Request& r);
  SlotPool pool_;
  int64_t vocab_ = 0, rows_cap_ = 0;
  Device device_;
  std::unique_ptr<ops::cuda::LogitsProcState> st_;
  Tensor tok_buf_;  // device staging of seeded tokens (grows at bind time, never during a step)
  std::vector<ops::LogitsProcRow> row_host_;
  int64_t dirty_rows_ = 0;  // the device row buffer may hold slots in rows [0, dirty_rows_)
  Seed seed_;
  int64_t n_seeds_ = 0;
};

}  // namespace ts
