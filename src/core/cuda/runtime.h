// Host-side CUDA runtime helpers shared by the backend: allocation, copies, streams, errors.
// Included from .cpp files that are compiled without nvcc, so no CUDA headers here
// (kernels get the typed stream from ops/cuda/common.cuh).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/caching_allocator.h"

namespace ts::cuda {
int device_count();                                  // 0 when no driver/GPU
// The GPU the calling thread drives (thread-local; a thread that never called set_device
// drives device 0, so single-GPU code is unchanged). set_device also makes it the CUDA
// runtime's current device for this thread and resets this thread's stream to that GPU's.
int current_device();
void set_device(int dev);
// Device memory from the current device's caching allocator (core/caching_allocator.h): the
// block goes back to that device's cache on the last reference (whatever thread drops it) and
// is reused by a later alloc, so the steady state makes no cudaMalloc/cudaFree calls. Reuse is
// safe because every op of a device runs on its one compute stream (stream() below; the
// synchronous copies' legacy default stream waits for it): the next user of a block is queued
// after the kernels that still read it. Memory used on another stream (copy_stream_create) must
// stay referenced until that stream's work is known done. While stream() is being captured into
// a CUDA graph, blocks bypass the cache (cudaMalloc, and cudaFree when dropped), so memory a graph
// may keep is never handed to anyone else. Out of memory: the cache is emptied and the
// allocation retried once, then an error naming the sizes.
std::shared_ptr<void> alloc(size_t bytes);
// Pinned host memory (portable: pinned for every GPU of the process, so TP ranks' copy streams
// run at full rate from it), freed on last reference.
std::shared_ptr<void> alloc_host(size_t bytes);
// Every device's cached blocks back to the driver (before free memory is measured, e.g. to size
// the KV pool). Returns the bytes freed.
size_t empty_cache();
// The caching allocators' counters, summed over devices (plus the pinned host allocations).
DeviceMemoryStats memory_stats();
void memset(void* p, int value, size_t bytes);
void copy(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes);
void synchronize();
size_t free_memory();                                // bytes free on the current device
size_t total_memory();                               // bytes on the current device
std::string device_description();                    // e.g. "NVIDIA H200, 132 SMs, 139.8 GiB"
void copy_async(void* dst, const void* src, size_t bytes);  // device to device, on stream()
void copy_h2d_async(void* dst, const void* pinned_src, size_t bytes);  // on stream()
void* event_create();                                // a cudaEvent_t (timing disabled)
void event_record(void* ev);                         // on stream()
void event_synchronize(void* ev);
void event_destroy(void* ev);
// Bulk copies beside compute (the host KV tier): a non-blocking stream on the current device,
// cudaMemcpyDefault copies on it (pinned host memory makes them asynchronous), and the event
// plumbing that orders it against stream() (nullptr as `stream`: this thread's stream()).
void* copy_stream_create();
void stream_destroy(void* s);
void copy_async_on(void* dst, const void* src, size_t bytes, void* stream);
void event_record_on(void* ev, void* stream);
void stream_wait_event(void* stream, void* ev);
// Copy completion without a host wait: a timing event (event_create_timed) recorded on a copy
// stream; event_query is true once the GPU has passed it (also for an event of another GPU:
// the engine thread polls every TP rank's copy events). elapsed_ms: both events reached.
void* event_create_timed();
bool event_query(void* ev);
float event_elapsed_ms(void* start, void* end);
void stream_synchronize_on(void* stream);

// Median milliseconds per call of fn() (work enqueued on stream()), each call timed with CUDA
// events after `warmup` untimed calls. For benchmarks and kernel labs.
double time_ms(const std::function<void()>& fn, int iters, int warmup = 2);

// The stream every op launches on: per device, a blocking stream created on first use (so the
// synchronous cudaMemcpy/cudaMemset above, which use the legacy default stream, stay ordered
// with the kernels); the calling thread's device picks it. set_stream(s) switches this thread
// to the caller's cudaStream_t (nullptr: back to the device's stream).
void* stream_handle();
void set_stream(void* cuda_stream);
void stream_synchronize();                           // waits for the current stream only

// Timestamps on stream(): record(i) enqueues marker i; once the work is done, elapsed_ms(a, b)
// is the device time between markers a and b. Per-phase timing without host syncs.
class StreamMarks {
 public:
  explicit StreamMarks(int n);
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;
  void record(int i);
  void synchronize(int i) const;  // waits until marker i has been reached
  float elapsed_ms(int a, int b) const;  // both markers reached (else an error)

 private:
  void* ev_[8] = {};
  int n_ = 0;
};

// Launch settings of the thread that drives a GPU, owned by its caller like the stream (no
// process-wide switch: two engines, or a test and an engine, on their own threads cannot steer
// each other). The engine installs its options on every thread it launches from (constructor,
// engine, device and TP worker threads: each copies its creator's config when it starts).
// pdl: programmatic dependent launch for the latency-bound kernels that opt in (on by default,
// `--disable-pdl` turns it off); read at launch time, so it also applies to graph capture.
// batch_invariant: `--enable-deterministic-inference` (#22). The ops whose kernel choice or
// reduction order depends on the batch (GEMV vs GEMM by row count, cuBLASLt algorithms per M,
// fused norm/LM-head GEMVs, split-KV attention cut by the grid, the decode/prefill attention
// split of a mixed batch, stored-weight decode kernels) take one fixed path instead, so every
// output row is computed the same way whatever else is in the batch, however the prompt was
// chunked and whatever the graph bucket (linear.cu, fused.cu, quant_linear.cu, moe.cu, attention.cu).
// gemm_autotune (`--gemm-autotune`, off by default): a new bf16 cuBLASLt shape of at most 256
// rows times the heuristic's first 8 algorithms and keeps the fastest (linear.cu); off, the
// heuristic's first pick.
struct LaunchConfig {
  bool pdl = true;
  bool batch_invariant = false;
  bool gemm_autotune = false;
};
LaunchConfig launch_config();
void set_launch_config(const LaunchConfig& c);
// Installs c on this thread for the scope, restoring the previous config after.
class ScopedLaunchConfig {
 public:
  explicit ScopedLaunchConfig(const LaunchConfig& c) : prev_(launch_config()) { set_launch_config(c); }
  ~ScopedLaunchConfig() { set_launch_config(prev_); }
  ScopedLaunchConfig(const ScopedLaunchConfig&) = delete;
  ScopedLaunchConfig& operator=(const ScopedLaunchConfig&) = delete;

 private:
  LaunchConfig prev_;
};
}  // namespace ts::cuda
