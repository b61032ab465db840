// SpecWorker: EAGLE3 chain speculative decoding (topk 1) inside the engine step.
// Per step, for every decoding request: N-1 draft steps (batched across requests), one target
// verify forward over [last, d1..d_{N-1}] (batched with any prefill chunks), acceptance —
// greedy, or rejection sampling against the target's filtered distribution so the output
// distribution is exactly the target's — then one draft forward that catches the draft cache
// up over the verified positions (and runs the draft prefill of prefill chunks).
// It is a Worker: it reads the plan's requests, reports per row the ids it accepted (accepted
// drafts, then the bonus token), the drafts it proposed and the next draft input, and never
// changes a Request — the engine's apply() appends, stops and advances.
// Exact semantics: docs/EAGLE3.md. Engine-thread only.
#pragma once
#include <memory>

#include "models/eagle3_draft.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/model_runner.h"
#include "runtime/step.h"

namespace ts {

struct GraphOptions;

class SpecWorker final : public Worker {
 public:
  // Target layers whose input is captured: --eagle3-layers-to-capture (ids = "output of layer
  // id", as in the draft config), else the draft config's ids, else [2, L/2, L-3] inputs.
  static std::vector<int> capture_layers_for(const EngineOptions& o, const io::ModelConfig& target);

  SpecWorker(const EngineOptions& o, ModelRunner& target);
  ~SpecWorker();
  int num_draft_tokens() const { return n_; }
  // Captures the fixed-shape decode step (draft steps + verify + acceptance, then the draft
  // catch-up) as CUDA graphs per (context bound, batch bucket). Call after the target's graphs.
  // size_for_graphs runs the largest graph step eagerly first, before the target's arena is
  // sized and frozen by its own graph capture, so the verify's scratch fits in it.
  void size_for_graphs(const GraphOptions& o);
  void enable_graphs(const GraphOptions& o);
  int graphs() const;
  // Runs one engine step over the plan's rows (every request must hold a slot from
  // acquire_slot); out.forward_s: seconds spent in forwards.
  void execute(const StepPlan& plan, StepResult& out) override;
  // The request's row of the draft-state pool (its draft hidden between steps).
  std::shared_ptr<const int> acquire_slot() override;
  // Device seconds in the draft model (draft steps + catch-up) and in the target verify.
  double draft_seconds() const { return draft_s_; }
  double verify_seconds() const { return verify_s_; }
  int64_t timed_steps() const { return timed_steps_; }  // steps the draft/verify seconds cover
  // Steps that ran the fixed-shape decode path (graph replays among them).
  int64_t fixed_steps() const { return fixed_steps_; }
  int64_t graph_steps() const { return graph_steps_; }

 public:
  // The draft model's paged KV (same block ids as the target's): the host tier mirrors it.
  KvPool& draft_kv() { return draft_kv_; }

 private:
  struct Lane;
  struct LaneGraphs;
  struct Marks;
  // Steps with prefill chunks: draft loop, one target forward over verify rows and chunks,
  // acceptance, one draft forward (catch-up + draft prefill).
  // `rows`: the plan rows it runs (indices into plan.chunks, and into out.rows).
  double mixed_step(const StepPlan& plan, const std::vector<size_t>& rows, StepResult& out);
  // Decode-only steps: fixed shapes, every request n rows (graph-capturable; see the .cpp).
  double decode_step(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows, StepResult& out);
  Lane* pick_lane(const std::vector<const Request*>& decodes, int& bucket, int& kv_bound, LaneGraphs*& g);
  void host_accept(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows, Lane& L,
                   StepResult& out);
  void build_lane(Lane& L, const std::vector<const Request*>& reqs, int bucket, int kv_bound);
  void segment_a(Lane& L, int bucket);  // draft steps
  void segment_v(Lane& L, int bucket);  // verify + greedy acceptance
  void segment_b(Lane& L, int bucket);  // draft catch-up
  void segment_all(Lane& L, int bucket);
  // Reports the greedy rows' ids and every row's next draft input; read_back: the device
  // results are not on the host yet.
  double finish_decode_step(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows, Lane& L,
                            bool host, bool graph, bool read_back, double t0, StepResult& out);
  void draft_loop(const std::vector<const Request*>& decodes, std::vector<std::vector<int32_t>>& drafts);
  // Acceptance of one verify row against the target logits [drafts + 1, vocab]: appends the
  // accepted drafts and the bonus token (and their logprobs) to `out` under `row`; returns the
  // number of accepted drafts.
  int accept(const Request& r, const int32_t* drafts, int num_drafts, const float* logits, int64_t vocab,
             StepResult& out, RowResult& row);
  int slot_of(const Request& r) const;
  Tensor pool_row(const Request& r) { int s = slot_of(r); return h_pool_.slice_rows(s, s + 1); }

  ModelRunner& target_;
  std::unique_ptr<models::Eagle3Draft> draft_;
  KvPool draft_kv_;
  ForwardBatch dbatch_;
  BatchBuilder dbuilder_;
  int n_ = 4;  // tokens per verify: N-1 drafts + 1
  int64_t fixed_steps_ = 0, graph_steps_ = 0, timed_steps_ = 0;
  double draft_s_ = 0, verify_s_ = 0;
  std::vector<std::vector<int32_t>> verify_ids_;
  // execute(): reused every step.
  std::vector<const Request*> decodes_;
  std::vector<size_t> decode_rows_, rest_rows_, all_rows_;
  std::vector<int32_t> catch_ids_;     // mixed_step(): the draft catch-up's input ids
  std::vector<float> accept_row_, accept_p_;
  // Draft hidden state per request: h_pool_ [slots + 1, H]; the last row takes padding writes.
  Tensor h_pool_;
  struct FreeSlots;
  std::shared_ptr<FreeSlots> free_slots_;
  int pad_slot_ = 0;
  std::unique_ptr<Lane> eager_, graph_, pending_;
  std::vector<Request> dummies_;  // graph capture inputs (context 1, first blocks, padding row)
};

}  // namespace ts
