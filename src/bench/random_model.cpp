#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include "bench/random_model.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>

#include "bench/random_fill.h"
#include "core/fp8.h"
#include "core/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ts::bench {

// --- presets -----------------------------------------------------------------------------------

namespace {

json llama3_rope(double factor) {
  return {{"factor", factor}, {"high_freq_factor", 4.0}, {"low_freq_factor", 1.0},
          {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
}

json llama_base() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", 128000},
          {"eos_token_id", {128001, 128008, 128009}},
          {"hidden_act", "silu"},
          {"initializer_range", 0.02},
          {"mlp_bias", false},
          {"model_type", "llama"},
          {"pretraining_tp", 1},
          {"rms_norm_eps", 1e-05},
          {"rope_theta", 500000.0},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.45.0"},
          {"use_cache", true},
          {"vocab_size", 128256}};
}

json qwen3_base() {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", 151643},
          {"eos_token_id", 151645},
          {"head_dim", 128},
          {"hidden_act", "silu"},
          {"initializer_range", 0.02},
          {"max_position_embeddings", 40960},
          {"model_type", "qwen3"},
          {"rms_norm_eps", 1e-06},
          {"rope_scaling", nullptr},
          {"rope_theta", 1000000.0},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.51.0"},
          {"use_cache", true},
          {"use_sliding_window", false},
          {"vocab_size", 151936}};
}

bool is_eagle3(const std::string& arch) { return arch == "LlamaForCausalLMEagle3" || arch == "Eagle3LlamaForCausalLM"; }

std::vector<int> eagle_aux_ids(int64_t target_layers) {
  int64_t L = target_layers;
  if (L >= 6) return {1, int(L / 2 - 1), int(L - 4)};  // SpecForge's default: 32 -> [1, 15, 28]
  std::vector<int> ids = {0, int(L / 2), int(L - 1)};  // shallow test targets: distinct ids only
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"llama-3.1-8b", "llama-3.2-1b", "qwen3-8b", "qwen3-30b-a3b", "eagle3-llama-3.1-8b"};
}

json preset_config(const std::string& name) {
  if (name == "llama-3.1-8b") {
    json c = llama_base();
    c.update({{"head_dim", 128}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"max_position_embeddings", 131072},
              {"num_attention_heads", 32}, {"num_hidden_layers", 32}, {"num_key_value_heads", 8},
              {"rope_scaling", llama3_rope(8.0)}, {"tie_word_embeddings", false}});
    return c;
  }
  if (name == "llama-3.2-1b") {
    json c = llama_base();
    c.update({{"head_dim", 64}, {"hidden_size", 2048}, {"intermediate_size", 8192}, {"max_position_embeddings", 131072},
              {"num_attention_heads", 32}, {"num_hidden_layers", 16}, {"num_key_value_heads", 8},
              {"rope_scaling", llama3_rope(32.0)}, {"tie_word_embeddings", true}});
    return c;
  }
  if (name == "qwen3-8b") {
    json c = qwen3_base();
    c.update({{"hidden_size", 4096}, {"intermediate_size", 12288}, {"max_window_layers", 36}, {"num_attention_heads", 32},
              {"num_hidden_layers", 36}, {"num_key_value_heads", 8}});
    return c;
  }
  if (name == "qwen3-30b-a3b") {
    json c = qwen3_base();
    c.update({{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"decoder_sparse_step", 1},
              {"hidden_size", 2048}, {"intermediate_size", 6144}, {"max_window_layers", 48}, {"mlp_only_layers", json::array()},
              {"moe_intermediate_size", 768}, {"norm_topk_prob", true}, {"num_attention_heads", 32}, {"num_experts", 128},
              {"num_experts_per_tok", 8}, {"num_hidden_layers", 48}, {"num_key_value_heads", 4},
              {"output_router_logits", false}, {"router_aux_loss_coef", 0.001}});
    return c;
  }
  if (name == "eagle3-llama-3.1-8b") {
    json c = llama_base();
    c.erase("pretraining_tp");
    c.update({{"architectures", {"LlamaForCausalLMEagle3"}}, {"draft_vocab_size", 32000},
              {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", eagle_aux_ids(32)}, {"use_aux_hidden_state", true}}},
              {"head_dim", 128}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"max_position_embeddings", 131072},
              {"num_attention_heads", 32}, {"num_hidden_layers", 1}, {"num_key_value_heads", 8},
              {"rope_scaling", llama3_rope(8.0)}, {"target_hidden_size", 4096}, {"tie_word_embeddings", false}});
    return c;
  }
  std::string list;
  for (auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  fail("unknown preset '{}' (presets: {})", name, list);
}

void apply_overrides(json& c, const ConfigOverrides& o) {
  std::string arch = c.value("architectures", json::array({""}))[0].get<std::string>();
  bool eagle = is_eagle3(arch);
  auto set_pos = [&](const char* key, int64_t v, const char* flag) {
    if (v < 0) return;
    TS_CHECK(v > 0, "{} must be > 0 (got {})", flag, v);
    c[key] = v;
  };
  if (o.num_layers >= 0) {
    TS_CHECK(!eagle || o.num_layers == 1, "EAGLE3 drafts have one layer: use --target-num-layers to set the target depth");
    set_pos("num_hidden_layers", o.num_layers, "--num-layers");
    if (c.contains("max_window_layers")) c["max_window_layers"] = o.num_layers;
  }
  set_pos("hidden_size", o.hidden_size, "--hidden-size");
  if (eagle && o.hidden_size > 0) c["target_hidden_size"] = o.hidden_size;
  set_pos("intermediate_size", o.intermediate_size, "--intermediate-size");
  set_pos("vocab_size", o.vocab_size, "--vocab-size");
  if (eagle && o.vocab_size > 0 && o.draft_vocab_size < 0)
    c["draft_vocab_size"] = std::min<int64_t>(c.value("draft_vocab_size", int64_t(32000)), std::max<int64_t>(o.vocab_size / 2, 1));
  set_pos("draft_vocab_size", o.draft_vocab_size, "--draft-vocab-size");
  set_pos("num_attention_heads", o.num_heads, "--num-heads");
  set_pos("num_key_value_heads", o.num_kv_heads, "--num-kv-heads");
  set_pos("head_dim", o.head_dim, "--head-dim");
  set_pos("num_experts", o.num_experts, "--num-experts");
  set_pos("num_experts_per_tok", o.num_experts_per_tok, "--num-experts-per-tok");
  set_pos("moe_intermediate_size", o.moe_intermediate_size, "--moe-intermediate-size");
  if (c.contains("num_experts") && c.contains("num_experts_per_tok"))
    c["num_experts_per_tok"] = std::min(c["num_experts_per_tok"].get<int64_t>(), c["num_experts"].get<int64_t>());
  if (o.target_num_layers >= 0) {
    TS_CHECK(eagle, "--target-num-layers is for EAGLE3 drafts");
    TS_CHECK(o.target_num_layers > 0, "--target-num-layers must be > 0");
    c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = eagle_aux_ids(o.target_num_layers);
  }
  // Keep the config self-consistent after shape changes.
  if (c.contains("num_attention_heads") && c.contains("num_key_value_heads"))
    TS_CHECK(c["num_attention_heads"].get<int64_t>() % c["num_key_value_heads"].get<int64_t>() == 0,
             "num_attention_heads {} is not a multiple of num_key_value_heads {}", c["num_attention_heads"].get<int64_t>(),
             c["num_key_value_heads"].get<int64_t>());
}

// --- tensors -----------------------------------------------------------------------------------

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> checkpoint_tensors(const json& c, DType wd) {
  auto req = [&](const char* key) -> int64_t {
    TS_CHECK(c.contains(key) && c[key].is_number_integer(), "config.json: missing integer field {}", key);
    return c[key].get<int64_t>();
  };
  TS_CHECK(c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty(),
           "config.json: missing architectures");
  std::string arch = c["architectures"][0].get<std::string>();
  int64_t V = req("vocab_size"), H = req("hidden_size"), I = req("intermediate_size"), L = req("num_hidden_layers");
  int64_t nh = req("num_attention_heads");
  int64_t nkv = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null() ? req("num_key_value_heads") : nh;
  int64_t hd = c.contains("head_dim") && !c["head_dim"].is_null() ? req("head_dim") : H / nh;
  int64_t qw = nh * hd, kw = nkv * hd;
  bool attn_bias = c.value("attention_bias", false);
  std::vector<TensorSpec> t;
  auto W = [&](std::string n, std::vector<int64_t> s) { t.push_back({std::move(n), std::move(s), wd, Init::normal}); };
  auto N = [&](std::string n, int64_t d) { t.push_back({std::move(n), {d}, wd, Init::ones}); };

  if (is_eagle3(arch)) {
    int64_t Ht = c.value("target_hidden_size", H), dv = c.value("draft_vocab_size", V);
    int64_t k = 3;
    if (c.contains("eagle_config") && c["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"))
      k = int64_t(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"].size());
    TS_CHECK(dv > 0 && dv <= V, "draft_vocab_size {} must be in 1..vocab_size {}", dv, V);
    W("fc.weight", {H, k * Ht});
    N("midlayer.input_layernorm.weight", H);
    N("midlayer.hidden_norm.weight", H);
    W("midlayer.self_attn.q_proj.weight", {qw, 2 * H});
    W("midlayer.self_attn.k_proj.weight", {kw, 2 * H});
    W("midlayer.self_attn.v_proj.weight", {kw, 2 * H});
    W("midlayer.self_attn.o_proj.weight", {H, qw});
    N("midlayer.post_attention_layernorm.weight", H);
    W("midlayer.mlp.gate_proj.weight", {I, H});
    W("midlayer.mlp.up_proj.weight", {I, H});
    W("midlayer.mlp.down_proj.weight", {H, I});
    N("norm.weight", H);
    W("lm_head.weight", {dv, H});
    t.push_back({"d2t", {dv}, DType::i64, Init::d2t});
    t.push_back({"t2d", {V}, DType::boolean, Init::t2d});
    return t;
  }

  static const std::vector<std::string> dense = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};
  TS_CHECK(std::find(dense.begin(), dense.end(), arch) != dense.end(),
           "make-random-model: architecture {} is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
           "Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLMEagle3)",
           arch);
  bool qwen2 = arch == "Qwen2ForCausalLM", qk_norm = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  bool moe = arch == "Qwen3MoeForCausalLM";
  int64_t E = moe ? req("num_experts") : 0, Im = moe ? req("moe_intermediate_size") : 0;
  int64_t step = c.value("decoder_sparse_step", int64_t(1));
  std::vector<int64_t> mlp_only = c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array()
                                      ? c["mlp_only_layers"].get<std::vector<int64_t>>()
                                      : std::vector<int64_t>{};
  W("model.embed_tokens.weight", {V, H});
  for (int64_t l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    N(p + "input_layernorm.weight", H);
    W(p + "self_attn.q_proj.weight", {qw, H});
    if (attn_bias || qwen2) W(p + "self_attn.q_proj.bias", {qw});
    W(p + "self_attn.k_proj.weight", {kw, H});
    if (attn_bias || qwen2) W(p + "self_attn.k_proj.bias", {kw});
    W(p + "self_attn.v_proj.weight", {kw, H});
    if (attn_bias || qwen2) W(p + "self_attn.v_proj.bias", {kw});
    W(p + "self_attn.o_proj.weight", {H, qw});
    if (attn_bias && !qwen2) W(p + "self_attn.o_proj.bias", {H});
    if (qk_norm) {
      N(p + "self_attn.q_norm.weight", hd);
      N(p + "self_attn.k_norm.weight", hd);
    }
    N(p + "post_attention_layernorm.weight", H);
    bool sparse = moe && E > 0 && std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && (l + 1) % step == 0;
    if (sparse) {
      W(p + "mlp.gate.weight", {E, H});
      for (int64_t e = 0; e < E; ++e) {
        std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        W(q + "gate_proj.weight", {Im, H});
        W(q + "up_proj.weight", {Im, H});
        W(q + "down_proj.weight", {H, Im});
      }
    } else {
      W(p + "mlp.gate_proj.weight", {I, H});
      W(p + "mlp.up_proj.weight", {I, H});
      W(p + "mlp.down_proj.weight", {H, I});
    }
  }
  N("model.norm.weight", H);
  if (!c.value("tie_word_embeddings", false)) W("lm_head.weight", {V, H});
  return t;
}


// --- quantized checkpoints ---------------------------------------------------------------------

std::vector<std::string> quant_formats() { return {"fp8", "fp8-channel", "fbgemm-fp8", "nvfp4", "ct-nvfp4", "modelopt-mixed"}; }

void quantize_checkpoint(std::vector<TensorSpec>& specs, json& cfg, json& hf_quant, const std::string& quant) {
  const std::vector<std::string> formats = quant_formats();
  std::string list;
  for (auto& f : formats) list += (list.empty() ? "" : ", ") + f;
  TS_CHECK(std::find(formats.begin(), formats.end(), quant) != formats.end(), "--quant '{}' is not supported (supported: {})",
           quant, list);
  // Stored values span the format: amax ~ 4 sigma of N(0, 0.02) maps to the format's max.
  const float amax = 0.08f;
  const float s_block = amax / kE4m3Max;                              // fp8 block / FP8_PB_WO (F32)
  const float s_chan = bf16_to_f32(f32_to_bf16(s_block));            // fp8-channel (BF16 scale)
  const uint8_t mx_code = f32_to_e8m0_ceil(amax / kE4m3Max);          // MXFP8: a power of two >= amax/448
  const float mx_scale = e8m0_to_f32(mx_code);
  const float fp4_block = 256.0f;                                      // NVFP4 per-16 scale (exact in e4m3)
  const float fp4_global = amax / kE2m1Max / fp4_block;               // weight_scale_2
  json layers = json::object();
  json not_converted = json::array();  // fbgemm-fp8: the modules left in the model dtype
  std::vector<TensorSpec> out;
  auto module_of = [](const std::string& n) { return n.substr(0, n.size() - std::string(".weight").size()); };
  for (auto& t : specs) {
    bool linear = t.init == Init::normal && t.shape.size() == 2 && t.name.size() > 7 &&
                  t.name.compare(t.name.size() - 7, 7, ".weight") == 0 &&
                  (t.name.find("self_attn.") != std::string::npos || t.name.find("mlp.") != std::string::npos) &&
                  t.name.find("mlp.gate.weight") == std::string::npos;
    // Meta's FBGEMM FP8 checkpoints quantize the MLPs and leave attention in bf16, listing it.
    if (linear && quant == "fbgemm-fp8" && t.name.find("self_attn.") != std::string::npos) {
      not_converted.push_back(module_of(t.name));
      linear = false;
    }
    if (!linear) {
      out.push_back(t);
      continue;
    }
    const std::string m = module_of(t.name);
    const int64_t N = t.shape[0], K = t.shape[1];
    std::string algo;  // per module for modelopt-mixed
    if (quant == "fp8") algo = "FP8_BLOCK";
    else if (quant == "fp8-channel") algo = "FP8_CHANNEL";
    else if (quant == "fbgemm-fp8") algo = "FBGEMM_FP8";
    else if (quant == "nvfp4") algo = "NVFP4";
    else if (quant == "ct-nvfp4") algo = "CT_NVFP4";
    else {
      bool attn = m.find("self_attn.") != std::string::npos;
      if (attn) algo = m.size() >= 6 && m.compare(m.size() - 6, 6, "o_proj") == 0 ? "FP8_PB_WO" : "MXFP8";
      else if (m.find("shared_expert") != std::string::npos) algo = "MXFP8";
      else algo = "NVFP4";
      size_t ex = m.find(".experts.");
      if (ex != std::string::npos) layers[m.substr(0, ex + 8)] = {{"quant_algo", algo}, {"group_size", 16}};
      else layers[m] = algo == "NVFP4" ? json{{"quant_algo", algo}, {"group_size", 16}} : json{{"quant_algo", algo}};
    }
    auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    if (algo == "FP8_BLOCK" || algo == "FP8_PB_WO") {
      out.push_back({t.name, {N, K}, DType::f8_e4m3, Init::e4m3, s_block});
      out.push_back({m + (algo == "FP8_BLOCK" ? ".weight_scale_inv" : ".weight_scale"), {cdiv(N, 128), cdiv(K, 128)},
                     DType::f32, Init::constant, s_block});
    } else if (algo == "FP8_CHANNEL") {
      out.push_back({t.name, {N, K}, DType::f8_e4m3, Init::e4m3, s_chan});
      out.push_back({m + ".weight_scale", {N, 1}, DType::bf16, Init::constant, s_chan});
    } else if (algo == "FBGEMM_FP8") {
      out.push_back({t.name, {N, K}, DType::f8_e4m3, Init::e4m3, s_block});
      out.push_back({m + ".weight_scale", {N, 1}, DType::f32, Init::constant, s_block});
    } else if (algo == "CT_NVFP4") {
      // The same codes and per-16 scales as ModelOpt's; the global scale stored as its divisor.
      TS_CHECK(K % 16 == 0, "--quant {}: {} has K = {}, not a multiple of 16 (NVFP4)", quant, t.name, K);
      out.push_back({m + ".weight_packed", {N, K / 2}, DType::u8, Init::e2m1, fp4_block * fp4_global});
      out.push_back({m + ".weight_scale", {N, K / 16}, DType::f8_e4m3, Init::constant, fp4_block});
      out.push_back({m + ".weight_global_scale", {1}, DType::f32, Init::constant, 1.0f / fp4_global});
      out.push_back({m + ".input_global_scale", {1}, DType::f32, Init::constant, kE4m3Max * kE2m1Max / 8.0f});
    } else if (algo == "MXFP8") {
      TS_CHECK(K % 32 == 0, "--quant {}: {} has K = {}, not a multiple of 32 (MXFP8)", quant, t.name, K);
      out.push_back({t.name, {N, K}, DType::f8_e4m3, Init::e4m3, mx_scale});
      out.push_back({m + ".weight_scale", {N, K / 32}, DType::u8, Init::constant, float(mx_code)});
    } else {
      TS_CHECK(K % 16 == 0, "--quant {}: {} has K = {}, not a multiple of 16 (NVFP4)", quant, t.name, K);
      out.push_back({t.name, {N, K / 2}, DType::u8, Init::e2m1, fp4_block * fp4_global});
      out.push_back({m + ".weight_scale", {N, K / 16}, DType::f8_e4m3, Init::constant, fp4_block});
      out.push_back({m + ".weight_scale_2", {}, DType::f32, Init::constant, fp4_global});
      out.push_back({m + ".input_scale", {}, DType::f32, Init::constant, 1.0f});
    }
  }
  specs = std::move(out);
  if (quant == "fp8") {
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {128, 128}}};
  } else if (quant == "fp8-channel") {
    cfg["quantization_config"] = {
        {"quant_method", "compressed-tensors"}, {"format", "float-quantized"}, {"quantization_status", "compressed"},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"symmetric", true}, {"dynamic", true}}}}}}},
        {"ignore", {"lm_head"}}};
  } else if (quant == "ct-nvfp4") {
    json fp4 = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16},
                {"symmetric", true}, {"observer", "minmax"}};
    json weights = fp4, acts = fp4;
    weights["dynamic"] = false;
    acts["dynamic"] = "local";
    cfg["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                  {"format", "nvfp4-pack-quantized"},
                                  {"quantization_status", "compressed"},
                                  {"config_groups",
                                   {{"group_0",
                                     {{"targets", {"Linear"}},
                                      {"format", "nvfp4-pack-quantized"},
                                      {"weights", weights},
                                      {"input_activations", acts}}}}},
                                  {"ignore", {"lm_head", "re:.*mlp[.]gate$"}}};
  } else if (quant == "fbgemm-fp8") {
    not_converted.push_back("lm_head");
    cfg["quantization_config"] = {
        {"quant_method", "fbgemm_fp8"}, {"activation_scale_ub", 1200.0}, {"modules_to_not_convert", not_converted}};
  } else {
    json q = {{"quant_algo", quant == "nvfp4" ? "NVFP4" : "MIXED_PRECISION"},
              {"kv_cache_quant_algo", nullptr},
              {"exclude_modules", {"lm_head", "model.layers.*.mlp.gate"}}};
    if (quant == "nvfp4") q["group_size"] = 16;
    else q["quantized_layers"] = layers;
    hf_quant = {{"producer", {{"name", "modelopt"}, {"version", "0.37.0"}}}, {"quantization", q}};
    json qc = q;
    qc["quant_method"] = "modelopt";
    cfg["quantization_config"] = qc;
  }
}

// --- tokenizer ---------------------------------------------------------------------------------

namespace {

std::string tok_of_byte(uint8_t b) { return tok::byte_level::bytes_to_token(std::string(1, char(b))); }

json added_token(int32_t id, const std::string& content, bool special) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", !special}, {"special", special}};
}

const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kQwenSplit =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Written for these generated tokenizers (same structure as the families' own templates).
const char* kLlama3Chat =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
const char* kChatml =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

}  // namespace

GeneratedTokenizer generate_tokenizer(int64_t vocab, const std::string& family) {
  TS_CHECK(family == "llama3" || family == "qwen", "generate_tokenizer: unknown family {}", family);
  bool qwen = family == "qwen";
  // Specials at the top of the id range: the real ids for the real vocab sizes
  // (llama3 128256 -> 128000.., qwen 151936 -> 151643..); 32 of them for tiny vocabularies.
  int64_t S = vocab >= 4096 ? (qwen ? 293 : 256) : 32;
  TS_CHECK(vocab >= 256 + S, "--vocab-size {} is too small for a generated byte-level tokenizer (need >= {})", vocab, 256 + S);
  int64_t base = vocab - S, merges_n = base - 256;

  std::vector<std::pair<std::string, bool>> specials;  // content, special
  if (qwen) {
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                          "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                          "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"})
      specials.emplace_back(s, true);
    for (const char* s : {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                          "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"})
      specials.emplace_back(s, false);
  } else {
    for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                          "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>",
                          "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"})
      specials.emplace_back(s, true);
  }
  for (int k = qwen ? 0 : 3; int64_t(specials.size()) < S; ++k)
    specials.emplace_back("<|reserved_special_token_" + std::to_string(k) + "|>", true);

  // Model vocabulary: 256 byte tokens, then one token per merge.
  json vocab_j = json::object();
  json merges = json::array();
  for (int b = 0; b < 256; ++b) vocab_j[tok_of_byte(uint8_t(b))] = b;
  const std::string letters = "etaoinsrhldcumfpgwybvkxjqz";
  const std::string space = tok_of_byte(' ');  // "Ġ"
  std::vector<std::string> prev;               // tokens of the previous level
  for (char ch : letters) prev.push_back(std::string(1, ch));
  int64_t id = 256;
  // Level 2: "Ġx" and "xy"; level n: (token of level n-1, letter). A token of level n may carry
  // the leading-space marker, which counts as one symbol.
  std::vector<std::string> level_prefixes;
  {
    std::vector<std::string> cur;
    for (char ch : letters) {
      if (id >= base) break;
      std::string t = space + ch;
      vocab_j[t] = id++;
      merges.push_back({space, std::string(1, ch)});
      cur.push_back(t);
    }
    for (const auto& p : prev)
      for (char ch : letters) {
        if (id >= base) break;
        std::string t = p + ch;
        vocab_j[t] = id++;
        merges.push_back({p, std::string(1, ch)});
        cur.push_back(t);
      }
    prev = std::move(cur);
  }
  while (id < base) {
    TS_CHECK(!prev.empty(), "generate_tokenizer: ran out of merges");
    std::vector<std::string> cur;
    for (const auto& p : prev) {
      for (char ch : letters) {
        if (id >= base) break;
        std::string t = p + ch;
        vocab_j[t] = id++;
        merges.push_back({p, std::string(1, ch)});
        cur.push_back(t);
      }
      if (id >= base) break;
    }
    prev = std::move(cur);
  }
  (void)merges_n;

  GeneratedTokenizer g;
  json added = json::array();
  for (size_t i = 0; i < specials.size(); ++i) added.push_back(added_token(int32_t(base + int64_t(i)), specials[i].first, specials[i].second));
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"Regex", qwen ? kQwenSplit : kLlama3Split}}}, {"behavior", "Isolated"}, {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  json post;
  if (qwen) {
    post = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  } else {
    std::string bos = specials[0].first;
    json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    post = {{"type", "Sequence"},
            {"processors",
             {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
              {{"type", "TemplateProcessing"},
               {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
               {"pair", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_piece, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
               {"special_tokens", {{bos, {{"id", bos}, {"ids", {base}}, {"tokens", {bos}}}}}}}}}};
  }
  g.tokenizer_json = {{"version", "1.0"},
                      {"truncation", nullptr},
                      {"padding", nullptr},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", pre},
                      {"post_processor", post},
                      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", !qwen},
                        {"vocab", std::move(vocab_j)},
                        {"merges", std::move(merges)}}}};
  if (qwen) {
    g.bos_id = int32_t(base);  // config.json's bos_token_id (the tokenizer adds none)
    g.pad_id = int32_t(base);
    g.eos_ids = {int32_t(base + 2), int32_t(base)};  // <|im_end|>, <|endoftext|>
    g.tokenizer_config = {{"add_bos_token", false},      {"add_prefix_space", false}, {"bos_token", nullptr},
                          {"eos_token", "<|im_end|>"},   {"pad_token", "<|endoftext|>"}, {"errors", "replace"},
                          {"model_max_length", 131072},  {"tokenizer_class", "Qwen2Tokenizer"},
                          {"clean_up_tokenization_spaces", false}, {"chat_template", kChatml}};
  } else {
    g.bos_id = int32_t(base);
    g.eos_ids = {int32_t(base + 1), int32_t(base + 8), int32_t(base + 9)};  // end_of_text, eom, eot
    g.tokenizer_config = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}, {"model_max_length", 131072},
                          {"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", true},
                          {"model_input_names", {"input_ids", "attention_mask"}}, {"chat_template", kLlama3Chat}};
  }
  return g;
}

// --- writer ------------------------------------------------------------------------------------

namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  TS_CHECK(f.good(), "{}: cannot write", p.string());
  f << s;
  TS_CHECK(f.good(), "{}: write failed", p.string());
}

void pwrite_all(int fd, const char* p, size_t n, size_t off, const std::string& path) {
  while (n) {
    ssize_t w = ::pwrite(fd, p, n, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    TS_CHECK(w > 0, "{}: write failed ({})", path, std::strerror(errno));
    p += w, n -= size_t(w), off += size_t(w);
  }
}

std::string family_of(const json& c) {
  std::string mt = c.value("model_type", "");
  return mt.rfind("qwen", 0) == 0 ? "qwen" : "llama3";
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the spec list
  std::vector<size_t> offsets;  // data offsets
  std::string header;           // 8-byte aligned header text
  size_t data_bytes = 0;
};

}  // namespace

RandomModelResult make_random_model(const RandomModelOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  TS_CHECK(!o.out_dir.empty(), "--out is required");
  TS_CHECK(o.preset.empty() != o.config_path.empty(), "give exactly one of --preset or --config");
  TS_CHECK(o.dtype == DType::bf16 || o.dtype == DType::f16 || o.dtype == DType::f32, "--dtype must be bf16, f16 or f32");
  json cfg;
  if (!o.preset.empty()) {
    cfg = preset_config(o.preset);
  } else {
    std::ifstream f(o.config_path);
    TS_CHECK(f.good(), "{}: cannot read", o.config_path);
    try {
      cfg = json::parse(f);
    } catch (const std::exception& e) {
      fail("{}: invalid JSON: {}", o.config_path, e.what());
    }
  }
  apply_overrides(cfg, o.overrides);
  cfg["torch_dtype"] = o.dtype == DType::bf16 ? "bfloat16" : o.dtype == DType::f16 ? "float16" : "float32";
  std::vector<TensorSpec> specs = checkpoint_tensors(cfg, o.dtype);
  json hf_quant;
  if (!o.quant.empty()) quantize_checkpoint(specs, cfg, hf_quant, o.quant);
  const int64_t vocab = cfg["vocab_size"].get<int64_t>();
  fs::create_directories(o.out_dir);
  fs::path out(o.out_dir);
  RandomModelResult res;

  // Tokenizer: --tokenizer DIR, else the demo model's when its vocabulary has exactly vocab_size
  // ids (a smaller one would let the model emit ids the tokenizer cannot decode), else generated.
  std::string src_dir = o.tokenizer_dir;
  if (src_dir.empty()) {
    std::string demo = std::string(TS_SOURCE_DIR) + "/models/pycoder";
    if (fs::exists(fs::path(demo) / "tokenizer.json") && tok::Tokenizer::from_dir(demo)->vocab_size() == vocab) src_dir = demo;
  }
  json gen_cfg = {{"_from_model_config", true}, {"transformers_version", cfg.value("transformers_version", "4.51.0")}};
  if (!src_dir.empty()) {
    TS_CHECK(fs::exists(fs::path(src_dir) / "tokenizer.json"), "--tokenizer {}: no tokenizer.json there", src_dir);
    auto tk = tok::Tokenizer::from_dir(src_dir);
    TS_CHECK(tk->vocab_size() <= vocab, "--tokenizer {}: its vocabulary ({} ids) is larger than vocab_size {}", src_dir,
             tk->vocab_size(), vocab);
    if (tk->vocab_size() < vocab)
      spdlog::warn("--tokenizer {}: {} ids for vocab_size {}: ids past the tokenizer's cannot be decoded to text", src_dir,
                   tk->vocab_size(), vocab);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})
      if (fs::exists(fs::path(src_dir) / f)) fs::copy_file(fs::path(src_dir) / f, out / f, fs::copy_options::overwrite_existing);
    // The source model's bos/eos ids go with its tokenizer.
    if (fs::exists(fs::path(src_dir) / "config.json")) {
      json sc = json::parse(std::ifstream(fs::path(src_dir) / "config.json"));
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (sc.contains(k)) cfg[k] = sc[k];
    } else {
      if (auto b = tk->bos_id()) cfg["bos_token_id"] = *b;
      if (auto e = tk->eos_id()) cfg["eos_token_id"] = *e;
    }
    if (fs::exists(fs::path(src_dir) / "generation_config.json")) {
      json sg = json::parse(std::ifstream(fs::path(src_dir) / "generation_config.json"));
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (sg.contains(k)) gen_cfg[k] = sg[k];
    }
    res.tokenizer_source = "copied from " + src_dir;
  } else {
    GeneratedTokenizer g = generate_tokenizer(vocab, family_of(cfg));
    write_text(out / "tokenizer.json", g.tokenizer_json.dump(1));
    write_text(out / "tokenizer_config.json", g.tokenizer_config.dump(2) + "\n");
    cfg["bos_token_id"] = g.bos_id >= 0 ? json(g.bos_id) : json(nullptr);
    if (family_of(cfg) == "qwen") {
      cfg["eos_token_id"] = g.eos_ids[0];
      gen_cfg["pad_token_id"] = g.pad_id;
    } else {
      cfg["eos_token_id"] = g.eos_ids;
    }
    res.tokenizer_source = "generated (byte-level BPE, " + std::to_string(vocab) + " ids)";
  }
  if (!gen_cfg.contains("bos_token_id") && cfg.contains("bos_token_id") && !cfg["bos_token_id"].is_null())
    gen_cfg["bos_token_id"] = cfg["bos_token_id"];
  if (!gen_cfg.contains("eos_token_id") && cfg.contains("eos_token_id")) {
    gen_cfg["eos_token_id"] = cfg["eos_token_id"];
    if (family_of(cfg) == "qwen" && src_dir.empty() && cfg["eos_token_id"].is_number())
      gen_cfg["eos_token_id"] = {cfg["eos_token_id"].get<int64_t>(), gen_cfg.value("pad_token_id", int64_t(0))};
  }
  write_text(out / "config.json", cfg.dump(2) + "\n");
  if (!hf_quant.is_null()) write_text(out / "hf_quant_config.json", hf_quant.dump(2) + "\n");
  else if (fs::exists(out / "hf_quant_config.json")) fs::remove(out / "hf_quant_config.json");
  write_text(out / "generation_config.json", gen_cfg.dump(2) + "\n");

  // Remove weights of an earlier run (a different shard count would leave stale files).
  for (auto& e : fs::directory_iterator(out)) {
    std::string n = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json") fs::remove(e.path());
  }

  // Shards: tensors in order, a new file when the next tensor would pass max_shard_bytes.
  std::vector<Shard> shards(1);
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t nb = specs[i].nbytes();
    if (!shards.back().tensors.empty() && shards.back().data_bytes + nb > o.max_shard_bytes) shards.emplace_back();
    shards.back().offsets.push_back(shards.back().data_bytes);
    shards.back().tensors.push_back(i);
    shards.back().data_bytes += nb;
  }
  const size_t ns = shards.size();
  json weight_map = json::object();
  size_t total = 0;
  for (size_t s = 0; s < ns; ++s) {
    Shard& sh = shards[s];
    sh.file = ns == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, ns);
    json h = json::object();
    h["__metadata__"] = {{"format", "pt"}};
    for (size_t k = 0; k < sh.tensors.size(); ++k) {
      const TensorSpec& t = specs[sh.tensors[k]];
      h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {sh.offsets[k], sh.offsets[k] + t.nbytes()}}};
      weight_map[t.name] = sh.file;
    }
    sh.header = h.dump();
    while ((sh.header.size() + 8) % 8) sh.header += ' ';
    total += sh.data_bytes;
  }

  // Work items: pieces of <= 16 MiB, interleaved across files so the writes to different files
  // (each with its own inode lock) overlap.
  struct Task {
    size_t shard, file_off, spec;
    uint64_t first;
    size_t n;
  };
  const size_t piece = size_t(16) << 20;
  std::vector<std::vector<Task>> per_shard(ns);
  for (size_t s = 0; s < ns; ++s) {
    size_t data_start = 8 + shards[s].header.size();
    for (size_t k = 0; k < shards[s].tensors.size(); ++k) {
      size_t si = shards[s].tensors[k];
      const TensorSpec& t = specs[si];
      size_t es = dtype_size(t.dtype), n = size_t(t.numel());
      bool chunked = t.init == Init::normal || t.init == Init::ones || t.init == Init::constant || t.init == Init::e4m3 ||
                     t.init == Init::e2m1;
      size_t step = chunked ? std::max<size_t>(piece / es, 1) : std::max<size_t>(n, 1);
      for (size_t b = 0; b < n; b += step)
        per_shard[s].push_back({s, data_start + shards[s].offsets[k] + b * es, si, b, std::min(step, n - b)});
    }
  }
  std::vector<Task> tasks;
  for (size_t r = 0;; ++r) {
    bool any = false;
    for (size_t s = 0; s < ns; ++s)
      if (r < per_shard[s].size()) tasks.push_back(per_shard[s][r]), any = true;
    if (!any) break;
  }

  // EAGLE3 vocabulary maps: a seeded random subset of dv target ids, sorted;
  // d2t[i] = target_id[i] - i, t2d[target_id] = true.
  std::vector<int64_t> d2t;
  std::vector<uint8_t> t2d;
  for (const auto& t : specs)
    if (t.init == Init::d2t) {
      int64_t dv = t.shape[0];
      std::vector<int64_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::mt19937_64 rng(stream_key(o.seed, "d2t"));
      for (int64_t i = 0; i < dv; ++i) {
        std::uniform_int_distribution<int64_t> d(i, vocab - 1);
        std::swap(ids[size_t(i)], ids[size_t(d(rng))]);
      }
      ids.resize(size_t(dv));
      std::sort(ids.begin(), ids.end());
      d2t.resize(size_t(dv));
      t2d.assign(size_t(vocab), 0);
      for (int64_t i = 0; i < dv; ++i) d2t[size_t(i)] = ids[size_t(i)] - i, t2d[size_t(ids[size_t(i)])] = 1;
    }

  std::vector<int> fds(ns, -1);
  std::vector<std::string> paths(ns);
  for (size_t s = 0; s < ns; ++s) {
    paths[s] = (out / shards[s].file).string();
    fds[s] = ::open(paths[s].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    TS_CHECK(fds[s] >= 0, "{}: cannot create ({})", paths[s], std::strerror(errno));
    size_t size = 8 + shards[s].header.size() + shards[s].data_bytes;
    TS_CHECK(::ftruncate(fds[s], off_t(size)) == 0, "{}: cannot size to {} bytes ({})", paths[s], size, std::strerror(errno));
    uint64_t hl = shards[s].header.size();
    pwrite_all(fds[s], reinterpret_cast<const char*>(&hl), 8, 0, paths[s]);
    pwrite_all(fds[s], shards[s].header.data(), shards[s].header.size(), 8, paths[s]);
  }
  std::vector<uint64_t> keys(specs.size());
  // A quantized weight draws the stream of the float weight it stands for (compressed-tensors
  // NVFP4 stores X.weight as X.weight_packed), so every format of one seed tracks one model.
  auto stream_name = [](const std::string& n) {
    const std::string packed = ".weight_packed";
    return n.size() > packed.size() && n.compare(n.size() - packed.size(), packed.size(), packed) == 0
               ? n.substr(0, n.size() - packed.size()) + ".weight"
               : n;
  };
  for (size_t i = 0; i < specs.size(); ++i) keys[i] = stream_key(o.seed, stream_name(specs[i].name));
  fill_normal(nullptr, DType::f32, 0, 0, 0, 0.0f);  // builds the quantile table before the threads start
  std::string error;
  std::mutex err_mu;
#pragma omp parallel
  {
    std::vector<char> buf;
    std::vector<float> fbuf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < int64_t(tasks.size()); ++ti) {
      const Task& k = tasks[size_t(ti)];
      const TensorSpec& t = specs[k.spec];
      try {
        const char* src = nullptr;
        size_t nb = k.n * dtype_size(t.dtype);
        if (t.init == Init::normal || t.init == Init::ones) {
          if (buf.size() < nb) buf.resize(nb);
          if (t.init == Init::normal) fill_normal(buf.data(), t.dtype, keys[k.spec], k.first, k.n, 0.02f);
          else fill_constant(buf.data(), t.dtype, k.n, 1.0f);
          src = buf.data();
        } else if (t.init == Init::constant) {
          if (buf.size() < nb) buf.resize(nb);
          if (t.dtype == DType::f8_e4m3) std::memset(buf.data(), f32_to_e4m3(t.value), nb);
          else if (t.dtype == DType::u8 || t.dtype == DType::f8_e8m0) std::memset(buf.data(), int(t.value), nb);
          else fill_constant(buf.data(), t.dtype, k.n, t.value);
          src = buf.data();
        } else if (t.init == Init::e4m3 || t.init == Init::e2m1) {
          // Normals in f32 (the same stream a float weight of this name would get), then encoded.
          const size_t per = t.init == Init::e2m1 ? 2 : 1;
          if (fbuf.size() < k.n * per) fbuf.resize(k.n * per);
          if (buf.size() < nb) buf.resize(nb);
          fill_normal(fbuf.data(), DType::f32, keys[k.spec], k.first * per, k.n * per, 0.02f);
          auto* b = reinterpret_cast<uint8_t*>(buf.data());
          for (size_t i = 0; i < k.n; ++i)
            b[i] = per == 1 ? f32_to_e4m3(fbuf[i] / t.value)
                            : uint8_t(f32_to_e2m1(fbuf[2 * i] / t.value) | (f32_to_e2m1(fbuf[2 * i + 1] / t.value) << 4));
          src = buf.data();
        } else if (t.init == Init::d2t) {
          src = reinterpret_cast<const char*>(d2t.data());
        } else {
          src = reinterpret_cast<const char*>(t2d.data());
        }
        pwrite_all(fds[k.shard], src, nb, k.file_off, paths[k.shard]);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (error.empty()) error = e.what();
      }
    }
  }
  for (int fd : fds) ::close(fd);
  TS_CHECK(error.empty(), "{}", error);
  if (ns > 1) {
    json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(out / "model.safetensors.index.json", idx.dump(2) + "\n");
  }
  res.total_bytes = total;
  res.num_files = int(ns);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace ts::bench
