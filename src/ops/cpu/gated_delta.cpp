// Gated DeltaNet reference (Qwen3.5 linear attention): the short causal conv, the gates, the
// recurrent delta rule and the gated output norm. The recurrence runs token by token (the
// recurrent form; transformers' chunked form is the same math regrouped), fp32 state,
// double accumulation for the reductions.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Sequence of every row (-1: padding row outside all sequences) and each sequence's first
// position, from the step metadata.
struct SeqRows {
  std::vector<int32_t> seq_of_row;
  const int32_t *cu = nullptr, *kv_len = nullptr, *slots = nullptr;
  int64_t start(int b) const { return int64_t(kv_len[b]) - (cu[b + 1] - cu[b]); }
};

SeqRows seq_rows(int64_t t_n, const AttnMeta& m, const Tensor& state_slots, int64_t n_slots, const char* op) {
  SeqRows s;
  s.cu = m.cu_q.ptr<int32_t>();
  s.kv_len = m.kv_len.ptr<int32_t>();
  s.slots = state_slots.ptr<int32_t>();
  TS_CHECK(state_slots.numel() >= m.num_seqs, "state_slots has {} entries for {} sequences", state_slots.numel(), m.num_seqs);
  for (int b = 0; b < m.num_seqs; ++b)
    TS_CHECK(s.slots[b] < n_slots, "{}: state slot {} outside the pool of {}", op, s.slots[b], n_slots);
  s.seq_of_row.assign(size_t(t_n), -1);
  for (int b = 0; b < m.num_seqs; ++b)
    for (int32_t r = s.cu[b]; r < s.cu[b + 1]; ++r) s.seq_of_row[size_t(r)] = b;
  return s;
}

}  // namespace

void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots, const AttnMeta& m,
                   Tensor& out) {
  const int64_t t_n = x.rows(), c_n = x.size(-1), k_n = w.size(1), hist = k_n - 1;
  TS_CHECK(w.size(0) == c_n && out.size(-1) == c_n && out.rows() == t_n, "causal_conv1d: x {} w {} out {}", x.shape_str(),
           w.shape_str(), out.shape_str());
  TS_CHECK(conv_state.ndim == 3 && conv_state.size(1) == hist && conv_state.size(2) == c_n,
           "causal_conv1d: conv_state {} for kernel {} over {} channels", conv_state.shape_str(), k_n, c_n);
  if (t_n == 0) return;
  SeqRows s = seq_rows(t_n, m, state_slots, conv_state.size(0), "causal_conv1d");
  const int64_t xs = x.row_stride(), os = out.row_stride();
  for (int64_t r = 0; r < t_n; ++r)
    if (s.seq_of_row[size_t(r)] < 0) std::memset(out.ptr<float>() + r * os, 0, size_t(c_n) * 4);
  // Per sequence: a window [hist + q_len, C] = previous inputs (state or zeros) then the chunk.
#pragma omp parallel for schedule(dynamic, 1)
  for (int b = 0; b < m.num_seqs; ++b) {
    const int64_t q_len = s.cu[b + 1] - s.cu[b], row0 = s.cu[b];
    const int32_t slot = s.slots[b];
    if (q_len == 0) continue;
    std::vector<float> win(size_t((hist + q_len) * c_n), 0.0f);
    float* st = slot >= 0 ? conv_state.ptr<float>() + int64_t(slot) * hist * c_n : nullptr;
    if (st && s.start(b) > 0) std::memcpy(win.data(), st, size_t(hist * c_n) * 4);
    for (int64_t i = 0; i < q_len; ++i)
      std::memcpy(win.data() + (hist + i) * c_n, x.ptr<float>() + (row0 + i) * xs, size_t(c_n) * 4);
    const float* wp = w.ptr<float>();
    for (int64_t i = 0; i < q_len; ++i) {
      float* o = out.ptr<float>() + (row0 + i) * os;
      for (int64_t c = 0; c < c_n; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < k_n; ++j) acc += double(wp[c * k_n + j]) * win[size_t((i + j) * c_n + c)];
        o[c] = silu(float(acc));
      }
    }
    if (st) std::memcpy(st, win.data() + q_len * c_n, size_t(hist * c_n) * 4);  // the last hist inputs
  }
}

void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g, Tensor& beta) {
  const int64_t t_n = a.rows(), nv = a.size(-1);
  TS_CHECK(b.rows() == t_n && b.size(-1) == nv && A_log.numel() == nv && dt_bias.numel() == nv && g.rows() == t_n &&
               g.size(-1) == nv && beta.rows() == t_n && beta.size(-1) == nv,
           "gdn_gates: a {} b {} A_log {} dt_bias {} g {} beta {}", a.shape_str(), b.shape_str(), A_log.shape_str(),
           dt_bias.shape_str(), g.shape_str(), beta.shape_str());
  TS_CHECK(A_log.dtype == DType::f32 && dt_bias.dtype == DType::f32 && g.dtype == DType::f32 && beta.dtype == DType::f32,
           "gdn_gates: A_log, dt_bias, g and beta must be f32");
  for (int64_t t = 0; t < t_n; ++t) {
    const float* ar = a.ptr<float>() + t * a.row_stride();
    const float* br = b.ptr<float>() + t * b.row_stride();
    float* gr = g.ptr<float>() + t * g.row_stride();
    float* betar = beta.ptr<float>() + t * beta.row_stride();
    for (int64_t h = 0; h < nv; ++h) {
      gr[h] = -std::exp(A_log.ptr<float>()[h]) * softplus(ar[h] + dt_bias.ptr<float>()[h]);
      betar[h] = sigmoid(br[h]);
    }
  }
}

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& m, Tensor& out) {
  const int64_t t_n = q.size(0), nk = q.size(1), dk = q.size(2), nv = v.size(1), dv = v.size(2);
  TS_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && k.size(0) == t_n && v.size(0) == t_n &&
               k.size(1) == nk && k.size(2) == dk && nv % nk == 0 && out.size(0) == t_n && out.size(1) == nv &&
               out.size(2) == dv,
           "gated_delta_rule: q {} k {} v {} out {}", q.shape_str(), k.shape_str(), v.shape_str(), out.shape_str());
  TS_CHECK(state.ndim == 4 && state.size(1) == nv && state.size(2) == dk && state.size(3) == dv && state.dtype == DType::f32,
           "gated_delta_rule: state {} for {} heads of {} x {}", state.shape_str(), nv, dk, dv);
  TS_CHECK(g.rows() == t_n && g.size(-1) == nv && beta.rows() == t_n && beta.size(-1) == nv,
           "gated_delta_rule: g {} beta {}", g.shape_str(), beta.shape_str());
  if (t_n == 0) return;
  SeqRows s = seq_rows(t_n, m, state_slots, state.size(0), "gated_delta_rule");
  for (int64_t r = 0; r < t_n; ++r)
    if (s.seq_of_row[size_t(r)] < 0)
      for (int64_t h = 0; h < nv; ++h) std::memset(out.ptr<float>() + r * out.stride[0] + h * out.stride[1], 0, size_t(dv) * 4);
  const int64_t group = nv / nk;
  const float q_scale = float(1.0 / std::sqrt(double(dk)));
  // l2norm as transformers / FLA: x * rsqrt(sum(x^2) + 1e-6).
  auto l2 = [&](const float* x, float scale, float* o) {
    double ss = 0;
    for (int64_t i = 0; i < dk; ++i) ss += double(x[i]) * x[i];
    float inv = float(1.0 / std::sqrt(ss + 1e-6));
    for (int64_t i = 0; i < dk; ++i) o[i] = x[i] * inv * scale;
  };
  const int64_t items = int64_t(m.num_seqs) * nv;
#pragma omp parallel
  {
    std::vector<float> S(size_t(dk * dv)), qn(static_cast<size_t>(dk)), kn(static_cast<size_t>(dk)), delta(static_cast<size_t>(dv));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int b = int(it / nv);
      const int64_t h = it % nv, hk = h / group, q_len = s.cu[b + 1] - s.cu[b], row0 = s.cu[b];
      const int32_t slot = s.slots[b];
      if (q_len == 0) continue;
      float* st = slot >= 0 ? state.ptr<float>() + (int64_t(slot) * nv + h) * dk * dv : nullptr;
      if (st && s.start(b) > 0) std::memcpy(S.data(), st, S.size() * 4);
      else std::fill(S.begin(), S.end(), 0.0f);
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t r = row0 + i;
        l2(q.ptr<float>() + r * q.stride[0] + hk * q.stride[1], q_scale, qn.data());
        l2(k.ptr<float>() + r * k.stride[0] + hk * k.stride[1], 1.0f, kn.data());
        const float* vr = v.ptr<float>() + r * v.stride[0] + h * v.stride[1];
        const float decay = std::exp(g.ptr<float>()[r * g.row_stride() + h]);
        const float bt = beta.ptr<float>()[r * beta.row_stride() + h];
        for (float& x : S) x *= decay;
        // delta = beta (v - S^T k); S += k delta^T
        for (int64_t j = 0; j < dv; ++j) {
          double mem = 0;
          for (int64_t a = 0; a < dk; ++a) mem += double(S[size_t(a * dv + j)]) * kn[size_t(a)];
          delta[size_t(j)] = (vr[j] - float(mem)) * bt;
        }
        for (int64_t a = 0; a < dk; ++a)
          for (int64_t j = 0; j < dv; ++j) S[size_t(a * dv + j)] += kn[size_t(a)] * delta[size_t(j)];
        float* o = out.ptr<float>() + r * out.stride[0] + h * out.stride[1];
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t a = 0; a < dk; ++a) acc += double(S[size_t(a * dv + j)]) * qn[size_t(a)];
          o[j] = float(acc);
        }
      }
      if (st) std::memcpy(st, S.data(), S.size() * 4);
    }
  }
}

void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  const int64_t t_n = x.size(0), nh = x.size(1), d = x.size(2);
  TS_CHECK(x.ndim == 3 && z.ndim == 3 && out.ndim == 3 && z.size(0) == t_n && z.size(1) == nh && z.size(2) == d &&
               out.size(0) == t_n && out.size(1) == nh && out.size(2) == d && w.numel() == d,
           "rmsnorm_gated: x {} z {} w {} out {}", x.shape_str(), z.shape_str(), w.shape_str(), out.shape_str());
  if (t_n == 0) return;
#pragma omp parallel for schedule(static) if (t_n > 16)
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* xr = x.ptr<float>() + t * x.stride[0] + h * x.stride[1];
      const float* zr = z.ptr<float>() + t * z.stride[0] + h * z.stride[1];
      float* o = out.ptr<float>() + t * out.stride[0] + h * out.stride[1];
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
      const float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
      for (int64_t i = 0; i < d; ++i) o[i] = w.ptr<float>()[i] * (xr[i] * inv) * silu(zr[i]);
    }
}

void sigmoid_gate(Tensor& x, const Tensor& gate) {
  const int64_t t_n = x.rows(), n = x.size(-1);
  TS_CHECK(gate.rows() == t_n && gate.size(-1) == n, "sigmoid_gate: x {} gate {}", x.shape_str(), gate.shape_str());
  if (t_n == 0) return;
  for (int64_t t = 0; t < t_n; ++t) {
    float* xr = x.ptr<float>() + t * x.row_stride();
    const float* gr = gate.ptr<float>() + t * gate.row_stride();
    for (int64_t i = 0; i < n; ++i) xr[i] *= sigmoid(gr[i]);
  }
}

}  // namespace ts::ops::cpu
