// Batch invariance of the MoE / MLA / sparse-attention architectures: two different prompts in
// one ModelRunner step give bit-identical logits to each prompt run alone, and so does a decode
// step batched with another sequence's prefill chunk.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "models/model.h"
#include "runtime/model_runner.h"

using namespace ts;

namespace {

std::string fixture(const char* name) { return std::string(TS_SOURCE_DIR) + "/tests/data/" + name; }

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((seed * 131 + i * 37) % 1000 + 5);
  return p;
}

Tensor copy(const Tensor& t) { return t.to_f32(); }

void check_invariant(const char* name, int len_a, int len_b) {
  models::LoadOptions lo;
  std::shared_ptr<models::Model> model = models::load_model(fixture(name), lo);
  const int bs = 16, blocks_per_seq = (std::max(len_a, len_b) + 2) / bs + 2;
  auto a = prompt(len_a, 1), b = prompt(len_b, 2);
  std::vector<int32_t> ta(static_cast<size_t>(blocks_per_seq)), tb(static_cast<size_t>(blocks_per_seq));
  std::iota(ta.begin(), ta.end(), 0);
  std::iota(tb.begin(), tb.end(), blocks_per_seq);
  const int64_t V = model->config().vocab_size;
  // Alone, every row's logits, then one decode step each.
  Tensor alone_a, alone_b, dec_a, dec_b;
  int32_t next_a = 7, next_b = 11;
  {
    ModelRunner r(model, 2 * blocks_per_seq, bs);
    alone_a = copy(r.run({SeqChunk{a.data(), len_a, 0, &ta, SeqChunk::Logits::all}}));
    dec_a = copy(r.run({SeqChunk{&next_a, 1, len_a, &ta, SeqChunk::Logits::last}}));
  }
  {
    ModelRunner r(model, 2 * blocks_per_seq, bs);
    alone_b = copy(r.run({SeqChunk{b.data(), len_b, 0, &tb, SeqChunk::Logits::all}}));
    dec_b = copy(r.run({SeqChunk{&next_b, 1, len_b, &tb, SeqChunk::Logits::last}}));
  }
  ModelRunner r(model, 2 * blocks_per_seq, bs);
  // Both prefills in one step.
  Tensor both = copy(r.run({SeqChunk{a.data(), len_a, 0, &ta, SeqChunk::Logits::all},
                            SeqChunk{b.data(), len_b, 0, &tb, SeqChunk::Logits::all}}));
  ASSERT_EQ(both.size(0), len_a + len_b);
  EXPECT_EQ(0, std::memcmp(both.data, alone_a.data, size_t(len_a * V) * 4)) << name << ": prompt A differs in a batch";
  EXPECT_EQ(0, std::memcmp(both.ptr<float>() + len_a * V, alone_b.data, size_t(len_b * V) * 4))
      << name << ": prompt B differs in a batch";
  // Both decodes in one step.
  Tensor dec = copy(r.run({SeqChunk{&next_a, 1, len_a, &ta, SeqChunk::Logits::last},
                           SeqChunk{&next_b, 1, len_b, &tb, SeqChunk::Logits::last}}));
  EXPECT_EQ(0, std::memcmp(dec.data, dec_a.data, size_t(V) * 4)) << name << ": decode A differs in a batch";
  EXPECT_EQ(0, std::memcmp(dec.ptr<float>() + V, dec_b.data, size_t(V) * 4)) << name << ": decode B differs in a batch";
}

}  // namespace

// Prompt lengths span several 16-token blocks so that MiniMax-M3's indexer is selective.
TEST(BatchInvariance, Qwen3Moe) { check_invariant("qwen3_moe", 23, 9); }
TEST(BatchInvariance, DeepseekV3) { check_invariant("deepseek_v3", 23, 9); }
TEST(BatchInvariance, MiniMaxM3) { check_invariant("minimax_m3", 150, 97); }
