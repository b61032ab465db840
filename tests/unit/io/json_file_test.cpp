// Safe file and JSON reading: regular files only (a FIFO must fail at once, not block), depth
// checked before parsing, errors without nlohmann's exception ids.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/checked.h"
#include "core/error.h"
#include "io/config.h"
#include "io/json_file.h"

namespace fs = std::filesystem;
using namespace ts::io;

namespace {

fs::path tmpdir() {
  fs::path d = fs::temp_directory_path() / ("ts_io_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ts::Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonDepth, CountsNestingOutsideStrings) {
  EXPECT_EQ(json_depth("{}", 64), 1);
  EXPECT_EQ(json_depth(R"({"a": [1, {"b": []}]})", 64), 4);
  EXPECT_EQ(json_depth(R"({"a": "[[[[[[\"[[[["})", 64), 1);
  EXPECT_EQ(json_depth("1", 64), 0);
  std::string deep(50000, '[');
  EXPECT_EQ(json_depth(deep, 64), 65);  // stops early
  EXPECT_NE(error_of([&] { check_json_depth(deep, 64, "body"); }).find("body: JSON nesting deeper than 64"),
            std::string::npos);
  std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_NO_THROW(check_json_depth(ok, 64, "body"));
}

TEST(JsonFile, ErrorsNameTheFileWithoutExceptionIds) {
  auto d = tmpdir();
  std::ofstream(d / "bad.json") << R"({"a": 1e400})";
  std::string e = error_of([&] { read_json_file((d / "bad.json").string()); });
  EXPECT_NE(e.find("bad.json: invalid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("1e400"), std::string::npos) << e;
  EXPECT_EQ(e.find("[json.exception"), std::string::npos) << e;
  std::ofstream(d / "deep.json") << std::string(100, '[') + std::string(100, ']');
  e = error_of([&] { read_json_file((d / "deep.json").string()); });
  EXPECT_NE(e.find("deep.json: JSON nesting deeper than 64"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(JsonFile, FifoAndDirectoryAreRejectedWithoutBlocking) {
  auto d = tmpdir();
  std::string fifo = (d / "config.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = error_of([&] { read_json_file(fifo); });  // would block forever with ifstream
  EXPECT_NE(e.find("is a FIFO"), std::string::npos) << e;
  e = error_of([&] { read_regular_file(d.string()); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  e = error_of([&] { read_regular_file("/dev/zero"); });
  EXPECT_NE(e.find("character device"), std::string::npos) << e;
  e = error_of([&] { load_config(d.string()); });
  EXPECT_NE(e.find("FIFO"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(Checked, MulAddOverflow) {
  EXPECT_EQ(ts::checked_mul(3, 4, "x"), 12);
  EXPECT_THROW(ts::checked_mul(int64_t(1) << 40, int64_t(1) << 40, "x"), ts::Error);
  EXPECT_THROW(ts::checked_add(INT64_MAX, 1, "x"), ts::Error);
  EXPECT_THROW(ts::checked_mul(-1, 2, "x"), ts::Error);
  EXPECT_THROW(ts::checked_mul_u(UINT64_MAX, 2, "x"), ts::Error);
  std::vector<int64_t> dims{1 << 20, 1 << 20, 1 << 20, 1 << 20};
  std::string e = error_of([&] { ts::checked_numel(dims, "t: shape"); });
  EXPECT_NE(e.find("t: shape: size overflow"), std::string::npos) << e;
}

}  // namespace
