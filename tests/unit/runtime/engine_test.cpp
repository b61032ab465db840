// The serving core on the CPU: batch invariance (alone, batch of 32, cached prefix, any chunk
// size), retraction under a tiny pool, stops, usage accounting and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "runtime/prompt_pass.h"
#include "runtime/structured.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::test;

namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = new Engine(small_engine());
    engine_->start();
    prompts_ = code_prompts(*engine_, 32);
    for (auto& p : prompts_) solo_.push_back(collect(engine_->submit(greedy(p, 12))).tokens);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static Engine* engine_;
  static std::vector<std::vector<int32_t>> prompts_;
  static std::vector<std::vector<int32_t>> solo_;
};
Engine* EngineTest::engine_ = nullptr;
std::vector<std::vector<int32_t>> EngineTest::prompts_;
std::vector<std::vector<int32_t>> EngineTest::solo_;

TEST_F(EngineTest, BatchOf32EqualsSolo) {
  std::vector<GenerateParams> ps;
  for (auto& p : prompts_) ps.push_back(greedy(p, 12));
  auto res = run_all(*engine_, ps, true);
  for (size_t i = 0; i < res.size(); ++i) {
    EXPECT_EQ(res[i].tokens, solo_[i]) << "prompt " << i;
    EXPECT_EQ(res[i].completion_tokens, 12);
    EXPECT_EQ(res[i].prompt_tokens, int(prompts_[i].size()));
    EXPECT_EQ(res[i].reason, FinishReason::length);
  }
}

TEST_F(EngineTest, CachedPrefixEqualsSolo) {
  // The same prompts again: full blocks now come from the prefix cache.
  int cached = 0;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    Result r = collect(engine_->submit(greedy(prompts_[i], 12)));
    EXPECT_EQ(r.tokens, solo_[i]) << "prompt " << i;
    cached += r.cached_tokens;
    EXPECT_LE(r.cached_tokens, int(prompts_[i].size()) - 1);
  }
  EXPECT_GT(cached, 0);
  EngineMetrics m = engine_->metrics();
  EXPECT_GT(m.prefix_hit_rate, 0.0);
}

TEST_F(EngineTest, LongPromptReusesAllFullBlocks) {
  std::vector<int32_t> p;
  for (auto& q : prompts_) p.insert(p.end(), q.begin(), q.end());
  p.resize(600);
  Result a = collect(engine_->submit(greedy(p, 4)));
  Result b = collect(engine_->submit(greedy(p, 4)));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GE(b.cached_tokens, 600 - 16);  // every full block but the one holding the last token
}

TEST(EngineChunks, AnyChunkSizeEqualsSolo) {
  for (int chunk : {1, 7, 64}) {
    EngineOptions o = small_engine();
    o.chunked_prefill_size = chunk;
    o.disable_prefix_cache = true;
    Engine e(o);
    e.start();
    auto prompts = code_prompts(e, 6);
    std::vector<GenerateParams> ps;
    for (auto& p : prompts) ps.push_back(greedy(p, 8));
    auto conc = run_all(e, ps, true);
    Engine ref(small_engine());
    ref.start();
    auto solo = run_all(ref, ps, false);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "chunk " << chunk << " prompt " << i;
  }
}

TEST(EngineRetraction, TinyPoolRetractsAndStillMatchesSolo) {
  EngineOptions o = small_engine(/*pool_tokens=*/256, /*block=*/16);
  Engine e(o);
  e.start();
  auto prompts = code_prompts(e, 8);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 40));
  auto solo = run_all(e, ps, false);
  auto conc = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
    EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "prompt " << i;
  }
  EXPECT_GT(e.metrics().retractions, 0);
}

TEST(EngineStops, StopStringsEosAndMaxTokens) {
  Engine e(small_engine());
  e.start();
  auto prompt = e.tokenizer().encode("def fibonacci(n):\n", true);
  Result base = collect(submit_text(e, greedy(prompt, 40)));
  ASSERT_GT(base.text.size(), 8u);
  // Stop on a substring of the known greedy text: output ends right before it.
  std::string stop = base.text.substr(base.text.size() / 2, 3);
  GenerateParams p = greedy(prompt, 40);
  p.stop = {stop};
  Result r = collect(submit_text(e, p));
  EXPECT_EQ(r.reason, FinishReason::stop);
  EXPECT_EQ(r.text, base.text.substr(0, base.text.find(stop)));
  EXPECT_EQ(int(r.tokens.size()), r.completion_tokens);
  // A stop token id: the request ends on it and counts it.
  GenerateParams q = greedy(prompt, 40);
  q.stop_token_ids = {base.tokens[5]};
  Result s = collect(e.submit(q));
  EXPECT_EQ(s.reason, FinishReason::stop);
  EXPECT_EQ(s.tokens.back(), base.tokens[5]);
  EXPECT_LE(s.tokens.size(), 6u);
  // max_tokens = 1
  Result one = collect(e.submit(greedy(prompt, 1)));
  EXPECT_EQ(one.tokens.size(), 1u);
  EXPECT_EQ(one.reason, FinishReason::length);
}

// The engine streams ids only; text is made on the consumer's side (the Stream's filter).
TEST(EngineStops, EngineSendsIdsTheConsumerMakesText) {
  Engine e(small_engine());
  e.start();
  auto prompt = e.tokenizer().encode("def fibonacci(n):\n", true);
  Result raw = collect(e.submit(greedy(prompt, 12)));
  EXPECT_TRUE(raw.text.empty());
  EXPECT_EQ(raw.tokens.size(), 12u);
  Result txt = collect(submit_text(e, greedy(prompt, 12)));
  EXPECT_EQ(txt.tokens, raw.tokens);
  EXPECT_EQ(txt.text, e.tokenizer().decode(raw.tokens, true));
}

TEST(EngineInput, BadRequestsAreRejected) {
  Engine e(small_engine(4096));
  e.start();
  EXPECT_THROW(e.submit(greedy({}, 4)), InvalidRequest);
  EXPECT_THROW(e.submit(greedy({1, 2, 99999}, 4)), InvalidRequest);
  EXPECT_THROW(e.submit(greedy({1, 2}, 0)), InvalidRequest);
  std::vector<int32_t> huge(5000, 5);
  try {
    e.submit(greedy(huge, 16));
    FAIL() << "over-long prompt accepted";
  } catch (const InvalidRequest& ex) {
    EXPECT_NE(std::string(ex.what()).find("5000 in the prompt"), std::string::npos) << ex.what();
  }
  // One-token prompt is fine.
  Result r = collect(e.submit(greedy({0}, 3)));
  EXPECT_EQ(r.tokens.size(), 3u);
}

TEST(EngineCancel, CancelledStreamIsAbortedAndFreed) {
  Engine e(small_engine());
  e.start();
  auto st = e.submit(greedy({0, 331, 291}, 2000));
  StreamEvent ev;
  ASSERT_TRUE(st->pop(ev, 60000));
  st->cancel();
  Result r = collect(st);
  EXPECT_EQ(r.reason, FinishReason::abort);
  for (int i = 0; i < 100 && e.metrics().kv_used_blocks > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(e.metrics().running, 0);
  EXPECT_EQ(e.metrics().requests_aborted, 1);
}

TEST(EngineCancel, RequestStopFinishesAsStopped) {
  Engine e(small_engine());
  e.start();
  auto st = e.submit(greedy({0, 331, 291}, 2000));
  StreamEvent ev;
  ASSERT_TRUE(st->pop(ev, 60000));
  st->request_stop();
  Result r = collect(st);
  EXPECT_EQ(r.reason, FinishReason::stop);
  EXPECT_LT(r.completion_tokens, 2000);
  for (int i = 0; i < 100 && e.metrics().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(e.metrics().running, 0);
  EXPECT_EQ(e.metrics().requests_aborted, 0);
  EXPECT_EQ(e.metrics().requests_finished, 1);
}

// An event-driven consumer: the notifier fires on the engine thread when the queue turns
// non-empty; draining with try_pop sees every event in order, the last one finished.
TEST(EngineStream, NotifyThenTryPopDrainsEveryEvent) {
  Engine e(small_engine());
  e.start();
  auto st = e.submit(greedy({0, 331, 291}, 8));
  std::mutex mu;
  std::condition_variable cv;
  int notified = 0;
  st->set_notify([&] {
    std::lock_guard<std::mutex> lk(mu);
    ++notified;
    cv.notify_one();
  });
  int tokens = 0;
  bool done = false;
  while (!done) {
    {
      std::unique_lock<std::mutex> lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return notified > 0; }));
      notified = 0;
    }
    StreamEvent ev;
    while (st->try_pop(ev)) {
      ASSERT_FALSE(done) << "event after the final one";
      tokens += int(ev.tokens.size());
      done = ev.finished;
    }
  }
  EXPECT_EQ(tokens, 8);
  StreamEvent ev;
  EXPECT_FALSE(st->try_pop(ev));
}

bool contains_run(const std::vector<int32_t>& v, const std::vector<int32_t>& run) {
  return std::search(v.begin(), v.end(), run.begin(), run.end()) != v.end();
}

// vLLM's bad_words through the engine (CPU backend, greedy): a word the model writes, banned,
// never appears as any of its token runs; one of one token and one of several.
TEST(EngineSampling, BadWordsAreNeverGenerated) {
  Engine e(small_engine());
  e.start();
  const auto& tok = e.tokenizer();
  GenerateParams p = greedy(tok.encode("def fibonacci(n):\n", true), 32);
  const Result plain = collect(e.submit(p));
  ASSERT_GE(plain.tokens.size(), 8u);
  for (int width : {1, 2}) {
    // The first run of `width` generated tokens whose text, as a bad word, has a token run
    // the plain output contains (so banning it must change the output).
    std::string word;
    std::vector<std::vector<int32_t>> seqs;
    for (size_t k = 0; k + size_t(width) <= plain.tokens.size() && word.empty(); ++k) {
      std::string w = tok.decode(plain.tokens.data() + k, size_t(width));
      if (w.find_first_not_of(" \t\n\r") == std::string::npos) continue;
      auto ids = bad_word_ids(tok, {w});
      for (auto& s : ids)
        if (int(s.size()) == width && contains_run(plain.tokens, s)) {
          word = w;
          seqs = ids;
        }
    }
    ASSERT_FALSE(word.empty()) << "no " << width << "-token word in the output";
    GenerateParams q = p;
    q.bad_words = {word};
    const Result banned = collect(e.submit(q));
    ASSERT_TRUE(banned.error.empty()) << banned.error;
    EXPECT_NE(banned.tokens, plain.tokens) << "banning '" << word << "' changed nothing";
    for (auto& s : seqs) EXPECT_FALSE(contains_run(banned.tokens, s)) << "'" << word << "' was generated";
  }
  GenerateParams empty = p;
  empty.bad_words = {"\n"};  // whitespace only: nothing to ban is a client error
  EXPECT_THROW(e.submit(empty), InvalidRequest);
}

TEST(EngineSampling, SeededSamplingIsReproducible) {
  Engine e(small_engine());
  e.start();
  GenerateParams p = greedy(e.tokenizer().encode("import os\n", true), 16);
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = 1234;
  Result a = collect(e.submit(p));
  Result b = collect(e.submit(p));
  EXPECT_EQ(a.tokens, b.tokens);
  p.seed = 4321;
  Result c = collect(e.submit(p));
  EXPECT_NE(a.tokens, c.tokens);
}

}  // namespace

namespace {
// The engine's host-side work per step (intake + schedule + batch build + sampling bookkeeping +
// stop checks + streaming) at 64 running requests, without HTTP threads competing for the cores.
// ctest runs the tiny-model cases twice: as is, and with the CPU forward's OpenMP team off the
// engine's core (runtime.EngineHostTimeQuietForward, tests/tests.cmake).
void host_time_at(int n, int max_tokens, const std::string& model = demo_model()) {
  EngineOptions o = small_engine(int64_t(n) * 1024, 16);
  o.model_dir = model;
  o.max_num_seqs = n;
  Engine e(o);
  e.start();
  // The figure: the mean over the steps between a quarter and three quarters of the tokens,
  // all n requests decoding (not the prefill steps, nor the last one, which finishes all n).
  EngineMetrics m0, m;
  EXPECT_EQ(drain_steady(e, n, max_tokens, [&](std::thread::id) { m0 = e.metrics(); }, [&] { m = e.metrics(); }), 0);
  ASSERT_GT(m.steps, m0.steps);
  const double mean_us = (m.step_host_seconds - m0.step_host_seconds) * 1e6 / double(m.steps - m0.steps);
  std::printf("  engine host time per step at %d running requests, %s: %.1f us (engine thread CPU, mean of steps %lld..%lld; "
              "target <= 50 us); EWMA parts: plan %.1f, worker host %.1f, apply %.1f\n",
              n, model.substr(model.rfind('/') + 1).c_str(), mean_us, static_cast<long long>(m0.steps),
              static_cast<long long>(m.steps), m.step_plan_us_mean, m.step_worker_host_us_mean, m.step_apply_us_mean);
  EXPECT_GT(mean_us, 0.0);
  EXPECT_LT(mean_us, 5000.0);  // a guard against pathologies, not the target (shared CI machines)
}

// The demo model's CPU forward shares the cores and caches with the engine thread; the tiny
// fixture's forward hardly does, as a GPU's would not: its figure is the engine's own cost.
TEST(EngineHostTime, SixtyFourRunningRequests) { host_time_at(64, 48); }
TEST(EngineHostTime, SixtyFourRunningRequestsTinyModel) { host_time_at(64, 48, TS_SOURCE_DIR "/tests/data/llama3"); }
TEST(EngineHostTime, OneHundredSixtyRunningRequestsTinyModel) { host_time_at(160, 48, TS_SOURCE_DIR "/tests/data/llama3"); }
}  // namespace

// A Mistral checkpoint with a sliding window (Mistral-7B-v0.1: 4096): each layer attends to the
// last `window` positions only. The Llama fixture's weights as a Mistral with window 8: its
// context is not capped; within the window it computes what the Llama does; past it, a position
// of the 6-layer stack depends only on the last 6 x 7 + 1 tokens -- two prompts that differ
// only before those give the same tokens and logprob bits (the Llama's differ), on every kernel
// path the engine takes (prefill chunks, decodes, mixed steps). Per-layer windows from
// layer_types: all sliding is the Mistral bit for bit; a full last layer reaches back again.
namespace {

// The Llama fixture's weights as a Mistral with sliding window `window`, in a fresh temp dir
// `name`; its config.json's JSON in *cfg.
std::filesystem::path mistral_fixture(const std::string& name, int window, nlohmann::json* cfg_out = nullptr) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(TS_SOURCE_DIR) / "tests/data/llama3";
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::create_symlink(src / f, dir / f);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  cfg["architectures"] = {"MistralForCausalLM"};
  cfg["model_type"] = "mistral";
  cfg["sliding_window"] = window;
  std::ofstream(dir / "config.json") << cfg.dump();
  if (cfg_out) *cfg_out = cfg;
  return dir;
}

// A result's logprobs as bits: the chosen token's, then each top entry's id and logprob.
std::vector<uint32_t> bits(const Result& r) {
  std::vector<uint32_t> v;
  for (const TokenLogprob& lp : r.logprobs) {
    v.push_back(std::bit_cast<uint32_t>(lp.logprob));
    for (auto& [id, l] : lp.top) v.push_back(uint32_t(id)), v.push_back(std::bit_cast<uint32_t>(l));
  }
  return v;
}

}  // namespace

TEST(EngineSlidingWindow, LayersAttendToTheLastWindowTokens) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(TS_SOURCE_DIR) / "tests/data/llama3";
  constexpr int kWindow = 8;
  nlohmann::json cfg;
  const fs::path dir = mistral_fixture("ts_sliding_window_mistral", kWindow, &cfg);
  const int layers = cfg["num_hidden_layers"].get<int>();

  EngineOptions o = small_engine();
  o.model_dir = dir.string();
  o.chunked_prefill_size = 32;  // prompts in several chunks, beside other requests' decodes
  Engine mistral(o);
  mistral.start();
  o.model_dir = src.string();
  Engine llama(o);
  llama.start();
  EXPECT_EQ(mistral.context_length(), llama.context_length());
  EXPECT_GT(mistral.context_length(), 4 * kWindow);

  // Within the window (prompt + output <= 8 tokens) the two models are the same computation.
  const std::vector<int32_t> short_prompt{101, 102, 103, 104};
  EXPECT_EQ(collect(mistral.submit(greedy(short_prompt, 4))).tokens, collect(llama.submit(greedy(short_prompt, 4))).tokens);

  // Prompts a and b differ in their first 10 tokens only; 100 tokens long, so position 99 and
  // later see identical tokens within the stack's reach (layers x (window - 1) back).
  std::vector<int32_t> a, b;
  for (int i = 0; i < 100; ++i) a.push_back(100 + (i * 37) % 300);
  b = a;
  for (int i = 0; i < 10; ++i) b[size_t(i)] = 900 + i;
  ASSERT_LT(10 + layers * (kWindow - 1), 100);
  auto run = [&](Engine& e, const std::vector<int32_t>& prompt) {
    GenerateParams p = greedy(prompt, 12);
    p.logprobs = 3;
    // Beside other requests: their decodes and this prompt's chunks share steps.
    std::vector<std::shared_ptr<Stream>> others;
    for (int k = 0; k < 3; ++k) others.push_back(e.submit(greedy({int32_t(200 + k), 201, 202}, 20)));
    Result r = collect(e.submit(p));
    for (auto& s : others) EXPECT_TRUE(collect(s).error.empty());
    return r;
  };
  const Result ma = run(mistral, a), mb = run(mistral, b);
  ASSERT_TRUE(ma.error.empty() && mb.error.empty()) << ma.error << mb.error;
  ASSERT_EQ(ma.logprobs.size(), 12u);
  EXPECT_EQ(ma.tokens, mb.tokens);
  EXPECT_EQ(bits(ma), bits(mb)) << "a sliding-window layer read a token outside its window";
  const Result la = run(llama, a), lb = run(llama, b);
  EXPECT_NE(bits(la), bits(lb)) << "full attention: the first tokens reach every position";
  EXPECT_NE(bits(ma), bits(la)) << "the window changed nothing past it";

  // Per-layer windows from layer_types (Qwen2 / Gemma-style configs): only the last layer
  // full reaches back to the first tokens again; every layer sliding is the Mistral.
  auto with_types = [&](const std::vector<std::string>& types) {
    nlohmann::json c = cfg;
    c["layer_types"] = types;
    std::ofstream(dir / "config.json") << c.dump();
    o.model_dir = dir.string();
    Engine e(o);
    e.start();
    const Result ra = run(e, a), rb = run(e, b);
    return std::make_pair(bits(ra), bits(rb));
  };
  std::vector<std::string> types(size_t(layers), "sliding_attention");
  const auto all_sliding = with_types(types);
  EXPECT_EQ(all_sliding.first, bits(ma));
  EXPECT_EQ(all_sliding.second, bits(mb));
  types.back() = "full_attention";
  const auto last_full = with_types(types);
  EXPECT_NE(last_full.first, last_full.second) << "a full layer reads the first tokens";
  EXPECT_NE(last_full.first, bits(ma));
  fs::remove_all(dir);
}

// Every layer slides: a sequence's blocks below its window (plus the kernels' read slack) go
// back to the pool as it advances (KvCache::set_window_release), so a 760-token conversation
// runs in a 320-token pool -- with the tokens and logprob bits of a pool that never reuses a
// released block (a read below the window would see another position's K/V there). The Llama
// (full attention) cannot take that request in that pool.
TEST(EngineSlidingWindow, BlocksBelowTheWindowGoBackToThePool) {
  namespace fs = std::filesystem;
  constexpr int kWindow = 24;
  const fs::path dir = mistral_fixture("ts_sliding_window_release", kWindow);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 700; ++i) prompt.push_back(100 + (i * 53) % 700);
  int cached2 = 0;  // the next turn's prefix hit
  auto run = [&](const std::string& model, int64_t pool, int tp = 1) {
    EngineOptions o = small_engine(pool, 16);
    o.model_dir = model;
    o.parallel.tp_size = tp;
    o.chunked_prefill_size = 48;
    Engine e(o);
    e.start();
    GenerateParams p = greedy(prompt, 60);
    p.logprobs = 2;
    std::vector<std::shared_ptr<Stream>> others;  // decodes beside its chunks
    for (int k = 0; k < 2; ++k) others.push_back(e.submit(greedy({int32_t(300 + k), 301, 302}, 30)));
    Result r = collect(e.submit(p));
    for (auto& s : others) EXPECT_TRUE(collect(s).error.empty());
    // The same conversation's next turn: the blocks it left cached are reused where present.
    std::vector<int32_t> turn2 = prompt;
    turn2.insert(turn2.end(), r.tokens.begin(), r.tokens.end());
    for (int i = 0; i < 20; ++i) turn2.push_back(200 + i);
    Result r2 = collect(e.submit(greedy(turn2, 10)));
    EXPECT_TRUE(r2.error.empty()) << r2.error;
    // Prompt logprobs of the whole prompt: a pass that takes and gives back blocks per chunk.
    PromptPassRequest pp;
    pp.ids = prompt;
    pp.logprobs = 1;
    PromptPassResult pr = e.prompt_pass(pp);
    EXPECT_TRUE(pr.error.empty()) << pr.error;
    EXPECT_EQ(pr.logprobs.size(), prompt.size() - 1);
    for (const TokenLogprob& lp : pr.logprobs) r2.tokens.push_back(int32_t(std::bit_cast<uint32_t>(lp.logprob)));
    cached2 = r2.cached_tokens;
    return std::make_pair(r, r2.tokens);
  };
  const auto small = run(dir.string(), 320);
  // The pool evicted the turn's first blocks, but the blocks its window reads were cached: the
  // next turn hits (KvCache::match_prefix's window path) most of its 760 + 20 tokens.
  EXPECT_GT(cached2, 700);
  const auto big = run(dir.string(), 16384);
  const auto tp2 = run(dir.string(), 320, 2);  // two CPU ranks, each its shard of the same blocks
  ASSERT_TRUE(small.first.error.empty()) << small.first.error;
  ASSERT_EQ(small.first.tokens.size(), 60u);
  EXPECT_EQ(small.first.tokens, big.first.tokens);
  EXPECT_EQ(bits(small.first), bits(big.first)) << "a layer read a released block";
  EXPECT_EQ(small.second, big.second);
  EXPECT_EQ(tp2.first.tokens, small.first.tokens);
  EXPECT_EQ(tp2.second.size(), small.second.size());
  EngineOptions o = small_engine(320, 16);
  o.model_dir = (fs::path(TS_SOURCE_DIR) / "tests/data/llama3").string();
  Engine llama(o);
  llama.start();
  EXPECT_LT(llama.context_length(), 320);
  EXPECT_THROW(llama.submit(greedy(prompt, 60)), InvalidRequest);
  fs::remove_all(dir);
}
