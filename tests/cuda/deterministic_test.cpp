// --enable-deterministic-inference on CUDA (LaunchConfig::batch_invariant): the ops give every
// row the same bits whatever else is in the batch, and the engine's greedy outputs and logprobs
// equal the solo run's under load.
//  - linear / the fused decode ops / the LM head: rows of an M-row call equal the same rows of
//    a 1-, 2-, 3-, 8-... row call (one cuBLASLt algorithm per shape, no GEMV);
//  - paged attention: a sequence's rows equal across its prompt at once, in uneven chunks, in a
//    mixed batch behind decodes, and as decodes (uniform mode: fixed 1024-token splits, 16 rows
//    per block; decodes take a block per split + the merge, longer queries one block per chunk);
//    bf16 and FP8 caches; MLA (one split) likewise;
//  - the engine on the demo model, CUDA graphs on: tokens and logprob bits under chunking,
//    mixed batches and retraction equal one-at-a-time runs.
// The kernels' logic is also checked on the CPU by bench/kernels/attention_emu.cpp ("uniform").
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)

#include <cstring>

#include "cuda_test_util.h"
#include "ops/cuda/split_kv.h"
#include "ops/lm_head.h"
#include "ops/ops.h"
#include "runtime/engine.h"

using namespace ts;
using namespace ts::test;

namespace {

const cuda::LaunchConfig kInvariant{.pdl = true, .batch_invariant = true};

// Raw bytes of rows [0, m) of a device tensor (contiguous rows of `width` elements).
std::vector<uint8_t> row_bytes(const Tensor& d, int64_t m) {
  cuda::synchronize();
  Tensor h = d.slice_rows(0, m).to(Device::cpu);
  const uint8_t* p = static_cast<const uint8_t*>(h.data);
  return std::vector<uint8_t>(p, p + size_t(h.numel()) * dtype_size(h.dtype));
}

void expect_rows_equal(const Tensor& small, const Tensor& full, int64_t m, const std::string& what) {
  EXPECT_TRUE(row_bytes(small, m) == row_bytes(full, m)) << what << ": the first " << m << " rows differ";
}

}  // namespace

TEST(DeterministicOps, LinearRowsDoNotDependOnM) {
  TS_REQUIRE_CUDA();
  cuda::ScopedLaunchConfig inv(kInvariant);
  struct Shape {
    int64_t n, k;
    bool bias, f32out;
  };
  for (const Shape& s : {Shape{1024, 512, false, false}, Shape{4096, 4096, false, false}, Shape{1000, 384, true, false},
                         Shape{8192, 1024, false, true}}) {
    const int64_t M = 300;
    Pair x = Pair::rand({M, s.k}), w = Pair::rand({s.n, s.k}, 0.05f), b = Pair::rand({s.n});
    const DType odt = s.f32out ? DType::f32 : DType::bf16;
    Tensor full = Tensor::empty({M, s.n}, odt, Device::cuda);
    ops::cuda::linear(x.d, w.d, full, s.bias ? &b.d : nullptr);
    for (int64_t m : {1, 2, 3, 8, 17, 64, 129, 255}) {
      Tensor part = Tensor::empty({m, s.n}, odt, Device::cuda);
      ops::cuda::linear(x.d.slice_rows(0, m), w.d, part, s.bias ? &b.d : nullptr);
      expect_rows_equal(part, full, m, "linear N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " M=" +
                                           std::to_string(m));
    }
  }
}

TEST(DeterministicOps, FusedDecodeOpsAndLmHeadTakeTheBatchPath) {
  TS_REQUIRE_CUDA();
  cuda::ScopedLaunchConfig inv(kInvariant);
  const int64_t M = 96, K = 1024, I = 1536, V = 5000;
  EXPECT_FALSE(ops::fuses_norm_gemv(Device::cuda, 1)) << "deterministic mode keeps the many-row path at one row";
  Pair x = Pair::rand({M, K}), nw = Pair::rand({K}), gu = Pair::rand({2 * I, K}, 0.05f), dn = Pair::rand({K, I}, 0.05f);
  Pair head = Pair::rand({V, K}, 0.05f);
  EXPECT_FALSE(ops::lm_head_argmax_fusable(x.d.slice_rows(0, 1), &nw.d, head.d));
  auto run = [&](int64_t m, Tensor& act, Tensor& res, Tensor& proj) {
    Tensor xs = Tensor::empty({m, K}, DType::bf16, Device::cuda), gs = Tensor::empty({m, 2 * I}, DType::bf16, Device::cuda);
    ops::linear_silu_mul(x.d.slice_rows(0, m), ops::LinearWeight(gu.d), act, gs, &nw.d, 1e-6f, &xs);
    Tensor scratch = Tensor::empty({m, K}, DType::bf16, Device::cuda);
    ops::linear_add(act, ops::LinearWeight(dn.d), res, scratch);
    ops::rmsnorm_linear(res, nw.d, 1e-6f, ops::LinearWeight(head.d.slice_rows(0, 512)), proj, nullptr, xs);
  };
  Tensor act_f = Tensor::empty({M, I}, DType::bf16, Device::cuda), proj_f = Tensor::empty({M, 512}, DType::bf16, Device::cuda);
  Tensor res_f = x.d.to(Device::cpu).to(Device::cuda);
  run(M, act_f, res_f, proj_f);
  for (int64_t m : {1, 2, 5}) {
    Tensor act = Tensor::empty({m, I}, DType::bf16, Device::cuda), proj = Tensor::empty({m, 512}, DType::bf16, Device::cuda);
    Tensor res = x.d.slice_rows(0, m).to(Device::cpu).to(Device::cuda);
    run(m, act, res, proj);
    expect_rows_equal(act, act_f, m, "linear_silu_mul M=" + std::to_string(m));
    expect_rows_equal(res, res_f, m, "linear_add M=" + std::to_string(m));
    expect_rows_equal(proj, proj_f, m, "rmsnorm_linear M=" + std::to_string(m));
  }
}

namespace {

// Sequences over fixed physical blocks; a call computes parts (seq, first position, rows) with
// kv_len = first + rows, decode-like parts first (as the scheduler orders a mixed batch).
struct AttnWorld {
  int nkv, G, hd, bs;
  int mla_rank = 0;  // > 0: MLA over the latent cache k (nkv 1, hd = D), out [T, nh, rank]
  int window = 0;    // sliding-window attention (ops::paged_attention's window)
  DType kv_dtype;
  std::vector<std::vector<int32_t>> blocks;  // per seq
  std::vector<Tensor> q;                     // per seq: device bf16 [len, nh, hd]
  Tensor kc, vc;                             // device [blocks, bs, nkv, hd]
};
struct AttnPart {
  int seq, first, rows;
};

AttnWorld make_world(const std::vector<int>& lens, int nkv, int G, int hd, int bs, bool fp8) {
  AttnWorld w{nkv, G, hd, bs, 0, 0, fp8 ? DType::f8_e4m3 : DType::bf16, {}, {}, {}, {}};
  int next = 0, total = 0;
  for (int L : lens) total += (L + bs - 1) / bs;
  std::vector<int32_t> perm(size_t(total) + 2);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng());
  for (int L : lens) {
    std::vector<int32_t> b;
    for (int j = 0; j < (L + bs - 1) / bs; ++j) b.push_back(perm[size_t(next++)]);
    w.blocks.push_back(b);
    w.q.push_back(Pair::rand({L, int64_t(nkv) * G, hd}).d);
  }
  const int64_t nb = int64_t(perm.size());
  Pair k = Pair::rand({nb, bs, nkv, hd}), v = Pair::rand({nb, bs, nkv, hd});
  if (fp8) {
    Tensor k8 = Tensor::empty({nb, bs, nkv, hd}, DType::f8_e4m3), v8 = Tensor::empty({nb, bs, nkv, hd}, DType::f8_e4m3);
    for (int64_t i = 0; i < k8.numel(); ++i) {
      k8.ptr<uint8_t>()[i] = f32_to_e4m3(k.h.ptr<float>()[i] * 4.0f);
      v8.ptr<uint8_t>()[i] = f32_to_e4m3(v.h.ptr<float>()[i] * 4.0f);
    }
    w.kc = k8.to(Device::cuda);
    w.vc = v8.to(Device::cuda);
  } else {
    w.kc = k.d;
    w.vc = v.d;
  }
  return w;
}

// Runs one call in the thread's launch config; returns each part's output rows (device).
std::vector<Tensor> attn_call(const AttnWorld& w, const std::vector<AttnPart>& parts, int pad) {
  const int B = int(parts.size()), nh = w.nkv * w.G;
  std::vector<int32_t> cu{0}, kvl;
  int max_q = 0, max_kv = 0;
  size_t width = 1;
  for (auto& p : parts) {
    cu.push_back(cu.back() + p.rows);
    kvl.push_back(p.first + p.rows);
    max_q = std::max(max_q, p.rows);
    max_kv = std::max(max_kv, p.first + p.rows);
    width = std::max(width, w.blocks[size_t(p.seq)].size());
  }
  Tensor bt = Tensor::empty({B, int64_t(width)}, DType::i32);
  for (int b = 0; b < B; ++b)
    for (size_t j = 0; j < width; ++j) {
      const auto& blk = w.blocks[size_t(parts[size_t(b)].seq)];
      bt.ptr<int32_t>()[size_t(b) * width + j] = j < blk.size() ? blk[j] : -1;
    }
  const int64_t T = cu.back() + pad;
  Tensor q = Tensor::zeros({T, nh, w.hd}, DType::bf16, Device::cuda);
  for (int b = 0; b < B; ++b) {
    const AttnPart& p = parts[size_t(b)];
    Tensor dst = q.slice_rows(cu[size_t(b)], cu[size_t(b)] + p.rows);
    ops::cuda::copy_rows(w.q[size_t(p.seq)].slice_rows(p.first, p.first + p.rows), dst);
  }
  ops::AttnMeta m;
  m.cu_q = i32_host(cu).to(Device::cuda);
  m.kv_len = i32_host(kvl).to(Device::cuda);
  m.block_tables = bt.to(Device::cuda);
  m.block_size = w.bs;
  m.num_seqs = B;
  m.max_q_len = max_q;
  m.max_kv_len = max_kv;
  ops::set_decode_lead(m, cu.data());
  Tensor out = Tensor::empty({T, nh, w.mla_rank > 0 ? w.mla_rank : w.hd}, DType::bf16, Device::cuda);
  const ops::KvScales kvs{0.25f, 0.25f};
  if (w.mla_rank > 0)
    ops::mla_attention(q, w.kc, m, 1.0f / std::sqrt(float(w.hd)), w.mla_rank, out, w.kc.dtype == DType::f8_e4m3 ? 0.25f : 1.0f);
  else
    ops::paged_attention(q, w.kc, w.vc, m, 1.0f / std::sqrt(float(w.hd)), out, kvs, w.window);
  std::vector<Tensor> res;
  for (int b = 0; b < B; ++b) res.push_back(out.slice_rows(cu[size_t(b)], cu[size_t(b) + 1]));
  return res;
}

}  // namespace

TEST(DeterministicOps, AttentionAndMlaRowsDoNotDependOnChunkingOrBatch) {
  TS_REQUIRE_CUDA();
  cuda::ScopedLaunchConfig inv(kInvariant);
  struct Case {
    int L, nkv, G, hd, bs;
    bool fp8;
    int window = 0;
  };
  // The last two: MLA (DeepSeek-V3's absorbed form: one latent head of D = 576, rank 512, 16
  // query heads) over bf16 and FP8 latent caches.
  // 2600 / 1500 tokens span 3 / 2 of uniform mode's 1024-token splits.
  for (const Case& c : {Case{700, 8, 4, 128, 64, false}, Case{333, 2, 8, 64, 16, false}, Case{520, 4, 4, 128, 16, true},
                        Case{2600, 8, 4, 128, 64, false}, Case{1500, 2, 8, 64, 16, true},
                        Case{410, 1, 16, 576, 64, false}, Case{300, 1, 16, 576, 16, true},
                        // sliding windows shorter and longer than a uniform-mode split
                        Case{2600, 8, 4, 128, 64, false, 700}, Case{2200, 2, 8, 64, 16, true, 1100}}) {
    AttnWorld w = make_world({c.L, 300, 90}, c.nkv, c.G, c.hd, c.bs, c.fp8);
    if (c.hd == 576) w.mla_rank = 512;
    w.window = c.window;
    const std::string name = "L=" + std::to_string(c.L) + " hd=" + std::to_string(c.hd) + (c.fp8 ? " fp8" : "") +
                             " window=" + std::to_string(c.window);
    const std::vector<uint8_t> whole = row_bytes(attn_call(w, {{0, 0, c.L}}, 0)[0], c.L);
    const size_t row = whole.size() / size_t(c.L);
    auto expect_part = [&](const Tensor& got, int first, int rows, const std::string& how) {
      const std::vector<uint8_t> b = row_bytes(got, rows);
      EXPECT_TRUE(std::equal(b.begin(), b.end(), whole.begin() + ptrdiff_t(size_t(first) * row)))
          << name << ": rows [" << first << ", " << first + rows << ") differ " << how;
    };
    for (int a = 0; a < c.L;) {  // uneven chunks
      const int n = std::min(c.L - a, a == 0 ? 100 : 157);
      expect_part(attn_call(w, {{0, a, n}}, 2)[0], a, n, "(chunked)");
      a += n;
    }
    for (int a = 0; a < c.L;) {  // mixed batches: decodes of seq 1 first, then the chunk, then seq 2's prefill
      const int n = std::min(c.L - a, 61);
      expect_part(attn_call(w, {{1, 200 + a % 90, 1}, {1, 299, 1}, {0, a, n}, {2, 0, 90}}, 3)[2], a, n, "(mixed)");
      a += n;
    }
    for (int pos = c.L - 4; pos < c.L; ++pos) {  // decodes, batched and alone
      expect_part(attn_call(w, {{1, 250, 1}, {0, pos, 1}, {2, 80, 1}}, 0)[1], pos, 1, "(decode in a batch)");
      expect_part(attn_call(w, {{0, pos, 1}}, 0)[0], pos, 1, "(decode alone)");
    }
  }
}

// A long prefill chunk: 16,400 rows at G = 8 and 8 kv heads are 8 x 8,200 blocks of 16 rows,
// past grid.y's 65,535 (the uniform split_loop grid puts them on x). Its first and last rows equal
// the same rows computed in small calls (whose grids are small), bit for bit.
TEST(DeterministicOps, AChunkPastTheGridYLimitRuns) {
  TS_REQUIRE_CUDA();
  cuda::ScopedLaunchConfig inv(kInvariant);
  const int L = 16400;
  AttnWorld w = make_world({L}, 8, 8, 128, 64, false);
  const std::vector<uint8_t> whole = row_bytes(attn_call(w, {{0, 0, L}}, 0)[0], L);
  const size_t row = whole.size() / size_t(L);
  for (const AttnPart part : {AttnPart{0, 0, 40}, AttnPart{0, 8000, 33}, AttnPart{0, L - 40, 40}}) {
    const std::vector<uint8_t> b = row_bytes(attn_call(w, {part}, 0)[0], part.rows);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), whole.begin() + ptrdiff_t(size_t(part.first) * row)))
        << "rows [" << part.first << ", " << part.first + part.rows << ") differ from the 16,400-row call's";
  }
}

namespace {

std::vector<GenerateParams> engine_requests() {
  std::vector<GenerateParams> out;
  for (int k = 0; k < 10; ++k) {
    GenerateParams p;
    for (int i = 0; i < 20 + 37 * k; ++i) p.prompt.push_back(int32_t(100 + (i * 7 + k * 3) % 61));
    p.max_tokens = 24;
    p.temperature = 0;
    p.ignore_eos = true;
    p.logprobs = 2;
    out.push_back(std::move(p));
  }
  return out;
}

struct Out {
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> lp;
  std::string error;
};

std::vector<Out> run(Engine& e, const std::vector<GenerateParams>& ps, bool concurrent) {
  std::vector<Out> out(ps.size());
  std::vector<std::shared_ptr<Stream>> st(ps.size());
  auto drain = [&](size_t i) {
    StreamEvent ev;
    while (st[i]->pop(ev, 120000)) {
      out[i].ids.insert(out[i].ids.end(), ev.tokens.begin(), ev.tokens.end());
      out[i].lp.insert(out[i].lp.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (ev.finished) {
        out[i].error = ev.error;
        return;
      }
    }
    out[i].error = "timeout";
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    st[i] = e.submit(ps[i]);
    if (!concurrent) drain(i);
  }
  if (concurrent)
    for (size_t i = 0; i < ps.size(); ++i) drain(i);
  return out;
}

}  // namespace

TEST(DeterministicEngine, GreedyLogprobBitsEqualSoloUnderLoad) {
  TS_REQUIRE_CUDA();
  auto opts = [](int chunk, bool mixed, int64_t pool) {
    EngineOptions o;
    o.model_dir = std::string(TS_SOURCE_DIR) + "/models/pycoder";
    o.device = "cuda";
    o.enable_deterministic_inference = true;
    o.max_total_tokens = pool;
    o.block_size = 16;
    o.chunked_prefill_size = chunk;
    o.enable_mixed_batch = mixed;
    o.cuda_graph_max_bs = 16;
    o.prefill_graph_max_tokens = 256;
    return o;
  };
  const std::vector<GenerateParams> ps = engine_requests();
  Engine solo(opts(8192, false, 16384));
  solo.start();
  const std::vector<Out> ref = run(solo, ps, false);
  for (auto [chunk, mixed, pool] : {std::tuple{48, true, int64_t(16384)}, std::tuple{300, false, int64_t(16384)},
                                    std::tuple{64, true, int64_t(640)}}) {
    Engine e(opts(chunk, mixed, pool));
    e.start();
    const std::vector<Out> got = run(e, ps, true);
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string what = "chunk " + std::to_string(chunk) + " pool " + std::to_string(pool) + " request " +
                               std::to_string(i);
      ASSERT_TRUE(got[i].error.empty()) << what << ": " << got[i].error;
      EXPECT_EQ(got[i].ids, ref[i].ids) << what;
      ASSERT_EQ(got[i].lp.size(), ref[i].lp.size()) << what;
      for (size_t t = 0; t < got[i].lp.size(); ++t)
        EXPECT_EQ(std::memcmp(&got[i].lp[t].logprob, &ref[i].lp[t].logprob, sizeof(float)), 0)
            << what << " token " << t << ": " << got[i].lp[t].logprob << " vs " << ref[i].lp[t].logprob;
    }
    if (pool < 1024) {
      EXPECT_GT(e.metrics().retractions, 0) << "the small pool must retract";
    }
  }
}
