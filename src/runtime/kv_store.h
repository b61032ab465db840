// KvStore: the host-memory tier of the KV cache (the reference system's KVStore; SGLang's
// HiCache, vLLM's CPU offload). A second pool of blocks beside the device pool, indexed by the
// same chained block hash (KvCache::hash_block), so a prefix found in either tier is the same
// tokens. Blocks move between tiers only as ops of a StepPlan:
//   writeback  device block -> host block: a hashed device block the device LRU evicts (its
//              hash is not in the host tier yet; if it is, the host copy is only touched);
//   load       host block -> device block: a prefix hit in the host tier, loaded into a fresh
//              device block;
//   through    (write-through policy, --kvstore-write-policy write_through) device -> host
//              shortly after a block is committed (full and hashed), in the background while
//              its request runs, so evicting it later costs no copy on the critical path. A
//              commit may name positions the step in flight still computes (overlap loop), so
//              a write-through is issued only at the second take_ops after its commit; a block
//              evicted before then has it turned into an ordinary writeback.
// The host tier is inclusive (a loaded block stays in host memory) and has its own LRU.
//
// Staged loads: the loads of one plan are a batch numbered `seq` (plan order). They are issued
// after the plan and copied asynchronously (CUDA: a load stream per rank, timing events; the
// compute stream never waits for them), while other requests keep running. A request whose
// blocks a batch fills is not scheduled before loaded(seq), which the scheduler learns from an
// event query at the start of a plan (begin_plan -> poll), never from a host wait. Until then
// the batch holds a reference on every device block it fills (KvCache: freed only after the
// copy finished, also when the request is aborted or retracted meanwhile) and a pin on every
// host block it reads (no writeback reuses it). Writebacks stay ordered before the next
// forward (it overwrites the evicted blocks): the compute stream waits for them, on their own
// stream so they never queue behind a load.
//
// Ranks (TP): every rank's pool holds its KV-head shard under the same block ids, so one
// bookkeeping serves all; rank r's tensors get their own host mirrors (attach(pool, r)) and on
// CUDA its own streams and events, used on rank r's thread (set_rank_runner: the TP workers).
// The CPU backend runs the same ops as memcpys (on the ranks' threads too), so CI runs the code
// path; set_load_delay_polls makes a CPU copy land late (tests: the "not loaded yet" state).
// Engine-thread only (rank work runs inside the runner's call).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/node_arena.h"
#include "core/tensor.h"
#include "models/forward_batch.h"

namespace ts {

struct KvBlockOp {
  int32_t device_block = -1, host_block = -1;
};

// The ops of one plan, issued in this order before its forward: every writeback (reads device
// blocks being reused by this plan; done before the forward), every write-through (blocks that
// were just committed, copied in the background: nothing waits for them), then every load
// (writes device blocks; asynchronous, after the writebacks).
struct KvBlockOps {
  std::vector<KvBlockOp> writeback, through, load;
  // This plan reuses a device block whose write-through may still be copying: its forward
  // waits for that copy's round (the highest such round number; 0: none). Only that round:
  // waiting for the latest one instead would chain every forward that evicts an old block to
  // the copy stream's newest write-throughs, which under steady write-through (a round per
  // step, each starting after the step in flight) is a stall of milliseconds per step.
  uint64_t wait_round = 0;
  bool wait_writebacks() const { return wait_round > 0; }
  bool empty() const { return writeback.empty() && through.empty() && load.empty() && wait_round == 0; }
  // Whether the ops touch device blocks a step still in flight may write (overlap loop: issue
  // them after it): evicted blocks' writebacks and loads into fresh blocks.
  bool needs_drain() const { return !writeback.empty() || !load.empty(); }
  void clear() {
    writeback.clear();
    through.clear();
    load.clear();
    wait_round = 0;
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
  int64_t writeback_blocks = 0;  // device blocks copied to the host tier (at eviction or written through)
  int64_t through_blocks = 0;    // of those, written through when committed
  int64_t writeback_skipped = 0; // evicted device blocks whose hash the host tier already held
  int64_t dropped_blocks = 0;    // evicted blocks the host tier had no room for (all pinned)
  int64_t evicted_blocks = 0;    // host blocks reused for another hash
  int64_t bytes_written = 0, bytes_loaded = 0;
  double load_seconds = 0;       // copy time of completed loads (CUDA: device time on rank 0)
  int64_t load_batches = 0;      // plans with at least one load (issued)
  int64_t loaded_bytes_done = 0; // bytes of completed loads (over load_seconds: the load GB/s)
};

class KvStore {
 public:
  // Runs fn(r) for every rank r, each on its rank's thread (TpWorkers::run).
  using RankRunner = std::function<void(const std::function<void(int)>&)>;

  KvStore(int64_t num_blocks, int block_size);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  int block_size() const { return block_size_; }
  int64_t cached_blocks() const { return int64_t(by_hash_.size()); }

  // --- bookkeeping (the scheduler's side, through KvCache) ---
  // Starts a plan: polls the issued load batches (completed ones are retired: their host pins
  // dropped, their device blocks listed in retired_blocks() for KvCache to release), then
  // drops the previous plan's epoch pins.
  void begin_plan();
  // The host block holding `hash` (now most recently used and pinned for this plan), or -1.
  int32_t find(uint64_t hash);
  bool contains(uint64_t hash) const { return by_hash_.count(hash) != 0; }
  // A device block with `hash` is being evicted: queues its writeback into a host block (the
  // least recently used one that no load reads), or only touches the host copy when the hash
  // is already held. parent/tokens are for the cache events.
  void offer(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens);
  // Write-through: device block `device_block` was just committed with `hash`; unless the host
  // tier holds it already, queue its background copy into a host block.
  void set_write_through(bool on) { write_through_ = on; }
  bool write_through() const { return write_through_; }
  void offer_through(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens);
  // A load of host block `host` into device block `dev`, queued for this plan (batch plan_seq()).
  void queue_load(int32_t host, int32_t dev) { ops_.load.push_back({dev, host}); }
  // The batch number this plan's loads complete under (> every earlier batch's).
  uint64_t plan_seq() const { return next_seq_; }
  // Whether batch `seq` (0: none) has completed, as of the last begin_plan.
  bool loaded(uint64_t seq) const { return seq <= done_seq_; }
  // Moves this plan's ops into `out` (cleared first); its loads become batch plan_seq(),
  // waiting for execute(). Every take_ops with loads must be followed by execute(out).
  void take_ops(KvBlockOps& out);
  // Device blocks of batches retired by the last begin_plan (KvCache drops the batch's
  // reference on each, then calls clear_retired()).
  const std::vector<int32_t>& retired_blocks() const { return retired_; }
  void clear_retired() { retired_.clear(); }
  // Load batches taken and not yet retired; their device blocks (tests: leak accounting).
  int64_t loads_in_flight() const { return int64_t(batches_.size()); }
  void pending_device_blocks(std::vector<int32_t>& out) const;

  // --- memory ---
  // Host mirrors of every block tensor of `pool` (k, v, aux per layer; [num_blocks, ...] each)
  // for rank `rank`: the target pool, then (rank 0) the EAGLE3 draft pool (same block ids).
  // Call before execute(); ranks are 0..n-1 in order.
  void attach(KvPool& pool, int rank = 0);
  // With more than one rank: how to run work on each rank's thread (CUDA TP: required, each
  // rank's copies go to its own GPU's streams; CPU ranks: their memcpys run there too).
  void set_rank_runner(RankRunner run) { run_ranks_ = std::move(run); }
  int ranks() const { return int(ranks_.size()); }
  size_t bytes_per_block() const { return bytes_per_block_; }
  size_t host_bytes() const { return bytes_per_block_ * size_t(num_blocks()); }
  // Issues the ops taken last (writebacks first, then the loads as the oldest unissued batch).
  // CUDA: the writebacks run on a copy stream after the compute stream's work so far and the
  // compute stream waits for them; the loads run on a load stream after both, unwaited. CPU:
  // memcpys now (a load with a delay lands when its batch completes).
  void execute(const KvBlockOps& ops);
  // Tests: a batch completes only at the (n+1)-th poll after it was issued, and on the CPU its
  // copies land only then (a slow copy: a forward that read its blocks early would read junk).
  void set_load_delay_polls(int n) { delay_polls_ = n; }
  // Waits for every issued copy (shutdown; tests). Batches stay until the next begin_plan.
  void synchronize();
  // Seconds the execute() calls since the last take spent copying on the caller's thread: the
  // CPU backend's memcpys, its device work, which the engine's host-time figure leaves out as it
  // leaves out the forward. CUDA: 0 (the copies are issued on streams).
  double take_inline_copy_seconds() {
    const double s = inline_copy_s_;
    inline_copy_s_ = 0;
    return s;
  }

  const KvStoreStats& stats() const { return stats_; }
  // Host-tier stores/removals go to `sink` (the KvCache's event list, so both tiers' events
  // keep their order); null: off.
  void set_events(std::vector<KvCacheEvent>* sink) { events_ = sink; }

  // Tests: every block is either free or indexed exactly once, pins match the batches in
  // flight; throws on a violation.
  void check() const;

 private:
  struct Block {
    uint64_t hash = 0;
    bool hashed = false;
    uint32_t pin_epoch = 0;  // == epoch_: read by this plan's loads
    int32_t pins = 0;        // load batches in flight that read it
    uint64_t wb_seq = 0;     // the writeback issue that fills it (> wb_done_: maybe still copying)
    int32_t through_dev = -1;  // a deferred write-through from this device block, not issued yet
    uint32_t gen = 0;          // bumped when the block is reassigned or its deferred copy moves
    std::pmr::list<int32_t>::iterator lru_it;
  };
  struct Through {  // a deferred write-through; void unless blocks_[host].gen == gen
    int32_t dev, host;
    uint32_t gen;
  };
  struct Mirror {
    Tensor dev;                 // the device tensor [num_blocks, ...]
    std::shared_ptr<void> host; // [host blocks, ...] bytes
    size_t block_bytes = 0;
  };
  // One rank's mirrors and (CUDA) its writeback and load streams and ordering events, created
  // on the rank's thread at its first execute.
  // CUDA: a writeback round still possibly copying, with the event recorded after it.
  struct Round {
    uint64_t seq = 0;
    void* ev = nullptr;
  };
  static constexpr size_t kRounds = 64;  // rounds in flight per rank (more: the oldest is waited for)
  struct Rank {
    std::vector<Mirror> mirrors;
    void *wb_stream = nullptr, *ld_stream = nullptr, *ev_compute = nullptr, *ev_wb = nullptr;
    // Rounds in flight, oldest first: a ring of kRounds (events created once, reused).
    Round rounds[kRounds];
    size_t round_head = 0, round_count = 0;
    std::shared_ptr<void> mirror_table;  // CUDA: ops::cuda::KvCopyMirror [mirrors] on the rank's GPU
    std::vector<int32_t> pair_buf;  // CUDA: a round's (device, host) block pairs (kernel parameters)
  };
  // The loads of one plan. start/end: per rank timing events on its load stream (CUDA).
  struct Batch {
    uint64_t seq = 0;
    std::vector<KvBlockOp> loads;
    bool issued = false, landed = false;  // landed: the CPU copies ran
    int polls_left = 0;
    double cpu_seconds = 0;
    std::vector<void*> start, end;
  };
  int32_t victim();
  // Indexes `hash` in a victim host block and reports it (-1: no room); the caller queues the copy.
  int32_t store_block(uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens);
  void for_ranks(const std::function<void(int)>& fn);
  void copy(Rank& k, const std::vector<KvBlockOp>& v, bool to_host);
  // CUDA: every mirror's blocks of `a` then `b` in one kernel launch on `stream`.
  void copy_kernel(Rank& k, const std::vector<KvBlockOp>& a, const std::vector<KvBlockOp>& b, bool to_host,
                   void* stream);
  void issue_rank(int r, const KvBlockOps& ops, Batch* b);
  bool complete(Batch& b);
  void release_events();

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;
  NodeArena nodes_;  // lru_'s and by_hash_'s nodes (at most one each per host block)
  std::pmr::list<int32_t> lru_;  // hashed host blocks; front = least recently used
  std::pmr::unordered_map<uint64_t, int32_t> by_hash_;
  uint32_t epoch_ = 1;
  KvBlockOps ops_;
  std::deque<Batch> batches_;  // taken, in seq order; issued ones first
  std::vector<Batch> spare_;   // retired batches (their vectors and events are reused)
  uint64_t next_seq_ = 1, done_seq_ = 0;
  // Writebacks (eviction + through) are issued in numbered rounds on one stream per rank;
  // wb_done_: every round up to it has completed (a poll of the last round's event).
  uint64_t wb_issued_ = 0, wb_done_ = 0;
  bool write_through_ = false;
  double inline_copy_s_ = 0;  // take_inline_copy_seconds()
  // Deferred write-throughs: committed since the last take_ops (fresh_), and since the one
  // before (aged_: issued by the next take_ops).
  std::vector<Through> fresh_, aged_;
  std::vector<int32_t> retired_;
  int delay_polls_ = 0;
  std::vector<Rank> ranks_;
  RankRunner run_ranks_;
  size_t bytes_per_block_ = 0;
  KvStoreStats stats_;
  std::vector<KvCacheEvent>* events_ = nullptr;
  Device device_ = Device::cpu;
};

// Host-tier size in blocks: `size_gb` (> 0) or `ratio` x the device pool, capped at half the
// host memory now available (MemAvailable) so the tier never pushes the machine into swap.
// `available_bytes` is filled for the startup log.
int64_t kvstore_blocks(int64_t device_blocks, size_t bytes_per_block, double ratio, double size_gb,
                       size_t& available_bytes);
size_t host_available_bytes();  // /proc/meminfo MemAvailable (0: unknown)

}  // namespace ts
