// Expert parallelism on CPU ranks: the dispatch/combine ops on hand-checked cases, and the EP /
// MoE-TP forwards against the single-rank MoE (ops::moe_experts + shared experts) for several
// rank counts and routings (softmax top-k, grouped sigmoid top-k with a correction bias, a rank
// that receives no token, ranks with no tokens). Exact combine: bit-identical on the CPU;
// partial combine: within fp32 rounding (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>

#include "ops/moe_dispatch.h"
#include "ops/ops.h"
#include "par_test_util.h"
#include "parallel/moe.h"
#include "parallel/world.h"

using namespace ts;
using namespace ts::parallel;
using ts::test::bit_equal;
using ts::test::max_abs_diff;
using ts::test::rand_f32;
using ts::test::run_ranks;

namespace {

Tensor i32(std::vector<int64_t> shape, std::vector<int32_t> v) {
  Tensor t = Tensor::empty(std::move(shape), DType::i32);
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}
std::vector<int32_t> vec(const Tensor& t) { return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()); }

struct Model {
  int64_t E = 8, H = 16, I = 8, SI = 12;  // experts, hidden, expert and shared intermediate
  Tensor gate_up, down, sh_gate, sh_up, sh_down;
  ops::GluAct act;
  explicit Model(int64_t experts = 8) : E(experts) {
    gate_up = rand_f32({E, 2 * I, H}, 101, 0.5f);
    down = rand_f32({E, H, I}, 102, 0.5f);
    sh_gate = rand_f32({SI, H}, 103, 0.5f);
    sh_up = rand_f32({SI, H}, 104, 0.5f);
    sh_down = rand_f32({H, SI}, 105, 0.5f);
  }
};

// A gated MLP over rows [i0, i0 + n) of the shared expert's intermediate dim (the whole of it, or
// a TP shard).
struct SharedMlp {
  Tensor gate_up, down;
  SharedMlp(const Model& m, Range r) {
    gate_up = Tensor::empty({2 * r.count, m.H}, DType::f32);
    Tensor g = gate_up.narrow(0, 0, r.count), u = gate_up.narrow(0, r.count, r.count);
    Tensor gs = m.sh_gate.narrow(0, r.start, r.count), us = m.sh_up.narrow(0, r.start, r.count);
    ops::copy_rows(gs, g);
    ops::copy_rows(us, u);
    down = Tensor::empty({m.H, r.count}, DType::f32);
    Tensor ds = m.sh_down.narrow(1, r.start, r.count);
    ops::copy_rows(ds, down);
  }
  void operator()(const Tensor& x, Tensor& out) const {
    Tensor gu = Tensor::empty({x.rows(), gate_up.size(0)}, DType::f32), a = Tensor::empty({x.rows(), down.size(1)}, DType::f32);
    ops::linear(x, gate_up, gu);
    ops::silu_mul(gu, a);
    ops::linear(a, down, out);
  }
};

// The single-rank MoE block: routed experts, then += shared (as models/moe.cpp does).
Tensor reference(const Model& m, const Tensor& x, const Tensor& ids, const Tensor& w, bool shared) {
  Tensor out = Tensor::zeros({x.rows(), m.H}, DType::f32);
  ops::moe_experts(x, ids, w, m.gate_up, m.down, m.act, out);
  if (shared && x.rows()) {
    SharedMlp s(m, {0, m.SI});
    Tensor sh = Tensor::empty({x.rows(), m.H}, DType::f32);
    s(x, sh);
    ops::add_inplace(out, sh);
  }
  return out;
}

enum class Routing { softmax, grouped, skewed };

// Tokens and their routing for one rank (seeded): ops::moe_route as the models run it.
void route(const Model& m, Routing kind, int64_t T, uint32_t seed, Tensor& x, Tensor& ids, Tensor& w, int k) {
  x = rand_f32({T, m.H}, seed);
  Tensor logits = rand_f32({T, m.E}, seed + 1, 3.0f);
  ops::MoeRouting r;
  r.top_k = k;
  Tensor bias;
  if (kind == Routing::grouped) {
    r.scoring = ops::MoeScoring::sigmoid;
    r.n_group = 4;
    r.topk_group = 2;
    r.renormalize = true;
    r.renorm_eps = 1e-20f;
    r.scale = 2.5f;
    bias = rand_f32({m.E}, seed + 2, 0.2f);
  }
  if (kind == Routing::skewed)  // every token avoids the last quarter of the experts
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = m.E - m.E / 4; e < m.E; ++e) logits.ptr<float>()[t * m.E + e] = -100.0f;
  ids = Tensor::empty({T, k}, DType::i32);
  w = Tensor::empty({T, k}, DType::f32);
  ops::moe_route(logits, bias.data ? &bias : nullptr, r, ids, w);
}

PlainExperts local_experts(const Model& m, const MoeParallel& moe) {
  return {m.gate_up.narrow(0, moe.first_expert(), moe.local_experts()),
          m.down.narrow(0, moe.first_expert(), moe.local_experts()), m.act};
}

}  // namespace

TEST(EpOps, PlanPackExpandFoldOnAHandCase) {
  // E 4 over 2 ranks; owners [[0,0],[0,1],[1,1]].
  Tensor ids = i32({3, 2}, {0, 1, 1, 3, 2, 3});
  Tensor counts = Tensor::empty({2, 2}, DType::i32), row_pos = Tensor::empty({3, 2}, DType::i32),
         slot_pos = Tensor::empty({3, 2}, DType::i32), row_token = Tensor::empty({6}, DType::i32);
  ops::ep_plan(ids, 4, 2, counts, row_pos, slot_pos, row_token);
  EXPECT_EQ(vec(counts), (std::vector<int32_t>{2, 2, 3, 3}));
  EXPECT_EQ(vec(row_pos), (std::vector<int32_t>{0, -1, 1, 2, 3, -1}));
  EXPECT_EQ(vec(slot_pos), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(row_token.ptr<int32_t>(), row_token.ptr<int32_t>() + 4),
            (std::vector<int32_t>{0, 1, 1, 2}));
  Tensor x = rand_f32({3, 4}, 1), w = rand_f32({3, 2}, 2);
  Tensor sx = Tensor::empty({4, 4}, DType::f32), sids = Tensor::empty({4, 2}, DType::i32),
         sw = Tensor::empty({4, 2}, DType::f32);
  ops::ep_pack(x, ids, w, row_token, counts, 4, sx, sids, sw);
  EXPECT_EQ(vec(sids), (std::vector<int32_t>{0, 1, 1, -1, -1, 1, 0, 1}));
  EXPECT_EQ(sx.ptr<float>()[2 * 4 + 1], x.ptr<float>()[1 * 4 + 1]);
  EXPECT_EQ(sw.ptr<float>()[3 * 2 + 1], w.ptr<float>()[2 * 2 + 1]);
  // Expand rank 1's received rows (rows 2, 3 of the send buffer).
  Tensor rid = sids.narrow(0, 2, 2);
  Tensor er = Tensor::empty({3}, DType::i32), ei = Tensor::empty({3, 1}, DType::i32), ew = Tensor::empty({3, 1}, DType::f32),
         ep = Tensor::empty({2, 2}, DType::i32);
  ops::ep_expand(rid, er, ei, ew, ep);
  EXPECT_EQ(vec(er), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(vec(ei), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(vec(ep), (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(ew.ptr<float>()[2], 1.0f);
  // Fold: out[n] = sum_j w * y[pos].
  Tensor y = rand_f32({3, 4}, 3), wt = rand_f32({2, 2}, 4), out = Tensor::empty({2, 4}, DType::f32);
  ops::ep_fold(y, ep, &wt, out);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out.ptr<float>()[i], 0.0f + y.ptr<float>()[i] * wt.ptr<float>()[1]);
    EXPECT_FLOAT_EQ(out.ptr<float>()[4 + i],
                    y.ptr<float>()[4 + i] * wt.ptr<float>()[2] + y.ptr<float>()[8 + i] * wt.ptr<float>()[3]);
  }
  Tensor loc = Tensor::empty({3, 2}, DType::i32);
  ops::ep_local_ids(ids, 2, 2, loc);
  EXPECT_EQ(vec(loc), (std::vector<int32_t>{-1, -1, -1, 1, 0, 1}));
  // Bad ids are errors on the CPU.
  Tensor bad = i32({1, 2}, {0, 9});
  EXPECT_THROW(ops::ep_plan(bad, 4, 2, counts, row_pos, slot_pos, row_token), Error);
}

TEST(EpMoe, DispatchEqualsSingleRankForRankCountsAndRoutings) {
  for (int R : {1, 2, 3, 4, 8})
    for (Routing kind : {Routing::softmax, Routing::grouped, Routing::skewed})
      for (bool shared : {false, true}) {
        SCOPED_TRACE(testing::Message() << "ranks " << R << " routing " << int(kind) << " shared " << shared);
        const int64_t E = R == 3 ? 12 : 8;
        Model m(E);
        if (kind == Routing::grouped && E % 4) continue;
        run_ranks(R, [&](int r, Comm& c) {
          // Rank 1 has no tokens at all; the others a few each.
          const int64_t T = r == 1 ? 0 : 2 + (r * 3) % 5;
          Tensor x, ids, w;
          route(m, kind, T, uint32_t(1000 + 17 * r), x, ids, w, kind == Routing::grouped ? 3 : 2);
          Tensor ref = reference(m, x, ids, w, shared);
          MoeParallel moe(E, R, r);
          PlainExperts pe = local_experts(m, moe);
          SharedMlp smlp(m, {0, m.SI});
          SharedRef sref = shared ? SharedRef::of(smlp, false) : SharedRef{};
          Workspace ws(Device::cpu);
          for (EpCombine mode : {EpCombine::exact, EpCombine::partial}) {
            Tensor out = Tensor::zeros({T, m.H}, DType::f32);
            ws.reset();
            EXPECT_EQ(moe.forward_dispatch(x, ids, w, pe.ref(), sref, mode, c, out, ws), MoeOut::complete);
            if (mode == EpCombine::exact) {
              EXPECT_TRUE(bit_equal(out, ref)) << "max diff " << max_abs_diff(out, ref);
            } else {
              EXPECT_LT(max_abs_diff(out, ref), 1e-5f);
            }
          }
        });
      }
}

TEST(EpMoe, DispatchIsReproducibleRunToRun) {
  Model m;
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> got(4);
    run_ranks(4, [&](int r, Comm& c) {
      Tensor x, ids, w;
      route(m, Routing::softmax, 6, uint32_t(50 + r), x, ids, w, 2);
      MoeParallel moe(m.E, 4, r);
      PlainExperts pe = local_experts(m, moe);
      Workspace ws(Device::cpu);
      Tensor out = Tensor::zeros({6, m.H}, DType::f32);
      moe.forward_dispatch(x, ids, w, pe.ref(), SharedRef{}, EpCombine::partial, c, out, ws);
      got[size_t(r)].assign(out.ptr<float>(), out.ptr<float>() + out.numel());
    });
    if (run == 0) first = got;
    else EXPECT_EQ(got, first);
  }
}

TEST(EpMoe, ReplicatedTokensExactAndPartialWithSharedExperts) {
  for (int R : {1, 2, 4}) {
    SCOPED_TRACE(R);
    Model m;
    Tensor x, ids, w;
    route(m, Routing::softmax, 9, 77, x, ids, w, 2);
    for (bool sharded : {false, true}) {
      Tensor ref = reference(m, x, ids, w, true);
      run_ranks(R, [&](int r, Comm& c) {
        MoeParallel moe(m.E, R, r);
        PlainExperts pe = local_experts(m, moe);
        Workspace ws(Device::cpu);
        // Exact: complete and bit-identical on every rank (shared experts replicated).
        SharedMlp full(m, {0, m.SI});
        Tensor out = Tensor::zeros({9, m.H}, DType::f32);
        EXPECT_EQ(moe.forward_replicated(x, ids, w, pe.ref(), SharedRef::of(full, false), EpCombine::exact, c, out, ws),
                  MoeOut::complete);
        EXPECT_TRUE(bit_equal(out, ref)) << max_abs_diff(out, ref);
        // Partial: this rank's share (+ its shared-expert shard, or rank 0's whole shared
        // expert), then the all-reduce the model fuses into its next norm.
        SharedMlp part(m, sharded ? even_shard(m.SI, R, r, "shared") : Range{0, m.SI});
        Tensor p = Tensor::zeros({9, m.H}, DType::f32);
        ws.reset();
        MoeOut kind = moe.forward_replicated(x, ids, w, pe.ref(), SharedRef::of(part, sharded), EpCombine::partial, c, p, ws);
        EXPECT_EQ(kind, R == 1 ? MoeOut::complete : MoeOut::partial);
        if (kind == MoeOut::partial) c.all_reduce(p);
        EXPECT_LT(max_abs_diff(p, ref), 1e-5f);
      });
    }
  }
}

TEST(EpMoe, MoeForwardPicksTheFlowFromTheMapping) {
  // attention TP 2 x DP 2 with EP 4: each attention group holds its own tokens; each rank of a
  // group dispatches its slice; every rank ends with its group's full output.
  Model m;
  struct Case {
    int tp, dp, ep, moe_tp;
  };
  for (Case cs : {Case{2, 2, 4, 0}, Case{1, 4, 4, 0}, Case{4, 1, 4, 0}, Case{4, 1, 1, 0}, Case{4, 1, 2, 1},
                  Case{2, 2, 1, 2}}) {
    SCOPED_TRACE(testing::Message() << "tp " << cs.tp << " dp " << cs.dp << " ep " << cs.ep << " moe_tp " << cs.moe_tp);
    ParallelOptions o;
    o.tp_size = cs.tp;
    o.dp_size = cs.dp;
    o.ep_size = cs.ep;
    o.moe_tp_size = cs.moe_tp;
    run_ranks(cs.tp * cs.dp, [&](int, Comm& world) {
      ParallelGroups g = ParallelGroups::create(o, std::shared_ptr<Comm>(&world, [](Comm*) {}));
      const Mapping& mp = g.mapping;
      // Tokens per attention group (identical on its ranks); group 1 of DP 4 has none.
      const int64_t T = mp.attn_dp_rank == 1 ? 0 : 5 + mp.attn_dp_rank;
      Tensor x, ids, w;
      route(m, Routing::softmax, T, uint32_t(300 + mp.attn_dp_rank), x, ids, w, 2);
      Tensor ref = reference(m, x, ids, w, true);
      MoeParallel moe(m.E, mp.moe_ep, mp.moe_ep_rank);
      // MoE TP: every expert's intermediate shard; EP: whole local experts.
      Model shard = m;
      if (mp.moe_tp > 1) {
        const GateUpShard s = shard_gate_up(m.I, mp.moe_tp, mp.moe_tp_rank);
        shard.gate_up = Tensor::empty({m.E, 2 * s.gate.count, m.H}, DType::f32);
        shard.down = Tensor::empty({m.E, m.H, s.gate.count}, DType::f32);
        for (int64_t e = 0; e < m.E; ++e) {
          Tensor gsrc = m.gate_up.row(e).narrow(0, s.gate.start, s.gate.count), usrc = m.gate_up.row(e).narrow(0, s.up.start, s.up.count);
          Tensor gdst = shard.gate_up.row(e).narrow(0, 0, s.gate.count), udst = shard.gate_up.row(e).narrow(0, s.gate.count, s.gate.count);
          ops::copy_rows(gsrc, gdst);
          ops::copy_rows(usrc, udst);
          Tensor dsrc = m.down.row(e).narrow(1, s.gate.start, s.gate.count), ddst = shard.down.row(e);
          ops::copy_rows(dsrc, ddst);
        }
      }
      PlainExperts pe = mp.moe_tp > 1 ? PlainExperts{shard.gate_up, shard.down, m.act} : local_experts(m, moe);
      const bool sharded_shared = mp.moe_tp > 1;
      SharedMlp smlp(m, sharded_shared ? even_shard(m.SI, mp.moe_tp, mp.moe_tp_rank, "shared") : Range{0, m.SI});
      Workspace ws(Device::cpu);
      Tensor out = Tensor::zeros({T, m.H}, DType::f32);
      MoeOut kind = moe_forward(g, moe, x, ids, w, pe.ref(), SharedRef::of(smlp, sharded_shared), EpCombine::exact, out, ws);
      if (kind == MoeOut::partial) g.moe().all_reduce(out);
      if (mp.moe_tp == 1 && kind == MoeOut::complete) {
        EXPECT_TRUE(bit_equal(out, ref)) << max_abs_diff(out, ref);
      }
      EXPECT_LT(max_abs_diff(out, ref), 1e-5f);
    });
  }
}
