// config.json validation: every bad value from issue #23 fails at load with the file and field named.
#include <gtest/gtest.h>

#include <string>

#include "io/config.h"

namespace {

using ts::io::parse_config;

nlohmann::json base() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1088, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0})");
}

// Expects parse_config to throw a message containing every fragment.
void expect_error(const nlohmann::json& j, std::initializer_list<const char*> parts) {
  try {
    parse_config(j, "m/config.json");
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const ts::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("m/config.json: ", 0), 0u) << msg;
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
  }
}

nlohmann::json with(const char* key, nlohmann::json v) {
  auto j = base();
  j[key] = std::move(v);
  return j;
}

TEST(Config, BaseLoads) {
  auto c = parse_config(base(), "m/config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_kv_heads, 2);
}

TEST(Config, HeadsZeroIsAnErrorNotSigfpe) { expect_error(with("num_attention_heads", 0), {"num_attention_heads"}); }

TEST(Config, HugeMaxPositionEmbeddings) {
  expect_error(with("max_position_embeddings", int64_t(1) << 58), {"max_position_embeddings"});
  expect_error(with("max_position_embeddings", 0), {"max_position_embeddings"});
}

TEST(Config, NormEpsAndRopeTheta) {
  expect_error(with("rms_norm_eps", -1), {"rms_norm_eps"});
  expect_error(with("rms_norm_eps", 0), {"rms_norm_eps"});
  expect_error(with("rope_theta", 0), {"rope_theta"});
  expect_error(with("rope_theta", -5), {"rope_theta"});
}

TEST(Config, WrongTypesNameTheField) {
  expect_error(with("hidden_size", "big"), {"hidden_size", "integer"});
  expect_error(with("num_hidden_layers", 2.5), {"num_hidden_layers"});
  expect_error(with("tie_word_embeddings", "yes"), {"tie_word_embeddings"});
  expect_error(with("vocab_size", int64_t(1) << 40), {"vocab_size"});
}

TEST(Config, HeadsVsHeadDimVsHidden) {
  expect_error(with("num_attention_heads", 5), {"hidden_size 64 is not a multiple of num_attention_heads 5"});
  expect_error(with("num_key_value_heads", 3), {"num_key_value_heads"});
  expect_error(with("num_key_value_heads", 0), {"num_key_value_heads"});
  auto j = with("num_attention_heads", 5);
  j["head_dim"] = 16;  // an explicit head_dim need not divide hidden (Qwen3 does this)
  j["num_key_value_heads"] = 5;
  EXPECT_NO_THROW(parse_config(j, "m/config.json"));
  j["head_dim"] = -1;
  expect_error(j, {"head_dim"});
}

TEST(Config, EosOutsideTheVocabulary) {
  expect_error(with("eos_token_id", 5000), {"eos_token_id"});
  expect_error(with("eos_token_id", nlohmann::json::array({2, int64_t(1) << 40})), {"eos_token_id[1]"});
  expect_error(with("bos_token_id", -3), {"bos_token_id"});
}

TEST(Config, MoeTopK) {
  auto j = base();
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  EXPECT_NO_THROW(parse_config(j, "m/config.json"));
  j["num_experts_per_tok"] = 0;
  expect_error(j, {"num_experts_per_tok"});
  j["num_experts_per_tok"] = 9;
  expect_error(j, {"num_experts_per_tok", "num_experts = 8"});
}

TEST(Config, DeepSeekGroups) {
  auto j = base();
  j["n_routed_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["n_group"] = 2;
  j["topk_group"] = 1;
  EXPECT_NO_THROW(parse_config(j, "m/config.json"));
  j["n_group"] = 0;
  expect_error(j, {"n_group"});
  j["n_group"] = 3;
  expect_error(j, {"n_group = 3", "divide"});
  j["n_group"] = 2;
  j["topk_group"] = 3;
  expect_error(j, {"topk_group"});
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 5;  // more than the 4 experts of one group
  expect_error(j, {"num_experts_per_tok"});
}

TEST(Config, RopeScalingFields) {
  auto j = base();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0}};
  expect_error(j, {"factor"});
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 1e30}};
  expect_error(j, {"original_max_position_embeddings"});
}

TEST(Config, ModelFieldGetNamesTheField) {
  auto j = base();
  j["num_experts_per_tok"] = "two";
  j["num_experts"] = 0;
  auto c = parse_config(j, "m/config.json");
  try {
    c.get<int>("num_experts_per_tok", 1);
    ADD_FAILURE();
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("m/config.json: field num_experts_per_tok"), std::string::npos) << e.what();
  }
  j["num_experts_per_tok"] = int64_t(1) << 40;
  c = parse_config(j, "m/config.json");
  EXPECT_THROW(c.get<int>("num_experts_per_tok", 1), ts::Error);  // not truncated to 0
}

}  // namespace

// Sliding-window attention as transformers decides it: Mistral's sliding_window (null: none),
// Qwen2/Qwen3 only with use_sliding_window and a layer at or past max_window_layers, any
// layer_types "sliding_attention"; Llama ignores the field.
TEST(Config, SlidingWindowAsTransformersAppliesIt) {
  auto cfg = [](const char* arch, std::initializer_list<std::pair<const char*, nlohmann::json>> fields) {
    nlohmann::json j = base();
    j["architectures"] = {arch};
    for (auto& [k, v] : fields) j[k] = v;
    return parse_config(j, "m/config.json");
  };
  EXPECT_EQ(cfg("MistralForCausalLM", {{"sliding_window", 4096}}).sliding_window, 4096);
  EXPECT_EQ(cfg("MistralForCausalLM", {{"sliding_window", nullptr}}).sliding_window, 0);
  EXPECT_EQ(cfg("MistralForCausalLM", {}).sliding_window, 0);
  EXPECT_EQ(cfg("LlamaForCausalLM", {{"sliding_window", 4096}}).sliding_window, 0);
  // Qwen2.5 / Qwen3 as published: use_sliding_window false, sliding_window set.
  EXPECT_EQ(cfg("Qwen2ForCausalLM", {{"use_sliding_window", false}, {"sliding_window", 131072}}).sliding_window, 0);
  EXPECT_EQ(cfg("Qwen3ForCausalLM", {{"use_sliding_window", true}, {"sliding_window", 512}, {"max_window_layers", 2}})
                .sliding_window,
            0);  // 2 layers, none at or past 2
  EXPECT_EQ(cfg("Qwen3MoeForCausalLM", {{"use_sliding_window", true}, {"sliding_window", 512}, {"max_window_layers", 1}})
                .sliding_window,
            512);
  EXPECT_EQ(cfg("Qwen2ForCausalLM", {{"layer_types", {"full_attention", "sliding_attention"}}, {"sliding_window", 256}})
                .sliding_window,
            256);
  EXPECT_EQ(cfg("Qwen2ForCausalLM", {{"layer_types", {"full_attention", "full_attention"}}, {"use_sliding_window", true},
                                     {"sliding_window", 256}, {"max_window_layers", 0}})
                .sliding_window,
            0);  // layer_types decides where given
  // Which layers slide: every Mistral layer; Qwen's from max_window_layers on; layer_types' entries.
  auto windows = [](const ts::io::ModelConfig& c) {
    std::vector<int> w;
    for (int64_t l = 0; l < c.num_layers; ++l) w.push_back(c.window_of(l));
    return w;
  };
  EXPECT_EQ(windows(cfg("MistralForCausalLM", {{"sliding_window", 4096}})), (std::vector<int>{4096, 4096}));
  EXPECT_EQ(windows(cfg("Qwen3MoeForCausalLM", {{"use_sliding_window", true}, {"sliding_window", 512}, {"max_window_layers", 1}})),
            (std::vector<int>{0, 512}));
  EXPECT_EQ(windows(cfg("Qwen2ForCausalLM", {{"layer_types", {"sliding_attention", "full_attention"}}, {"sliding_window", 256}})),
            (std::vector<int>{256, 0}));
  EXPECT_EQ(windows(cfg("Qwen2ForCausalLM", {{"use_sliding_window", false}, {"sliding_window", 131072}})),
            (std::vector<int>{0, 0}));
  expect_error(
      [] {
        nlohmann::json j = base();
        j["layer_types"] = {"sliding_attention"};  // one entry for two layers
        j["sliding_window"] = 64;
        return j;
      }(),
      {"layer_types has 1 entries for 2 layers"});
  expect_error(
      [] {
        nlohmann::json j = base();
        j["architectures"] = {"MistralForCausalLM"};
        j["sliding_window"] = 0;
        return j;
      }(),
      {"sliding_window"});
}

TEST(Config, HiddenActOtherThanSiluIsNamed) {
  nlohmann::json j = base();
  EXPECT_NO_THROW(parse_config(j, "m/config.json").require_silu_mlp());
  j["hidden_act"] = "swish";
  EXPECT_NO_THROW(parse_config(j, "m/config.json").require_silu_mlp());
  j["hidden_act"] = "gelu_pytorch_tanh";
  try {
    parse_config(j, "m/config.json").require_silu_mlp();
    ADD_FAILURE() << "gelu accepted";
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_act = 'gelu_pytorch_tanh'"), std::string::npos) << e.what();
  }
}
