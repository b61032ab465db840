// Request: one generation's state, owned by the engine thread.
// Lifecycle (a finite-state machine whose states are types):
//   Waiting -> Prefilling (one or more chunks) -> Decoding -> Finished
//   Decoding|Prefilling -> Retracted -> Waiting   (preempted when KV blocks run out; its tokens
//                                                  are recomputed, reusing cached prefix blocks)
//   any non-terminal state -> Aborted             (client gone, error)
//   Waiting -> Finished                           (overlap loop: a request retracted while its
//                                                  step was in flight, whose id from that step
//                                                  ends it)
// Transitions are made with Request::transit<From...>(To{}): a (From, To) pair the table below
// forbids does not compile; the runtime check is only that the request is in one of the
// named From states (it throws otherwise, never silently continues). The scheduler names the
// admissions and retractions of a plan; Engine::apply_plan/apply make every transition.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "runtime/engine.h"

namespace ts {

class LogitsConstraints;  // runtime/structured.h

namespace state {
struct Waiting {};
struct Prefilling {};
struct Decoding {};
struct Retracted {};
struct Finished {
  FinishReason reason;
};
struct Aborted {
  std::string why;
};
}  // namespace state

using RequestState = std::variant<state::Waiting, state::Prefilling, state::Decoding, state::Retracted,
                                  state::Finished, state::Aborted>;

// The transition table, at compile time.
template <class From, class To>
constexpr bool transition_allowed_v() {
  using namespace state;
  if constexpr (std::is_same_v<From, Finished> || std::is_same_v<From, Aborted>) return false;  // terminal
  else if constexpr (std::is_same_v<To, Aborted>) return true;
  else if constexpr (std::is_same_v<From, Waiting>) return std::is_same_v<To, Prefilling> || std::is_same_v<To, Finished>;
  else if constexpr (std::is_same_v<From, Prefilling>)
    return std::is_same_v<To, Decoding> || std::is_same_v<To, Finished> || std::is_same_v<To, Retracted>;
  else if constexpr (std::is_same_v<From, Decoding>) return std::is_same_v<To, Finished> || std::is_same_v<To, Retracted>;
  else if constexpr (std::is_same_v<From, Retracted>) return std::is_same_v<To, Waiting>;
  else return false;
}

const char* state_name(const RequestState& s);
// The same table at run time (tests; diagnostics).
bool transition_allowed(const RequestState& from, const RequestState& to);

using Clock = std::chrono::steady_clock;

struct Request {
  // What every step of a running request reads or writes, first and together (three cache
  // lines; prefetch_step_lines): a step's passes over hundreds of requests otherwise miss the
  // cache on each scattered line, after the forward between two steps evicted them.
  RequestState state = state::Waiting{};
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int prompt_len = 0;
  int num_computed = 0;         // tokens whose K/V are in the cache
  int tokens_emitted = 0;       // generated tokens already sent
  // Overlap loop: the step in flight ends this request (max_tokens or context reached), so
  // the scheduler plans nothing more for it. tokens.back() < 0 is a future id (see
  // PlainWorker: the id the step in flight samples), resolved when that step is applied.
  bool finishing = false;
  // Overlap loop, jump-forward: tokens the grammar forced replaced the future id of the step in
  // flight, whose row for this request is then void (applied as nothing but its KV).
  bool future_voided = false;
  bool has_first_token = false;
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;
  std::shared_ptr<Stream> stream;
  // Row of the runner's device logits-processing state (runtime/device_logits.h: penalties,
  // logit_bias, min_tokens on a CUDA runner) while it runs; dropped when it ends or is retracted.
  std::shared_ptr<const int> logits_slot;
  // Grammar matcher, logit_bias, min_tokens (null when the request has none of them).
  std::shared_ptr<LogitsConstraints> constraints;
  Clock::time_point last_token;
  bool has_future() const { return !tokens.empty() && tokens.back() < 0; }

  int64_t id = 0;
  GenerateParams params;
  int cached_tokens = 0;        // prompt tokens served from the prefix cache (first admission)
  int host_cached_tokens = 0;   // of those, loaded back from the host tier (KvStore)
  bool admitted_once = false;
  // Host-tier loads (KvStore): the load batch this request's prefix blocks wait for (0: none).
  // Set at admission; the scheduler plans none of its chunks before the batch completed.
  uint64_t kv_wait_seq = 0;
  Clock::time_point kv_wait_since;  // when it started waiting
  double kv_load_wait_s = 0;        // seconds it waited for loads (all admissions)
  // Hybrid models: the row of the ModelRunner's recurrent-state pool this request holds while
  // it runs (taken at its first chunk, dropped when it ends or is retracted).
  std::shared_ptr<const int> state_slot;
  uint64_t seed = 0;

  Clock::time_point submitted, first_token;
  Clock::time_point scheduled;  // first admission (queue time = scheduled - submitted)

  // Speculative decoding state (EAGLE3). The draft cache shares the target's block table
  // (draft entry p sits at position p), so only the next draft input is kept here: the token,
  // and the draft hidden r of the last draft row in row *spec_slot of the SpecWorker's pool
  // (the handle gives the row back when the request is done).
  int32_t spec_next = -1;       // first draft token of the next iteration (target vocabulary)
  std::shared_ptr<const int> spec_slot;
  struct SpecIteration {
    std::vector<int32_t> drafts;
    int accepted;
  };
  std::vector<SpecIteration> spec_trace;

  int num_generated() const { return int(tokens.size()) - prompt_len; }
  int num_generated_known() const { return num_generated() - (has_future() ? 1 : 0); }
  int remaining_to_compute() const { return int(tokens.size()) - num_computed; }
  template <typename S>
  bool is() const { return std::holds_alternative<S>(state); }
  bool terminal() const { return is<state::Finished>() || is<state::Aborted>(); }
  // Moves from one of the states From... to `next`. Every (From, To) pair must be in the table
  // (static_assert); throws when the request is in none of the From states.
  template <class... From, class To>
  void transit(To next) {
    static_assert(sizeof...(From) > 0, "name the states the transition leaves");
    static_assert((transition_allowed_v<From, To>() && ...), "illegal request state transition");
    if (!(is<From>() || ...)) bad_transition(state_name(RequestState(next)));
    state = std::move(next);
  }
  // Any live state -> Aborted (no-op on a terminal request).
  void abort(std::string why) {
    if (!terminal())
      transit<state::Waiting, state::Prefilling, state::Decoding, state::Retracted>(state::Aborted{std::move(why)});
  }

 private:
  [[noreturn]] void bad_transition(const char* to) const;
};

// Starts loading the lines of r a step reads: the hot block at its head, and the lines of
// params with the stop fields (max_tokens, stop_token_ids, ignore_eos, logprobs). A loop over a
// step's rows calls it a few rows ahead, so the rows' cache misses overlap instead of queueing.
inline void prefetch_step_lines(const Request* r) {
  const char* p = reinterpret_cast<const char*>(r);
  for (size_t o = 0; o < offsetof(Request, id) + 64; o += 64) __builtin_prefetch(p + o);  // (any alignment)
  const char* q = reinterpret_cast<const char*>(&r->params);
  __builtin_prefetch(q + offsetof(GenerateParams, max_tokens));
  __builtin_prefetch(q + offsetof(GenerateParams, stop_token_ids));
  __builtin_prefetch(q + offsetof(GenerateParams, logprobs));
}

}  // namespace ts
