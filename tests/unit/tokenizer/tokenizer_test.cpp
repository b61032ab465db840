// Tokenizer behaviour beyond the goldens: added-token matching rules, invalid UTF-8, real
// tokenizer shapes (NFC, Metaspace pre-tokenizer, DeepSeek-style splits), config, errors, threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace ts::tok {
namespace {

using test::from_json;
using test::repo;
using Ids = std::vector<int32_t>;

Ids concat(std::initializer_list<Ids> parts) {
  Ids r;
  for (const auto& p : parts) r.insert(r.end(), p.begin(), p.end());
  return r;
}

TEST(tokenizer, EmptyInput) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->encode("", true), Ids{0});
  EXPECT_EQ(tok->decode(Ids{}), "");
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.flush(), "");
}

TEST(tokenizer, SpecialTokensInText) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  Ids eot{4};
  EXPECT_EQ(tok->encode("<|eot_id|><|eot_id|>"), (Ids{4, 4}));
  EXPECT_EQ(tok->encode("a<|eot_id|>b"), concat({tok->encode("a"), eot, tok->encode("b")}));
  // An incomplete special token is ordinary text.
  Ids partial = tok->encode("<|eot_id|");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), 4), 0);
  EXPECT_TRUE(tok->is_special(4));
  EXPECT_FALSE(tok->is_special(44));
  EXPECT_EQ(tok->decode(Ids{4, 44}, true), "H");
  EXPECT_EQ(tok->decode(Ids{4, 44}, false), "<|eot_id|>H");
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 4);
  EXPECT_EQ(tok->id_to_token(4), "<|eot_id|>");
  EXPECT_EQ(tok->token_to_id("no such token"), std::nullopt);
}

// Added tokens: longest match wins, and single_word / lstrip / rstrip / normalized behave as in HF.
TEST(tokenizer, AddedTokenRules) {
  nlohmann::json j = test::bytelevel_json();
  auto add = [&](int id, const std::string& content, bool special, bool single_word, bool lstrip, bool rstrip) {
    j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
                                 {"rstrip", rstrip}, {"normalized", false}, {"special", special}});
  };
  add(1024, "<tag>", false, false, false, false);
  add(1025, "<tag>x", false, false, false, false);
  add(1026, "<mask>", true, false, true, true);
  add(1027, "word", false, true, false, false);
  auto tok = from_json(j);
  auto plain = test::from_json(test::bytelevel_json());
  EXPECT_EQ(tok->vocab_size(), 1028);
  EXPECT_EQ(tok->encode("<tag>x"), Ids{1025});  // longest at the leftmost position
  EXPECT_EQ(tok->encode("<tag>y"), concat({Ids{1024}, plain->encode("y")}));
  // lstrip/rstrip swallow the whitespace around the token.
  EXPECT_EQ(tok->encode("a  <mask>  b"), concat({plain->encode("a"), Ids{1026}, plain->encode("b")}));
  // single_word: only when not glued to word characters.
  EXPECT_EQ(tok->encode("a word b"), concat({plain->encode("a "), Ids{1027}, plain->encode(" b")}));
  EXPECT_EQ(tok->encode("swords"), plain->encode("swords"));
  EXPECT_EQ(tok->encode("word"), Ids{1027});
  // Non-special added tokens survive skip_special_tokens.
  EXPECT_EQ(tok->decode(Ids{1024, 1026}, true), "<tag>");
}

// normalized=true added tokens are matched after normalization, against their normalized content.
TEST(tokenizer, NormalizedAddedToken) {
  nlohmann::json j = test::metaspace_json();
  int32_t id = 1027;
  j["added_tokens"].push_back({{"id", id}, {"content", "hello"}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", true}, {"special", false}});
  auto tok = from_json(j);
  Ids ids = tok->encode("hello there");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], id);  // "▁hello" after Prepend + Replace
}

// Byte-level models take any bytes: invalid UTF-8 is encoded byte by byte, decoded lossily.
TEST(tokenizer, InvalidUtf8ByteLevel) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  std::string text = "ok \xff\xfe and \xe4\xb8 end\xc3";
  Ids ids = tok->encode(text);
  std::string raw;
  for (int32_t id : ids) raw += *byte_level::token_to_bytes(tok->id_to_token(id));
  EXPECT_EQ(raw, text);  // the ids spell out exactly the input bytes
  EXPECT_EQ(tok->decode(ids), unicode::to_valid_lossy(text));
  EXPECT_EQ(tok->decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD and \xEF\xBF\xBD end\xEF\xBF\xBD");
  StreamDecoder sd(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  EXPECT_EQ(streamed, tok->decode(ids));
}

// SentencePiece-style models fall back to <0xNN> tokens for bytes that are not characters.
TEST(tokenizer, InvalidUtf8ByteFallback) {
  auto tok = Tokenizer::from_dir(repo("tests/data/tokenizers/metaspace-1k"));
  Ids ids = tok->encode("a\xff");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(tok->id_to_token(ids.back()), "<0xFF>");
  EXPECT_EQ(tok->decode(ids), "a\xEF\xBF\xBD");
}

TEST(tokenizer, StreamingMultiByte) {
  for (const char* dir : {"models/pycoder", "tests/data/tokenizers/metaspace-1k"}) {
    auto tok = Tokenizer::from_dir(repo(dir));
    for (std::string text : {"😀 emoji 👋🏽 family 👨‍👩‍👧 rocket 🚀", "中文测试：你好，世界！日本語のテキスト",
                             "  leading and trailing  ", "Ω≈ç√∫˜µ≤≥÷ café naïve"}) {
      Ids ids = tok->encode(text, true);
      for (bool skip : {true, false}) {
        StreamDecoder sd(*tok, skip);
        std::string streamed;
        for (int32_t id : ids) {
          std::string d = sd.push(id);
          EXPECT_EQ(unicode::valid_prefix(d), d.size()) << dir;
          streamed += d;
        }
        streamed += sd.flush();
        EXPECT_EQ(streamed, tok->decode(ids, skip)) << dir << " " << text;
      }
    }
  }
}

TEST(tokenizer, StreamDecoderHoldsIncompleteCharacter) {
  auto tok = Tokenizer::from_dir(repo("tests/data/tokenizers/metaspace-1k"));
  auto id = [&](const char* t) { return *tok->token_to_id(t); };
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(id("a")), "a");
  EXPECT_EQ(sd.push(id("<0xE4>")), "");
  EXPECT_EQ(sd.push(id("<0xB8>")), "");
  EXPECT_EQ(sd.push(id("<0xAD>")), "中");
  EXPECT_EQ(sd.push(id("<0xE5>")), "");
  EXPECT_EQ(sd.push(id("<0xA5>")), "");
  EXPECT_EQ(sd.push(id("<0xBD>")), "好");
  EXPECT_EQ(sd.push(id("<0xE4>")), "");
  // A dangling byte becomes U+FFFD at the end. (A full decode would turn the whole byte run
  // into U+FFFDs, HF's ByteFallback rule; text already streamed cannot be taken back.)
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(1 << 30), "");  // a padded LM-head row: no text, the stream goes on
  EXPECT_EQ(sd.push(id("a")), "a");
  EXPECT_THROW(sd.push(-1), Error);
}

// Ids past the tokenizer (a padded LM head's rows) decode to nothing, as HF tokenizers do;
// negative ids are an error.
TEST(tokenizer, DecodeSkipsIdsWithoutTokenAndRejectsNegative) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  const int32_t a = *tok->token_to_id("a");
  EXPECT_EQ(tok->decode(Ids{8192}), "");
  EXPECT_EQ(tok->decode(Ids{a, 8192, a}), tok->decode(Ids{a, a}));
  EXPECT_THROW(tok->decode(Ids{-1}), Error);
  EXPECT_THROW(tok->id_to_token(8192), Error);
  EXPECT_FALSE(tok->is_valid_id(8192));
}

// Qwen2/3 files normalize with NFC: decomposed input encodes like the precomposed text.
TEST(tokenizer, NfcNormalizer) {
  nlohmann::json j = test::bytelevel_json();
  j["normalizer"] = {{"type", "NFC"}};
  auto tok = from_json(j);
  EXPECT_EQ(tok->encode("cafe\xCC\x81"), tok->encode("caf\xC3\xA9"));
  EXPECT_NE(test::from_json(test::bytelevel_json())->encode("cafe\xCC\x81"), tok->encode("caf\xC3\xA9"));
}

// Newer Llama-2/Mistral conversions: no normalizer, a Metaspace pre-tokenizer and decoder.
TEST(tokenizer, MetaspacePreTokenizer) {
  nlohmann::json j = test::metaspace_json();
  auto legacy = from_json(j);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}}}}};
  auto tok = from_json(j);
  for (std::string text : {"Hello world", "def f(x):\n    return x**2", "naïve café"}) {
    EXPECT_EQ(tok->encode(text), legacy->encode(text)) << text;
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
  // "first": only the start of the input gets the marker, not the text after a special token.
  Ids after = tok->encode("<s>Hello");
  EXPECT_EQ(after[0], 1);
  EXPECT_NE(tok->id_to_token(after[1]).rfind("\xE2\x96\x81", 0), 0u);
  // split=true cuts before each marker; the result is the same for this vocabulary.
  j["pre_tokenizer"]["split"] = true;
  EXPECT_EQ(from_json(j)->encode("Hello big world"), tok->encode("Hello big world"));
}

// DeepSeek-V3-style pre-tokenizer: several Split regexes, then ByteLevel; empty normalizer list.
TEST(tokenizer, MultiSplitSequence) {
  nlohmann::json j = test::bytelevel_json();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "Split"}, {"pattern", {{"Regex", "[一-龥\u3040-ゟ゠-ヿ]+"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "Split"},
         {"pattern",
          {{"Regex",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
            "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  auto tok = from_json(j);
  for (std::string text : {"x = 12345 + 7;\n", "中文テキスト and ひらがな", ""}) EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

// GPT-2 style: a lone ByteLevel pre-tokenizer with its own regex and the prefix space.
TEST(tokenizer, ByteLevelWithRegex) {
  nlohmann::json j = test::bytelevel_json();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = from_json(j);
  EXPECT_EQ(tok->encode("Hello"), tok->encode(" Hello"));
  EXPECT_EQ(tok->decode(tok->encode("Hello world")), " Hello world");
}

// Whitespace-free SentencePiece input is one long word: the heap merge path must agree with
// the same text cut into pieces at markers.
TEST(tokenizer, LongSentencePieceWord) {
  auto tok = Tokenizer::from_dir(repo("tests/data/tokenizers/metaspace-1k"));
  std::string text;
  for (int i = 0; i < 300; ++i) text += "there";
  Ids ids = tok->encode(text);
  EXPECT_EQ(tok->decode(ids), text);
  // Without the marker split (a token with an inner marker disables it), the result is the same.
  nlohmann::json j = test::metaspace_json();
  j["model"]["vocab"]["x\xE2\x96\x81"] = 5000;
  EXPECT_EQ(from_json(j)->encode(text), ids);
  EXPECT_EQ(from_json(j)->encode("a b  c " + text), tok->encode("a b  c " + text));
}

TEST(tokenizer, ConfigAndTemplates) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  EXPECT_EQ(tok->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(tok->eos_token(), "<|eot_id|>");
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->eos_id(), 4);
  EXPECT_EQ(tok->add_bos_token(), std::nullopt);
  ASSERT_TRUE(tok->chat_template().has_value());
  EXPECT_NE(tok->chat_template()->find("<|start_header_id|>"), std::string::npos);
  auto bare = Tokenizer::from_file(repo("models/pycoder/tokenizer.json"));
  EXPECT_EQ(bare->bos_id(), std::nullopt);
  EXPECT_TRUE(bare->chat_templates().empty());
  EXPECT_EQ(Tokenizer::load(repo("models/pycoder/tokenizer.json"))->vocab_size(), 8192);
}

TEST(tokenizer, ConfigVariants) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("ts_tok_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(repo("tests/data/tokenizers/metaspace-1k/tokenizer.json"), dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  {
    std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": true, "add_eos_token": false,
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
      "eos_token": "</s>", "clean_up_tokenization_spaces": false, "model_max_length": 1000000000000000019884624838656,
      "chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}],
      "some_future_field": {"x": [1, 2]}})";
  }
  auto tok = Tokenizer::from_dir(dir.string());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->add_bos_token(), true);
  EXPECT_EQ(tok->add_eos_token(), false);
  EXPECT_EQ(tok->clean_up_tokenization_spaces(), false);
  ASSERT_EQ(tok->chat_templates().size(), 2u);
  EXPECT_EQ(tok->chat_template("tool_use"), "B");
  EXPECT_EQ(tok->chat_template(), "A");
  std::ofstream(dir / "tokenizer_config.json") << "{ not json";
  EXPECT_THROW(Tokenizer::from_dir(dir.string()), Error);
  fs::remove_all(dir);
}

std::string load_error(const nlohmann::json& j) {
  try {
    from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(tokenizer, LoadErrors) {
  nlohmann::json j = test::bytelevel_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(load_error(j).find("WordPiece"), std::string::npos);
  j["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(j).find("not supported"), std::string::npos);

  j = test::bytelevel_json();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(load_error(j).find("UnicodeScripts"), std::string::npos);

  j = test::bytelevel_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  std::string msg = load_error(j);
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[0]"), std::string::npos) << msg;

  j = test::bytelevel_json();
  j["model"]["merges"].push_back({"nope", "missing"});
  EXPECT_NE(load_error(j).find("model.merges["), std::string::npos);

  j = test::bytelevel_json();
  j["decoder"] = {{"type", "CTC"}};
  EXPECT_NE(load_error(j).find("CTC"), std::string::npos);

  // Unknown but harmless fields are ignored.
  j = test::bytelevel_json();
  j["some_new_field"] = {{"a", 1}};
  j["model"]["another"] = true;
  EXPECT_EQ(load_error(j), "");

  EXPECT_THROW(Tokenizer::from_json_string("{\"model\": "), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  EXPECT_THROW(Tokenizer::from_dir("/nonexistent"), Error);
  // Errors are one line.
  EXPECT_EQ(load_error(j).find('\n'), std::string::npos);
  try {
    Tokenizer::from_json_string("[1, 2");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

// Every fixture model's tokenizer loads and round-trips text.
TEST(tokenizer, FixtureModelsLoad) {
  namespace fs = std::filesystem;
  int n = 0;
  for (const auto& e : fs::directory_iterator(repo("tests/data"))) {
    if (!fs::exists(e.path() / "tokenizer.json")) continue;
    auto tok = Tokenizer::from_dir(e.path().string());
    EXPECT_GT(tok->vocab_size(), 0) << e.path();
    EXPECT_TRUE(tok->bos_id().has_value()) << e.path();
    EXPECT_TRUE(tok->eos_id().has_value()) << e.path();
    std::string text = "def main():\n    print('héllo, 世界 🚀')\n";
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << e.path();
    ++n;
  }
  EXPECT_GE(n, 7);
}

TEST(tokenizer, ConcurrentEncode) {
  auto tok = Tokenizer::from_dir(repo("models/pycoder"));
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i * 7) + "  # ok\n");
  std::vector<Ids> expect;
  for (const auto& t : texts) expect.push_back(tok->encode(t));
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int k = 0; k < 8; ++k)
    th.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t idx = (i + k * 7) % texts.size();
          if (tok->encode(texts[idx]) != expect[idx] || tok->decode(expect[idx]) != texts[idx]) ++bad;
        }
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace ts::tok
