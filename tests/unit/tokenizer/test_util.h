// Helpers for tokenizer tests: fixture paths and variants of the fixture tokenizer.json files.
#pragma once
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace ts::tok::test {

inline std::string repo(const std::string& rel) { return std::string(TS_SOURCE_DIR) + "/" + rel; }

inline nlohmann::json read_json(const std::string& rel) {
  std::ifstream f(repo(rel));
  return nlohmann::json::parse(f);
}

inline nlohmann::json bytelevel_json() { return read_json("tests/data/tokenizers/bytelevel-1k/tokenizer.json"); }
inline nlohmann::json metaspace_json() { return read_json("tests/data/tokenizers/metaspace-1k/tokenizer.json"); }

inline std::shared_ptr<Tokenizer> from_json(const nlohmann::json& j) { return Tokenizer::from_json_string(j.dump()); }

}  // namespace ts::tok::test
