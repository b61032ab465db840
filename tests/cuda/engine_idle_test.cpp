// The engine's device-idle figure on the GPU (runtime/engine.cpp IdleClock): timed with CUDA
// events on the compute stream, in the overlap loop and in the simple loop. The demo model's
// steps are short, so only sanity bounds hold here (the < 2% target is a bench serving figure at
// batch 64 on the 8B shapes: scripts/gpu_grammar_cost.sh prints dev_idle%).
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cuda_test_util.h"
#include "runtime/engine.h"

using namespace ts;

namespace {

EngineMetrics run_load(bool overlap, double& wall_s) {
  EngineOptions o;
  o.model_dir = std::string(TS_SOURCE_DIR) + "/models/pycoder";
  o.device = "cuda";
  o.max_total_tokens = 8192;
  o.max_num_seqs = 8;
  o.cuda_graph_max_bs = 8;
  o.disable_overlap_schedule = !overlap;
  Engine e(o);
  e.start();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Stream>> st;
  for (int i = 0; i < 8; ++i) {
    GenerateParams g;
    for (int k = 0; k < 40 + 7 * i; ++k) g.prompt.push_back(100 + (k * 31 + i) % 900);
    g.max_tokens = 48;
    g.temperature = 0;
    g.ignore_eos = true;
    st.push_back(e.submit(g));
  }
  for (auto& s : st) {
    StreamEvent ev;
    while (s->pop(ev, 60000) && !ev.finished) {
    }
    EXPECT_TRUE(ev.finished);
  }
  wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineMetrics m = e.metrics();
  for (int i = 0; i < 100 && m.running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = e.metrics();
  }
  return m;
}

}  // namespace

TEST(EngineDeviceIdle, CudaEventFiguresAreSane) {
  TS_REQUIRE_CUDA();
  for (bool overlap : {true, false}) {
    double wall = 0;
    EngineMetrics m = run_load(overlap, wall);
    std::printf("overlap=%d: steps %lld, device busy %.4f s, idle %.4f s (%.1f%%), idle per step %.1f us, wall %.3f s\n",
                int(overlap), (long long)m.steps, m.device_busy_seconds, m.device_idle_seconds,
                100 * m.device_idle_seconds / std::max(1e-9, m.device_idle_seconds + m.device_busy_seconds),
                m.device_idle_us_mean, wall);
    EXPECT_GT(m.steps, 40) << overlap;
    EXPECT_GT(m.device_busy_seconds, 0.0) << overlap;
    EXPECT_GE(m.device_idle_seconds, 0.0) << overlap;
    // Both are device time inside the measured window (plus the warm-up before it).
    EXPECT_LT(m.device_busy_seconds + m.device_idle_seconds, wall + 1.0) << overlap;
    EXPECT_GE(m.device_idle_us_mean, 0.0) << overlap;
  }
}
