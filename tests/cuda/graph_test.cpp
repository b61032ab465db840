// CUDA graphs: every decode bucket and every breakable prefill bucket replays the same logits
// as eager execution (bf16 tolerance: padded batches change GEMM shapes), on random batches
// with mixed lengths, cached prefixes and padding; a failed capture falls back to eager.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/device_memory.h"
#include "models/model.h"
#include "ops/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/model_runner.h"
#include "ops/cpu/cpu_ops.h"

using namespace ts;

namespace {

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

std::shared_ptr<models::Model> demo() {
  static std::shared_ptr<models::Model> m;
  if (!m) {
    models::LoadOptions lo;
    lo.device = Device::cuda;
    m = models::load_model(std::string(TS_SOURCE_DIR) + "/models/pycoder", lo);
  }
  return m;
}

double rel_err(const Tensor& a, const Tensor& b) {
  Tensor x = a.to_f32(), y = b.to_f32();
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double d = double(x.ptr<float>()[i]) - y.ptr<float>()[i];
    num += d * d;
    den += double(y.ptr<float>()[i]) * y.ptr<float>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Seq {
  std::vector<int32_t> tokens, table;
};

// Two runners over one model: `eager` never uses graphs, `graphed` captured them.
struct Pair {
  std::unique_ptr<ModelRunner> eager, graphed;
  Pair(int max_bs, int max_prefill, bool fail_capture = false) {
    eager = std::make_unique<ModelRunner>(demo(), 512, 16);
    graphed = std::make_unique<ModelRunner>(demo(), 512, 16);
    GraphOptions g;
    g.max_bs = max_bs;
    g.max_prefill_tokens = max_prefill;
    g.max_context = 2048;
    g.eager_max_tokens = 2048;
    g.progress = false;
    if (fail_capture) cuda::inject_capture_failures(1 << 20);
    graphed->enable_graphs(g);
    cuda::inject_capture_failures(0);
  }
};

std::mt19937 rng(7);
int32_t rand_tok() { return int32_t(rng() % 8192); }

// Builds `n` sequences with random prompts of up to `max_len` tokens in disjoint blocks.
std::vector<Seq> make_seqs(int n, int max_len, int block_size = 16) {
  std::vector<Seq> s(static_cast<size_t>(n));
  int next_block = 0;
  for (auto& q : s) {
    int len = 1 + int(rng() % uint32_t(max_len));
    for (int i = 0; i < len; ++i) q.tokens.push_back(rand_tok());
    int blocks = (len + 8 + block_size - 1) / block_size;
    for (int i = 0; i < blocks; ++i) q.table.push_back(next_block++);
  }
  return s;
}

TEST(CudaGraphs, BucketLists) {
  auto d = decode_buckets(160);
  EXPECT_EQ(d.front(), 1);
  EXPECT_EQ(d[3], 8);
  EXPECT_EQ(d[4], 16);
  EXPECT_EQ(d.back(), 160);
  auto p = prefill_buckets(2048);
  EXPECT_EQ(p.front(), 16);
  EXPECT_EQ(p.back(), 2048);
  for (size_t i = 1; i < p.size(); ++i) EXPECT_GT(p[i], p[i - 1]);
}

TEST(CudaGraphs, DecodeBucketsMatchEager) {
  TS_REQUIRE_CUDA();
  Pair pr(16, 0);
  // max_context 2048: every batch bucket has graphs for contexts <= 1024 and <= 2048.
  ASSERT_EQ(pr.graphed->graphs()->decode_graphs(), 2 * int(decode_buckets(16).size()));
  for (int B : {1, 2, 3, 5, 8, 11, 16}) {
    auto seqs = make_seqs(B, 120);
    std::vector<SeqChunk> pre;
    for (auto& s : seqs) pre.push_back({s.tokens.data(), int(s.tokens.size()), 0, &s.table, SeqChunk::Logits::last});
    pr.eager->run(pre);
    pr.graphed->run(pre);  // prefill (eager: the prefill graph is off here)
    for (int step = 0; step < 3; ++step) {
      std::vector<int32_t> next(static_cast<size_t>(B));
      std::vector<SeqChunk> dec;
      for (int i = 0; i < B; ++i) {
        next[size_t(i)] = rand_tok();
        dec.push_back({&next[size_t(i)], 1, int(seqs[size_t(i)].tokens.size()) + step, &seqs[size_t(i)].table, SeqChunk::Logits::last});
      }
      Tensor a = pr.eager->run(dec).to_f32();
      Tensor b = pr.graphed->run(dec).to_f32();
      ASSERT_EQ(a.size(0), B);
      ASSERT_EQ(b.size(0), B);
      double e = rel_err(b, a);
      std::printf("  [decode B=%d step %d] rel err %.3e\n", B, step, e);
      EXPECT_LT(e, 2e-2) << "B=" << B;
    }
  }
}

TEST(CudaGraphs, SamplingInsideDecodeGraphMatchesHostSampler) {
  TS_REQUIRE_CUDA();
  Pair pr(8, 0);
  for (int B : {1, 3, 8}) {
    auto seqs = make_seqs(B, 80);
    std::vector<SeqChunk> pre;
    for (auto& s : seqs) pre.push_back({s.tokens.data(), int(s.tokens.size()), 0, &s.table, SeqChunk::Logits::last});
    pr.eager->run(pre);
    pr.graphed->run(pre);
    for (int step = 0; step < 3; ++step) {
      std::vector<int32_t> next(static_cast<size_t>(B));
      std::vector<SeqChunk> dec;
      std::vector<ops::SamplingRow> rows;
      for (int i = 0; i < B; ++i) {
        next[size_t(i)] = rand_tok();
        dec.push_back({&next[size_t(i)], 1, int(seqs[size_t(i)].tokens.size()) + step, &seqs[size_t(i)].table, SeqChunk::Logits::last});
        ops::SamplingRow r;  // even rows greedy, odd rows seeded nucleus sampling
        if (i % 2) r = {0.8f, 0, 0.9f, 0.0f, uint64_t(1000 + i), uint64_t(step)};
        rows.push_back(r);
      }
      Tensor logits = pr.eager->run(dec).to_f32();
      std::vector<int32_t> want, got;
      ops::cpu::sample(logits, rows, want);
      ASSERT_TRUE(pr.graphed->run_sampled(dec, rows, got)) << "B=" << B;
      EXPECT_EQ(got, want) << "B=" << B << " step " << step;
    }
  }
}

// ModelRunner::run_greedy (the fused LM head + argmax, no logits): eager at any batch and in the
// batch-1/2 greedy decode graphs, the ids are the argmax of the eager logits (eager: exactly;
// graphs: or a near tie, the graph's attention splits differ); with graphs, batches without a
// greedy graph decline (the sampling graph serves them).
TEST(CudaGraphs, GreedyWithoutLogitsMatchesArgmax) {
  TS_REQUIRE_CUDA();
  Pair pr(8, 0);
  for (int B : {1, 2, 3}) {
    auto seqs = make_seqs(B, 80);
    std::vector<SeqChunk> pre;
    for (auto& s : seqs) pre.push_back({s.tokens.data(), int(s.tokens.size()), 0, &s.table, SeqChunk::Logits::last});
    pr.eager->run(pre);
    pr.graphed->run(pre);
    for (int step = 0; step < 3; ++step) {
      std::vector<int32_t> next(static_cast<size_t>(B));
      std::vector<SeqChunk> dec;
      for (int i = 0; i < B; ++i) {
        next[size_t(i)] = rand_tok();
        dec.push_back({&next[size_t(i)], 1, int(seqs[size_t(i)].tokens.size()) + step, &seqs[size_t(i)].table, SeqChunk::Logits::last});
      }
      Tensor logits = pr.eager->run(dec).to_f32();
      const int64_t V = logits.size(1);
      std::vector<int32_t> eager_ids, graph_ids;
      ASSERT_TRUE(pr.eager->run_greedy(dec, eager_ids)) << "B=" << B;
      const bool g = pr.graphed->run_greedy(dec, graph_ids);
      EXPECT_EQ(g, B <= 2) << "B=" << B;
      ASSERT_EQ(eager_ids.size(), size_t(B));
      for (int i = 0; i < B; ++i) {
        const float* l = logits.ptr<float>() + int64_t(i) * V;
        const int32_t best = int32_t(std::max_element(l, l + V) - l);
        auto near = [&](int32_t id) { return id == best || l[best] - l[id] <= 1e-2f * std::max(1.0f, std::fabs(l[best])); };
        // Eager: the same norm and GEMV as run()'s logits, so exactly their argmax.
        EXPECT_EQ(eager_ids[size_t(i)], best) << "B=" << B << " row " << i;
        if (g) {
          EXPECT_TRUE(near(graph_ids[size_t(i)])) << "B=" << B << " row " << i << " graph " << graph_ids[size_t(i)];
        }
      }
    }
  }
}

TEST(CudaGraphs, PrefillBucketsMatchEager) {
  TS_REQUIRE_CUDA();
  Pair pr(0, 512);
  ASSERT_EQ(pr.graphed->graphs()->prefill_graphs(), int(prefill_buckets(512).size()));
  // Mixed batches: cached prefixes (computed first), chunks of different lengths, totals that
  // land on, below and between buckets.
  for (int total : {1, 15, 16, 17, 40, 100, 250, 511, 512}) {
    int n = 1 + int(rng() % 4);
    auto seqs = make_seqs(n, 60);
    std::vector<SeqChunk> prefix;
    for (auto& s : seqs) prefix.push_back({s.tokens.data(), int(s.tokens.size()), 0, &s.table, SeqChunk::Logits::none});
    pr.eager->run(prefix);
    pr.graphed->run(prefix);
    // New chunks after the cached prefixes, `total` tokens split over the sequences.
    std::vector<std::vector<int32_t>> fresh(seqs.size());
    std::vector<SeqChunk> step;
    int left = total;
    for (size_t i = 0; i < seqs.size() && left > 0; ++i) {
      int take = i + 1 == seqs.size() ? left : std::max(1, left / int(seqs.size() - i));
      for (int k = 0; k < take; ++k) fresh[i].push_back(rand_tok());
      auto& s = seqs[i];
      int end = int(s.tokens.size()) + take;
      while (int(s.table.size()) * 16 < end) s.table.push_back(int32_t(200 + 40 * int(i) + int(s.table.size())));
      step.push_back({fresh[i].data(), take, int(s.tokens.size()), &s.table, SeqChunk::Logits::all});
      left -= take;
    }
    Tensor a = pr.eager->run(step).to_f32();
    Tensor b = pr.graphed->run(step).to_f32();
    ASSERT_EQ(a.size(0), b.size(0));
    double e = rel_err(b, a);
    std::printf("  [prefill total=%d seqs=%zu] rel err %.3e\n", total, step.size(), e);
    EXPECT_LT(e, 2e-2) << "total=" << total;
  }
}

TEST(CudaGraphs, FailedCaptureFallsBackToEager) {
  TS_REQUIRE_CUDA();
  Pair pr(4, 64, /*fail_capture=*/true);
  EXPECT_EQ(pr.graphed->graphs()->decode_graphs(), 0);
  EXPECT_EQ(pr.graphed->graphs()->prefill_graphs(), 0);
  auto seqs = make_seqs(2, 30);
  std::vector<SeqChunk> pre;
  for (auto& s : seqs) pre.push_back({s.tokens.data(), int(s.tokens.size()), 0, &s.table, SeqChunk::Logits::last});
  Tensor a = pr.eager->run(pre).to_f32();
  Tensor b = pr.graphed->run(pre).to_f32();
  EXPECT_EQ(rel_err(b, a), 0.0);  // both eager: identical
}

}  // namespace
