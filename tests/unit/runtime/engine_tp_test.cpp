// The engine on CPU ranks (--device cpu --tp-size 2: two rank threads over the CPU Comm
// backend, the GPU TP worker path): batching, chunked prefill and prefix reuse give
// the TP 1 greedy tokens. Row-parallel sums differ from TP 1 by fp32 rounding only, far below
// the demo model's top-2 logit gaps on these prompts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "io/safetensors.h"

using namespace ts;
using namespace ts::test;

namespace {

EngineOptions tp2(EngineOptions o) {
  o.parallel.tp_size = 2;
  return o;
}

}  // namespace

TEST(EngineTp, BatchChunksAndPrefixReuseEqualTp1) {
  Engine ref(small_engine());
  ref.start();
  auto prompts = code_prompts(ref, 4);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 6));
  auto solo = run_all(ref, ps, false);

  EngineOptions o = tp2(small_engine());
  o.chunked_prefill_size = 7;  // several prefill chunks per prompt, mixed with decodes
  Engine e(o);
  e.start();
  expect_batched_then_cached_equal(e, ps, solo);
}

// Retraction under a tiny pool at TP 2: every rank's pool loses the same blocks at the same step
// (one KvCache drives them all), and the recomputed requests give the TP 1 tokens.
TEST(EngineTp, RetractionEqualsTp1) {
  Engine ref(small_engine());
  ref.start();
  auto prompts = code_prompts(ref, 4);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 24));
  auto solo = run_all(ref, ps, false);

  Engine e(tp2(small_engine(/*pool_tokens=*/128, /*block=*/16)));
  e.start();
  auto conc = run_all(e, ps, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
    EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "prompt " << i;
  }
  EXPECT_GT(e.metrics().retractions, 0);
}

namespace {

EngineOptions eagle3(EngineOptions o) {
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = demo_draft();
  o.speculative_num_steps = 3;
  return o;
}

// Greedy EAGLE3 requests with their traces (drafts and accepted count per verify).
std::vector<Result> spec_run(Engine& e, const std::vector<std::vector<int32_t>>& prompts, bool concurrent) {
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) {
    ps.push_back(greedy(p, 24));
    ps.back().return_spec_trace = true;
  }
  return run_all(e, ps, concurrent);
}

}  // namespace

// EAGLE3 on a TP 2 target (CPU ranks): the draft runs on rank 0 with the target's embedding
// layout — rebuilt as a replicated table when the target's is vocab-parallel (the default at
// TP 2), shared when the target replicates it (--replicate-embedding). Either way every
// iteration's drafts and accepted counts equal TP 1's (the target logits differ from TP 1 by
// fp32 rounding only, far below the demo pair's top-2 gaps), and the tokens equal plain decoding.
TEST(EngineTp, Eagle3EqualsTp1Eagle3AndPlain) {
  Engine plain(small_engine());
  plain.start();
  auto prompts = code_prompts(plain, 3);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 24));
  auto want = run_all(plain, ps, false);

  Engine spec1(eagle3(small_engine()));
  spec1.start();
  auto tp1 = spec_run(spec1, prompts, false);
  for (bool replicate : {false, true}) {
    EngineOptions o = eagle3(tp2(small_engine()));
    o.replicate_embedding = replicate;
    o.chunked_prefill_size = 9;  // prefill chunks mixed with speculative decodes
    Engine e(o);
    e.start();
    for (bool concurrent : {false, true}) {
      auto got = spec_run(e, prompts, concurrent);
      for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE(testing::Message() << "replicate " << replicate << " concurrent " << concurrent << " prompt " << i);
        EXPECT_TRUE(got[i].error.empty()) << got[i].error;
        EXPECT_EQ(got[i].tokens, want[i].tokens) << "EAGLE3 at TP 2 vs plain TP 1";
        EXPECT_FALSE(got[i].trace.empty());
        if (!concurrent) {
          EXPECT_EQ(got[i].trace, tp1[i].trace) << "drafts / accepted per verify vs TP 1";
        }
      }
    }
  }
}

namespace {

// The llama3 fixture as transformers' Llama with attention_bias: true, which biases o_proj as
// well as q/k/v: zero q/k/v biases, o_proj.bias drawn N(0, o_scale) (o_scale 0: the fixture
// without any bias tensor, attention_bias false).
std::string llama_with_o_bias(const std::string& name, float o_scale) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(TS_SOURCE_DIR) / "tests/data/llama3";
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) fs::create_symlink(src / f, dir / f);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  io::Checkpoint ck = io::Checkpoint::open(src.string());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : ck.names()) tensors.emplace_back(n, ck.get(n));
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, o_scale);
  const int64_t H = cfg["hidden_size"].get<int64_t>(), hd = cfg["head_dim"].get<int64_t>();
  const int64_t nh = cfg["num_attention_heads"].get<int64_t>(), nkv = cfg["num_key_value_heads"].get<int64_t>();
  auto filled = [&](int64_t n, bool random) {
    Tensor t = Tensor::zeros({n}, DType::f32);
    if (random)
      for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = d(g);
    return t;
  };
  if (o_scale > 0.0f) {
    cfg["attention_bias"] = true;
    for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".self_attn.";
      tensors.emplace_back(pre + "q_proj.bias", filled(nh * hd, false));
      tensors.emplace_back(pre + "k_proj.bias", filled(nkv * hd, false));
      tensors.emplace_back(pre + "v_proj.bias", filled(nkv * hd, false));
      tensors.emplace_back(pre + "o_proj.bias", filled(H, true));
    }
  }
  io::write_safetensors((dir / "model.safetensors").string(), tensors);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

}  // namespace

// o_proj.bias (Llama / Qwen3 attention_bias): applied -- the outputs move -- and added once at
// TP 2, where o_proj is row-parallel and only the first head shard's rank holds the bias: its
// logprobs equal TP 1's to fp32 rounding (a bias added on both ranks moves them by far more).
TEST(EngineTp, OProjBiasIsAddedOnce) {
  const std::string plain = llama_with_o_bias("ts_o_bias_plain", 0.0f), biased = llama_with_o_bias("ts_o_bias", 0.5f);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(100 + (i * 13) % 400);
  GenerateParams p = greedy(prompt, 8);
  p.logprobs = 4;
  auto run = [&](const std::string& model, int tp) {
    EngineOptions o = small_engine();
    o.model_dir = model;
    o.parallel.tp_size = tp;
    Engine e(o);
    e.start();
    Result r = collect(e.submit(p));
    EXPECT_TRUE(r.error.empty()) << r.error;
    return r;
  };
  const Result base = run(plain, 1), one = run(biased, 1), two = run(biased, 2);
  ASSERT_EQ(one.logprobs.size(), 8u);
  ASSERT_EQ(two.logprobs.size(), 8u);
  ASSERT_EQ(base.logprobs.size(), 8u);
  EXPECT_EQ(one.tokens, two.tokens);
  double moved = 0, tp_diff = 0;
  for (size_t i = 0; i < 8; ++i) {
    ASSERT_EQ(one.logprobs[i].top.size(), two.logprobs[i].top.size());
    for (size_t j = 0; j < one.logprobs[i].top.size(); ++j) {
      EXPECT_EQ(one.logprobs[i].top[j].first, two.logprobs[i].top[j].first) << "token " << i << " rank " << j;
      tp_diff = std::max(tp_diff, double(std::fabs(one.logprobs[i].top[j].second - two.logprobs[i].top[j].second)));
    }
  }
  moved = std::fabs(double(one.logprobs[0].top[0].second) - double(base.logprobs[0].top[0].second)) +
          (one.logprobs[0].top[0].first != base.logprobs[0].top[0].first ? 1.0 : 0.0);
  EXPECT_LT(tp_diff, 1e-3) << "TP 2's logprobs vs TP 1's";
  EXPECT_GT(moved, 1e-2) << "the bias changed nothing";
  std::filesystem::remove_all(plain);
  std::filesystem::remove_all(biased);
}
