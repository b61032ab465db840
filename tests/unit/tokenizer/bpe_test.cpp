// The BPE merge loop (rank-array for short words, heap for long ones, word cache) against a
// deliberately naive reference written from the definition: repeatedly merge the adjacent pair
// with the lowest merge rank, leftmost first.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "test_util.h"
#include "tokenizer/byte_level.h"

namespace ts::tok {
namespace {

class NaiveBpe {
 public:
  explicit NaiveBpe(const nlohmann::json& model) {
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) vocab_[it.key()] = it.value();
    int rank = 0;
    for (const auto& m : model["merges"]) ranks_[{m[0].get<std::string>(), m[1].get<std::string>()}] = rank++;
  }
  // `units`: the initial symbols (characters of the mapped word).
  std::vector<int32_t> encode(std::vector<std::string> s) const {
    for (;;) {
      int best = -1, best_rank = INT32_MAX;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto it = ranks_.find({s[i], s[i + 1]});
        if (it != ranks_.end() && it->second < best_rank) best_rank = it->second, best = static_cast<int>(i);
      }
      if (best < 0) break;
      s[best] += s[best + 1];
      s.erase(s.begin() + best + 1);
    }
    std::vector<int32_t> ids;
    for (const auto& t : s) ids.push_back(vocab_.at(t));
    return ids;
  }
  bool has(const std::string& t) const { return vocab_.count(t) > 0; }
  int32_t id(const std::string& t) const { return vocab_.at(t); }

 private:
  std::map<std::string, int32_t> vocab_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
};

std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xC0) == 0x80) ++len;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// Byte-level (ignore_merges off, so every word goes through the merge loop): letter runs are
// single pre-tokenized words; lengths straddle the short/heap switch and the cache limit.
TEST(tokenizer_bpe, ByteLevelMatchesNaive) {
  nlohmann::json j = test::bytelevel_json();
  j["model"]["ignore_merges"] = false;
  auto tok = test::from_json(j);
  NaiveBpe ref(j["model"]);
  std::mt19937 rng(7);
  const std::string alphabet = "etaoinshrdlucmfwypvbgkqjxz";
  for (int n = 0; n < 400; ++n) {
    size_t len = 1 + rng() % (n < 300 ? 60 : 400);
    std::string w;
    for (size_t i = 0; i < len; ++i) w += alphabet[rng() % (rng() % 3 ? 8 : alphabet.size())];
    for (int rep = 0; rep < 2; ++rep)  // the second time comes from the cache
      ASSERT_EQ(tok->encode(w), ref.encode(chars(byte_level::bytes_to_token(w)))) << w;
  }
}

// SentencePiece-style: "▁" + the text is one word (no pre-tokenizer); long runs without spaces
// take the heap path.
TEST(tokenizer_bpe, SentencePieceMatchesNaive) {
  nlohmann::json j = test::metaspace_json();
  auto tok = test::from_json(j);
  NaiveBpe ref(j["model"]);
  std::mt19937 rng(11);
  const std::string alphabet = "etaoinshrdlucmfwypvbgkqjxz";
  for (int n = 0; n < 300; ++n) {
    size_t len = 1 + rng() % (n < 200 ? 40 : 500);
    std::string w;
    for (size_t i = 0; i < len; ++i) w += alphabet[rng() % (rng() % 3 ? 8 : alphabet.size())];
    ASSERT_EQ(tok->encode(w), ref.encode(chars("\xE2\x96\x81" + w))) << w;
  }
}

// ignore_merges: a word that is in the vocabulary is one token even if merges would split it.
TEST(tokenizer_bpe, IgnoreMerges) {
  nlohmann::json j = test::bytelevel_json();
  j["model"]["vocab"]["zqx"] = 1024;  // reachable by no merge
  auto with = test::from_json(j);
  EXPECT_EQ(with->encode("zqx"), std::vector<int32_t>{1024});
  j["model"]["ignore_merges"] = false;
  EXPECT_NE(test::from_json(j)->encode("zqx"), std::vector<int32_t>{1024});
}

// unk handling without byte fallback: unknown characters become unk, fused when fuse_unk.
TEST(tokenizer_bpe, UnknownCharacters) {
  nlohmann::json j = test::metaspace_json();
  j["model"]["byte_fallback"] = false;
  auto fused = test::from_json(j);
  auto ids = fused->encode("a\xE2\x98\x83\xE2\x98\x83");  // a☃☃
  EXPECT_EQ(ids.back(), 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 1);
  j["model"]["fuse_unk"] = false;
  ids = test::from_json(j)->encode("a\xE2\x98\x83\xE2\x98\x83");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 2);
  // No unk token: unknown characters are dropped, as HF does.
  j["model"]["unk_token"] = nullptr;
  ids = test::from_json(j)->encode("a\xE2\x98\x83");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0);
  EXPECT_EQ(test::from_json(j)->decode(ids), "a");
}

// Merges may be written "a b" (older files) or ["a", "b"].
TEST(tokenizer_bpe, LegacyMergeStrings) {
  nlohmann::json j = test::bytelevel_json();
  nlohmann::json legacy = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"]) legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  auto a = test::from_json(j);
  j["model"]["merges"] = legacy;
  auto b = test::from_json(j);
  for (std::string text : {"Hello world", "def f(x):\n    return x**2  # square\n"}) EXPECT_EQ(a->encode(text), b->encode(text));
}

}  // namespace
}  // namespace ts::tok
