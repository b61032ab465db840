#include "runtime/plain_worker.h"

#include <chrono>

namespace ts {

void PlainWorker::execute(const StepPlan& plan, StepResult& out) {
  out.clear(plan.chunks.size());
  seq_.clear();
  sample_reqs_.clear();
  sample_row_.clear();
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    const ScheduledChunk& c = plan.chunks[k];
    const Request& r = *c.req;
    const bool last = r.num_computed + c.num_tokens == int(r.tokens.size());
    seq_.push_back({r.tokens.data() + r.num_computed, c.num_tokens, r.num_computed, &r.block_table,
                    last ? SeqChunk::Logits::last : SeqChunk::Logits::none, r.state_slot ? *r.state_slot : -1});
    if (last) {
      sample_reqs_.push_back(&r);
      sample_row_.push_back(k);
    }
  }
  // Penalties and logprobs work on host logits; otherwise sampling runs where the logits are.
  bool host = false, masked = false;
  for (const Request* r : sample_reqs_) {
    host = host || needs_host_logits(*r);
    masked = masked || needs_mask(*r);  // structured outputs: sample_batch applies the masks
  }
  auto f0 = std::chrono::steady_clock::now();
  // Pure decode steps sample inside the decode CUDA graph when one fits.
  bool sampled = false;
  if (!host && !masked && sample_reqs_.size() == seq_.size()) {
    sampling_.clear();
    for (const Request* r : sample_reqs_) sampling_.push_back(sampling_row(*r));
    sampled = runner_.run_sampled(seq_, sampling_, ids_);
    if (sampled) {
      samples_.resize(ids_.size());
      for (size_t i = 0; i < ids_.size(); ++i) samples_[i].token = ids_[i];
    }
  }
  if (!sampled) {
    Tensor logits = runner_.run(seq_, false, host);
    // The device work (forward + sampling) completes inside sample_batch's copy of the ids:
    // it counts as device time, not host time.
    sample_batch(logits, sample_reqs_, samples_);
  }
  out.forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count() - runner_.last_build_seconds();
  for (size_t i = 0; i < sample_reqs_.size(); ++i) {
    RowResult& row = out.rows[sample_row_[i]];
    row.first = int(out.tokens.size());
    row.count = 1;
    out.tokens.push_back(samples_[i].token);
    if (sample_reqs_[i]->params.logprobs >= 0) {
      row.lp_first = int(out.logprobs.size());
      out.logprobs.push_back(std::move(samples_[i].logprob));
    }
  }
}

}  // namespace ts
