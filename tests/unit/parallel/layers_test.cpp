// The parallel layer primitives on CPU ranks against single-rank references: column + row
// parallel linear = the full linear (also through the fused all-reduce + add + norm and with an
// opaque linear), vocab-parallel embedding and LM head = the full ones, the seed's embedding
// rule (fused first norm only when sharded), fused QKV / gate_up shard layouts.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "par_test_util.h"
#include "parallel/layers.h"
#include "parallel/mapping.h"

using namespace ts;
using namespace ts::parallel;
using ts::test::max_abs_diff;
using ts::test::rand_f32;
using ts::test::run_ranks;

namespace {

// Rows [r.start, r.end()) of a [N, K] matrix.
Tensor rows_of(const Tensor& w, Range r) {
  Tensor o = Tensor::empty({r.count, w.size(1)}, DType::f32);
  Tensor src = w.narrow(0, r.start, r.count);
  ops::copy_rows(src, o);
  return o;
}
Tensor cols_of(const Tensor& w, Range c) {
  Tensor o = Tensor::empty({w.size(0), c.count}, DType::f32);
  Tensor src = w.narrow(1, c.start, c.count);
  ops::copy_rows(src, o);
  return o;
}
Tensor stack_rows(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (auto& p : parts) n += p.size(0);
  Tensor o = Tensor::empty({n, parts[0].size(1)}, DType::f32);
  int64_t at = 0;
  for (auto& p : parts) {
    Tensor dst = o.narrow(0, at, p.size(0));
    ops::copy_rows(p, dst);
    at += p.size(0);
  }
  return o;
}

// An opaque linear: what a quantized linear type looks like to the primitives.
struct ScaledLinear {
  Tensor w;
  float scale;
  void apply(const Tensor& x, Tensor& out) const {
    ops::linear(x, w, out);
    for (int64_t t = 0; t < out.rows(); ++t)
      for (int64_t i = 0; i < out.size(-1); ++i) out.ptr<float>()[t * out.row_stride() + i] *= scale;
  }
};

}  // namespace

TEST(ParallelLinear, GateUpThenDownEqualsTheFullMlp) {
  const int64_t T = 7, H = 32, I = 48;
  Tensor x = rand_f32({T, H}, 1), gate = rand_f32({I, H}, 2), up = rand_f32({I, H}, 3), down = rand_f32({H, I}, 4);
  // Reference: the unsharded MLP.
  Tensor gu_full = stack_rows({gate, up});
  Tensor gu = Tensor::empty({T, 2 * I}, DType::f32), a = Tensor::empty({T, I}, DType::f32),
         ref = Tensor::empty({T, H}, DType::f32);
  ops::linear(x, gu_full, gu);
  ops::silu_mul(gu, a);
  ops::linear(a, down, ref);
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE(tp);
    run_ranks(tp, [&](int r, Comm& c) {
      GateUpShard s = shard_gate_up(I, tp, r);
      Tensor w_gu = stack_rows({rows_of(gate, s.gate), rows_of(up, s.gate)});  // separate checkpoint tensors
      Tensor w_gu_fused = stack_rows({rows_of(gu_full, s.gate), rows_of(gu_full, s.up)});  // a fused [2I, H] tensor
      EXPECT_TRUE(ts::test::bit_equal(w_gu, w_gu_fused));
      Tensor w_down = cols_of(down, s.gate);
      const int64_t ic = s.gate.count;
      Tensor g = Tensor::empty({T, 2 * ic}, DType::f32), act = Tensor::empty({T, ic}, DType::f32),
             out = Tensor::empty({T, H}, DType::f32);
      column_parallel(x, w_gu, g);
      ops::silu_mul(g, act);
      row_parallel(act, w_down, c, out);
      EXPECT_LT(max_abs_diff(out, ref), 1e-4f);
      // The same through the fused all-reduce + residual add + RMSNorm.
      Tensor res = rand_f32({T, H}, 5), ref_res = rand_f32({T, H}, 5), normw = rand_f32({H}, 6);
      Tensor ref_x = Tensor::empty({T, H}, DType::f32);
      ops::copy_rows(ref, ref_x);
      ops::fused_add_rmsnorm(ref_x, ref_res, normw, 1e-6f);
      row_parallel_add_rmsnorm(act, w_down, c, out, res, normw, 1e-6f);
      EXPECT_LT(max_abs_diff(res, ref_res), 1e-4f);
      EXPECT_LT(max_abs_diff(out, ref_x), 1e-3f);
    });
  }
}

TEST(ParallelLinear, QkvWithReplicatedKvHeadsAndOpaqueLinears) {
  // 8 q heads, 2 kv heads of 8 over 4 ranks: each rank one (replicated) kv head.
  const int64_t T = 3, H = 16, nh = 8, nkv = 2, hd = 8;
  Tensor x = rand_f32({T, H}, 7), q = rand_f32({nh * hd, H}, 8), k = rand_f32({nkv * hd, H}, 9),
         v = rand_f32({nkv * hd, H}, 10), o = rand_f32({H, nh * hd}, 11);
  Tensor q_out = Tensor::empty({T, nh * hd}, DType::f32), k_out = Tensor::empty({T, nkv * hd}, DType::f32),
         o_ref = Tensor::empty({T, H}, DType::f32);
  ops::linear(x, q, q_out);
  ops::linear(x, k, k_out);
  ops::linear(q_out, o, o_ref);  // "attention" = identity on q, enough to check the o_proj split
  run_ranks(4, [&](int r, Comm& c) {
    QkvShard s = shard_qkv(nh, nkv, hd, 4, r);
    Tensor w = stack_rows({rows_of(q, s.q), rows_of(k, s.k), rows_of(v, s.v)});
    Tensor out = Tensor::empty({T, s.q.count + 2 * s.k.count}, DType::f32);
    column_parallel(x, w, out);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < s.q.count; ++i)
        EXPECT_NEAR(out.ptr<float>()[t * out.size(1) + i], q_out.ptr<float>()[t * nh * hd + s.q.start + i], 1e-5f);
      for (int64_t i = 0; i < s.k.count; ++i)  // this rank's (replicated) kv head
        EXPECT_NEAR(out.ptr<float>()[t * out.size(1) + s.q.count + i], k_out.ptr<float>()[t * nkv * hd + s.k.start + i],
                    1e-5f);
    }
    // Row-parallel o_proj through an opaque (scaled) linear on this rank's q columns.
    Tensor qs = Tensor::empty({T, s.q.count}, DType::f32);
    Tensor qsrc = out.narrow(1, 0, s.q.count);
    ops::copy_rows(qsrc, qs);
    ScaledLinear lin{cols_of(o, s.q), 0.5f};
    Tensor y = Tensor::empty({T, H}, DType::f32);
    row_parallel(qs, lin, c, y);
    for (int64_t i = 0; i < T * H; ++i) EXPECT_NEAR(y.ptr<float>()[i], 0.5f * o_ref.ptr<float>()[i], 1e-4f);
    // A row-parallel bias is added once, not once per rank.
    Tensor bias = rand_f32({H}, 12);
    Tensor yb = Tensor::empty({T, H}, DType::f32);
    row_parallel(qs, cols_of(o, s.q), c, yb, Reduce::now, &bias);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i)
        EXPECT_NEAR(yb.ptr<float>()[t * H + i], o_ref.ptr<float>()[t * H + i] + bias.ptr<float>()[i], 1e-4f);
  });
}

TEST(ParallelLinear, ColumnParallelGather) {
  const int64_t T = 4, H = 8, N = 12;
  Tensor x = rand_f32({T, H}, 20), w = rand_f32({N, H}, 21), ref = Tensor::empty({T, N}, DType::f32);
  ops::linear(x, w, ref);
  run_ranks(3, [&](int r, Comm& c) {
    Workspace ws(Device::cpu);
    Tensor out = Tensor::empty({T, N}, DType::f32);
    column_parallel_gather(x, rows_of(w, even_shard(N, 3, r, "N")), c, out, ws);
    EXPECT_TRUE(ts::test::bit_equal(out, ref));
  });
}

TEST(ParallelEmbedding, VocabParallelEqualsFullAndFusesOnlyWhenSharded) {
  const int64_t V = 11, H = 8, T = 9;  // uneven vocabulary: shards of 3, 3, 3, 2 over 4
  Tensor table = rand_f32({V, H}, 30), normw = rand_f32({H}, 31);
  Tensor ids = Tensor::empty({T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) ids.ptr<int32_t>()[t] = int32_t((t * 5 + 3) % V);
  Tensor ref = Tensor::empty({T, H}, DType::f32), ref_h = Tensor::empty({T, H}, DType::f32);
  ops::embedding(ids, table, ref);
  ops::rmsnorm(ref, normw, 1e-6f, ref_h);
  for (int tp : {1, 2, 4})
    for (bool replicate : {false, true}) {
      SCOPED_TRACE(tp * 10 + replicate);
      run_ranks(tp, [&](int r, Comm& c) {
        VocabShard v = embed_rows(V, tp, r, replicate);
        EmbedShard e{rows_of(table, {v.start, v.count}), replicate ? 1 : tp, v.start};
        EXPECT_EQ(fuse_embed_reduce(e), !replicate && tp > 1);
        Tensor out = Tensor::empty({T, H}, DType::f32);
        embed(ids, e, c, out);
        EXPECT_TRUE(ts::test::bit_equal(out, ref));  // one non-zero contribution per row: exact
        Tensor res = Tensor::empty({T, H}, DType::f32), h = Tensor::empty({T, H}, DType::f32);
        embed_first_norm(ids, e, c, normw, 1e-6f, res, h);
        EXPECT_TRUE(ts::test::bit_equal(res, ref));
        EXPECT_LT(max_abs_diff(h, ref_h), 1e-6f);
      });
    }
}

TEST(ParallelEmbedding, ReplicatedTableNeverCommunicates) {
  // A replicated embedding on a 2-rank group where only rank 0 embeds: it must not wait for rank 1.
  auto comms = make_cpu_comms(2);
  Tensor table = rand_f32({5, 4}, 40), ids = Tensor::zeros({2}, DType::i32), out = Tensor::empty({2, 4}, DType::f32);
  EmbedShard e{table, 1, 0};
  embed(ids, e, *comms[0], out);
  EXPECT_EQ(out.ptr<float>()[0], table.ptr<float>()[0]);
}

TEST(ParallelLmHead, VocabParallelLogitsEqualTheFullHead) {
  const int64_t V = 13, H = 8, N = 5;
  Tensor head = rand_f32({V, H}, 50), rows = rand_f32({N, H}, 51), ref = Tensor::empty({N, V}, DType::f32);
  ops::linear(rows, head, ref);
  for (int tp : {1, 2, 3, 4}) {
    SCOPED_TRACE(tp);
    run_ranks(tp, [&](int r, Comm& c) {
      Workspace ws(Device::cpu);
      VocabShard v = shard_vocab(V, tp, r);
      Tensor shard = rows_of(head, {v.start, v.count});
      LmHead h{shard, tp, V};
      Tensor logits = lm_head_logits(rows, h, c, ws);
      EXPECT_TRUE(ts::test::bit_equal(logits, ref));
      // Zero rows (an idle batch) still take part.
      Tensor none = Tensor::empty({0, H}, DType::f32);
      EXPECT_EQ(lm_head_logits(none, h, c, ws).rows(), 0);
    });
  }
}

// A dense MLP sharded over a group g, run through group_sharded_forward for each attention
// group's own tokens, equals the full MLP on those tokens in all three nestings: g = the
// attention group (partial sums: returns true), g inside it (reduced over g), g spanning two
// attention groups of different token counts (SpanGather; one group may have none).
TEST(ParallelSpan, ShardedMlpOverAnyNestingEqualsTheFullMlp) {
  const int64_t H = 16, I = 24;
  Tensor gate = rand_f32({I, H}, 21), up = rand_f32({I, H}, 22), down = rand_f32({H, I}, 23);
  Tensor gu_full = stack_rows({gate, up});
  auto full_mlp = [&](const Tensor& x) {
    Tensor gu = Tensor::empty({x.rows(), 2 * I}, DType::f32), a = Tensor::empty({x.rows(), I}, DType::f32),
           y = Tensor::empty({x.rows(), H}, DType::f32);
    ops::linear(x, gu_full, gu);
    ops::silu_mul(gu, a);
    ops::linear(a, down, y);
    return y;
  };
  struct Case {
    int attn_tp, g_size;
    std::vector<int64_t> tokens;  // per attention group
  };
  for (const Case& cs : {Case{4, 4, {5}}, Case{4, 2, {5}}, Case{2, 4, {5, 3}}, Case{1, 4, {2, 0, 7, 1}},
                         Case{2, 4, {0, 4}}}) {
    SCOPED_TRACE(testing::Message() << "attention tp " << cs.attn_tp << ", group " << cs.g_size);
    std::vector<Tensor> xs, refs;
    for (size_t a = 0; a < cs.tokens.size(); ++a) {
      xs.push_back(rand_f32({cs.tokens[a], H}, uint32_t(30 + a)));
      refs.push_back(full_mlp(xs.back()));
    }
    run_ranks(4, [&](int r, Comm& world) {
      auto attn = world.split(r / cs.attn_tp, r % cs.attn_tp);
      auto g = world.split(r / cs.g_size, r % cs.g_size);
      const GateUpShard s = shard_gate_up(I, cs.g_size, g->rank());
      Tensor w_gu = stack_rows({rows_of(gate, s.gate), rows_of(up, s.gate)}), w_down = cols_of(down, s.gate);
      auto shard = [&](const Tensor& x, Tensor& y) {
        Tensor gu = Tensor::empty({x.rows(), 2 * s.gate.count}, DType::f32),
               a = Tensor::empty({x.rows(), s.gate.count}, DType::f32);
        ops::linear(x, w_gu, gu);
        ops::silu_mul(gu, a);
        ops::linear(a, w_down, y);
      };
      const Tensor& x = xs[size_t(r / cs.attn_tp)];
      Tensor y = Tensor::empty({x.rows(), H}, DType::f32);
      Workspace ws;
      SpanGather span;
      const bool partial = group_sharded_forward(*g, *attn, span, x, y, ws, shard);
      EXPECT_EQ(partial, cs.g_size == cs.attn_tp);
      if (partial) attn->all_reduce(y);  // what decoder_forward fuses into the next norm
      EXPECT_LT(max_abs_diff(y, refs[size_t(r / cs.attn_tp)]), 1e-4f) << "rank " << r;
      if (cs.g_size > cs.attn_tp) {
        int64_t all = 0;
        for (size_t a = size_t(r / cs.g_size * cs.g_size / cs.attn_tp); a < size_t((r / cs.g_size + 1) * cs.g_size / cs.attn_tp); ++a)
          all += cs.tokens[a];
        EXPECT_EQ(span.total(), all) << "every token of the group's attention groups, once";
      }
    });
  }
}
