// libFuzzer target: a safetensors file (header + data) and, when the input starts with '{', a
// model.safetensors.index.json next to one valid shard. The loader must reject every bad header
// with a ts::Error (never read outside the mapping: ASan checks every tensor byte below).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/quant_config.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {
const fs::path& dir() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("ts_fuzz_st_" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}
void write(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (size > 0 && data[0] == '{') {
      fs::path d = dir() / "ckpt";
      fs::create_directories(d);
      write(d / "model.safetensors.index.json", data, size);
      std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
      while (h.size() % 8) h += ' ';
      uint64_t hl = h.size();
      std::string shard(reinterpret_cast<const char*>(&hl), 8);
      shard += h + std::string(8, '\0');
      write(d / "a.safetensors", reinterpret_cast<const uint8_t*>(shard.data()), shard.size());
      auto c = ts::io::Checkpoint::open(d.string());
      for (auto& n : c.names()) (void)c.get(n);
    } else {
      fs::path p = dir() / "model.safetensors";
      write(p, data, size);
      ts::io::SafetensorsFile f(p.string());
      volatile uint8_t sink = 0;
      for (auto& n : f.names()) {
        ts::Tensor t = f.get(n);
        const auto* b = static_cast<const uint8_t*>(t.data);
        for (size_t i = 0; i < t.nbytes(); ++i) sink = sink ^ b[i];
      }
      // The renames of quantized formats read whatever tensors a file holds (names, dtypes, scalars).
      auto c = ts::io::Checkpoint::open(dir().string());
      ts::io::adopt_quant_names(c);
      for (auto& n : c.names())
        if (c.has(n + "_2")) (void)c.get(n + "_2");
    }
  } catch (const ts::Error&) {
  }
  return 0;
}
