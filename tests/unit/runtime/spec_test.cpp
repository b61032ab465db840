// EAGLE3 on the CPU (fp32): the demo pair reproduces ../models/pycoder-eagle3/spec_golden.json
// exactly (plain greedy tokens, every iteration's drafts and accepted count), speculation is
// lossless for the trained draft and for a random-weight draft, stops inside an accepted run
// end the request there, and rejection sampling leaves the target distribution unchanged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine_test_util.h"
#include "io/safetensors.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::test;
namespace fs = std::filesystem;

namespace {

nlohmann::json spec_golden() {
  std::ifstream f(demo_draft() + "/spec_golden.json");
  return nlohmann::json::parse(f);
}

EngineOptions spec_engine(const std::string& draft) {
  EngineOptions o = small_engine();
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = draft;
  o.speculative_num_steps = 3;
  return o;
}

TEST(SpecGolden, PlainGreedyMatchesGolden) {
  Engine e(small_engine());
  e.start();
  const auto golden = spec_golden();  // (a range-for over a temporary's member dangles)
  for (auto& t : golden["traces"]) {
    Result r = collect(e.submit(greedy(t["prompt"].get<std::vector<int32_t>>(), 64)));
    EXPECT_EQ(r.tokens, t["greedy"].get<std::vector<int32_t>>());
  }
}

TEST(SpecGolden, Eagle3TracesMatchExactly) {
  auto g = spec_golden();
  Engine e(spec_engine(demo_draft()));
  e.start();
  double steps = 0, tokens = 0;
  for (auto& t : g["traces"]) {
    GenerateParams p = greedy(t["prompt"].get<std::vector<int32_t>>(), 64);
    p.return_spec_trace = true;
    Result r = collect(e.submit(p));
    EXPECT_EQ(r.tokens, t["greedy"].get<std::vector<int32_t>>()) << "lossless";
    ASSERT_EQ(r.trace.size(), t["iterations"].size());
    for (size_t i = 0; i < r.trace.size(); ++i) {
      EXPECT_EQ(r.trace[i].first, t["iterations"][i]["drafts"].get<std::vector<int32_t>>()) << "iteration " << i;
      EXPECT_EQ(r.trace[i].second, t["iterations"][i]["accepted"].get<int>()) << "iteration " << i;
      steps += 1;
      tokens += r.trace[i].second + 1;
    }
  }
  // Metrics are published at the end of the engine step, just after the final event is sent.
  EngineMetrics m = e.metrics();
  for (int i = 0; i < 200 && double(m.spec_verify_steps) < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = e.metrics();
  }
  EXPECT_EQ(double(m.spec_verify_steps), steps);
  EXPECT_GT(tokens / steps, 2.5);  // the demo pair accepts ~2.9 tokens per verify on these prompts
  // One request at a time: every decode step takes the fixed-shape path (the graph path's shapes).
  EXPECT_GT(m.spec_fixed_steps, 0);
  EXPECT_GT(m.spec_draft_seconds, 0.0);
  EXPECT_GT(m.spec_verify_seconds, 0.0);
}

// A draft with the demo draft's shapes and random weights: speculation must still be lossless.
std::string random_draft() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = (fs::temp_directory_path() / "ts_random_eagle3").string();
  fs::create_directories(dir);
  fs::copy_file(demo_draft() + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
  io::SafetensorsFile src(demo_draft() + "/model.safetensors");
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& name : src.names()) {
    Tensor t = src.get(name);
    Tensor c = Tensor::empty(t.dims(), t.dtype);
    std::memcpy(c.data, t.data, t.nbytes());
    if (t.dtype == DType::bf16)
      for (int64_t i = 0; i < c.numel(); ++i) c.ptr<uint16_t>()[i] = f32_to_bf16(name.find("norm") != std::string::npos ? 1.0f : nd(rng));
    out.emplace_back(name, c);
  }
  io::write_safetensors(dir + "/model.safetensors", out);
  return dir;
}

TEST(SpecLossless, RandomDraftEqualsPlainGreedy) {
  Engine plain(small_engine());
  plain.start();
  Engine spec(spec_engine(random_draft()));
  spec.start();
  auto prompts = code_prompts(plain, 6);
  std::vector<std::shared_ptr<Stream>> batch;
  for (auto& p : prompts) batch.push_back(spec.submit(greedy(p, 24)));  // many requests, one batch
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result want = collect(plain.submit(greedy(prompts[i], 24)));
    Result got = collect(batch[i]);
    EXPECT_EQ(got.tokens, want.tokens) << "prompt " << i;
    EXPECT_EQ(got.completion_tokens, 24);
  }
}

TEST(SpecLossless, TrainedDraftWithChunkedPrefillAndPrefixReuse) {
  EngineOptions o = spec_engine(demo_draft());
  o.chunked_prefill_size = 5;
  Engine spec(o);
  spec.start();
  Engine plain(small_engine());
  plain.start();
  auto prompts = code_prompts(plain, 4);
  for (int round = 0; round < 2; ++round)  // the second round reuses cached prefix blocks
    for (auto& p : prompts) EXPECT_EQ(collect(spec.submit(greedy(p, 20))).tokens, collect(plain.submit(greedy(p, 20))).tokens);
}

// --kv-cache-dtype fp8 with EAGLE3: the target and the draft caches are both e4m3 (the draft's
// follows the target's type); speculation stays lossless against plain decoding over the same
// FP8 cache, across a batch and over cached prefixes.
TEST(SpecLossless, TrainedDraftOverAnFp8KvCache) {
  EngineOptions o = spec_engine(demo_draft()), p = small_engine();
  o.kv_cache_dtype = p.kv_cache_dtype = "fp8";
  Engine spec(o), plain(p);
  spec.start();
  plain.start();
  auto prompts = code_prompts(plain, 4);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<Stream>> batch;
    for (auto& q : prompts) batch.push_back(spec.submit(greedy(q, 20)));
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(collect(batch[i]).tokens, collect(plain.submit(greedy(prompts[i], 20))).tokens) << "round " << round << " prompt " << i;
  }
}

// Penalties and logprobs force host acceptance between the verify and the catch-up; greedy
// with a repetition penalty is still deterministic, so speculation must equal plain decoding.
TEST(SpecLossless, HostAcceptanceWithPenaltiesAndLogprobsEqualsPlain) {
  Engine plain(small_engine());
  plain.start();
  Engine spec(spec_engine(demo_draft()));
  spec.start();
  for (auto& p : code_prompts(plain, 3)) {
    GenerateParams g = greedy(p, 24);
    g.repetition_penalty = 1.3f;
    g.frequency_penalty = 0.2f;
    g.logprobs = 2;
    Result want = collect(plain.submit(g));
    Result got = collect(spec.submit(g));
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4);
  }
}

// Seeded sampling through rejection sampling: reproducible, exact token counts, and several
// requests with different parameters in one fixed-shape step.
TEST(SpecSampling, SeededSamplingIsReproducibleInABatch) {
  Engine spec(spec_engine(demo_draft()));
  spec.start();
  auto prompts = code_prompts(spec, 3);
  auto params = [&](size_t i) {
    GenerateParams g = greedy(prompts[i], 30);
    g.temperature = i == 0 ? 0.0f : 0.8f;
    g.top_p = 0.9f;
    g.seed = 11 + i;
    return g;
  };
  std::vector<Result> first, second;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<Stream>> s;
    for (size_t i = 0; i < prompts.size(); ++i) s.push_back(spec.submit(params(i)));
    for (auto& st : s) (round ? second : first).push_back(collect(st));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(first[i].tokens, second[i].tokens) << "request " << i;
    EXPECT_EQ(first[i].completion_tokens, 30);
  }
}

// A small token budget staggers the prefills: steps then hold decodes (fixed-shape step) and
// prefill chunks (mixed step after it) together. Output still equals plain greedy.
TEST(SpecLossless, DecodesAndPrefillChunksInOneStep) {
  EngineOptions o = spec_engine(demo_draft());
  o.chunked_prefill_size = 12;
  Engine spec(o);
  spec.start();
  Engine plain(small_engine());
  plain.start();
  auto prompts = code_prompts(plain, 4);
  prompts.push_back({prompts[0][0]});  // a 1-token prompt
  std::vector<std::shared_ptr<Stream>> batch;
  for (auto& p : prompts) batch.push_back(spec.submit(greedy(p, 16)));
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(collect(batch[i]).tokens, collect(plain.submit(greedy(prompts[i], 16))).tokens) << "prompt " << i;
  // max_tokens 1: the prefill's sample is the whole answer.
  Result one = collect(spec.submit(greedy(prompts[1], 1)));
  EXPECT_EQ(one.completion_tokens, 1);
  EXPECT_EQ(one.tokens, collect(plain.submit(greedy(prompts[1], 1))).tokens);
}

// Each request's draft state lives in a pool row that must come back when the request ends:
// far more requests than the pool has rows (2 * max_num_seqs + 16) run one after another.
TEST(SpecLossless, DraftStateRowsAreReturned) {
  EngineOptions o = spec_engine(demo_draft());
  o.max_num_seqs = 2;
  Engine spec(o);
  spec.start();
  auto prompts = code_prompts(spec, 2);
  for (int i = 0; i < 30; ++i) {
    Result r = collect(spec.submit(greedy(prompts[size_t(i % 2)], 3)));
    ASSERT_TRUE(r.error.empty()) << "request " << i << ": " << r.error;
    ASSERT_EQ(r.completion_tokens, 3);
  }
}

TEST(SpecStops, StopInsideAcceptedRun) {
  auto t = spec_golden()["traces"][0];
  auto prompt = t["prompt"].get<std::vector<int32_t>>();
  auto want = t["greedy"].get<std::vector<int32_t>>();
  Engine e(spec_engine(demo_draft()));
  e.start();
  // max_tokens that ends in the middle of a 4-token accepted run.
  Result r = collect(e.submit(greedy(prompt, 6)));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + 6));
  EXPECT_EQ(r.completion_tokens, 6);
  EXPECT_EQ(r.reason, FinishReason::length);
  // A stop token id that appears inside an accepted run: nothing after it is emitted.
  GenerateParams p = greedy(prompt, 40);
  p.stop_token_ids = {want[2]};
  Result s = collect(e.submit(p));
  EXPECT_EQ(s.tokens, std::vector<int32_t>(want.begin(), want.begin() + 3));
  EXPECT_EQ(s.reason, FinishReason::stop);
  EXPECT_EQ(s.completion_tokens, 3);
}

TEST(SpecSampling, RejectionSamplingPreservesTheTargetDistribution) {
  // A 6-token vocabulary; for each draft token (likely, unlikely, impossible) the verified
  // token over many seeds must follow p — chi-square against p with a generous bound.
  const std::vector<float> p = {0.40f, 0.25f, 0.15f, 0.10f, 0.10f, 0.0f};
  for (int32_t draft : {0, 3, 5}) {
    std::vector<int> count(p.size(), 0);
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      std::vector<float> q = p;
      bool accepted = false;
      ++count[size_t(verify_draft_token(q, draft, uint64_t(i) * 7919 + 13, 0, accepted))];
    }
    double chi2 = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      if (p[k] == 0) {
        EXPECT_EQ(count[k], 0) << "draft " << draft << " emitted an impossible token";
        continue;
      }
      double e = p[k] * n;
      chi2 += (count[k] - e) * (count[k] - e) / e;
    }
    EXPECT_LT(chi2, 25.0) << "draft " << draft;  // 4 degrees of freedom: p < 1e-4
  }
}

TEST(SpecConfig, OnlyChainDraftingIsAccepted) {
  EngineOptions o = spec_engine(demo_draft());
  o.speculative_eagle_topk = 4;
  try {
    Engine e(o);
    FAIL() << "topk 4 accepted";
  } catch (const Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("speculative-eagle-topk"), std::string::npos) << ex.what();
  }
}

}  // namespace
