// Host-side CUDA runtime helpers shared by the backend: allocation, copies, streams, errors.
// Included from .cpp files that are compiled without nvcc, so no CUDA headers here
// (kernels get the typed stream from ops/cuda/common.cuh).
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

// The stream every op launches on. Default: a blocking stream created on first use (so the
// synchronous cudaMemcpy/cudaMemset above, which use the legacy default stream, stay ordered
// with the kernels). set_stream(s) switches to the caller's cudaStream_t (nullptr: default).
void* stream_handle();
void set_stream(void* cuda_stream);
void stream_synchronize();                           // waits for the current stream only

// Programmatic dependent launch (PDL) for latency-bound kernels; on by default,
// `--disable-pdl` turns it off. Read at launch time (so it also applies to graph capture).
void set_pdl_enabled(bool on);
bool pdl_enabled();
}  // namespace ts::cuda
