#include "models/weights.h"

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
      dtype_(device == Device::cpu ? DType::f32 : DType::bf16) {}

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

}  // namespace ts::models
