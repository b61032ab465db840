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
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/linear_weight.h"

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

// Per-layer dequantization scales of an FP8 (e4m3) KV cache, vLLM's k_scale / v_scale from the
// checkpoint (1.0 where it has none): the cache stores e4m3(x / scale), attention reads
// stored x scale. Caches of the model's own dtype ignore them (as vLLM does for a bf16 cache).
struct KvScales {
  float k = 1.0f;
  float v = 1.0f;
};
// The FP8 cache ops' precondition on the scales (positive and finite): an error naming `op`.
inline void check_kv_scales(const KvScales& s, const char* op) {
  TS_CHECK(s.k > 0 && s.v > 0 && s.k < INFINITY && s.v < INFINITY, "{}: FP8 cache scales k {} v {} must be positive and finite",
           op, s.k, s.v);
}

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
  // The batch's leading sequences whose query length is at most kAttnDecodeMaxQLen (decodes and
  // speculative verify rows: the scheduler puts them before prefill chunks) and the longest of
  // their queries; set by the batch builder (set_decode_lead). CUDA runs a mixed batch as two
  // launches — these rows through the split-KV decode kernel, the rest through the prefill
  // kernel — instead of giving each decode row a 64-row prefill tile that walks its whole
  // context alone (H200, 8B shapes, 64 decodes @1k + a 512-token chunk: 5.3 ms of attention in
  // one launch, 3.4 ms in two; the 64 decodes alone take 2.6 ms). 0: no split.
  int lead_decode_seqs = 0;
  int lead_decode_max_q = 0;
  int lead_decode_rows = 0;  // their query rows: cu_q[lead_decode_seqs]
};

// Query lengths at or below this run the split-KV decode kernel on CUDA.
constexpr int kAttnDecodeMaxQLen = 8;

// Sets meta's lead_decode_* from the host copy of cu_q ([num_seqs + 1] row offsets).
inline void set_decode_lead(AttnMeta& meta, const int32_t* cu_q_host) {
  int n = 0, mq = 0;
  while (n < meta.num_seqs) {
    const int q = cu_q_host[n + 1] - cu_q_host[n];
    if (q < 1 || q > kAttnDecodeMaxQLen) break;
    mq = q > mq ? q : mq;
    ++n;
  }
  meta.lead_decode_seqs = n;
  meta.lead_decode_max_q = mq;
  meta.lead_decode_rows = cu_q_host[n] - cu_q_host[0];
}

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
// An f8_e4m3 cache stores e4m3(x / kvs) rounded to nearest (saturating at 448).
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
              const Tensor& slot_mapping, const KvScales& kvs = {});
// Decode fusion (#22): the rotary embedding (after the per-head RMSNorm of q and k when wq/wk
// are given: Qwen3) on q [T, nh, hd] and k [T, nkv, hd] in place, then k and v [T, nkv, hd_v]
// written into the paged caches at slot_mapping (slot < 0: not written) — exactly
// qk_norm_rope / rope followed by kv_write, one launch on CUDA. Any T (prefill and decode).
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& slot_mapping, const KvScales& kvs = {});
// Decode fusion (#22): out [T, I] = silu(x @ Wg^T) * (x @ Wu^T) for w [2I, K] (gate rows then up
// rows, as MlpWeights::gate_up) — linear then silu_mul, with the same bf16 roundings. On CUDA
// at small T one GEMV launch (each warp dots a gate row and its up row and writes the product:
// no [T, 2I] round trip, no silu_mul launch); otherwise the GEMM into gu_scratch [T, 2I] then
// silu_mul. With in_norm: x is first RMS-normalised (times *in_norm, eps) as rmsnorm does, in the
// GEMV's prologue where it fuses, else into x_scratch [T, K].
// w may be an FP8 / NVFP4 weight kept as stored on CUDA (ops/linear_weight.h; so may
// rmsnorm_linear's and linear_add's): fused through the tensor-core decode GEMV where it applies.
void linear_silu_mul(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& gu_scratch,
                     const Tensor* in_norm = nullptr, float eps = 0.0f, Tensor* x_scratch = nullptr);
// Decode fusion (#22): out = rmsnorm(x) * norm_w @ w^T (+ bias): the norm in the GEMV's prologue
// (each block normalises the few rows of x itself) where it fuses, else rmsnorm into x_scratch
// [T, K] then linear.
void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out,
                    const Tensor* bias, Tensor& x_scratch);
// Decode fusion (#22): residual += x @ w^T, rounded as linear then add (the GEMV's epilogue where
// it fuses, else linear into scratch [T, N] then add_inplace).
void linear_add(const Tensor& x, const LinearWeight& w, Tensor& residual, Tensor& scratch);
// True where rmsnorm_linear / linear_add / linear_silu_mul with in_norm each run as one GEMV for
// `rows` rows of activations on `device` (CUDA, 1 or 2 rows; any weight of the dense models).
// There the dense decoder keeps the residual stream out of separate add + norm launches.
bool fuses_norm_gemv(Device device, int64_t rows);
// Causal paged attention for a mixed batch (prefill chunks and decodes together).
// q [T, nh, hd]; caches as above (nkv heads, nh % nkv == 0, GQA); out [T, nh, hd_v].
// f8_e4m3 caches are read as stored x kvs (both caches of one dtype).
// window > 0: a sliding-window layer (Mistral, Qwen2 past max_window_layers): the query at
// position p attends to the keys at positions (p - window, p] only -- `window` keys, itself
// included, as transformers' sliding mask and FlashAttention's window (window - 1, 0). 0: all.
// With a window, no backend reads (even to mask) a key below p - window + 1 - kWindowReadSlack
// for a query at p (the CUDA kernels start at the 64-token tile holding a block's lowest key):
// the block table's entries wholly below that may be anything (KvCache's window release).
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out, const KvScales& kvs = {}, int window = 0);
inline constexpr int kWindowReadSlack = 128;

// dst = src row by row (either may be strided); same dtype and shape.
void copy_rows(const Tensor& src, Tensor& dst);
// dst = src converted (f32 <-> bf16), same shape.
void cast(const Tensor& src, Tensor& dst);

// Copies rows: out[i] = x[index[i]] (gathers the rows that need logits). index i32 [N].
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out);


// --- Mixture of experts, MLA, block-sparse attention ----------------------------------------

// Writes rows x [T, heads, dim] (rows may be strided) into cache [blocks, block_size, heads, dim]
// at slot_mapping (slot < 0: padding, skipped). For caches with a single tensor per token (the
// MLA latent, the MiniMax-M3 indexer keys).
// An f8_e4m3 cache (the MLA latent under --kv-cache-dtype fp8) stores e4m3(x / fp8_scale).
void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale = 1.0f);

// Gated activations over x [T, 2I] (gate then up) -> out [T, I].
//  silu:       silu(gate) * up
//  swiglu_oai: g = min(gate, limit), u = clamp(up, -limit, limit), g * sigmoid(alpha g) * (u + 1)
enum class GluKind : uint8_t { silu, swiglu_oai };
struct GluAct {
  GluKind kind = GluKind::silu;
  float alpha = 1.702f, limit = 7.0f;
};
void glu(const Tensor& x, Tensor& out, const GluAct& act);

// Router: logits [T, E] (f32) -> the top_k experts of every token.
//  softmax: p = softmax(logits); pick the top_k of p.
//  sigmoid: p = sigmoid(logits); pick by p + bias (e_score_correction_bias, selection only),
//           optionally grouped (DeepSeek-V3): the E experts form n_group groups, each ranked by
//           the sum of its two best biased scores; only the topk_group best groups compete
//           (the others' experts score 0, as transformers masks them).
// weights = p of the picked experts, / their sum (+ renorm_eps) when renormalize, * scale.
// ids i32 [T, top_k] come sorted by expert id (the order experts are summed in); ties pick the
// lower id. weights f32 [T, top_k] follow ids.
enum class MoeScoring : uint8_t { softmax, sigmoid };
struct MoeRouting {
  MoeScoring scoring = MoeScoring::softmax;
  int top_k = 1;
  int n_group = 1, topk_group = 1;
  bool renormalize = false;
  float renorm_eps = 0.0f;
  float scale = 1.0f;
};
void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights);

// Routed experts: out[t] = sum_j weights[t, j] * down[e] @ act(gate_up[e] @ x[t]), e = ids[t, j],
// summed in j order (each token independently, so results do not depend on the batch).
// x [T, H]; gate_up [E, 2I, H] (gate rows then up rows); down [E, H, I]; out [T, H].
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                 const Tensor& down, const GluAct& act, Tensor& out);

// Multi-head latent attention (DeepSeek-V2/V3) in the absorbed form over the paged latent cache
// [blocks, block_size, 1, kv_rank + rope_dim], each token holding its normed latent c and its
// roped k_pe. q [T, nh, kv_rank + rope_dim] is (q_nope absorbed through W_UK | roped q_pe).
// out [T, nh, kv_rank] = softmax(scale * q . [c | k_pe]) @ c, causal as paged_attention.
// An f8_e4m3 latent cache (--kv-cache-dtype fp8) is read as stored x fp8_scale.
void mla_attention(const Tensor& q, const Tensor& latent_cache, const AttnMeta& meta, float scale, int64_t kv_rank,
                   Tensor& out, float fp8_scale = 1.0f);

// MiniMax-M3 lightning indexer, one selection per index head h (transformers: per KV / GQA
// group). For query row r of sequence b at position p (see AttnMeta), key block n (tokens
// [n*bs, (n+1)*bs) of the sequence) scores the max over keys j <= p in the block of
// q[r, h] . k[j] (k_cache [blocks, block_size, 1, D]); the local_blocks blocks ending at p's block
// score +inf; the top_k best blocks are kept (blocks after p's never are; ties: lower block).
// out i32 [T, heads, top_k]: the kept block ids in ascending order, then -1.
struct BlockIndexer {
  int block_size = 0, top_k = 0, local_blocks = 0;
};
void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& meta, const BlockIndexer& p, Tensor& out);

// paged_attention restricted to the key blocks listed per query row and selection head in
// blocks i32 [T, S, n] (ascending, -1 padded; blocks of sel_block_size tokens; attention head h
// reads selection h / (nh / S)) and to keys at or before the query.
void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta,
                            float scale, const Tensor& blocks, int sel_block_size, Tensor& out);


// --- Gated DeltaNet (the linear-attention layers of Qwen3.5 / Qwen3-Next) -------------------
// Recurrent layers keep per-sequence state in rows of a state pool ("state slots"), not in
// paged blocks: sequence b of the batch reads and writes row state_slots[b] (i32 [S]). A
// sequence whose first query sits at position 0 (kv_len[b] == its q_len) starts from zero
// state whatever the row holds; slot < 0 (graph padding) starts from zero and saves nothing.
// Rows outside every sequence get zero output.

// Depthwise causal conv over time, then SiLU: out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c]),
// the K-1 inputs before a chunk coming from conv_state[slot] ([slots, K-1, C]: the sequence's
// last K-1 inputs, oldest first), which is updated to the last K-1 inputs after the chunk.
// x [T, C] (strided rows allowed), w [C, K], out [T, C].
void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots,
                   const AttnMeta& meta, Tensor& out);

// The delta rule's per-head gates: g = -exp(A_log) * softplus(a + dt_bias) (log decay, <= 0)
// and beta = sigmoid(b). a, b [T, nv] (strided rows allowed); A_log, dt_bias f32 [nv];
// g, beta f32 [T, nv].
void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g, Tensor& beta);

// Gated delta rule, token by token per sequence and value head h (key head h / (nv / nk)):
//   q, k l2-normalised (x / sqrt(|x|^2 + 1e-6)), q scaled by dk^-1/2;
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q
// with S [dk, dv] = state[slot, h] (f32 [slots, nv, dk, dv], updated in place).
// q, k [T, nk, dk], v [T, nv, dv] (strided rows allowed); g, beta f32 [T, nv]; out [T, nv, dv].
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& meta, Tensor& out);

// Gated RMSNorm per head: out = x / rms(x) * w * silu(z). x, out [T, nh, d] (out may alias x),
// z [T, nh, d] (strided rows allowed), w [d] (plain scale, not 1 + w).
void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);

// Attention output gate: x *= sigmoid(gate), elementwise. x, gate [T, N] (strided rows allowed).
void sigmoid_gate(Tensor& x, const Tensor& gate);

}  // namespace ts::ops

namespace ts::ops {

// --- Speculative decoding (EAGLE3 chain drafting, fixed-shape steps for CUDA graphs) --------

// out[r * out_stride] = argmax_v logits[r, v] (+ offsets[argmax] when offsets is given: the
// EAGLE3 d2t draft->target map), and out2[r] the same when out2 is given. logits f32 [R, V];
// offsets i32 [V]; out, out2 i32. Ties: lowest id.
void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride = 1, Tensor* out2 = nullptr);
// Greedy chain acceptance, n rows per request: verify_ids [B*n] are the verify inputs
// [last, d1..d_{n-1}], target_ids [B*n] the target's argmax per row. acc[i] = number of leading
// drafts equal to the target's choice (0..n-1). All i32.
void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc);
// Keeps each request's draft state after its accepted run: h_pool[slots[i]] = r[i*n + acc[i]]
// and next_out[i] = next_ids[i*n + acc[i]]. r [B*n, H], h_pool [S, H] (same dtype); others i32.
void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n,
                 Tensor& h_pool, Tensor& next_out);

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

// Structured outputs: logits [B, V] f32 (in place, any device); bitmask [B, ceil(V/32)] i32 on
// the same device, bit (id & 31) of word (id >> 5) set = allowed; a disallowed id becomes -inf.
// Rows without a grammar pass all-ones words. On CUDA it is one launch on the current stream
// with fixed shapes and no host sync (capturable in a decode graph with a persistent mask buffer).
void apply_token_bitmask(Tensor& logits, const Tensor& bitmask);

}  // namespace ts::ops
