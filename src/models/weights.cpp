#include "models/weights.h"

#include <algorithm>
#include <optional>

#include "core/fp8.h"
#include "ops/moe_experts.h"
#ifdef TS_WITH_CUDA
#include "ops/cuda/quant_linear.h"
#endif

namespace ts::models {

static void convert_into(const Tensor& src, DType dt, void* dst) {
  int64_t n = src.numel();
  TS_CHECK(src.is_contiguous(), "convert: source must be contiguous");
  if (src.dtype == dt) {
    std::memcpy(dst, src.data, src.nbytes());
    return;
  }
  if (dt == DType::f32) {
    Tensor f = src.to_f32();
    std::memcpy(dst, f.data, size_t(n) * 4);
    return;
  }
  TS_CHECK(dt == DType::bf16, "convert: target dtype {} not supported", dtype_name(dt));
  uint16_t* o = static_cast<uint16_t*>(dst);
  if (src.dtype == DType::f32) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(src.ptr<float>()[i]);
  } else if (src.dtype == DType::f16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(f16_to_f32(src.ptr<uint16_t>()[i]));
  } else {
    fail("convert: cannot convert {} to BF16", dtype_name(src.dtype));
  }
}

Tensor convert(const Tensor& src, DType dt, Device device) {
  Tensor host = Tensor::empty(src.dims(), dt, Device::cpu);
  convert_into(src, dt, host.data);
  return device == Device::cpu ? host : host.to(device);
}

WeightLoader::WeightLoader(io::Checkpoint ckpt, Device device)
    : ckpt_(std::move(ckpt)),
      quant_(io::load_quant_config(ckpt_.dir())),
      device_(device),
      dtype_(device == Device::cpu ? DType::f32 : DType::bf16) {
  io::adopt_quant_names(ckpt_);  // compressed-tensors NVFP4's weight_packed & co. in ModelOpt's layout
}

static void check_float(const Tensor& t, const std::string& file, const std::string& name) {
  TS_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f32,
           "{}: tensor {} has dtype {}, expected a float type (BF16, F16, F32)", file, name, dtype_name(t.dtype));
}

Tensor WeightLoader::host_float(const std::string& name, const std::vector<int64_t>& shape) const {
  if (io::is_quantized_weight(ckpt_, name)) {
    Tensor t = io::dequantize_weight(ckpt_, quant_, name);
    std::string want;
    for (auto d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    TS_CHECK(t.dims() == shape, "{}: quantized tensor {} holds a {} weight, expected [{}]", ckpt_.file_of(name), name,
             t.shape_str(), want);
    return t;
  }
  Tensor t = ckpt_.get(name, shape);
  check_float(t, ckpt_.file_of(name), name);
  return t;
}

Tensor WeightLoader::load(const std::string& name, const std::vector<int64_t>& shape) {
  Tensor t = host_float(name, shape);
  Tensor out = convert(t, dtype_, device_);
  bytes_ += out.nbytes();
  return out;
}

Tensor WeightLoader::load_blocks3(const std::string& name, const std::vector<int64_t>& shape, int64_t a0, int64_t an,
                                 const std::vector<std::pair<int64_t, int64_t>>& b_ranges, int64_t c0, int64_t cn) {
  TS_CHECK(shape.size() == 3, "{}: load_blocks3 needs a 3-D shape", name);
  Tensor t = host_float(name, shape);
  TS_CHECK(t.is_contiguous(), "{}: checkpoint tensor must be contiguous", name);
  const int64_t B = shape[1], C = shape[2];
  int64_t bn = 0;
  for (auto [b0, n] : b_ranges) {
    TS_CHECK(b0 >= 0 && n >= 0 && b0 + n <= B, "{}: rows [{}, {}) outside {}", name, b0, b0 + n, B);
    bn += n;
  }
  TS_CHECK(a0 >= 0 && an >= 0 && a0 + an <= shape[0] && c0 >= 0 && cn >= 0 && c0 + cn <= C,
           "{}: block [{}, +{}) x [{}, +{}) outside {}", name, a0, an, c0, cn, t.shape_str());
  const size_t es = dtype_size(t.dtype);
  Tensor cut = Tensor::empty({an, bn, cn}, t.dtype, Device::cpu);
  char* dst = static_cast<char*>(cut.data);
  for (int64_t a = a0; a < a0 + an; ++a)
    for (auto [b0, n] : b_ranges)
      for (int64_t b = b0; b < b0 + n; ++b) {
        std::memcpy(dst, static_cast<const char*>(t.data) + size_t((a * B + b) * C + c0) * es, size_t(cn) * es);
        dst += size_t(cn) * es;
      }
  Tensor out = convert(cut, dtype_, device_);
  bytes_ += out.nbytes();
  return out;
}

Tensor WeightLoader::load_f32(const std::string& name, const std::vector<int64_t>& shape) {
  Tensor t = host_float(name, shape);
  Tensor out = convert(t, DType::f32, device_);
  bytes_ += out.nbytes();
  return out;
}

Tensor WeightLoader::load_stacked(const std::vector<std::string>& names,
                                  const std::vector<std::vector<int64_t>>& shapes) {
  TS_CHECK(names.size() == shapes.size() && !names.empty(), "load_stacked: bad arguments");
  // Stacks along dim 0: 2-D weights [rows_i, cols] or 1-D biases [rows_i].
  int64_t rows = 0, cols = shapes[0].back();
  for (auto& s : shapes) {
    TS_CHECK(s.size() == shapes[0].size() && (s.size() == 1 || s.back() == cols), "load_stacked: {} column mismatch", names[0]);
    rows += s[0];
  }
  std::vector<int64_t> out_shape = shapes[0].size() == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
  Tensor host = Tensor::empty(out_shape, dtype_, Device::cpu);
  size_t off = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor t = host_float(names[i], shapes[i]);
    convert_into(t, dtype_, static_cast<char*>(host.data) + off);
    off += size_t(t.numel()) * dtype_size(dtype_);
  }
  Tensor out = device_ == Device::cpu ? host : host.to(device_);
  bytes_ += out.nbytes();
  return out;
}

// A contiguous host copy (same dtype) of t's [start, start + count) along dim (0 or 1).
static Tensor host_slice(const Tensor& t, int dim, int64_t start, int64_t count, const std::string& name) {
  TS_CHECK(t.is_contiguous(), "{}: checkpoint tensor must be contiguous", name);
  TS_CHECK(dim == 0 || (dim == 1 && t.ndim == 2), "{}: cannot shard dim {} of a {}-D tensor", name, dim, t.ndim);
  TS_CHECK(start >= 0 && count >= 0 && start + count <= t.size(dim), "{}: shard [{}, {}) outside dim {} of {}", name, start,
           start + count, dim, t.shape_str());
  if (start == 0 && count == t.size(dim)) return t;
  const size_t es = dtype_size(t.dtype);
  std::vector<int64_t> shape = t.dims();
  shape[size_t(dim)] = count;
  Tensor out = Tensor::empty(shape, t.dtype, Device::cpu);
  const int64_t inner = t.ndim == 1 ? 1 : t.size(1);
  if (dim == 0) {
    std::memcpy(out.data, static_cast<const char*>(t.data) + size_t(start * inner) * es, size_t(count * inner) * es);
  } else {
    for (int64_t r = 0; r < t.size(0); ++r)
      std::memcpy(static_cast<char*>(out.data) + size_t(r * count) * es,
                  static_cast<const char*>(t.data) + size_t(r * inner + start) * es, size_t(count) * es);
  }
  return out;
}

Tensor WeightLoader::load_parts(const std::vector<Part>& parts) {
  TS_CHECK(!parts.empty(), "load_parts: no parts");
  std::vector<Tensor> slices;
  int64_t rows = 0;
  for (auto& p : parts) {
    Tensor t = host_float(p.name, p.shape);
    int64_t count = p.count < 0 ? t.size(p.dim) - p.start : p.count;
    slices.push_back(host_slice(t, p.dim, p.start, count, p.name));
    rows += slices.back().size(0);
  }
  const Tensor& f = slices[0];
  for (auto& s : slices)
    TS_CHECK(s.ndim == f.ndim && (s.ndim == 1 || s.size(1) == f.size(1)), "load_parts: {} column mismatch", parts[0].name);
  std::vector<int64_t> shape = f.ndim == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, f.size(1)};
  Tensor host = Tensor::empty(shape, dtype_, Device::cpu);
  size_t off = 0;
  for (auto& s : slices) {
    convert_into(s, dtype_, static_cast<char*>(host.data) + off);
    off += size_t(s.numel()) * dtype_size(dtype_);
  }
  Tensor out = device_ == Device::cpu ? host : host.to(device_);
  bytes_ += out.nbytes();
  return out;
}

namespace {

int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// One part of a quantized linear in the CUDA kernels' layout (ops::QuantScales): host values
// [rows, cols] and f32 scales [ceil(rows / 2^bn), ceil(cols / 2^bk)].
struct QuantPart {
  Tensor data, scale;
  int bn = 0, bk = 0;
  const char* format = "";
  bool nvfp4 = false;
  Tensor scale2;  // nvfp4: f32 [rows]
};

// Per-row scales [rows, cols] of rows [start, start + rows) of a grid with 2^bn-row blocks.
Tensor per_row_scales(const Tensor& grid, int bn, int64_t start, int64_t rows) {
  const int64_t cols = grid.size(1);
  Tensor out = Tensor::empty({rows, cols}, DType::f32);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.ptr<float>() + r * cols, grid.ptr<float>() + ((start + r) >> bn) * cols, size_t(cols) * 4);
  return out;
}

// Rows [r0, r0 + rn) and columns [c0, c0 + cn) of a contiguous 2-D host tensor.
Tensor host_block(const Tensor& t, int64_t r0, int64_t rn, int64_t c0, int64_t cn) {
  const size_t es = dtype_size(t.dtype);
  const int64_t cols = t.size(1);
  if (c0 == 0 && cn == cols) {
    Tensor out = Tensor::empty({rn, cn}, t.dtype);
    std::memcpy(out.data, static_cast<const char*>(t.data) + size_t(r0 * cols) * es, size_t(rn * cn) * es);
    return out;
  }
  Tensor out = Tensor::empty({rn, cn}, t.dtype);
  for (int64_t r = 0; r < rn; ++r)
    std::memcpy(static_cast<char*>(out.data) + size_t(r * cn) * es,
                static_cast<const char*>(t.data) + size_t((r0 + r) * cols + c0) * es, size_t(cn) * es);
  return out;
}

// The part in the kernels' layout, or nullopt where they do not apply (NVFP4, blocks that are
// not powers of two or narrower than 16 columns, cuts inside a k block, K % 16 != 0).
std::optional<QuantPart> quant_part(const io::StoredWeight& sw, const WeightLoader::Part& p) {
  using io::WeightFormat;
  const int64_t N = sw.n, K = sw.k;
  QuantPart q;
  q.format = io::weight_format_name(sw.format);
  Tensor grid = sw.scale.is_contiguous() ? sw.scale : sw.scale.to(Device::cpu);
  switch (sw.format) {
    case WeightFormat::fp8_tensor:  // stored per channel: one row of scales per output
      grid = per_row_scales(grid, 30, 0, N);
      q.bk = std::max(4, ceil_log2(K));
      break;
    case WeightFormat::fp8_channel:
      q.bk = std::max(4, ceil_log2(K));
      break;
    case WeightFormat::mxfp8:
      q.bk = 5;
      break;
    case WeightFormat::nvfp4:
      q.nvfp4 = true;
      q.bk = 4;
      break;
    case WeightFormat::fp8_block: {
      const int64_t bn = sw.block_n, bk = sw.block_k;
      if ((bn & (bn - 1)) || (bk & (bk - 1)) || bk < 16) return std::nullopt;
      q.bn = ceil_log2(bn);
      q.bk = ceil_log2(bk);
      break;
    }
    default: return std::nullopt;
  }
  const int64_t count = p.count < 0 ? (p.dim == 0 ? N : K) - p.start : p.count;
  int64_t r0 = 0, rn = N, c0 = 0, cn = K;
  (p.dim == 0 ? r0 : c0) = p.start;
  (p.dim == 0 ? rn : cn) = count;
  if (cn % (q.nvfp4 ? 32 : 16) != 0) return std::nullopt;
  // Columns: the scale grid is cut at k blocks (a per-channel grid has one column: any cut).
  int64_t sc0 = 0, scn = grid.size(1);
  if (grid.size(1) > 1 && (c0 != 0 || cn != K)) {
    if (c0 % (int64_t(1) << q.bk) != 0) return std::nullopt;
    sc0 = c0 >> q.bk;
    scn = ((c0 + cn + (int64_t(1) << q.bk) - 1) >> q.bk) - sc0;
  }
  // Rows: cut at whole row blocks, else per-row scales.
  if (q.bn > 0 && r0 % (int64_t(1) << q.bn) != 0) {
    grid = per_row_scales(grid, q.bn, r0, rn);
    q.bn = 0;
  } else {
    const int64_t s0 = r0 >> q.bn, s1 = (r0 + rn + (int64_t(1) << q.bn) - 1) >> q.bn;
    grid = host_block(grid, s0, s1 - s0, 0, grid.size(1));
  }
  q.scale = host_block(grid, 0, grid.size(0), sc0, scn);
  if (!q.nvfp4) {
    q.data = host_block(sw.data, r0, rn, c0, cn);
    return q;
  }
  // Two values a byte; the scales back to their E4M3 codes (exact: they were decoded from them).
  q.data = host_block(sw.data, r0, rn, c0 / 2, cn / 2);
  Tensor codes = Tensor::empty(q.scale.dims(), DType::f8_e4m3);
  for (int64_t i = 0; i < codes.numel(); ++i) codes.ptr<uint8_t>()[i] = f32_to_e4m3(q.scale.ptr<float>()[i]);
  q.scale = codes;
  q.scale2 = Tensor::empty({rn}, DType::f32);
  for (int64_t i = 0; i < rn; ++i) q.scale2.ptr<float>()[i] = sw.scale2;
  return q;
}

}  // namespace

std::optional<ops::LinearWeight> WeightLoader::stored_linear(const std::vector<Part>& parts) const {
  TS_CHECK(!parts.empty(), "load_linear: no parts");
  if (!quant_.quantized()) return std::nullopt;
  std::vector<QuantPart> qs;
  for (auto& p : parts) {
    if (!io::is_quantized_weight(ckpt_, p.name)) return std::nullopt;
    io::StoredWeight sw = io::stored_weight(ckpt_, quant_, p.name);
    TS_CHECK(p.shape.size() == 2 && sw.n == p.shape[0] && sw.k == p.shape[1],
             "{}: quantized tensor {} holds a [{}, {}] weight, expected {}", ckpt_.file_of(p.name), p.name, sw.n, sw.k,
             Tensor::empty(p.shape, DType::u8).shape_str());
    std::optional<QuantPart> q = quant_part(sw, p);
    if (!q) return std::nullopt;
    qs.push_back(std::move(*q));
  }
  // Stacked rows share the k blocks; row blocks stack when every part but the last ends on one.
  const int bk = qs[0].bk;
  const int64_t cols = qs[0].data.size(1), scols = qs[0].scale.size(1);
  bool same_rows = true;
  for (size_t i = 0; i < qs.size(); ++i) {
    if (qs[i].bk != bk || qs[i].nvfp4 != qs[0].nvfp4 || qs[i].data.size(1) != cols || qs[i].scale.size(1) != scols)
      return std::nullopt;
    same_rows = same_rows && qs[i].bn == qs[0].bn &&
                (i + 1 == qs.size() || qs[i].data.size(0) % (int64_t(1) << qs[i].bn) == 0);
  }
  if (!same_rows)
    for (auto& q : qs) {
      if (q.bn > 0) q.scale = per_row_scales(q.scale, q.bn, 0, q.data.size(0));
      q.bn = 0;
    }
  int64_t rows = 0, srows = 0;
  for (auto& q : qs) rows += q.data.size(0), srows += q.scale.size(0);
  const bool fp4 = qs[0].nvfp4;
  Tensor data = Tensor::empty({rows, cols}, fp4 ? DType::u8 : DType::f8_e4m3);
  Tensor scale = Tensor::empty({srows, scols}, fp4 ? DType::f8_e4m3 : DType::f32);
  Tensor scale2 = fp4 ? Tensor::empty({rows}, DType::f32) : Tensor{};
  size_t d_off = 0, s_off = 0, s2_off = 0;
  for (auto& q : qs) {
    std::memcpy(static_cast<char*>(data.data) + d_off, q.data.data, q.data.nbytes());
    std::memcpy(static_cast<char*>(scale.data) + s_off, q.scale.data, q.scale.nbytes());
    if (fp4) std::memcpy(static_cast<char*>(scale2.data) + s2_off, q.scale2.data, q.scale2.nbytes());
    d_off += q.data.nbytes();
    s_off += q.scale.nbytes();
    s2_off += fp4 ? q.scale2.nbytes() : 0;
  }
  ops::LinearWeight w(data);
  w.quant.scale = scale;
  // DeepSeek-V3/R1, Qwen3-FP8 and the like are made for dynamic FP8 activations (W8A8 prefill).
  w.quant.act_fp8 = quant_.method == "fp8" && quant_.act_dynamic && !fp4;
  w.quant.block_n_log2 = qs[0].bn;
  w.quant.block_k_log2 = bk;
  w.quant.format = qs[0].format;
  w.quant.nvfp4 = fp4;
  w.quant.scale2 = scale2;
  return w;
}

ops::LinearWeight WeightLoader::load_linear(const std::vector<Part>& parts) {
  if (device_ == Device::cpu && simulate_w8a8_) {
    ops::LinearWeight w = load_parts(parts);
    std::optional<ops::LinearWeight> host = stored_linear(parts);
    w.quant.sim_w8a8 = host && ops::w8a8_weight_form(host->quant, host->in_features());
    return w;
  }
  if (device_ != Device::cuda || !keep_quantized_) return load_parts(parts);
  std::optional<ops::LinearWeight> host = stored_linear(parts);
  if (!host) return load_parts(parts);
#ifdef TS_WITH_CUDA
  ops::cuda::reserve_quant_scratch();
#endif
  ops::LinearWeight w(host->to(device_));
  w.quant = host->quant;
  w.quant.scale = host->quant.scale.to(device_);
  if (host->quant.nvfp4) w.quant.scale2 = host->quant.scale2.to(device_);
  bytes_ += w.stored_bytes();
  return w;
}

std::optional<ops::LinearWeight> WeightLoader::stored_experts(const std::vector<std::vector<Part>>& experts) const {
  TS_CHECK(!experts.empty(), "load_experts: no experts");
  std::vector<ops::LinearWeight> ws;
  ws.reserve(experts.size());
  for (auto& parts : experts) {
    std::optional<ops::LinearWeight> w = stored_linear(parts);
    if (!w) return std::nullopt;
    ws.push_back(std::move(*w));
  }
  const ops::LinearWeight& f = ws[0];
  const bool fp4 = f.quant.nvfp4;
  for (auto& w : ws)
    if (w.dims() != f.dims() || w.quant.nvfp4 != fp4 || w.quant.block_k_log2 != f.quant.block_k_log2 ||
        w.quant.block_n_log2 != f.quant.block_n_log2 || w.quant.scale.dims() != f.quant.scale.dims())
      return std::nullopt;
  const int64_t E = int64_t(ws.size()), R = f.size(0), C = f.size(1);
  int bn = f.quant.block_n_log2;
  // The kernels index scale rows of the flat [E * R, K] weight: R must end on a row block.
  if (bn > 0 && R % (int64_t(1) << bn) != 0) {
    for (auto& w : ws) w.quant.scale = per_row_scales(w.quant.scale, bn, 0, R);
    bn = 0;
  }
  const Tensor& s0 = ws[0].quant.scale;
  Tensor data = Tensor::empty({E, R, C}, f.dtype);
  Tensor scale = Tensor::empty({E, s0.size(0), s0.size(1)}, s0.dtype);
  Tensor scale2 = fp4 ? Tensor::empty({E, R}, DType::f32) : Tensor{};
  for (int64_t e = 0; e < E; ++e) {
    const ops::LinearWeight& w = ws[size_t(e)];
    std::memcpy(static_cast<char*>(data.data) + size_t(e) * w.nbytes(), w.data, w.nbytes());
    std::memcpy(static_cast<char*>(scale.data) + size_t(e) * w.quant.scale.nbytes(), w.quant.scale.data,
                w.quant.scale.nbytes());
    if (fp4)
      std::memcpy(static_cast<char*>(scale2.data) + size_t(e) * w.quant.scale2.nbytes(), w.quant.scale2.data,
                  w.quant.scale2.nbytes());
  }
  ops::LinearWeight out(data);
  out.quant = f.quant;
  out.quant.scale = scale;
  out.quant.block_n_log2 = bn;
  out.quant.scale2 = scale2;
  return out;
}

ops::LinearWeight WeightLoader::load_experts(const std::vector<std::vector<Part>>& experts, bool keep_quantized) {
  std::optional<ops::LinearWeight> host;
  if (device_ == Device::cuda && keep_quantized_ && keep_quantized) host = stored_experts(experts);
  if (!host) {
    std::vector<Part> all;
    for (auto& parts : experts) all.insert(all.end(), parts.begin(), parts.end());
    // Whole tensors: load_stacked converts one at a time (a smaller host peak than load_parts).
    const bool whole = std::all_of(all.begin(), all.end(), [](const Part& p) { return p.start == 0 && p.count < 0; });
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    for (auto& p : all) names.push_back(p.name), shapes.push_back(p.shape);
    Tensor t = whole ? load_stacked(names, shapes) : load_parts(all);
    const int64_t E = int64_t(experts.size());
    return t.view({E, t.size(0) / E, t.size(1)});
  }
#ifdef TS_WITH_CUDA
  // The prefill path dequantizes chunks of experts (gate_up + down: at most 3x the larger one).
  ops::cuda::reserve_expert_scratch(host->size(0),
                                    size_t(3) * size_t(host->size(1)) * size_t(ops::expert_in_features(*host)) * 2);
#endif
  ops::LinearWeight w(host->to(device_));
  w.quant = host->quant;
  w.quant.scale = host->quant.scale.to(device_);
  if (host->quant.nvfp4) w.quant.scale2 = host->quant.scale2.to(device_);
  bytes_ += w.stored_bytes();
  return w;
}

Tensor dequantize_linear(const ops::LinearWeight& w) {
  TS_CHECK(w.quantized() && w.dtype == (w.quant.nvfp4 ? DType::u8 : DType::f8_e4m3) && w.ndim == 2,
           "dequantize_linear: not an FP8 / NVFP4 linear weight");
  auto host = [](const Tensor& t) { return t.device == Device::cpu ? t : t.to(Device::cpu); };
  Tensor d = host(w);
  Tensor s = host(w.quant.scale);
  const int64_t N = d.size(0), K = w.in_features(), sc = s.size(1);
  Tensor out = Tensor::empty({N, K}, DType::f32);
  if (w.quant.nvfp4) {
    Tensor s2 = host(w.quant.scale2);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = d.ptr<uint8_t>()[n * d.row_stride() + k / 2];
        out.ptr<float>()[n * K + k] = e2m1_to_f32((k & 1) ? byte >> 4 : byte & 0xf) *
                                      e4m3_to_f32(s.ptr<uint8_t>()[n * sc + (k >> 4)]) * s2.ptr<float>()[n];
      }
    return out;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      out.ptr<float>()[n * K + k] = e4m3_to_f32(d.ptr<uint8_t>()[n * d.row_stride() + k]) *
                                    s.ptr<float>()[(n >> w.quant.block_n_log2) * sc + (k >> w.quant.block_k_log2)];
  return out;
}

}  // namespace ts::models
