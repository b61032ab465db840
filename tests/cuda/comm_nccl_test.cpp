// The NCCL backend of Comm on 2+ GPUs of one process (a thread per GPU), against the CPU
// backend's results: every collective incl. uneven all_to_all_v and zero rows, split groups,
// a multi-rank unique-id init (CommGroup::create_ranks, the multi-node path in one process), and
// the expert-parallel dispatch over GPUs against moe_experts on one GPU. Skips with < 2 GPUs.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/moe_dispatch.h"
#include "parallel/comm.h"
#include "parallel/moe.h"
#include "runtime/tp_workers.h"

using namespace ts;
using namespace ts::test;

#define TS_REQUIRE_GPUS(n)                                                                                  \
  if (!::ts::cuda_available() || ::ts::cuda::device_count() < (n))                                          \
  GTEST_SKIP() << "NCCL tests need " << (n) << " GPUs (" << (::ts::cuda_available() ? ::ts::cuda::device_count() : 0) \
               << " visible): skipped"

namespace {

Tensor dev_f32(const std::vector<float>& v) { return Tensor::from_blob(const_cast<float*>(v.data()), {int64_t(v.size())}, DType::f32, Device::cpu).to(Device::cuda); }
std::vector<float> host(const Tensor& d) {
  ::ts::cuda::synchronize();
  return d.to(Device::cpu).to_vector_f32();
}

void collectives(int n, const std::function<std::shared_ptr<parallel::Comm>(int)>& comm_of) {
  TpWorkers w(n);
  w.run([&](int r) {
    auto c = comm_of(r);
    ASSERT_EQ(c->size(), n);
    ASSERT_EQ(c->backend(), parallel::CommBackend::nccl);
    // all_reduce (f32: small integers, exact in any order)
    std::vector<float> v(37);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(r + 1) * float(i);
    Tensor x = dev_f32(v);
    c->all_reduce(x);
    auto got = host(x);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(got[i], float(n * (n + 1) / 2) * float(i));
    // reduce_scatter
    std::vector<float> rs(size_t(4 * n));
    for (size_t i = 0; i < rs.size(); ++i) rs[i] = float(r) + float(i);
    Tensor in = dev_f32(rs), out = Tensor::empty({4}, DType::f32, Device::cuda);
    c->reduce_scatter(in, out);
    got = host(out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[size_t(i)], float(n * (n - 1) / 2 + n * (r * 4 + i)));
    // broadcast
    Tensor b = dev_f32({float(r), float(r) * 2});
    c->broadcast(b, n - 1);
    EXPECT_EQ(host(b), (std::vector<float>{float(n - 1), float(2 * (n - 1))}));
    // all_to_all_v: (a + 2b) % 3 rows of width 2 from a to b
    std::vector<int64_t> sr, rr;
    std::vector<float> send;
    int64_t rt = 0;
    for (int p = 0; p < n; ++p) {
      sr.push_back((r + 2 * p) % 3);
      rr.push_back((p + 2 * r) % 3);
      rt += rr.back();
      for (int64_t i = 0; i < sr.back(); ++i)
        for (int j = 0; j < 2; ++j) send.push_back(float(r * 100 + p * 10 + i) + 0.5f * float(j));
    }
    Tensor sd = send.empty() ? Tensor::empty({0, 2}, DType::f32, Device::cuda)
                             : dev_f32(send).view({int64_t(send.size() / 2), 2});
    Tensor rd = Tensor::empty({std::max<int64_t>(rt, 1), 2}, DType::f32, Device::cuda);
    c->all_to_all_v(sd, sr, rd, rr);
    got = host(rd);
    int64_t o = 0;
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < rr[size_t(p)]; ++i, ++o)
        for (int j = 0; j < 2; ++j) EXPECT_EQ(got[size_t(o * 2 + j)], float(p * 100 + r * 10 + i) + 0.5f * float(j));
    // all_gather_v
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (int p = 0; p < n; ++p) total += rows.emplace_back(p % 2 + 1);
    Tensor gi = dev_f32(std::vector<float>(size_t(2 * rows[size_t(r)]), float(r))).view({rows[size_t(r)], 2});
    Tensor go = Tensor::empty({total, 2}, DType::f32, Device::cuda);
    c->all_gather_v(gi, rows, go);
    got = host(go);
    o = 0;
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < 2 * rows[size_t(p)]; ++i, ++o) EXPECT_EQ(got[size_t(o)], float(p));
    // zero-size, barrier, split
    Tensor z = Tensor::empty({0}, DType::f32, Device::cuda);
    c->all_reduce(z);
    c->barrier();
    auto g = c->split(r % 2, r);
    ASSERT_TRUE(g);
    Tensor s = dev_f32({1.0f});
    g->all_reduce(s);
    EXPECT_EQ(host(s)[0], float((n + 1 - r % 2) / 2));
  });
}

}  // namespace

TEST(NcclComm, EveryCollectiveOnAllGpus) {
  TS_REQUIRE_GPUS(2);
  const int n = std::min(::ts::cuda::device_count(), 8);
  auto group = parallel::CommGroup::create(n, 0, 64);
  collectives(n, [&](int r) { return group->rank(r); });
}

TEST(NcclComm, UniqueIdInitLikeMultiNode) {
  TS_REQUIRE_GPUS(2);
  const int n = std::min(::ts::cuda::device_count(), 8);
  std::vector<int> devs;
  for (int i = 0; i < n; ++i) devs.push_back(i);
  auto group = parallel::CommGroup::create_ranks(parallel::nccl_unique_id(), n, 0, devs, 2048, 64);
  collectives(n, [&](int r) { return group->rank(r); });
}

TEST(NcclComm, ExpertParallelDispatchMatchesOneGpu) {
  TS_REQUIRE_GPUS(2);
  const int n = 2;
  const int64_t T = 40, H = 64, I = 32, E = 8;
  const int k = 2;
  Pair gu = Pair::rand({E, 2 * I, H}, 0.3f), dn = Pair::rand({E, H, I}, 0.3f);
  std::vector<Pair> xs;
  std::vector<Tensor> ids, ws;
  std::uniform_int_distribution<int> pick(0, int(E) - 1);
  std::uniform_real_distribution<float> wd(0.1f, 1.0f);
  for (int r = 0; r < n; ++r) {
    const int64_t Tr = r == 1 ? 0 : T;  // rank 1 has no tokens
    xs.push_back(Pair::rand({Tr, H}));
    Tensor id = Tensor::empty({Tr, int64_t(k)}, DType::i32), w = Tensor::empty({Tr, int64_t(k)}, DType::f32);
    for (int64_t t = 0; t < Tr; ++t) {
      int a = pick(rng()), b = (a + 1 + pick(rng()) % int(E - 1)) % int(E);
      id.ptr<int32_t>()[t * k] = std::min(a, b);
      id.ptr<int32_t>()[t * k + 1] = std::max(a, b);
      w.ptr<float>()[t * k] = wd(rng());
      w.ptr<float>()[t * k + 1] = wd(rng());
    }
    ids.push_back(id);
    ws.push_back(w);
  }
  auto group = parallel::CommGroup::create(n, 0, H);
  TpWorkers workers(n);
  workers.run([&](int r) {
    auto c = group->rank(r);
    // The experts live on each rank's own GPU.
    Tensor gu_all = gu.h.to(Device::cpu), dn_all = dn.h.to(Device::cpu);
    auto to_bf16_dev = [](const Tensor& h) {
      Tensor b = Tensor::empty(h.dims(), DType::bf16);
      for (int64_t i = 0; i < h.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(h.ptr<float>()[i]);
      return b.to(Device::cuda);
    };
    Tensor gu_d = to_bf16_dev(gu_all), dn_d = to_bf16_dev(dn_all);
    Tensor x = to_bf16_dev(xs[size_t(r)].h), id = ids[size_t(r)].to(Device::cuda), w = ws[size_t(r)].to(Device::cuda);
    const int64_t Tr = x.rows();
    Tensor ref = Tensor::empty({Tr, H}, DType::bf16, Device::cuda);
    ops::GluAct act;
    ops::cuda::moe_experts(x, id, w, gu_d, dn_d, act, ref);
    parallel::MoeParallel moe(E, n, r);
    parallel::PlainExperts pe{gu_d.narrow(0, moe.first_expert(), moe.local_experts()),
                              dn_d.narrow(0, moe.first_expert(), moe.local_experts()), act};
    Workspace scratch(Device::cuda);
    for (auto mode : {parallel::EpCombine::exact, parallel::EpCombine::partial}) {
      Tensor out = Tensor::empty({Tr, H}, DType::bf16, Device::cuda);
      scratch.reset();
      moe.forward_dispatch(x, id, w, pe.ref(), parallel::SharedRef{}, mode, *c, out, scratch);
      if (Tr) EXPECT_CLOSE(to_host_f32(out), to_host_f32(ref), fmt::format("EP dispatch over 2 GPUs, rank {} mode {}", r, int(mode)));
    }
  });
}
