// Structured outputs on the device: ops::cuda::apply_token_bitmask against the CPU op (random
// masks, vocabularies that are and are not multiples of 32), replayed from a captured CUDA graph
// with the mask buffer refreshed between replays, and sample_batch's device path for grammar
// requests choosing the same greedy tokens as the host path.
#include "cuda_test_util.h"

#include <nlohmann/json.hpp>

#include "grammar/ir.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "ops/cuda/graph.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/structured.h"

using namespace ts;
using namespace ts::test;

namespace {

Tensor rand_mask(int64_t B, int64_t V, int density_pct) {
  const int64_t W = (V + 31) / 32;
  Tensor m = Tensor::empty({B, W}, DType::i32);
  std::uniform_int_distribution<int> d(0, 99);
  for (int64_t i = 0; i < B * W; ++i) {
    uint32_t w = 0;
    for (int k = 0; k < 32; ++k) w |= uint32_t(d(rng()) < density_pct) << k;
    m.ptr<uint32_t>()[i] = (i % 7 == 3) ? 0xffffffffu : w;
  }
  return m;
}

void expect_same(const Tensor& ref, const Tensor& dev, const char* what) {
  Tensor got = to_host_f32(dev);
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const float a = ref.ptr<float>()[i], b = got.ptr<float>()[i];
    ASSERT_TRUE(a == b || (std::isinf(a) && std::isinf(b))) << what << " at " << i << ": " << a << " vs " << b;
  }
}

}  // namespace

TEST(CudaBitmask, MatchesCpu) {
  TS_REQUIRE_CUDA();
  for (int64_t V : {1, 31, 32, 33, 1000, 8192, 128256}) {
    for (int64_t B : {1, 5}) {
      for (int density : {0, 3, 50, 100}) {
        Tensor l = rand_host({B, V}, 2.0f), m = rand_mask(B, V, density);
        Tensor d = to_dev(l), dm = to_dev(m);
        ops::cpu::apply_token_bitmask(l, m);
        ops::cuda::apply_token_bitmask(d, dm);
        expect_same(l, d, "bitmask");
      }
    }
  }
}

TEST(CudaBitmask, CapturedGraphReadsTheCurrentMask) {
  TS_REQUIRE_CUDA();
  const int64_t B = 4, V = 128256;
  Tensor base = rand_host({B, V}, 2.0f);
  Tensor d = to_dev(base), dm = to_dev(rand_mask(B, V, 50));
  cuda::Graph g;
  g.begin_capture();
  ops::cuda::apply_token_bitmask(d, dm);
  g.end_capture();
  for (int rep = 0; rep < 3; ++rep) {
    Tensor l = base.to(Device::cpu), m = rand_mask(B, V, 10 + 30 * rep);
    // New logits and a new mask into the same device buffers, then replay.
    cuda::copy(d.data, true, l.data, false, l.nbytes());
    cuda::copy(dm.data, true, m.data, false, m.nbytes());
    g.replay();
    ops::cpu::apply_token_bitmask(l, m);
    expect_same(l, d, "graph replay");
  }
}

TEST(CudaBitmask, SampleBatchDevicePathFollowsGrammar) {
  TS_REQUIRE_CUDA();
  // ids 0..255 one byte each, 256 the stop id; the model vocabulary is padded to 300.
  const int64_t V = 300;
  std::vector<std::string> bytes(257);
  for (int i = 0; i < 256; ++i) bytes[size_t(i)] = std::string(1, char(i));
  bytes[256] = "</s>";
  auto vocab = std::make_shared<const grammar::Vocab>(bytes, std::vector<bool>(257, false), std::vector<int32_t>{256});
  auto sr = std::make_shared<StructuredRequest>();
  sr->compiled = std::make_shared<const grammar::CompiledGrammar>(
      grammar::json_schema_grammar(std::string_view(R"({"type":"object","properties":{"k":{"enum":["ab","cd"]},)"
                                                    R"("n":{"type":"integer","minimum":0,"maximum":50}},"required":["k","n"]})"),
                                   grammar::JsonSchemaOptions{true, false}),
      vocab);
  std::vector<Request> host_reqs(3), dev_reqs(3);
  std::vector<const Request*> hp, dp;
  for (size_t i = 0; i < 3; ++i) {
    for (auto* r : {&host_reqs[i], &dev_reqs[i]}) {
      r->params.temperature = 0.0f;
      if (i != 1) r->params.structured = sr;  // row 1: no grammar
      r->tokens = {1};
      r->prompt_len = 1;
      r->constraints = LogitsConstraints::make(r->params, {256});
    }
    hp.push_back(&host_reqs[i]);
    dp.push_back(&dev_reqs[i]);
  }
  std::vector<std::string> out(3);
  for (int step = 0; step < 40 && !(host_reqs[0].constraints->grammar_done() && host_reqs[2].constraints->grammar_done()); ++step) {
    Tensor l = rand_host({3, V}, 3.0f);
    Tensor d = to_dev(l);
    std::vector<SampleResult> a, b;
    sample_batch(l, hp, a);
    sample_batch(d, dp, b);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(a[i].token, b[i].token) << "step " << step << " row " << i;
      for (auto* r : {&host_reqs[i], &dev_reqs[i]}) {
        r->tokens.push_back(a[i].token);
        if (r->constraints) r->constraints->accept(a[i].token);
      }
      if (i != 1 && !host_reqs[i].constraints->grammar_done()) out[i] += char(a[i].token);
    }
  }
  for (size_t i : {0u, 2u}) {
    EXPECT_TRUE(dev_reqs[i].constraints->grammar_done()) << out[i];
    auto j = nlohmann::json::parse(out[i]);
    EXPECT_TRUE(j["k"] == "ab" || j["k"] == "cd") << out[i];
  }
}
