// Device dispatch: the first tensor argument's device picks the backend.
#include "ops/ops.h"

#include "ops/cpu/cpu_ops.h"

#if defined(TS_WITH_CUDA) && __has_include("ops/cuda/cuda_ops.h")
#include "ops/cuda/cuda_ops.h"
#define TS_DISPATCH(dev, fn, ...)                                          \
  do {                                                                     \
    if ((dev) == Device::cuda) return ::ts::ops::cuda::fn(__VA_ARGS__);    \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                \
  } while (0)
#else
#define TS_DISPATCH(dev, fn, ...)                                          \
  do {                                                                     \
    TS_CHECK((dev) == Device::cpu, "op " #fn ": no CUDA backend in this build"); \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                \
  } while (0)
#endif

namespace ts::ops {

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
  TS_DISPATCH(x.device, linear, x, w, out, bias);
}
void add_inplace(Tensor& y, const Tensor& x) { TS_DISPATCH(y.device, add_inplace, y, x); }
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping) {
  TS_DISPATCH(k_cache.device, kv_write, k, v, k_cache, v_cache, slot_mapping);
}
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttnMeta& meta, float scale,
                     Tensor& out) {
  TS_DISPATCH(k_cache.device, paged_attention, q, k_cache, v_cache, meta, scale, out);
}
void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) { TS_DISPATCH(x.device, gather_rows, x, index, out); }
void copy_rows(const Tensor& src, Tensor& dst) { TS_DISPATCH(dst.device, copy_rows, src, dst); }
void cast(const Tensor& src, Tensor& dst) { TS_DISPATCH(dst.device, cast, src, dst); }
void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<int32_t>& out) {
  TS_DISPATCH(logits.device, sample, logits, rows, out);
}

}  // namespace ts::ops
