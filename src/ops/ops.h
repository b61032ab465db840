// The op interface. Model code calls these; each dispatches on the device of its first tensor
// argument to ops/cpu (fp32 reference, the oracle) or ops/cuda (bf16 storage, fp32 accumulation).
//
// Conventions for every op:
//  - Activations and weights share a dtype per device: f32 on the CPU, bf16 on CUDA.
//  - "Rows" are all dims but the last; the last dim is contiguous; the row stride may be larger
//    than the row (a slice of a wider buffer), so outputs can be written into column slices.
//  - Every op accepts zero rows and then does nothing (no kernel launch).
//  - Index tensors (ids, positions, slot mappings, block tables, seq lens) are i32.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ts::ops {

// Precomputed rotary table: cos_sin [max_pos, rot_dim] holds cos in [:, :rot_dim/2] and sin in
// [:, rot_dim/2:], f32 on the op's device, scaling (llama3/linear/yarn incl. its attention
// factor) already folded in. The first rot_dim features of each head rotate; the rest pass.
// interleaved=false: HF "rotate_half" pairs (i, i + rot_dim/2); true: pairs (2i, 2i+1).
struct Rope {
  Tensor cos_sin;
  int rot_dim = 0;
  bool interleaved = false;
};

// Step metadata read by paged attention (one struct, as in nano-vllm's context).
// Sequence b owns query rows [cu_q[b], cu_q[b+1]) and, after this step's KV write, kv_len[b]
// cached tokens; its query i sits at position kv_len[b] - q_len_b + i and attends causally
// to cached tokens [0, that position]. Tokens live in blocks: token t of seq b is slot
// block_tables[b][t / block_size] * block_size + t % block_size.
struct AttnMeta {
  Tensor cu_q;          // i32 [B+1]
  Tensor kv_len;        // i32 [B]
  Tensor block_tables;  // i32 [B, max_blocks_per_seq]
  int block_size = 0;
  int num_seqs = 0;
  int max_q_len = 0;    // host-side maxima, so kernels can size grids without a sync
  int max_kv_len = 0;
};

// out[t] = table[ids[t] - vocab_start] for ids inside [vocab_start, vocab_start + rows(table)),
// zero otherwise (the vocab-parallel mask; replicated tables use vocab_start 0).
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start = 0);

// out = x / rms(x) * w. out may be a strided slice or alias x (in place). x, out: [T, H].
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
// residual += x; x = rmsnorm(residual) * w — both in place. [T, H].
void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps);
// Two independent norms in one launch, each writing into its own (possibly strided) slice.
void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps,
                  Tensor& out_a, Tensor& out_b);
// Per-head RMSNorm of q [T, nh, hd] and k [T, nkv, hd] (weights [hd]) then RoPE, in place.
void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps,
                  const Tensor& positions, const Rope& rope);
// RoPE in place on q [T, nh, hd] and k [T, nkv, hd] (either may be undefined to skip it).
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& rope);

// out[t] = silu(x[t, :I]) * x[t, I:]; x [T, 2I] (gate then up), out [T, I].
void silu_mul(const Tensor& x, Tensor& out);
// out = x @ w^T (+ bias): x [T, K], w [N, K] (HF Linear layout), out [T, N] (may be strided).
void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias = nullptr);
// y += x, elementwise, same shapes.
void add_inplace(Tensor& y, const Tensor& x);

// Writes k, v [T, nkv, hd] into the paged caches [num_blocks, block_size, nkv, hd] at slots.
// A slot < 0 means "padding row, do not write".
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
              const Tensor& slot_mapping);
// Causal paged attention for a mixed batch (prefill chunks and decodes together).
// q [T, nh, hd]; caches as above (nkv heads, nh % nkv == 0, GQA); out [T, nh, hd_v].
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out);

// dst = src row by row (either may be strided); same dtype and shape.
void copy_rows(const Tensor& src, Tensor& dst);
// dst = src converted (f32 <-> bf16), same shape.
void cast(const Tensor& src, Tensor& dst);

// Copies rows: out[i] = x[index[i]] (gathers the rows that need logits). index i32 [N].
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out);

}  // namespace ts::ops

namespace ts::ops {

// One row's sampling parameters. temperature == 0 means greedy (ties go to the lowest id).
// Randomness is counter-based — uniform(seed, counter) — so a seeded request draws the same
// numbers on any backend and batch position: counter is the request's output index.
struct SamplingRow {
  float temperature = 0.0f;
  int top_k = 0;        // 0 or >= V: off
  float top_p = 1.0f;   // 1: off
  float min_p = 0.0f;   // 0: off
  uint64_t seed = 0;
  uint64_t counter = 0;
};

// The one uniform draw in [0, 1) used by all samplers (host and device share this function).
inline float sampling_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);  // 24 random bits
}

// Samples one id per row of logits [B, V] (f32, any device). Filtering order as in vLLM/SGLang:
// temperature, then top-k, top-p, min-p on the softmax; then inverse-CDF with the uniform draw.
void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out);

}  // namespace ts::ops
