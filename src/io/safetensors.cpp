#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checked.h"
#include "io/json_file.h"

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
  size_t size = 0;
  int fd = open_regular_file(path, size);  // a FIFO or device fails here instead of blocking
  if (size < 8) {
    ::close(fd);
    fail("{}: truncated safetensors file ({} bytes, no header)", path, size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  TS_CHECK(p != MAP_FAILED, "{}: mmap failed ({})", path, std::strerror(mmap_errno));
  map_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  const char* base = static_cast<const char*>(p);
  uint64_t hlen;
  std::memcpy(&hlen, base, 8);
  TS_CHECK(hlen <= size - 8, "{}: truncated safetensors file (header length {} > file size {})", path,
           hlen, size);
  TS_CHECK(hlen <= kMaxSafetensorsHeader, "{}: safetensors header length {} exceeds the limit {}", path, hlen,
           kMaxSafetensorsHeader);
  nlohmann::json header;
  std::string_view htext(base + 8, size_t(hlen));
  try {
    check_json_depth(htext, kDefaultMaxJsonDepth, path + ": safetensors header");
    header = nlohmann::json::parse(htext.begin(), htext.end());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: bad safetensors header: {}", path, json_error_text(e));
  } catch (const Error& e) {
    fail("{}: bad safetensors header: {}", path, e.what());
  }
  TS_CHECK(header.is_object(), "{}: bad safetensors header (not a JSON object)", path);
  data_ = base + 8 + hlen;
  uint64_t data_size = size - 8 - hlen;
  for (auto& item : header.items()) {
    const std::string& name = item.key();
    const nlohmann::json& v = item.value();  // (a structured binding cannot be captured below)
    if (name == "__metadata__") {
      TS_CHECK(v.is_object(), "{}: __metadata__ must be an object", path);
      metadata_ = v;
      continue;
    }
    std::string ctx = path + ": tensor " + name;
    TS_CHECK(v.is_object(), "{}: header entry must be an object", ctx);
    auto field = [&](const char* k) -> const nlohmann::json& {
      TS_CHECK(v.contains(k), "{}: header entry has no {}", ctx, k);
      return v[k];
    };
    const auto& jd = field("dtype");
    TS_CHECK(jd.is_string(), "{}: dtype must be a string", ctx);
    Entry e;
    e.dtype = parse_dtype(jd.get<std::string>(), ctx);
    const auto& js = field("shape");
    TS_CHECK(js.is_array(), "{}: shape must be an array", ctx);
    TS_CHECK(js.size() <= size_t(kMaxDims), "{}: rank {} not supported", ctx, js.size());
    for (size_t i = 0; i < js.size(); ++i) {
      TS_CHECK(js[i].is_number_unsigned() || (js[i].is_number_integer() && js[i].get<int64_t>() >= 0),
               "{}: shape[{}] must be a non-negative integer", ctx, i);
      TS_CHECK(js[i].get<uint64_t>() <= uint64_t(INT64_MAX), "{}: shape[{}] is too large", ctx, i);
      e.shape.push_back(js[i].get<int64_t>());
    }
    const auto& jo = field("data_offsets");
    TS_CHECK(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
             "{}: data_offsets must be two non-negative integers", ctx);
    e.begin = jo[0].get<uint64_t>();
    e.end = jo[1].get<uint64_t>();
    TS_CHECK(e.begin <= e.end, "{}: bad data_offsets [{}, {}] (begin after end)", ctx, e.begin, e.end);
    TS_CHECK(e.end <= data_size, "{}: truncated file (tensor ends at byte {} of {})", ctx, e.end, data_size);
    uint64_t nbytes = checked_mul_u(uint64_t(checked_numel(e.shape, ctx + ": shape")), dtype_size(e.dtype),
                                    ctx + ": byte size");
    TS_CHECK(nbytes == e.end - e.begin, "{}: shape {} ({} bytes) does not match its byte range [{}, {}]", ctx,
             shape_str(e.shape), nbytes, e.begin, e.end);
    TS_CHECK(e.begin % dtype_size(e.dtype) == 0, "{}: data offset {} is not aligned to its dtype ({} bytes)", ctx,
             e.begin, dtype_size(e.dtype));
    entries_[name] = std::move(e);
  }
  // The tensors must tile the data section exactly: no overlap (two names for the same bytes, or
  // a header off by some bytes), no holes, nothing past the last tensor.
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (auto& [n, e] : entries_) order.emplace_back(&n, &e);
  std::sort(order.begin(), order.end(), [](auto& a, auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  uint64_t at = 0;
  const std::string* prev = nullptr;
  for (auto& [n, e] : order) {
    if (e->begin < at)
      fail("{}: tensor {} (bytes [{}, {})) overlaps tensor {}", path, *n, e->begin, e->end, prev ? *prev : "");
    if (e->begin > at)
      fail("{}: tensor {} starts at byte {}, leaving a hole after byte {} of the data section", path, *n, e->begin, at);
    at = e->end;
    prev = n;
  }
  TS_CHECK(at == data_size, "{}: the tensors cover {} bytes but the data section has {} (wrong header length?)", path,
           at, data_size);
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
    nlohmann::json j = read_json_file(index.string());
    TS_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "{}: no weight_map",
             index.string());
    std::map<std::string, size_t> shard_idx;
    for (auto& [name, shard] : j["weight_map"].items()) {
      TS_CHECK(shard.is_string(), "{}: weight_map[{:?}] must be a file name (string)", index.string(), name);
      std::string s = shard.get<std::string>();
      // Shards live in the model directory: no absolute paths, no "..".
      TS_CHECK(!s.empty() && s[0] != '/' && fs::path(s).lexically_normal().string().rfind("..", 0) != 0,
               "{}: weight_map[{:?}] = {:?} is not a file inside the model directory", index.string(), name, s);
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
  if (it == where_.end()) {
    auto a = alias_.find(name);
    TS_CHECK(a != alias_.end(), "{}: missing tensor {}", dir_, name);
    return a->second.value ? *a->second.value : get(a->second.stored);
  }
  return files_[it->second]->get(name);
}

void Checkpoint::alias(const std::string& name, const std::string& stored, std::optional<Tensor> value) {
  TS_CHECK(where_.count(stored), "{}: alias {} of a missing tensor {}", dir_, name, stored);
  TS_CHECK(!where_.count(name), "{}: alias {} would hide the stored tensor of that name", file_of(stored), name);
  alias_[name] = Alias{stored, std::move(value)};
}

Tensor Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape) const {
  Tensor t = get(name);
  TS_CHECK(t.dims() == shape, "{}: tensor {} has shape {}, expected {}", file_of(name), name,
           t.shape_str(), shape_str(shape));
  return t;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it != where_.end()) return files_[it->second]->path();
  auto a = alias_.find(name);
  return a == alias_.end() ? dir_ : file_of(a->second.stored);
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
  // The data section has no holes and every tensor starts aligned to its element size (what the
  // reader checks, and what the safetensors library writes): lay tensors out by element size,
  // largest first, keeping the caller's order within one size. Each tensor's byte size is a
  // multiple of its element size, so every offset stays aligned.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });
  size_t off = 0;
  for (size_t i : order) {
    auto& [name, t] = tensors[i];
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
  for (size_t i : order) f.write(static_cast<const char*>(tensors[i].second.data), std::streamsize(tensors[i].second.nbytes()));
  TS_CHECK(f.good(), "{}: write failed", path);
}

}  // namespace ts::io
