// NodeArena: memory for the nodes of node-based containers whose size is bounded by a pool
// (a cache index and LRU list: at most one entry per block), set aside up front and reused as
// nodes come and go, so the engine thread's steady steps do not allocate. Pass resource() to
// std::pmr containers declared after the arena (they must die first). One owner thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory_resource>

namespace ts {

class NodeArena {
 public:
  // `bytes`: what the containers will need at most (nodes, bucket arrays), with room for the
  // pool's chunking; past it the arena grows from the heap like any container would.
  explicit NodeArena(size_t bytes) : arena_(bytes), pool_(&arena_) {}
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  std::pmr::memory_resource* resource() { return &pool_; }
  // For a hash index (node ~24 B, bucket 8 B, primes past the count) and an LRU list (node
  // ~24 B) of at most one entry each per block: doubled for the pool's chunking, plus a margin.
  static size_t bytes_for_blocks(int64_t blocks) { return size_t(blocks > 0 ? blocks : 0) * 128 + (64 << 10); }

 private:
  std::pmr::monotonic_buffer_resource arena_;
  std::pmr::unsynchronized_pool_resource pool_;
};

}  // namespace ts
