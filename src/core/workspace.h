// Per-forward scratch memory: a bump allocator reset at the start of every forward, so the
// steady state allocates nothing. When a forward needs more than the arena holds it takes the
// overflow from the heap (device) for that forward and grows the arena at the next reset.
// Addresses are stable across forwards of the same shape — CUDA graphs depend on that.
#pragma once
#include <algorithm>
#include <vector>

#include "core/tensor.h"

namespace ts {

class Workspace {
 public:
  explicit Workspace(Device device = Device::cpu) : device_(device) {}
  void reserve(size_t bytes);   // ensure capacity (call before graph capture)
  void reset();                 // start a new forward; grows to the last high-water mark
  // After freeze() the arena never moves (CUDA graphs hold its addresses); a forward that
  // needs more takes the overflow from separate allocations.
  void freeze() { frozen_ = true; }
  size_t high_water() const { return high_water_; }
  Tensor alloc(std::vector<int64_t> shape, DType dtype);
  size_t capacity() const { return capacity_; }
  // Allocations that did not fit the arena so far (a graph captured while this grows would
  // hold addresses that are freed after the forward: capture code checks it stays put).
  size_t overflow_allocs() const { return overflow_allocs_; }
  // LIFO scratch: everything allocated after mark() is reused after release(mark).
  size_t mark() const { return used_; }
  void release(size_t m);
  Device device() const { return device_; }

 private:
  Device device_;
  std::shared_ptr<void> arena_;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0, overflow_allocs_ = 0;
  bool frozen_ = false;
  std::vector<std::pair<size_t, Tensor>> overflow_;  // (position, allocation) past the arena
};

// Releases a block's temporaries when it returns: per-layer scratch is reused by the next
// layer instead of accumulating over the whole forward.
class WorkspaceScope {
 public:
  explicit WorkspaceScope(Workspace& ws) : ws_(ws), mark_(ws.mark()) {}
  ~WorkspaceScope() { ws_.release(mark_); }
  WorkspaceScope(const WorkspaceScope&) = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;

 private:
  Workspace& ws_;
  size_t mark_;
};

}  // namespace ts
