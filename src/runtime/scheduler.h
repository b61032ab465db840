// Scheduler: decides what runs in the next step, under a token budget.
//  1. Every running request that is decoding gets its next token(s) (`decode_tokens` each:
//     1, or the speculative verify width; with 1, every token not computed yet, i.e. the run a
//     grammar's jump-forward appended, in one chunk). When blocks run out, the newest running request is
//     retracted (its blocks released — full ones stay in the prefix cache — and it goes back to
//     the front of the waiting queue, to be recomputed later).
//  2. Running requests in the middle of a chunked prefill continue.
//  3. Waiting requests are admitted in FIFO order (prefix matched first) while budget,
//     `max_num_seqs` and blocks allow. A prompt larger than the budget is chunked. A request
//     whose prefix comes back from the host tier (KvStore) is admitted with its blocks but
//     runs its first chunk only in a plan after its load batch completed (staged loads: the
//     other requests' rows run meanwhile; KvCache::loaded, an event query, never a wait).
// Decodes and prefill chunks share one step (mixed batches); with mixed_prefill_tokens the
// prefill share of a step that has decodes is capped. Attention data parallelism (a KvCache of
// several groups): an admission picks the request's group (KvCache::pick_group: longest cached
// prefix, then most free blocks) and takes every block from it; a decode that runs out of
// blocks retracts the newest request of its own group (others would free nothing it can use).
// Engine-thread only.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/mixed_budget.h"
#include "runtime/request.h"
#include "runtime/step.h"

namespace ts {

struct SchedulerOptions {
  int token_budget = 8192;
  int max_num_seqs = 256;
  int decode_tokens = 1;  // tokens a decoding request needs per step (spec: num_draft_tokens)
  int extra_decode_slots = 0;  // additional KV slots reserved per decode (spec lookahead)
  // --enable-mixed-batch with a fixed --mixed-prefill-tokens: while decodes run, a step's prefill
  // chunks take at most this many tokens (0: the whole remaining budget, or the MixedBudget set
  // with set_mixed_budget), so a decode step never carries a long prefill chunk.
  int mixed_prefill_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(KvCache& kv, SchedulerOptions opts) : kv_(kv), opts_(opts) {}
  void add(std::shared_ptr<Request> r) { waiting_.push_back(std::move(r)); }
  // Builds the next step into `plan` (cleared first; its vectors are reused). Requests it can
  // never serve go to plan.rejected (the engine aborts them with a message). Block bookkeeping
  // (allocation, prefix matches, retraction) happens here; the FSM transitions it makes are
  // Waiting -> Prefilling (admission) and Decoding|Prefilling -> Retracted -> Waiting.
  void plan(StepPlan& plan);
  // Removes finished/aborted requests from the running set and releases their blocks.
  void reap();
  void release(Request& r);
  std::vector<std::shared_ptr<Request>>& running() { return running_; }
  std::deque<std::shared_ptr<Request>>& waiting() { return waiting_; }
  int64_t retractions() const { return retractions_; }
  // Automatic mixed-batch budget (runtime/mixed_budget.h; not owned; null: none): asked once per
  // step that has decodes, with the decode rows and the prompt tokens waiting to be prefilled.
  void set_mixed_budget(const MixedBudget* b) { mixed_ = b; }
  // Prompt tokens still to prefill (prefilling + waiting requests), counted up to `cap` (also
  // the requests counted, into *requests when given).
  int64_t prefill_backlog(int64_t cap, int64_t* requests = nullptr) const;
  // Nothing to run and no host-tier load in flight (a load whose request is gone still holds
  // its blocks: planning goes on until it has been polled complete and they are back).
  bool idle() const { return running_.empty() && waiting_.empty() && kv_.loads_in_flight() == 0; }

 private:
  // Retracts the newest running request admitted after index `after` (none: returns false);
  // group >= 0: only a request whose blocks are in that DP group.
  bool retract_newest(size_t after, StepPlan& plan, int group = -1);
  void retract_at(size_t idx, StepPlan& plan);
  void commit(Request& r);

  KvCache& kv_;
  SchedulerOptions opts_;
  std::vector<std::shared_ptr<Request>> running_;  // admission order
  std::deque<std::shared_ptr<Request>> waiting_;
  int64_t retractions_ = 0;
  const MixedBudget* mixed_ = nullptr;
};

// The FSM transitions a plan implies (retracted: -> Retracted -> Waiting; admitted: Waiting ->
// Prefilling). Engine::apply_plan calls it right after plan(); simulations call it directly.
void apply_plan_transitions(const StepPlan& plan);

}  // namespace ts
