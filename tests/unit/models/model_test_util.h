// Test helpers shared by the CPU and CUDA model tests (tests/unit/models, tests/cuda): a small
// random Llama checkpoint whose linears are K % 512 == 0 (W8A8-eligible when quantized), a
// one-chunk prefill's logits of every row, and the max abs difference of two logits tensors.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/random_model.h"
#include "models/model.h"
#include "runtime/model_runner.h"

namespace ts::test {

// make-random-model --preset llama-3.1-8b shrunk: hidden 512 (q|k|v, gate|up and o_proj K = 512),
// `inter` (down's K), 4 heads x 128, 2 KV heads, vocab 1024; quant "" | fp8 | fp8-channel | ...
inline void write_small_llama(const std::string& dir, const std::string& quant, int layers, int inter) {
  bench::RandomModelOptions o;
  o.preset = "llama-3.1-8b";
  o.out_dir = dir;
  o.seed = 5;
  o.quiet = true;
  o.quant = quant;
  o.overrides.num_layers = layers;
  o.overrides.hidden_size = 512;
  o.overrides.intermediate_size = inter;
  o.overrides.vocab_size = 1024;
  o.overrides.num_heads = 4;
  o.overrides.num_kv_heads = 2;
  o.overrides.head_dim = 128;
  bench::make_random_model(o);
}

// f32 host logits [tokens, V] of a prefill of `tokens` fixed pseudo-random ids (< 1000) from
// position 0 (8 blocks of 16: tokens <= 128).
inline Tensor prefill_logits(const std::shared_ptr<models::Model>& m, int tokens) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens)), table(8);
  for (int i = 0; i < tokens; ++i) ids[size_t(i)] = int32_t((17 + 31 * i) % 1000);
  std::iota(table.begin(), table.end(), 0);
  ModelRunner r(m, 8, 16);
  return r.run({SeqChunk{ids.data(), tokens, 0, &table, SeqChunk::Logits::all}}).to_f32();
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, double(std::fabs(a.ptr<float>()[i] - b.ptr<float>()[i])));
  return d;
}

}  // namespace ts::test
