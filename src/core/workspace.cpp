#include "core/workspace.h"

namespace ts {

void Workspace::reserve(size_t bytes) {
  if (bytes <= capacity_ || frozen_) return;
  Tensor t = Tensor::empty({int64_t(bytes)}, DType::u8, device_);
  arena_ = t.owner;
  capacity_ = bytes;
  used_ = 0;
}

void Workspace::reset() {
  overflow_.clear();
  if (high_water_ > capacity_ && !frozen_) reserve(high_water_ + high_water_ / 4);
  used_ = 0;
}

void Workspace::release(size_t m) {
  used_ = std::min(used_, m);
  // Overflow allocations made after the mark go too, so a forward larger than the arena
  // holds one layer's scratch at a time, not the whole forward's.
  while (!overflow_.empty() && overflow_.back().first >= m) overflow_.pop_back();
}

Tensor Workspace::alloc(std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  size_t bytes = (size_t(n) * dtype_size(dtype) + 255) / 256 * 256;
  high_water_ = std::max(high_water_, used_ + bytes);
  if (used_ + bytes > capacity_) {
    overflow_.emplace_back(used_, Tensor::empty(shape, dtype, device_));
    ++overflow_allocs_;
    used_ += bytes;
    return overflow_.back().second;
  }
  Tensor t = Tensor::from_blob(static_cast<char*>(arena_.get()) + used_, std::move(shape), dtype, device_, arena_);
  used_ += bytes;
  return t;
}

}  // namespace ts
