// Quantized decode through the dense decoder's fused flow on CUDA (models/blocks.h:
// dense_decoder_forward_fused at 1-2 rows): random Llamas in FP8 block-128, FP8 per-channel and
// NVFP4 whose decode rows run rmsnorm_linear / linear_silu_mul / linear_add over the stored
// weights (the tensor-core W8A16 / W4A16 decode GEMV, quant_linear.cu), against the CPU oracle
// (dequantized weights, fp32). Two sequences prefilled on each backend, then decode steps of 1 and 2 rows;
// the weight-only rule: max |logit diff| <= 0.1 (bf16 activations vs fp32) and the same
// greedy token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <numeric>

#include "core/device_memory.h"
#include "models/model.h"
#include "runtime/model_runner.h"
#include "../unit/models/model_test_util.h"

using namespace ts;
namespace fs = std::filesystem;

#define TS_REQUIRE_CUDA() \
  if (!::ts::cuda_available()) GTEST_SKIP() << "no CUDA device: skipped"

namespace {

int argmax_row(const Tensor& l, int64_t r) {
  const int64_t V = l.size(-1);
  const float* p = l.ptr<float>() + r * V;
  return int(std::max_element(p, p + V) - p);
}

// The gap between the best and the second-best logit of row r.
double top2_gap(const Tensor& l, int64_t r) {
  const int64_t V = l.size(-1);
  std::vector<float> v(l.ptr<float>() + r * V, l.ptr<float>() + (r + 1) * V);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return double(v[0]) - double(v[1]);
}

// Logits of decode steps: prefill sequences a (24 tokens) and b (9 tokens), then a alone at its
// next position (1 row), then a and b together (2 rows). Returns the rows [1 step a, a, b].
Tensor decode_logits(const std::shared_ptr<models::Model>& m) {
  std::vector<int32_t> a(26), b(10);
  for (size_t i = 0; i < a.size(); ++i) a[i] = int32_t((17 + 31 * i) % 1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = int32_t((5 + 77 * i) % 1000);
  std::vector<int32_t> ta(4), tb(4);
  std::iota(ta.begin(), ta.end(), 0);
  std::iota(tb.begin(), tb.end(), 4);
  ModelRunner r(m, 8, 16);
  r.run({SeqChunk{a.data(), 24, 0, &ta, SeqChunk::Logits::none}, SeqChunk{b.data(), 9, 0, &tb, SeqChunk::Logits::none}});
  Tensor one = r.run({SeqChunk{a.data() + 24, 1, 24, &ta, SeqChunk::Logits::last}}).to_f32();
  Tensor two = r.run({SeqChunk{a.data() + 25, 1, 25, &ta, SeqChunk::Logits::last},
                      SeqChunk{b.data() + 9, 1, 9, &tb, SeqChunk::Logits::last}})
                   .to_f32();
  const int64_t V = one.size(-1);
  Tensor out = Tensor::empty({3, V}, DType::f32);
  std::copy(one.ptr<float>(), one.ptr<float>() + V, out.ptr<float>());
  std::copy(two.ptr<float>(), two.ptr<float>() + 2 * V, out.ptr<float>() + V);
  return out;
}

}  // namespace

TEST(CudaQuantModel, DecodeThroughTheFusedFlowMatchesTheCpu) {
  TS_REQUIRE_CUDA();
  for (const char* quant : {"fp8", "fp8-channel", "fbgemm-fp8", "nvfp4", "ct-nvfp4"}) {
    const fs::path dir = fs::temp_directory_path() / (std::string("ts_quant_decode_") + std::to_string(::getpid()));
    fs::remove_all(dir);
    test::write_small_llama(dir.string(), quant, 2, 1536);
    models::LoadOptions cpu, gpu;
    gpu.device = Device::cuda;
    const Tensor g = decode_logits(models::load_model(dir.string(), gpu));
    const Tensor c = decode_logits(models::load_model(dir.string(), cpu));
    fs::remove_all(dir);
    const double d = test::max_abs_diff(g, c);
    std::printf("%s: decode rows (1, then 2 sequences): max |cuda - cpu| %.4g\n", quant, d);
    EXPECT_LE(d, 0.1) << quant;
    // Greedy equal wherever the oracle's choice is not a near-tie (a gap over twice the diff).
    for (int64_t r = 0; r < 3; ++r)
      if (top2_gap(c, r) > 2 * d) {
        EXPECT_EQ(argmax_row(g, r), argmax_row(c, r)) << quant << " row " << r;
      }
  }
}
