// CUDA expert-parallel dispatch / combine kernels vs the CPU ops (ops/moe_dispatch.h) on one GPU:
// ep_plan / ep_pack / ep_expand positions equal exactly (deterministic scans), ep_fold within bf16
// rounding, ep_local_ids; the masked-id contract the EP partial flow relies on (CUDA moe_experts
// skips id -1); and the whole single-rank EP forward on the GPU against moe_experts.
#include <algorithm>

#include "cuda_test_util.h"
#include "ops/moe_dispatch.h"
#include "parallel/moe.h"

using namespace ts;
using namespace ts::test;

namespace {

Tensor back_i32(const Tensor& d) {
  ::ts::cuda::synchronize();
  return d.to(Device::cpu);
}
std::vector<int32_t> vec(const Tensor& t, int64_t n = -1) {
  return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + (n < 0 ? t.numel() : n));
}

// Sorted distinct expert ids per token (as moe_route gives), optionally avoiding the last experts.
Tensor random_ids(int64_t T, int k, int64_t E, int64_t avoid) {
  Tensor ids = Tensor::empty({T, int64_t(k)}, DType::i32);
  std::vector<int32_t> pool(size_t(E - avoid));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng());
    std::vector<int32_t> pick(pool.begin(), pool.begin() + k);
    std::sort(pick.begin(), pick.end());
    for (int j = 0; j < k; ++j) ids.ptr<int32_t>()[t * k + j] = pick[size_t(j)];
  }
  return ids;
}

Tensor rand_w(int64_t T, int k) {
  Tensor w = Tensor::empty({T, int64_t(k)}, DType::f32);
  std::uniform_real_distribution<float> d(0.1f, 1.0f);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = d(rng());
  return w;
}

}  // namespace

TEST(CudaEpOps, PlanPackExpandMatchTheCpu) {
  TS_REQUIRE_CUDA();
  for (int R : {1, 2, 3, 8, 64})
    for (int k : {1, 2, 8})
      for (int64_t T : {0, 1, 37, 1000}) {
        const int64_t E = int64_t(R) * std::max(2, (k + std::max(R - 1, 1) - 1) / std::max(R - 1, 1) + 1);
        if (k > E) continue;
        SCOPED_TRACE(testing::Message() << "R " << R << " k " << k << " T " << T);
        Tensor ids = random_ids(T, k, E, R > 1 ? E / R : 0);  // the last rank gets nothing
        const int64_t cap = std::max<int64_t>(1, T * std::min<int64_t>(k, R));
        Tensor c_h = Tensor::empty({2, int64_t(R)}, DType::i32), rp_h = Tensor::empty({T, int64_t(k)}, DType::i32),
               sp_h = Tensor::empty({T, int64_t(k)}, DType::i32), rt_h = Tensor::zeros({cap}, DType::i32);
        ops::cpu::ep_plan(ids, E, R, c_h, rp_h, sp_h, rt_h);
        Tensor ids_d = ids.to(Device::cuda);
        Tensor c_d = Tensor::empty({2, int64_t(R)}, DType::i32, Device::cuda),
               rp_d = Tensor::empty({T, int64_t(k)}, DType::i32, Device::cuda),
               sp_d = Tensor::empty({T, int64_t(k)}, DType::i32, Device::cuda),
               rt_d = Tensor::zeros({cap}, DType::i32, Device::cuda);
        ops::cuda::ep_plan(ids_d, E, R, c_d, rp_d, sp_d, rt_d);
        EXPECT_EQ(vec(back_i32(c_d)), vec(c_h));
        EXPECT_EQ(vec(back_i32(rp_d)), vec(rp_h));
        EXPECT_EQ(vec(back_i32(sp_d)), vec(sp_h));
        int64_t S = 0, M = 0;
        for (int r = 0; r < R; ++r) {
          S += c_h.ptr<int32_t>()[r];
          M += c_h.ptr<int32_t>()[R + r];
        }
        EXPECT_EQ(vec(back_i32(rt_d), S), vec(rt_h, S));
        // Pack.
        const int64_t H = 72;
        Pair x = Pair::rand({T, H});
        Tensor w = rand_w(T, k), w_d = w.to(Device::cuda);
        Tensor sx_h = Tensor::empty({S, H}, DType::f32), si_h = Tensor::empty({S, int64_t(k)}, DType::i32),
               sw_h = Tensor::empty({S, int64_t(k)}, DType::f32);
        ops::cpu::ep_pack(x.h, ids, w, rt_h, c_h, E, sx_h, si_h, sw_h);
        Tensor sx_d = Tensor::empty({S, H}, DType::bf16, Device::cuda),
               si_d = Tensor::empty({S, int64_t(k)}, DType::i32, Device::cuda),
               sw_d = Tensor::empty({S, int64_t(k)}, DType::f32, Device::cuda);
        ops::cuda::ep_pack(x.d, ids_d, w_d, rt_d, c_d, E, sx_d, si_d, sw_d);
        EXPECT_EQ(rel_err(to_host_f32(sx_d), sx_h), 0.0);  // a copy: exact
        EXPECT_EQ(vec(back_i32(si_d)), vec(si_h));
        Tensor sw_back = back_i32(sw_d);
        EXPECT_EQ(0, std::memcmp(sw_back.data, sw_h.data, sw_h.nbytes()));
        // Expand the packed ids as a receiver would (all ranks' rows at once: every row has a
        // valid slot).
        Tensor er_h = Tensor::empty({M}, DType::i32), ei_h = Tensor::empty({M, 1}, DType::i32),
               ew_h = Tensor::empty({M, 1}, DType::f32), ep_h = Tensor::empty({S, int64_t(k)}, DType::i32);
        ops::cpu::ep_expand(si_h, er_h, ei_h, ew_h, ep_h);
        Tensor er_d = Tensor::empty({M}, DType::i32, Device::cuda), ei_d = Tensor::empty({M, 1}, DType::i32, Device::cuda),
               ew_d = Tensor::empty({M, 1}, DType::f32, Device::cuda),
               ep_d = Tensor::empty({S, int64_t(k)}, DType::i32, Device::cuda);
        ops::cuda::ep_expand(si_d, er_d, ei_d, ew_d, ep_d);
        EXPECT_EQ(vec(back_i32(er_d)), vec(er_h));
        EXPECT_EQ(vec(back_i32(ei_d)), vec(ei_h));
        EXPECT_EQ(vec(back_i32(ep_d)), vec(ep_h));
        // Fold the combine over per-slot rows placed by slot_pos.
        Pair y = Pair::rand({M, H});
        Tensor o_h = Tensor::empty({T, H}, DType::f32);
        ops::cpu::ep_fold(y.h, sp_h, &w, o_h);
        Tensor o_d = Tensor::empty({T, H}, DType::bf16, Device::cuda);
        ops::cuda::ep_fold(y.d, sp_d, &w_d, o_d);
        if (T) EXPECT_CLOSE(to_host_f32(o_d), o_h, fmt::format("ep_fold R={} k={} T={}", R, k, T));
        // Local ids of rank R / 2.
        const int64_t per = E / R, e0 = per * (R / 2);
        Tensor l_h = Tensor::empty({T, int64_t(k)}, DType::i32), l_d = Tensor::empty({T, int64_t(k)}, DType::i32, Device::cuda);
        ops::cpu::ep_local_ids(ids, e0, per, l_h);
        ops::cuda::ep_local_ids(ids_d, e0, per, l_d);
        EXPECT_EQ(vec(back_i32(l_d)), vec(l_h));
      }
}

TEST(CudaEpOps, FoldUnalignedAndF32) {
  TS_REQUIRE_CUDA();
  for (int64_t H : {7, 8, 100}) {
    Pair y = Pair::rand({5, H});
    Tensor pos = Tensor::empty({3, 2}, DType::i32);
    const int32_t p[6] = {0, -1, 4, 2, -1, -1};
    std::memcpy(pos.data, p, sizeof(p));
    Tensor pos_d = pos.to(Device::cuda);
    Tensor o_h = Tensor::empty({3, H}, DType::f32), o_d = Tensor::empty({3, H}, DType::bf16, Device::cuda);
    ops::cpu::ep_fold(y.h, pos, nullptr, o_h);
    ops::cuda::ep_fold(y.d, pos_d, nullptr, o_d);
    EXPECT_CLOSE(to_host_f32(o_d), o_h, fmt::format("ep_fold H={} bf16", H));
    Tensor yf = y.h.to(Device::cuda), of = Tensor::empty({3, H}, DType::f32, Device::cuda);
    ops::cuda::ep_fold(yf, pos_d, nullptr, of);
    ::ts::cuda::synchronize();
    Tensor ofh = of.to(Device::cpu);
    EXPECT_EQ(0, std::memcmp(ofh.data, o_h.data, o_h.nbytes())) << "f32 fold differs (H " << H << ")";
  }
}

// The partial EP flow passes -1 for other ranks' experts straight to moe_experts: the CUDA op must
// skip them, giving this rank's share of the single-rank output.
TEST(CudaEpOps, MoeExpertsSkipsOtherRanksExperts) {
  TS_REQUIRE_CUDA();
  const int64_t T = 33, H = 64, I = 32, E = 8, R = 4;
  const int k = 2;
  Pair x = Pair::rand({T, H}), gu = Pair::rand({E, 2 * I, H}, 0.3f), dn = Pair::rand({E, H, I}, 0.3f);
  Tensor ids = random_ids(T, k, E, 0), w = rand_w(T, k);
  ops::GluAct act;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t per = E / R, e0 = r * per;
    Tensor local = Tensor::empty({T, int64_t(k)}, DType::i32);
    ops::cpu::ep_local_ids(ids, e0, per, local);
    // CPU reference: this rank's slots only (zero weight elsewhere, ids clamped to a valid one).
    Tensor ids_c = Tensor::empty({T, int64_t(k)}, DType::i32), w_c = Tensor::empty({T, int64_t(k)}, DType::f32);
    for (int64_t i = 0; i < T * k; ++i) {
      const bool mine = local.ptr<int32_t>()[i] >= 0;
      ids_c.ptr<int32_t>()[i] = mine ? local.ptr<int32_t>()[i] : 0;
      w_c.ptr<float>()[i] = mine ? w.ptr<float>()[i] : 0.0f;
    }
    Tensor gu_l = gu.h.narrow(0, e0, per), dn_l = dn.h.narrow(0, e0, per);
    Tensor ref = Tensor::empty({T, H}, DType::f32);
    ops::cpu::moe_experts(x.h, ids_c, w_c, gu_l, dn_l, act, ref);
    Tensor out = Tensor::empty({T, H}, DType::bf16, Device::cuda);
    ops::cuda::moe_experts(x.d, local.to(Device::cuda), w.to(Device::cuda), gu.d.narrow(0, e0, per),
                           dn.d.narrow(0, e0, per), act, out);
    EXPECT_CLOSE(to_host_f32(out), ref, fmt::format("moe_experts with -1 ids, rank {}", r));
  }
}

// The whole EP forward (one rank: plan, pack, the own-segment all-to-all, expand, experts,
// combine) on the GPU against the single-GPU moe_experts.
TEST(CudaEpOps, SingleRankForwardMatchesMoeExperts) {
  TS_REQUIRE_CUDA();
  const int64_t T = 50, H = 64, I = 32, E = 8;
  const int k = 2;
  Pair x = Pair::rand({T, H}), gu = Pair::rand({E, 2 * I, H}, 0.3f), dn = Pair::rand({E, H, I}, 0.3f);
  Tensor ids = random_ids(T, k, E, 0), w = rand_w(T, k);
  Tensor ids_d = ids.to(Device::cuda), w_d = w.to(Device::cuda);
  ops::GluAct act;
  Tensor ref = Tensor::empty({T, H}, DType::bf16, Device::cuda);
  ops::cuda::moe_experts(x.d, ids_d, w_d, gu.d, dn.d, act, ref);
  parallel::PlainExperts pe{gu.d, dn.d, act};
  parallel::MoeParallel moe(E, 1, 0);
  auto comm = parallel::make_single_comm();
  Workspace ws(Device::cuda);
  for (parallel::EpCombine mode : {parallel::EpCombine::exact, parallel::EpCombine::partial}) {
    Tensor out = Tensor::empty({T, H}, DType::bf16, Device::cuda);
    ws.reset();
    moe.forward_dispatch(x.d, ids_d, w_d, pe.ref(), parallel::SharedRef{}, mode, *comm, out, ws);
    EXPECT_CLOSE(to_host_f32(out), to_host_f32(ref), fmt::format("EP forward on one GPU, combine {}", int(mode)));
    ws.reset();
    moe.forward_replicated(x.d, ids_d, w_d, pe.ref(), parallel::SharedRef{}, mode, *comm, out, ws);
    EXPECT_CLOSE(to_host_f32(out), to_host_f32(ref), fmt::format("EP replicated on one GPU, combine {}", int(mode)));
  }
}
