// Sampler: turns logits rows into tokens for a batch of requests: penalties (presence,
// frequency, repetition) and logits constraints (logit_bias, min_tokens, grammar masks:
// runtime/structured.h) on host logits, then ops::sample, then optional top-k logprobs.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "runtime/request.h"

namespace ts {

struct SampleResult {
  int32_t token;
  TokenLogprob logprob;  // filled when the request asked for logprobs
};

// The sampling parameters of a request's next token.
ops::SamplingRow sampling_row(const Request& r);
// Whether a request's sampling needs the logits on the host (penalties, logprobs, logit_bias,
// min_tokens). A grammar alone does not: its mask is applied on device logits; nor do penalties,
// logit_bias and min_tokens of a request bound to a device logits slot (runtime/device_logits.h).
bool needs_host_logits(const Request& r);
// Whether a request's next token is the plain argmax of its logits: greedy (temperature <= 0),
// no logprobs, no penalties, no logits constraints (logit_bias, min_tokens, grammar). Steps
// whose sampled rows all are may skip the logits (ModelRunner::run_greedy).
bool greedy_without_logits(const Request& r);
// Whether a request has logits constraints (a grammar, logit_bias, min_tokens).
inline bool needs_mask(const Request& r) { return r.constraints != nullptr; }
// logits: f32 [N, V] (host, modified in place by penalties; or on the device when no request
// needs host logits); reqs[i] owns row i.
void sample_batch(Tensor& logits, const std::vector<const Request*>& reqs, std::vector<SampleResult>& out);

// Device logits [N, V]: applies the grammar masks of reqs (rows without one untouched) with
// ops::apply_token_bitmask. sample_batch calls it for grammar-only requests on device logits.
void apply_device_masks(Tensor& logits, const std::vector<const Request*>& reqs);

// log-softmax value of `id` and the top-k (id, logprob), from raw logits of one row.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int k);
// Speculative verification of one draft token against the target distribution p (dense,
// normalised — what the plain sampler would draw from). The draft is a point mass, so it is
// accepted with probability p[draft]; on rejection the token is drawn from p with the draft
// removed (max(p - q, 0) renormalised). The result is distributed exactly as p.
int32_t verify_draft_token(std::vector<float>& p, int32_t draft, uint64_t seed, uint64_t counter, bool& accepted);

// Applies the request's penalties to one logits row; `extra` [n_extra] are tokens generated
// after r.tokens that count as output too (a speculative run accepted so far this step).
void apply_penalties(float* logits, int64_t vocab, const Request& r, const int32_t* extra = nullptr, size_t n_extra = 0);

}  // namespace ts
