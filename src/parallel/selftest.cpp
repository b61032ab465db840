#include "parallel/selftest.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/workspace.h"
#include "ops/ops.h"
#include "parallel/moe.h"

namespace ts::parallel {

namespace {

uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// A value every rank can recompute: a multiple of 1/8 in [-64, 64) (sums of a few stay exact).
float val(uint64_t a, uint64_t b) { return float(int64_t(mix(a * 1000003 + b) % 1024) - 512) / 8.0f; }
// A full-precision value in [-1, 1).
float rnd(uint64_t a) { return float(int64_t(mix(a) >> 40) - (1 << 23)) / float(1 << 23); }

Tensor f32(int64_t n) { return Tensor::zeros({n}, DType::f32); }

class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  void expect(bool ok, const std::string& what) {
    ++res.checks;
    if (!ok) res.failures.push_back(fmt::format("rank {}: {}", rank_, what));
  }
  // Runs one check; an exception (a transport error, a timeout) is a failure of that check.
  template <class F>
  void run(const char* name, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      ++res.checks;
      res.failures.push_back(fmt::format("rank {}: {}: {}", rank_, name, e.what()));
    }
  }
  SelftestResult res;

 private:
  int rank_;
};

void check_collectives(Comm& c, Checker& ck) {
  const int W = c.size(), r = c.rank();
  ck.run("all_reduce f32", [&] {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(37)}) {
      Tensor x = f32(n);
      for (int64_t i = 0; i < n; ++i) x.ptr<float>()[i] = val(uint64_t(r), uint64_t(i));
      c.all_reduce(x);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i) {
        float want = val(0, uint64_t(i));
        for (int p = 1; p < W; ++p) want += val(uint64_t(p), uint64_t(i));
        ok = ok && x.ptr<float>()[i] == want;
      }
      ck.expect(ok, fmt::format("all_reduce f32 of {} elements", n));
    }
  });
  ck.run("all_reduce i32", [&] {
    Tensor x = Tensor::zeros({5}, DType::i32);
    for (int i = 0; i < 5; ++i) x.ptr<int32_t>()[i] = (r + 1) * (i + 1);
    c.all_reduce(x);
    bool ok = true;
    for (int i = 0; i < 5; ++i) ok = ok && x.ptr<int32_t>()[i] == (i + 1) * W * (W + 1) / 2;
    ck.expect(ok, "all_reduce i32");
  });
  ck.run("all_gather", [&] {
    Tensor in = f32(3), out = f32(3 * W);
    for (int i = 0; i < 3; ++i) in.ptr<float>()[i] = val(uint64_t(r), uint64_t(i));
    c.all_gather(in, out);
    bool ok = true;
    for (int p = 0; p < W; ++p)
      for (int i = 0; i < 3; ++i) ok = ok && out.ptr<float>()[p * 3 + i] == val(uint64_t(p), uint64_t(i));
    ck.expect(ok, "all_gather");
  });
  ck.run("reduce_scatter", [&] {
    Tensor in = f32(4 * W), out = f32(4);
    for (int i = 0; i < 4 * W; ++i) in.ptr<float>()[i] = val(uint64_t(r), uint64_t(i));
    c.reduce_scatter(in, out);
    bool ok = true;
    for (int i = 0; i < 4; ++i) {
      float want = val(0, uint64_t(r * 4 + i));
      for (int p = 1; p < W; ++p) want += val(uint64_t(p), uint64_t(r * 4 + i));
      ok = ok && out.ptr<float>()[i] == want;
    }
    ck.expect(ok, "reduce_scatter");
  });
  ck.run("all_to_all", [&] {
    Tensor in = f32(2 * W), out = f32(2 * W);
    for (int p = 0; p < W; ++p)
      for (int i = 0; i < 2; ++i) in.ptr<float>()[p * 2 + i] = float(r * 100 + p * 10 + i);
    c.all_to_all(in, out);
    bool ok = true;
    for (int p = 0; p < W; ++p)
      for (int i = 0; i < 2; ++i) ok = ok && out.ptr<float>()[p * 2 + i] == float(p * 100 + r * 10 + i);
    ck.expect(ok, "all_to_all");
  });
  ck.run("all_to_all_v", [&] {
    // Rank a sends (a + 2b) % 3 rows of width 3 to rank b (zero rows included).
    auto rows = [](int a, int b) { return int64_t((a + 2 * b) % 3); };
    std::vector<int64_t> sr(static_cast<size_t>(W)), rr(static_cast<size_t>(W));
    int64_t st = 0, rt = 0;
    for (int p = 0; p < W; ++p) {
      st += sr[size_t(p)] = rows(r, p);
      rt += rr[size_t(p)] = rows(p, r);
    }
    Tensor in = Tensor::zeros({std::max<int64_t>(st, 1), 3}, DType::f32), out = Tensor::zeros({rt + 1, 3}, DType::f32);
    int64_t o = 0;
    for (int p = 0; p < W; ++p)
      for (int64_t i = 0; i < sr[size_t(p)]; ++i, ++o)
        for (int j = 0; j < 3; ++j) in.ptr<float>()[o * 3 + j] = float(r * 1000 + p * 100 + i * 10 + j);
    c.all_to_all_v(in, sr, out, rr);
    bool ok = true;
    o = 0;
    for (int p = 0; p < W; ++p)
      for (int64_t i = 0; i < rr[size_t(p)]; ++i, ++o)
        for (int j = 0; j < 3; ++j) ok = ok && out.ptr<float>()[o * 3 + j] == float(p * 1000 + r * 100 + i * 10 + j);
    ck.expect(ok, "all_to_all_v (uneven counts, zero-row peers)");
  });
  ck.run("all_gather_v", [&] {
    std::vector<int64_t> rows(static_cast<size_t>(W));
    int64_t total = 0;
    for (int p = 0; p < W; ++p) total += rows[size_t(p)] = p % 3;
    Tensor in = Tensor::zeros({3, 2}, DType::f32), out = Tensor::zeros({total + 1, 2}, DType::f32);
    for (int i = 0; i < 6; ++i) in.ptr<float>()[i] = float(r * 10 + i);
    c.all_gather_v(in, rows, out);
    bool ok = true;
    int64_t o = 0;
    for (int p = 0; p < W; ++p)
      for (int64_t i = 0; i < rows[size_t(p)]; ++i, ++o)
        for (int j = 0; j < 2; ++j) ok = ok && out.ptr<float>()[o * 2 + j] == float(p * 10 + i * 2 + j);
    ck.expect(ok, "all_gather_v");
  });
  ck.run("broadcast", [&] {
    Tensor x = f32(6);
    for (int i = 0; i < 6; ++i) x.ptr<float>()[i] = val(uint64_t(r), uint64_t(i));
    c.broadcast(x, W - 1);
    bool ok = true;
    for (int i = 0; i < 6; ++i) ok = ok && x.ptr<float>()[i] == val(uint64_t(W - 1), uint64_t(i));
    ck.expect(ok, "broadcast from the last rank");
  });
  ck.run("barrier", [&] {
    c.barrier();
    ck.expect(true, "barrier");
  });
  ck.run("split", [&] {
    // Even and odd ranks, ordered by descending rank inside each group.
    auto g = c.split(r % 2, -r);
    ck.expect(g && g->size() == (W + 1 - r % 2) / 2, "split group size");
    if (!g) return;
    Tensor x = f32(1);
    x.ptr<float>()[0] = float(r);
    g->all_reduce(x);
    float want = 0;
    for (int p = r % 2; p < W; p += 2) want += float(p);
    ck.expect(x.ptr<float>()[0] == want, "all_reduce inside a split group");
    int expect_rank = 0;
    for (int p = r + 2; p < W; p += 2) ++expect_rank;
    ck.expect(g->rank() == expect_rank, "split group rank order (by key)");
  });
}

// Expert-parallel dispatch over the whole world against ops::moe_experts on this rank's own
// tokens with all experts: exact combine bit-identical, partial within fp32 rounding. Rank 0 has
// no tokens and the last rank's experts are never picked (a rank that receives nothing).
void check_dispatch(Comm& c, Checker& ck) {
  const int W = c.size(), r = c.rank();
  const int64_t E = 2 * int64_t(W), H = 8, I = 4, k = 2;
  const int64_t T = r == 0 ? 0 : 1 + (r * 5) % 4;
  const int64_t pick = W > 1 ? E - 2 : E;  // experts tokens may pick
  Tensor gate_up = Tensor::empty({E, 2 * I, H}, DType::f32), down = Tensor::empty({E, H, I}, DType::f32);
  for (int64_t i = 0; i < gate_up.numel(); ++i) gate_up.ptr<float>()[i] = rnd(11 + uint64_t(i)) * 0.5f;
  for (int64_t i = 0; i < down.numel(); ++i) down.ptr<float>()[i] = rnd(7771 + uint64_t(i)) * 0.5f;
  Tensor x = Tensor::empty({T, H}, DType::f32), ids = Tensor::empty({T, k}, DType::i32),
         w = Tensor::empty({T, k}, DType::f32);
  for (int64_t t = 0; t < T; ++t) {
    const uint64_t s = uint64_t(r) * 1000 + uint64_t(t);
    for (int64_t i = 0; i < H; ++i) x.ptr<float>()[t * H + i] = rnd(s * 31 + uint64_t(i));
    int32_t a = int32_t(mix(s) % uint64_t(pick)), b = int32_t((uint64_t(a) + 1 + mix(s + 7) % uint64_t(pick - 1)) % uint64_t(pick));
    ids.ptr<int32_t>()[t * k] = std::min(a, b);
    ids.ptr<int32_t>()[t * k + 1] = std::max(a, b);
    w.ptr<float>()[t * k] = 0.25f + 0.5f * std::fabs(rnd(s + 3));
    w.ptr<float>()[t * k + 1] = 0.25f + 0.5f * std::fabs(rnd(s + 5));
  }
  ops::GluAct act;
  Tensor ref = Tensor::zeros({T, H}, DType::f32);
  ops::moe_experts(x, ids, w, gate_up, down, act, ref);
  MoeParallel moe(E, W, r);
  PlainExperts local{gate_up.narrow(0, moe.first_expert(), moe.local_experts()),
                     down.narrow(0, moe.first_expert(), moe.local_experts()), act};
  Workspace ws(Device::cpu);
  for (EpCombine mode : {EpCombine::exact, EpCombine::partial}) {
    const char* name = mode == EpCombine::exact ? "EP dispatch (exact combine)" : "EP dispatch (partial combine)";
    ck.run(name, [&] {
      Tensor out = Tensor::zeros({T, H}, DType::f32);
      ws.reset();
      moe.forward_dispatch(x, ids, w, local.ref(), SharedRef{}, mode, c, out, ws);
      float worst = 0;
      bool same = true;
      for (int64_t i = 0; i < T * H; ++i) {
        worst = std::max(worst, std::fabs(out.ptr<float>()[i] - ref.ptr<float>()[i]));
        same = same && out.ptr<float>()[i] == ref.ptr<float>()[i];
      }
      ck.expect(mode == EpCombine::exact ? same : worst <= 1e-5f,
                fmt::format("{}: max |diff| {} against the single-rank MoE", name, worst));
    });
  }
}

}  // namespace

SelftestResult comm_selftest(Comm& world) {
  Checker ck(world.rank());
  check_collectives(world, ck);
  check_dispatch(world, ck);
  // A last barrier so that no rank tears its transport down while a peer still reads.
  ck.run("final barrier", [&] { world.barrier(); });
  return ck.res;
}

}  // namespace ts::parallel
