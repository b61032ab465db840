// Tensor: a typed, shaped view of memory on one device. Storage is shared (mmap'd checkpoint,
// host heap, or device memory) and kept alive by `owner`; views never copy.
// Shapes are row-major with element strides; ops accept a strided leading dimension (rows of a
// larger buffer) and require the last dimension to be contiguous unless they say otherwise.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace ts {

// f8_e4m3 / f8_e8m0: quantized checkpoints' storage types (values, UE8M0 scales); no op computes
// in them, the loader dequantizes (src/io/quant_config.h, src/core/fp8.h).
enum class DType : uint8_t { f32, bf16, f16, i64, i32, u8, boolean, f8_e4m3, f8_e8m0 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* device_name(Device d);

// bf16 <-> f32 on the host (round-to-nearest-even, NaN kept quiet).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements
  std::shared_ptr<void> owner;             // keeps the storage alive

  bool defined() const { return data != nullptr || numel() == 0; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  // Rows = product of all dims but the last; row stride must be uniform (checked).
  int64_t rows() const;
  int64_t row_stride() const;
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_str() const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Views (no copy).
  Tensor narrow(int dim, int64_t start, int64_t len) const;
  Tensor slice_rows(int64_t begin, int64_t end) const { return narrow(0, begin, end - begin); }
  Tensor view(std::vector<int64_t> new_shape) const;  // contiguous only; one -1 allowed
  Tensor row(int64_t i) const;                         // drops dim 0

  // Allocation. Host memory is 64-byte aligned; CUDA memory comes from the device allocator.
  static Tensor empty(std::vector<int64_t> shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, Device device = Device::cpu);
  // Wraps memory owned elsewhere.
  static Tensor from_blob(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                          std::shared_ptr<void> owner = nullptr);

  // Host-side conversion helpers (for loading and tests).
  Tensor to(Device d) const;          // copy to another device (contiguous result)
  Tensor to_f32() const;              // host copy converted to f32 (from bf16/f16/f32)
  std::vector<float> to_vector_f32() const;
};

void set_contiguous_strides(Tensor& t);

}  // namespace ts
