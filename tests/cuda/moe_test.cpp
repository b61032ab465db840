// CUDA mixture-of-experts ops vs the CPU reference: glu (silu, clamped swiglu_oai), cache_write,
// moe_route (softmax / sigmoid + bias / grouped top-k, ties, strided logits, bf16 bias) and
// moe_experts (random and skewed routings, 0/1/odd token counts, odd and non-multiple-of-8 dims,
// strided x and out, every token tile) plus batch invariance of moe_experts.
#include "cuda_test_util.h"

using namespace ts;
using namespace ts::test;

namespace {

Tensor back_i32(const Tensor& d) {
  ::ts::cuda::synchronize();
  return d.to(Device::cpu);
}

// ---- glu -----------------------------------------------------------------------------------------
void check_glu(int64_t T, int64_t I, const ops::GluAct& act, int64_t x_pad, int64_t o_off) {
  Pair xb = Pair::rand({T, 2 * I + x_pad}, 3.0f);
  Tensor xh = xb.h.narrow(1, x_pad, 2 * I), xd = xb.d.narrow(1, x_pad, 2 * I);
  Pair ob = Pair::rand({T, I + 2 * o_off});
  Tensor oh = ob.h.narrow(1, o_off, I), od = ob.d.narrow(1, o_off, I);
  ops::cpu::glu(xh, oh, act);
  ops::cuda::glu(xd, od, act);
  EXPECT_CLOSE(ob.back(), ob.h,
               fmt::format("glu T={} I={} kind={} limit={} pad={}", T, I, int(act.kind), act.limit, x_pad));
}

TEST(CudaMoe, Glu) {
  TS_REQUIRE_CUDA();
  ops::GluAct silu, oai, oai_tight;
  oai.kind = oai_tight.kind = ops::GluKind::swiglu_oai;
  oai_tight.limit = 0.5f;  // most values clamp
  for (const ops::GluAct& a : {silu, oai, oai_tight})
    for (int64_t T : {1, 7, 64})
      for (int64_t I : {8, 32, 768, 13}) {
        check_glu(T, I, a, 0, 0);
        check_glu(T, I, a, 8, 8);  // strided rows, still 16-byte aligned
        check_glu(T, I, a, 3, 1);  // unaligned: scalar path
      }
}

TEST(CudaMoe, GluZeroRows) {
  TS_REQUIRE_CUDA();
  Tensor x = Tensor::empty({0, 64}, DType::bf16, Device::cuda), o = Tensor::empty({0, 32}, DType::bf16, Device::cuda);
  ops::cuda::glu(x, o, ops::GluAct{});
  ::ts::cuda::synchronize();
}

// ---- cache_write -----------------------------------------------------------------------------------
void check_cache_write(int64_t T, int64_t D, int64_t col0, int bs) {
  const int64_t blocks = (T + bs - 1) / bs + 2;
  Pair cache = Pair::rand({blocks, bs, 1, D});
  Pair xb = Pair::rand({T, D + col0 + 8});
  Tensor xh = heads_view(xb.h, col0, 1, D), xd = heads_view(xb.d, col0, 1, D);
  std::vector<int32_t> slots(static_cast<size_t>(blocks * bs));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = int32_t(i);
  std::shuffle(slots.begin(), slots.end(), rng());
  slots.resize(size_t(T));
  for (size_t i = 0; i < slots.size(); i += 3) slots[i] = -1;  // padding rows
  Tensor sh = i32_host(slots);
  ops::cpu::cache_write(xh, cache.h, sh);
  ops::cuda::cache_write(xd, cache.d, to_dev(sh));
  EXPECT_CLOSE(cache.back(), cache.h, fmt::format("cache_write T={} D={} col0={} bs={}", T, D, col0, bs));
}

TEST(CudaMoe, CacheWrite) {
  TS_REQUIRE_CUDA();
  for (int64_t T : {1, 5, 100})
    for (int64_t D : {40, 576, 13})
      for (int64_t col0 : {0, 8, 3}) check_cache_write(T, D, col0, 16);
  check_cache_write(70, 576, 64, 64);
}

// ---- moe_route -------------------------------------------------------------------------------------
// levels > 0: logits (and bias) quantised to that many values, so many exact ties. The levels sit
// off zero so no two different pairs of sigmoid scores have the same exact sum (s(x) + s(-x) = 1
// would make a tie that rounding decides differently on the two backends).
void check_route(int64_t T, int E, const ops::MoeRouting& r, bool use_bias, int levels, bool bias_bf16 = false) {
  Tensor lb = Tensor::empty({std::max<int64_t>(T, 1), int64_t(E) + 5}, DType::f32);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int> lv(0, std::max(levels, 1) - 1);
  for (int64_t i = 0; i < lb.numel(); ++i) lb.ptr<float>()[i] = levels > 0 ? float(lv(rng())) * 0.25f + 0.1f : nd(rng());
  Tensor bias = Tensor::empty({E}, DType::f32);
  std::uniform_real_distribution<float> ud(-0.3f, 0.3f);
  for (int e = 0; e < E; ++e) {
    float v = levels > 0 ? float(lv(rng()) % 3) * 0.125f : ud(rng());
    if (bias_bf16) v = bf16_to_f32(f32_to_bf16(v));
    bias.ptr<float>()[e] = v;
  }
  Tensor lh = lb.slice_rows(0, T).narrow(1, 2, E);
  Tensor ldev_buf = to_dev(lb);
  Tensor ld = ldev_buf.slice_rows(0, T).narrow(1, 2, E);
  const int k = r.top_k;
  Tensor ih = Tensor::empty({T, k}, DType::i32), wh = Tensor::empty({T, k}, DType::f32);
  Tensor id = Tensor::empty({T, k}, DType::i32, Device::cuda), wd = Tensor::empty({T, k}, DType::f32, Device::cuda);
  ops::cpu::moe_route(lh, use_bias ? &bias : nullptr, r, ih, wh);
  Tensor bd = bias_bf16 ? to_dev_bf16(bias) : to_dev(bias);
  ops::cuda::moe_route(ld, use_bias ? &bd : nullptr, r, id, wd);
  if (T == 0) return;
  Tensor ig = back_i32(id), wg = back_i32(wd);
  int64_t id_bad = 0;
  double w_err = 0;
  for (int64_t i = 0; i < T * k; ++i) {
    id_bad += ig.ptr<int32_t>()[i] != ih.ptr<int32_t>()[i];
    const double a = wg.ptr<float>()[i], b = wh.ptr<float>()[i];
    w_err = std::max(w_err, std::fabs(a - b) / std::max(1e-6, std::fabs(b)));
  }
  const std::string desc = fmt::format("route T={} E={} k={} {} groups={}/{} renorm={} bias={} levels={}", T, E, k,
                                       r.scoring == ops::MoeScoring::softmax ? "softmax" : "sigmoid", r.topk_group,
                                       r.n_group, r.renormalize, use_bias, levels);
  std::printf("  [%s] id mismatches %lld, max weight rel err %.2e\n", desc.c_str(), (long long)id_bad, w_err);
  EXPECT_EQ(id_bad, 0) << desc;
  EXPECT_LT(w_err, 1e-4) << desc;
}

TEST(CudaMoe, RouteSoftmax) {
  TS_REQUIRE_CUDA();
  for (int E : {8, 60, 128, 256})
    for (int k : {1, 2, 8})
      for (bool renorm : {false, true})
        for (int levels : {0, 5}) {
          if (k > E) continue;
          ops::MoeRouting r;
          r.top_k = k;
          r.renormalize = renorm;
          check_route(37, E, r, false, levels);
        }
  ops::MoeRouting all;
  all.top_k = 8;
  check_route(3, 8, all, false, 0);  // every expert picked
  check_route(0, 8, all, false, 0);
}

TEST(CudaMoe, RouteSigmoidBias) {
  TS_REQUIRE_CUDA();
  for (int E : {8, 128, 256})
    for (int levels : {0, 4}) {
      ops::MoeRouting r;
      r.scoring = ops::MoeScoring::sigmoid;
      r.top_k = 8 > E ? E : 8;
      r.renormalize = true;
      r.renorm_eps = 1e-20f;
      r.scale = 2.5f;
      check_route(41, E, r, true, levels);
      check_route(41, E, r, false, levels);
      check_route(41, E, r, true, levels, /*bias_bf16=*/true);
    }
}

TEST(CudaMoe, RouteGrouped) {
  TS_REQUIRE_CUDA();
  struct G {
    int E, n_group, topk_group, k;
  };
  for (G g : {G{8, 2, 1, 2}, G{256, 8, 4, 8}, G{64, 8, 3, 6}, G{60, 4, 2, 5}, G{16, 16, 4, 4}, G{96, 3, 3, 8}})
    for (int levels : {0, 6}) {
      ops::MoeRouting r;
      r.scoring = ops::MoeScoring::sigmoid;
      r.top_k = g.k;
      r.n_group = g.n_group;
      r.topk_group = g.topk_group;
      r.renormalize = true;
      r.renorm_eps = 1e-20f;
      r.scale = 2.5f;
      check_route(33, g.E, r, /*use_bias=*/levels == 0, levels);
    }
}

// ---- moe_experts -----------------------------------------------------------------------------------
// mode 0: random distinct experts per token; 1: every token uses experts 0..k-1 (one expert gets
// all tokens, most get none); 2: half the tokens use the last k experts, the rest random.
Tensor make_ids(int64_t T, int64_t E, int64_t k, int mode) {
  Tensor ids = Tensor::empty({T, k}, DType::i32);
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) all[size_t(e)] = int32_t(e);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pick;
    if (mode == 1 || (mode == 2 && t % 2 == 0)) {
      for (int64_t j = 0; j < k; ++j) pick.push_back(int32_t(mode == 1 ? j : E - k + j));
    } else {
      std::shuffle(all.begin(), all.end(), rng());
      pick.assign(all.begin(), all.begin() + k);
    }
    std::sort(pick.begin(), pick.end());
    for (int64_t j = 0; j < k; ++j) ids.ptr<int32_t>()[t * k + j] = pick[size_t(j)];
  }
  return ids;
}

struct ExpertsCase {
  Pair xb, gate_up, down;
  Tensor ids_h, ids_d, w_h, w_d;
  int64_t T, H, I, E, k, x_off;
};

ExpertsCase make_experts(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, int mode, int64_t x_off) {
  ExpertsCase c;
  c.T = T, c.H = H, c.I = I, c.E = E, c.k = k, c.x_off = x_off;
  c.xb = Pair::rand({T, H + x_off + 8});
  c.gate_up = Pair::rand({E, 2 * I, H}, 2.0f / std::sqrt(float(H)));
  c.down = Pair::rand({E, H, I}, 2.0f / std::sqrt(float(I)));
  c.ids_h = make_ids(T, E, k, mode);
  c.ids_d = to_dev(c.ids_h);
  c.w_h = Tensor::empty({T, k}, DType::f32);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  for (int64_t i = 0; i < T * k; ++i) c.w_h.ptr<float>()[i] = ud(rng());
  c.w_d = to_dev(c.w_h);
  return c;
}

void check_experts(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const ops::GluAct& act, int mode,
                   int nt = 0, int64_t x_off = 8, int64_t o_off = 8) {
  ExpertsCase c = make_experts(T, H, I, E, k, mode, x_off);
  Tensor xh = c.xb.h.narrow(1, x_off, H), xd = c.xb.d.narrow(1, x_off, H);
  Pair ob = Pair::rand({T, H + 2 * o_off});
  Tensor oh = ob.h.narrow(1, o_off, H), od = ob.d.narrow(1, o_off, H);
  ops::cpu::moe_experts(xh, c.ids_h, c.w_h, c.gate_up.h, c.down.h, act, oh);
  ops::cuda::moe_experts(xd, c.ids_d, c.w_d, c.gate_up.d, c.down.d, act, od, ops::KernelPolicy{.moe_tile = nt});
  EXPECT_CLOSE(ob.back(), ob.h,
               fmt::format("experts T={} H={} I={} E={} k={} act={} mode={} nt={} x_off={} o_off={}", T, H, I, E, k,
                           int(act.kind), mode, nt, x_off, o_off));
}

TEST(CudaMoe, ExpertsFixtureShapes) {
  TS_REQUIRE_CUDA();
  ops::GluAct silu, oai;
  oai.kind = ops::GluKind::swiglu_oai;
  oai.limit = 1.0f;
  for (int64_t T : {1, 2, 3, 17, 64})
    for (int mode : {0, 1, 2}) {
      check_experts(T, 64, 32, 8, 2, silu, mode);
      check_experts(T, 64, 32, 8, 2, oai, mode);
    }
}

TEST(CudaMoe, ExpertsTokenTiles) {
  TS_REQUIRE_CUDA();
  ops::GluAct silu;
  for (int nt : {1, 2, 4, 8})
    for (int64_t T : {1, 9, 100})
      for (int mode : {0, 1}) check_experts(T, 128, 96, 16, 4, silu, mode, nt);
}

TEST(CudaMoe, ExpertsOddShapes) {
  TS_REQUIRE_CUDA();
  ops::GluAct silu, oai;
  oai.kind = ops::GluKind::swiglu_oai;
  for (const ops::GluAct& a : {silu, oai}) {
    check_experts(5, 40, 24, 6, 3, a, 0);        // K not a multiple of 32: zero-filled chunk tails
    check_experts(5, 36, 20, 6, 3, a, 0);        // K % 8 != 0: scalar loads
    check_experts(7, 64, 32, 8, 2, a, 0, 0, 3, 5);  // unaligned strided x and out
    check_experts(1, 64, 32, 1, 1, a, 0);        // one expert, top-1
    check_experts(11, 64, 16, 8, 8, a, 0);       // every expert for every token
    check_experts(3, 48, 40, 300, 2, a, 0);      // many experts, few tokens
  }
}

TEST(CudaMoe, ExpertsLarger) {
  TS_REQUIRE_CUDA();
  ops::GluAct silu;
  for (int64_t T : {1, 8, 64, 300})
    for (int mode : {0, 2}) check_experts(T, 512, 256, 32, 8, silu, mode);
  check_experts(200, 256, 128, 8, 2, silu, 1);  // one expert with 200 rows: several work items
}

TEST(CudaMoe, ExpertsZeroTokens) {
  TS_REQUIRE_CUDA();
  Tensor x = Tensor::empty({0, 64}, DType::bf16, Device::cuda), out = Tensor::empty({0, 64}, DType::bf16, Device::cuda);
  Tensor ids = Tensor::empty({0, 2}, DType::i32, Device::cuda), w = Tensor::empty({0, 2}, DType::f32, Device::cuda);
  Tensor gu = Tensor::empty({8, 64, 64}, DType::bf16, Device::cuda), dn = Tensor::empty({8, 64, 32}, DType::bf16, Device::cuda);
  ops::cuda::moe_experts(x, ids, w, gu, dn, ops::GluAct{}, out);
  ::ts::cuda::synchronize();
}

// A token's output is bit-identical whether it runs alone or in a batch, whatever the token tile.
TEST(CudaMoe, ExpertsBatchInvariant) {
  TS_REQUIRE_CUDA();
  const int64_t T = 37, H = 256, I = 128, E = 16, k = 4;
  ExpertsCase c = make_experts(T, H, I, E, k, 2, 8);
  Tensor xd = c.xb.d.narrow(1, 8, H);
  ops::GluAct act;
  Tensor full = Tensor::empty({T, H}, DType::bf16, Device::cuda);
  ops::cuda::moe_experts(xd, c.ids_d, c.w_d, c.gate_up.d, c.down.d, act, full, ops::KernelPolicy{.moe_tile = 4});
  ::ts::cuda::synchronize();
  Tensor fh = full.to(Device::cpu);
  int64_t bad = 0;
  for (int64_t t : {0, 1, 18, 36}) {
    for (int nt : {1, 8}) {
      Tensor one = Tensor::empty({1, H}, DType::bf16, Device::cuda);
      ops::cuda::moe_experts(xd.slice_rows(t, t + 1), c.ids_d.slice_rows(t, t + 1), c.w_d.slice_rows(t, t + 1),
                             c.gate_up.d, c.down.d, act, one, ops::KernelPolicy{.moe_tile = nt});
      ::ts::cuda::synchronize();
      Tensor oh = one.to(Device::cpu);
      for (int64_t i = 0; i < H; ++i) bad += oh.ptr<uint16_t>()[i] != fh.ptr<uint16_t>()[t * H + i];
    }
  }
  EXPECT_EQ(bad, 0) << "moe_experts results depend on the batch";
}

// Router + experts end to end, Qwen3-MoE-like (softmax, renormalised) at a reduced size.
TEST(CudaMoe, RouteThenExperts) {
  TS_REQUIRE_CUDA();
  const int64_t H = 256, I = 64, E = 32, k = 4;
  for (int64_t T : {1, 13, 64}) {
    Pair x = Pair::rand({T, H}), router = Pair::rand({E, H}, 0.2f);
    Pair gu = Pair::rand({E, 2 * I, H}, 0.1f), dn = Pair::rand({E, H, I}, 0.2f);
    ops::MoeRouting r;
    r.top_k = int(k);
    r.renormalize = true;
    Tensor lg_h = Tensor::empty({T, E}, DType::f32);
    ops::cpu::linear(x.h, router.h, lg_h, nullptr);
    Tensor ih = Tensor::empty({T, k}, DType::i32), wh = Tensor::empty({T, k}, DType::f32);
    ops::cpu::moe_route(lg_h, nullptr, r, ih, wh);
    Tensor oh = Tensor::empty({T, H}, DType::f32);
    ops::cpu::moe_experts(x.h, ih, wh, gu.h, dn.h, ops::GluAct{}, oh);
    // The GPU routes the CPU's logits (bf16 GEMM rounding could flip near-tied experts).
    Tensor lg_d = to_dev(lg_h);
    Tensor id = Tensor::empty({T, k}, DType::i32, Device::cuda), wd = Tensor::empty({T, k}, DType::f32, Device::cuda);
    ops::cuda::moe_route(lg_d, nullptr, r, id, wd);
    Pair o = Pair::rand({T, H});
    ops::cuda::moe_experts(x.d, id, wd, gu.d, dn.d, ops::GluAct{}, o.d);
    EXPECT_CLOSE(o.back(), oh, fmt::format("route+experts T={}", T));
  }
}

}  // namespace
