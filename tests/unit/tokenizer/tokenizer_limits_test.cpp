// tokenizer.json ids bounded by the vocabulary (issue #23): an added-token id of 2^40 was
// truncated to 32 bits, a vocab id of 1e8 allocated 9.7 GB; both are now errors naming the field.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using ts::tok::Tokenizer;

namespace {

nlohmann::json tiny() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 0; c < 26; ++c) vocab[std::string(1, char('a' + c))] = c;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"added_tokens", nlohmann::json::array({{{"id", 26}, {"content", "<s>"}, {"special", true}}})}};
}

std::string error_of(const nlohmann::json& j) {
  try {
    Tokenizer::from_json_string(j.dump(), "t/tokenizer.json");
  } catch (const ts::Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("t/tokenizer.json: ", 0), 0u) << m;
    EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
    return m;
  }
  return "";
}

TEST(TokenizerLimits, TinyLoads) {
  auto t = Tokenizer::from_json_string(tiny().dump());
  EXPECT_EQ(t->vocab_size(), 27);
}

TEST(TokenizerLimits, AddedTokenIdBeyondTheVocabulary) {
  auto j = tiny();
  j["added_tokens"][0]["id"] = int64_t(1) << 40;
  auto e = error_of(j);
  EXPECT_NE(e.find("added_tokens[0].id 1099511627776 is outside the vocabulary"), std::string::npos) << e;
  j["added_tokens"][0]["id"] = 100000000;
  EXPECT_NE(error_of(j).find("outside the vocabulary"), std::string::npos);
  j["added_tokens"][0]["id"] = 1000;  // a gap of reserved ids is fine
  EXPECT_EQ(error_of(j), "");
}

TEST(TokenizerLimits, VocabIdBeyondTheVocabulary) {
  auto j = tiny();
  j["model"]["vocab"]["zz"] = 100000000;
  auto e = error_of(j);
  EXPECT_NE(e.find("model.vocab[\"zz\"] = 100000000 is outside the vocabulary"), std::string::npos) << e;
}

TEST(TokenizerLimits, PostProcessorIds) {
  auto j = tiny();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {int64_t(1) << 40}}, {"tokens", {"<s>"}}}}}}};
  EXPECT_NE(error_of(j).find("must be a token id"), std::string::npos);
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {500};
  EXPECT_NE(error_of(j).find("post_processor adds token id 500"), std::string::npos);
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {26};
  EXPECT_EQ(error_of(j), "");
}

TEST(TokenizerLimits, DeepNestingAndBadNumbers) {
  std::string deep = R"({"model": )" + std::string(1000, '[') + std::string(1000, ']') + "}";
  try {
    Tokenizer::from_json_string(deep, "t/tokenizer.json");
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than 64"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_json_string(R"({"model": {"dropout": 1e400}})", "t/tokenizer.json");
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("t/tokenizer.json: invalid JSON: number overflow"), std::string::npos) << e.what();
  }
}

TEST(TokenizerLimits, FifoIsRejected) {
  fs::path d = fs::temp_directory_path() / ("ts_tok_fifo_" + std::to_string(::getpid()));
  fs::create_directories(d);
  ASSERT_EQ(::mkfifo((d / "tokenizer.json").c_str(), 0600), 0);
  try {
    Tokenizer::from_dir(d.string());
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
