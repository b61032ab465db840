// Every case of the Hugging Face goldens (tests/data/tokenizers/*.golden.json): ids, ids with
// special tokens, tokens, decode with and without skipping specials, and the streaming decoder.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using ts::tok::StreamDecoder;
using ts::tok::Tokenizer;

namespace {

struct GoldenSet {
  const char* name;
  const char* tokenizer_dir;  // relative to the repo root
};

const GoldenSet kSets[] = {
    {"bytelevel-1k", "tests/data/tokenizers/bytelevel-1k"},
    {"metaspace-1k", "tests/data/tokenizers/metaspace-1k"},
    {"pycoder-8k", "models/pycoder"},
};

void PrintTo(const GoldenSet& s, std::ostream* os) { *os << s.name; }

nlohmann::json load_golden(const std::string& name) {
  std::ifstream f(std::string(TS_SOURCE_DIR) + "/tests/data/tokenizers/" + name + ".golden.json");
  EXPECT_TRUE(f.good()) << name;
  return nlohmann::json::parse(f);
}

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip, std::vector<std::string>* deltas) {
  StreamDecoder sd(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string d = sd.push(id);
    if (deltas) deltas->push_back(d);
    out += d;
  }
  std::string tail = sd.flush();
  if (deltas) deltas->push_back(tail);
  return out + tail;
}

class Golden : public ::testing::TestWithParam<GoldenSet> {};

TEST_P(Golden, AllCases) {
  const GoldenSet& set = GetParam();
  auto tok = Tokenizer::from_dir(std::string(TS_SOURCE_DIR) + "/" + set.tokenizer_dir);
  nlohmann::json g = load_golden(set.name);
  EXPECT_EQ(tok->vocab_size(), g["vocab_size"].get<int32_t>());
  int passed = 0, total = 0;
  for (const auto& c : g["cases"]) {
    ++total;
    std::string text = c["text"];
    auto ids = c["ids"].get<std::vector<int32_t>>();
    auto ids_special = c["ids_with_special"].get<std::vector<int32_t>>();
    auto tokens = c["tokens"].get<std::vector<std::string>>();
    std::string decoded = c["decoded"], decoded_skip = c["decoded_skip_special"];
    bool ok = true;
    auto check = [&](bool cond, const char* what) {
      EXPECT_TRUE(cond) << set.name << " " << what << " for text " << nlohmann::json(text).dump();
      ok = ok && cond;
    };
    std::vector<int32_t> got = tok->encode(text);
    check(got == ids, "ids");
    check(tok->encode(text, true) == ids_special, "ids_with_special");
    std::vector<std::string> got_tokens;
    for (int32_t id : ids) got_tokens.push_back(tok->id_to_token(id));
    check(got_tokens == tokens, "tokens");
    check(tok->decode(ids) == decoded, "decoded");
    check(tok->decode(ids, true) == decoded_skip, "decoded_skip_special");
    check(tok->decode(ids_special, true) == decoded_skip, "decoded_skip_special (with specials)");
    // Streaming, one id at a time: same text, and no delta ends inside a UTF-8 character.
    for (bool skip : {false, true}) {
      for (const auto* seq : {&ids, &ids_special}) {
        std::vector<std::string> deltas;
        std::string streamed = stream_all(*tok, *seq, skip, &deltas);
        check(streamed == tok->decode(*seq, skip), skip ? "stream(skip_special)" : "stream");
        for (const std::string& d : deltas) check(ts::tok::unicode::valid_prefix(d) == d.size(), "delta is valid UTF-8");
      }
    }
    passed += ok;
  }
  std::printf("[ golden ] %s: %d/%d cases pass\n", set.name, passed, total);
  EXPECT_EQ(passed, total);
  EXPECT_EQ(total, 30);
}

INSTANTIATE_TEST_SUITE_P(tokenizer, Golden, ::testing::ValuesIn(kSets),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
