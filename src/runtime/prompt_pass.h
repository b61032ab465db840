// Prefill-only passes over a prompt, outside the scheduler: no sampling, nothing streamed and
// nothing cached. They serve /v1/embeddings (the final hidden states, pooled) and prompt
// logprobs (prompt_logprobs, echo with logprobs). The engine runs them on its own thread
// between steps (Engine::prompt_pass), on KV blocks borrowed from the pool for the pass and
// freed after it (never entered into the prefix cache).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ts {

class ModelRunner;
class KvCache;

struct PromptPassRequest {
  std::vector<int32_t> ids;   // the prompt (non-empty, in the vocabulary)
  bool hidden = false;        // pool the final residual stream
  bool mean = false;          // mean over the prompt (else the last token's)
  int logprobs = -1;          // >= 0: logprob of every prompt token after the first, with top-k
};

struct PromptPassResult {
  std::vector<float> hidden;            // [H] pooled, not normalised (hidden only)
  std::vector<TokenLogprob> logprobs;   // [ids.size() - 1]: entry i is ids[i + 1] given ids[0..i]
  std::vector<int32_t> ranks;           // [ids.size() - 1]: 1 + how many tokens scored above ids[i + 1]
  std::string error;                    // set when the pass could not run (KV pool full, ...)
};

// Engine thread only. `max_chunk`: tokens per forward (the logits of a chunk are [chunk, vocab]
// f32 on the host, so logprob passes use small chunks). The hidden state is the residual stream
// after the last layer, before the final RMSNorm (the model must capture layer num_layers:
// models::LoadOptions::capture_layers); callers L2-normalise it.
PromptPassResult run_prompt_pass(ModelRunner& runner, KvCache& kv, const PromptPassRequest& req, int max_chunk);

}  // namespace ts
