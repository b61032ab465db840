// NodeArena: memory for the nodes of node-based containers whose size is bounded by a pool
// (a cache index and LRU list: at most one entry per block), set aside up front and reused as
// nodes come and go, so the engine thread's steady steps do not allocate. Pass resource() to
// std::pmr containers declared after the arena (they must die first). One owner thread.
#pragma once
#include <cstddef>
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

 private:
  std::pmr::monotonic_buffer_resource arena_;
  std::pmr::unsynchronized_pool_resource pool_;
};

}  // namespace ts
