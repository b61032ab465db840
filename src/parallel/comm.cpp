// Comm base behaviour, the single-rank backend and the NCCL backend (the CPU backend lives in
// comm_cpu.cpp).
#include "parallel/comm.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "ops/graph_hooks.h"
#include "ops/ops.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/comm_ops.h"
#include "core/cuda/runtime.h"
#endif

namespace ts::parallel {

const char* backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::single: return "single";
    case CommBackend::cpu: return "cpu";
    case CommBackend::nccl: return "nccl";
  }
  return "?";
}

void Comm::all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init) {
  if (x.rows() == 0) return;
  all_reduce(x);
  if (residual_init) {
    ops::copy_rows(x, residual);
    ops::rmsnorm(residual, w, eps, x);
  } else {
    ops::fused_add_rmsnorm(x, residual, w, eps);
  }
}

namespace {

// [rows, width] view of a contiguous tensor's first `rows` rows (dim 0), for row copies.
Tensor rows_view(const Tensor& t, int64_t rows) {
  const int64_t width = t.size(0) ? t.numel() / t.size(0) : 0;
  Tensor v = t;
  v.ndim = 2;
  v.shape = {rows, width, 0, 0};
  v.stride = {width, 1, 0, 0};
  return v;
}

void copy_contiguous(const Tensor& src, Tensor& dst, const char* what) {
  TS_CHECK(src.is_contiguous() && dst.is_contiguous() && src.dtype == dst.dtype && src.numel() == dst.numel(),
           "{}: in {} out {}", what, src.shape_str(), dst.shape_str());
  if (src.numel() == 0 || src.data == dst.data) return;
  Tensor a = src.view({1, src.numel()}), b = dst.view({1, dst.numel()});
  ops::copy_rows(a, b);
}

class SingleComm final : public Comm {
 public:
  CommBackend backend() const override { return CommBackend::single; }
  void all_reduce(Tensor&) override {}
  void all_gather(const Tensor& in, Tensor& out) override { copy_contiguous(in, out, "all_gather"); }
  void reduce_scatter(const Tensor& in, Tensor& out) override { copy_contiguous(in, out, "reduce_scatter"); }
  void all_to_all(const Tensor& in, Tensor& out) override { copy_contiguous(in, out, "all_to_all"); }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    TS_CHECK(send_rows.size() == 1 && recv_rows.size() == 1 && send_rows[0] == recv_rows[0] &&
                 send_rows[0] <= in.size(0) && recv_rows[0] <= out.size(0),
             "all_to_all_v on one rank: send {} recv {} rows of in {} out {}", send_rows.size() ? send_rows[0] : -1,
             recv_rows.size() ? recv_rows[0] : -1, in.shape_str(), out.shape_str());
    if (send_rows[0] == 0 || in.data == out.data) return;
    Tensor a = rows_view(in, send_rows[0]), b = rows_view(out, send_rows[0]);
    ops::copy_rows(a, b);
  }
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& rows, Tensor& out) override {
    TS_CHECK(rows.size() == 1 && rows[0] <= in.size(0) && rows[0] <= out.size(0), "all_gather_v on one rank: {} rows",
             rows.size() ? rows[0] : -1);
    if (rows[0] == 0 || in.data == out.data) return;
    Tensor a = rows_view(in, rows[0]), b = rows_view(out, rows[0]);
    ops::copy_rows(a, b);
  }
  void broadcast(Tensor&, int root) override { TS_CHECK(root == 0, "broadcast: root {} of a group of one", root); }
  void barrier() override {}
  std::shared_ptr<Comm> split(int color, int) override {
    return color < 0 ? nullptr : std::make_shared<SingleComm>();
  }
};

}  // namespace

std::shared_ptr<Comm> make_single_comm() { return std::make_shared<SingleComm>(); }

#ifdef TS_WITH_CUDA

namespace {
// Inside a breakable graph's replay the collectives are in the segment graphs: skip them here,
// as the op dispatcher skips ordinary ops.
bool replaying() {
  ops::GraphHooks* h = ops::graph_hooks();
  return h && h->skip_ops();
}
// Collectives with host counts cannot live in a captured graph (the counts would be baked in).
void check_not_captured(const char* what) {
  ops::GraphHooks* h = ops::graph_hooks();
  TS_CHECK(!(h && h->in_segment()) && !cuda::stream_capturing(),
           "{} with host counts cannot be captured into a CUDA graph: run it in an eager region "
           "(parallel::run_eager)",
           what);
}
}  // namespace

// One rank of an NCCL group. The handle is owned by the CommGroup (ranks it made) or by this
// object (groups made by split).
class NcclComm final : public Comm {
 public:
  NcclComm(void* nccl, int rank, int size, std::shared_ptr<void> owner, std::shared_ptr<cuda::OneShotAllReduce> oneshot,
           int fusion_max_tokens)
      : nccl_(nccl), owner_(std::move(owner)), oneshot_(std::move(oneshot)) {
    rank_ = rank;
    size_ = size;
    fusion_max_tokens_ = oneshot_ ? fusion_max_tokens : 0;
  }
  CommBackend backend() const override { return CommBackend::nccl; }

  void all_reduce(Tensor& x) override {
    if (size_ == 1 || replaying()) return;
    cuda::nccl_all_reduce_sum(nccl_, x);
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    if (size_ == 1) {
      copy_contiguous(in, out, "all_gather");
      return;
    }
    if (replaying()) return;
    cuda::nccl_all_gather(nccl_, in, out);
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    if (size_ == 1) {
      copy_contiguous(in, out, "reduce_scatter");
      return;
    }
    if (replaying()) return;
    cuda::nccl_reduce_scatter_sum(nccl_, in, out);
  }
  void all_to_all(const Tensor& in, Tensor& out) override {
    TS_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0 && in.dtype == out.dtype,
             "all_to_all: in {} out {} over {} ranks", in.shape_str(), out.shape_str(), size_);
    if (replaying()) return;
    // Equal chunks as rows of one chunk each: the v-path with uniform counts (capturable: the
    // counts are fixed by the shapes).
    const int64_t chunk = in.numel() / size_;
    Tensor a = in.view({int64_t(size_), chunk}), b = out.view({int64_t(size_), chunk});
    ones_.assign(size_t(size_), 1);  // keeps its capacity: no allocation after the first call
    cuda::nccl_all_to_all_v(nccl_, a, ones_.data(), b, ones_.data());
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    TS_CHECK(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_, "all_to_all_v: {} / {} counts for {} ranks",
             send_rows.size(), recv_rows.size(), size_);
    check_not_captured("all_to_all_v");
    cuda::nccl_all_to_all_v(nccl_, in, send_rows.data(), out, recv_rows.data());
  }
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& rows, Tensor& out) override {
    TS_CHECK(int(rows.size()) == size_, "all_gather_v: {} counts for {} ranks", rows.size(), size_);
    check_not_captured("all_gather_v");
    cuda::nccl_all_gather_v(nccl_, in, rows.data(), out);
  }
  void broadcast(Tensor& x, int root) override {
    TS_CHECK(root >= 0 && root < size_, "broadcast: root {} outside 0..{}", root, size_ - 1);
    if (size_ == 1 || replaying()) return;
    cuda::nccl_broadcast(nccl_, x, root);
  }
  void barrier() override {
    if (size_ == 1) {
      cuda::synchronize();
      return;
    }
    if (!scratch_.data) scratch_ = Tensor::zeros({1}, DType::i32, Device::cuda);
    cuda::nccl_barrier(nccl_, scratch_);
  }
  void all_reduce_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps, bool residual_init) override {
    if (x.rows() == 0) return;
    if (size_ > 1 && oneshot_ && x.rows() <= fusion_max_tokens_) {
      if (replaying()) return;
      oneshot_->add_rmsnorm(x, residual, w, eps, residual_init);
      return;
    }
    Comm::all_reduce_add_rmsnorm(x, residual, w, eps, residual_init);
  }
  std::shared_ptr<Comm> split(int color, int key) override {
    void* c = cuda::nccl_split(nccl_, color, key);
    if (!c) return nullptr;
    std::shared_ptr<void> own(c, [](void* p) { cuda::nccl_destroy(p); });
    return std::make_shared<NcclComm>(c, cuda::nccl_rank(c), cuda::nccl_size(c), std::move(own), nullptr, 0);
  }

 private:
  void* nccl_;
  std::shared_ptr<void> owner_;  // the CommGroup or the split handle: keeps nccl_ alive
  std::shared_ptr<cuda::OneShotAllReduce> oneshot_;
  Tensor scratch_;
  std::vector<int64_t> ones_;
};

std::shared_ptr<CommGroup> CommGroup::create(int n, int fusion_max_tokens, int64_t hidden) {
  TS_CHECK(n >= 2, "a communicator group needs at least 2 GPUs (got {})", n);
  TS_CHECK(cuda::nccl_available(), "--tp-size {} needs NCCL, which this build does not link", n);
  TS_CHECK(cuda::device_count() >= n, "--tp-size {}: only {} GPUs visible", n, cuda::device_count());
  auto g = std::shared_ptr<CommGroup>(new CommGroup());
  g->nccl_ = cuda::nccl_init_all(n);
  g->world_ = n;
  g->first_ = 0;
  for (int i = 0; i < n; ++i) g->devices_.push_back(i);
  g->fusion_max_tokens_ = std::max(fusion_max_tokens, 0);
  if (g->fusion_max_tokens_ > 0) {
    auto v = cuda::OneShotAllReduce::create(n, g->fusion_max_tokens_, hidden);
    for (auto& o : v) g->oneshot_.emplace_back(std::move(o));
  }
  return g;
}

std::shared_ptr<CommGroup> CommGroup::create_ranks(const std::string& id, int world, int first,
                                                   const std::vector<int>& devices, int fusion_max_tokens,
                                                   int64_t hidden) {
  TS_CHECK(cuda::nccl_available(), "multi-node tensor parallelism needs NCCL, which this build does not link");
  for (int d : devices)
    TS_CHECK(d >= 0 && d < cuda::device_count(), "NCCL: device {} requested, {} GPUs visible", d, cuda::device_count());
  auto g = std::shared_ptr<CommGroup>(new CommGroup());
  g->nccl_ = cuda::nccl_init_ranks(id, world, first, devices);
  g->world_ = world;
  g->first_ = first;
  g->devices_ = devices;
  // The one-shot kernel reads peers' buffers through peer access: only when the whole group
  // is in this process on devices 0..n-1.
  bool all_here = first == 0 && int(devices.size()) == world && world >= 2;
  for (size_t i = 0; all_here && i < devices.size(); ++i) all_here = devices[i] == int(i);
  g->fusion_max_tokens_ = all_here ? std::max(fusion_max_tokens, 0) : 0;
  if (g->fusion_max_tokens_ > 0) {
    auto v = cuda::OneShotAllReduce::create(world, g->fusion_max_tokens_, hidden);
    for (auto& o : v) g->oneshot_.emplace_back(std::move(o));
  }
  return g;
}

CommGroup::~CommGroup() {
  for (void* c : nccl_) cuda::nccl_destroy(c);
}

std::shared_ptr<Comm> CommGroup::rank(int r) {
  TS_CHECK(r >= first_ && r < first_ + local(), "communicator rank {} outside this process's ranks {}..{}", r, first_,
           first_ + local() - 1);
  const size_t i = size_t(r - first_);
  return std::make_shared<NcclComm>(nccl_[i], r, world_, shared_from_this(),
                                    oneshot_.empty() ? nullptr : oneshot_[i], fusion_max_tokens_);
}

std::string nccl_unique_id() { return cuda::nccl_unique_id(); }

#else

std::shared_ptr<CommGroup> CommGroup::create(int n, int, int64_t) {
  fail("--tp-size {} on GPUs needs the CUDA backend with NCCL; this build has no CUDA (use --device cpu)", n);
}
std::shared_ptr<CommGroup> CommGroup::create_ranks(const std::string&, int world, int, const std::vector<int>&, int,
                                                   int64_t) {
  fail("{} GPU ranks need the CUDA backend with NCCL; this build has no CUDA (use --device cpu)", world);
}
CommGroup::~CommGroup() = default;
std::shared_ptr<Comm> CommGroup::rank(int) { fail("no NCCL communicators without CUDA"); }
std::string nccl_unique_id() { fail("NCCL: this build has no CUDA"); }

#endif

}  // namespace ts::parallel
