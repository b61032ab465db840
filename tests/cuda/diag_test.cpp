// Diagnostics on the GPU: the op profiler times each dispatched op once (nested kernels
// included, labels per op / linear weight shape); ModelRunner's host logits come through one
// reused pinned buffer and equal the device logits; the MoE route hook forces the routing on the
// device too (recorded routes reproduce the logits bit for bit); so does MiniMax-M3's
// block-selection hook, whose kernel check finds the device's indexer and sparse attention equal
// to the CPU ops on the device's own inputs (picks identical, outputs within bf16 rounding).
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/device_memory.h"
#include "models/block_select.h"
#include "models/model.h"
#include "models/moe.h"
#include "ops/cuda/op_profiler.h"
#include "ops/ops.h"
#include "runtime/model_runner.h"

using namespace ts;

namespace {

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

std::shared_ptr<models::Model> load(const char* dir) {
  models::LoadOptions lo;
  lo.device = Device::cuda;
  return models::load_model(std::string(TS_SOURCE_DIR) + dir, lo);
}

TEST(OpProfiler, TimesEveryOpOnceByLabel) {
  TS_REQUIRE_CUDA();
  Tensor x = Tensor::zeros({8, 256}, DType::bf16, Device::cuda), w = Tensor::zeros({512, 256}, DType::bf16, Device::cuda);
  Tensor nw = Tensor::zeros({256}, DType::bf16, Device::cuda), y = Tensor::empty({8, 512}, DType::bf16, Device::cuda);
  Tensor xn = Tensor::empty({8, 256}, DType::bf16, Device::cuda);
  ops::cuda::CudaOpProfiler prof;
  ops::op_profiler() = &prof;
  for (int i = 0; i < 3; ++i) {
    ops::rmsnorm(x, nw, 1e-6f, xn);
    ops::linear(xn, w, y);
  }
  ops::op_profiler() = nullptr;
  ops::cuda::OpProfile p = prof.collect();
  ASSERT_EQ(p.ops.size(), 2u);
  EXPECT_EQ(p.ops[0].label, "rmsnorm");
  EXPECT_EQ(p.ops[1].label, "linear 512x256");
  for (auto& o : p.ops) {
    EXPECT_EQ(o.count, 3);
    EXPECT_GT(o.ms, 0.0);
  }
  EXPECT_LE(p.busy_ms, p.span_ms * 1.001 + 1e-3);
  EXPECT_TRUE(prof.collect().ops.empty()) << "collect() must leave the profiler empty";
}

TEST(ModelRunnerCuda, HostLogitsReuseOnePinnedBuffer) {
  TS_REQUIRE_CUDA();
  auto m = load("/models/pycoder");
  ModelRunner r(m, 8, 16);
  std::vector<int32_t> table = {0, 1, 2, 3}, ids = {5, 6, 7, 8, 9};
  SeqChunk c{ids.data(), 5, 0, &table, SeqChunk::Logits::all};
  Tensor dev = r.run({c}, false, false).to_f32();  // own host copy of the device logits
  Tensor h1 = r.run({c}, false, true);
  ASSERT_EQ(h1.device, Device::cpu);
  EXPECT_EQ(0, std::memcmp(h1.data, dev.data, dev.nbytes()));
  const void* p1 = h1.data;
  SeqChunk one{ids.data(), 1, 0, &table, SeqChunk::Logits::last};
  Tensor h2 = r.run({one}, false, true);
  EXPECT_EQ(h2.data, p1) << "a smaller step must reuse the host buffer";
}

TEST(MoeRouteHookCuda, ForcingRecordedRoutesReproducesLogits) {
  TS_REQUIRE_CUDA();
  auto m = load("/tests/data/qwen3_moe");
  std::vector<int32_t> p(40);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((131 + i * 37) % 1000 + 5);
  auto run = [&](models::RouteTape* tape) {
    std::vector<int32_t> table(4);
    std::iota(table.begin(), table.end(), 0);
    ModelRunner r(m, 4, 16);
    models::ScopedMoeRouteHook on(tape);
    if (tape) tape->start();
    return r.run({SeqChunk{p.data(), int(p.size()), 0, &table, SeqChunk::Logits::all}}).to_f32();
  };
  models::RouteTape rec;
  Tensor a = run(&rec);
  ASSERT_FALSE(rec.seen.empty());
  models::RouteTape force;
  force.forced = rec.seen;
  Tensor b = run(&force);
  EXPECT_EQ(0, std::memcmp(a.data, b.data, a.nbytes()));
}

TEST(BlockSelectHookCuda, ForcingRecordedBlocksReproducesLogitsAndKernelsMatchCpu) {
  TS_REQUIRE_CUDA();
  auto m = load("/tests/data/minimax_m3");
  // 200 tokens: past index_topk_blocks * index_block_size (64), so most queries drop blocks.
  std::vector<int32_t> p(200);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((131 + i * 37) % 1000 + 5);
  auto run = [&](models::BlockTape* tape) {
    std::vector<int32_t> table(p.size() / 16 + 2);
    std::iota(table.begin(), table.end(), 0);
    ModelRunner r(m, int64_t(table.size()), 16);
    models::ScopedBlockSelectHook on(tape);
    if (tape) tape->start();
    return r.run({SeqChunk{p.data(), int(p.size()), 0, &table, SeqChunk::Logits::all}}).to_f32();
  };
  models::BlockTape rec;
  rec.check = true;
  Tensor a = run(&rec);
  ASSERT_EQ(rec.seen.size(), 2u);
  ASSERT_EQ(rec.checks.size(), 2u);
  for (size_t l = 0; l < rec.checks.size(); ++l) {
    const auto& c = rec.checks[l];
    EXPECT_EQ(c.sel_differ, 0) << "sparse layer " << l << ": the indexer's picks differ from the CPU's on the same inputs";
    EXPECT_LE(c.out_diff, 0.02 * c.out_max) << "sparse layer " << l << ": attention differs from the CPU's on the same inputs";
  }
  models::BlockTape force;
  force.forced = rec.seen;
  Tensor b = run(&force);
  EXPECT_EQ(0, std::memcmp(a.data, b.data, a.nbytes()));
}

}  // namespace
