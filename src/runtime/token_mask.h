// Grammar masks of one step on the device: a persistent bitmask [rows_cap, words] (words =
// ceil(vocab / 32); bit (id & 31) of word (id >> 5) set = id allowed) that the decode CUDA graphs
// capture (ops::apply_token_bitmask before their sampler), refreshed by one asynchronous copy
// from pinned host rows on the compute stream before each masked sampling. Rows without a
// grammar are all-ones, so the same graphs serve masked and unmasked steps.
//
// Who fills it: PlainWorker::run_staged, on the thread that drives the device, after it launched
// the step's forward. In the overlap loop that forward runs while the engine thread still applies
// the previous step, whose tokens these masks depend on: upload() waits for each row's mask
// (LogitsConstraints::mask_after), so only the sampling waits, never the forward.
// On the CPU backend the "device" rows are the host rows (the same code runs, CI tests it).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace ts {

class LogitsConstraints;

// The grammar rows of one step's sampled rows: cons[i] (null: no grammar) must have accepted
// after[i] tokens (the request's generated tokens before the one row i samples) before its mask
// is the right one. any: some row has one.
struct StepMasks {
  std::vector<std::shared_ptr<LogitsConstraints>> cons;
  std::vector<int64_t> after;
  bool any = false;
  void clear() {
    cons.clear();
    after.clear();
    any = false;
  }
};

class TokenMaskBuffer {
 public:
  TokenMaskBuffer(int64_t rows_cap, int64_t vocab, Device device);
  ~TokenMaskBuffer();
  TokenMaskBuffer(const TokenMaskBuffer&) = delete;
  TokenMaskBuffer& operator=(const TokenMaskBuffer&) = delete;
  int64_t rows_cap() const { return rows_cap_; }
  int64_t words() const { return words_; }
  // Rows [0, m.cons.size()) from the masks (waiting for each), all-ones where there is none;
  // rows a previous upload masked beyond them go back to all-ones. The copy is ordered before
  // kernels launched after it on the compute stream; the host returns without waiting for it.
  void upload(const StepMasks& m);
  // Every row all-ones (a step without masks); free when already so.
  void clear();
  // Device view [n, words] (n <= rows_cap). The graphs capture rows(bucket).
  Tensor rows(int64_t n) const;

 private:
  void copy(int64_t n);  // staging rows [0, n) to the device
  int64_t rows_cap_, words_;
  Device device_;
  Tensor dev_;                    // [rows_cap, words] u32 (i32 storage); the host rows on the CPU
  std::shared_ptr<void> staging_;  // pinned [rows_cap, words] (CUDA)
  void* event_ = nullptr;          // the last copy left the staging rows once it completes
  int64_t dirty_ = 0;              // rows [0, dirty_) may hold masks
};

}  // namespace ts
