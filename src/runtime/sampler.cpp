#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "ops/ops.h"
#include "runtime/structured.h"

namespace ts {

void apply_penalties(float* l, int64_t vocab, const Request& r, const int32_t* extra, size_t n_extra) {
  const GenerateParams& p = r.params;
  if (p.repetition_penalty != 1.0f) {
    // HF/vLLM semantics: every token seen in prompt or output is penalised once.
    std::vector<bool> seen(size_t(vocab), false);
    for (int32_t t : r.tokens)
      if (t >= 0 && t < vocab) seen[size_t(t)] = true;
    for (size_t i = 0; i < n_extra; ++i)
      if (extra[i] >= 0 && extra[i] < vocab) seen[size_t(extra[i])] = true;
    for (int64_t i = 0; i < vocab; ++i)
      if (seen[size_t(i)]) l[i] = l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> count;
    for (size_t i = size_t(r.prompt_len); i < r.tokens.size(); ++i) ++count[r.tokens[i]];
    for (size_t i = 0; i < n_extra; ++i) ++count[extra[i]];
    for (auto& [t, c] : count)
      if (t >= 0 && t < vocab) l[t] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }
}

TokenLogprob token_logprob(const float* l, int64_t vocab, int32_t id, int k) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, l[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(l[i] - mx));
  float lse = mx + float(std::log(sum));
  TokenLogprob lp{id, l[id] - lse, {}};
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[size_t(i)] = int32_t(i);
    int kk = int(std::min<int64_t>(k, vocab));
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int i = 0; i < kk; ++i) lp.top.emplace_back(idx[size_t(i)], l[idx[size_t(i)]] - lse);
  }
  return lp;
}

int32_t verify_draft_token(std::vector<float>& p, int32_t draft, uint64_t seed, uint64_t counter, bool& accepted) {
  // Separate counter streams: never reuse the plain sampler's draw for the same output index.
  constexpr uint64_t kAcceptStream = 1ull << 40, kResampleStream = 2ull << 40;
  accepted = ops::sampling_uniform(seed, counter + kAcceptStream) < p[size_t(draft)];
  if (accepted) return draft;
  p[size_t(draft)] = 0.0f;
  double total = 0;
  for (float x : p) total += x;
  double u = double(ops::sampling_uniform(seed, counter + kResampleStream)) * total, c = 0;
  int32_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    c += p[i];
    last = int32_t(i);
    if (u < c) return int32_t(i);
  }
  return last >= 0 ? last : draft;  // p was a point mass on the draft: nothing else to draw
}

ops::SamplingRow sampling_row(const Request& r) {
  return {r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p, r.seed, uint64_t(r.num_generated())};
}

bool needs_host_logits(const Request& r) {
  const GenerateParams& p = r.params;
  if (p.logprobs >= 0) return true;
  // Bound to a device logits-processing slot (runtime/device_logits.h; only requests without
  // logprobs or a grammar are): penalties, logit_bias and min_tokens run on the device.
  if (r.logits_slot) return false;
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         (r.constraints != nullptr && !r.constraints->device_maskable());
}

bool greedy_without_logits(const Request& r) {
  const GenerateParams& p = r.params;
  return p.temperature <= 0.0f && p.logprobs < 0 && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f && r.constraints == nullptr && p.structured == nullptr && p.logit_bias.empty() &&
         p.min_tokens == 0;
}

void apply_device_masks(Tensor& logits, const std::vector<const Request*>& reqs) {
  const int64_t n = int64_t(reqs.size()), vocab = logits.size(-1), words = (vocab + 31) / 32;
  // Host rows [n, words]: a grammar row's mask (ids past the tokenizer's vocabulary masked),
  // all-ones for the others; one upload, one kernel.
  Tensor host = Tensor::empty({n, words}, DType::i32);
  uint32_t* h = host.ptr<uint32_t>();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* row = h + i * words;
    const uint32_t* m = reqs[size_t(i)]->constraints ? reqs[size_t(i)]->constraints->wait_mask() : nullptr;
    if (!m) {
      std::fill(row, row + words, 0xffffffffu);
      continue;
    }
    const int64_t mw = std::min<int64_t>(words, reqs[size_t(i)]->constraints->mask_words());
    std::copy(m, m + mw, row);
    std::fill(row + mw, row + words, 0u);
  }
  Tensor dev = host.to(logits.device);
  ops::apply_token_bitmask(logits, dev);
}

void sample_batch(Tensor& logits, const std::vector<const Request*>& reqs, std::vector<SampleResult>& out) {
  int64_t n = int64_t(reqs.size()), vocab = logits.size(-1);
  // Engine-thread scratch, reused every step.
  thread_local std::vector<ops::SamplingRow> rows;
  thread_local std::vector<int32_t> ids;
  rows.clear();
  if (logits.device != Device::cpu) {
    bool masked = false;
    for (const Request* r : reqs) {
      // Grammar-only constraints are applied on the device (ops::apply_token_bitmask).
      // Rows with a logits slot were processed on the device before (PlainWorker).
      const bool grammar_only = r->constraints && r->constraints->device_maskable();
      TS_CHECK(grammar_only || !needs_host_logits(*r), "sample_batch: request {} needs host logits", r->id);
      masked = masked || grammar_only;
      rows.push_back(sampling_row(*r));
    }
    if (masked) apply_device_masks(logits, reqs);
    ops::sample(logits, rows, ids);
    out.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) out[size_t(i)].token = ids[size_t(i)];
    return;
  }
  out.resize(size_t(n));
  rows.resize(size_t(n));
  // Logprobs are the model's own (pre-penalty, pre-temperature: vLLM's raw logprobs, and what
  // the speculative path reports): rows that want them keep a raw copy before the penalties.
  thread_local std::vector<std::vector<float>> raw;
  raw.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const Request& r = *reqs[size_t(i)];
    float* row = logits.ptr<float>() + i * logits.row_stride();
    if (r.params.logprobs >= 0) raw[size_t(i)].assign(row, row + vocab);
    apply_penalties(row, vocab, r);
    // logit_bias, min_tokens, then the grammar mask (its next-step mask was computed on a mask
    // thread while this step's forward ran).
    if (r.constraints) {
      r.constraints->apply(row, vocab, r.num_generated());
      // (host rows run the simple loop: r.tokens holds no future id here)
      r.constraints->apply_bad_sequences(row, vocab, r.tokens.data() + r.prompt_len, size_t(r.num_generated()));
    }
    rows[size_t(i)] = sampling_row(r);
  }
  ops::sample(logits, rows, ids);
  for (int64_t i = 0; i < n; ++i) {
    out[size_t(i)].token = ids[size_t(i)];
    const Request& r = *reqs[size_t(i)];
    if (r.params.logprobs >= 0)
      out[size_t(i)].logprob = token_logprob(raw[size_t(i)].data(), vocab, ids[size_t(i)], r.params.logprobs);
  }
}

}  // namespace ts
