// SpecWorker: EAGLE3 chain speculative decoding (topk 1) inside the engine step.
// Per step, for every decoding request: N-1 draft steps (batched across requests), one target
// verify forward over [last, d1..d_{N-1}] (batched with any prefill chunks), acceptance —
// greedy, or rejection sampling against the target's filtered distribution so the output
// distribution is exactly the target's — then one draft forward that catches the draft cache
// up over the verified positions (and runs the draft prefill of prefill chunks).
// Exact semantics: shared/docs/EAGLE3.md. Engine-thread only.
#pragma once
#include <functional>
#include <memory>

#include "models/eagle3_draft.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"

namespace ts {

class SpecWorker {
 public:
  using PushFn = std::function<bool(Request&, int32_t, const TokenLogprob*, StreamEvent&)>;
  using EmitFn = std::function<void(Request&, StreamEvent&)>;

  // Target layers whose input is captured: --eagle3-layers-to-capture (ids = "output of layer
  // id", as in the draft config), else the draft config's ids, else [2, L/2, L-3] inputs.
  static std::vector<int> capture_layers_for(const EngineOptions& o, const io::ModelConfig& target);

  SpecWorker(const EngineOptions& o, ModelRunner& target, KvCache& kv);
  int num_draft_tokens() const { return n_; }
  // Runs one engine step over `chunks`; returns seconds spent in forwards.
  double step(const std::vector<ScheduledChunk>& chunks, const PushFn& push, const EmitFn& emit);
  int64_t verify_steps() const { return verify_steps_; }
  int64_t accepted_tokens() const { return accepted_tokens_; }
  double draft_seconds() const { return draft_s_; }

 private:
  void draft_loop(const std::vector<Request*>& decodes, std::vector<std::vector<int32_t>>& drafts);
  // Returns the number of accepted drafts; pushes accepted drafts + the bonus token.
  int accept(Request& r, const std::vector<int32_t>& drafts, const float* logits, int64_t vocab, const PushFn& push,
             const EmitFn& emit);

  ModelRunner& target_;
  KvCache& kv_;
  std::unique_ptr<models::Eagle3Draft> draft_;
  KvPool draft_kv_;
  ForwardBatch dbatch_;
  BatchBuilder dbuilder_;
  int n_ = 4;  // tokens per verify: N-1 drafts + 1
  int64_t verify_steps_ = 0, accepted_tokens_ = 0;
  double draft_s_ = 0;
  std::vector<std::vector<int32_t>> verify_ids_;
};

}  // namespace ts
