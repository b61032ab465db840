#include "core/tensor.h"

#include <cstdlib>
#include <fmt/format.h>

#include "core/device_memory.h"
#include "core/fp8.h"

namespace ts {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i64: return 8;
    case DType::u8: case DType::boolean: case DType::f8_e4m3: case DType::f8_e8m0: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::f8_e8m0: return "F8_E8M0";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return uint16_t(half);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

int64_t Tensor::rows() const {
  if (ndim == 0) return 1;
  return numel() / shape[ndim - 1];
}

int64_t Tensor::row_stride() const {
  if (ndim <= 1) return ndim == 1 ? shape[0] : 1;
  // Dims before the last must be packed relative to each other.
  for (int i = 0; i + 2 < ndim; ++i)
    TS_CHECK(shape[i + 1] == 1 || stride[i] == stride[i + 1] * shape[i + 1],
             "tensor {} has non-uniform row stride", shape_str());
  TS_CHECK(stride[ndim - 1] == 1 || shape[ndim - 1] == 1, "tensor {} last dim not contiguous",
           shape_str());
  return stride[ndim - 2];
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void set_contiguous_strides(Tensor& t) {
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.stride[i] = s;
    s *= t.shape[i];
  }
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t len) const {
  if (dim < 0) dim += ndim;
  TS_CHECK(dim >= 0 && dim < ndim && start >= 0 && len >= 0 && start + len <= shape[dim],
           "narrow({}, {}, {}) out of range for {}", dim, start, len, shape_str());
  Tensor t = *this;
  t.shape[dim] = len;
  // An empty tensor (a zero-token batch's activations) may have no storage: offsetting a null
  // pointer is undefined, and its slices are as empty.
  if (data) t.data = static_cast<char*>(data) + start * stride[dim] * int64_t(dtype_size(dtype));
  return t;
}

Tensor Tensor::view(std::vector<int64_t> new_shape) const {
  TS_CHECK(is_contiguous(), "view of non-contiguous tensor {}", shape_str());
  TS_CHECK(new_shape.size() <= kMaxDims, "view: too many dims");
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) infer = int(i);
    else known *= new_shape[i];
  }
  if (infer >= 0) new_shape[infer] = known ? numel() / known : 0;
  Tensor t = *this;
  t.ndim = int(new_shape.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = new_shape[i];
  TS_CHECK(t.numel() == numel(), "view {} -> {} changes element count", shape_str(), t.shape_str());
  set_contiguous_strides(t);
  return t;
}

Tensor Tensor::row(int64_t i) const {
  TS_CHECK(ndim >= 1 && i >= 0 && i < shape[0], "row {} out of range for {}", i, shape_str());
  Tensor t;
  t.data = static_cast<char*>(data) + i * stride[0] * int64_t(dtype_size(dtype));
  t.dtype = dtype;
  t.device = device;
  t.owner = owner;
  t.ndim = ndim - 1;
  for (int d = 1; d < ndim; ++d) {
    t.shape[d - 1] = shape[d];
    t.stride[d - 1] = stride[d];
  }
  return t;
}

Tensor Tensor::from_blob(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                         std::shared_ptr<void> owner) {
  TS_CHECK(shape.size() <= kMaxDims, "tensor rank {} > {}", shape.size(), kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = int(shape.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = shape[i];
  set_contiguous_strides(t);
  t.owner = std::move(owner);
  return t;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  size_t bytes = size_t(n) * dtype_size(dtype);
  std::shared_ptr<void> owner;
  if (device == Device::cpu) {
    size_t padded = (bytes + 63) / 64 * 64;
    void* p = padded ? std::aligned_alloc(64, padded) : nullptr;
    TS_CHECK(p || !padded, "out of host memory allocating {} bytes", bytes);
    owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    owner = device_alloc(bytes);
  }
  return from_blob(owner.get(), std::move(shape), dtype, device, owner);
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (device == Device::cpu) {
    if (t.nbytes()) std::memset(t.data, 0, t.nbytes());
  } else {
    device_memset(t.data, 0, t.nbytes());
  }
  return t;
}

Tensor Tensor::to(Device d) const {
  TS_CHECK(is_contiguous(), "to({}) needs a contiguous tensor", device_name(d));
  Tensor t = empty(dims(), dtype, d);
  device_copy(t.data, d, data, device, nbytes());
  return t;
}

Tensor Tensor::to_f32() const {
  Tensor src = device == Device::cpu ? *this : to(Device::cpu);
  TS_CHECK(src.is_contiguous(), "to_f32 needs a contiguous tensor");
  Tensor out = empty(dims(), DType::f32);
  float* o = out.ptr<float>();
  int64_t n = numel();
  switch (dtype) {
    case DType::f32: std::memcpy(o, src.data, size_t(n) * 4); break;
    case DType::bf16: {
      auto* s = src.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::f16: {
      auto* s = src.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::f8_e4m3: {
      auto* s = src.ptr<uint8_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = e4m3_to_f32(s[i]);
      break;
    }
    case DType::f8_e8m0: {
      auto* s = src.ptr<uint8_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = e8m0_to_f32(s[i]);
      break;
    }
    default: fail("to_f32: unsupported dtype {}", dtype_name(dtype));
  }
  return out;
}

std::vector<float> Tensor::to_vector_f32() const {
  Tensor f = to_f32();
  return {f.ptr<float>(), f.ptr<float>() + f.numel()};
}

}  // namespace ts
