// tokenizer.json "normalizer": applied to the text between added tokens, before pre-tokenizing.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace ts::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// `where` is the JSON path used in error messages (e.g. "normalizer.normalizers[1]").
// A null JSON value gives nullptr.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace ts::tok
