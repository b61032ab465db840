// PlainWorker: the non-speculative step. One forward over every row of the plan (decodes and
// prefill chunks in one batch), then sampling of the rows that end their sequence — inside the
// decode CUDA graphs when the step is pure decode, one fits and no request needs host logits.
// Grammar rows (runtime/token_mask.h) are masked on the device before the sampler, in the graphs
// too; their masks are waited for after the forward was launched, so in the overlap loop a
// constrained request's step N+1 runs its forward while step N's token is still being applied.
//
// A step is two halves so the overlap loop can run the second on its own thread:
//  - stage() (engine thread) copies everything the step reads from its requests (input ids,
//    block tables, positions, sampling rows) into a StagedStep;
//  - run_staged() (the thread that drives the device; one at a time, in launch order) runs the
//    forward and sampling from the StagedStep alone. Input ids < 0 are futures: -(k+1) is the
//    id sampled for row k of the previous step, read from its StepResult (`prev`) here, so a
//    step can be staged before the previous one has produced its ids.
// execute() is stage() + run_staged() on the calling thread (the simple loop; speculative and
// host-logit steps), so both loops run the same code.
#pragma once
#include <vector>

#include "runtime/device_logits.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/step.h"
#include "runtime/token_mask.h"

namespace ts {

// One staged step (reused: every vector keeps its capacity).
struct StagedStep {
  std::vector<int32_t> ids;                  // every row's input ids, concatenated (futures < 0)
  std::vector<std::vector<int32_t>> tables;  // row i's block table (copied: the scheduler grows them)
  std::vector<SeqChunk> seq;                 // points into ids / tables
  std::vector<size_t> sample_row;            // plan row of each sampled row
  std::vector<ops::SamplingRow> sampling;    // one per sampled row
  // The sampled rows' requests. Read (by sample_batch: penalties, logprobs) only when
  // `live`: execute() runs the step on the engine thread, while the requests do not change.
  // Overlapped steps sample from `sampling` alone (their requests pass can_overlap).
  std::vector<const Request*> reqs;
  std::vector<int> logprobs;                 // per sampled row: GenerateParams::logprobs
  // Device logits processing (runtime/device_logits.h): one row per sampled row (slot -1:
  // none); proc_any: some row has a slot.
  std::vector<ops::LogitsProcRow> proc;
  bool proc_any = false;
  bool host = false;                         // some sampled row needs host logits
  // Per sampled row: its grammar (device-maskable rows; null otherwise) and the tokens it must
  // have accepted first. Held by shared_ptr: an overlapped step may outlive its requests' turn.
  StepMasks masks;
  bool greedy = false;                       // every sampled row is greedy_without_logits (and there is one)
  bool live = false;
  size_t rows = 0;
  bool empty() const { return rows == 0; }
};

class PlainWorker final : public Worker {
 public:
  explicit PlainWorker(ModelRunner& runner) : runner_(runner) {}
  void execute(const StepPlan& plan, StepResult& out) override;
  std::shared_ptr<const int> acquire_slot() override { return nullptr; }
  // Whether a request's steps may be staged ahead of the previous step's ids (no host logits:
  // penalties read the token history, which then still holds futures). A grammar alone is fine:
  // the mask of step N+1 depends on the token step N samples, so the device thread waits for it
  // (LogitsConstraints::mask_after) after launching N+1's forward, before N+1's sampling.
  // Device-processed requests (runtime/device_logits.h) keep the simple loop too: a slot is
  // seeded from the whole token history, which must hold no futures.
  static bool can_overlap(const Request& r) { return !needs_host_logits(r) && !DeviceLogits::wants(r); }
  // Copies the plan into `s` (engine thread). Row ids the previous step has not produced yet
  // must already be futures in the requests' tokens (the engine's pre-apply).
  void stage(const StepPlan& plan, StagedStep& s) const;
  // Runs a staged step; `prev`: the result of the step run just before (resolves futures;
  // null: `s` must hold none). Touches no Request unless s.host.
  void run_staged(StagedStep& s, const StepResult* prev, StepResult& out);

 private:
  ModelRunner& runner_;
  StagedStep sync_;  // execute()'s staging (reused)
  std::vector<SampleResult> samples_;
  std::vector<int32_t> ids_;
};

}  // namespace ts
