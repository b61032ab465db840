// Device dispatch: the first tensor argument's device picks the backend.
#include "ops/ops.h"

#include <fmt/format.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/graph_hooks.h"
#include "ops/linear_weight.h"
#include "ops/moe_experts.h"
#include "ops/op_profile.h"

#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/quant_linear.h"
// Ordinary ops: skipped while a breakable graph replays (their work is in a segment graph).
// label: a callable giving the op's name for the op profiler, called only while profiling.
#define TS_DISPATCH_L(dev, label, fn, ...)                                 \
  do {                                                                     \
    if ((dev) == Device::cuda) {                                           \
      if (GraphHooks* h_ = graph_hooks(); h_ && h_->skip_ops()) return;    \
      OpProfileScope prof_(label);                                         \
      ::ts::ops::cuda::fn(__VA_ARGS__);                                    \
      return;                                                              \
    }                                                                      \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                \
  } while (0)
#define TS_DISPATCH(dev, fn, ...) TS_DISPATCH_L(dev, [] { return std::string(#fn); }, fn, __VA_ARGS__)
// Break ops read per-batch attention metadata: always eager, between segment graphs.
#define TS_DISPATCH_BREAK(dev, fn, ...)                                    \
  do {                                                                     \
    if ((dev) == Device::cuda) {                                           \
      GraphHooks* h_ = graph_hooks();                                      \
      if (h_ && h_->in_segment()) {                                        \
        h_->before_break();                                                \
        ::ts::ops::cuda::fn(__VA_ARGS__);                                  \
        h_->after_break();                                                 \
        return;                                                            \
      }                                                                    \
      OpProfileScope prof_([] { return std::string(#fn); });               \
      ::ts::ops::cuda::fn(__VA_ARGS__);                                    \
      return;                                                              \
    }                                                                      \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                \
  } while (0)
#else
#define TS_DISPATCH(dev, fn, ...)                                          \
  do {                                                                     \
    TS_CHECK((dev) == Device::cpu, "op " #fn ": no CUDA backend in this build"); \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                \
  } while (0)
#define TS_DISPATCH_L(dev, label, fn, ...) TS_DISPATCH(dev, fn, __VA_ARGS__)
#define TS_DISPATCH_BREAK TS_DISPATCH
#endif

#include "ops/lm_head.h"

namespace ts::ops {

GraphHooks*& graph_hooks() {
  static thread_local GraphHooks* h = nullptr;
  return h;
}

OpProfiler*& op_profiler() {
  static thread_local OpProfiler* p = nullptr;
  return p;
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  TS_DISPATCH(table.device, embedding, ids, table, out, vocab_start);
}
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) { TS_DISPATCH(x.device, rmsnorm, x, w, eps, out); }
void fused_add_rmsnorm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  TS_DISPATCH(x.device, fused_add_rmsnorm, x, residual, w, eps);
}
void rmsnorm_pair(const Tensor& a, const Tensor& b, const Tensor& wa, const Tensor& wb, float eps, Tensor& out_a,
                  Tensor& out_b) {
  TS_DISPATCH(a.device, rmsnorm_pair, a, b, wa, wb, eps, out_a, out_b);
}
void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& wq, const Tensor& wk, float eps, const Tensor& positions,
                  const Rope& r) {
  TS_DISPATCH(q.device, qk_norm_rope, q, k, wq, wk, eps, positions, r);
}
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Rope& r) {
  TS_DISPATCH(positions.device, rope, q, k, positions, r);
}
void silu_mul(const Tensor& x, Tensor& out) { TS_DISPATCH(x.device, silu_mul, x, out); }
void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias) {
  // Profiled per weight shape: the router, projections and LM head are told apart.
  TS_DISPATCH_L(
      x.device, [&] { return fmt::format("linear {}x{}{}", w.size(0), w.size(1), out.dtype == DType::f32 ? " (f32 out)" : ""); },
      linear, x, w, out, bias);
}
void linear(const Tensor& x, const LinearWeight& w, Tensor& out, const Tensor* bias) {
  if (w.quant.sim_w8a8 && x.device == Device::cpu && x.rows() >= kW8A8MinRows) {
    // The CPU's simulation of CUDA's W8A8 (LoadOptions::simulate_w8a8): FP8 activations.
    Tensor xq = Tensor::empty({x.rows(), x.size(-1)}, DType::f32);
    cpu::fake_quantize_act_fp8(x, xq);
    return linear(xq, static_cast<const Tensor&>(w), out, bias);
  }
  if (!w.quantized()) return linear(x, static_cast<const Tensor&>(w), out, bias);
  TS_CHECK(x.device == Device::cuda, "linear: a quantized ({}) weight is for the CUDA backend (the CPU dequantizes at load)",
           w.quant.format);
#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
  if (GraphHooks* h = graph_hooks(); h && h->skip_ops()) return;
  OpProfileScope prof([&] { return fmt::format("linear {}x{} ({})", w.size(0), w.size(1), w.quant.format); });
  cuda::quant_linear(x, w, out, bias);
#else
  fail("linear: a quantized weight needs the CUDA backend, not in this build");
#endif
}
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const LinearWeight& gate_up,
                 const LinearWeight& down, const GluAct& act, Tensor& out) {
  if (!gate_up.quantized() && !down.quantized())
    return moe_experts(x, ids, weights, static_cast<const Tensor&>(gate_up), static_cast<const Tensor&>(down), act, out);
  TS_CHECK(x.device == Device::cuda,
           "moe_experts: quantized ({}) experts are for the CUDA backend (the CPU dequantizes at load)",
           gate_up.quant.format);
#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
  if (GraphHooks* h = graph_hooks(); h && h->skip_ops()) return;
  OpProfileScope prof([&] { return fmt::format("moe_experts ({})", gate_up.quant.format); });
  cuda::moe_experts_stored(x, ids, weights, gate_up, down, act, out);
#else
  fail("moe_experts: quantized experts need the CUDA backend, not in this build");
#endif
}
void add_inplace(Tensor& y, const Tensor& x) { TS_DISPATCH(y.device, add_inplace, y, x); }
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping,
              const KvScales& kvs) {
  TS_DISPATCH_BREAK(k_cache.device, kv_write, k, v, k_cache, v_cache, slot_mapping, kvs);
}
// A break op (it reads the per-batch slot mapping, as kv_write).
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& r, Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping,
                   const KvScales& kvs) {
  TS_DISPATCH_BREAK(k_cache.device, rope_kv_write, q, k, v, wq, wk, eps, positions, r, k_cache, v_cache, slot_mapping,
                    kvs);
}
namespace {
// " (fp8 block)" for a weight kept as stored: the profile tells the formats apart.
std::string weight_tag(const LinearWeight& w) { return w.quantized() ? fmt::format(" ({})", w.quant.format) : ""; }
// The CPU backend holds dequantized weights only (the oracle); a quantized one here is a bug.
void check_cpu_weight(const Tensor& x, const LinearWeight& w, const char* op) {
  TS_CHECK(x.device == Device::cuda || !w.quantized(), "{}: a quantized ({}) weight is for the CUDA backend", op,
           w.quant.format);
}
}  // namespace

void linear_silu_mul(const Tensor& x, const LinearWeight& w, Tensor& out, Tensor& gu_scratch, const Tensor* in_norm,
                     float eps, Tensor* x_scratch) {
  check_cpu_weight(x, w, "linear_silu_mul");
  TS_DISPATCH_L(
      x.device,
      [&] { return fmt::format("linear_silu_mul {}x{}{}{}", w.size(0), w.in_features(), weight_tag(w), in_norm ? " (normed x)" : ""); },
      linear_silu_mul, x, w, out, gu_scratch, in_norm, eps, x_scratch);
}
void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out,
                    const Tensor* bias, Tensor& x_scratch) {
  check_cpu_weight(x, w, "rmsnorm_linear");
  TS_DISPATCH_L(
      x.device, [&] { return fmt::format("rmsnorm_linear {}x{}{}", w.size(0), w.in_features(), weight_tag(w)); },
      rmsnorm_linear, x, norm_w, eps, w, out, bias, x_scratch);
}
void linear_add(const Tensor& x, const LinearWeight& w, Tensor& residual, Tensor& scratch) {
  check_cpu_weight(x, w, "linear_add");
  TS_DISPATCH_L(
      x.device, [&] { return fmt::format("linear_add {}x{}{}", w.size(0), w.in_features(), weight_tag(w)); }, linear_add,
      x, w, residual, scratch);
}
bool lm_head_argmax_fusable(const Tensor& x, const Tensor* norm_w, const Tensor& head) {
#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
  if (x.device == Device::cuda) return ::ts::ops::cuda::lm_head_argmax_fusable(x, norm_w, head);
#endif
  (void)x;
  (void)norm_w;
  (void)head;
  return false;
}
void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor& scratch) {
  TS_DISPATCH_L(
      x.device, [&] { return fmt::format("lm_head_argmax {}x{}", head.size(0), head.size(1)); }, lm_head_argmax, x,
      norm_w, eps, head, ids, scratch);
}
bool fuses_norm_gemv(Device device, int64_t rows) {
#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
  if (device == Device::cuda) return ::ts::ops::cuda::fuses_norm_gemv(rows);
#endif
  (void)device;
  (void)rows;
  return false;
}
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out, const KvScales& kvs, int window) {
  TS_DISPATCH_BREAK(k_cache.device, paged_attention, q, k_cache, v_cache, meta, scale, out, kvs, window);
}
void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride, Tensor* out2) {
  TS_DISPATCH(out.device, argmax_rows, logits, offsets, out, out_stride, out2);
}
void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc) {
  TS_DISPATCH(acc.device, spec_accept, verify_ids, target_ids, n, acc);
}
void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n, Tensor& h_pool,
                 Tensor& next_out) {
  TS_DISPATCH(h_pool.device, spec_select, r, next_ids, acc, slots, n, h_pool, next_out);
}
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) { TS_DISPATCH(x.device, gather_rows, x, index, out); }
void copy_rows(const Tensor& src, Tensor& dst) { TS_DISPATCH(dst.device, copy_rows, src, dst); }
void cast(const Tensor& src, Tensor& dst) { TS_DISPATCH(dst.device, cast, src, dst); }
void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out) {
  TS_DISPATCH(logits.device, sample, logits, rows, out);
}

void apply_token_bitmask(Tensor& logits, const Tensor& bitmask) {
  TS_CHECK(logits.dtype == DType::f32 && logits.ndim == 2, "apply_token_bitmask: logits must be f32 [B, V]");
  TS_CHECK(bitmask.dtype == DType::i32 && bitmask.ndim == 2 && bitmask.is_contiguous() && bitmask.size(0) == logits.size(0) &&
               bitmask.size(1) == (logits.size(1) + 31) / 32 && bitmask.device == logits.device,
           "apply_token_bitmask: bitmask must be i32 [B, ceil(V/32)] on the logits' device");
  TS_DISPATCH(logits.device, apply_token_bitmask, logits, bitmask);
}

// MoE: ordinary (capturable) ops. The latent / indexer cache writes and MLA / block-sparse
// attention read per-batch metadata: break ops, like kv_write and paged_attention.
void cache_write(const Tensor& x, Tensor& cache, const Tensor& slot_mapping, float fp8_scale) {
  TS_DISPATCH_BREAK(cache.device, cache_write, x, cache, slot_mapping, fp8_scale);
}
void glu(const Tensor& x, Tensor& out, const GluAct& act) { TS_DISPATCH(x.device, glu, x, out, act); }
void moe_route(const Tensor& logits, const Tensor* bias, const MoeRouting& r, Tensor& ids, Tensor& weights) {
  TS_DISPATCH(logits.device, moe_route, logits, bias, r, ids, weights);
}
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                 const GluAct& act, Tensor& out) {
  TS_DISPATCH(x.device, moe_experts, x, ids, weights, gate_up, down, act, out);
}
void mla_attention(const Tensor& q, const Tensor& latent_cache, const AttnMeta& meta, float scale, int64_t kv_rank,
                   Tensor& out, float fp8_scale) {
  TS_DISPATCH_BREAK(latent_cache.device, mla_attention, q, latent_cache, meta, scale, kv_rank, out, fp8_scale);
}
void block_indexer(const Tensor& q, const Tensor& k_cache, const AttnMeta& meta, const BlockIndexer& p, Tensor& out) {
  TS_DISPATCH_BREAK(k_cache.device, block_indexer, q, k_cache, meta, p, out);
}
void block_sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta,
                            float scale, const Tensor& blocks, int sel_block_size, Tensor& out) {
  TS_DISPATCH_BREAK(k_cache.device, block_sparse_attention, q, k_cache, v_cache, meta, scale, blocks, sel_block_size, out);
}

// Gated DeltaNet: the conv and the delta rule read per-sequence metadata and state slots (break
// ops, like attention); the gates, the gated norm and the output gate are ordinary ops.
void causal_conv1d(const Tensor& x, const Tensor& w, Tensor& conv_state, const Tensor& state_slots, const AttnMeta& meta,
                   Tensor& out) {
  TS_DISPATCH_BREAK(x.device, causal_conv1d, x, w, conv_state, state_slots, meta, out);
}
void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g, Tensor& beta) {
  TS_DISPATCH(a.device, gdn_gates, a, b, A_log, dt_bias, g, beta);
}
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, const Tensor& state_slots, const AttnMeta& meta, Tensor& out) {
  TS_DISPATCH_BREAK(q.device, gated_delta_rule, q, k, v, g, beta, state, state_slots, meta, out);
}
void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  TS_DISPATCH(x.device, rmsnorm_gated, x, z, w, eps, out);
}
void sigmoid_gate(Tensor& x, const Tensor& gate) { TS_DISPATCH(x.device, sigmoid_gate, x, gate); }

}  // namespace ts::ops
