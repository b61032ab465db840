// safetensors header validation: offsets in range, aligned to the dtype, non-overlapping and
// tiling the data section exactly; sizes computed without overflow; errors name file and tensor.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using ts::io::SafetensorsFile;

namespace {

struct Dir {
  fs::path p = fs::temp_directory_path() / ("ts_st_test_" + std::to_string(::getpid()));
  Dir() { fs::create_directories(p); }
  ~Dir() { fs::remove_all(p); }
};

// Writes [u64 header length][header (padded to `pad` with spaces)][data_bytes zero bytes].
std::string write(const fs::path& dir, const std::string& header, size_t data_bytes, int64_t hlen_delta = 0) {
  std::string h = header;
  while ((h.size() + 8) % 8) h += ' ';
  std::string path = (dir / "model.safetensors").string();
  std::ofstream f(path, std::ios::binary);
  uint64_t hl = uint64_t(int64_t(h.size()) + hlen_delta);
  f.write(reinterpret_cast<const char*>(&hl), 8);
  f.write(h.data(), std::streamsize(h.size()));
  std::string data(data_bytes, '\0');
  f.write(data.data(), std::streamsize(data.size()));
  return path;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const ts::Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind(path, 0), 0u) << m;  // names the file
    EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
    return m;
  }
  return "";
}

TEST(Safetensors, ValidFileLoads) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})", 32);
  SafetensorsFile f(p);
  EXPECT_TRUE(f.has("a"));
  EXPECT_EQ(f.get("b").numel(), 4);
}

TEST(Safetensors, MisalignedOffset) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", 6);
  auto e = error_of(p);
  EXPECT_NE(e.find("tensor b"), std::string::npos) << e;
  EXPECT_NE(e.find("not aligned"), std::string::npos) << e;
}

TEST(Safetensors, OverlappingTensors) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16);
  auto e = error_of(p);
  EXPECT_NE(e.find("overlaps"), std::string::npos) << e;
}

TEST(Safetensors, HoleAndTrailingBytes) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16);
  EXPECT_NE(error_of(p).find("hole"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 16);
  EXPECT_NE(error_of(p).find("cover 8 bytes but the data section has 16"), std::string::npos);
}

TEST(Safetensors, HeaderLengthShortByOne) {
  Dir d;
  // The header is padded, so one byte less still parses, but the data section then starts a
  // byte early: the tensors no longer cover it exactly.
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )", 8, -1);
  auto e = error_of(p);
  EXPECT_NE(e.find("wrong header length"), std::string::npos) << e;
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, 1000);
  EXPECT_NE(error_of(p).find("truncated"), std::string::npos);
}

TEST(Safetensors, ShapeOverflowAndMismatch) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0);
  auto e = error_of(p);
  EXPECT_NE(e.find("tensor a: shape: size overflow"), std::string::npos) << e;
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("overflow"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("does not match its byte range"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("shape[0] must be a non-negative integer"), std::string::npos);
}

TEST(Safetensors, BadEntries) {
  Dir d;
  auto p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
  EXPECT_NE(error_of(p).find("begin after end"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8);
  EXPECT_NE(error_of(p).find("data_offsets must be two non-negative integers"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("tensor a: dtype must be a string"), std::string::npos);
  p = write(d.p, R"({"a":[1,2]})", 8);
  EXPECT_NE(error_of(p).find("tensor a: header entry must be an object"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":3})", 8);
  EXPECT_NE(error_of(p).find("__metadata__"), std::string::npos);
  p = write(d.p, std::string(200, '[') + std::string(200, ']'), 0);
  EXPECT_NE(error_of(p).find("nesting"), std::string::npos);
  p = write(d.p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1e400]}})", 8);
  EXPECT_NE(error_of(p).find("bad safetensors header"), std::string::npos);
}

TEST(Safetensors, FifoIsRejectedWithoutBlocking) {
  Dir d;
  std::string fifo = (d.p / "model.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of(fifo).find("FIFO"), std::string::npos);
}

TEST(Safetensors, IndexShardOutsideTheDirectory) {
  Dir d;
  std::ofstream(d.p / "model.safetensors.index.json") << R"({"weight_map": {"a": "../../etc/passwd"}})";
  try {
    ts::io::Checkpoint::open(d.p.string());
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a file inside the model directory"), std::string::npos) << e.what();
  }
  std::ofstream(d.p / "model.safetensors.index.json") << R"({"weight_map": {"a": 5}})";
  try {
    ts::io::Checkpoint::open(d.p.string());
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_map[\"a\"] must be a file name"), std::string::npos) << e.what();
  }
}

}  // namespace
