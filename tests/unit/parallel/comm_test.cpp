// The CPU backend of Comm: every collective for 1..8 ranks (zero-size tensors, uneven
// all_to_all_v counts), determinism (bit-identical on every rank and across runs), errors that
// name the problem instead of hanging, the fused all-reduce + add + RMSNorm, and the same
// selftest over threads and over two "nodes" joined by TCP in one process.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "ops/ops.h"
#include "par_test_util.h"
#include "parallel/comm.h"
#include "parallel/cpu_transport.h"
#include "parallel/net.h"
#include "parallel/rendezvous.h"
#include "parallel/selftest.h"
#include "parallel/world.h"

using namespace ts;
using namespace ts::parallel;
using ts::test::run_ranks;

namespace {

std::string fmt_failures(const SelftestResult& r) {
  std::string s;
  for (auto& f : r.failures) s += f + "\n";
  return s;
}

// A free TCP port on the loopback (bound, read, released; the tests retry on the rare reuse).
int free_port() {
  net::Socket s = net::listen_tcp("127.0.0.1", 0);
  return net::bound_port(s);
}

}  // namespace

TEST(CpuComm, SelftestEveryCollectiveOneToEightRanks) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](int, Comm& c) {
      SelftestResult r = comm_selftest(c);
      EXPECT_GT(r.checks, 15);
      EXPECT_TRUE(r.failures.empty()) << fmt_failures(r);
    });
  }
}

TEST(CpuComm, AllReduceIsBitIdenticalAcrossRanksAndRuns) {
  // Full-precision values whose sum depends on the order: every rank and every run must agree
  // with the rank-order fold.
  const int n = 5;
  const int64_t len = 1000;
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> got(n);
    run_ranks(n, [&](int r, Comm& c) {
      // Stagger the ranks so arrival order differs between runs.
      std::this_thread::sleep_for(std::chrono::milliseconds(((r + run) * 7) % 5));
      Tensor x = ts::test::rand_f32({len}, uint32_t(100 + r), 1e3f);
      c.all_reduce(x);
      got[size_t(r)].assign(x.ptr<float>(), x.ptr<float>() + len);
    });
    std::vector<float> want(size_t(len), 0.0f);
    for (int r = 0; r < n; ++r) {
      Tensor x = ts::test::rand_f32({len}, uint32_t(100 + r), 1e3f);
      for (int64_t i = 0; i < len; ++i) want[size_t(i)] = r == 0 ? x.ptr<float>()[i] : want[size_t(i)] + x.ptr<float>()[i];
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(0, std::memcmp(got[size_t(r)].data(), want.data(), size_t(len) * 4)) << r;
    if (run == 0) first = got;
    else EXPECT_EQ(first, got);
  }
}

TEST(CpuComm, ReduceScatterAndBf16AllReduceFoldInRankOrder) {
  run_ranks(3, [](int r, Comm& c) {
    Tensor in = ts::test::rand_f32({3 * 4}, uint32_t(7 + r));
    Tensor out = Tensor::zeros({4}, DType::f32);
    c.reduce_scatter(in, out);
    for (int i = 0; i < 4; ++i) {
      float want = 0;
      for (int p = 0; p < 3; ++p) {
        Tensor v = ts::test::rand_f32({3 * 4}, uint32_t(7 + p));
        want = p == 0 ? v.ptr<float>()[r * 4 + i] : want + v.ptr<float>()[r * 4 + i];
      }
      EXPECT_EQ(out.ptr<float>()[i], want);
    }
    Tensor b = Tensor::empty({2}, DType::bf16);
    b.ptr<uint16_t>()[0] = f32_to_bf16(1.0f + float(r));
    b.ptr<uint16_t>()[1] = f32_to_bf16(-0.5f);
    c.all_reduce(b);
    EXPECT_EQ(bf16_to_f32(b.ptr<uint16_t>()[0]), 6.0f);
    EXPECT_EQ(bf16_to_f32(b.ptr<uint16_t>()[1]), -1.5f);
  });
}

TEST(CpuComm, AllToAllVUnevenAndZeroRowsForEveryRankCount) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE(n);
    run_ranks(n, [&](int r, Comm& c) {
      // Rank a sends (a * 3 + b * 5) % 4 rows of width 2 to b; all rows tagged (src, dst, i).
      auto rows = [](int a, int b) { return int64_t((a * 3 + b * 5) % 4); };
      std::vector<int64_t> sr, rr;
      int64_t st = 0, rt = 0;
      for (int p = 0; p < n; ++p) {
        sr.push_back(rows(r, p));
        rr.push_back(rows(p, r));
        st += sr.back();
        rt += rr.back();
      }
      Tensor in = Tensor::zeros({st, 2}, DType::i32), out = Tensor::zeros({rt, 2}, DType::i32);
      int64_t o = 0;
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < sr[size_t(p)]; ++i, ++o) {
          in.ptr<int32_t>()[2 * o] = r * 100 + p;
          in.ptr<int32_t>()[2 * o + 1] = int32_t(i);
        }
      c.all_to_all_v(in, sr, out, rr);
      o = 0;
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < rr[size_t(p)]; ++i, ++o) {
          EXPECT_EQ(out.ptr<int32_t>()[2 * o], p * 100 + r);
          EXPECT_EQ(out.ptr<int32_t>()[2 * o + 1], i);
        }
      // Zero-size collectives still line up.
      Tensor z = Tensor::zeros({0}, DType::f32), zg = Tensor::zeros({0}, DType::f32);
      c.all_reduce(z);
      c.all_gather(z, zg);
      std::vector<int64_t> zeros(size_t(n), 0);
      Tensor z2 = Tensor::zeros({0, 4}, DType::f32), z3 = Tensor::zeros({0, 4}, DType::f32);
      c.all_to_all_v(z2, zeros, z3, zeros);
      c.all_gather_v(z2, zeros, z3);
    });
  }
}

TEST(CpuComm, MismatchedCountsAreErrorsNotHangs) {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r, Comm& c) {
    // Rank 0 sends one row to rank 1, but rank 1 expects two.
    std::vector<int64_t> sr = {0, r == 0 ? 1 : 0}, rr = {r == 1 ? 2 : 0, 0};
    if (r == 1) sr = {0, 0};
    Tensor in = Tensor::zeros({2, 3}, DType::f32), out = Tensor::zeros({2, 3}, DType::f32);
    try {
      c.all_to_all_v(in, sr, out, rr);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  EXPECT_NE(errors[1].find("expected 24 bytes from rank 0 but got 12"), std::string::npos) << errors[1];
}

TEST(CpuComm, AMissingPeerTimesOutNamingIt) {
  auto t = CpuTransport::local(2, std::chrono::milliseconds(200));
  auto comms = make_cpu_comms(t);
  Tensor x = Tensor::zeros({4}, DType::f32);
  try {
    comms[0]->all_reduce(x);  // rank 1 never joins
    FAIL() << "all_reduce without its peer returned";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("all_reduce: rank 0 waited 0 s for rank 1"), std::string::npos) << m;
  }
}

TEST(CpuComm, FusedAllReduceAddNormEqualsAllReduceThenNorm) {
  const int64_t T = 5, H = 16;
  Tensor w = ts::test::rand_f32({H}, 3);
  for (bool init : {false, true})
    run_ranks(3, [&](int r, Comm& c) {
      Tensor x = ts::test::rand_f32({T, H}, uint32_t(40 + r)), res = ts::test::rand_f32({T, H}, 9);
      // Reference: the rank-order sum, then the ops.
      Tensor s = Tensor::zeros({T, H}, DType::f32);
      for (int p = 0; p < 3; ++p) {
        Tensor v = ts::test::rand_f32({T, H}, uint32_t(40 + p));
        for (int64_t i = 0; i < T * H; ++i) s.ptr<float>()[i] = p == 0 ? v.ptr<float>()[i] : s.ptr<float>()[i] + v.ptr<float>()[i];
      }
      Tensor ref_res = ts::test::rand_f32({T, H}, 9), ref_x = Tensor::zeros({T, H}, DType::f32);
      if (init) {
        ops::copy_rows(s, ref_res);
        ops::rmsnorm(ref_res, w, 1e-6f, ref_x);
      } else {
        ops::copy_rows(s, ref_x);
        ops::fused_add_rmsnorm(ref_x, ref_res, w, 1e-6f);
      }
      c.all_reduce_add_rmsnorm(x, res, w, 1e-6f, init);
      EXPECT_TRUE(ts::test::bit_equal(x, ref_x)) << r;
      EXPECT_TRUE(ts::test::bit_equal(res, ref_res)) << r;
    });
}

TEST(CpuComm, SingleCommCopiesAndNeverCommunicates) {
  auto c = make_single_comm();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->backend(), CommBackend::single);
  Tensor a = ts::test::rand_f32({6}, 1), b = Tensor::zeros({6}, DType::f32);
  c->all_gather(a, b);
  EXPECT_TRUE(ts::test::bit_equal(a, b));
  Tensor x = ts::test::rand_f32({6}, 2), y = ts::test::rand_f32({6}, 2);
  c->all_reduce(x);
  EXPECT_TRUE(ts::test::bit_equal(x, y));
  std::vector<int64_t> one = {2};
  Tensor in = ts::test::rand_f32({3, 2}, 5), out = Tensor::zeros({2, 2}, DType::f32);
  c->all_to_all_v(in, one, out, one);
  EXPECT_EQ(out.ptr<float>()[3], in.ptr<float>()[3]);
  EXPECT_TRUE(c->split(0, 0));
  EXPECT_FALSE(c->split(-1, 0));
}

TEST(CpuComm, SplitGroupsAreIndependentStreams) {
  // Interleaved collectives on the world and on two sub-groups must not mix messages.
  run_ranks(4, [](int r, Comm& c) {
    auto g = c.split(r / 2, r);
    ASSERT_TRUE(g);
    EXPECT_EQ(g->size(), 2);
    EXPECT_EQ(g->rank(), r % 2);
    for (int i = 0; i < 20; ++i) {
      Tensor a = Tensor::zeros({1}, DType::i32), b = Tensor::zeros({1}, DType::i32);
      a.ptr<int32_t>()[0] = r + i;
      b.ptr<int32_t>()[0] = 10 * r + i;
      g->all_reduce(a);
      c.all_reduce(b);
      const int lo = (r / 2) * 2;
      EXPECT_EQ(a.ptr<int32_t>()[0], lo + lo + 1 + 2 * i);
      EXPECT_EQ(b.ptr<int32_t>()[0], 60 + 4 * i);
    }
  });
}

TEST(CpuComm, TwoNodesOverTcpPassTheSelftest) {
  // Two "nodes" of 2 ranks each in one process: each node connects through the rendezvous and its
  // own TCP transport, exactly as two processes do.
  const int port = free_port();
  std::vector<SelftestResult> res(4);
  std::vector<std::string> errors(2);
  std::vector<std::thread> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.emplace_back([&, node] {
      try {
        ParallelOptions o;
        o.tp_size = 4;
        o.nnodes = 2;
        o.node_rank = node;
        o.dist_init_addr = "127.0.0.1:" + std::to_string(port);
        o.dist_timeout_s = 60;
        auto comms = make_cpu_world(o);
        ASSERT_EQ(comms.size(), 2u);
        std::vector<std::thread> ranks;
        for (int i = 0; i < 2; ++i) ranks.emplace_back([&, i] { res[size_t(node * 2 + i)] = comm_selftest(*comms[size_t(i)]); });
        for (auto& t : ranks) t.join();
      } catch (const std::exception& e) {
        errors[size_t(node)] = e.what();
      }
    });
  for (auto& t : nodes) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (int r = 0; r < 4; ++r) {
    EXPECT_GT(res[size_t(r)].checks, 15) << r;
    EXPECT_TRUE(res[size_t(r)].failures.empty()) << fmt_failures(res[size_t(r)]);
  }
}
