// PlainWorker: the non-speculative step. One forward over every row of the plan (decodes and
// prefill chunks in one batch), then sampling of the rows that end their sequence — inside the
// decode CUDA graph when the step is pure decode, one fits and no request needs host logits.
#pragma once
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/step.h"

namespace ts {

class PlainWorker final : public Worker {
 public:
  explicit PlainWorker(ModelRunner& runner) : runner_(runner) {}
  void execute(const StepPlan& plan, StepResult& out) override;
  std::shared_ptr<const int> acquire_slot() override { return nullptr; }

 private:
  ModelRunner& runner_;
  // Reused every step.
  std::vector<SeqChunk> seq_;
  std::vector<const Request*> sample_reqs_;
  std::vector<size_t> sample_row_;  // plan row of each sampled request
  std::vector<SampleResult> samples_;
  std::vector<ops::SamplingRow> sampling_;
  std::vector<int32_t> ids_;
};

}  // namespace ts
