// EAGLE3 on the GPU: the fixed-shape step's kernels (argmax with the d2t map, greedy
// acceptance, state select) against the CPU reference, and the engine's decode-step graphs
// (draft steps + verify + catch-up replayed as CUDA graphs) against the same step run eagerly.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cuda_test_util.h"
#include "ops/ops.h"
#include "runtime/engine.h"

using namespace ts;
using namespace ts::test;

namespace {

std::string src(const std::string& rel) { return std::string(TS_SOURCE_DIR) + "/" + rel; }

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}
std::vector<int32_t> to_vec(const Tensor& t) {
  Tensor h = t.device == Device::cpu ? t : t.to(Device::cpu);
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
}

TEST(SpecOps, ArgmaxAcceptSelectMatchCpu) {
  TS_REQUIRE_CUDA();
  const int64_t R = 12, V = 5000, n = 4, B = R / n, H = 96;
  Tensor lg = rand_host({R, V});
  lg.ptr<float>()[3 * V + 7] = 9.0f;  // ties: the lowest id wins
  lg.ptr<float>()[3 * V + 4000] = 9.0f;
  std::vector<int32_t> off(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) off[size_t(i)] = int32_t(i % 17);
  Tensor offs = host_i32(off);
  // Strided output (stride n, offset 1), as the draft steps write into the verify inputs.
  Tensor out_h = Tensor::zeros({R * n}, DType::i32), out_d = Tensor::zeros({R * n}, DType::i32, Device::cuda);
  Tensor oh = out_h.narrow(0, 1, (R - 1) * n + 1), od = out_d.narrow(0, 1, (R - 1) * n + 1);
  Tensor offs_d = offs.to(Device::cuda);
  Tensor o2_h = Tensor::zeros({R}, DType::i32), o2_d = Tensor::zeros({R}, DType::i32, Device::cuda);
  ops::argmax_rows(lg, &offs, oh, n, &o2_h);
  ops::argmax_rows(lg.to(Device::cuda), &offs_d, od, n, &o2_d);
  EXPECT_EQ(to_vec(out_d), to_vec(out_h));
  EXPECT_EQ(to_vec(o2_d), to_vec(o2_h));
  for (int64_t r = 0; r < R; ++r) EXPECT_EQ(o2_h.ptr<int32_t>()[r], out_h.ptr<int32_t>()[1 + r * n]);
  EXPECT_EQ(out_h.ptr<int32_t>()[1 + 3 * n], 7 + 7 % 17);
  // Acceptance: request 0 accepts 0, 1 accepts 2, 2 accepts all 3.
  std::vector<int32_t> v = {5, 1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 3};
  std::vector<int32_t> t = {9, 9, 9, 9, 1, 2, 9, 9, 1, 2, 3, 4};
  Tensor acc_h = Tensor::zeros({B}, DType::i32), acc_d = Tensor::zeros({B}, DType::i32, Device::cuda);
  ops::spec_accept(host_i32(v), host_i32(t), int(n), acc_h);
  ops::spec_accept(host_i32(v).to(Device::cuda), host_i32(t).to(Device::cuda), int(n), acc_d);
  EXPECT_EQ(to_vec(acc_h), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(to_vec(acc_d), to_vec(acc_h));
  // Select: pool rows 4, 0, 6 receive r rows i*n + acc[i].
  Pair r = Pair::rand({R, H});
  Tensor pool_h = Tensor::zeros({8, H}, DType::f32), pool_d = Tensor::zeros({8, H}, DType::bf16, Device::cuda);
  Tensor slots = host_i32({4, 0, 6});
  Tensor nx_h = Tensor::zeros({B}, DType::i32), nx_d = Tensor::zeros({B}, DType::i32, Device::cuda);
  ops::spec_select(r.h, host_i32(t), acc_h, slots, int(n), pool_h, nx_h);
  ops::spec_select(r.d, host_i32(t).to(Device::cuda), acc_d, slots.to(Device::cuda), int(n), pool_d, nx_d);
  EXPECT_EQ(to_vec(nx_d), to_vec(nx_h));
  EXPECT_EQ(to_vec(nx_h), (std::vector<int32_t>{9, 9, 4}));
  Tensor pd = to_host_f32(pool_d);
  for (int64_t i = 0; i < 8 * H; ++i) ASSERT_EQ(pd.ptr<float>()[i], pool_h.ptr<float>()[i]) << i;
}

struct SpecRun {
  std::vector<int32_t> tokens;
  std::vector<std::pair<std::vector<int32_t>, int>> trace;
};

std::vector<SpecRun> run_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int n) {
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : prompts) {
    GenerateParams g;
    g.prompt = p;
    g.max_tokens = n;
    g.temperature = 0;
    g.ignore_eos = true;
    g.return_spec_trace = true;
    st.push_back(e.submit(g));
  }
  std::vector<SpecRun> out;
  for (auto& s : st) {
    SpecRun r;
    StreamEvent ev;
    while (s->pop(ev, 60000)) {
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        r.trace = ev.spec_trace;
        break;
      }
    }
    out.push_back(r);
  }
  return out;
}

EngineOptions spec_opts() {
  EngineOptions o;
  o.model_dir = src("models/pycoder");
  o.device = "cuda";
  o.max_total_tokens = 16384;
  o.max_num_seqs = 16;
  o.cuda_graph_max_bs = 16;
  o.prefill_graph_max_tokens = 256;
  o.speculative_algorithm = "EAGLE3";
  o.speculative_draft_model_path = src("models/pycoder-eagle3");
  o.speculative_num_steps = 3;
  return o;
}

EngineMetrics settled(Engine& e, int64_t steps) {
  EngineMetrics m = e.metrics();
  for (int i = 0; i < 200 && m.spec_verify_steps < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = e.metrics();
  }
  return m;
}

// The graph replays run exactly the eager step's kernels on the same shapes (batch 1 pads
// nothing), so drafts, accepted counts and tokens must be identical.
TEST(SpecGraphs, DecodeStepGraphsMatchEagerStep) {
  TS_REQUIRE_CUDA();
  std::ifstream f(src("models/pycoder-eagle3/spec_golden.json"));
  auto g = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts;
  for (auto& t : g["traces"]) prompts.push_back(t["prompt"].get<std::vector<int32_t>>());
  EngineOptions o = spec_opts();
  Engine graphs(o);
  graphs.start();
  o.enforce_eager = true;
  Engine eager(o);
  eager.start();
  int64_t steps = 0;
  for (auto& p : prompts) {
    SpecRun a = run_all(graphs, {p}, 48)[0], b = run_all(eager, {p}, 48)[0];
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.trace, b.trace);
    EXPECT_EQ(a.tokens.size(), 48u);
    steps += int64_t(a.trace.size());
  }
  EngineMetrics m = settled(graphs, steps);
  EXPECT_GT(m.spec_graph_steps, 0) << "no decode step ran as a graph";
  EXPECT_GT(m.spec_draft_seconds, 0.0);
  EXPECT_EQ(settled(eager, steps).spec_graph_steps, 0);
  // Several requests in one (padded) graph bucket: each keeps its own acceptance and the
  // output equals the same requests run eagerly in one batch (same bucket size: 3 pads to 4).
  std::vector<std::vector<int32_t>> three(prompts.begin(), prompts.end());
  three.resize(3, prompts[0]);
  auto ga = run_all(graphs, three, 40), eb = run_all(eager, three, 40);
  for (size_t i = 0; i < three.size(); ++i) {
    EXPECT_EQ(ga[i].tokens.size(), 40u) << i;
    EXPECT_EQ(eb[i].tokens.size(), 40u) << i;
  }
}

}  // namespace
