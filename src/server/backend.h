// What the HTTP layer needs from the model side. The real one wraps ts::Engine
// (make_engine_backend); tests plug in a scripted fake to drive the HTTP layer without a model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/output_processor.h"
#include "server/protocol.h"

namespace ts::server {

// Per-request options of the text side (the consumer's OutputProcessor), beside GenerateParams.
struct SubmitOptions {
  bool include_stop_str = false;        // include_stop_str_in_output
  bool skip_special = true;             // skip_special_tokens
  std::shared_ptr<StopInfo> stop_info;  // when set: receives the stop reason (vLLM's stop_reason)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::shared_ptr<Stream> submit(GenerateParams params) = 0;  // thread-safe
  // With text-side options; a backend without a text side ignores them.
  virtual std::shared_ptr<Stream> submit(GenerateParams params, const SubmitOptions&) { return submit(std::move(params)); }
  virtual EngineMetrics metrics() const = 0;                          // thread-safe
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  // The raw bytes one id contributes to a text (a piece of a multi-byte character stays its own
  // bytes, where decode gives U+FFFD): chat logprobs' `bytes`, from which clients rebuild
  // characters split across tokens.
  virtual std::string token_bytes(int32_t id) const { return decode({id}, false); }
  // Prefill-only requests (no sampling, nothing streamed; blocking, so call them from a worker):
  // the served model's final hidden state pooled over `ids` (the last token's, or the mean of
  // all), not normalised — /v1/embeddings; and prompt logprobs: entry i is token i + 1 given
  // tokens 0..i with the top `top` alternatives — prompt_logprobs / echo with logprobs. A backend
  // without them answers 501.
  virtual std::vector<float> embed(const std::vector<int32_t>& ids, bool mean_pooling) {
    (void)ids, (void)mean_pooling;
    throw ApiError(501, "Embeddings are not supported by this backend");
  }
  struct PromptLogprobs {
    std::vector<TokenLogprob> lps;  // [ids.size() - 1]
    std::vector<int32_t> ranks;     // [ids.size() - 1]: the prompt token's rank (1 = most likely)
  };
  virtual PromptLogprobs prompt_logprobs(const std::vector<int32_t>& ids, int top) {
    (void)ids, (void)top;
    throw ApiError(501, "Prompt logprobs are not supported by this backend");
  }
  virtual int64_t context_length() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual void stop() {}
};

// Loads the model and tokenizer (may throw ts::Error) and starts the engine thread.
struct KvEventsConfig;
// `events`: KV cache events (--kv-events-config); off unless active(). `grammar_markers`: the
// served tool-call parser's markers (parser_markers): those that are special tokens of the
// tokenizer may be written by forced tool-call grammars as that one token (GrammarCache).
std::shared_ptr<Backend> make_engine_backend(const EngineOptions& opts, const KvEventsConfig& events,
                                             std::vector<std::string> grammar_markers = {});

}  // namespace ts::server
