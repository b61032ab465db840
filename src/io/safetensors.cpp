#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace ts::io {

DType parse_dtype(const std::string& s, const std::string& context) {
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  if (s == "I64") return DType::i64;
  if (s == "I32") return DType::i32;
  if (s == "U8") return DType::u8;
  if (s == "BOOL") return DType::boolean;
  if (s == "F8_E4M3") return DType::f8_e4m3;
  if (s == "F8_E8M0") return DType::f8_e8m0;
  fail("{}: unsupported dtype {} (supported: F32, BF16, F16, I64, I32, U8, BOOL, F8_E4M3, F8_E8M0)", context, s);
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  TS_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("{}: truncated safetensors file ({} bytes, no header)", path, size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  TS_CHECK(p != MAP_FAILED, "{}: mmap failed ({})", path, std::strerror(errno));
  map_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  const char* base = static_cast<const char*>(p);
  uint64_t hlen;
  std::memcpy(&hlen, base, 8);
  TS_CHECK(hlen <= size - 8, "{}: truncated safetensors file (header length {} > file size {})", path,
           hlen, size);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + hlen);
  } catch (const std::exception& e) {
    fail("{}: bad safetensors header: {}", path, e.what());
  }
  TS_CHECK(header.is_object(), "{}: bad safetensors header (not a JSON object)", path);
  data_ = base + 8 + hlen;
  size_t data_size = size - 8 - hlen;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = v;
      continue;
    }
    std::string ctx = path + ": tensor " + name;
    try {
      Entry e;
      e.dtype = parse_dtype(v.at("dtype").get<std::string>(), ctx);
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<size_t>>();
      TS_CHECK(off.size() == 2 && off[0] <= off[1], "{}: bad data_offsets", ctx);
      e.begin = off[0];
      e.end = off[1];
      int64_t n = 1;
      for (auto d : e.shape) n *= d;
      TS_CHECK(e.shape.size() <= size_t(kMaxDims), "{}: rank {} not supported", ctx, e.shape.size());
      TS_CHECK(size_t(n) * dtype_size(e.dtype) == e.end - e.begin,
               "{}: shape {} does not match its byte range", ctx, shape_str(e.shape));
      TS_CHECK(e.end <= data_size, "{}: truncated file (tensor ends at byte {} of {})", ctx, e.end,
               data_size);
      entries_[name] = std::move(e);
    } catch (const nlohmann::json::exception& ex) {
      fail("{}: bad header entry: {}", ctx, ex.what());
    }
  }
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  TS_CHECK(it != entries_.end(), "{}: missing tensor {}", path_, name);
  const Entry& e = it->second;
  return Tensor::from_blob(const_cast<char*>(data_ + e.begin), e.shape, e.dtype, Device::cpu, map_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> r;
  for (auto& [k, _] : entries_) r.push_back(k);
  return r;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  TS_CHECK(fs::is_directory(dir), "model directory {} does not exist", dir);
  Checkpoint c;
  c.dir_ = dir;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      std::ifstream f(index);
      j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail("{}: invalid JSON: {}", index.string(), e.what());
    }
    TS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "{}: no weight_map",
             index.string());
    std::map<std::string, size_t> shard_idx;
    for (auto& [name, shard] : j["weight_map"].items()) {
      std::string s = shard.get<std::string>();
      if (!shard_idx.count(s)) {
        shard_idx[s] = c.files_.size();
        fs::path p = fs::path(dir) / s;
        TS_CHECK(fs::exists(p), "{}: shard {} listed in the index is missing", index.string(), s);
        c.files_.push_back(std::make_shared<SafetensorsFile>(p.string()));
      }
      size_t fi = shard_idx[s];
      TS_CHECK(c.files_[fi]->has(name), "{}: missing tensor {} (listed in the index)",
               c.files_[fi]->path(), name);
      c.where_[name] = fi;
    }
  } else {
    std::vector<fs::path> shards;
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
    TS_CHECK(!shards.empty(), "model directory {} has no *.safetensors files", dir);
    for (auto& p : shards) {
      // Golden files beside a model are not weights.
      if (p.filename().string().rfind("golden", 0) == 0) continue;
      c.files_.push_back(std::make_shared<SafetensorsFile>(p.string()));
      for (auto& n : c.files_.back()->names()) c.where_[n] = c.files_.size() - 1;
    }
    TS_CHECK(!c.files_.empty(), "model directory {} has no weight files", dir);
  }
  return c;
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  TS_CHECK(it != where_.end(), "{}: missing tensor {}", dir_, name);
  return files_[it->second]->get(name);
}

Tensor Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape) const {
  Tensor t = get(name);
  TS_CHECK(t.dims() == shape, "{}: tensor {} has shape {}, expected {}", file_of(name), name,
           t.shape_str(), shape_str(shape));
  return t;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? dir_ : files_[it->second]->path();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (auto& [k, _] : where_) r.push_back(k);
  return r;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t off = 0;
  for (auto& [name, t] : tensors) {
    TS_CHECK(t.device == Device::cpu && t.is_contiguous(), "write_safetensors: {} must be a contiguous host tensor", name);
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.dims()}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';  // keep the data section 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  TS_CHECK(f.good(), "{}: cannot write", path);
  uint64_t hl = h.size();
  f.write(reinterpret_cast<const char*>(&hl), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (auto& [_, t] : tensors) f.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes()));
  TS_CHECK(f.good(), "{}: write failed", path);
}

}  // namespace ts::io
