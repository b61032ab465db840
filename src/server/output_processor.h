// OutputProcessor: one request's text, built off the engine thread (vLLM v1's frontend
// OutputProcessor / detokenizer). The engine streams token ids; the consumer of a Stream (an
// HTTP connection, the CLI) feeds each event here and gets the text it may send now:
//  - incremental, UTF-8-safe detokenization (tok::StreamDecoder; special tokens skipped);
//  - the final token of a request the engine stopped on a stop id (EOS, stop_token_ids) adds
//    no text;
//  - stop strings: text that could still become one is held back (cut to a UTF-8 boundary)
//    until the next token decides; on a match the text ends before the stop string (or after
//    it with include_stop_str), `stopped` is set and later tokens are ignored. The caller then
//    tells the engine (Stream::request_stop) so the request ends at its next step.
// Threading: one instance per request, used by one thread at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/engine.h"

namespace ts::tok {
class Tokenizer;
class StreamDecoder;
}  // namespace ts::tok

namespace ts::server {

struct OutputOptions {
  std::vector<std::string> stop;           // stop strings
  std::unordered_set<int32_t> stop_ids;    // ids that end a request without text (EOS ∪ stop_token_ids)
  std::unordered_set<int32_t> keep_ids;    // of those, the ones whose text stays (include_stop_str: stop_token_ids)
  bool skip_special = true;
  // keep the matched stop string in the text, and a stop_token_ids id's text (vLLM's
  // include_stop_str_in_output; EOS adds none)
  bool include_stop_str = false;
};

class OutputProcessor {
 public:
  OutputProcessor(std::shared_ptr<const tok::Tokenizer> tok, OutputOptions opts);
  ~OutputProcessor();
  OutputProcessor(OutputProcessor&&) noexcept;
  OutputProcessor& operator=(OutputProcessor&&) noexcept;

  struct Delta {
    std::string text;          // text that may be sent now
    int tokens = 0;            // tokens of this event that count (those after a stop match do not)
  };
  // Feeds one event (its tokens, and on the final event the flush). Once stopped() every
  // later call returns an empty delta.
  Delta feed(const StreamEvent& ev);
  bool stopped() const { return !stop_str_.empty(); }  // a stop string matched
  const std::string& stop_str() const { return stop_str_; }
  const std::string& text() const { return text_; }  // everything generated so far (before hold-back)
  size_t emitted() const { return emitted_; }        // bytes of text() already returned

 private:
  void feed_token(int32_t id, bool final_stop_id);
  bool match_stop();   // searches the new text for a stop string; cuts text_ on a match
  Delta take(bool final);

  std::shared_ptr<const tok::Tokenizer> tok_;
  std::unique_ptr<tok::StreamDecoder> detok_;
  OutputOptions opts_;
  size_t hold_ = 0;          // longest stop string - 1: bytes that may not be sent yet
  std::string text_;
  size_t emitted_ = 0;
  std::string stop_str_;
};

// The options for a request as the engine runs it: its stop strings, and as stop ids the
// engine's EOS ids (unless ignore_eos) and the request's stop_token_ids.
OutputOptions output_options(const GenerateParams& p, const std::vector<int32_t>& eos_ids);

// Installs an OutputProcessor as `st`'s filter (Stream::set_filter), so every event a consumer
// pops carries its text, on the consumer's thread. On a stop-string match the filter asks the
// engine to stop (Stream::request_stop) and drops what follows the match: the event's tokens
// and logprobs are cut to those that count, later events carry none, and the final event's
// completion_tokens counts the tokens up to the match. Call before the first pop.
void attach_output_processor(Stream& st, std::shared_ptr<const tok::Tokenizer> tok, const GenerateParams& p,
                             const std::vector<int32_t>& eos_ids);

// Why a request stopped, as vLLM's `stop_reason` reports it: the stop string that matched, or
// the stop_token_ids entry the engine stopped on (EOS: neither). Written by the stream's filter
// on the consumer's thread, read by the same thread after the final event.
struct StopInfo {
  std::string stop_str;
  int32_t stop_token = -1;
};
// The same with text options beyond GenerateParams: include_stop_str keeps the matched stop
// string in the text (include_stop_str_in_output); `info` (may be null) receives the stop reason;
// skip_special false keeps special tokens' text (skip_special_tokens; the final stop id adds none).
void attach_output_processor(Stream& st, std::shared_ptr<const tok::Tokenizer> tok, const GenerateParams& p,
                             const std::vector<int32_t>& eos_ids, bool include_stop_str,
                             std::shared_ptr<StopInfo> info, bool skip_special = true);

}  // namespace ts::server
