// tokenizer.json "pre_tokenizer": cuts normalized text into words for the model.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ts::tok {

struct Piece {
  uint32_t off, len;
  bool first;  // starts at offset 0 of the input (Metaspace prepend_scheme "first")
};

// Words as spans of `text`, which views either the caller's text or `storage` once a step
// rewrote it (Metaspace, ByteLevel add_prefix_space).
struct PreTokenized {
  std::string_view text;
  std::string storage;
  std::vector<Piece> pieces;
  std::string_view piece(const Piece& p) const { return text.substr(p.off, p.len); }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(PreTokenized& pt) const = 0;
};

// A null JSON value gives nullptr. `byte_level` is set when a ByteLevel step is present; it must
// be the last step, because the model then consumes raw bytes (the byte->char map is implied).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where, bool& byte_level);

}  // namespace ts::tok
