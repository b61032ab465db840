// UTF-8 and Unicode helpers the tokenizer needs: tolerant decoding (invalid bytes are units of
// their own, so byte-level tokenizers can still encode them), lossy conversion with the same
// replacement rule as Rust's String::from_utf8_lossy (the HF decoders' behaviour), and the
// normalization forms / lowercase used by tokenizer.json normalizers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ts::tok::unicode {

inline constexpr uint32_t kInvalid = 0xFFFFFFFF;

// Decodes the code point at s[i]; `len` gets its byte length. An invalid or truncated sequence
// yields kInvalid with len 1, so callers can always advance.
uint32_t decode(std::string_view s, size_t i, size_t& len);

void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that is valid UTF-8 and ends on a character boundary.
size_t valid_prefix(std::string_view s);

// Replaces each maximal invalid subsequence with U+FFFD (Rust from_utf8_lossy semantics).
std::string to_valid_lossy(std::string_view bytes);

bool is_whitespace(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
bool is_nonspacing_mark(uint32_t cp);

enum class Form { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, Form form);
std::string lowercase(std::string_view s);

}  // namespace ts::tok::unicode
