#include "parallel/comm.h"

#include <algorithm>

#include "core/error.h"
#include "ops/graph_hooks.h"
#include "ops/ops.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/comm_ops.h"
#include "ops/cuda/runtime.h"
#endif

namespace ts::parallel {

#ifdef TS_WITH_CUDA

std::shared_ptr<CommGroup> CommGroup::create(int n, int fusion_max_tokens, int64_t hidden) {
  TS_CHECK(n >= 2, "a communicator group needs at least 2 GPUs (got {})", n);
  TS_CHECK(cuda::nccl_available(), "--tp-size {} needs NCCL, which this build does not link", n);
  TS_CHECK(cuda::device_count() >= n, "--tp-size {}: only {} GPUs visible", n, cuda::device_count());
  auto g = std::shared_ptr<CommGroup>(new CommGroup());
  g->nccl_ = cuda::nccl_init_all(n);
  g->fusion_max_tokens_ = std::max(fusion_max_tokens, 0);
  if (g->fusion_max_tokens_ > 0) {
    auto v = cuda::OneShotAllReduce::create(n, g->fusion_max_tokens_, hidden);
    for (auto& o : v) g->oneshot_.emplace_back(std::move(o));
  }
  return g;
}

CommGroup::~CommGroup() {
  for (void* c : nccl_) cuda::nccl_destroy(c);
}

std::shared_ptr<Comm> CommGroup::rank(int r) {
  TS_CHECK(r >= 0 && r < size(), "communicator rank {} outside 0..{}", r, size() - 1);
  auto c = std::make_shared<Comm>();
  c->rank_ = r;
  c->size_ = size();
  c->nccl_ = nccl_[size_t(r)];
  c->fusion_max_tokens_ = fusion_max_tokens_;
  if (!oneshot_.empty()) c->oneshot_ = oneshot_[size_t(r)];
  c->group_ = shared_from_this();
  return c;
}

namespace {
// Inside a breakable graph's replay the collectives are in the segment graphs: skip them here,
// as the op dispatcher skips ordinary ops.
bool replaying() {
  ops::GraphHooks* h = ops::graph_hooks();
  return h && h->skip_ops();
}
}  // namespace

void Comm::all_reduce(Tensor& x) {
  if (size_ == 1 || replaying()) return;
  cuda::nccl_all_reduce_sum(nccl_, x);
}

void Comm::all_gather(const Tensor& in, Tensor& out) {
  if (size_ == 1) {
    ops::copy_rows(in, out);
    return;
  }
  if (replaying()) return;
  cuda::nccl_all_gather(nccl_, in, out);
}

void Comm::all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init) {
  if (x.rows() == 0) return;
  if (size_ > 1 && oneshot_ && x.rows() <= fusion_max_tokens_) {
    if (replaying()) return;
    oneshot_->add_rmsnorm(x, residual, w, eps, residual_init);
    return;
  }
  all_reduce(x);
  if (residual_init) {
    ops::copy_rows(x, residual);
    ops::rmsnorm(residual, w, eps, x);
  } else {
    ops::fused_add_rmsnorm(x, residual, w, eps);
  }
}

#else

std::shared_ptr<CommGroup> CommGroup::create(int n, int, int64_t) {
  fail("--tp-size {} needs the CUDA backend with NCCL; this build has no CUDA", n);
}
CommGroup::~CommGroup() = default;
std::shared_ptr<Comm> CommGroup::rank(int) { fail("no communicators without CUDA"); }
void Comm::all_reduce(Tensor&) { TS_CHECK(size_ == 1, "all-reduce needs CUDA + NCCL"); }
void Comm::all_gather(const Tensor& in, Tensor& out) {
  TS_CHECK(size_ == 1, "all-gather needs CUDA + NCCL");
  ops::copy_rows(in, out);
}
void Comm::all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init) {
  TS_CHECK(size_ == 1, "all-reduce needs CUDA + NCCL");
  if (residual_init) {
    ops::copy_rows(x, residual);
    ops::rmsnorm(residual, w, eps, x);
  } else {
    ops::fused_add_rmsnorm(x, residual, w, eps);
  }
}

#endif

}  // namespace ts::parallel
