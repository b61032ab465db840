// Logits processing on the device from per-slot token counts (ops/cuda/logits_proc.h).
//  - logits_process: grid (ceil(V/kChunk), B), 256 threads; a block owns kChunk contiguous ids
//    of one row: first the elementwise penalties (counts and prompt bits read once per id), then,
//    after a barrier, the slot's logit_bias entries and min_tokens stop ids that fall in its
//    range (so each id sees the CPU's order: penalties, bias, ban). Rows without a slot exit at
//    once, so a batch mixing processed and plain rows pays only for the processed ones.
//  - logits_count: one thread per row, counts[slot, id] += 1 after sampling (inside the graph).
//  - logits_seed: clears one slot, then scatters a request's prompt (bits) and output (counts).
// Arithmetic uses the _rn intrinsics: no FMA contraction, so results equal the CPU sampler's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/logits_proc.h"

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {
constexpr int kThreads = 256;
constexpr int64_t kChunk = 4096;  // ids per block: 16 per thread

__global__ void __launch_bounds__(kThreads)
process_kernel(float* logits, int64_t ld, int64_t V, int64_t W, const LogitsProcRow* rows, const int32_t* counts,
               const uint32_t* prompt, const int32_t* info) {
  const int64_t b = blockIdx.y;
  const LogitsProcRow r = rows[b];
  if (r.slot < 0) return;
  const int64_t v0 = int64_t(blockIdx.x) * kChunk, v1 = v0 + kChunk < V ? v0 + kChunk : V;
  float* l = logits + b * ld;
  const int32_t* cnt = counts + int64_t(r.slot) * V;
  const uint32_t* pb = prompt + int64_t(r.slot) * W;
  const bool rep = r.repetition != 1.0f, pf = r.presence != 0.0f || r.frequency != 0.0f;
  if (rep || pf) {
    for (int64_t v = v0 + threadIdx.x; v < v1; v += kThreads) {
      const int32_t c = cnt[v];
      const bool seen = c > 0 || ((pb[v >> 5] >> (v & 31)) & 1u);
      if (!seen) continue;
      float x = l[v];
      if (rep) x = x > 0.0f ? __fdiv_rn(x, r.repetition) : __fmul_rn(x, r.repetition);
      if (pf && c > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn(r.frequency, float(c)), r.presence));
      l[v] = x;
    }
  }
  const int32_t* in = info + int64_t(r.slot) * kLogitsSlotInfo;
  const int nb = in[0], ns = in[1];  // uniform over the block: the barriers below are safe
  if (nb > 0) {
    __syncthreads();
    // Bias ids are distinct (runtime/device_logits.cpp rejects duplicates): one writer per id.
    for (int j = threadIdx.x; j < nb; j += kThreads) {
      const int64_t id = in[2 + j];
      if (id >= v0 && id < v1) l[id] = __fadd_rn(l[id], __int_as_float(in[2 + kLogitsMaxBias + j]));
    }
  }
  if (r.ban_stop && ns > 0) {
    __syncthreads();
    for (int j = threadIdx.x; j < ns; j += kThreads) {
      const int64_t id = in[2 + 2 * kLogitsMaxBias + j];
      if (id >= v0 && id < v1) l[id] = -INFINITY;
    }
  }
}

__global__ void count_kernel(const int32_t* ids, int64_t B, int64_t V, const LogitsProcRow* rows, int32_t* counts) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int32_t slot = rows[b].slot, id = ids[b];
  if (slot >= 0 && id >= 0 && id < V) atomicAdd(counts + int64_t(slot) * V + id, 1);
}

__global__ void clear_kernel(int32_t* counts, uint32_t* prompt, int64_t V, int64_t W) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < V; i += int64_t(gridDim.x) * blockDim.x) {
    counts[i] = 0;
    if (i < W) prompt[i] = 0u;
  }
}

__global__ void seed_kernel(const int32_t* tokens, int64_t n, int64_t prompt_len, int64_t V, int32_t* counts,
                            uint32_t* prompt) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t t = tokens[i];
  if (t < 0 || t >= V) return;
  if (i < prompt_len) atomicOr(prompt + (t >> 5), 1u << (t & 31));
  else atomicAdd(counts + t, 1);
}
}  // namespace

LogitsProcState LogitsProcState::create(int64_t slots, int64_t vocab, int64_t rows_cap) {
  TS_CHECK(slots > 0 && vocab > 0 && rows_cap > 0, "LogitsProcState: slots {} vocab {} rows {}", slots, vocab, rows_cap);
  LogitsProcState s;
  s.slots = slots;
  s.vocab = vocab;
  s.rows_cap = rows_cap;
  s.counts = Tensor::zeros({slots, vocab}, DType::i32, Device::cuda);
  s.prompt = Tensor::zeros({slots, (vocab + 31) / 32}, DType::i32, Device::cuda);
  s.info = Tensor::zeros({slots, kLogitsSlotInfo}, DType::i32, Device::cuda);
  s.rows = Tensor::zeros({rows_cap, 8}, DType::i32, Device::cuda);
  s.ids = Tensor::zeros({rows_cap}, DType::i32, Device::cuda);
  std::vector<LogitsProcRow> none(static_cast<size_t>(rows_cap));
  TS_CUDA_CHECK(cudaMemcpy(s.rows.data, none.data(), none.size() * sizeof(LogitsProcRow), cudaMemcpyHostToDevice));
  return s;
}

void logits_process(Tensor& logits, const LogitsProcState& s) {
  check_dev(logits, DType::f32, "logits_process logits");
  TS_CHECK(logits.ndim == 2 && logits.stride[1] == 1, "logits_process: logits [B, V] with unit column stride, got {}",
           logits.shape_str());
  const int64_t B = logits.size(0), V = logits.size(1);
  TS_CHECK(V == s.vocab, "logits_process: logits have {} columns, the count state {}", V, s.vocab);
  TS_CHECK(B <= s.rows_cap, "logits_process: {} rows, capacity {}", B, s.rows_cap);
  if (B == 0) return;
  const dim3 grid(unsigned(ceil_div(V, kChunk)), unsigned(B));
  launch(process_kernel, grid, dim3(kThreads), 0, false, logits.ptr<float>(), logits.row_stride(), V, (V + 31) / 32,
         reinterpret_cast<const LogitsProcRow*>(s.rows.data), s.counts.ptr<int32_t>(),
         reinterpret_cast<const uint32_t*>(s.prompt.data), s.info.ptr<int32_t>());
}

void logits_count(const Tensor& ids, const LogitsProcState& s) {
  check_dev(ids, DType::i32, "logits_count ids");
  const int64_t B = ids.numel();
  TS_CHECK(B <= s.rows_cap, "logits_count: {} rows, capacity {}", B, s.rows_cap);
  if (B == 0) return;
  launch(count_kernel, dim3(unsigned(ceil_div(B, 128))), dim3(128), 0, false, ids.ptr<int32_t>(), B, s.vocab,
         reinterpret_cast<const LogitsProcRow*>(s.rows.data), s.counts.ptr<int32_t>());
}

void logits_seed(const LogitsProcState& s, int slot, const Tensor& tokens, int64_t n, int64_t prompt_len) {
  TS_CHECK(slot >= 0 && slot < s.slots, "logits_seed: slot {} of {}", slot, s.slots);
  const int64_t V = s.vocab, W = (V + 31) / 32;
  int32_t* counts = s.counts.ptr<int32_t>() + int64_t(slot) * V;
  uint32_t* prompt = reinterpret_cast<uint32_t*>(s.prompt.data) + int64_t(slot) * W;
  launch(clear_kernel, dim3(unsigned(std::min<int64_t>(ceil_div(V, 256), 1024))), dim3(256), 0, false, counts, prompt,
         V, W);
  if (n <= 0) return;
  check_dev(tokens, DType::i32, "logits_seed tokens");
  TS_CHECK(tokens.numel() >= n, "logits_seed: {} tokens in a buffer of {}", n, tokens.numel());
  launch(seed_kernel, dim3(unsigned(ceil_div(n, 256))), dim3(256), 0, false, tokens.ptr<int32_t>(), n, prompt_len, V,
         counts, prompt);
}

}  // namespace ts::ops::cuda
