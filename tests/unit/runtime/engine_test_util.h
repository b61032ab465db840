// Helpers for engine tests: the bundled demo model, greedy generation, prompts.
#pragma once
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/output_processor.h"

namespace ts::test {

inline std::string demo_model() { return std::string(TS_SOURCE_DIR) + "/models/pycoder"; }
inline std::string demo_draft() { return std::string(TS_SOURCE_DIR) + "/models/pycoder-eagle3"; }

inline EngineOptions small_engine(int64_t pool_tokens = 16384, int block = 16) {
  EngineOptions o;
  o.model_dir = demo_model();
  o.device = "cpu";
  o.max_total_tokens = pool_tokens;
  o.block_size = block;
  return o;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::none;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::string error;
  std::vector<std::pair<std::vector<int32_t>, int>> trace;
  std::vector<TokenLogprob> logprobs;
};

inline Result collect(const std::shared_ptr<Stream>& st) {
  Result r;
  StreamEvent ev;
  while (true) {
    if (!st->pop(ev, 60000)) {
      r.error = "timeout";
      return r;
    }
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r.text += ev.text;
    r.logprobs.insert(r.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    if (ev.finished) {
      r.reason = ev.reason;
      r.prompt_tokens = ev.prompt_tokens;
      r.completion_tokens = ev.completion_tokens;
      r.cached_tokens = ev.cached_tokens;
      r.error = ev.error;
      r.trace = ev.spec_trace;
      return r;
    }
  }
}

// Runs every request: one after the other, or all submitted at once (batched by the engine);
// results in request order either way.
inline std::vector<Result> run_all(Engine& e, const std::vector<GenerateParams>& ps, bool concurrent) {
  std::vector<Result> out;
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) {
    if (concurrent) st.push_back(e.submit(p));
    else out.push_back(collect(e.submit(p)));
  }
  for (auto& s : st) out.push_back(collect(s));
  return out;
}

// Runs `ps` batched on `e` and expects `solo`'s tokens (the reference engine's, one at a time),
// then runs them again and expects the same tokens with some of the prompts from the prefix cache.
inline void expect_batched_then_cached_equal(Engine& e, const std::vector<GenerateParams>& ps,
                                             const std::vector<Result>& solo) {
  auto batch = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(batch[i].error.empty()) << batch[i].error;
    EXPECT_EQ(batch[i].tokens, solo[i].tokens) << "batched, prompt " << i;
  }
  auto again = run_all(e, ps, true);
  int cached = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(again[i].tokens, solo[i].tokens) << "cached prefix, prompt " << i;
    cached += again[i].cached_tokens;
  }
  EXPECT_GT(cached, 0);
}

// Submits with the server's output processor on the stream, so collect() gets text and stop
// strings end the request (the engine itself sends ids only).
inline std::shared_ptr<Stream> submit_text(Engine& e, const GenerateParams& p) {
  auto st = e.submit(p);
  server::attach_output_processor(*st, e.tokenizer_ptr(), p, e.eos_token_ids());
  return st;
}

inline GenerateParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerateParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

// Code-like prompts of varied lengths, tokenized by the engine's tokenizer.
std::vector<std::vector<int32_t>> code_prompts(const Engine& e, int n);

// Submits n greedy requests (code_prompts, max_tokens each) and drains them on this thread as
// the server's event loop does: one StreamWaker, woken once per engine step. `begin` runs once
// the consumer has received a quarter of all tokens, `end` at three quarters: between them every
// request decodes (no prefill, no finish). begin gets the thread that woke the consumer (the
// engine thread). Returns the number of requests that ended with an error; throws after 60 s
// without output.
int drain_steady(Engine& e, int n, int max_tokens, const std::function<void(std::thread::id)>& begin,
                 const std::function<void()>& end);

}  // namespace ts::test
