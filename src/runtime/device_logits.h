// DeviceLogits: penalties (presence, frequency, repetition), logit_bias and min_tokens applied to
// device logits from per-request token counts, so such requests keep device sampling and the
// decode CUDA graphs (issue #17 item 6). The CPU sampler (runtime/sampler.cpp: apply_penalties,
// LogitsConstraints::apply) is the oracle; tests/cuda/logits_proc_test.cpp compares the two.
//
// Bookkeeping (engine thread): a request that asks for processing takes one of `slots` rows
// (Request::logits_slot, a SlotPool handle dropped when it ends or is retracted) when it is first
// planned (acquire); the slot is then pending until the first step that samples the request is
// staged, which copies r.tokens (prompt ids -> bits for repetition, output ids -> counts) into
// the step's LogitsSeeds (stage_seed). The thread that runs the step seeds the slot from them
// (run_seeds) before that step's forward: after every step launched before it, so a reused slot
// is cleared after the last step of its previous owner (whose rows may still be in flight under
// overlap scheduling) and counts never leak between requests; a retracted request is reseeded
// the same way. Seeding runs with the step so that it may hold futures: the overlap loop's
// placeholders for ids the step in flight samples (PlainWorker), resolved with the step's own
// input ids. Each step uploads one LogitsProcRow per batch row (slot, min_tokens ban, penalty
// values; one pinned asynchronous copy), apply() runs before sampling and count() adds the
// sampled ids to the counts (inside the graph: no host round trip). Requests with logprobs or a
// grammar keep their paths (host logits / device masks); when every slot is held, a request uses
// host logits (and the simple loop).
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
class StagedUpload;

// Slot seeds staged with a step (reused: clear() keeps capacity).
struct LogitsSeeds {
  struct Item {
    int slot = -1;
    int64_t prompt_len = 0;
    size_t first = 0, count = 0;  // tokens[first, first + count): the request's whole history
  };
  std::vector<Item> items;
  std::vector<int32_t> tokens;  // concatenated histories; ids < 0 are futures until resolved
  std::vector<int32_t> info;    // ops::kLogitsSlotInfo per item
  void clear() {
    items.clear();
    tokens.clear();
    info.clear();
  }
  bool empty() const { return items.empty(); }
};

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

  // Engine thread, when r is planned: takes a slot for a supported request that holds none and
  // marks it pending (seeded with the first step that samples r). false: r samples on the host
  // this step (unsupported, or every slot held; retried at its next step).
  bool acquire(Request& r);
  // Engine thread, when a step that samples r is staged: r's slot is pending -> its history and
  // info row go into `out` (the slot is no longer pending). false: nothing to seed.
  bool stage_seed(const Request& r, LogitsSeeds& out);
  // The thread that runs the step, before its forward: seeds every item of `s` (no futures
  // left in s.tokens). On the CPU only recorded (last_seed / seeds).
  void run_seeds(const LogitsSeeds& s);
  bool pending(int slot) const { return slot >= 0 && size_t(slot) < pending_.size() && pending_[size_t(slot)]; }
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

  // What the last run_seeds() seeded (tests): slot, prompt length, tokens, info row.
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
  SlotPool pool_;
  std::vector<char> pending_;  // per slot: taken, not yet staged for seeding
  int64_t vocab_ = 0, rows_cap_ = 0;
  Device device_;
  std::unique_ptr<ops::cuda::LogitsProcState> st_;
  // Device copies of seeds (tokens, then info rows; grows geometrically, only when a request
  // with a longer history is seeded) and the pinned asynchronous uploads of seeds, rows, ids.
  Tensor tok_buf_;
  std::unique_ptr<StagedUpload> up_seed_, up_rows_, up_ids_;
  std::vector<int32_t> seed_host_;
  std::vector<ops::LogitsProcRow> row_host_;
  int64_t dirty_rows_ = 0;  // the device row buffer may hold slots in rows [0, dirty_rows_)
  Seed seed_;
  int64_t n_seeds_ = 0;
};

}  // namespace ts
