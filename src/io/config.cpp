#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/checked.h"
#include "io/json_file.h"

namespace fs = std::filesystem;

namespace ts::io {

static nlohmann::json read_json(const std::string& path) { return read_json_file(path); }

std::vector<int32_t> parse_id_list(const nlohmann::json& v, const std::string& path, const std::string& key) {
  std::vector<int32_t> r;
  auto one = [&](const nlohmann::json& x, const std::string& k) {
    int32_t id = json_field<int32_t>(x, path, k);
    TS_CHECK(id >= 0, "{}: field {} = {} must be a non-negative token id", path, k, id);
    r.push_back(id);
  };
  if (v.is_number_integer()) one(v, key);
  else if (v.is_array())
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].is_number_integer()) one(v[i], fmt::format("{}[{}]", key, i));
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
  const char* pname = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? "rope_parameters" : "rope_scaling";
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
  {
    double om = num("original_max_position_embeddings", 0);
    TS_CHECK(std::isfinite(om) && om >= 0 && om <= double(kMaxPositionEmbeddings),
             "{}: field {}.original_max_position_embeddings = {} is out of range [0, {}]", path, pname, om,
             kMaxPositionEmbeddings);
    r.original_max_position_embeddings = int64_t(om);
  }
  r.beta_fast = num("beta_fast", 32.0);
  r.beta_slow = num("beta_slow", 1.0);
  if (p.contains("mscale") && p["mscale"].is_number()) r.mscale = p["mscale"].get<double>();
  if (p.contains("mscale_all_dim") && p["mscale_all_dim"].is_number()) r.mscale_all_dim = p["mscale_all_dim"].get<double>();
  if (p.contains("attention_factor") && p["attention_factor"].is_number()) r.attention_factor = p["attention_factor"].get<double>();
  if (p.contains("truncate") && p["truncate"].is_boolean()) r.truncate = p["truncate"].get<bool>();
  TS_CHECK(std::isfinite(r.theta) && r.theta > 0, "{}: field rope_theta = {} must be a positive number", path, r.theta);
  TS_CHECK(std::isfinite(r.factor) && r.factor > 0, "{}: field {}.factor = {} must be a positive number", path, pname,
           r.factor);
  using KV = std::pair<const char*, double>;
  for (auto [k, v] : {KV{"low_freq_factor", r.low_freq_factor}, KV{"high_freq_factor", r.high_freq_factor},
                      KV{"beta_fast", r.beta_fast}, KV{"beta_slow", r.beta_slow}})
    TS_CHECK(std::isfinite(v), "{}: field {}.{} = {} must be finite", path, pname, k, v);
  if (type == "llama3") {
    TS_CHECK(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
             "{}: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor (got {}, {})", path,
             r.low_freq_factor, r.high_freq_factor);
    TS_CHECK(r.original_max_position_embeddings > 0, "{}: llama3 rope scaling needs original_max_position_embeddings", path);
  }
  return r;
}

// The window of the layers that slide (0: none slide) and which layers slide; see
// ModelConfig::sliding_window.
static void parse_sliding_window(ModelConfig& c) {
  const std::string& a = c.architecture;
  if (c.num_layers < 1 || c.num_layers > kMaxLayers) return;  // validate_config names it
  std::vector<uint8_t> slides(size_t(c.num_layers), 0);
  if (c.has("layer_types")) {
    const auto types = c.get<std::vector<std::string>>("layer_types", {});
    const bool any = std::find(types.begin(), types.end(), "sliding_attention") != types.end();
    TS_CHECK(!any || int64_t(types.size()) == c.num_layers, "{}: field layer_types has {} entries for {} layers",
             c.path, types.size(), c.num_layers);
    for (size_t i = 0; i < types.size() && i < slides.size(); ++i) slides[i] = types[i] == "sliding_attention";
  } else if (a == "MistralForCausalLM") {
    // null: full attention (Mistral v0.2+)
    if (c.has("sliding_window")) std::fill(slides.begin(), slides.end(), 1);
  } else if (a == "Qwen2ForCausalLM" || a == "Qwen3ForCausalLM" || a == "Qwen3MoeForCausalLM") {
    // transformers: layer i slides when use_sliding_window and i >= max_window_layers.
    if (c.get<bool>("use_sliding_window", false))
      for (int64_t i = std::max<int64_t>(0, c.get<int64_t>("max_window_layers", 28)); i < c.num_layers; ++i)
        slides[size_t(i)] = 1;
  }
  if (std::find(slides.begin(), slides.end(), 1) == slides.end()) return;
  TS_CHECK(c.has("sliding_window"), "{}: layers use sliding-window attention but field sliding_window is missing", c.path);
  const int64_t w = c.get<int64_t>("sliding_window", 0);
  TS_CHECK(w >= 1 && w <= 0x7fffffff, "{}: field sliding_window = {} is out of range [1, 2^31)", c.path, w);
  c.sliding_window = w;
  c.sliding_layers = std::move(slides);
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
  // Before any division by it (num_attention_heads 0 was a SIGFPE here).
  TS_CHECK(c.num_heads > 0 && c.num_heads <= kMaxHeads, "{}: field num_attention_heads = {} is out of range [1, {}]",
           path, c.num_heads, kMaxHeads);
  TS_CHECK(c.hidden_size > 0 && c.hidden_size <= kMaxHidden, "{}: field hidden_size = {} is out of range [1, {}]",
           path, c.hidden_size, kMaxHidden);
  c.num_kv_heads = c.get<int64_t>("num_key_value_heads", c.num_heads);
  c.head_dim = c.get<int64_t>("head_dim", 0);
  if (c.head_dim == 0) {
    TS_CHECK(c.hidden_size % c.num_heads == 0,
             "{}: hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim is given)", path,
             c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.max_position_embeddings = c.get<int64_t>("max_position_embeddings", 4096);
  c.rms_norm_eps = c.get<double>("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = c.get<bool>("tie_word_embeddings", false);
  c.attention_bias = c.get<bool>("attention_bias", false);
  c.mlp_bias = c.get<bool>("mlp_bias", false);
  c.rope = parse_rope(j, path);
  parse_sliding_window(c);
  c.partial_rotary_factor = c.get<double>("partial_rotary_factor", 1.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("partial_rotary_factor"))
    c.partial_rotary_factor = json_field<double>(j["rope_parameters"]["partial_rotary_factor"], path, "rope_parameters.partial_rotary_factor");
  if (j.contains("eos_token_id")) c.eos_token_ids = parse_id_list(j["eos_token_id"], path, "eos_token_id");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    c.bos_token_id = parse_id_list(j["bos_token_id"], path, "bos_token_id").at(0);
  validate_config(c);
  return c;
}

void ModelConfig::require_silu_mlp() const {
  const std::string act = get<std::string>("hidden_act", "silu");
  TS_CHECK(act == "silu" || act == "swish", "{}: field hidden_act = '{}' is not supported for {} (silu only)", path, act,
           architecture);
}

void validate_config(const ModelConfig& c) {
  const std::string& path = c.path;
  auto range = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    TS_CHECK(v >= lo && v <= hi, "{}: field {} = {} is out of range [{}, {}]", path, field, v, lo, hi);
  };
  range("vocab_size", c.vocab_size, 1, kMaxVocab);
  range("hidden_size", c.hidden_size, 1, kMaxHidden);
  range("num_hidden_layers", c.num_layers, 1, kMaxLayers);
  range("num_attention_heads", c.num_heads, 1, kMaxHeads);
  range("num_key_value_heads", c.num_kv_heads, 1, c.num_heads);
  TS_CHECK(c.num_heads % c.num_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           path, c.num_heads, c.num_kv_heads);
  range("head_dim", c.head_dim, 1, kMaxHeadDim);
  range("intermediate_size", c.intermediate_size, 0, int64_t(1) << 24);
  range("max_position_embeddings", c.max_position_embeddings, 1, kMaxPositionEmbeddings);
  // Sizes the models derive from these (q projection, rope table) must not wrap.
  checked_mul(c.num_heads, c.head_dim, path + ": num_attention_heads * head_dim");
  checked_mul(checked_mul(c.max_position_embeddings, c.head_dim, path + ": rope table"), 8, path + ": rope table");
  TS_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0 && c.rms_norm_eps < 1,
           "{}: field rms_norm_eps = {} must be in (0, 1)", path, c.rms_norm_eps);
  TS_CHECK(std::isfinite(c.partial_rotary_factor) && c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1,
           "{}: field partial_rotary_factor = {} must be in (0, 1]", path, c.partial_rotary_factor);
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i)
    TS_CHECK(c.eos_token_ids[i] < c.vocab_size, "{}: field eos_token_id {} is outside the vocabulary (vocab_size {})",
             path, c.eos_token_ids[i], c.vocab_size);
  if (c.bos_token_id)
    TS_CHECK(*c.bos_token_id < c.vocab_size, "{}: field bos_token_id {} is outside the vocabulary (vocab_size {})", path,
             *c.bos_token_id, c.vocab_size);

  // MoE routing (Qwen3-MoE / Mixtral: num_experts or num_local_experts; DeepSeek: n_routed_experts).
  int64_t experts = 0;
  const char* experts_field = nullptr;
  for (const char* k : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (c.has(k)) {
      experts = c.get<int64_t>(k, 0);
      experts_field = k;
      range(k, experts, 0, 65536);
      if (experts > 0) break;
    }
  if (experts > 0) {
    int64_t top_k = c.get<int64_t>("num_experts_per_tok", 1);
    TS_CHECK(top_k >= 1 && top_k <= experts, "{}: field num_experts_per_tok = {} must be in [1, {} = {}]", path, top_k,
             experts_field, experts);
    if (c.has("n_group")) {
      int64_t groups = c.get<int64_t>("n_group", 1);
      TS_CHECK(groups >= 1 && experts % groups == 0, "{}: field n_group = {} must be >= 1 and divide {} = {}", path,
               groups, experts_field, experts);
      int64_t topk_group = c.get<int64_t>("topk_group", 1);
      TS_CHECK(topk_group >= 1 && topk_group <= groups, "{}: field topk_group = {} must be in [1, n_group = {}]", path,
               topk_group, groups);
      TS_CHECK(top_k <= topk_group * (experts / groups),
               "{}: num_experts_per_tok {} exceeds the experts of topk_group {} groups ({} each)", path, top_k,
               topk_group, experts / groups);
    }
  }
}

ModelConfig load_config(const std::string& dir) {
  TS_CHECK(fs::is_directory(dir), "model directory {} does not exist", dir);
  std::string path = (fs::path(dir) / "config.json").string();
  TS_CHECK(fs::exists(path), "{}: missing (is {} a Hugging Face model directory?)", path, dir);
  // Errors from here name the file; a field's get<T> names the field too.
  ModelConfig c = parse_config(read_json(path), path);
  c.dir = dir;
  return c;
}

GenerationConfig load_generation_config(const std::string& dir) {
  GenerationConfig g;
  std::string path = (fs::path(dir) / "generation_config.json").string();
  if (!fs::exists(path)) return g;
  auto j = read_json(path);
  TS_CHECK(j.is_object(), "{}: not a JSON object", path);
  if (j.contains("eos_token_id")) g.eos_token_ids = parse_id_list(j["eos_token_id"], path, "eos_token_id");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    g.bos_token_id = parse_id_list(j["bos_token_id"], path, "bos_token_id").at(0);
  auto opt_f = [&](const char* k, std::optional<float>& o) {
    if (j.contains(k) && j[k].is_number()) {
      double d = j[k].get<double>();
      TS_CHECK(std::isfinite(d) && std::abs(d) < 1e30, "{}: field {} = {} is out of range", path, k, d);
      o = float(d);
    }
  };
  opt_f("temperature", g.temperature);
  opt_f("top_p", g.top_p);
  opt_f("min_p", g.min_p);
  opt_f("repetition_penalty", g.repetition_penalty);
  if (j.contains("top_k") && j["top_k"].is_number_integer()) g.top_k = json_field<int>(j["top_k"], path, "top_k");
  if (j.contains("do_sample") && j["do_sample"].is_boolean()) g.do_sample = j["do_sample"].get<bool>();
  return g;
}

}  // namespace ts::io
