// Structured outputs in the step: per request, the logits constraints the sampler applies before
// it draws a token -- a grammar (JSON schema, regex, choice, EBNF, a forced tool call), additive
// logit biases, and a minimum length -- and the grammar state that advances with every token.
//
// Flow: the API layer builds a StructuredRequest (validated IR + cache key; an invalid schema is
// a 400 there), the backend compiles it once per key in a GrammarCache (HTTP worker thread), the
// engine makes a LogitsConstraints per request (one per n: each sample has its own matcher). The
// mask for the next step is computed on a MaskPool thread as soon as the previous token is
// accepted, so it overlaps the engine's scheduling and the next forward; the sampler waits for it
// only if it is not ready yet. After a token is chosen the engine calls accept(); a grammar that
// has accepted a stop id (allowed only where the grammar can end) finishes the request.
//
// Threading: accept(), take_forced(), close() and the spec_* walk run on the engine thread;
// mask_after() also runs on the overlap loop's device thread, which samples step N+1 while the
// engine thread is still applying step N: it waits until the token it depends on was accepted
// (a count, not a flag) and its mask computed, or the request was closed. The matcher is touched
// by one thread at a time: the engine thread between jobs, a mask thread during one.
//
// Jump-forward (SGLang's name; llguidance's fast-forward tokens): where the grammar admits exactly
// one continuation for the next bytes (`{"name":"`, a key of a strict schema), the mask job first
// tokenizes those bytes and accepts the tokens itself; the engine appends them to the request
// (take_forced) and computes them as one multi-token chunk before it samples again.
//
// Reasoning models: with a reasoning parser the grammar starts after the reasoning block. qwen3:
// the first token may also be <think> (then the grammar waits for </think>); deepseek-r1: the
// output starts inside the reasoning, the grammar waits for </think>. Both need <think>/</think>
// to be single tokens of the vocabulary; otherwise the grammar applies from the first token.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"

namespace ts::grammar {
class Grammar;
class CompiledGrammar;
class Matcher;
class Vocab;
}  // namespace ts::grammar

namespace ts {

// GenerateParams::bad_words as token sequences, as vLLM makes them (each word without leading
// whitespace, tokenized without special tokens, and again after a space), except that the spaced
// run is kept whenever it differs (vLLM: only when as long as the plain one). Throws
// InvalidRequest for a word with no tokens.
std::vector<std::vector<int32_t>> bad_word_ids(const tok::Tokenizer& t, const std::vector<std::string>& words);

struct StructuredRequest {
  enum class Reasoning { none, qwen3, deepseek_r1 };
  std::string kind;  // what the client asked for (json_schema, json_object, regex, choice, grammar, tool_call)
  std::string key;   // cache key: kind, options and canonical text
  std::string field;  // the request field it came from (errors name it)
  std::shared_ptr<const grammar::Grammar> ir;
  std::shared_ptr<const grammar::CompiledGrammar> compiled;  // set by GrammarCache::prepare
  Reasoning reasoning = Reasoning::none;
  int32_t think_start = -1, think_end = -1;  // set by GrammarCache::prepare when reasoning != none
  // A triggered grammar (tool_choice auto: free text or tool calls). Non-empty: the output is free
  // (no mask) until its bytes contain `trigger` (e.g. "<tool_call>"); the grammar then matches
  // what follows the trigger, ending with the end tag (it must be able to end only there). Once
  // it ends: `trigger_repeat` -- free text again, the next trigger starts a fresh match;
  // otherwise only a stop id may follow (parallel_tool_calls: false).
  std::string trigger;
  bool trigger_repeat = true;
  // trigger_at_start: the trigger counts only as the first bytes of the output (after the
  // reasoning block and leading whitespace); output that starts otherwise stays free text to the
  // end (llama3 tool calls: the whole output is the calls or none is). trigger_in_grammar: the
  // trigger's bytes are the grammar's first bytes too (llama3's "{" opens the call object).
  bool trigger_at_start = false, trigger_in_grammar = false;
  // Set by GrammarCache::prepare: the served tokenizer, which jump-forward needs to tokenize forced
  // bytes (null: no jump-forward).
  std::shared_ptr<const tok::Tokenizer> tokenizer;
};

// Compiled grammars by key (LRU, `capacity` entries) over one tokenizer's vocabulary; the vocab
// tables are built once (100-190 ms for a 128k vocabulary), on first use. Thread-safe.
// `special_texts`: special tokens of these texts are admitted to grammars as markers
// (grammar::Vocab::from_tokenizer; the served tool-call parser's markers).
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const tok::Tokenizer> tok, std::vector<int32_t> stop_ids, size_t capacity = 256,
               std::vector<std::string> special_texts = {});
  ~GrammarCache();
  // A copy of `req` with `compiled` (and the think ids) filled in.
  std::shared_ptr<const StructuredRequest> prepare(const StructuredRequest& req);
  std::shared_ptr<const grammar::Vocab> vocab();
  size_t size() const;

 private:
  std::shared_ptr<const tok::Tokenizer> tok_;
  std::vector<int32_t> stop_ids_;
  size_t capacity_;
  std::vector<std::string> special_texts_;
  mutable std::mutex mu_;
  std::shared_ptr<const grammar::Vocab> vocab_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const grammar::CompiledGrammar>, std::list<std::string>::iterator>> map_;
};

// Whether the params ask for any logits constraint.
bool has_constraints(const GenerateParams& p);

class LogitsConstraints {
 public:
  // Null when `p` has no constraint. `stop_ids`: what min_tokens masks (the engine's eos ids;
  // the request's stop_token_ids are added).
  // bad_words: GenerateParams::bad_words as token sequences (Engine::submit tokenizes them).
  static std::shared_ptr<LogitsConstraints> make(const GenerateParams& p, const std::vector<int32_t>& stop_ids,
                                                 std::vector<std::vector<int32_t>> bad_words = {});
  LogitsConstraints(const GenerateParams& p, const std::vector<int32_t>& stop_ids,
                    std::vector<std::vector<int32_t>> bad_words = {});
  ~LogitsConstraints();

  // One host logits row [vocab] before sampling, `n_generated` tokens generated so far: biases,
  // min_tokens, then the grammar mask (disallowed -> -inf). Never leaves a row with no finite
  // entry: when min_tokens and the grammar together allow nothing, the grammar wins.
  void apply(float* logits, int64_t vocab, int n_generated);
  // The chosen token (after the engine appended it); starts the next mask in the background.
  void accept(int32_t token);
  // A stop id was accepted by the grammar: the output is complete.
  bool grammar_done() const { return done_; }
  // The grammar rejected a token (a bug or a client-forced token): the request should end.
  bool failed() const { return failed_; }
  bool has_grammar() const { return has_grammar_; }
  // Only a grammar (no logit_bias / min_tokens): the mask can be applied on device logits.
  bool device_maskable() const { return has_grammar_ && bias_.empty() && min_tokens_ == 0 && bad_seqs_.empty(); }
  // Bad words of two or more tokens (one-token ones are -inf biases): they need the output so far,
  // so only the host sampler applies them (apply_bad_sequences; DeviceLogits refuses them).
  bool has_bad_sequences() const { return !bad_seqs_.empty(); }
  // Bans the last token of every bad sequence whose other tokens end `out` ([n] generated ids).
  void apply_bad_sequences(float* logits, int64_t vocab, const int32_t* out, size_t n) const;
  // Tokens accept()ed so far plus the forced tokens the mask jobs accepted (= the request's
  // generated tokens once the engine took every forced run).
  int64_t accepted() const;
  // The mask of the state after `after` accepted tokens, into row[words] (zeros past the
  // grammar's vocabulary): blocks until that many tokens were accepted and the mask is computed
  // (a later state's after a jump-forward: the row is then void anyway), or the request was
  // closed. false, row untouched: no mask applies there (free text, reasoning, ended, closed).
  bool mask_after(int64_t after, uint32_t* row, int64_t words);
  // The request ended (or its step failed): wake and release every mask_after() waiter for good.
  void close();

  // Jump-forward. jumps(): enabled for this request (a tokenizer, GenerateParams::jump_forward,
  // no logprobs). take_forced(): the tokens the grammar forced after the last accept (already
  // accepted: accepted() counts them), moved into `out` (cleared; empty: none); blocks only until
  // the pending job has decided them, never for its mask. forced_ready(): that decision is made.
  bool jumps() const { return jump_; }
  void take_forced(std::vector<int32_t>& out);
  bool forced_ready();
  int64_t mask_words() const { return int64_t(mask_.size()); }
  // What apply() uses besides the grammar (device logits processing: runtime/device_logits.h).
  const std::vector<std::pair<int32_t, float>>& bias() const { return bias_; }
  int min_tokens() const { return min_tokens_; }
  const std::vector<int32_t>& min_stop_ids() const { return min_stop_; }  // empty unless min_tokens > 0
  // Blocks until the pending mask (if any) is computed; the mask row ([mask_words] uint32, or
  // null when the grammar does not apply at this step).
  const uint32_t* wait_mask();

  // Speculative verify (EAGLE3, runtime/spec_worker.cpp): the verify rows of one request are
  // positions past the current state. spec_begin() opens a tentative walk from the current state;
  // spec_apply() constrains the logits of the next verify position (the state after the drafts
  // spec_advance()d so far: its mask is computed inline, the walk is a few tokens); spec_advance()
  // moves the walk over an accepted draft (false: the grammar rejects it, the walk stops);
  // spec_end() rolls the matcher back to where spec_begin() found it. The engine then accept()s
  // the tokens it keeps, as in plain decoding, so rejected drafts leave no trace.
  void spec_begin();
  void spec_apply(float* logits, int64_t vocab, int n_generated);
  bool spec_advance(int32_t token);
  void spec_end();

 private:
  // first_optional_think -> reasoning -> active, or straight to active; with a trigger, `free`
  // replaces active outside a triggered match.
  enum class Phase { first_optional_think, reasoning, free, active };
  bool grammar_applies() const;  // the current state has a mask
  // After a state change (construction: counted = false; accept: true): publishes the new state
  // under the lock and schedules its job on the pool -- the forced tokens first (jump-forward, at
  // the front of the queue), then the mask.
  void start_mask(bool counted);
  void compute_forced();
  void compute_mask();
  void fill_mask(uint32_t* row);  // the current state's mask (plus <think> when optional)
  // biases, min_tokens, then mask m (null: no grammar at this position)
  void apply_with(float* logits, int64_t vocab, int n_generated, const uint32_t* m);
  // The grammar part of accept(): phase gate, then the matcher. Inside spec_begin..spec_end it
  // counts matcher steps (for the rollback) and returns false where the walk must stop: a
  // triggered match ended and the next one needs a fresh matcher (made only by accept()).
  bool advance(int32_t token);
  void enter_free_text();  // reasoning ended / a triggered match ended with repeat
  void free_text(int32_t token);  // scans for the trigger; may enter the grammar
  std::vector<std::pair<int32_t, float>> bias_;
  std::vector<std::vector<int32_t>> bad_seqs_;  // >= 2 tokens each
  std::vector<int32_t> min_stop_;
  int min_tokens_ = 0;
  std::unique_ptr<grammar::Matcher> matcher_;
  std::shared_ptr<const grammar::CompiledGrammar> compiled_;  // for a fresh matcher per triggered match
  std::string trigger_, tail_;  // tail_: the last bytes of free text (a possible trigger prefix)
  bool trigger_repeat_ = true, trigger_at_start_ = false, trigger_in_grammar_ = false;
  bool trigger_dead_ = false;  // trigger_at_start_: the output did not start with the trigger
  Phase phase_ = Phase::active;
  int32_t think_start_ = -1, think_end_ = -1;
  bool failed_ = false;
  std::vector<uint32_t> mask_;
  bool mask_valid_ = false;  // mask_ describes the current state
  bool has_grammar_ = false;
  bool done_ = false;        // the matcher terminated (set by accept(), read by the engine)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false;     // a job is running or queued: the matcher is its
  // Under mu_: tokens accepted so far; whether a mask applies after them; closed.
  int64_t accepted_ = 0;
  bool applies_ = false, closed_ = false;
  // Jump-forward: enabled; the token budget (max_tokens: one token is always left to sample);
  // the forced run of the last job and whether the job decided it yet.
  bool jump_ = false;
  int64_t max_tokens_ = 0;
  std::shared_ptr<const tok::Tokenizer> tok_;
  std::vector<int32_t> forced_;
  bool forced_ready_ = true;
  // spec_begin() .. spec_end(): the saved gate and how many matcher tokens to roll back.
  bool spec_ = false;
  Phase spec_phase_ = Phase::active;
  bool spec_trigger_dead_ = false;
  bool spec_failed_ = false;
  std::string spec_tail_;
  size_t spec_steps_ = 0, matcher_steps_ = 0;
  std::vector<uint32_t> spec_mask_;
};

// Host threads that compute next-step masks off the engine thread (process-wide, started on
// first use; 2 threads). Jobs never block on each other; `urgent` ones (the engine waits for
// them: jump-forward decisions) run before the queued masks.
void mask_pool_run(std::function<void()> job, bool urgent = false);

// Jump-forward's tokenization of forced bytes (exposed for tests): the tokenizer's ids for
// `bytes` cut back to whole UTF-8 characters, without the last id when the vocabulary has a
// longer token starting with its bytes (the text that follows could merge into it).
std::vector<int32_t> forced_tokens(const tok::Tokenizer& tok, const grammar::Vocab& vocab, std::string_view bytes);

}  // namespace ts
