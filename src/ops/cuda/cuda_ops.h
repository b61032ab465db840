// The CUDA backend of the op interface (ops/ops.h): same signatures, bf16 activations and
// weights, f32 Rope tables, i32 indices, fp32 accumulation. Plain C++ (no CUDA headers).
// Kernels run on ts::cuda::stream() (ops/cuda/runtime.h); nothing here synchronises the host
// except `sample` (it returns host ids).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_policy.h"
#include "ops/linear_weight.h"
#include "ops/ops.h"

namespace ts::ops::cuda {

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start = 0);

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps);
void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps,
                  Tensor& out_a, Tensor& out_b);
void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps,
                  const Tensor& positions, const Rope& rope);
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& rope);

void silu_mul(const Tensor& x, Tensor& out);
// policy: kernel choice (ops/kernel_policy.h); {} picks per shape.
void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias = nullptr,
            const KernelPolicy& policy = {});
void add_inplace(Tensor& y, const Tensor& x);
// Kernel lab only (bench --gemm-lab): the bf16 cuBLASLt GEMM of linear() with the index-th
// algorithm cuBLASLt's heuristic proposes for query_m rows (the shape otherwise x's), run at x's
// rows; no cache. False where the heuristic has fewer algorithms or that one refuses the shape.
bool linear_lab_algo(const Tensor& x, const Tensor& w, Tensor& out, int64_t query_m, int index);
// The bf16 cuBLASLt algorithm cache of this device, counted since the process started: shapes
// whose algorithm was chosen by timing the heuristic's candidates (LaunchConfig::gemm_autotune),
// shapes that took its first pick, and candidates timed. Tests and logs.
struct GemmAlgoStats {
  int64_t tuned_shapes = 0, heuristic_shapes = 0, candidates_timed = 0;
};
GemmAlgoStats gemm_algo_stats();

// W8A8 FP8 GEMM through cuBLASLt's Hopper block scaling (CUDA >= 12.9): out bf16 [M, N] (row
// stride ldc) = sum_k e4m3(xq[m, k]) x_scale(m, k/128) e4m3(wq[n, k]) w_scale(n/128, k/128)
// (+ bias bf16 [N]), fp32 accumulation. xq [M, K] contiguous e4m3 (K % 128 == 0), wq [N, K] e4m3
// with row stride ldw. The scale tensors' element orders (Fp8ScaleOrder; bench/kernels/
// fp8_gemm_lab.cu checks each against the CPU): x_scale [kb * ld + m] (token-major, ld = M or
// M rounded up to 4) or [m * K/128 + kb]; w_scale [nb * K/128 + kb] (the checkpoint's grid, as
// stored) or [kb * ceil(N/128) + nb]. Returns false (nothing launched) where cuBLASLt has no
// algorithm for the shape: the caller falls back.
struct Fp8ScaleOrder {
  bool act_k_major = false;
  bool act_ld_pad4 = false;
  bool weight_n_major = false;
};
bool fp8_block_matmul(int64_t M, int64_t N, int64_t K, const void* xq, const float* x_scale, const void* wq,
                      int64_t ldw, const float* w_scale, const void* bias, void* out, int64_t ldc,
                      const Fp8ScaleOrder& order);

// Caches bf16 or f8_e4m3 (e4m3(x / kvs), round to nearest, saturating: ops/cpu/attention.cpp).
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
              const Tensor& slot_mapping, const KvScales& kvs = {});
// Decode fusions (ops/cuda/fused.cu; ops.h describes them).
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& slot_mapping, const KvScales& kvs = {});
// w bf16, or FP8 / NVFP4 kept as stored (ops/linear_weight.h): those fuse through the
// tensor-core decode GEMV (quant_linear.h: quant_decode_gemv) where it applies, else run unfused.
void linear_silu_mul(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& gu_scratch,
                     const Tensor* in_norm = nullptr, float eps = 0.0f, Tensor* x_scratch = nullptr,
                     const KernelPolicy& policy = {});
void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out,
                    const Tensor* bias, Tensor& x_scratch, const KernelPolicy& policy = {});
void linear_add(const Tensor& x, const LinearWeight& w, Tensor& residual, Tensor& scratch,
                const KernelPolicy& policy = {});
bool fuses_norm_gemv(int64_t rows);
// Caches bf16, or both f8_e4m3 (read as stored x kvs; the v2 kernels turn each staged tile into
// bf16 in shared memory, attention_v2.cuh).
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out, const KernelPolicy& policy = {});
// window: ops::paged_attention's sliding window (0: full causal).
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out, const KvScales& kvs, int window = 0, const KernelPolicy& policy = {});

void copy_rows(const Tensor& src, Tensor& dst);  // any dtype, strided rows
void cast(const Tensor& src, Tensor& dst);       // f32 <-> bf16 (same dtype: copy_rows)
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out);
void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride, Tensor* out2);
void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc);
void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n, Tensor& h_pool,
                 Tensor& next_out);

void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out);
void apply_token_bitmask(Tensor& logits, const Tensor& bitmask);

// Mixture of experts, MLA, block-sparse attention (ops/cuda/moe.cu, latent_attention.cu,
// block_sparse.cu). moe_route takes the correction bias as f32 or bf16; moe_experts uses
// workspace(2) (grow-only: run the largest token count eagerly before graph capture).
void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale = 1.0f);
void glu(const Tensor& x, Tensor& out, const GluAct& act);
void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                 const Tensor& down, const GluAct& act, Tensor& out, const KernelPolicy& policy = {});
void mla_attention(const Tensor& q, const Tensor& latent_cache, const AttnMeta& meta, float scale,
                   int64_t kv_rank, Tensor& out, float fp8_scale = 1.0f);
void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& meta, const BlockIndexer& p,
                   Tensor& out);
void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                            const AttnMeta& meta, float scale, const Tensor& blocks, int sel_block_size,
                            Tensor& out);
void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots,
                   const AttnMeta& meta, Tensor& out);
void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
               Tensor& beta);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& meta, Tensor& out);
void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);
void sigmoid_gate(Tensor& x, const Tensor& gate);

// ---- CUDA-only extras ------------------------------------------------------------------------
// Dtype casts between (possibly strided-row) tensors of the same shape.
void cast_bf16_to_f32(const Tensor& x, Tensor& out);
void cast_f32_to_bf16(const Tensor& x, Tensor& out);

// Per-row sampling parameters as device arrays (each [B]): temperature f32, top_k i32,
// top_p f32, min_p f32, seed i64 (bits of the u64), counter i64 (bits of the u64).
struct DeviceSamplingParams {
  Tensor temperature, top_k, top_p, min_p, seed, counter;
};
// Graph-safe sampling: reads parameters from device memory and writes i32 ids [B] on the device.
// No host synchronisation; scratch comes from a workspace that grows only outside capture, so
// call it once eagerly with the largest B*V before capturing.
void sample_device(const Tensor& logits, const DeviceSamplingParams& params, Tensor& out_ids);

}  // namespace ts::ops::cuda
