#include "io/config.h"

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace ts::io {

static nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  TS_CHECK(f.good(), "{}: cannot open", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

std::vector<int32_t> parse_id_list(const nlohmann::json& v) {
  std::vector<int32_t> r;
  if (v.is_number_integer()) r.push_back(v.get<int32_t>());
  else if (v.is_array())
    for (auto& x : v)
      if (x.is_number_integer()) r.push_back(x.get<int32_t>());
  return r;
}

RopeScaling parse_rope(const nlohmann::json& j, const std::string& path) {
  RopeScaling r;
  // transformers 5 keeps everything in rope_parameters (theta included); the classic form has
  // rope_theta at the top and an optional rope_scaling object.
  nlohmann::json p = nlohmann::json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) p = j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) p = j["rope_scaling"];
  auto num = [&](const char* k, double def) {
    return p.contains(k) && p[k].is_number() ? p[k].get<double>() : def;
  };
  r.theta = p.contains("rope_theta") && p["rope_theta"].is_number() ? p["rope_theta"].get<double>()
            : j.contains("rope_theta") && j["rope_theta"].is_number() ? j["rope_theta"].get<double>()
                                                                      : 10000.0;
  std::string type = p.contains("rope_type") && p["rope_type"].is_string() ? p["rope_type"].get<std::string>()
                     : p.contains("type") && p["type"].is_string()         ? p["type"].get<std::string>()
                                                                           : "default";
  if (type == "su" || type == "longrope" || type == "mrope" || type == "proportional")
    fail("{}: rope type '{}' is not supported (supported: default, linear, llama3, yarn, dynamic)", path, type);
  TS_CHECK(type == "default" || type == "linear" || type == "llama3" || type == "yarn" || type == "dynamic",
           "{}: unknown rope type '{}' (supported: default, linear, llama3, yarn, dynamic)", path, type);
  r.type = type;
  r.factor = num("factor", 1.0);
  r.low_freq_factor = num("low_freq_factor", 1.0);
  r.high_freq_factor = num("high_freq_factor", 4.0);
  r.original_max_position_embeddings = int64_t(num("original_max_position_embeddings", 0));
  r.beta_fast = num("beta_fast", 32.0);
  r.beta_slow = num("beta_slow", 1.0);
  if (p.contains("mscale") && p["mscale"].is_number()) r.mscale = p["mscale"].get<double>();
  if (p.contains("mscale_all_dim") && p["mscale_all_dim"].is_number()) r.mscale_all_dim = p["mscale_all_dim"].get<double>();
  if (p.contains("attention_factor") && p["attention_factor"].is_number()) r.attention_factor = p["attention_factor"].get<double>();
  if (p.contains("truncate") && p["truncate"].is_boolean()) r.truncate = p["truncate"].get<bool>();
  if (type == "llama3") {
    TS_CHECK(r.original_max_position_embeddings > 0, "{}: llama3 rope scaling needs original_max_position_embeddings", path);
  }
  return r;
}

ModelConfig parse_config(const nlohmann::json& j0, const std::string& path) {
  ModelConfig c;
  c.path = path;
  c.raw = j0;
  // Multimodal wrappers keep the language model's fields under text_config.
  if (j0.contains("text_config") && j0["text_config"].is_object()) {
    for (auto& [k, v] : j0["text_config"].items())
      if (!c.raw.contains(k) || k == "model_type") c.raw[k] = v;
    if (j0["text_config"].contains("model_type")) c.raw["text_model_type"] = j0["text_config"]["model_type"];
  }
  const auto& j = c.raw;
  TS_CHECK(j.is_object(), "{}: not a JSON object", path);
  auto archs = c.get<std::vector<std::string>>("architectures", {});
  TS_CHECK(!archs.empty(), "{}: missing field architectures", path);
  c.architecture = archs[0];
  c.model_type = c.get<std::string>("model_type", "");
  c.vocab_size = c.require<int64_t>("vocab_size");
  c.hidden_size = c.require<int64_t>("hidden_size");
  c.intermediate_size = c.get<int64_t>("intermediate_size", 0);
  c.num_layers = c.require<int64_t>("num_hidden_layers");
  c.num_heads = c.require<int64_t>("num_attention_heads");
  c.num_kv_heads = c.get<int64_t>("num_key_value_heads", c.num_heads);
  c.head_dim = c.get<int64_t>("head_dim", 0);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_heads;
  c.max_position_embeddings = c.get<int64_t>("max_position_embeddings", 4096);
  c.rms_norm_eps = c.get<double>("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = c.get<bool>("tie_word_embeddings", false);
  c.attention_bias = c.get<bool>("attention_bias", false);
  c.mlp_bias = c.get<bool>("mlp_bias", false);
  c.rope = parse_rope(j, path);
  c.partial_rotary_factor = c.get<double>("partial_rotary_factor", 1.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("partial_rotary_factor"))
    c.partial_rotary_factor = j["rope_parameters"]["partial_rotary_factor"].get<double>();
  if (j.contains("eos_token_id")) c.eos_token_ids = parse_id_list(j["eos_token_id"]);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int32_t>();
  TS_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
           "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path, c.num_heads, c.num_kv_heads);
  TS_CHECK(c.hidden_size > 0 && c.vocab_size > 0 && c.num_layers > 0, "{}: sizes must be positive", path);
  return c;
}

ModelConfig load_config(const std::string& dir) {
  TS_CHECK(fs::is_directory(dir), "model directory {} does not exist", dir);
  std::string path = (fs::path(dir) / "config.json").string();
  TS_CHECK(fs::exists(path), "{}: missing (is {} a Hugging Face model directory?)", path, dir);
  ModelConfig c = parse_config(read_json(path), path);
  c.dir = dir;
  return c;
}

GenerationConfig load_generation_config(const std::string& dir) {
  GenerationConfig g;
  std::string path = (fs::path(dir) / "generation_config.json").string();
  if (!fs::exists(path)) return g;
  auto j = read_json(path);
  if (j.contains("eos_token_id")) g.eos_token_ids = parse_id_list(j["eos_token_id"]);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) g.bos_token_id = j["bos_token_id"].get<int32_t>();
  auto opt_f = [&](const char* k, std::optional<float>& o) {
    if (j.contains(k) && j[k].is_number()) o = j[k].get<float>();
  };
  opt_f("temperature", g.temperature);
  opt_f("top_p", g.top_p);
  opt_f("min_p", g.min_p);
  opt_f("repetition_penalty", g.repetition_penalty);
  if (j.contains("top_k") && j["top_k"].is_number_integer()) g.top_k = j["top_k"].get<int>();
  if (j.contains("do_sample") && j["do_sample"].is_boolean()) g.do_sample = j["do_sample"].get<bool>();
  return g;
}

}  // namespace ts::io
