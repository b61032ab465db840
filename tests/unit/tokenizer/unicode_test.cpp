#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

using unicode::Form;

TEST(tokenizer_unicode, LossyMatchesRustFromUtf8Lossy) {
  EXPECT_EQ(unicode::to_valid_lossy("abc"), "abc");
  // A truncated 3-byte sequence is one maximal subpart: one U+FFFD.
  EXPECT_EQ(unicode::to_valid_lossy("a\xE4\xB8"), "a\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_lossy("\xE4\xB8z"), "\xEF\xBF\xBDz");
  // Bytes that can never start a sequence are one U+FFFD each.
  EXPECT_EQ(unicode::to_valid_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(unicode::to_valid_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(unicode::to_valid_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(tokenizer_unicode, ValidPrefix) {
  EXPECT_EQ(unicode::valid_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(unicode::valid_prefix("\xE4\xB8\xAD"), 3u);
  EXPECT_EQ(unicode::valid_prefix(""), 0u);
}

TEST(tokenizer_unicode, Normalization) {
  // é precomposed vs e + combining acute.
  EXPECT_EQ(unicode::normalize("e\xCC\x81", Form::NFC), "\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xC3\xA9", Form::NFD), "e\xCC\x81");
  // Canonical reordering: dot below (220) before acute (230), then composition.
  EXPECT_EQ(unicode::normalize("a\xCC\x81\xCC\xA3", Form::NFD), "a\xCC\xA3\xCC\x81");
  // Hangul: 한 = U+1112 U+1161 U+11AB.
  EXPECT_EQ(unicode::normalize("\xED\x95\x9C", Form::NFD), "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");
  EXPECT_EQ(unicode::normalize("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", Form::NFC), "\xED\x95\x9C");
  // Compatibility: ﬁ -> fi, ½ -> 1⁄2, NBSP -> space; NFC leaves them alone.
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", Form::NFKC), "fi");
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", Form::NFC), "\xEF\xAC\x81");
  EXPECT_EQ(unicode::normalize("\xC2\xA0", Form::NFKC), " ");
  // Composition exclusions stay decomposed under NFC (U+0958 DEVANAGARI QA).
  EXPECT_EQ(unicode::normalize("\xE0\xA5\x98", Form::NFC), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Invalid bytes pass through untouched.
  EXPECT_EQ(unicode::normalize("e\xFF\xCC\x81", Form::NFC), "e\xFF\xCC\x81");
  EXPECT_EQ(unicode::normalize("plain ascii", Form::NFKD), "plain ascii");
}

TEST(tokenizer_unicode, Lowercase) {
  EXPECT_EQ(unicode::lowercase("HeLLo ÀÉ ΣΑΣ"), "hello àé σασ");
  EXPECT_EQ(unicode::lowercase("\xC4\xB0"), "i\xCC\x87");  // İ -> i + combining dot
}

TEST(tokenizer_unicode, Whitespace) {
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0x85u, 0xA0u, 0x3000u, 0x2009u}) EXPECT_TRUE(unicode::is_whitespace(cp)) << cp;
  for (uint32_t cp : {0x41u, 0x200Bu, 0xFEFFu}) EXPECT_FALSE(unicode::is_whitespace(cp)) << cp;
}

TEST(tokenizer_byte_level, Alphabet) {
  EXPECT_EQ(byte_level::bytes_to_token(" "), "\xC4\xA0");  // Ġ
  EXPECT_EQ(byte_level::bytes_to_token("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level::bytes_to_token("a"), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level::token_to_bytes(byte_level::bytes_to_token(all)), all);
  EXPECT_EQ(byte_level::token_to_bytes("\xE2\x96\x81"), std::nullopt);  // ▁ is not in the alphabet
}

TEST(tokenizer_regex, OnigurumaWhitespace) {
  EXPECT_EQ(Regex::from_oniguruma(R"(\s+(?!\S))"), R"([\s\x{85}]+(?![^\s\x{85}]))");
  EXPECT_EQ(Regex::from_oniguruma(R"([^\s\p{L}])"), R"([^\s\x{85}\p{L}])");
  EXPECT_EQ(Regex::from_oniguruma(R"(\\s)"), R"(\\s)");    // an escaped backslash, then 's'
  EXPECT_EQ(Regex::from_oniguruma(R"([]\s])"), R"([]\s\x{85}])");  // ']' first is a member
  Regex re(R"(\s+)", "test");
  size_t b, e;
  ASSERT_TRUE(re.search("a\xC2\x85" "b", 0, b, e));  // U+0085 (NEL) is whitespace, as in Oniguruma
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(e, 3u);
}

TEST(tokenizer_regex, InvalidUtf8NeverMatches) {
  Regex re(R"(\p{L}+)", "test");
  std::vector<std::pair<size_t, size_t>> m;
  re.for_each_match("ab\xFF" "cd", [&](size_t b, size_t e) { m.emplace_back(b, e); });
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{3, 5}));
}

TEST(tokenizer_regex, EmptyMatchesAdvance) {
  Regex re(R"(x*)", "test");
  std::vector<std::pair<size_t, size_t>> m;
  re.for_each_match("axxb", [&](size_t b, size_t e) { m.emplace_back(b, e); });
  // onig find_iter: (0,0), (1,3), then the empty match at 3 right after a match is skipped, (4,4).
  std::vector<std::pair<size_t, size_t>> want{{0, 0}, {1, 3}, {4, 4}};
  EXPECT_EQ(m, want);
}

TEST(tokenizer_regex, BadPatternNamesField) {
  try {
    Regex re("(", "pre_tokenizer.pattern.Regex");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer.pattern.Regex"), std::string::npos);
  }
}

}  // namespace
}  // namespace ts::tok
