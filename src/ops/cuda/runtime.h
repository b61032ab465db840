// Host-side CUDA runtime helpers shared by the backend: allocation, copies, streams, errors.
// Included from .cpp files that are compiled without nvcc, so no CUDA headers here.
#pragma once
#include <cstddef>
#include <memory>

namespace ts::cuda {
int device_count();                                  // 0 when no driver/GPU
std::shared_ptr<void> alloc(size_t bytes);           // cudaMalloc, freed on last reference
void memset(void* p, int value, size_t bytes);
void copy(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes);
void synchronize();
size_t free_memory();                                // bytes free on the current device
size_t total_memory();                               // bytes on the current device
}  // namespace ts::cuda
