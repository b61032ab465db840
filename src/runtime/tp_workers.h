// TpWorkers: one thread per rank for tensor / expert parallelism inside one process. Rank 0 is
// the calling thread (the engine thread drives GPU 0, as without TP); ranks 1..N-1 are worker
// threads. On CUDA each is bound to its GPU (cuda::set_device) for its whole life, so every CUDA
// call, allocation, stream and graph of rank r happens on GPU r's thread; on the CPU the ranks
// are plain threads joined by the CPU Comm backend (the same worker path, testable in CI).
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "io/config.h"
#include "models/model.h"
#include "parallel/options.h"

namespace ts {

class ModelRunner;
struct EngineOptions;

class TpWorkers {
 public:
  explicit TpWorkers(int tp_size, Device device = Device::cuda);
  ~TpWorkers();
  TpWorkers(const TpWorkers&) = delete;
  TpWorkers& operator=(const TpWorkers&) = delete;
  int size() const { return size_; }
  // Runs fn(r) on worker r for r = 1..size-1 and fn(0) on the caller, all at once; returns
  // when every rank finished, rethrowing the first failure (lowest rank).
  void run(const std::function<void(int)>& fn);
  // Starts fn(r) on the workers only (r >= 1); wait() joins them, rethrowing a failure.
  void post(const std::function<void(int)>& fn);
  void wait();

 private:
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    const std::function<void(int)>* job = nullptr;
    bool busy = false, quit = false;
    std::exception_ptr error;
  };
  void loop(int rank, Device device);
  void bind_cpu_threads() const;
  int size_;
  int cpu_threads_ = 0;  // CPU ranks: OpenMP threads per rank (0: GPU ranks, left alone)
  std::vector<std::unique_ptr<Worker>> w_;  // index = rank; w_[0] unused
  const std::function<void(int)>* posted_ = nullptr;
};

// A model loaded as one shard per rank of this process, each on its own rank's thread.
struct TpModels {
  std::shared_ptr<TpWorkers> workers;
  std::vector<std::shared_ptr<models::Model>> shards;  // index = local rank
  std::vector<std::shared_ptr<const parallel::ParallelGroups>> groups;  // index = local rank
};
// Creates the world (base.device cuda: NCCL + the fused one-shot buffers for up to
// p.comm_fusion_max_num_tokens rows; cpu: the CPU backend, ranks as threads), each rank's
// groups (ParallelGroups::create, on the rank's thread), and loads every shard (base's capture
// layers / device apply; p.replicate_embedding forces a replicated table). p.world_size() >= 2.
TpModels load_tp_models(const io::ModelConfig& cfg, const models::LoadOptions& base, const parallel::ParallelOptions& p);
// The same for --tp-size tp_size --ep-size ep_size (the CUDA tests' shorthand).
TpModels load_tp_models(const io::ModelConfig& cfg, const models::LoadOptions& base, int tp_size, int ep_size,
                        int fusion_max_tokens);
// The mapping an engine runs: o.parallel, or — when that is a world of one and the older fields
// ask for more — tp_size / ep_size / replicate_embedding / comm_fusion_max_num_tokens.
parallel::ParallelOptions engine_parallel_options(const EngineOptions& o);
// Rank 0's runner (on the calling thread) with the other ranks' runners attached; the KV pool
// of every rank has num_blocks blocks (its own kv heads) and state_slots recurrent-state rows.
std::unique_ptr<ModelRunner> make_tp_runner(const TpModels& m, int64_t num_blocks, int block_size, int state_slots = 0,
                                            std::optional<DType> kv_dtype = std::nullopt);

}  // namespace ts
