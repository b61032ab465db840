// KvStore: the host-memory tier of the KV cache (the reference system's KVStore; SGLang's
// HiCache, vLLM's CPU offload). A second pool of blocks beside the device pool, indexed by the
// same chained block hash (KvCache::hash_block), so a prefix found in either tier is the same
// tokens. Blocks move between tiers only as ops of a StepPlan:
//   writeback  device block -> host block: a hashed device block the device LRU evicts (its
//              hash is not in the host tier yet; if it is, the host copy is only touched);
//   load       host block -> device block: a prefix hit in the host tier, loaded into a fresh
//              device block before the forward that reads it.
// The host tier is inclusive (a loaded block stays in host memory) and has its own LRU. On
// CUDA the copies run on a copy stream ordered by events against the compute stream (the host
// never waits); on the CPU backend they are memcpys over the same op list, so CI runs the code
// path. Engine-thread only.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "models/forward_batch.h"

namespace ts {

struct KvBlockOp {
  int32_t device_block = -1, host_block = -1;
};

// The ops of one plan, executed in this order before its forward: every writeback (reads
// device blocks being reused by this plan), then every load (writes device blocks).
struct KvBlockOps {
  std::vector<KvBlockOp> writeback, load;
  bool empty() const { return writeback.empty() && load.empty(); }
  void clear() {
    writeback.clear();
    load.clear();
  }
};

// Cache events for external routers (vLLM's KV-events vocabulary). `tokens` only for stores.
struct KvCacheEvent {
  enum class Kind { stored, removed, cleared } kind = Kind::stored;
  enum class Medium { gpu, cpu } medium = Medium::gpu;  // the device tier is "GPU" on the CPU backend too
  uint64_t hash = 0, parent = 0;
  bool has_parent = false;
  std::vector<int32_t> tokens;
};

struct KvStoreStats {
  int64_t hit_blocks = 0;        // prefix blocks found in the host tier (loaded back)
  int64_t writeback_blocks = 0;  // device blocks copied to the host tier
  int64_t writeback_skipped = 0; // evicted device blocks whose hash the host tier already held
  int64_t dropped_blocks = 0;    // evicted blocks the host tier had no room for (all pinned)
  int64_t evicted_blocks = 0;    // host blocks reused for another hash
  int64_t bytes_written = 0, bytes_loaded = 0;
  double load_seconds = 0;       // host wall time issuing loads (CPU: the copies themselves)
  int64_t load_batches = 0;      // plans with at least one load
};

class KvStore {
 public:
  KvStore(int64_t num_blocks, int block_size);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  int block_size() const { return block_size_; }
  int64_t cached_blocks() const { return int64_t(by_hash_.size()); }

  // --- bookkeeping (the scheduler's side, through KvCache) ---
  // Starts a plan: pins of the previous plan's loads are dropped (its copies are ordered
  // before anything the new plan enqueues).
  void begin_plan();
  // The host block holding `hash` (now most recently used and pinned for this plan), or -1.
  int32_t find(uint64_t hash);
  bool contains(uint64_t hash) const { return by_hash_.count(hash) != 0; }
  // A device block with `hash` is being evicted: queues its writeback into a host block (the
  // least recently used one that this plan does not read), or only touches the host copy when
  // the hash is already held. parent/tokens are for the cache events.
  void offer(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens);
  // A load of host block `host` into device block `dev`, queued for this plan.
  void queue_load(int32_t host, int32_t dev) { ops_.load.push_back({dev, host}); }
  // Moves this plan's ops into `out` (cleared first).
  void take_ops(KvBlockOps& out);

  // --- memory ---
  // Host mirrors of every block tensor of `pool` (k, v, aux per layer; [num_blocks, ...] each):
  // the target pool, then the EAGLE3 draft pool (same block ids). Call before execute().
  void attach(KvPool& pool);
  size_t bytes_per_block() const { return bytes_per_block_; }
  size_t host_bytes() const { return bytes_per_block_ * size_t(num_blocks()); }
  // Runs the ops on the attached pools (writebacks first, then loads). CUDA: enqueued on the
  // copy stream after the compute stream's work so far; the compute stream waits for them.
  void execute(const KvBlockOps& ops);

  const KvStoreStats& stats() const { return stats_; }
  // Host-tier stores/removals go to `sink` (the KvCache's event list, so both tiers' events
  // keep their order); null: off.
  void set_events(std::vector<KvCacheEvent>* sink) { events_ = sink; }

  // Tests: every block is either free or indexed exactly once; throws on a violation.
  void check() const;

 private:
  struct Block {
    uint64_t hash = 0;
    bool hashed = false;
    uint32_t pin_epoch = 0;  // == epoch_: read by this plan's loads
    std::list<int32_t>::iterator lru_it;
  };
  struct Mirror {
    Tensor dev;                 // the device tensor [num_blocks, ...]
    std::shared_ptr<void> host; // [host blocks, ...] bytes
    size_t block_bytes = 0;
  };
  int32_t victim();

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // hashed host blocks; front = least recently used
  std::unordered_map<uint64_t, int32_t> by_hash_;
  uint32_t epoch_ = 1;
  KvBlockOps ops_;
  std::vector<Mirror> mirrors_;
  size_t bytes_per_block_ = 0;
  KvStoreStats stats_;
  std::vector<KvCacheEvent>* events_ = nullptr;
  Device device_ = Device::cpu;
  void *copy_stream_ = nullptr, *ev_compute_ = nullptr, *ev_copy_ = nullptr;
};

// Host-tier size in blocks: `size_gb` (> 0) or `ratio` x the device pool, capped at half the
// host memory now available (MemAvailable) so the tier never pushes the machine into swap.
// `available_bytes` is filled for the startup log.
int64_t kvstore_blocks(int64_t device_blocks, size_t bytes_per_block, double ratio, double size_gb,
                       size_t& available_bytes);
size_t host_available_bytes();  // /proc/meminfo MemAvailable (0: unknown)

}  // namespace ts
