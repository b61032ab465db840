// tokenizer.json "decoder": token strings -> text. Each step rewrites the list of token
// strings (HF's decode_chain); the final text is their concatenation.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ts::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void chain(std::vector<std::string>& tokens) const = 0;
  // True for a lone ByteLevel decoder: the tokenizer then decodes through per-id byte tables.
  virtual bool is_byte_level() const { return false; }
};

// A null JSON value gives nullptr (tokens are then joined with spaces, as HF does).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace ts::tok
