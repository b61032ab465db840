#include "tokenizer/byte_level.h"

#include "tokenizer/unicode.h"

namespace ts::tok::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // the alphabet lies in [0, 324)
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t c = printable ? static_cast<uint32_t>(b) : next++;
      to_char[b] = c;
      to_byte[c] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }

std::optional<std::string> token_to_bytes(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    size_t len;
    uint32_t cp = unicode::decode(token, i, len);
    if (cp == unicode::kInvalid || cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.to_byte[cp]));
    i += len;
  }
  return out;
}

std::string bytes_to_token(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) unicode::append_utf8(out, tables().to_char[b]);
  return out;
}

}  // namespace ts::tok::byte_level
