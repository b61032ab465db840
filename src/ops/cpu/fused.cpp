// Decode fusions on the CPU: the reference is the composition of the unfused ops (the CUDA
// kernels must match it), so a model gives the same logits fused or not.
#include "ops/cpu/cpu_ops.h"
#include "ops/lm_head.h"

namespace ts::ops::cpu {

void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* wq, const Tensor* wk, float eps,
                   const Tensor& positions, const Rope& rope, Tensor& k_cache, Tensor& v_cache,
                   const Tensor& slot_mapping, const KvScales& kvs) {
  TS_CHECK((wq == nullptr) == (wk == nullptr), "rope_kv_write: give both q/k norm weights or neither");
  if (wq) ops::cpu::qk_norm_rope(q, k, *wq, *wk, eps, positions, rope);
  else ops::cpu::rope(q, k, positions, rope);
  ops::cpu::kv_write(k, v, k_cache, v_cache, slot_mapping, kvs);
}

void linear_silu_mul(const Tensor& x, const Tensor& w, Tensor& out, Tensor& gu_scratch, const Tensor* in_norm, float eps,
                     Tensor* x_scratch) {
  TS_CHECK(gu_scratch.rows() == x.rows() && gu_scratch.size(-1) == w.size(0), "linear_silu_mul: scratch {} for w {}",
           gu_scratch.shape_str(), w.shape_str());
  const Tensor* src = &x;
  if (in_norm) {
    TS_CHECK(x_scratch, "linear_silu_mul: the input norm needs an x scratch");
    ops::cpu::rmsnorm(x, *in_norm, eps, *x_scratch);
    src = x_scratch;
  }
  ops::cpu::linear(*src, w, gu_scratch, nullptr);
  ops::cpu::silu_mul(gu_scratch, out);
}

void rmsnorm_linear(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w, Tensor& out, const Tensor* bias,
                    Tensor& x_scratch) {
  ops::cpu::rmsnorm(x, norm_w, eps, x_scratch);
  ops::cpu::linear(x_scratch, w, out, bias);
}

void linear_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) {
  ops::cpu::linear(x, w, scratch, nullptr);
  ops::cpu::add_inplace(residual, scratch);
}

void lm_head_argmax(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& head, Tensor& ids, Tensor&) {
  // The reference: norm, f32 logits, argmax_rows (ties to the lowest id).
  const int64_t M = x.rows();
  TS_CHECK(ids.dtype == DType::i32 && ids.numel() >= M, "lm_head_argmax: ids must be i32 [>= {}]", M);
  Tensor xn = x;
  if (norm_w) {
    xn = Tensor::empty(x.dims(), x.dtype);
    ops::cpu::rmsnorm(x, *norm_w, eps, xn);
  }
  Tensor logits = Tensor::empty({M, head.size(0)}, DType::f32);
  ops::cpu::linear(xn, head, logits, nullptr);
  ops::cpu::argmax_rows(logits, nullptr, ids, 1, nullptr);
}

}  // namespace ts::ops::cpu
