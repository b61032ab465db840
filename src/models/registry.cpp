// Architecture table: config.json's architectures[0] -> model file. An explicit list (not
// static registrars) so that every model object file is linked from the static library.
#include <map>

#include "models/model.h"

namespace ts::models {

std::unique_ptr<Model> make_llama(const io::ModelConfig&, const LoadOptions&);
std::unique_ptr<Model> make_qwen3_moe(const io::ModelConfig&, const LoadOptions&);
std::unique_ptr<Model> make_deepseek_v3(const io::ModelConfig&, const LoadOptions&);
std::unique_ptr<Model> make_minimax_m3(const io::ModelConfig&, const LoadOptions&);
std::unique_ptr<Model> make_qwen3_5(const io::ModelConfig&, const LoadOptions&);

static const std::map<std::string, ModelFactory>& factories() {
  static const std::map<std::string, ModelFactory> f = {
      {"LlamaForCausalLM", make_llama},
      {"MistralForCausalLM", make_llama},
      {"Qwen2ForCausalLM", make_llama},
      {"Qwen3ForCausalLM", make_llama},
      {"Qwen3MoeForCausalLM", make_qwen3_moe},
      {"DeepseekV3ForCausalLM", make_deepseek_v3},
      {"MiniMaxM3VLForCausalLM", make_minimax_m3},
      {"Qwen3_5ForCausalLM", make_qwen3_5},
  };
  return f;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> r;
  for (auto& [k, _] : factories()) r.push_back(k);
  return r;
}

std::unique_ptr<Model> create_model(const io::ModelConfig& cfg, const LoadOptions& opts) {
  auto it = factories().find(cfg.architecture);
  if (it == factories().end()) {
    std::string list;
    for (auto& a : supported_architectures()) list += (list.empty() ? "" : ", ") + a;
    fail("{}: unsupported architecture {} (supported: {})", cfg.path, cfg.architecture, list);
  }
  // Tensor parallelism: the Llama family, Qwen3-MoE and DeepSeek-V3 (attention / MLA heads TP,
// MoE TP or EP) so far.
  const std::string& a = cfg.architecture;
  bool tp_ok = a == "LlamaForCausalLM" || a == "MistralForCausalLM" || a == "Qwen2ForCausalLM" ||
               a == "Qwen3ForCausalLM" || a == "Qwen3MoeForCausalLM" || a == "DeepseekV3ForCausalLM";
  TS_CHECK(opts.mapping.tp_size == 1 || tp_ok, "{}: --tp-size {} is not supported for {} yet (Llama/Qwen2/Qwen3/Mistral/Qwen3-MoE/DeepSeek-V3 only)",
           cfg.path, opts.mapping.tp_size, cfg.architecture);
  TS_CHECK(opts.mapping.tp_size == 1 || opts.comm, "{}: --tp-size {} needs a communicator", cfg.path, opts.mapping.tp_size);
  return it->second(cfg, opts);
}

bool has_recurrent_layers(const io::ModelConfig& cfg) {
  if (!cfg.has("layer_types") || !cfg.raw["layer_types"].is_array()) return false;
  for (auto& t : cfg.raw["layer_types"])
    if (t.is_string() && t.get<std::string>() == "linear_attention") return true;
  return false;
}

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& opts) {
  return create_model(io::load_config(dir), opts);
}

}  // namespace ts::models
