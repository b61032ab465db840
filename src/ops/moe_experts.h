// Routed experts kept as stored (CUDA): ops::moe_experts over FP8 / NVFP4 expert weights.
// A stored expert weight is an ops::LinearWeight of ndim 3: data [E, R, K] (NVFP4: [E, R, K/2])
// with quant.scale [E, SR, SC] and (NVFP4) quant.scale2 [E, R], every expert's rows laid out as
// one 2-D LinearWeight would be and R a multiple of 2^block_n_log2 (the loader falls back to
// per-row scales otherwise), so experts [e0, e0 + count) read as one 2-D weight [count * R, K]
// whose row e * R + r is expert e's row r (expert_rows). Plain experts are bf16 (CUDA) / f32
// (CPU) [E, R, K] tensors, as ops::moe_experts takes them.
#pragma once
#include <cstdint>

#include "ops/linear_weight.h"
#include "ops/ops.h"

namespace ts::ops {

// K of a plain or stored expert weight [E, R, K (NVFP4: K/2)].
inline int64_t expert_in_features(const LinearWeight& w) { return w.quant.nvfp4 ? w.size(2) * 2 : w.size(2); }

// Experts [e0, e0 + count) of a stored expert weight as one 2-D weight [count * R, K].
inline LinearWeight expert_rows(const LinearWeight& w, int64_t e0, int64_t count) {
  const int64_t E = w.size(0), R = w.size(1), SR = w.quant.scale.size(1), SC = w.quant.scale.size(2);
  LinearWeight v(w.view({E * R, w.size(2)}).slice_rows(e0 * R, (e0 + count) * R));
  v.quant = w.quant;
  v.quant.scale = w.quant.scale.view({E * SR, SC}).slice_rows(e0 * SR, (e0 + count) * SR);
  if (w.quant.scale2.data) v.quant.scale2 = w.quant.scale2.view({E * R}).narrow(0, e0 * R, count * R);
  return v;
}

// ops::moe_experts for plain or stored experts (gate_up [E, 2I, H], down [E, H, I]): plain ones
// go to ops::moe_experts; stored ones (CUDA only: the CPU dequantizes at load) to the grouped
// kernels of src/ops/cuda/moe.cu.
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const LinearWeight& gate_up,
                 const LinearWeight& down, const GluAct& act, Tensor& out);

}  // namespace ts::ops
