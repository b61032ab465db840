#include "runtime/kv_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/device_memory.h"
#include "core/error.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#include "ops/cuda/kv_copy.h"
#endif

namespace ts {

KvStore::KvStore(int64_t num_blocks, int block_size)
    : block_size_(block_size), blocks_(size_t(std::max<int64_t>(num_blocks, 0))),
      nodes_(NodeArena::bytes_for_blocks(num_blocks)), lru_(nodes_.resource()),
      by_hash_(nodes_.resource()) {
  TS_CHECK(num_blocks > 0 && block_size > 0, "KvStore: bad host pool {} x {}", num_blocks, block_size);
  by_hash_.reserve(size_t(num_blocks));  // one entry per host block at most: never rehashed
  free_.reserve(size_t(num_blocks));
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(int32_t(i));  // hands out 0, 1, ... (copy runs)
}

KvStore::~KvStore() {
  try {
    synchronize();
  } catch (...) {
  }
  release_events();
}

// Streams and events belong to their rank's GPU: destroyed on that rank's thread.
void KvStore::release_events() {
#ifdef TS_WITH_CUDA
  if (device_ != Device::cuda) return;
  std::vector<Batch*> all;
  for (Batch& b : batches_) all.push_back(&b);
  for (Batch& b : spare_) all.push_back(&b);
  try {
    for_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      for (void* s : {k.wb_stream, k.ld_stream})
        if (s) cuda::stream_destroy(s);
      for (void* e : {k.ev_compute, k.ev_wb})
        if (e) cuda::event_destroy(e);
      for (Round& rd : k.rounds)
        if (rd.ev) cuda::event_destroy(rd.ev);
      for (Batch* b : all) {
        if (size_t(r) < b->start.size() && b->start[size_t(r)]) cuda::event_destroy(b->start[size_t(r)]);
        if (size_t(r) < b->end.size() && b->end[size_t(r)]) cuda::event_destroy(b->end[size_t(r)]);
      }
    });
  } catch (...) {
  }
#endif
}

void KvStore::for_ranks(const std::function<void(int)>& fn) {
  if (ranks_.size() > 1 && run_ranks_) {
    run_ranks_(fn);
    return;
  }
#ifdef TS_WITH_CUDA
  TS_CHECK(ranks_.size() <= 1 || device_ != Device::cuda, "KvStore: {} CUDA ranks need a rank runner", ranks_.size());
#endif
  for (int r = 0; r < int(ranks_.size()); ++r) fn(r);
}

void KvStore::begin_plan() {
#ifdef TS_WITH_CUDA
  // Writebacks: each rank's rounds complete in order (one copy stream); wb_done_ is the last
  // round every rank has completed.
  if (device_ == Device::cuda && wb_done_ < wb_issued_) {
    uint64_t done = wb_issued_;
    for (Rank& k : ranks_) {
      while (k.round_count > 0 && cuda::event_query(k.rounds[k.round_head].ev)) {
        k.round_head = (k.round_head + 1) % kRounds;
        --k.round_count;
      }
      if (k.round_count > 0) done = std::min(done, k.rounds[k.round_head].seq - 1);
    }
    wb_done_ = std::max(wb_done_, done);
  }
#endif
  // Batches complete in seq order (one load stream per rank, FIFO); an unissued one (taken,
  // execute() not called yet) stops the walk.
  while (!batches_.empty() && batches_.front().issued && complete(batches_.front())) {
    Batch& b = batches_.front();
    for (const KvBlockOp& op : b.loads) {
      --blocks_[size_t(op.host_block)].pins;
      retired_.push_back(op.device_block);
    }
    done_seq_ = b.seq;
    spare_.push_back(std::move(b));
    batches_.pop_front();
  }
  ++epoch_;
}

// Whether batch b's copies are done (CUDA: every rank's end event reached; then its device time
// is added). A delayed batch waits its polls first; its CPU copies land when it completes.
bool KvStore::complete(Batch& b) {
  if (b.polls_left > 0) {
    --b.polls_left;
    return false;
  }
#ifdef TS_WITH_CUDA
  if (device_ == Device::cuda) {
    for (void* e : b.end)
      if (e && !cuda::event_query(e)) return false;
    // Rank 0's copy time (the shards are the same size; its events are on this thread's GPU,
    // as cudaEventElapsedTime wants).
    if (!b.end.empty() && b.end[0]) stats_.load_seconds += cuda::event_elapsed_ms(b.start[0], b.end[0]) * 1e-3;
    stats_.loaded_bytes_done += int64_t(b.loads.size() * bytes_per_block_);
    return true;
  }
#endif
  if (!b.landed) {
    // The slow copy of a delayed batch, on this (the engine) thread for every rank: the ranks'
    // threads may be running a step now.
    auto t0 = std::chrono::steady_clock::now();
    for (Rank& k : ranks_) copy(k, b.loads, false);
    b.cpu_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b.landed = true;
  }
  stats_.load_seconds += b.cpu_seconds;
  stats_.loaded_bytes_done += int64_t(b.loads.size() * bytes_per_block_);
  return true;
}

int32_t KvStore::find(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  Block& b = blocks_[size_t(it->second)];
  lru_.splice(lru_.end(), lru_, b.lru_it);
  b.pin_epoch = epoch_;
  ++stats_.hit_blocks;
  return it->second;
}

// The block a writeback fills: a free one, else the least recently used one that no load reads
// (this plan's, or a batch still copying). -1: none.
int32_t KvStore::victim() {
  if (!free_.empty()) {
    int32_t id = free_.back();
    free_.pop_back();
    return id;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    Block& b = blocks_[size_t(*it)];
    if (b.pin_epoch == epoch_ || b.pins > 0) continue;
    int32_t id = *it;
    lru_.erase(it);
    by_hash_.erase(b.hash);
    b.hashed = false;
    ++stats_.evicted_blocks;
    if (events_) events_->push_back({KvCacheEvent::Kind::removed, KvCacheEvent::Medium::cpu, b.hash, 0, false, {}});
    return id;
  }
  return -1;
}

int32_t KvStore::store_block(uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens) {
  int32_t id = victim();
  if (id < 0) {
    ++stats_.dropped_blocks;
    return -1;
  }
  Block& b = blocks_[size_t(id)];
  b.hash = hash;
  b.hashed = true;
  b.wb_seq = wb_issued_ + 1;  // the round the next execute() issues
  b.through_dev = -1;
  ++b.gen;  // a deferred write-through into its previous content is void
  b.lru_it = lru_.insert(lru_.end(), id);
  by_hash_.emplace(hash, id);
  ++stats_.writeback_blocks;
  if (events_) {
    KvCacheEvent ev{KvCacheEvent::Kind::stored, KvCacheEvent::Medium::cpu, hash, parent, has_parent, {}};
    if (tokens) ev.tokens.assign(tokens, tokens + block_size_);
    events_->push_back(std::move(ev));
  }
  return id;
}

void KvStore::offer(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent, const int32_t* tokens) {
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end()) {  // already held (written back before, or loaded from here): no copy
    Block& b = blocks_[size_t(it->second)];
    lru_.splice(lru_.end(), lru_, b.lru_it);
    if (b.through_dev == device_block) {
      // Its write-through is still deferred: copy it now, as the writeback of this eviction
      // (issued before the forward that reuses the block, after the step in flight).
      b.through_dev = -1;
      ++b.gen;
      b.wb_seq = wb_issued_ + 1;
      ops_.writeback.push_back({device_block, it->second});
      return;
    }
    ++stats_.writeback_skipped;
    // Written through from this device block, maybe still copying: the forward that
    // overwrites the block must wait for that round.
    if (b.wb_seq > wb_done_) ops_.wait_round = std::max(ops_.wait_round, b.wb_seq);
    return;
  }
  int32_t id = store_block(hash, parent, has_parent, tokens);
  if (id >= 0) ops_.writeback.push_back({device_block, id});
}

void KvStore::offer_through(int32_t device_block, uint64_t hash, uint64_t parent, bool has_parent,
                            const int32_t* tokens) {
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end()) {  // held (e.g. the block was loaded from here): the copy is there
    lru_.splice(lru_.end(), lru_, blocks_[size_t(it->second)].lru_it);
    return;
  }
  int32_t id = store_block(hash, parent, has_parent, tokens);
  if (id < 0) return;
  blocks_[size_t(id)].through_dev = device_block;
  fresh_.push_back({device_block, id, blocks_[size_t(id)].gen});
  ++stats_.through_blocks;
}

void KvStore::take_ops(KvBlockOps& out) {
  out.clear();
  std::swap(out, ops_);
  // Write-throughs committed before the previous take_ops: their steps have completed.
  for (const Through& t : aged_) {
    Block& b = blocks_[size_t(t.host)];
    if (b.gen != t.gen || b.through_dev != t.dev) continue;  // reassigned, or already copied
    b.through_dev = -1;
    b.wb_seq = wb_issued_ + 1;
    out.through.push_back({t.dev, t.host});
  }
  aged_.clear();
  std::swap(aged_, fresh_);
  if (out.load.empty()) return;
  // The batch: a retired one's storage when there is one (its vectors and events are reused).
  if (spare_.empty()) {
    batches_.emplace_back();
  } else {
    batches_.push_back(std::move(spare_.back()));
    spare_.pop_back();
  }
  Batch& b = batches_.back();
  b.seq = next_seq_++;
  b.loads.assign(out.load.begin(), out.load.end());
  b.issued = b.landed = false;
  b.polls_left = 0;
  b.cpu_seconds = 0;
  for (const KvBlockOp& op : b.loads) ++blocks_[size_t(op.host_block)].pins;
}

void KvStore::pending_device_blocks(std::vector<int32_t>& out) const {
  for (const Batch& b : batches_)
    for (const KvBlockOp& op : b.loads) out.push_back(op.device_block);
}

void KvStore::attach(KvPool& pool, int rank) {
  TS_CHECK(rank >= 0 && rank <= int(ranks_.size()), "KvStore: attach rank {} after {} ranks", rank, ranks_.size());
  if (rank == int(ranks_.size())) ranks_.emplace_back();
  Rank& k = ranks_[size_t(rank)];
  auto add = [&](Tensor& t) {
    if (!t.defined() || t.numel() == 0) return;
    TS_CHECK(!t.shape.empty() && t.shape[0] == pool.num_blocks, "KvStore: a KV tensor is not [num_blocks, ...]");
    Mirror m;
    m.dev = t;
    m.block_bytes = t.nbytes() / size_t(pool.num_blocks);
    // Pinned on CUDA builds with a GPU (DMA at full PCIe rate, truly asynchronous copies); plain
    // aligned memory otherwise. Pages are touched only when a block is first written back.
    m.host = host_pinned_alloc(m.block_bytes * size_t(num_blocks()));
    bytes_per_block_ += m.block_bytes;
    device_ = t.device;
    k.mirrors.push_back(std::move(m));
  };
  TS_CHECK(pool.block_size == block_size_, "KvStore: pool block size {} != {}", pool.block_size, block_size_);
  for (size_t l = 0; l < pool.k.size(); ++l) {
    add(pool.k[l]);
    if (l < pool.v.size()) add(pool.v[l]);
    if (l < pool.aux.size()) add(pool.aux[l]);
  }
}

// Rank k's copies of ops `v` on the CPU backend: consecutive ops whose device and host blocks
// both follow on are one memcpy per tensor (the free lists hand out ascending ids, so a
// sequence's blocks are mostly runs). CUDA ranks copy with copy_kernel.
void KvStore::copy(Rank& k, const std::vector<KvBlockOp>& v, bool to_host) {
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    while (j < v.size() && v[j].device_block == v[j - 1].device_block + 1 && v[j].host_block == v[j - 1].host_block + 1) ++j;
    const size_t n = j - i;
    for (Mirror& m : k.mirrors) {
      char* dev = static_cast<char*>(m.dev.data) + size_t(v[i].device_block) * m.block_bytes;
      char* host = static_cast<char*>(m.host.get()) + size_t(v[i].host_block) * m.block_bytes;
      if (to_host) std::memcpy(host, dev, n * m.block_bytes);
      else std::memcpy(dev, host, n * m.block_bytes);
    }
    i = j;
  }
}

void KvStore::copy_kernel(Rank& k, const std::vector<KvBlockOp>& a, const std::vector<KvBlockOp>& b, bool to_host,
                          void* stream) {
#ifdef TS_WITH_CUDA
  const size_t n = a.size() + b.size();
  if (n == 0) return;
  // (device, host) pairs, host-side: the launches take them as parameters.
  k.pair_buf.resize(2 * n);
  int32_t* pairs = k.pair_buf.data();
  size_t i = 0;
  for (const auto* v : {&a, &b})
    for (const KvBlockOp& op : *v) {
      pairs[2 * i] = op.device_block;
      pairs[2 * i + 1] = op.host_block;
      ++i;
    }
  ops::cuda::kv_block_copy(static_cast<const ops::cuda::KvCopyMirror*>(k.mirror_table.get()), int(k.mirrors.size()),
                           pairs, int64_t(n), to_host, stream);
#else
  (void)k, (void)a, (void)b, (void)to_host, (void)stream;
#endif
}

// Rank r's share of execute(), on rank r's thread. Touches only ranks_[r] and b's slot r.
void KvStore::issue_rank(int r, const KvBlockOps& ops, Batch* b) {
  Rank& k = ranks_[size_t(r)];
#ifdef TS_WITH_CUDA
  if (device_ == Device::cuda) {
    if (!k.wb_stream) {
      k.wb_stream = cuda::copy_stream_create();
      k.ld_stream = cuda::copy_stream_create();
      k.ev_compute = cuda::event_create();
      k.ev_wb = cuda::event_create();
      // The copy kernel's view of the mirrors (fixed once attached).
      std::vector<ops::cuda::KvCopyMirror> table;
      for (const Mirror& m : k.mirrors)
        table.push_back({reinterpret_cast<uint64_t>(m.dev.data), reinterpret_cast<uint64_t>(m.host.get()),
                         uint64_t(m.block_bytes)});
      const size_t bytes = std::max<size_t>(table.size(), 1) * sizeof(ops::cuda::KvCopyMirror);
      k.mirror_table = cuda::alloc(bytes);
      if (!table.empty()) cuda::copy(k.mirror_table.get(), true, table.data(), false, table.size() * sizeof(table[0]));
    }
    // Both kinds start after the compute work already enqueued on this GPU (the evicted blocks'
    // K/V is written; a block a load fills is no longer read or written by it).
    cuda::event_record_on(k.ev_compute, nullptr);
    if (!ops.writeback.empty() || !ops.through.empty()) {
      cuda::stream_wait_event(k.wb_stream, k.ev_compute);
      copy_kernel(k, ops.writeback, ops.through, true, k.wb_stream);
      cuda::event_record_on(k.ev_wb, k.wb_stream);
      // This round's own event (begin_plan polls them; a forward may wait for one).
      if (k.round_count == kRounds) {  // the copy stream is kRounds rounds behind: wait for the oldest
        cuda::event_synchronize(k.rounds[k.round_head].ev);
        k.round_head = (k.round_head + 1) % kRounds;
        --k.round_count;
      }
      Round& rd = k.rounds[(k.round_head + k.round_count) % kRounds];
      if (!rd.ev) rd.ev = cuda::event_create();
      rd.seq = wb_issued_;  // execute() numbered this round before issuing it
      cuda::event_record_on(rd.ev, k.wb_stream);
      ++k.round_count;
    }
    // The next forward overwrites the evicted blocks: it waits for their writeback (this
    // round's, or an earlier write-through's; the stream is FIFO, ev_wb marks its last round).
    // Write-throughs alone are waited for by nobody.
    if (!ops.writeback.empty()) {
      cuda::stream_wait_event(nullptr, k.ev_wb);
    } else if (ops.wait_round > 0) {
      // Only the round that copies the reused blocks (rounds still in the ring may be waited
      // for; one that left it has completed).
      for (size_t i = 0; i < k.round_count; ++i) {
        const Round& rd = k.rounds[(k.round_head + i) % kRounds];
        if (rd.seq > ops.wait_round) break;  // (ascending: that round has completed)
        if (rd.seq == ops.wait_round) {
          cuda::stream_wait_event(nullptr, rd.ev);
          break;
        }
      }
    }
    if (b) {
      // A load may fill a block a writeback reads, or read a host block a writeback fills:
      // after every round issued so far. Nobody waits on the host; the scheduler polls b's
      // end events.
      cuda::stream_wait_event(k.ld_stream, k.ev_compute);
      if (wb_issued_ > 0) cuda::stream_wait_event(k.ld_stream, k.ev_wb);
      if (!b->start[size_t(r)]) {
        b->start[size_t(r)] = cuda::event_create_timed();
        b->end[size_t(r)] = cuda::event_create_timed();
      }
      cuda::event_record_on(b->start[size_t(r)], k.ld_stream);
      copy_kernel(k, ops.load, {}, false, k.ld_stream);
      cuda::event_record_on(b->end[size_t(r)], k.ld_stream);
    }
    return;
  }
#endif
  copy(k, ops.writeback, true);
  copy(k, ops.through, true);
  if (b && delay_polls_ == 0) copy(k, ops.load, false);
}

void KvStore::execute(const KvBlockOps& ops) {
  Batch* b = nullptr;
  if (!ops.load.empty()) {
    for (Batch& x : batches_)
      if (!x.issued) {
        b = &x;
        break;
      }
    TS_CHECK(b && b->loads.size() == ops.load.size(), "KvStore: execute() of loads that take_ops() did not hand out");
    b->issued = true;
    b->polls_left = delay_polls_;
    b->start.resize(ranks_.size(), nullptr);
    b->end.resize(ranks_.size(), nullptr);
    ++stats_.load_batches;
    stats_.bytes_loaded += int64_t(ops.load.size() * bytes_per_block_);
  }
  stats_.bytes_written += int64_t((ops.writeback.size() + ops.through.size()) * bytes_per_block_);
  const bool round = !ops.writeback.empty() || !ops.through.empty();
  if (round) ++wb_issued_;  // the round store_block() numbered its blocks with
  if (ranks_.empty()) {  // bookkeeping only (tests without pools): nothing to copy
    if (b) b->landed = true;
    wb_done_ = wb_issued_;
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  // One reference captured: the std::function holds it inline (no allocation per plan).
  struct Issue {
    KvStore* self;
    const KvBlockOps* ops;
    Batch* b;
  } issue{this, &ops, b};
  for_ranks([&issue](int r) { issue.self->issue_rank(r, *issue.ops, issue.b); });
  if (device_ == Device::cuda) return;
  wb_done_ = wb_issued_;  // memcpys: done
  const double copy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  inline_copy_s_ += copy_s;
  if (b && delay_polls_ == 0) {
    // CPU: the copies ran here (writebacks included: they come first and are small next to
    // the loads they make room for).
    b->landed = true;
    b->cpu_seconds = copy_s;
  }
}

void KvStore::synchronize() {
#ifdef TS_WITH_CUDA
  if (device_ == Device::cuda) {
    for_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      if (k.wb_stream) cuda::stream_synchronize_on(k.wb_stream);
      if (k.ld_stream) cuda::stream_synchronize_on(k.ld_stream);
    });
    return;
  }
#endif
  for (Batch& b : batches_)
    if (b.issued && !b.landed) {
      for (Rank& k : ranks_) copy(k, b.loads, false);
      b.landed = true;
    }
}

void KvStore::check() const {
  std::vector<int> seen(blocks_.size(), 0);
  for (int32_t id : free_) {
    TS_CHECK(!blocks_[size_t(id)].hashed, "KvStore: free host block {} is indexed", id);
    ++seen[size_t(id)];
  }
  for (int32_t id : lru_) {
    TS_CHECK(blocks_[size_t(id)].hashed, "KvStore: host block {} on the LRU has no hash", id);
    ++seen[size_t(id)];
  }
  for (size_t i = 0; i < blocks_.size(); ++i)
    TS_CHECK(seen[i] == 1, "KvStore: host block {} is on {} of the free/cached lists", i, seen[i]);
  TS_CHECK(by_hash_.size() == lru_.size(), "KvStore: {} hashes index {} cached blocks", by_hash_.size(), lru_.size());
  for (auto& [h, id] : by_hash_)
    TS_CHECK(blocks_[size_t(id)].hashed && blocks_[size_t(id)].hash == h, "KvStore: hash index names host block {} wrongly", id);
  std::vector<int32_t> pins(blocks_.size(), 0);
  for (const Batch& b : batches_)
    for (const KvBlockOp& op : b.loads) ++pins[size_t(op.host_block)];
  for (size_t i = 0; i < blocks_.size(); ++i) {
    TS_CHECK(pins[i] == blocks_[i].pins, "KvStore: host block {} has {} pins, {} loads in flight read it", i,
             blocks_[i].pins, pins[i]);
    TS_CHECK(pins[i] == 0 || blocks_[i].hashed, "KvStore: host block {} is read by a load but holds no block", i);
  }
}

size_t host_available_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

int64_t kvstore_blocks(int64_t device_blocks, size_t bytes_per_block, double ratio, double size_gb,
                       size_t& available_bytes) {
  available_bytes = host_available_bytes();
  if (bytes_per_block == 0) return 0;
  int64_t want = size_gb > 0 ? int64_t(size_gb * double(1ull << 30) / double(bytes_per_block))
                             : int64_t(ratio * double(device_blocks));
  if (available_bytes > 0) want = std::min<int64_t>(want, int64_t(available_bytes / 2 / bytes_per_block));
  return std::max<int64_t>(want, 0);
}

}  // namespace ts
