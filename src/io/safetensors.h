// safetensors checkpoints, memory-mapped: tensors are views into the mapping (no copy until a
// model converts them). A directory holds one model.safetensors or shards listed in
// model.safetensors.index.json. Every error names the file and, where there is one, the tensor.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ts::io {

// The safetensors format's own bound on the JSON header (100 MB).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  Tensor get(const std::string& name) const;  // host view into the mapping
  std::vector<std::string> names() const;
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;  // byte offsets into the data section (validated: in range, aligned,
                          // tiling the data section exactly)
  };
  std::string path_;
  std::shared_ptr<void> map_;  // munmap on last reference (views hold it too)
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> entries_;
  nlohmann::json metadata_;
};

class Checkpoint {
 public:
  // Opens DIR/model.safetensors.index.json if present, else every DIR/*.safetensors.
  static Checkpoint open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return where_.count(name) > 0 || alias_.count(name) > 0; }
  Tensor get(const std::string& name) const;
  // Same, checking the shape ("tensor X in FILE has shape [..], expected [..]").
  Tensor get(const std::string& name, const std::vector<int64_t>& shape) const;
  // The stored tensors' names (aliases not included).
  std::vector<std::string> names() const;
  std::string file_of(const std::string& name) const;
  // Makes `name` read a tensor a format stores under another name: `stored` as it is, or (with
  // `value` given) a small host tensor derived from it (compressed-tensors' weight_packed read as
  // weight, 1 / weight_global_scale as weight_scale_2: io::adopt_quant_names). Errors (file_of,
  // shape checks) name `stored`'s file.
  void alias(const std::string& name, const std::string& stored, std::optional<Tensor> value = std::nullopt);

 private:
  struct Alias {
    std::string stored;
    std::optional<Tensor> value;
  };
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  std::map<std::string, Alias> alias_;
};

// Writes tensors (host, contiguous) to one safetensors file; metadata values must be strings.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

DType parse_dtype(const std::string& s, const std::string& context);

}  // namespace ts::io
