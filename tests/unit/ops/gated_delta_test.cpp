// Gated DeltaNet ops (CPU) against naive double-precision references written from the
// definitions: the gated delta rule, the causal conv with its carried window, the gates and
// the gated norm; state carried across chunks (any split equals the whole sequence), several
// sequences per batch, reset at position 0, padding and zero-token batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ops/ops.h"

using namespace ts;

namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& g, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(g);
  return t;
}

Tensor i32(std::vector<int32_t> v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

// Step metadata for sequences given as (tokens already processed, new tokens); rows follow
// the sequences, then `pad_rows` rows outside every sequence.
struct Meta {
  ops::AttnMeta m;
  Tensor slots;
  int64_t rows = 0;
  Meta(const std::vector<std::pair<int, int>>& seqs, std::vector<int32_t> slotv, int pad_rows = 0) {
    std::vector<int32_t> cu{0}, kv;
    for (auto [done, fresh] : seqs) {
      cu.push_back(cu.back() + fresh);
      kv.push_back(done + fresh);
    }
    rows = cu.back() + pad_rows;
    m.cu_q = i32(cu);
    m.kv_len = i32(kv);
    m.num_seqs = int(seqs.size());
    slots = i32(slotv);
  }
};

constexpr int64_t NK = 2, NV = 4, DK = 8, DV = 6, K = 4;

// One sequence's inputs, [L, ...] f32 each.
struct SeqInputs {
  Tensor q, k, v, g, beta;
};

SeqInputs random_seq(int64_t L, std::mt19937& gen) {
  SeqInputs s{random_tensor({L, NK, DK}, gen), random_tensor({L, NK, DK}, gen), random_tensor({L, NV, DV}, gen),
              Tensor::empty({L, NV}, DType::f32), Tensor::empty({L, NV}, DType::f32)};
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < L * NV; ++i) {
    s.g.ptr<float>()[i] = -2.0f * u(gen);  // log decay <= 0
    s.beta.ptr<float>()[i] = u(gen);
  }
  return s;
}

// The definition, in double: normalise, then per token S = e^g S + k (beta (v - S^T k))^T,
// o = S^T q / sqrt(dk). Returns o [L, NV, DV] and the final state [NV, DK, DV].
void naive_delta(const SeqInputs& s, int64_t L, std::vector<double>& o, std::vector<double>& state) {
  o.assign(size_t(L * NV * DV), 0.0);
  state.assign(size_t(NV * DK * DV), 0.0);
  for (int64_t h = 0; h < NV; ++h) {
    int64_t hk = h / (NV / NK);
    double* S = state.data() + h * DK * DV;
    for (int64_t t = 0; t < L; ++t) {
      double q[DK], k[DK], nq = 0, nk = 0;
      for (int64_t i = 0; i < DK; ++i) {
        q[i] = s.q.ptr<float>()[(t * NK + hk) * DK + i];
        k[i] = s.k.ptr<float>()[(t * NK + hk) * DK + i];
        nq += q[i] * q[i];
        nk += k[i] * k[i];
      }
      for (int64_t i = 0; i < DK; ++i) {
        q[i] /= std::sqrt(nq + 1e-6) * std::sqrt(double(DK));
        k[i] /= std::sqrt(nk + 1e-6);
      }
      double decay = std::exp(double(s.g.ptr<float>()[t * NV + h])), beta = s.beta.ptr<float>()[t * NV + h];
      for (int64_t i = 0; i < DK * DV; ++i) S[i] *= decay;
      for (int64_t j = 0; j < DV; ++j) {
        double mem = 0;
        for (int64_t i = 0; i < DK; ++i) mem += S[i * DV + j] * k[i];
        double delta = beta * (s.v.ptr<float>()[(t * NV + h) * DV + j] - mem);
        for (int64_t i = 0; i < DK; ++i) S[i * DV + j] += k[i] * delta;
      }
      for (int64_t j = 0; j < DV; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < DK; ++i) acc += S[i * DV + j] * q[i];
        o[size_t((t * NV + h) * DV + j)] = acc;
      }
    }
  }
}

// Copies rows [r0, r0 + n) of src into rows [d0, d0 + n) of dst (same row width).
void put_rows(const Tensor& src, int64_t r0, Tensor& dst, int64_t d0, int64_t n) {
  int64_t w = src.numel() / src.size(0);
  std::memcpy(dst.ptr<float>() + d0 * w, src.ptr<float>() + r0 * w, size_t(n * w) * 4);
}

// Runs gated_delta_rule over a batch whose sequence b takes rows [from[b], from[b] + n[b]) of
// seqs[b]; returns the output [rows, NV, DV].
Tensor run_delta(const std::vector<SeqInputs>& seqs, const std::vector<int>& from, const std::vector<int>& n,
                 const std::vector<int32_t>& slots, Tensor& state, int pad_rows = 0) {
  std::vector<std::pair<int, int>> shape;
  for (size_t b = 0; b < seqs.size(); ++b) shape.push_back({from[b], n[b]});
  Meta meta(shape, slots, pad_rows);
  int64_t T = meta.rows;
  Tensor q = Tensor::zeros({T, NK, DK}, DType::f32), k = Tensor::zeros({T, NK, DK}, DType::f32);
  Tensor v = Tensor::zeros({T, NV, DV}, DType::f32), g = Tensor::zeros({T, NV}, DType::f32);
  Tensor beta = Tensor::zeros({T, NV}, DType::f32);
  int64_t row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    put_rows(seqs[b].q, from[b], q, row, n[b]);
    put_rows(seqs[b].k, from[b], k, row, n[b]);
    put_rows(seqs[b].v, from[b], v, row, n[b]);
    put_rows(seqs[b].g, from[b], g, row, n[b]);
    put_rows(seqs[b].beta, from[b], beta, row, n[b]);
    row += n[b];
  }
  Tensor out = Tensor::empty({T, NV, DV}, DType::f32);
  for (int64_t i = 0; i < out.numel(); ++i) out.ptr<float>()[i] = 99.0f;  // must be overwritten
  ops::gated_delta_rule(q, k, v, g, beta, state, meta.slots, meta.m, out);
  return out;
}

void fill(Tensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = v;
}

TEST(GatedDeltaRule, BatchMatchesNaiveAndKeepsState) {
  std::mt19937 gen(7);
  std::vector<int> lens{5, 1, 9};
  std::vector<SeqInputs> seqs;
  for (int L : lens) seqs.push_back(random_seq(L, gen));
  Tensor state = Tensor::empty({4, NV, DK, DV}, DType::f32);
  fill(state, 3.0f);  // stale rows: every sequence starts at position 0, so they are ignored
  std::vector<int32_t> slots{2, 0, 3};
  Tensor out = run_delta(seqs, {0, 0, 0}, lens, slots, state);
  int64_t row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    std::vector<double> ref, ref_state;
    naive_delta(seqs[b], lens[b], ref, ref_state);
    for (int64_t i = 0; i < lens[b] * NV * DV; ++i)
      ASSERT_NEAR(out.ptr<float>()[row * NV * DV + i], ref[size_t(i)], 2e-5) << "seq " << b << " elem " << i;
    const float* st = state.ptr<float>() + int64_t(slots[b]) * NV * DK * DV;
    for (int64_t i = 0; i < NV * DK * DV; ++i) ASSERT_NEAR(st[i], ref_state[size_t(i)], 2e-5) << "state of seq " << b;
    row += lens[b];
  }
  const float* untouched = state.ptr<float>() + 1 * NV * DK * DV;
  for (int64_t i = 0; i < NV * DK * DV; ++i) ASSERT_EQ(untouched[i], 3.0f);
}

TEST(GatedDeltaRule, AnyChunkingEqualsWholeSequence) {
  std::mt19937 gen(11);
  const int L = 13;
  std::vector<SeqInputs> a{random_seq(L, gen)}, both{a[0], random_seq(L, gen)};
  Tensor s_whole = Tensor::zeros({2, NV, DK, DV}, DType::f32);
  Tensor whole = run_delta(a, {0}, {L}, {1}, s_whole);
  for (std::vector<int> split : {std::vector<int>{1, 4, 7, 1}, std::vector<int>{1, 1, 1, 10}, std::vector<int>{7, 6}}) {
    Tensor st = Tensor::zeros({3, NV, DK, DV}, DType::f32);
    int done = 0;
    for (int n : split) {
      // The second sequence rides along in the same batch (its own slot, a different split).
      int n2 = std::min(3, L - std::min(done, L - 1));
      Tensor part = run_delta(both, {done, std::min(done, L - n2)}, {n, n2}, {0, 2}, st, 2);
      for (int64_t i = 0; i < n * NV * DV; ++i)
        ASSERT_EQ(part.ptr<float>()[i], whole.ptr<float>()[done * NV * DV + i]) << "chunk at " << done;
      for (int64_t i = (n + n2) * NV * DV; i < part.numel(); ++i) ASSERT_EQ(part.ptr<float>()[i], 0.0f) << "padding row";
      done += n;
    }
    for (int64_t i = 0; i < NV * DK * DV; ++i) ASSERT_EQ(st.ptr<float>()[i], s_whole.ptr<float>()[NV * DK * DV + i]);
  }
}

TEST(GatedDeltaRule, NoSlotStartsFromZeroAndSavesNothing) {
  std::mt19937 gen(3);
  std::vector<SeqInputs> a{random_seq(4, gen)};
  // Rows 2..3 of the sequence (2 tokens "already done") with slot -1 (padding): zero initial
  // state, the same as a fresh 2-token sequence, and no row is written.
  std::vector<SeqInputs> tail{SeqInputs{a[0].q.slice_rows(2, 4), a[0].k.slice_rows(2, 4), a[0].v.slice_rows(2, 4),
                                        a[0].g.slice_rows(2, 4), a[0].beta.slice_rows(2, 4)}};
  Tensor zero = Tensor::zeros({1, NV, DK, DV}, DType::f32);
  Tensor want = run_delta(tail, {0}, {2}, {0}, zero);
  Tensor st = Tensor::empty({1, NV, DK, DV}, DType::f32);
  fill(st, 5.0f);
  Tensor got = run_delta(a, {2}, {2}, {-1}, st);
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.ptr<float>()[i], want.ptr<float>()[i]);
  for (int64_t i = 0; i < st.numel(); ++i) ASSERT_EQ(st.ptr<float>()[i], 5.0f);
}

TEST(GatedDeltaRule, ZeroTokens) {
  Meta meta({}, {});
  Tensor q = Tensor::empty({0, NK, DK}, DType::f32), k = Tensor::empty({0, NK, DK}, DType::f32);
  Tensor v = Tensor::empty({0, NV, DV}, DType::f32), g = Tensor::empty({0, NV}, DType::f32);
  Tensor beta = Tensor::empty({0, NV}, DType::f32), out = Tensor::empty({0, NV, DV}, DType::f32);
  Tensor st = Tensor::zeros({1, NV, DK, DV}, DType::f32);
  ops::gated_delta_rule(q, k, v, g, beta, st, meta.slots, meta.m, out);
  Tensor x = Tensor::empty({0, 12}, DType::f32), w = Tensor::zeros({12, K}, DType::f32), o = Tensor::empty({0, 12}, DType::f32);
  Tensor cs = Tensor::zeros({1, K - 1, 12}, DType::f32);
  ops::causal_conv1d(x, w, cs, meta.slots, meta.m, o);
}

// Naive causal conv + SiLU over a whole sequence x [L, C] (zeros before the start).
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, int64_t L, int64_t C) {
  std::vector<double> o(size_t(L * C));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += double(w.ptr<float>()[c * K + j]) * x.ptr<float>()[src * C + c];
      }
      o[size_t(t * C + c)] = acc / (1.0 + std::exp(-acc));
    }
  return o;
}

TEST(CausalConv1d, ChunksMatchNaiveWholeSequence) {
  std::mt19937 gen(5);
  const int64_t L = 11, C = 12;
  Tensor x = random_tensor({L, C}, gen), w = random_tensor({C, K}, gen, 0.5f);
  std::vector<double> ref = naive_conv(x, w, L, C);
  for (std::vector<int> split : {std::vector<int>{11}, std::vector<int>{1, 1, 2, 7}, std::vector<int>{2, 1, 5, 3}}) {
    Tensor cs = Tensor::empty({2, K - 1, C}, DType::f32);
    fill(cs, 7.0f);  // stale: the first chunk starts at position 0
    int done = 0;
    for (int n : split) {
      // Sequence in slot 1, behind a one-token sequence at position 0 in slot 0, then a padding row.
      Meta meta({{0, 1}, {done, n}}, {0, 1}, 1);
      Tensor in = Tensor::zeros({meta.rows, 2 * C}, DType::f32);  // strided: x in the first C columns
      for (int64_t i = 0; i < n; ++i) std::memcpy(in.ptr<float>() + (1 + i) * 2 * C, x.ptr<float>() + (done + i) * C, size_t(C) * 4);
      Tensor out = Tensor::empty({meta.rows, C}, DType::f32);
      fill(out, 99.0f);
      ops::causal_conv1d(in.narrow(1, 0, C), w, cs, meta.slots, meta.m, out);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < C; ++c)
          ASSERT_NEAR(out.ptr<float>()[(1 + i) * C + c], ref[size_t((done + i) * C + c)], 1e-5) << "t " << done + i;
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out.ptr<float>()[(meta.rows - 1) * C + c], 0.0f) << "padding row";
      done += n;
    }
    // The window holds the last K-1 inputs.
    for (int64_t j = 0; j < K - 1; ++j)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(cs.ptr<float>()[((K - 1) + j) * C + c], x.ptr<float>()[(L - (K - 1) + j) * C + c]);
  }
}

TEST(GdnGates, MatchDefinition) {
  std::mt19937 gen(9);
  const int64_t T = 3;
  Tensor ab = random_tensor({T, 2 * NV}, gen, 10.0f);  // large values reach softplus' linear branch
  Tensor A_log = random_tensor({NV}, gen), dt = random_tensor({NV}, gen);
  Tensor g = Tensor::empty({T, NV}, DType::f32), beta = Tensor::empty({T, NV}, DType::f32);
  ops::gdn_gates(ab.narrow(1, 0, NV), ab.narrow(1, NV, NV), A_log, dt, g, beta);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < NV; ++h) {
      double a = ab.ptr<float>()[t * 2 * NV + h] + dt.ptr<float>()[h], b = ab.ptr<float>()[t * 2 * NV + NV + h];
      double sp = a > 20 ? a : std::log1p(std::exp(a));
      EXPECT_NEAR(g.ptr<float>()[t * NV + h], -std::exp(double(A_log.ptr<float>()[h])) * sp, 1e-4 * (1 + std::fabs(sp)));
      EXPECT_NEAR(beta.ptr<float>()[t * NV + h], 1.0 / (1.0 + std::exp(-b)), 1e-6);
    }
}

TEST(RmsNormGated, AndSigmoidGate) {
  std::mt19937 gen(13);
  const int64_t T = 2, D = 5;
  Tensor x = random_tensor({T, 3, D}, gen), z = random_tensor({T, 3, D}, gen), w = random_tensor({D}, gen);
  Tensor out = Tensor::empty({T, 3, D}, DType::f32);
  ops::rmsnorm_gated(x, z, w, 1e-6f, out);
  for (int64_t r = 0; r < T * 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x.ptr<float>()[r * D + i]) * x.ptr<float>()[r * D + i];
    double inv = 1.0 / std::sqrt(ss / D + 1e-6);
    for (int64_t i = 0; i < D; ++i) {
      double zz = z.ptr<float>()[r * D + i];
      EXPECT_NEAR(out.ptr<float>()[r * D + i], x.ptr<float>()[r * D + i] * inv * w.ptr<float>()[i] * zz / (1 + std::exp(-zz)), 1e-5);
    }
  }
  Tensor y = random_tensor({T, 4}, gen), gate = random_tensor({T, 8}, gen);
  Tensor y0 = Tensor::empty({T, 4}, DType::f32);
  std::memcpy(y0.data, y.data, size_t(y.numel()) * 4);
  ops::sigmoid_gate(y, gate.narrow(1, 4, 4));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(y.ptr<float>()[t * 4 + i], y0.ptr<float>()[t * 4 + i] / (1 + std::exp(-gate.ptr<float>()[t * 8 + 4 + i])), 1e-6);
}

}  // namespace
