#include "io/quant_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>

#include "core/fp8.h"

namespace fs = std::filesystem;

namespace ts::io {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::plain: return "plain";
    case WeightFormat::fp8_block: return "fp8 block";
    case WeightFormat::fp8_channel: return "fp8 per-channel";
    case WeightFormat::fp8_tensor: return "fp8 per-tensor";
    case WeightFormat::mxfp8: return "MXFP8";
    case WeightFormat::nvfp4: return "NVFP4";
  }
  return "?";
}

bool glob_match(const std::string& p, const std::string& s) {
  // Iterative wildcard match: '*' matches any run (dots included), as ModelOpt's fnmatch does.
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (j < s.size()) {
    if (i < p.size() && (p[i] == s[j] || p[i] == '?')) {
      ++i;
      ++j;
    } else if (i < p.size() && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (star != std::string::npos) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

// compressed-tensors target/ignore entry: exact name, or "re:" + a regex matched at the start
// (Python's re.match).
static bool ct_match(const std::string& target, const std::string& module, const std::string& path) {
  if (target.rfind("re:", 0) == 0) {
    try {
      std::regex re(target.substr(3));
      return std::regex_search(module, re, std::regex_constants::match_continuous);
    } catch (const std::regex_error& e) {
      fail("{}: bad regex in quantization_config: '{}' ({})", path, target, e.what());
    }
  }
  return target == module;
}

static const char* kMethods =
    "fp8, compressed-tensors, fbgemm_fp8, modelopt (quant_algo NVFP4, W4A16_NVFP4, MXFP8, FP8_PB_WO, FP8, "
    "FP8_PER_CHANNEL_PER_TOKEN, MIXED_PRECISION)";
// ModelOpt's per-module algorithms (top level or in MIXED_PRECISION's quantized_layers), as
// vLLM's modelopt loader names them.
static const char* kModeloptAlgos = "NVFP4, W4A16_NVFP4, MXFP8, FP8_PB_WO, FP8, FP8_PER_CHANNEL_PER_TOKEN";
static std::optional<WeightFormat> modelopt_format(const std::string& a) {
  if (a == "NVFP4" || a == "W4A16_NVFP4") return WeightFormat::nvfp4;
  if (a == "MXFP8") return WeightFormat::mxfp8;
  if (a == "FP8_PB_WO") return WeightFormat::fp8_block;  // 128 x 128 blocks, weight-only
  if (a == "FP8") return WeightFormat::fp8_tensor;
  if (a == "FP8_PER_CHANNEL_PER_TOKEN") return WeightFormat::fp8_channel;
  return std::nullopt;
}

static std::string str_or(const nlohmann::json& j, const char* k, const std::string& def) {
  return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : def;
}

static std::vector<std::string> str_list(const nlohmann::json& j, const char* k, const std::string& path) {
  std::vector<std::string> r;
  if (!j.contains(k) || j[k].is_null()) return r;
  TS_CHECK(j[k].is_array(), "{}: quantization field {} must be a list of strings", path, k);
  for (auto& v : j[k]) {
    TS_CHECK(v.is_string(), "{}: quantization field {} must be a list of strings", path, k);
    r.push_back(v.get<std::string>());
  }
  return r;
}

static void parse_block(const nlohmann::json& v, int64_t& bn, int64_t& bk, const std::string& path, const char* what) {
  TS_CHECK(v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer() &&
               v[0].get<int64_t>() > 0 && v[1].get<int64_t>() > 0,
           "{}: {} must be two positive integers [block_n, block_k]", path, what);
  bn = v[0].get<int64_t>();
  bk = v[1].get<int64_t>();
}

// compressed-tensors' checkpoint formats we read: FP8 as is (float-quantized; the 2024
// neuralmagic *-FP8 releases say naive-quantized: the same F8_E4M3 tensors, unpacked), NVFP4
// packed two a byte, and a mix of them named per group. The weights' num_bits / type decide.
static bool ct_format_ok(const std::string& f) {
  return f == "float-quantized" || f == "naive-quantized" || f == "nvfp4-pack-quantized" || f == "mixed-precision";
}
static const char* kCtFormats = "float-quantized, naive-quantized (8-bit float), nvfp4-pack-quantized, mixed-precision";

static void parse_compressed_tensors(const nlohmann::json& q, const std::string& path, QuantConfig& c) {
  std::string format = str_or(q, "format", "float-quantized");
  TS_CHECK(ct_format_ok(format), "{}: compressed-tensors format '{}' is not supported (supported: {})", path, format,
           kCtFormats);
  std::string status = str_or(q, "quantization_status", "compressed");
  TS_CHECK(status == "compressed" || status == "frozen",
           "{}: compressed-tensors quantization_status '{}' is not supported (supported: compressed, frozen)", path, status);
  c.ignore = str_list(q, "ignore", path);
  TS_CHECK(q.contains("config_groups") && q["config_groups"].is_object() && !q["config_groups"].empty(),
           "{}: compressed-tensors quantization_config has no config_groups", path);
  for (auto& [gname, g] : q["config_groups"].items()) {
    QuantConfig::CtGroup grp;
    grp.name = gname;
    grp.targets = str_list(g, "targets", path);
    TS_CHECK(!grp.targets.empty(), "{}: config_groups.{} has no targets", path, gname);
    TS_CHECK(g.contains("weights") && g["weights"].is_object(), "{}: config_groups.{} has no weights", path, gname);
    std::string gformat = str_or(g, "format", format);
    TS_CHECK(ct_format_ok(gformat), "{}: config_groups.{}.format '{}' is not supported (supported: {})", path, gname,
             gformat, kCtFormats);
    const auto& w = g["weights"];
    int bits = w.contains("num_bits") && w["num_bits"].is_number_integer() ? w["num_bits"].get<int>() : 0;
    std::string type = str_or(w, "type", "");
    TS_CHECK((bits == 8 || bits == 4) && type == "float",
             "{}: config_groups.{}.weights: {}-bit '{}' weights are not supported (supported: 8-bit float (e4m3), "
             "4-bit float (NVFP4))",
             path, gname, bits, type);
    TS_CHECK(!(w.contains("dynamic") && w["dynamic"].is_boolean() && w["dynamic"].get<bool>()),
             "{}: config_groups.{}.weights: dynamic weight quantization is not supported", path, gname);
    std::string strategy = str_or(w, "strategy", "");
    if (bits == 4) {
      // NVFP4 (llm-compressor's NVFP4 / NVFP4A16): e2m1 codes, an F8_E4M3 scale per 16 and one
      // F32 global divisor.
      int64_t gs = w.contains("group_size") && w["group_size"].is_number_integer() ? w["group_size"].get<int64_t>() : 0;
      TS_CHECK(strategy == "tensor_group" && gs == 16,
               "{}: config_groups.{}.weights: 4-bit float strategy '{}' group_size {} is not supported (supported: "
               "tensor_group with group_size 16, NVFP4)",
               path, gname, strategy, gs);
      grp.format = WeightFormat::nvfp4;
    } else if (strategy == "tensor") grp.format = WeightFormat::fp8_tensor;
    else if (strategy == "channel") grp.format = WeightFormat::fp8_channel;
    else if (strategy == "block") {
      grp.format = WeightFormat::fp8_block;
      TS_CHECK(w.contains("block_structure"), "{}: config_groups.{}.weights: strategy block needs block_structure", path,
               gname);
      parse_block(w["block_structure"], grp.block_n, grp.block_k, path, "block_structure");
    } else {
      fail("{}: config_groups.{}.weights.strategy '{}' is not supported (supported: tensor, channel, block)", path, gname,
           strategy);
    }
    if (g.contains("input_activations") && g["input_activations"].is_object()) {
      const auto& a = g["input_activations"];
      grp.act_dynamic = !a.contains("dynamic") || !a["dynamic"].is_boolean() || a["dynamic"].get<bool>();
      grp.act_strategy = str_or(a, "strategy", "tensor");
      // NVFP4's activations are "tensor_group" with dynamic "local" (a string): per-16 scales
      // computed at run time under a calibrated global one.
      TS_CHECK(grp.act_strategy == "token" || grp.act_strategy == "tensor" || grp.act_strategy == "group" ||
                   grp.act_strategy == "tensor_group",
               "{}: config_groups.{}.input_activations.strategy '{}' is not supported (supported: token, tensor, group, "
               "tensor_group)",
               path, gname, grp.act_strategy);
    }
    c.groups.push_back(std::move(grp));
  }
  if (q.contains("kv_cache_scheme") && q["kv_cache_scheme"].is_object()) c.kv_cache_quant_algo = "FP8";
}

static void parse_modelopt(const nlohmann::json& q, const std::string& path, QuantConfig& c) {
  c.algo = str_or(q, "quant_algo", "");
  std::transform(c.algo.begin(), c.algo.end(), c.algo.begin(), ::toupper);
  c.exclude = str_list(q, "exclude_modules", path);
  if (q.contains("group_size") && q["group_size"].is_number_integer()) c.nvfp4_group = q["group_size"].get<int64_t>();
  c.kv_cache_quant_algo = str_or(q, "kv_cache_quant_algo", "");
  if (modelopt_format(c.algo)) {
    TS_CHECK(*modelopt_format(c.algo) != WeightFormat::nvfp4 || c.nvfp4_group == 16,
             "{}: {} group_size {} is not supported (supported: 16)", path, c.algo, c.nvfp4_group);
  } else if (c.algo == "MIXED_PRECISION") {
    TS_CHECK(q.contains("quantized_layers") && q["quantized_layers"].is_object() && !q["quantized_layers"].empty(),
             "{}: MIXED_PRECISION needs a non-empty quantized_layers map", path);
    for (auto& [name, info] : q["quantized_layers"].items()) {
      std::string a = info.is_object() ? str_or(info, "quant_algo", "") : info.is_string() ? info.get<std::string>() : "";
      std::transform(a.begin(), a.end(), a.begin(), ::toupper);
      TS_CHECK(modelopt_format(a).has_value(), "{}: quantized_layers.{}: quant_algo '{}' is not supported (supported: {})",
               path, name, a, kModeloptAlgos);
      if (*modelopt_format(a) == WeightFormat::nvfp4 && info.is_object() && info.contains("group_size"))
        TS_CHECK(info["group_size"] == 16, "{}: quantized_layers.{}: {} group_size {} is not supported (supported: 16)",
                 path, name, a, info["group_size"].dump());
      c.layers[name] = a;
    }
  } else {
    fail("{}: modelopt quant_algo '{}' is not supported (supported: {}, MIXED_PRECISION)", path, c.algo, kModeloptAlgos);
  }
}

QuantConfig parse_quant_config(const nlohmann::json& q, const std::string& path) {
  QuantConfig c;
  c.source = path;
  TS_CHECK(q.is_object(), "{}: quantization_config must be an object", path);
  std::string m = str_or(q, "quant_method", "");
  // hf_quant_config.json's "quantization" section has no quant_method: its producer is ModelOpt.
  if (m.empty() && q.contains("quant_algo")) m = "modelopt";
  if (m == "modelopt_fp4" || m == "modelopt_fp8" || m == "modelopt_mxfp8" || m == "modelopt_mixed") m = "modelopt";
  if (m == "compressed_tensors") m = "compressed-tensors";  // the library's module name, seen in configs too
  c.method = m;
  if (m == "fp8") {
    std::string fmt = str_or(q, "fmt", "e4m3");
    TS_CHECK(fmt == "e4m3", "{}: fp8 fmt '{}' is not supported (supported: e4m3)", path, fmt);
    std::string act = str_or(q, "activation_scheme", "dynamic");
    TS_CHECK(act == "dynamic" || act == "static", "{}: fp8 activation_scheme '{}' is not supported (supported: dynamic, static)",
             path, act);
    c.act_dynamic = act == "dynamic";
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null())
      parse_block(q["weight_block_size"], c.block_n, c.block_k, path, "weight_block_size");
    std::string sf = str_or(q, "scale_fmt", "");
    TS_CHECK(sf.empty() || sf == "ue8m0", "{}: fp8 scale_fmt '{}' is not supported (supported: ue8m0)", path, sf);
    c.ue8m0_scales = sf == "ue8m0";
    // DeepSeek-style exclusions where a checkpoint lists them.
    c.ignore = str_list(q, "modules_to_not_convert", path);
  } else if (m == "compressed-tensors") {
    parse_compressed_tensors(q, path, c);
  } else if (m == "fbgemm_fp8") {
    // Meta's FBGEMM FP8 (Llama-3.1-405B-Instruct-FP8 and its kin): per-channel F8_E4M3 weights
    // with F32 weight_scale [N, 1], dynamic per-token activations clamped at activation_scale_ub,
    // and the modules left in bf16 named in modules_to_not_convert.
    c.ignore = str_list(q, "modules_to_not_convert", path);
    if (q.contains("activation_scale_ub") && !q["activation_scale_ub"].is_null()) {
      TS_CHECK(q["activation_scale_ub"].is_number() && q["activation_scale_ub"].get<double>() > 0,
               "{}: fbgemm_fp8 activation_scale_ub must be a positive number, is {}", path,
               q["activation_scale_ub"].dump());
      c.act_scale_ub = q["activation_scale_ub"].get<float>();
    }
  } else if (m == "modelopt") {
    parse_modelopt(q, path, c);
  } else {
    fail("{}: quant_method '{}' is not supported (supported: {})", path, m, kMethods);
  }
  return c;
}

static nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f(path);
  TS_CHECK(f.good(), "{}: cannot open", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

QuantConfig load_quant_config(const std::string& dir) {
  fs::path cfg = fs::path(dir) / "config.json", hf = fs::path(dir) / "hf_quant_config.json";
  // ModelOpt's own file is the complete one (MIXED_PRECISION's quantized_layers live there).
  if (fs::exists(hf)) {
    nlohmann::json j = read_json_file(hf.string());
    TS_CHECK(j.contains("quantization") && j["quantization"].is_object(), "{}: no \"quantization\" section",
             hf.string());
    return parse_quant_config(j["quantization"], hf.string());
  }
  if (fs::exists(cfg)) {
    nlohmann::json j = read_json_file(cfg.string());
    if (j.is_object() && j.contains("quantization_config") && !j["quantization_config"].is_null())
      return parse_quant_config(j["quantization_config"], cfg.string());
    // compressed-tensors' earlier key for the same section.
    if (j.is_object() && j.contains("compression_config") && !j["compression_config"].is_null())
      return parse_quant_config(j["compression_config"], cfg.string());
  }
  return {};
}

std::string QuantConfig::excluded(const std::string& module) const {
  if (method == "modelopt") {
    for (auto& p : exclude)
      if (glob_match(p, module)) return fmt::format("exclude_modules entry '{}'", p);
    return "";
  }
  if (method == "fbgemm_fp8") {
    // Entries name modules (vLLM matches them exactly; transformers' docs also show "lm_head.weight")
    // or their ancestors (a whole layer).
    for (auto& p : ignore)
      if (p == module || p == module + ".weight" || (module.size() > p.size() && module.rfind(p + ".", 0) == 0))
        return fmt::format("modules_to_not_convert entry '{}'", p);
    return "";
  }
  for (auto& p : ignore)
    if (ct_match(p, module, source)) return fmt::format("{} entry '{}'", method == "fp8" ? "modules_to_not_convert" : "ignore", p);
  return "";
}

static const std::string* mixed_algo(const QuantConfig& q, const std::string& module) {
  // Direct entry, else the nearest ancestor (ModelOpt names whole expert subtrees: "...experts").
  std::string m = module;
  while (true) {
    auto it = q.layers.find(m);
    if (it != q.layers.end()) return &it->second;
    size_t dot = m.rfind('.');
    if (dot == std::string::npos) return nullptr;
    m.resize(dot);
  }
}

static const QuantConfig::CtGroup* ct_group(const QuantConfig& q, const std::string& module) {
  for (auto& g : q.groups)
    for (auto& t : g.targets)
      if (t == "Linear" || ct_match(t, module, q.source)) return &g;
  return nullptr;
}

std::vector<WeightFormat> QuantConfig::allowed(const std::string& module) const {
  using F = WeightFormat;
  if (!quantized() || !excluded(module).empty()) return {};
  if (method == "fp8") return block_n ? std::vector<F>{F::fp8_block} : std::vector<F>{F::fp8_tensor};
  if (method == "fbgemm_fp8") return {F::fp8_channel};
  if (method == "compressed-tensors") {
    auto* g = ct_group(*this, module);
    return g ? std::vector<F>{g->format} : std::vector<F>{};
  }
  if (auto f = modelopt_format(algo)) return {*f};
  const std::string* a = mixed_algo(*this, module);
  if (!a) return {};
  return {*modelopt_format(*a)};  // checked at parse
}

std::pair<int64_t, int64_t> QuantConfig::block_of(const std::string& module) const {
  if (method == "fp8") return {block_n, block_k};
  if (method == "fbgemm_fp8") return {0, 0};
  if (method == "compressed-tensors") {
    auto* g = ct_group(*this, module);
    return g ? std::pair{g->block_n, g->block_k} : std::pair<int64_t, int64_t>{0, 0};
  }
  return {128, 128};  // ModelOpt FP8_PB_WO: 128 x 128 blocks
}

static std::string module_of(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

bool is_quantized_weight(const Checkpoint& c, const std::string& name) {
  if (!c.has(name)) return false;
  Tensor t = c.get(name);
  if (t.dtype == DType::f8_e4m3) return true;
  std::string s = module_of(name) + ".weight_scale";
  return t.dtype == DType::u8 && c.has(s) && c.get(s).dtype == DType::f8_e4m3;
}

static bool is_float(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

WeightFormat detect_weight_format(const Checkpoint& c, const std::string& name) {
  if (!is_quantized_weight(c, name)) return WeightFormat::plain;
  Tensor w = c.get(name);
  const std::string mod = module_of(name), f = c.file_of(name);
  const std::string s_inv = mod + ".weight_scale_inv", s = mod + ".weight_scale";
  if (w.dtype == DType::u8) {
    TS_CHECK(c.has(mod + ".weight_scale_2"), "{}: NVFP4 weight {} has no weight_scale_2 (the F32 global scale)", f, name);
    return WeightFormat::nvfp4;
  }
  std::string sname = c.has(s_inv) ? s_inv : s;
  TS_CHECK(c.has(sname), "{}: F8_E4M3 weight {} has no scale ({} or {})", f, name, s_inv, s);
  Tensor sc = c.get(sname);
  if (sc.dtype == DType::u8 || sc.dtype == DType::f8_e8m0) return WeightFormat::mxfp8;
  TS_CHECK(is_float(sc.dtype), "{}: scale {} of {} has dtype {}, expected F32, BF16, F16 (or U8/F8_E8M0 for MXFP8)",
           c.file_of(sname), sname, name, dtype_name(sc.dtype));
  if (sc.numel() == 1) return WeightFormat::fp8_tensor;
  if (w.ndim == 2 && ((sc.ndim == 2 && sc.size(0) == w.size(0) && sc.size(1) == 1) ||
                      (sc.ndim == 1 && sc.size(0) == w.size(0))) && w.size(0) > 1)
    return WeightFormat::fp8_channel;
  return WeightFormat::fp8_block;
}

static std::string dims_str(const std::vector<int64_t>& d) {
  std::string r = "[";
  for (size_t i = 0; i < d.size(); ++i) r += (i ? ", " : "") + std::to_string(d[i]);
  return r + "]";
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

StoredWeight stored_weight(const Checkpoint& c, const QuantConfig& q, const std::string& name) {
  WeightFormat fmt_ = detect_weight_format(c, name);
  const std::string mod = module_of(name), file = c.file_of(name);
  TS_CHECK(fmt_ != WeightFormat::plain, "{}: {} is not a quantized weight", file, name);
  TS_CHECK(q.quantized(), "{}: tensor {} is quantized ({}) but {}/config.json declares no quantization_config", file,
           name, weight_format_name(fmt_), c.dir());
  std::string why = q.excluded(mod);
  TS_CHECK(why.empty(), "{}: tensor {} is quantized ({}) but module {} is excluded from quantization by {} ({})", file,
           name, weight_format_name(fmt_), mod, q.source, why);
  auto allowed = q.allowed(mod);
  auto allows = [&](WeightFormat f) { return std::find(allowed.begin(), allowed.end(), f) != allowed.end(); };
  // A one-element scale is also a one-block grid (weights within one block): the block path
  // then checks its shape.
  if (fmt_ == WeightFormat::fp8_tensor && !allows(fmt_) && allows(WeightFormat::fp8_block)) fmt_ = WeightFormat::fp8_block;
  if (std::find(allowed.begin(), allowed.end(), fmt_) == allowed.end()) {
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(weight_format_name(a));
    std::string scales;
    for (const char* suf : {".weight_scale_inv", ".weight_scale", ".weight_scale_2"})
      if (c.has(mod + suf)) {
        Tensor s = c.get(mod + suf);
        scales += fmt::format("{}{}{} {} {}", scales.empty() ? "" : ", ", mod, suf, dtype_name(s.dtype), s.shape_str());
      }
    fail("{}: tensor {} {} is stored as {} (scales: {}), but {} declares {} for module {}", file, name,
         c.get(name).shape_str(), weight_format_name(fmt_), scales, q.source, list.empty() ? "no quantization" : list, mod);
  }
  Tensor w = c.get(name);
  TS_CHECK(w.ndim == 2 && w.is_contiguous(), "{}: quantized weight {} must be 2-D, has shape {}", file, name, w.shape_str());
  const int64_t N = w.size(0);
  auto scale = [&](const std::string& sn, const std::vector<int64_t>& want, const char* what) {
    TS_CHECK(c.has(sn), "{}: quantized weight {} has no {} {}", file, name, what, sn);
    Tensor s = c.get(sn);
    TS_CHECK(s.dims() == want, "{}: scale {} of {} has shape {}, expected {} ({})", c.file_of(sn), sn, name,
             s.shape_str(), dims_str(want), what);
    if (s.dtype != DType::u8) return s.to_f32();
    // UE8M0 exponents stored as U8 (ModelOpt MXFP8).
    Tensor f = Tensor::empty(s.dims(), DType::f32);
    for (int64_t i = 0; i < s.numel(); ++i) f.ptr<float>()[i] = e8m0_to_f32(s.ptr<uint8_t>()[i]);
    return f;
  };
  StoredWeight sw;
  sw.format = fmt_;
  sw.data = w;
  sw.n = N;
  if (fmt_ == WeightFormat::nvfp4) {
    const int64_t K = w.size(1) * 2, G = 16;
    TS_CHECK(K % G == 0, "{}: NVFP4 weight {}: K = {} is not a multiple of {}", file, name, K, G);
    sw.k = K;
    sw.scale = scale(mod + ".weight_scale", {N, K / G}, "F8_E4M3 per-16 block scale");
    Tensor s2t = c.get(mod + ".weight_scale_2");
    TS_CHECK(s2t.numel() == 1 && is_float(s2t.dtype), "{}: weight_scale_2 of {} must be an F32 scalar, has {} {}",
             c.file_of(mod + ".weight_scale_2"), name, dtype_name(s2t.dtype), s2t.shape_str());
    if (c.has(mod + ".input_scale"))
      TS_CHECK(c.get(mod + ".input_scale").numel() == 1, "{}: input_scale of {} must be a scalar",
               c.file_of(mod + ".input_scale"), name);
    sw.scale2 = s2t.to_f32().ptr<float>()[0];
    sw.block_n = 1;
    sw.block_k = G;
    return sw;
  }
  const int64_t K = w.size(1);
  sw.k = K;
  if (fmt_ == WeightFormat::mxfp8) {
    TS_CHECK(K % 32 == 0, "{}: MXFP8 weight {}: K = {} is not a multiple of 32", file, name, K);
    sw.scale = scale(mod + ".weight_scale", {N, K / 32}, "UE8M0 per-32 scale");
    sw.block_n = 1;
    sw.block_k = 32;
    return sw;
  }
  std::string sn = c.has(mod + ".weight_scale_inv") ? mod + ".weight_scale_inv" : mod + ".weight_scale";
  Tensor st = c.get(sn);
  if (fmt_ == WeightFormat::fp8_tensor) {
    sw.scale = st.to_f32().view({1, 1});
    sw.block_n = N;
    sw.block_k = K;
    return sw;
  }
  if (fmt_ == WeightFormat::fp8_channel) {
    sw.scale = st.to_f32().view({N, 1});
    sw.block_n = 1;
    sw.block_k = K;
    return sw;
  }
  const std::pair<int64_t, int64_t> blk = q.block_of(mod);
  const int64_t bn = blk.first, bk = blk.second;
  TS_CHECK(bn > 0 && bk > 0, "{}: block-scaled weight {} but {} gives no block size", file, name, q.source);
  const int64_t nb = cdiv(N, bn), kb = cdiv(K, bk);
  // ModelOpt FP8_PB_WO stores the grid as [nb, 1, kb, 1]; the same numbers.
  std::vector<int64_t> want = st.ndim == 4 ? std::vector<int64_t>{nb, 1, kb, 1} : std::vector<int64_t>{nb, kb};
  sw.scale = scale(sn, want, "block scale [ceil(N/block_n), ceil(K/block_k)]").view({nb, kb});
  sw.block_n = bn;
  sw.block_k = bk;
  return sw;
}

Tensor dequantize(const StoredWeight& sw) {
  const int64_t N = sw.n, K = sw.k, bn = sw.block_n, bk = sw.block_k;
  const int64_t kb = sw.scale.size(1);
  const uint8_t* qv = sw.data.ptr<uint8_t>();
  const float* sp = sw.scale.ptr<float>();
  Tensor out = Tensor::empty({N, K}, DType::f32);
  float* o = out.ptr<float>();
  // Rows in parallel: real checkpoints hold billions of values.
  if (sw.format == WeightFormat::nvfp4) {
    const float s2 = sw.scale2;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        uint8_t byte = qv[n * (K / 2) + k / 2];
        uint8_t code = (k & 1) ? byte >> 4 : byte & 0xf;
        o[n * K + k] = e2m1_to_f32(code) * sp[(n / bn) * kb + k / bk] * s2;
      }
    return out;
  }
  #pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) o[n * K + k] = e4m3_to_f32(qv[n * K + k]) * sp[(n / bn) * kb + k / bk];
  return out;
}

void adopt_quant_names(Checkpoint& c) {
  const std::string packed = ".weight_packed";
  for (const std::string& n : c.names()) {
    if (n.size() <= packed.size() || n.compare(n.size() - packed.size(), packed.size(), packed) != 0) continue;
    const std::string mod = n.substr(0, n.size() - packed.size());
    // Only NVFP4's packing (U8 with a global scale); compressed-tensors' int pack-quantized
    // (I32 words) is refused by its config.
    if (c.has(mod + ".weight") || c.get(n).dtype != DType::u8 || !c.has(mod + ".weight_global_scale")) continue;
    c.alias(mod + ".weight", n);
    // A divisor there, a multiplier in ModelOpt's layout: 1 / g (f32; within an ulp of dividing).
    auto reciprocal = [&](const std::string& from, const std::string& to) {
      if (!c.has(from) || c.has(to)) return;
      Tensor g = c.get(from);
      TS_CHECK(g.numel() == 1 && is_float(g.dtype), "{}: {} must be a float scalar, has {} {}", c.file_of(from), from,
               dtype_name(g.dtype), g.shape_str());
      const float v = g.to_f32().ptr<float>()[0];
      TS_CHECK(std::isfinite(v) && v > 0, "{}: {} is {}, expected a positive number", c.file_of(from), from, v);
      Tensor r = Tensor::empty(g.dims(), DType::f32);
      r.ptr<float>()[0] = 1.0f / v;
      c.alias(to, from, r);
    };
    reciprocal(mod + ".weight_global_scale", mod + ".weight_scale_2");
    reciprocal(mod + ".input_global_scale", mod + ".input_scale");
  }
}

Tensor dequantize_weight(const Checkpoint& c, const QuantConfig& q, const std::string& name) {
  return dequantize(stored_weight(c, q, name));
}

}  // namespace ts::io
