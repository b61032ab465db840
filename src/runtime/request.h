// Request: one generation's state, owned by the engine thread.
// Lifecycle (a finite-state machine whose states are types):
//   Waiting -> Prefilling (one or more chunks) -> Decoding -> Finished
//   Decoding|Prefilling -> Retracted -> Waiting   (preempted when KV blocks run out; its tokens
//                                                  are recomputed, reusing cached prefix blocks)
//   any non-terminal state -> Aborted             (client gone, error)
// An illegal transition throws; it never silently continues.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "runtime/engine.h"

namespace ts {

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

const char* state_name(const RequestState& s);
bool transition_allowed(const RequestState& from, const RequestState& to);

using Clock = std::chrono::steady_clock;

struct Request {
  int64_t id = 0;
  GenerateParams params;
  std::shared_ptr<Stream> stream;
  RequestState state = state::Waiting{};

  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int prompt_len = 0;
  int num_computed = 0;         // tokens whose K/V are in the cache
  int cached_tokens = 0;        // prompt tokens served from the prefix cache (first admission)
  bool admitted_once = false;
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;
  // Hybrid models: the row of the ModelRunner's recurrent-state pool this request holds while
  // it runs (taken at its first chunk, dropped when it ends or is retracted).
  std::shared_ptr<const int> state_slot;
  uint64_t seed = 0;

  // Text and stop-string state (the engine emits text deltas that never split UTF-8).
  std::string text;             // generated text so far (special tokens skipped)
  size_t text_emitted = 0;      // bytes of `text` already sent
  int tokens_emitted = 0;       // generated tokens already sent
  std::shared_ptr<tok::StreamDecoder> detok;

  Clock::time_point submitted, first_token, last_token;
  bool has_first_token = false;

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
  int remaining_to_compute() const { return int(tokens.size()) - num_computed; }
  template <typename S>
  bool is() const { return std::holds_alternative<S>(state); }
  bool terminal() const { return is<state::Finished>() || is<state::Aborted>(); }
  void to(RequestState next);
};

}  // namespace ts
