// Device memory entry points used by Tensor. Without the CUDA backend they fail loudly.
#pragma once
#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace ts {
std::shared_ptr<void> device_alloc(size_t bytes);
void device_memset(void* p, int value, size_t bytes);
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
bool cuda_available();  // a CUDA device is present and usable
// Host memory that device copies reach by DMA (pinned on CUDA builds with a GPU, else plain
// aligned memory), for buffers copied every step: a fresh pageable buffer costs its page
// faults plus a staged copy each time.
std::shared_ptr<void> host_pinned_alloc(size_t bytes);
}  // namespace ts
