// Quantized-checkpoint parsing and dequantization: the small float formats, the config parsers
// (fp8, compressed-tensors, fbgemm_fp8, modelopt NVFP4 / MIXED_PRECISION) and the startup errors for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>

#include "core/fp8.h"
#include "io/quant_config.h"

using namespace ts;
using namespace ts::io;
namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(Fp8, E4m3EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    float v = e4m3_to_f32(uint8_t(c));
    uint8_t back = f32_to_e4m3(v);
    if (v == 0) {
      EXPECT_EQ(e4m3_to_f32(back), 0.0f);
    } else {
      EXPECT_EQ(back, uint8_t(c)) << c << " " << v;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);  // halfway 1 .. 1.125 -> even (1.0)
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.1f)), 1.125f);
}

TEST(Fp8, E8m0AndE2m1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(f32_to_e8m0_ceil(3.0f), 129);  // 4
  EXPECT_EQ(f32_to_e8m0_ceil(4.0f), 129);
  const float mags[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), (c & 8 ? -1.0f : 1.0f) * mags[c & 7]);
    if (c != 8) {
      EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(uint8_t(c))), c);
    }
  }
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);  // tie 2 | 3 -> even code (2)
}

TEST(QuantConfig, Glob) {
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
  EXPECT_TRUE(glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate"));
  EXPECT_FALSE(glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate_proj"));
  EXPECT_TRUE(glob_match("*self_attn*", "model.layers.0.self_attn.q_proj"));
}

TEST(QuantConfig, ParsesTheMethods) {
  auto fp8 = parse_quant_config(json::parse(R"({"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic",
      "weight_block_size":[128,128],"scale_fmt":"ue8m0"})"), "c.json");
  EXPECT_EQ(fp8.method, "fp8");
  EXPECT_EQ(fp8.block_n, 128);
  EXPECT_TRUE(fp8.ue8m0_scales);
  EXPECT_EQ(fp8.allowed("model.layers.0.mlp.up_proj"), std::vector<WeightFormat>{WeightFormat::fp8_block});

  auto ct = parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"float-quantized",
      "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"channel"},
      "input_activations":{"num_bits":8,"type":"float","strategy":"token","dynamic":true}}},
      "ignore":["lm_head","re:.*mlp\\.gate$"]})"), "c.json");
  EXPECT_EQ(ct.allowed("model.layers.0.self_attn.q_proj"), std::vector<WeightFormat>{WeightFormat::fp8_channel});
  EXPECT_FALSE(ct.excluded("lm_head").empty());
  EXPECT_FALSE(ct.excluded("model.layers.3.mlp.gate").empty());
  EXPECT_TRUE(ct.excluded("model.layers.3.mlp.gate_proj").empty());

  // neuralmagic's 2024 FP8 releases: format naive-quantized, 8-bit float per-tensor weights and
  // static activation scales; int weights under it stay refused.
  auto naive = parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"naive-quantized",
      "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"tensor",
      "dynamic":false,"symmetric":true},"input_activations":{"num_bits":8,"type":"float","strategy":"tensor",
      "dynamic":false}}},"ignore":["lm_head"]})"), "c.json");
  EXPECT_EQ(naive.allowed("model.layers.0.mlp.up_proj"), std::vector<WeightFormat>{WeightFormat::fp8_tensor});
  EXPECT_THROW(parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"naive-quantized",
      "config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":8,"type":"int","strategy":"channel"}}}})"), "c"),
               std::exception);

  // Meta's fbgemm_fp8: per-channel everywhere not listed; entries are modules, "module.weight"
  // (as transformers' docs write them) or whole subtrees.
  auto fb = parse_quant_config(json::parse(R"({"quant_method":"fbgemm_fp8","activation_scale_ub":1200.0,
      "modules_to_not_convert":["model.layers.0.self_attn.q_proj","lm_head.weight","model.layers.1"]})"), "c.json");
  EXPECT_EQ(fb.method, "fbgemm_fp8");
  EXPECT_FLOAT_EQ(fb.act_scale_ub, 1200.0f);
  EXPECT_EQ(fb.allowed("model.layers.0.mlp.up_proj"), std::vector<WeightFormat>{WeightFormat::fp8_channel});
  EXPECT_EQ(fb.block_of("model.layers.0.mlp.up_proj"), (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_TRUE(fb.allowed("model.layers.0.self_attn.q_proj").empty());
  EXPECT_FALSE(fb.excluded("lm_head").empty());
  EXPECT_FALSE(fb.excluded("model.layers.1.mlp.down_proj").empty());
  EXPECT_TRUE(fb.excluded("model.layers.10.mlp.down_proj").empty());  // not a subtree of layers.1
  EXPECT_TRUE(fb.excluded("model.layers.0.self_attn.q_proj_extra").empty());
  EXPECT_TRUE(fb.excluded("model.layers.0.self_attn.k_proj").empty());
  auto fb_bare = parse_quant_config(json::parse(R"({"quant_method":"fbgemm_fp8","modules_to_not_convert":null})"), "c");
  EXPECT_EQ(fb_bare.act_scale_ub, 0.0f);
  EXPECT_EQ(fb_bare.allowed("lm_head"), std::vector<WeightFormat>{WeightFormat::fp8_channel});

  // ModelOpt's single-algorithm checkpoints, as vLLM's modelopt loader lists them.
  for (auto [algo, f] : std::vector<std::pair<std::string, WeightFormat>>{
           {"NVFP4", WeightFormat::nvfp4}, {"W4A16_NVFP4", WeightFormat::nvfp4}, {"MXFP8", WeightFormat::mxfp8},
           {"FP8_PB_WO", WeightFormat::fp8_block}, {"FP8", WeightFormat::fp8_tensor},
           {"FP8_PER_CHANNEL_PER_TOKEN", WeightFormat::fp8_channel}}) {
    auto mo = parse_quant_config(json{{"quant_algo", algo}, {"exclude_modules", {"lm_head"}}}, "hf_quant_config.json");
    EXPECT_EQ(mo.method, "modelopt") << algo;
    EXPECT_EQ(mo.allowed("model.layers.0.mlp.up_proj"), std::vector<WeightFormat>{f}) << algo;
    EXPECT_TRUE(mo.allowed("lm_head").empty()) << algo;
  }
  EXPECT_EQ(parse_quant_config(json::parse(R"({"quant_method":"modelopt_mxfp8","quant_algo":"MXFP8"})"), "c").method,
            "modelopt");
  EXPECT_EQ(parse_quant_config(json::parse(R"({"quant_method":"compressed_tensors","config_groups":{"g":{"targets":
      ["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"channel"}}}})"), "c").method, "compressed-tensors");

  auto mixed = parse_quant_config(json::parse(R"({"quant_algo":"MIXED_PRECISION","exclude_modules":["lm_head"],
      "quantized_layers":{"model.layers.0.self_attn.q_proj":{"quant_algo":"MXFP8"},
      "model.layers.0.mlp.experts":{"quant_algo":"NVFP4","group_size":16},
      "model.layers.0.mlp.shared_experts.up_proj":{"quant_algo":"FP8_PB_WO"}}})"), "hf_quant_config.json");
  EXPECT_EQ(mixed.method, "modelopt");
  EXPECT_EQ(mixed.allowed("model.layers.0.self_attn.q_proj"), std::vector<WeightFormat>{WeightFormat::mxfp8});
  EXPECT_EQ(mixed.allowed("model.layers.0.mlp.experts.3.w1"), std::vector<WeightFormat>{WeightFormat::nvfp4});
  EXPECT_EQ(mixed.allowed("model.layers.0.mlp.shared_experts.up_proj"), std::vector<WeightFormat>{WeightFormat::fp8_block});
  EXPECT_TRUE(mixed.allowed("model.layers.0.self_attn.k_proj").empty());
}

static void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(QuantConfig, UnknownMethodsListTheSupportedOnes) {
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"gptq"})"), "x/config.json"); },
               {"x/config.json", "gptq", "fp8, compressed-tensors, fbgemm_fp8, modelopt"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"modelopt","quant_algo":"W4A8_AWQ"})"), "c"); },
               {"W4A8_AWQ", "NVFP4, W4A16_NVFP4, MXFP8, FP8_PB_WO, FP8, FP8_PER_CHANNEL_PER_TOKEN, MIXED_PRECISION"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_algo":"MIXED_PRECISION",
                    "quantized_layers":{"a.b":{"quant_algo":"INT4_AWQ"}}})"), "c"); },
               {"a.b", "INT4_AWQ", "NVFP4, W4A16_NVFP4, MXFP8, FP8_PB_WO"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"fbgemm_fp8","activation_scale_ub":-1})"), "c"); },
               {"activation_scale_ub", "positive", "-1"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"fbgemm_fp8","modules_to_not_convert":"lm_head"})"),
                                       "c"); },
               {"modules_to_not_convert", "list of strings"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"pack-quantized",
                    "config_groups":{}})"), "c"); },
               {"pack-quantized", "float-quantized"});
}

// A one-linear checkpoint in a temp dir: "m.weight" stored as given plus partners.
struct TmpModel {
  fs::path dir;
  explicit TmpModel(const std::string& tag) {
    dir = fs::temp_directory_path() / ("ts_quant_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TmpModel() { fs::remove_all(dir); }
  void write(const json& qcfg, const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::ofstream(dir / "config.json") << json{{"quantization_config", qcfg}}.dump();
    write_safetensors((dir / "model.safetensors").string(), tensors);
  }
};

static Tensor bytes(std::vector<int64_t> shape, DType dt, const std::vector<uint8_t>& v) {
  Tensor t = Tensor::empty(shape, dt);
  std::memcpy(t.data, v.data(), v.size());
  return t;
}
static Tensor f32(std::vector<int64_t> shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

TEST(QuantConfig, DequantizesBlockFp8WithPartialEdgeBlocks) {
  TmpModel m("block");
  // W [3, 5] with 2 x 2 blocks: scale grid [2, 3]; the last row / column blocks are partial.
  std::vector<uint8_t> q(15);
  for (int i = 0; i < 15; ++i) q[size_t(i)] = f32_to_e4m3(float(i + 1) * 0.25f);
  m.write(json::parse(R"({"quant_method":"fp8","fmt":"e4m3","weight_block_size":[2,2]})"),
          {{"m.weight", bytes({3, 5}, DType::f8_e4m3, q)}, {"m.weight_scale_inv", f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
  Checkpoint c = Checkpoint::open(m.dir.string());
  QuantConfig qc = load_quant_config(m.dir.string());
  ASSERT_EQ(detect_weight_format(c, "m.weight"), WeightFormat::fp8_block);
  Tensor w = dequantize_weight(c, qc, "m.weight");
  ASSERT_EQ(w.dims(), (std::vector<int64_t>{3, 5}));
  for (int n = 0; n < 3; ++n)
    for (int k = 0; k < 5; ++k)
      EXPECT_EQ(w.ptr<float>()[n * 5 + k], e4m3_to_f32(q[size_t(n * 5 + k)]) * float((n / 2) * 3 + k / 2 + 1));
}

TEST(QuantConfig, DequantizesNvfp4AndMxfp8) {
  TmpModel m("fp4");
  // NVFP4 W [1, 32]: codes 0..15 twice, element 2i in the low nibble; block scales 2 and 0.5.
  std::vector<uint8_t> packed(16);
  for (int i = 0; i < 16; ++i) packed[size_t(i)] = uint8_t((2 * i) % 16 | (((2 * i + 1) % 16) << 4));
  std::vector<uint8_t> mx(32);
  for (int i = 0; i < 32; ++i) mx[size_t(i)] = f32_to_e4m3(float(i) - 16);
  json mixed = json::parse(R"({"quant_method":"modelopt","quant_algo":"MIXED_PRECISION",
      "quantized_layers":{"a":{"quant_algo":"NVFP4","group_size":16},"b":{"quant_algo":"MXFP8"}}})");
  m.write(mixed, {{"a.weight", bytes({1, 16}, DType::u8, packed)},
                  {"a.weight_scale", bytes({1, 2}, DType::f8_e4m3, {f32_to_e4m3(2.0f), f32_to_e4m3(0.5f)})},
                  {"a.weight_scale_2", f32({}, {3.0f})},
                  {"b.weight", bytes({1, 32}, DType::f8_e4m3, mx)},
                  {"b.weight_scale", bytes({1, 1}, DType::u8, {uint8_t(128)})}});
  Checkpoint c = Checkpoint::open(m.dir.string());
  QuantConfig qc = load_quant_config(m.dir.string());
  Tensor a = dequantize_weight(c, qc, "a.weight");
  ASSERT_EQ(a.dims(), (std::vector<int64_t>{1, 32}));
  for (int k = 0; k < 32; ++k) EXPECT_EQ(a.ptr<float>()[k], e2m1_to_f32(uint8_t(k % 16)) * (k < 16 ? 2.0f : 0.5f) * 3.0f);
  Tensor b = dequantize_weight(c, qc, "b.weight");
  for (int k = 0; k < 32; ++k) EXPECT_EQ(b.ptr<float>()[k], (float(k) - 16) * 2.0f);
}

// compressed-tensors NVFP4 (llm-compressor): weight_packed and a global scale that divides;
// read as ModelOpt's layout (adopt_quant_names), the same values.
TEST(QuantConfig, CompressedTensorsNvfp4ReadsAsModelOpt) {
  TmpModel m("ctfp4");
  std::vector<uint8_t> packed(16);
  for (int i = 0; i < 16; ++i) packed[size_t(i)] = uint8_t((2 * i) % 16 | (((2 * i + 1) % 16) << 4));
  json cfg = json::parse(R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized",
      "quantization_status":"compressed","ignore":["lm_head"],
      "config_groups":{"group_0":{"targets":["Linear"],"format":"nvfp4-pack-quantized",
        "weights":{"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"symmetric":true,"dynamic":false},
        "input_activations":{"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"dynamic":"local"}}}})");
  m.write(cfg, {{"a.weight_packed", bytes({1, 16}, DType::u8, packed)},
                {"a.weight_scale", bytes({1, 2}, DType::f8_e4m3, {f32_to_e4m3(2.0f), f32_to_e4m3(0.5f)})},
                {"a.weight_global_scale", f32({1}, {0.25f})},
                {"a.input_global_scale", f32({1}, {8.0f})}});
  Checkpoint c = Checkpoint::open(m.dir.string());
  QuantConfig qc = load_quant_config(m.dir.string());
  EXPECT_EQ(qc.allowed("a"), std::vector<WeightFormat>{WeightFormat::nvfp4});
  EXPECT_FALSE(c.has("a.weight"));
  adopt_quant_names(c);
  ASSERT_TRUE(c.has("a.weight"));
  EXPECT_EQ(c.names().size(), 4u);  // the stored ones only
  EXPECT_EQ(c.file_of("a.weight"), c.file_of("a.weight_packed"));
  EXPECT_EQ(c.get("a.weight_scale_2").to_f32().ptr<float>()[0], 4.0f);
  EXPECT_EQ(c.get("a.input_scale").to_f32().ptr<float>()[0], 0.125f);
  ASSERT_EQ(detect_weight_format(c, "a.weight"), WeightFormat::nvfp4);
  Tensor a = dequantize_weight(c, qc, "a.weight");
  ASSERT_EQ(a.dims(), (std::vector<int64_t>{1, 32}));
  // W = e2m1 x scale / global.
  for (int k = 0; k < 32; ++k) EXPECT_EQ(a.ptr<float>()[k], e2m1_to_f32(uint8_t(k % 16)) * (k < 16 ? 2.0f : 0.5f) / 0.25f);

  // A global scale that is not a positive scalar is an error naming the file and tensor.
  TmpModel bad("ctfp4bad");
  bad.write(cfg, {{"a.weight_packed", bytes({1, 16}, DType::u8, packed)},
                  {"a.weight_scale", bytes({1, 2}, DType::f8_e4m3, {f32_to_e4m3(2.0f), f32_to_e4m3(0.5f)})},
                  {"a.weight_global_scale", f32({1}, {0.0f})}});
  Checkpoint cb = Checkpoint::open(bad.dir.string());
  expect_error([&] { adopt_quant_names(cb); }, {"model.safetensors", "a.weight_global_scale", "positive"});

  // Only 4-bit float tensor_group 16 is NVFP4; other 4-bit float layouts are refused.
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized",
                    "config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":4,"type":"float","strategy":"group",
                    "group_size":32}}}})"), "c"); },
               {"config_groups.g", "group", "32", "tensor_group with group_size 16"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized",
                    "config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","strategy":"group",
                    "group_size":128}}}})"), "c"); },
               {"4-bit 'int'", "4-bit float (NVFP4)"});
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method":"compressed-tensors","format":"mixed-precision",
                    "config_groups":{"g":{"targets":["Linear"],"format":"mxfp4-pack-quantized",
                    "weights":{"num_bits":4,"type":"float","strategy":"group","group_size":32}}}})"), "c"); },
               {"config_groups.g.format", "mxfp4-pack-quantized", "nvfp4-pack-quantized"});
}

// Earlier compressed-tensors checkpoints put the section under "compression_config".
TEST(QuantConfig, CompressionConfigKeyIsRead) {
  TmpModel m("cc");
  std::ofstream(m.dir / "config.json") << json{{"compression_config", json::parse(R"({"quant_method":"compressed-tensors",
      "format":"float-quantized","config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float",
      "strategy":"tensor"}}}})")}}.dump();
  QuantConfig qc = load_quant_config(m.dir.string());
  EXPECT_EQ(qc.method, "compressed-tensors");
  EXPECT_EQ(qc.allowed("x"), std::vector<WeightFormat>{WeightFormat::fp8_tensor});
}

TEST(QuantConfig, BadInputNamesFileAndTensor) {
  TmpModel m("bad");
  std::vector<uint8_t> q(4, 0x38);  // 1.0
  m.write(json::parse(R"({"quant_method":"compressed-tensors","format":"float-quantized",
      "config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"channel"}}},
      "ignore":["lm_head"]})"),
          {{"x.weight", bytes({2, 2}, DType::f8_e4m3, q)},  // no scale
           {"y.weight", bytes({2, 2}, DType::f8_e4m3, q)},
           {"y.weight_scale", f32({3, 1}, {1, 1, 1})},      // mis-shaped: 3 rows, not 2
           {"lm_head.weight", bytes({2, 2}, DType::f8_e4m3, q)},
           {"lm_head.weight_scale", f32({2, 1}, {1, 1})}});  // quantized but ignored
  Checkpoint c = Checkpoint::open(m.dir.string());
  QuantConfig qc = load_quant_config(m.dir.string());
  std::string file = (m.dir / "model.safetensors").string();
  expect_error([&] { dequantize_weight(c, qc, "x.weight"); }, {file, "x.weight", "no scale"});
  expect_error([&] { dequantize_weight(c, qc, "y.weight"); }, {file, "y.weight_scale", "[3, 1]"});
  expect_error([&] { dequantize_weight(c, qc, "lm_head.weight"); }, {file, "lm_head.weight", "excluded", "ignore"});
}
