// GPT-2 byte-level alphabet: every byte maps to one printable code point, so byte-level vocab
// entries can be stored and matched as the raw bytes they stand for.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ts::tok::byte_level {

// Code point that stands for byte b (printable bytes map to themselves, the rest to U+0100...).
uint32_t byte_to_char(uint8_t b);

// The raw bytes a byte-level token string stands for; nullopt if it has a character outside
// the 256-character alphabet (e.g. an added token such as "<｜begin▁of▁sentence｜>").
std::optional<std::string> token_to_bytes(std::string_view token);

std::string bytes_to_token(std::string_view bytes);

}  // namespace ts::tok::byte_level
