// Loads checkpoint tensors into the model's device and dtype (f32 on the CPU, bf16 on CUDA),
// checking names and shapes, and fusing projections (q|k|v, gate|up) by stacking rows.
// Quantized weights (FP8, MXFP8, NVFP4; src/io/quant_config.h) are dequantized at load (stored
// value x scales, in f32) wherever a float weight is asked for: exact on the CPU (the oracle);
// on CUDA the result is rounded to bf16, a correctness path, not the fast one.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "ops/linear_weight.h"

namespace ts::models {

class WeightLoader {
 public:
  WeightLoader(io::Checkpoint ckpt, Device device);
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  bool has(const std::string& name) const { return ckpt_.has(name); }
  // Loads `name` with the expected shape, converted to the model dtype.
  Tensor load(const std::string& name, const std::vector<int64_t>& shape);
  // Loads `name` as f32 on the model's device whatever the model dtype: small tensors whose
  // precision decides discrete choices (the router's e_score_correction_bias).
  Tensor load_f32(const std::string& name, const std::vector<int64_t>& shape);
  // Loads several [rows_i, cols] tensors stacked along dim 0 into one [sum rows_i, cols].
  Tensor load_stacked(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes);
  // One part of a (possibly sharded) load: rows or columns [start, start + count) of `name`
  // (full checkpoint shape `shape`) along `dim` (0: rows, 1: columns of a 2-D weight);
  // count < 0: the whole dimension.
  struct Part {
    std::string name;
    std::vector<int64_t> shape;
    int dim = 0;
    int64_t start = 0, count = -1;
  };
  // Loads the parts (each sliced) stacked along dim 0.
  Tensor load_parts(const std::vector<Part>& parts);
  // A linear's weight from parts as load_parts takes them. On CUDA, FP8 weights (block, channel,
  // tensor, MXFP8) stay as stored with their scales (ops::LinearWeight) when every part is one
  // and the cuts fall on scale blocks (rows: any cut, unaligned ones get per-row scales; columns:
  // multiples of the k block); anything else is dequantized as load_parts does.
  ops::LinearWeight load_linear(const std::vector<Part>& parts);
  ops::LinearWeight load_linear(const std::string& name, const std::vector<int64_t>& shape) {
    return load_linear({Part{name, shape}});
  }
  // The host form load_linear would upload (nullopt: it would dequantize instead); for tests.
  std::optional<ops::LinearWeight> stored_linear(const std::vector<Part>& parts) const;
  // Routed experts as one weight [E, rows, cols]: experts[e] lists expert e's parts (gate and up
  // rows, or down), each stacked as load_parts does. On CUDA, FP8 / NVFP4 experts stay as stored
  // (ops::LinearWeight of ndim 3, linear_weight.h) when load_linear would keep every expert's
  // parts; otherwise (or with keep_quantized false) they are dequantized (load_parts of all parts,
  // viewed [E, rows, cols]).
  ops::LinearWeight load_experts(const std::vector<std::vector<Part>>& experts, bool keep_quantized = true);
  // The host form load_experts would upload (nullopt: it would dequantize); for tests. Scale rows
  // become per-row where rows is not a multiple of the row block (the kernels' flat indexing).
  std::optional<ops::LinearWeight> stored_experts(const std::vector<std::vector<Part>>& experts) const;
  // false: load_linear dequantizes on CUDA too (the bf16 path, to compare against).
  void set_keep_quantized(bool on) { keep_quantized_ = on; }
  // CPU: load_linear marks dequantized weights whose CUDA form takes W8A8 (ops::LinearWeight's
  // QuantScales::sim_w8a8), so the CPU simulates that path (LoadOptions::simulate_w8a8).
  void set_simulate_w8a8(bool on) { simulate_w8a8_ = on; }
  // A 3-D tensor [A, B, C] (fused experts: [E, 2I, H] or [E, H, I]) cut to the a-range [a0, a0 +
  // an) of dim 0, the listed ranges {start, count} of dim 1 (stacked in order) and [c0, c0 + cn) of
  // dim 2: [an, sum counts, cn]. Quantized tensors are dequantized first (as load does).
  Tensor load_blocks3(const std::string& name, const std::vector<int64_t>& shape, int64_t a0, int64_t an,
                      const std::vector<std::pair<int64_t, int64_t>>& b_ranges, int64_t c0, int64_t cn);
  // Raw host tensor (any dtype, no conversion), e.g. int64 index maps.
  Tensor raw(const std::string& name) const { return ckpt_.get(name); }
  size_t bytes_loaded() const { return bytes_; }
  const io::Checkpoint& checkpoint() const { return ckpt_; }
  const io::QuantConfig& quant() const { return quant_; }

 private:
  // Host float tensor of `name` with logical shape `shape`: as stored, or dequantized to f32.
  Tensor host_float(const std::string& name, const std::vector<int64_t>& shape) const;

  io::Checkpoint ckpt_;
  io::QuantConfig quant_;
  Device device_;
  DType dtype_;
  size_t bytes_ = 0;
  bool keep_quantized_ = true;
  bool simulate_w8a8_ = false;
};

// e4m3 x scales of a quantized linear weight (host or device) as host f32 [N, K]: the reference
// for the CUDA kernels that read it.
Tensor dequantize_linear(const ops::LinearWeight& w);

// Converts a host tensor of f32/bf16/f16 into `dt` on `device` (a fresh contiguous tensor).
Tensor convert(const Tensor& src, DType dt, Device device);

}  // namespace ts::models
