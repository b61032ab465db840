// CPU reference backend: fp32, OpenMP across rows/heads. It is the oracle for the CUDA kernels,
// so it favours clarity and a fixed summation order (results do not depend on the batch size or
// the thread count — the batch-invariance tests rely on that).
#pragma once
#include "ops/ops.h"

namespace ts::ops::cpu {
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps);
void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps,
                  Tensor& out_a, Tensor& out_b);
void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps,
                  const Tensor& positions, const Rope& rope);
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& rope);
void silu_mul(const Tensor& x, Tensor& out);
void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias);
// Dynamic FP8 activation quantization per token and 128 channels (the W8A8 GEMM's input; the
// oracle of ops::cuda::quantize_act_fp8): x f32 [M, K], K % 128 == 0; q u8 [M, K] e4m3 codes and
// scale f32 [M, K/128] (row-major) with scale = amax / 448 of the group (1 where the group is all
// zero) and q = e4m3(x / scale) rounded to nearest, so q x scale reproduces x within e4m3 rounding.
void quantize_act_fp8(const Tensor& x, Tensor& q, Tensor& scale);
// out f32 [M, K] (contiguous) = the activations W8A8 multiplies: q x scale of quantize_act_fp8(x).
void fake_quantize_act_fp8(const Tensor& x, Tensor& out);
void add_inplace(Tensor& y, const Tensor& x);
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping,
              const KvScales& kvs = {});
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& slot_mapping, const KvScales& kvs = {});
void linear_silu_mul(const Tensor& x, const Tensor& w, Tensor& out, Tensor& gu_scratch, const Tensor* in_norm, float eps,
                     Tensor* x_scratch);
void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w, Tensor& out, const Tensor* bias,
                    Tensor& x_scratch);
void linear_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttnMeta& meta, float scale, Tensor& out, const KvScales& kvs = {}, int window = 0);
void copy_rows(const Tensor& src, Tensor& dst);
void cast(const Tensor& src, Tensor& dst);
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out);
void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride, Tensor* out2);
void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc);
void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n, Tensor& h_pool,
                 Tensor& next_out);
void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale = 1.0f);
void glu(const Tensor& x, Tensor& out, const GluAct& act);
void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                 const Tensor& down, const GluAct& act, Tensor& out);
void mla_attention(const Tensor& q, const Tensor& latent_cache, const AttnMeta& meta, float scale, int64_t kv_rank,
                   Tensor& out, float fp8_scale = 1.0f);
void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& meta, const BlockIndexer& p, Tensor& out);
void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta,
                            float scale, const Tensor& blocks, int sel_block_size, Tensor& out);
void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots,
                   const AttnMeta& meta, Tensor& out);
void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g, Tensor& beta);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& meta, Tensor& out);
void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);
void sigmoid_gate(Tensor& x, const Tensor& gate);
void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out);
void apply_token_bitmask(Tensor& logits, const Tensor& bitmask);

// The exact distribution sample() draws from for one row (dense; filtered tokens are 0).
void sampling_probs(const float* logits, int64_t vocab, const SamplingRow& p, std::vector<float>& out);

// Dot product with the fixed lane order every CPU GEMM/GEMV path uses (8 fp32 lanes over k,
// then a fixed horizontal sum, then the k % 8 tail).
float dot(const float* a, const float* b, int64_t k);
}  // namespace ts::ops::cpu
