// Speculative-decoding helpers of the fixed-shape EAGLE3 step (reference for ops/cuda/spec.cu).
#include <cstring>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace ts::ops::cpu {

void argmax_rows(const Tensor& logits, const Tensor* offsets, Tensor& out, int64_t out_stride, Tensor* out2) {
  TS_CHECK(logits.dtype == DType::f32 && out.dtype == DType::i32, "argmax_rows: f32 logits, i32 out");
  const int64_t R = logits.rows(), V = logits.size(-1), ld = R ? logits.row_stride() : 0;
  TS_CHECK(R == 0 || out.numel() >= (R - 1) * out_stride + 1, "argmax_rows: out {} too small for {} rows (stride {})",
           out.shape_str(), R, out_stride);
  TS_CHECK(!offsets || (offsets->dtype == DType::i32 && offsets->numel() == V), "argmax_rows: offsets must be i32 [{}]", V);
  TS_CHECK(!out2 || (out2->dtype == DType::i32 && out2->numel() >= R), "argmax_rows: out2 must be i32 [>= {}]", R);
  for (int64_t r = 0; r < R; ++r) {
    const float* l = logits.ptr<float>() + r * ld;
    int64_t b = 0;
    for (int64_t v = 1; v < V; ++v)
      if (l[v] > l[b]) b = v;
    const int32_t id = int32_t(b) + (offsets ? offsets->ptr<int32_t>()[b] : 0);
    out.ptr<int32_t>()[r * out_stride] = id;
    if (out2) out2->ptr<int32_t>()[r] = id;
  }
}

void spec_accept(const Tensor& verify_ids, const Tensor& target_ids, int n, Tensor& acc) {
  const int64_t B = acc.numel();
  TS_CHECK(verify_ids.numel() >= B * n && target_ids.numel() >= B * n, "spec_accept: {} requests of {} rows", B, n);
  const int32_t *v = verify_ids.ptr<int32_t>(), *t = target_ids.ptr<int32_t>();
  for (int64_t i = 0; i < B; ++i) {
    int a = 0;
    while (a < n - 1 && t[i * n + a] == v[i * n + a + 1]) ++a;
    acc.ptr<int32_t>()[i] = a;
  }
}

void spec_select(const Tensor& r, const Tensor& next_ids, const Tensor& acc, const Tensor& slots, int n, Tensor& h_pool,
                 Tensor& next_out) {
  const int64_t B = acc.numel(), es = int64_t(dtype_size(r.dtype)), row = r.size(-1) * es;
  TS_CHECK(r.dtype == h_pool.dtype && r.size(-1) == h_pool.size(-1), "spec_select: r {} vs pool {}", r.shape_str(),
           h_pool.shape_str());
  for (int64_t i = 0; i < B; ++i) {
    int64_t a = acc.ptr<int32_t>()[i], s = slots.ptr<int32_t>()[i], src = i * n + a;
    TS_CHECK(a >= 0 && a < n && s >= 0 && s < h_pool.rows(), "spec_select: acc {} slot {}", a, s);
    std::memcpy(static_cast<char*>(h_pool.data) + s * h_pool.row_stride() * es,
                static_cast<const char*>(r.data) + src * r.row_stride() * es, size_t(row));
    next_out.ptr<int32_t>()[i] = next_ids.ptr<int32_t>()[src];
  }
}

}  // namespace ts::ops::cpu
