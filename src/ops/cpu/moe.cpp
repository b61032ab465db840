// Mixture-of-experts on the CPU: gated activations, the router (softmax or biased/grouped
// sigmoid top-k) and the routed experts. Every token is routed and summed on its own, in a fixed
// order (its experts by ascending id), so its output does not depend on the rest of the batch.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

static inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

static void glu_row(const float* g, const float* u, int64_t inter, const GluAct& act, float* o) {
  if (act.kind == GluKind::silu) {
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return;
  }
  const float lim = act.limit, alpha = act.alpha;
  for (int64_t i = 0; i < inter; ++i) {
    float gi = std::min(g[i], lim);
    float ui = std::clamp(u[i], -lim, lim);
    float glu = gi * sigmoidf(gi * alpha);
    o[i] = (ui + 1.0f) * glu;
  }
}

void glu(const Tensor& x, Tensor& out, const GluAct& act) {
  TS_CHECK(x.dtype == DType::f32, "cpu glu: f32 only");
  int64_t n = x.rows(), i2 = x.size(-1), inter = i2 / 2;
  TS_CHECK(i2 % 2 == 0 && out.size(-1) == inter && out.rows() == n, "glu: x {} out {}", x.shape_str(), out.shape_str());
  if (n == 0) return;
  int64_t xs = x.row_stride(), os = out.row_stride();
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* g = x.ptr<float>() + r * xs;
    glu_row(g, g + inter, inter, act, out.ptr<float>() + r * os);
  }
}

// Indices of the k largest values (ties: lower index first), in descending value order.
static void topk_desc(const float* v, int n, int k, std::vector<int>& idx) {
  idx.resize(size_t(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(size_t(k));
}

void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights) {
  TS_CHECK(logits.dtype == DType::f32, "cpu moe_route: logits must be f32");
  int64_t t_n = logits.rows();
  const int e_n = int(logits.size(-1)), k = r.top_k;
  TS_CHECK(k >= 1 && k <= e_n, "moe_route: top_k {} with {} experts", k, e_n);
  TS_CHECK(r.n_group >= 1 && e_n % r.n_group == 0 && r.topk_group >= 1 && r.topk_group <= r.n_group,
           "moe_route: {} experts in {} groups, topk_group {}", e_n, r.n_group, r.topk_group);
  TS_CHECK(ids.dtype == DType::i32 && weights.dtype == DType::f32 && ids.rows() == t_n && weights.rows() == t_n &&
               ids.size(-1) == k && weights.size(-1) == k,
           "moe_route: ids {} weights {} for {} tokens, top_k {}", ids.shape_str(), weights.shape_str(), t_n, k);
  const bool has_bias = bias && bias->data;
  TS_CHECK(!has_bias || bias->numel() == e_n, "moe_route: bias has {} entries for {} experts", has_bias ? bias->numel() : 0, e_n);
  TS_CHECK(r.scoring == MoeScoring::sigmoid || (!has_bias && r.n_group == 1),
           "moe_route: correction bias and groups need sigmoid scoring");
  if (t_n == 0) return;
  const int gsize = e_n / r.n_group;
  int64_t ls = logits.row_stride(), is = ids.row_stride(), ws = weights.row_stride();
#pragma omp parallel for schedule(static) if (t_n > 64)
  for (int64_t t = 0; t < t_n; ++t) {
    const float* lg = logits.ptr<float>() + t * ls;
    std::vector<float> p(static_cast<size_t>(e_n)), choice(static_cast<size_t>(e_n));
    std::vector<int> pick;
    if (r.scoring == MoeScoring::softmax) {
      float mx = -INFINITY;
      for (int e = 0; e < e_n; ++e) mx = std::max(mx, lg[e]);
      double sum = 0;
      for (int e = 0; e < e_n; ++e) {
        p[size_t(e)] = std::exp(lg[e] - mx);
        sum += p[size_t(e)];
      }
      float inv = float(1.0 / sum);
      for (int e = 0; e < e_n; ++e) p[size_t(e)] *= inv;
      choice = p;
    } else {
      for (int e = 0; e < e_n; ++e) {
        p[size_t(e)] = sigmoidf(lg[e]);
        choice[size_t(e)] = p[size_t(e)] + (has_bias ? bias->ptr<float>()[e] : 0.0f);
      }
      if (r.n_group > 1) {
        std::vector<float> gscore(static_cast<size_t>(r.n_group));
        std::vector<int> top2;
        for (int g = 0; g < r.n_group; ++g) {
          int take = std::min(2, gsize);
          topk_desc(choice.data() + g * gsize, gsize, take, top2);
          float s = 0;
          for (int i : top2) s += choice[size_t(g * gsize + i)];
          gscore[size_t(g)] = s;
        }
        std::vector<int> keep;
        topk_desc(gscore.data(), r.n_group, r.topk_group, keep);
        std::vector<char> kept(static_cast<size_t>(r.n_group), 0);
        for (int g : keep) kept[size_t(g)] = 1;
        for (int e = 0; e < e_n; ++e)
          if (!kept[size_t(e / gsize)]) choice[size_t(e)] = 0.0f;  // transformers masks with 0, not -inf
      }
    }
    topk_desc(choice.data(), e_n, k, pick);
    std::sort(pick.begin(), pick.end());
    float denom = 0;
    for (int e : pick) denom += p[size_t(e)];
    denom += r.renorm_eps;
    int32_t* io = ids.ptr<int32_t>() + t * is;
    float* wo = weights.ptr<float>() + t * ws;
    for (int j = 0; j < k; ++j) {
      int e = pick[size_t(j)];
      float w = p[size_t(e)];
      if (r.renormalize) w /= denom;
      io[j] = e;
      wo[j] = w * r.scale;
    }
  }
}

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                 const GluAct& act, Tensor& out) {
  TS_CHECK(x.dtype == DType::f32 && gate_up.dtype == DType::f32 && down.dtype == DType::f32, "cpu moe_experts: f32 only");
  int64_t t_n = x.rows(), hid = x.size(-1), k = ids.size(-1);
  TS_CHECK(gate_up.ndim == 3 && down.ndim == 3 && gate_up.size(0) == down.size(0) && gate_up.size(2) == hid &&
               down.size(1) == hid && gate_up.size(1) == 2 * down.size(2),
           "moe_experts: gate_up {} down {} for hidden {}", gate_up.shape_str(), down.shape_str(), hid);
  TS_CHECK(gate_up.is_contiguous() && down.is_contiguous(), "moe_experts: expert weights must be contiguous");
  TS_CHECK(ids.rows() == t_n && weights.rows() == t_n && weights.size(-1) == k && out.rows() == t_n &&
               out.size(-1) == hid,
           "moe_experts: x {} ids {} weights {} out {}", x.shape_str(), ids.shape_str(), weights.shape_str(),
           out.shape_str());
  if (t_n == 0) return;
  const int64_t e_n = gate_up.size(0), inter = down.size(2);
  // Rows (t, j) grouped by expert, in token order: each expert's rows go through one GEMM, whose
  // per-element arithmetic is a fixed dot() whatever the number of rows.
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(e_n));
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = ids.ptr<int32_t>()[t * ids.row_stride() + j];
      TS_CHECK(e >= 0 && e < e_n, "moe_experts: expert id {} outside 0..{}", e, e_n - 1);
      rows_of[size_t(e)].push_back(t * k + j);
    }
  Tensor y = Tensor::empty({t_n * k, hid}, DType::f32);  // each (token, slot)'s expert output
  int64_t xs = x.row_stride();
  for (int64_t e = 0; e < e_n; ++e) {
    const auto& rows = rows_of[size_t(e)];
    int64_t n = int64_t(rows.size());
    if (n == 0) continue;
    Tensor xin = Tensor::empty({n, hid}, DType::f32);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xin.ptr<float>() + i * hid, x.ptr<float>() + (rows[size_t(i)] / k) * xs, size_t(hid) * 4);
    Tensor gu = Tensor::empty({n, 2 * inter}, DType::f32);
    linear(xin, gate_up.row(e), gu, nullptr);
    Tensor a = Tensor::empty({n, inter}, DType::f32);
    ::ts::ops::cpu::glu(gu, a, act);
    Tensor yo = Tensor::empty({n, hid}, DType::f32);
    linear(a, down.row(e), yo, nullptr);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(y.ptr<float>() + rows[size_t(i)] * hid, yo.ptr<float>() + i * hid, size_t(hid) * 4);
  }
  int64_t os = out.row_stride(), wsd = weights.row_stride();
#pragma omp parallel for schedule(static) if (t_n > 16)
  for (int64_t t = 0; t < t_n; ++t) {
    float* o = out.ptr<float>() + t * os;
    for (int64_t i = 0; i < hid; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      float w = weights.ptr<float>()[t * wsd + j];
      const float* yr = y.ptr<float>() + (t * k + j) * hid;
      for (int64_t i = 0; i < hid; ++i) o[i] += yr[i] * w;
    }
  }
}

}  // namespace ts::ops::cpu
