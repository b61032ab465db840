// SpanGather (parallel/layers.h: dense TP / MoE TP over whole attention-DP groups) on one GPU
// through a group of one: the row counts go host -> device -> host around the all-gather, the
// rows come back bit-exact for bf16 activations and i32 routing ids, and zero-token ranks (a DP
// group without requests this step) gather nothing. The multi-rank behaviour is tested on CPU
// ranks (tests/unit/parallel/layers_test.cpp, ParallelSpan).
#include <cstring>

#include "cuda_test_util.h"
#include "ops/ops.h"
#include "parallel/layers.h"

using namespace ts;
using namespace ts::test;

TEST(CudaSpanGather, OneRankRoundTripOnTheDevice) {
  TS_REQUIRE_CUDA();
  auto comm = parallel::make_single_comm();
  Workspace ws(Device::cuda);
  for (int64_t T : {37, 1, 0}) {
    SCOPED_TRACE(T);
    const int64_t W = 24;
    Pair x = Pair::rand({T, W});
    Tensor ids_h = Tensor::empty({T, 2}, DType::i32);
    for (int64_t i = 0; i < ids_h.numel(); ++i) ids_h.ptr<int32_t>()[i] = int32_t(i * 7 % 13);
    Tensor ids = ids_h.to(Device::cuda);
    parallel::SpanGather span;
    span.plan(*comm, 1, 0, T, ws);
    ASSERT_EQ(span.total(), T);
    Tensor gx = Tensor::empty({T, W}, DType::bf16, Device::cuda), gi = Tensor::empty({T, 2}, DType::i32, Device::cuda);
    span.gather(*comm, x.d, gx);
    span.gather(*comm, ids, gi);
    Tensor bx = Tensor::empty({T, W}, DType::bf16, Device::cuda);
    span.take_mine(gx, bx);
    ::ts::cuda::synchronize();
    if (T == 0) continue;
    Tensor hx = bx.to(Device::cpu), ox = x.d.to(Device::cpu), hi = gi.to(Device::cpu);
    EXPECT_EQ(std::memcmp(hx.data, ox.data, size_t(hx.nbytes())), 0) << "bf16 rows gathered and taken back";
    EXPECT_EQ(std::memcmp(hi.data, ids_h.data, size_t(hi.nbytes())), 0) << "i32 ids gathered";
    // The layer helper with groups of one: the attention group itself, y = f(x) (a "partial"
    // sum over one rank).
    Tensor y = Tensor::empty({T, W}, DType::bf16, Device::cuda);
    const bool partial = parallel::group_sharded_forward(*comm, *comm, span, x.d, y, ws,
                                                         [&](const Tensor& a, Tensor& b) { ops::copy_rows(a, b); });
    EXPECT_TRUE(partial);
    ::ts::cuda::synchronize();
    Tensor hy = y.to(Device::cpu);
    EXPECT_EQ(std::memcmp(hy.data, ox.data, size_t(hy.nbytes())), 0);
  }
}
