#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

static int32_t argmax(const float* l, int64_t v) {
  int64_t best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (l[i] > l[best]) best = i;
  return int32_t(best);
}

// Softmax with temperature, then top-k, top-p, min-p. Leaves the kept candidates in
// idx[0..keep) sorted by probability (desc), ties by id (asc) — the order every backend uses —
// and returns keep. prob holds the unfiltered tempered softmax.
static int64_t filter(const float* l, int64_t v, const SamplingRow& p, std::vector<int32_t>& idx, std::vector<float>& prob) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < v; ++i) mx = std::max(mx, l[i]);
  prob.resize(size_t(v));
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) {
    prob[size_t(i)] = std::exp((l[i] - mx) / p.temperature);
    sum += prob[size_t(i)];
  }
  for (auto& x : prob) x = float(x / sum);
  int64_t k = (p.top_k > 0 && p.top_k < v) ? p.top_k : v;
  idx.resize(size_t(v));
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](int32_t a, int32_t b) { return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  // top-p: keep the smallest prefix whose mass reaches top_p (the token crossing it included).
  int64_t keep = k;
  if (p.top_p < 1.0f) {
    double c = 0;
    for (int64_t i = 0; i < k; ++i) {
      c += prob[size_t(idx[size_t(i)])];
      if (c >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    float thr = p.min_p * prob[size_t(idx[0])];
    int64_t j = 1;
    while (j < keep && prob[size_t(idx[size_t(j)])] >= thr) ++j;
    keep = j;
  }
  return keep;
}

static int32_t sample_row(const float* l, int64_t v, const SamplingRow& p, std::vector<int32_t>& idx,
                          std::vector<float>& prob) {
  if (p.temperature <= 0.0f) return argmax(l, v);
  int64_t keep = filter(l, v, p, idx, prob);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[size_t(idx[size_t(i)])];
  double u = double(sampling_uniform(p.seed, p.counter)) * total, c = 0;
  for (int64_t i = 0; i < keep; ++i) {
    c += prob[size_t(idx[size_t(i)])];
    if (u < c) return idx[size_t(i)];
  }
  return idx[size_t(keep - 1)];
}

void sampling_probs(const float* l, int64_t v, const SamplingRow& p, std::vector<float>& out) {
  out.assign(size_t(v), 0.0f);
  if (p.temperature <= 0.0f) {
    out[size_t(argmax(l, v))] = 1.0f;
    return;
  }
  std::vector<int32_t> idx;
  std::vector<float> prob;
  int64_t keep = filter(l, v, p, idx, prob);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[size_t(idx[size_t(i)])];
  for (int64_t i = 0; i < keep; ++i) out[size_t(idx[size_t(i)])] = float(prob[size_t(idx[size_t(i)])] / total);
}

void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out) {
  int64_t b = logits.rows(), v = logits.size(-1);
  TS_CHECK(int64_t(rows.size()) == b, "sample: {} rows of params for {} logits rows", rows.size(), b);
  out.resize(size_t(b));
  std::vector<int32_t> idx;
  std::vector<float> prob;
  for (int64_t r = 0; r < b; ++r)
    out[size_t(r)] = sample_row(logits.ptr<float>() + r * logits.row_stride(), v, rows[size_t(r)], idx, prob);
}

}  // namespace ts::ops::cpu
