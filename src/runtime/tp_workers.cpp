#include "runtime/tp_workers.h"

#include <omp.h>

#include <algorithm>

#include "core/error.h"
#include "models/shape.h"
#include "parallel/comm.h"
#include "parallel/world.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

TpWorkers::TpWorkers(int tp_size, Device device) : size_(tp_size) {
  TS_CHECK(tp_size >= 1, "TpWorkers: size {}", tp_size);
  // CPU ranks share the host's cores: each rank's ops get an even share of OpenMP threads, so
  // N ranks do not run N full teams that spin against each other between collectives.
  if (device == Device::cpu) cpu_threads_ = std::max(1, omp_get_max_threads() / tp_size);
  w_.resize(size_t(tp_size));
#ifdef TS_WITH_CUDA
  // Each worker thread runs with its creator's (the engine's) launch settings.
  auto body = [this, device, lc = cuda::launch_config()](int r) {
    cuda::set_launch_config(lc);
    loop(r, device);
  };
#else
  auto body = [this, device](int r) { loop(r, device); };
#endif
  for (int r = 1; r < tp_size; ++r) {
    w_[size_t(r)] = std::make_unique<Worker>();
    w_[size_t(r)]->thread = std::thread(body, r);
  }
}

TpWorkers::~TpWorkers() {
  for (int r = 1; r < size_; ++r) {
    Worker& w = *w_[size_t(r)];
    {
      std::lock_guard<std::mutex> lk(w.mu);
      w.quit = true;
    }
    w.cv.notify_all();
  }
  for (int r = 1; r < size_; ++r)
    if (w_[size_t(r)]->thread.joinable()) w_[size_t(r)]->thread.join();
}

void TpWorkers::loop(int rank, Device device) {
  Worker& w = *w_[size_t(rank)];
  std::exception_ptr bind_error;
  bind_cpu_threads();
#ifdef TS_WITH_CUDA
  try {
    if (device == Device::cuda) cuda::set_device(rank);
  } catch (...) {
    bind_error = std::current_exception();
  }
#else
  (void)device;
#endif
  while (true) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(w.mu);
      w.cv.wait(lk, [&] { return w.quit || (w.busy && w.job); });
      if (w.quit) return;
      job = w.job;
    }
    std::exception_ptr err = bind_error;
    if (!err) {
      try {
        (*job)(rank);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lk(w.mu);
      w.error = err;
      w.job = nullptr;
      w.busy = false;
    }
    w.cv.notify_all();
  }
}

void TpWorkers::post(const std::function<void(int)>& fn) {
  TS_CHECK(!posted_, "TpWorkers: a job is already running");
  posted_ = &fn;
  for (int r = 1; r < size_; ++r) {
    Worker& w = *w_[size_t(r)];
    {
      std::lock_guard<std::mutex> lk(w.mu);
      w.job = &fn;
      w.busy = true;
      w.error = nullptr;
    }
    w.cv.notify_all();
  }
}

void TpWorkers::wait() {
  if (!posted_) return;
  std::exception_ptr first;
  for (int r = 1; r < size_; ++r) {
    Worker& w = *w_[size_t(r)];
    std::unique_lock<std::mutex> lk(w.mu);
    w.cv.wait(lk, [&] { return !w.busy; });
    if (w.error && !first) first = w.error;
    w.error = nullptr;
  }
  posted_ = nullptr;
  if (first) std::rethrow_exception(first);
}

void TpWorkers::bind_cpu_threads() const {
  if (cpu_threads_ > 0) omp_set_num_threads(cpu_threads_);  // this thread's OpenMP team size
}

void TpWorkers::run(const std::function<void(int)>& fn) {
  post(fn);
  std::exception_ptr local;
  try {
    bind_cpu_threads();  // rank 0 runs on the caller's thread (e.g. the engine loop)
    fn(0);
  } catch (...) {
    local = std::current_exception();
  }
  try {
    wait();
  } catch (...) {
    if (!local) local = std::current_exception();
  }
  if (local) std::rethrow_exception(local);
}

TpModels load_tp_models(const io::ModelConfig& cfg, const models::LoadOptions& base,
                        const parallel::ParallelOptions& p) {
  TS_CHECK(p.world_size() >= 2, "load_tp_models: a world of {} rank(s)", p.world_size());
  // This process's ranks: the whole world on one node; ranks_per_node() of them (global ranks
  // node_rank * ranks_per_node + i) with --nnodes > 1.
  const int world = p.ranks_per_node(), first = p.node_rank * world;
  // The model's shapes against the mapping, before any communicator or weight: an error that
  // names the config field and the flag (heads, KV heads, experts, intermediate sizes).
  parallel::check_model_fits(parallel::Mapping::resolve(p, 0), models::model_shape(cfg));
  // One Comm per local rank (index = rank): NCCL on GPUs, the deterministic CPU backend else.
  std::vector<std::shared_ptr<parallel::Comm>> comms;
  if (base.device == Device::cuda) {
    auto group = parallel::make_nccl_world(p, cfg.hidden_size);
    for (int r = 0; r < world; ++r) comms.push_back(group->rank(first + r));
  } else {
    comms = parallel::make_cpu_world(p);
  }
  TpModels m;
  m.workers = std::make_shared<TpWorkers>(world, base.device);
  m.shards.resize(size_t(world));
  m.groups.resize(size_t(world));
  m.workers->run([&](int r) {
    // Collective (the group splits): every rank at once, each on its own thread.
    auto pg = std::make_shared<parallel::ParallelGroups>(parallel::ParallelGroups::create(p, comms[size_t(r)]));
    models::LoadOptions lo = base;
    lo.mapping = pg->mapping;
    lo.comm = pg->attn_tp;
    lo.groups = pg;
    lo.replicate_embedding = base.replicate_embedding || p.replicate_embedding;
    m.groups[size_t(r)] = pg;
    m.shards[size_t(r)] = models::create_model(cfg, lo);
  });
  return m;
}

TpModels load_tp_models(const io::ModelConfig& cfg, const models::LoadOptions& base, int tp_size, int ep_size,
                        int fusion_max_tokens) {
  parallel::ParallelOptions p;
  p.tp_size = tp_size;
  p.ep_size = ep_size;
  p.replicate_embedding = base.replicate_embedding;
  p.comm_fusion_max_num_tokens = fusion_max_tokens;
  return load_tp_models(cfg, base, p);
}

parallel::ParallelOptions engine_parallel_options(const EngineOptions& o) {
  parallel::ParallelOptions p = o.parallel;
  if (p.world_size() == 1 && (o.tp_size > 1 || o.ep_size > 1)) {
    p.tp_size = o.tp_size;
    p.ep_size = o.ep_size;
  }
  p.replicate_embedding = p.replicate_embedding || o.replicate_embedding;
  p.comm_fusion_max_num_tokens = o.comm_fusion_max_num_tokens;
  parallel::Mapping::resolve(p, 0);  // the flags' arithmetic: an error that names them
  return p;
}

std::unique_ptr<ModelRunner> make_tp_runner(const TpModels& m, int64_t num_blocks, int block_size, int state_slots,
                                            std::optional<DType> kv_dtype) {
  const int tp = m.workers->size();
  std::vector<std::unique_ptr<ModelRunner>> peers;
  peers.resize(size_t(tp));
  std::unique_ptr<ModelRunner> r0;
  m.workers->run([&](int r) {
    auto runner = std::make_unique<ModelRunner>(m.shards[size_t(r)], num_blocks, block_size, state_slots, kv_dtype);
    if (r == 0) r0 = std::move(runner);
    else peers[size_t(r)] = std::move(runner);
  });
  r0->attach_tp(m.workers, std::move(peers));
  return r0;
}

}  // namespace ts
