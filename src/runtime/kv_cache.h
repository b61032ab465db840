// KvCache: the paged block pool's bookkeeping (host only; the memory is ModelRunner's KvPool).
// Blocks are ref-counted. A full block that holds computed tokens gets a chained hash
// h_i = xxh64(tokens of block i, seed = h_{i-1}); equal hashes mean an equal token prefix, so
// later requests reuse those blocks instead of recomputing them. Blocks nobody references stay
// cached on an LRU list and are evicted only when the pool runs dry.
// With a host tier (KvStore, set_store) an evicted hashed block is offered to the host tier
// (a writeback op) and a prefix lookup that runs out of device blocks continues in the host
// tier (load ops into fresh device blocks); the ops go into the step plan (take_ops). A block
// being loaded carries its load batch (Block::load_seq) and one extra reference, held by the
// batch until the copy has completed (begin_plan releases it): so it is never handed out or
// freed while the copy may still write it, and a lookup that finds it on the device learns
// which batch it must wait for (last_wait_seq).
// Attention data parallelism (--data-parallel-size D): the block ids are D equal partitions of
// consecutive ids, group g = [g * group_blocks(), (g + 1) * group_blocks()), one per DP group's
// KV pools (each rank's pool holds group_blocks() blocks; the runner subtracts the group's first
// id). A sequence takes all its blocks from one group — the group of its table's blocks, or the
// group passed in for an empty table — and prefix hashes are seeded per group, so a lookup only
// finds blocks that its group's ranks hold. With one group everything is as without DP.
// Sliding-window release (set_window_release; every attention layer slides): a sequence's blocks
// wholly below what its later queries can read are dropped as it advances (commit), their table
// entries left as kNoBlock, so a 100k-token conversation over a 4k window holds ~4k tokens of
// blocks. The group of a table is its last block's (the last block is never released).
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "core/node_arena.h"

#include "runtime/kv_store.h"

namespace ts {

class KvCache {
 public:
  // groups: DP groups (num_blocks must be a multiple of it).
  KvCache(int64_t num_blocks, int block_size, bool enable_prefix_cache, int groups = 1);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  int groups() const { return int(parts_.size()); }
  int64_t group_blocks() const { return num_blocks() / groups(); }  // the most one sequence can hold
  int group_of(int32_t block) const { return int(block / group_blocks()); }
  // Blocks that can be handed out now (free + cached-but-unreferenced), in all groups or in one.
  int64_t available_blocks() const;
  int64_t available_blocks(int group) const {
    return int64_t(parts_[size_t(group)].free.size() + parts_[size_t(group)].lru.size());
  }
  // The group an admission should use for `tokens` (at most max_tokens of them): the one with
  // the longest cached prefix, ties to the most available blocks, then the lowest index. Takes
  // no reference; 0 with one group.
  int pick_group(const int32_t* tokens, int max_tokens) const;
  int64_t used_blocks() const { return num_blocks() - available_blocks(); }
  bool prefix_cache_enabled() const { return prefix_; }

  // Looks up the longest cached run of full blocks for `tokens` (at most `max_tokens` tokens),
  // takes a reference on each, appends them to `table` (which must be empty) and their hashes
  // to `hashes`. Returns the number of tokens covered. group: the DP group (see above). With a
  // window release a hit needs only the blocks a query at its end reads (the others kNoBlock).
  int match_prefix(const int32_t* tokens, int max_tokens, std::vector<int32_t>& table, std::vector<uint64_t>& hashes,
                   int group = 0);
  // Grows `table` to cover `num_tokens` tokens (blocks of the table's group; an empty table:
  // of `group`). Returns false (and changes nothing) when the group cannot supply the blocks.
  bool ensure(std::vector<int32_t>& table, int64_t num_tokens, int group = 0);
  int64_t blocks_needed(const std::vector<int32_t>& table, int64_t num_tokens) const;
  // Registers the hashes of blocks that became full with computed tokens [0, computed). With a
  // window release, then drops the blocks wholly below computed - window + 1 -
  // ops::kWindowReadSlack (no later query of the sequence reads them): their hashed blocks stay
  // cached on the LRU for prefix hits of later turns (match_prefix's window hit needs only the
  // blocks its end reads: the released ones are evicted first, as the oldest).
  void commit(const int32_t* tokens, int64_t computed, std::vector<int32_t>& table, std::vector<uint64_t>& hashes);
  // Drops the sequence's references (blocks with a hash stay cached, others become free).
  void release(std::vector<int32_t>& table, std::vector<uint64_t>& hashes);
  // Window release: every attention layer of the model reads the last `window` keys only (0:
  // off), and the kernels no key more than `slack` below that (ops::kWindowReadSlack; tests
  // pass less). Not with speculative decoding (the draft model attends to the whole context).
  void set_window_release(int window);  // slack: ops::kWindowReadSlack
  void set_window_release(int window, int slack);
  int window_release() const { return window_release_; }
  // Prefix hits that took the window path (their earlier blocks evicted; match_prefix).
  int64_t window_hits() const { return window_hits_; }
  // Window release alone (commit does it after hashing): drops the table's blocks wholly below
  // what a query at `computed` or later reads. No-op without a window release.
  void release_below_window(std::vector<int32_t>& table, int64_t computed);
  // A released entry of a table (no block; never read).
  static constexpr int32_t kNoBlock = -1;
  // The group of a non-empty table (its last block's).
  int table_group(const std::vector<int32_t>& table) const { return group_of(table.back()); }
  // The most blocks one sequence of `tokens` tokens holds while a step computes `step_tokens` of
  // them: all of its blocks, or with a window release the window's (plus the read slack) and the
  // step's. A request whose bound exceeds a group's blocks can never run.
  int64_t peak_blocks(int64_t tokens, int64_t step_tokens) const;
  // Truncates a table to cover `num_tokens` (speculative rollback); blocks past it are released.
  void truncate(std::vector<int32_t>& table, std::vector<uint64_t>& hashes, int64_t num_tokens);

  static uint64_t hash_block(const int32_t* tokens, int n, uint64_t parent);

  // The host tier (null: none). Not owned; outlives this cache.
  void set_store(KvStore* store);
  KvStore* store() const { return store_; }
  // Plan boundaries: begin_plan() before the scheduler's first block op (it also retires the
  // load batches that completed: their blocks' batch references are dropped), take_ops() after
  // its last (the host-tier copies this plan needs; empty without a tier).
  void begin_plan();
  void take_ops(KvBlockOps& out);
  // The load batch the blocks of the last match_prefix wait for (0: none; they are all there).
  uint64_t last_wait_seq() const { return last_wait_seq_; }
  // Host-tier load batches not yet retired (0 without a tier).
  int64_t loads_in_flight() const { return store_ ? store_->loads_in_flight() : 0; }
  // Whether load batch `seq` has completed (as of the last begin_plan; 0 always has).
  bool loaded(uint64_t seq) const { return seq == 0 || !store_ || store_->loaded(seq); }
  // Cache events (stored/removed blocks of both tiers, in order) for KV-event publishers; off
  // until enabled. drain_events appends them to `out` and clears the list.
  void enable_events();
  bool events_enabled() const { return events_on_; }
  void drain_events(std::vector<KvCacheEvent>& out);
  // Prefix hits of admissions (tokens; the scheduler reports each request's first admission,
  // so retried and re-admitted lookups do not count twice): from the device tier, from the host
  // tier (loaded back).
  void count_admission(int device_tokens, int host_tokens) {
    device_hit_tokens_ += device_tokens;
    host_hit_tokens_ += host_tokens;
  }
  int64_t device_hit_tokens() const { return device_hit_tokens_; }
  int64_t host_hit_tokens() const { return host_hit_tokens_; }
  int64_t host_hit_blocks() const { return host_hits_; }  // every host-tier lookup hit (loads)
  // Tokens the last match_prefix found in the host tier (a subset of its return value).
  int last_host_tokens() const { return last_host_tokens_; }

  // Tests and simulations: references held on block `id`, and a full consistency check (every
  // block is exactly one of free, cached-unreferenced on the LRU, or referenced; the hash index
  // names only hashed blocks). Throws on a violation. O(blocks).
  int32_t refs(int32_t id) const { return blocks_[size_t(id)].ref; }
  void check() const;

 private:
  struct Block {
    int32_t ref = 0;
    uint64_t hash = 0, parent = 0;
    bool hashed = false, has_parent = false;
    std::pmr::list<int32_t>::iterator lru_it;
    bool in_lru = false;
    uint64_t load_seq = 0;  // the host-tier load batch filling it (0: its contents are there)
  };
  int32_t take_block(int group);
  void unref(int32_t id);
  // The hash chain's seed of a group's sequences (0 for group 0: hashes as without DP).
  static uint64_t group_seed(int group) { return group == 0 ? 0 : 0x9E3779B97F4A7C15ull * uint64_t(group); }
  // Tokens of the longest run of full blocks of `tokens` cached in the device tier of `group`.
  int cached_tokens(const int32_t* tokens, int max_tokens, int group) const;
  struct WindowHit {
    int chain = 0;      // blocks: the leading run on the device
    int device = 0;     // blocks: the longest window hit on the device alone
    int any = 0;        // blocks: the longest window hit on the device or in the host tier
    int any_loads = 0;  // host-tier blocks `any` loads
  };
  WindowHit window_hit(const int32_t* tokens, int max_tokens, int group);
  void ref_cached(int32_t id);
  int32_t load_host_block(int32_t host, size_t pos, const int32_t* block_tokens, const std::vector<uint64_t>& hashes,
                          int group);
  int take_window(const int32_t* tokens, int end, std::vector<int32_t>& table, std::vector<uint64_t>& hashes, int group);
  void index_block(int32_t id, uint64_t h, size_t pos, const int32_t* block_tokens, const std::vector<uint64_t>& hashes);

  int block_size_;
  bool prefix_;
  int window_release_ = 0, window_slack_ = 0;
  std::vector<uint64_t> window_hashes_;  // window_hit's scratch: the chain's hashes
  std::vector<int32_t> window_host_;     // window_hit's scratch: prefix counts of host-only blocks
  std::vector<int32_t> window_host_ids_; // take_window's scratch: host block per table entry
  int64_t window_hits_ = 0;
  std::vector<Block> blocks_;
  // The LRU lists' and the hash index's nodes (at most one of each per block): set aside at
  // construction, so committing and evicting blocks allocates nothing (declared before them).
  NodeArena nodes_;
  struct Part {
    std::vector<int32_t> free;
    std::pmr::list<int32_t> lru;  // front = least recently used
    explicit Part(std::pmr::memory_resource* m) : lru(m) {}
  };
  std::vector<Part> parts_;  // per DP group
  std::pmr::unordered_map<uint64_t, int32_t> by_hash_;
  KvStore* store_ = nullptr;
  // Tokens of each hashed block (block id * block_size), kept for host-tier writebacks' and
  // removals' events only when events are on.
  std::vector<int32_t> block_tokens_;
  bool events_on_ = false;
  std::vector<KvCacheEvent> events_;
  int64_t host_hits_ = 0, device_hit_tokens_ = 0, host_hit_tokens_ = 0;
  int last_host_tokens_ = 0;
  uint64_t last_wait_seq_ = 0;
};

}  // namespace ts
