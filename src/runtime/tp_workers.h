// TpWorkers: one thread per GPU for tensor parallelism inside one process. Rank 0 is the
// calling thread (the engine thread drives GPU 0, as without TP); ranks 1..N-1 are worker
// threads, each bound to its GPU (cuda::set_device) for its whole life, so every CUDA call,
// allocation, stream and graph of rank r happens on GPU r's thread.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/config.h"
#include "models/model.h"

namespace ts {

class ModelRunner;

class TpWorkers {
 public:
  explicit TpWorkers(int tp_size);
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
  void loop(int rank);
  int size_;
  std::vector<std::unique_ptr<Worker>> w_;  // index = rank; w_[0] unused
  const std::function<void(int)>* posted_ = nullptr;
};

// A model loaded as tp_size shards, one per GPU, each on its own GPU's thread.
struct TpModels {
  std::shared_ptr<TpWorkers> workers;
  std::vector<std::shared_ptr<models::Model>> shards;  // index = rank
};
// Creates the communicators (NCCL + the fused one-shot buffers for up to fusion_max_tokens
// rows) and loads every shard (base's capture layers / device / replicate_embedding apply).
TpModels load_tp_models(const io::ModelConfig& cfg, const models::LoadOptions& base, int tp_size, int ep_size,
                        int fusion_max_tokens);
// Rank 0's runner (on the calling thread) with the other ranks' runners attached; the KV pool
// of every rank has num_blocks blocks (its own kv heads).
std::unique_ptr<ModelRunner> make_tp_runner(const TpModels& m, int64_t num_blocks, int block_size);

}  // namespace ts
