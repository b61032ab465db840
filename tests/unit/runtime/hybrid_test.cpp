// Hybrid models (Qwen3.5: Gated DeltaNet + full attention) through the engine on the CPU: the
// recurrent state carried in per-request slots must make greedy output independent of chunk
// size (1, 7, whole), batching and retraction; prefix reuse is off; unsupported combinations
// (CUDA, tensor parallel, EAGLE3) fail at startup with a clear message.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine_test_util.h"
#include "models/model.h"
#include "runtime/model_runner.h"

using namespace ts;
using namespace ts::test;

namespace {

std::string hybrid_model() { return std::string(TS_SOURCE_DIR) + "/tests/data/qwen3_5"; }

EngineOptions hybrid_engine(int chunk = 8192, int64_t pool_tokens = 4096) {
  EngineOptions o;
  o.model_dir = hybrid_model();
  o.device = "cpu";
  o.max_total_tokens = pool_tokens;
  o.block_size = 16;
  o.chunked_prefill_size = chunk;
  return o;
}

// Prompts of varied lengths (1 token included), ids inside the fixture's vocabulary.
std::vector<std::vector<int32_t>> prompts(int n) {
  std::mt19937 g(42);
  std::uniform_int_distribution<int32_t> id(3, 1000);
  std::vector<int> lens{1, 5, 17, 33, 2, 64, 9, 40};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(static_cast<size_t>(lens[size_t(i) % lens.size()]));
    for (auto& t : p) t = id(g);
    out.push_back(p);
  }
  return out;
}

// The fixture's model vocabulary (1088) is padded past its tokenizer's (1024): greedy decoding of
// its random weights reaches those ids, which decode to no text and do not end the request.
std::vector<Result> run(Engine& e, const std::vector<std::vector<int32_t>>& ps, int max_tokens, bool concurrent) {
  std::vector<Result> out;
  if (concurrent) {
    std::vector<std::shared_ptr<Stream>> st;
    for (auto& p : ps) st.push_back(e.submit(greedy(p, max_tokens)));
    for (auto& s : st) out.push_back(collect(s));
  } else {
    for (auto& p : ps) out.push_back(collect(e.submit(greedy(p, max_tokens))));
  }
  return out;
}

TEST(HybridEngine, MatchesTransformersGreedy) {
  // The engine path (slots, chunked prefill at 7) reproduces the golden greedy continuation.
  std::ifstream f(hybrid_model() + "/golden.json");
  nlohmann::json g = nlohmann::json::parse(f);
  Engine e(hybrid_engine(7));
  e.start();
  for (size_t i = 0; i < g["prompts"].size(); ++i) {
    auto p = g["prompts"][i].get<std::vector<int32_t>>();
    auto want = g["greedy"][i].get<std::vector<int32_t>>();
    Result r = collect(e.submit(greedy(p, int(want.size()))));
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.tokens, want) << "prompt " << i;
  }
}

TEST(HybridEngine, ChunkSizesAndBatchingEqualSolo) {
  auto ps = prompts(8);
  Engine ref(hybrid_engine());
  ref.start();
  auto solo = run(ref, ps, 10, false);
  size_t generated = 0;
  for (auto& s : solo) {
    ASSERT_TRUE(s.error.empty()) << s.error;
    generated += s.tokens.size();
  }
  EXPECT_GE(generated, 40u);  // most requests run well past their prefill
  for (int chunk : {1, 7, 8192}) {
    Engine e(hybrid_engine(chunk));
    e.start();
    auto conc = run(e, ps, 10, true);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
      EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "chunk " << chunk << " prompt " << i << " (" << ps[i].size() << " tokens)";
    }
    // Slots were given back: the same prompts again, one by one, in the same engine.
    auto again = run(e, ps, 10, false);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(again[i].tokens, solo[i].tokens) << "rerun, chunk " << chunk;
  }
}

TEST(HybridEngine, NoPrefixReuse) {
  Engine e(hybrid_engine());
  e.start();
  auto p = prompts(6)[5];  // 64 tokens: four full blocks
  Result a = collect(e.submit(greedy(p, 4)));
  Result b = collect(e.submit(greedy(p, 4)));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.cached_tokens, 0);
}

TEST(HybridEngine, RetractionRestartsStateAndStillMatchesSolo) {
  auto ps = prompts(16);
  Engine ref(hybrid_engine());
  ref.start();
  auto solo = run(ref, ps, 30, false);
  Engine e(hybrid_engine(8192, /*pool_tokens=*/96));
  e.start();
  auto conc = run(e, ps, 30, true);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(conc[i].error.empty()) << conc[i].error;
    EXPECT_EQ(conc[i].tokens, solo[i].tokens) << "prompt " << i;
  }
  EXPECT_GT(e.metrics().retractions, 0);
}

TEST(HybridRunner, ZeroTokenBatchAndSlotRequired) {
  std::shared_ptr<models::Model> m = models::load_model(hybrid_model(), {});
  ModelRunner runner(m, 8, 16, 2);
  ASSERT_TRUE(runner.has_state());
  Tensor none = runner.run({});
  EXPECT_EQ(none.size(0), 0);
  std::vector<int32_t> table{0}, ids{5};
  SeqChunk c{ids.data(), 1, 0, &table, SeqChunk::Logits::last};
  try {
    runner.run({c});
    FAIL() << "a sequence without a state slot must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent-state slot"), std::string::npos) << e.what();
  }
  auto a = runner.take_state_slot(), b = runner.take_state_slot();
  EXPECT_THROW(runner.take_state_slot(), std::exception);  // two rows, both held
  a.reset();
  EXPECT_NO_THROW(runner.take_state_slot());
}

void expect_load_error(const models::LoadOptions& lo, const std::string& what) {
  try {
    models::load_model(hybrid_model(), lo);
    FAIL() << "expected an error containing '" << what << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(HybridModel, UnsupportedCombinationsFailClearly) {
  models::LoadOptions cuda;
  cuda.device = Device::cuda;
  expect_load_error(cuda, "qwen3_5 on cuda is not implemented");
  models::LoadOptions tp;
  tp.mapping.tp_size = 2;
  expect_load_error(tp, "--tp-size 2 needs a communicator");  // TP itself runs (CPU ranks: golden_tp2_qwen3_5)
  models::LoadOptions eagle;
  eagle.capture_layers = {1, 2, 3};
  expect_load_error(eagle, "EAGLE3 speculative decoding is not supported");
  EngineOptions o = hybrid_engine();
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = demo_draft();
  try {
    Engine e(o);
    FAIL() << "EAGLE3 with a hybrid model must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
  }
}

}  // namespace
