// Device logits processing through the engine on the demo model (CUDA graphs on): requests with
// penalties / logit_bias / min_tokens take the device path (decode graphs, counts on the device);
// the same requests with logprobs take the host path (CPU penalties on host logits of the same
// forward). Greedy outputs must be equal, batch by batch.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include "core/device_memory.h"
#include "runtime/engine.h"

using namespace ts;

namespace {

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

std::vector<GenerateParams> requests(bool host) {
  std::vector<GenerateParams> out;
  for (int k = 0; k < 6; ++k) {
    GenerateParams p;
    for (int i = 0; i < 12 + 5 * k; ++i) p.prompt.push_back(int32_t(100 + (i * 7 + k) % 40));
    p.max_tokens = 32;
    p.temperature = 0;
    p.ignore_eos = true;
    switch (k) {
      case 0: p.repetition_penalty = 1.5f; break;
      case 1: p.presence_penalty = 1.0f, p.frequency_penalty = 0.5f; break;
      case 2: p.logit_bias = {{int32_t(100 + k), 5.0f}, {13, -50.0f}}; break;
      case 3: p.ignore_eos = false, p.min_tokens = 24; break;
      case 4: p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f, p.min_tokens = 8, p.ignore_eos = false; break;
      default: break;  // plain: no processing
    }
    if (host) p.logprobs = 0;  // forces host logits (raw logprobs): the CPU sampler's path
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::vector<int32_t>> run(bool host, bool graphs) {
  EngineOptions o;
  o.model_dir = std::string(TS_SOURCE_DIR) + "/models/pycoder";
  o.device = "cuda";
  o.max_total_tokens = 8192;
  o.cuda_graph_max_bs = 8;
  o.prefill_graph_max_tokens = 256;
  o.max_num_seqs = 8;
  o.disable_cuda_graph = !graphs;
  Engine e(o);
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : requests(host)) st.push_back(e.submit(p));  // queued before start: one batch
  e.start();
  std::vector<std::vector<int32_t>> out(st.size());
  for (size_t i = 0; i < st.size(); ++i) {
    StreamEvent ev;
    while (st[i]->pop(ev, 60000)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      out[i].insert(out[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) break;
    }
  }
  e.stop();
  return out;
}

}  // namespace

TEST(CudaLogitsProcEngine, DevicePathEqualsHostPath) {
  TS_REQUIRE_CUDA();
  for (bool graphs : {true, false}) {
    auto dev = run(false, graphs), host = run(true, graphs);
    ASSERT_EQ(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i) {
      EXPECT_EQ(dev[i], host[i]) << "request " << i << (graphs ? " (decode graphs)" : " (eager)");
      EXPECT_FALSE(dev[i].empty());
    }
    EXPECT_GE(dev[3].size(), 24u) << "min_tokens";
  }
}
