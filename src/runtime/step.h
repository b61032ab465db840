// One engine step as data: Scheduler::plan() -> StepPlan -> Worker::execute() -> StepResult ->
// Engine::apply(). The plan names which requests run and how many tokens each computes; the
// worker runs the forward(s) and sampling/acceptance and reports, per row, the ids it produced;
// it reads requests but never changes them (it sees them as const). Engine::apply is the one
// place that appends tokens, advances num_computed, commits KV blocks, checks token-level stops
// (EOS, stop ids, max_tokens, context) and makes FSM transitions.
// All vectors are reused step to step (clear() keeps capacity): no allocation in steady state.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/kv_store.h"
#include "runtime/request.h"

namespace ts {

// A Request* whose constness follows the plan's: through a `const StepPlan&` (what a Worker
// gets) it yields only `const Request&`, so a worker that writes a request does not compile.
class RequestRef {
 public:
  RequestRef(Request* r = nullptr) : p_(r) {}  // NOLINT: implicit, plans are built from Request*
  Request* operator->() { return p_; }
  const Request* operator->() const { return p_; }
  Request& operator*() { return *p_; }
  const Request& operator*() const { return *p_; }
  Request* get() { return p_; }
  const Request* get() const { return p_; }

 private:
  Request* p_;
};

// One row of a plan: `num_tokens` of req->tokens from req->num_computed (a prefill chunk), or a
// decode (num_tokens = 1: the last token; a speculative verify runs its own width over it).
struct ScheduledChunk {
  RequestRef req;
  int num_tokens;
};

struct StepPlan {
  // Run order: decodes (oldest first), continuing prefills, admissions.
  std::vector<ScheduledChunk> chunks;
  // Requests the pool can never serve: the engine aborts them with a message.
  std::vector<std::shared_ptr<Request>> rejected;
  // FSM transitions the plan implies, made by the engine (apply_plan_transitions): requests
  // admitted (Waiting -> Prefilling) and retracted (-> Retracted -> Waiting, back at the front
  // of the waiting queue to be recomputed).
  std::vector<Request*> admitted, retracted;
  // KV block ops this plan made in the host bookkeeping (the single-tier device pool needs no
  // device-side work for them): net blocks taken from the pool (prefix matches, growth, minus
  // the blocks retractions gave back).
  int64_t blocks_allocated = 0;
  // The plan's shape: decode rows (spec verify rows count once) and prefill tokens (the mixed
  // budget's cost model pairs them with the step's device time).
  int decode_rows = 0, prefill_tokens = 0;
  // Host-tier copies (KvStore): evicted cached blocks written back, host prefix hits loaded into
  // the device blocks this plan's admissions hold. The engine issues them (KvStore::execute)
  // before the forward, also when the plan has no rows; the loads complete asynchronously.
  KvBlockOps kv_ops;
  // Admitted requests whose prefix blocks are still being loaded from the host tier (running,
  // holding their blocks, but no row in this plan): the rows above ran beside their loads.
  int kv_loading = 0;
  bool empty() const { return chunks.empty(); }
  void clear() {
    chunks.clear();
    rejected.clear();
    admitted.clear();
    retracted.clear();
    blocks_allocated = 0;
    decode_rows = prefill_tokens = 0;
    kv_ops.clear();
    kv_loading = 0;
  }
};

// What the worker produced for plan row i (rows[i] belongs to plan.chunks[i]).
struct RowResult {
  // Ids produced this step: StepResult::tokens[first, first + count). count 0: a prefill chunk
  // that does not end the sequence (nothing sampled).
  int first = 0, count = 0;
  // StepResult::logprobs[lp_first, lp_first + count) when the request asked for logprobs, else -1.
  int lp_first = -1;
  // Speculative verify rows: the drafts proposed (StepResult::drafts[draft_first, +draft_count))
  // and how many leading drafts the target accepted (the ids are the accepted drafts, then the
  // bonus token: count = accepted + 1). accepted = -1: not a verify row.
  int accepted = -1;
  int draft_first = 0, draft_count = 0;
  // The first draft input of the request's next step (EAGLE3; -1: none).
  int32_t spec_next = -1;
};

struct StepResult {
  std::vector<RowResult> rows;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::vector<int32_t> drafts;
  double forward_s = 0;  // seconds in forwards (device work); the rest of the step is host time
  // Set by whoever runs the step (the overlap thread, or the engine thread in the simple loop):
  // seconds the device sat idle between the previous step's end and this one's start (-1: not
  // counted, the engine had no work before it), and this step's busy seconds.
  double idle_before_s = -1, busy_s = 0;
  void clear(size_t n_rows) {
    rows.assign(n_rows, RowResult{});
    tokens.clear();
    logprobs.clear();
    drafts.clear();
    forward_s = 0;
  }
};

// Executes plans. Implementations: PlainWorker (one forward + sampling), SpecWorker (EAGLE3:
// draft steps, verify, acceptance, draft catch-up). A worker may keep device state per request
// (the EAGLE3 draft hidden row) through handles the engine stores on the request
// (acquire_slot); it never changes a Request.
class Worker {
 public:
  virtual ~Worker() = default;
  // Runs every row of `plan`; `out` is cleared and gets one RowResult per plan row.
  virtual void execute(const StepPlan& plan, StepResult& out) = 0;
  // A per-request slot of worker state (the engine stores it on the request before the
  // request first runs; dropping the handle returns the slot). Null: the worker keeps none.
  virtual std::shared_ptr<const int> acquire_slot() { return nullptr; }
};

}  // namespace ts
