// CUDA Gated DeltaNet ops (Qwen3.5 linear attention) vs the CPU reference: the causal conv and
// the delta rule over mixed batches (decodes, fresh prefills, later chunks carrying state,
// slot -1, padding rows) at the fixture's dims and at real-model dims, with the state rows
// they leave behind; the gates, the gated norm, the attention output gate; zero tokens.
#include "paged_meta.h"

using namespace ts;
using namespace ts::test;

namespace {

// Host and device state-slot vectors.
struct Slots {
  Tensor h, d;
  explicit Slots(const std::vector<int32_t>& v)
      : h(i32_host(v)), d(v.empty() ? Tensor::empty({0}, DType::i32, Device::cuda) : to_dev(i32_host(v))) {}
};

// Random f32 values in [lo, hi] (host) and the same on the device.
std::pair<Tensor, Tensor> uniform_f32(std::vector<int64_t> shape, float lo, float hi) {
  Tensor h = Tensor::empty(std::move(shape), DType::f32);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < h.numel(); ++i) h.ptr<float>()[i] = u(rng());
  return {h, to_dev(h)};
}

void check_conv(const std::vector<SeqLens>& seqs, const std::vector<int32_t>& slotv, int64_t C, int64_t K, int pad_rows) {
  PagedMeta m = make_paged(seqs, 16, pad_rows);
  const int64_t T = m.rows;
  Slots slots(slotv);
  Pair xb = Pair::rand({T, C + 8});
  Tensor xh = xb.h.narrow(1, 8, C), xd = xb.d.narrow(1, 8, C);
  Pair w = Pair::rand({C, K}, 0.5f);
  Pair st = Pair::rand({4, K - 1, C});
  Tensor oh = Tensor::empty({T, C}, DType::f32), od = Tensor::empty({T, C}, DType::bf16, Device::cuda);
  ops::cpu::causal_conv1d(xh, w.h, st.h, slots.h, m.h, oh);
  ops::cuda::causal_conv1d(xd, w.d, st.d, slots.d, m.d, od);
  const std::string desc = fmt::format("conv B={} C={} K={} pad={}", seqs.size(), C, K, pad_rows);
  EXPECT_CLOSE(to_host_f32(od), oh, desc + " out");
  EXPECT_CLOSE(st.back(), st.h, desc + " state");
}

TEST(CudaGatedDelta, CausalConv) {
  TS_REQUIRE_CUDA();
  // (q_len, kv_len): decode carrying state, fresh prefill, later chunk shorter than the window,
  // a carried decode whose slot is -1 (starts from zero), then padding rows.
  std::vector<SeqLens> seqs{{1, 9}, {17, 17}, {2, 40}, {1, 5}};
  check_conv(seqs, {2, 0, 3, -1}, 128, 4, 2);   // fixture: conv_dim 128, kernel 4
  check_conv(seqs, {1, 3, 0, 2}, 10240, 4, 0);  // Qwen3.5-27B-like conv_dim
  check_conv({{5, 5}, {1, 3}}, {0, 1}, 40, 2, 1);
  check_conv({{9, 30}}, {3}, 24, 8, 0);          // the largest kernel supported
}

struct DeltaDims {
  int64_t nk, nv, dk, dv;
};

void check_delta(const std::vector<SeqLens>& seqs, const std::vector<int32_t>& slotv, DeltaDims d, int pad_rows) {
  PagedMeta m = make_paged(seqs, 16, pad_rows);
  const int64_t T = m.rows;
  Slots slots(slotv);
  // q | k | v columns of one buffer (strided rows), as the model's conv output.
  const int64_t qw = d.nk * d.dk, vw = d.nv * d.dv;
  Pair buf = Pair::rand({T, 2 * qw + vw});
  Tensor qh = heads_view(buf.h, 0, d.nk, d.dk), qd = heads_view(buf.d, 0, d.nk, d.dk);
  Tensor kh = heads_view(buf.h, qw, d.nk, d.dk), kd = heads_view(buf.d, qw, d.nk, d.dk);
  Tensor vh = heads_view(buf.h, 2 * qw, d.nv, d.dv), vd = heads_view(buf.d, 2 * qw, d.nv, d.dv);
  auto [gh, gd] = uniform_f32({T, d.nv}, -2.0f, 0.0f);
  auto [bh, bd] = uniform_f32({T, d.nv}, 0.0f, 1.0f);
  auto [sh, sd] = uniform_f32({4, d.nv, d.dk, d.dv}, -0.5f, 0.5f);
  Tensor oh = Tensor::empty({T, d.nv, d.dv}, DType::f32), od = Tensor::empty({T, d.nv, d.dv}, DType::bf16, Device::cuda);
  ops::cpu::gated_delta_rule(qh, kh, vh, gh, bh, sh, slots.h, m.h, oh);
  ops::cuda::gated_delta_rule(qd, kd, vd, gd, bd, sd, slots.d, m.d, od);
  const std::string desc =
      fmt::format("delta B={} nk={} nv={} dk={} dv={} pad={}", seqs.size(), d.nk, d.nv, d.dk, d.dv, pad_rows);
  EXPECT_CLOSE(to_host_f32(od), oh, desc + " out");
  EXPECT_CLOSE(to_host_f32(sd), sh, desc + " state");
}

TEST(CudaGatedDelta, DeltaRule) {
  TS_REQUIRE_CUDA();
  std::vector<SeqLens> seqs{{1, 9}, {17, 17}, {2, 40}, {1, 5}};
  check_delta(seqs, {2, 0, 3, -1}, {2, 4, 16, 16}, 2);        // fixture dims
  check_delta(seqs, {1, 3, 0, 2}, {16, 48, 128, 128}, 0);     // Qwen3.5-27B-like dims
  check_delta({{64, 64}, {1, 100}}, {0, 1}, {4, 4, 64, 32}, 1);  // dv < dk, nv == nk
  check_delta({{3, 3}}, {2}, {1, 2, 24, 40}, 0);                // dv not a multiple of 32
}

TEST(CudaGatedDelta, GatesNormAndOutputGate) {
  TS_REQUIRE_CUDA();
  const int64_t T = 37, nv = 48;
  Pair ab = Pair::rand({T, 2 * nv + 4}, 8.0f);  // wide range: softplus' linear branch too
  auto [Ah, Ad] = uniform_f32({nv}, -3.0f, 3.0f);
  auto [dh, dd] = uniform_f32({nv}, -1.0f, 1.0f);
  Tensor gh = Tensor::empty({T, nv}, DType::f32), bh = Tensor::empty({T, nv}, DType::f32);
  Tensor gd = Tensor::empty({T, nv}, DType::f32, Device::cuda), bd = Tensor::empty({T, nv}, DType::f32, Device::cuda);
  ops::cpu::gdn_gates(ab.h.narrow(1, 4, nv), ab.h.narrow(1, 4 + nv, nv), Ah, dh, gh, bh);
  ops::cuda::gdn_gates(ab.d.narrow(1, 4, nv), ab.d.narrow(1, 4 + nv, nv), Ad, dd, gd, bd);
  EXPECT_CLOSE(to_host_f32(gd), gh, "gdn_gates g");
  EXPECT_CLOSE(to_host_f32(bd), bh, "gdn_gates beta");

  for (int64_t dv : {16, 128, 40}) {
    Pair x = Pair::rand({T, 4, dv}), zb = Pair::rand({T, 4 * dv + 8}), w = Pair::rand({dv});
    Tensor zh = heads_view(zb.h, 8, 4, dv), zd = heads_view(zb.d, 8, 4, dv);
    Tensor oh = Tensor::empty({T, 4, dv}, DType::f32);
    ops::cpu::rmsnorm_gated(x.h, zh, w.h, 1e-6f, oh);
    ops::cuda::rmsnorm_gated(x.d, zd, w.d, 1e-6f, x.d);  // in place, as the model runs it
    EXPECT_CLOSE(x.back(), oh, fmt::format("rmsnorm_gated dv={}", dv));
  }

  Pair y = Pair::rand({T, 64}), gate = Pair::rand({T, 200}, 4.0f);
  Tensor yh = y.h.narrow(1, 0, 64), yd = y.d;
  ops::cpu::sigmoid_gate(yh, gate.h.narrow(1, 100, 64));
  ops::cuda::sigmoid_gate(yd, gate.d.narrow(1, 100, 64));
  EXPECT_CLOSE(y.back(), y.h, "sigmoid_gate");
}

TEST(CudaGatedDelta, ZeroTokens) {
  TS_REQUIRE_CUDA();
  PagedMeta m = make_paged({}, 16);
  Slots slots({});
  Tensor x = Tensor::empty({0, 12}, DType::bf16, Device::cuda), o = Tensor::empty({0, 12}, DType::bf16, Device::cuda);
  Tensor w = Tensor::zeros({12, 4}, DType::bf16, Device::cuda), cs = Tensor::zeros({1, 3, 12}, DType::bf16, Device::cuda);
  ops::cuda::causal_conv1d(x, w, cs, slots.d, m.d, o);
  Tensor q = Tensor::empty({0, 2, 16}, DType::bf16, Device::cuda), v = Tensor::empty({0, 4, 16}, DType::bf16, Device::cuda);
  Tensor g = Tensor::empty({0, 4}, DType::f32, Device::cuda), st = Tensor::zeros({1, 4, 16, 16}, DType::f32, Device::cuda);
  Tensor out = Tensor::empty({0, 4, 16}, DType::bf16, Device::cuda);
  ops::cuda::gated_delta_rule(q, q, v, g, g, st, slots.d, m.d, out);
  ops::cuda::rmsnorm_gated(out, out, Tensor::zeros({16}, DType::bf16, Device::cuda), 1e-6f, out);
  ::ts::cuda::synchronize();
}

}  // namespace
