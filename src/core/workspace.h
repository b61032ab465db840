// Per-forward scratch memory: a bump allocator reset at the start of every forward, so the
// steady state allocates nothing. When a forward needs more than the arena holds it takes the
// overflow from the heap (device) for that forward and grows the arena at the next reset.
// Addresses are stable across forwards of the same shape — CUDA graphs depend on that.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace ts {

class Workspace {
 public:
  explicit Workspace(Device device = Device::cpu) : device_(device) {}
  void reserve(size_t bytes);   // ensure capacity (call before graph capture)
  void reset();                 // start a new forward; grows to the last high-water mark
  Tensor alloc(std::vector<int64_t> shape, DType dtype);
  size_t capacity() const { return capacity_; }
  Device device() const { return device_; }

 private:
  Device device_;
  std::shared_ptr<void> arena_;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
  std::vector<Tensor> overflow_;
};

}  // namespace ts
