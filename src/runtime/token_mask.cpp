#include "runtime/token_mask.h"

#include <algorithm>
#include <cstring>

#include "core/device_memory.h"
#include "runtime/structured.h"

#ifdef TS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ts {

TokenMaskBuffer::TokenMaskBuffer(int64_t rows_cap, int64_t vocab, Device device)
    : rows_cap_(std::max<int64_t>(rows_cap, 1)), words_((std::max<int64_t>(vocab, 1) + 31) / 32), device_(device) {
  const size_t bytes = size_t(rows_cap_ * words_) * sizeof(uint32_t);
  if (device_ == Device::cpu) {
    dev_ = Tensor::empty({rows_cap_, words_}, DType::i32, Device::cpu);
    std::memset(dev_.data, 0xff, bytes);
    return;
  }
#ifdef TS_WITH_CUDA
  staging_ = cuda::alloc_host(bytes);
  std::memset(staging_.get(), 0xff, bytes);
  dev_ = Tensor::empty({rows_cap_, words_}, DType::i32, device_);
  cuda::copy(dev_.data, true, staging_.get(), false, bytes);  // all-ones before any graph reads it
  event_ = cuda::event_create();
#else
  TS_CHECK(false, "TokenMaskBuffer: this build has no CUDA backend");
#endif
}

TokenMaskBuffer::~TokenMaskBuffer() {
#ifdef TS_WITH_CUDA
  if (event_) cuda::event_destroy(event_);
#endif
}

Tensor TokenMaskBuffer::rows(int64_t n) const {
  TS_CHECK(n >= 0 && n <= rows_cap_, "token masks: {} rows, the buffer holds {}", n, rows_cap_);
  return dev_.slice_rows(0, n);
}

void TokenMaskBuffer::upload(const StepMasks& m) {
  const int64_t n = int64_t(m.cons.size());
  TS_CHECK(n <= rows_cap_, "token masks: a step of {} sampled rows, the buffer holds {}", n, rows_cap_);
  TS_CHECK(m.after.size() == m.cons.size(), "token masks: {} rows but {} counts", n, m.after.size());
#ifdef TS_WITH_CUDA
  if (event_) cuda::event_synchronize(event_);  // the previous copy has read the staging rows
#endif
  uint32_t* base = device_ == Device::cpu ? dev_.ptr<uint32_t>() : static_cast<uint32_t*>(staging_.get());
  int64_t hi = 0;  // rows [0, hi) hold a mask after this upload
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* row = base + i * words_;
    const LogitsConstraints* c = m.cons[size_t(i)].get();
    if (c && m.cons[size_t(i)]->mask_after(m.after[size_t(i)], row, words_)) {
      hi = i + 1;
      continue;
    }
    if (i < dirty_ || device_ == Device::cpu) std::fill(row, row + words_, 0xffffffffu);
  }
  const int64_t span = std::max(hi, std::min(dirty_, rows_cap_));
  for (int64_t i = n; i < span; ++i) std::fill(base + i * words_, base + (i + 1) * words_, 0xffffffffu);
  copy(span);
  dirty_ = hi;
}

void TokenMaskBuffer::clear() {
  if (dirty_ == 0) return;
#ifdef TS_WITH_CUDA
  if (event_) cuda::event_synchronize(event_);
#endif
  uint32_t* base = device_ == Device::cpu ? dev_.ptr<uint32_t>() : static_cast<uint32_t*>(staging_.get());
  std::fill(base, base + dirty_ * words_, 0xffffffffu);
  copy(dirty_);
  dirty_ = 0;
}

void TokenMaskBuffer::copy(int64_t n) {
  if (device_ == Device::cpu || n == 0) return;
#ifdef TS_WITH_CUDA
  cuda::copy_h2d_async(dev_.data, staging_.get(), size_t(n * words_) * sizeof(uint32_t));
  cuda::event_record(event_);
#endif
}

}  // namespace ts
