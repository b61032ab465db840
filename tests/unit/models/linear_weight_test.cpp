// WeightLoader::stored_linear, the host form of the FP8 weights the CUDA backend keeps as stored:
// for every scale layout (block-128 with partial edge blocks, per-channel, per-tensor) and every
// cut the model files make (q|k|v and gate|up row stacks, TP row shards, TP column shards),
// its dequantization must equal what the CPU loader dequantizes, exactly; cuts the kernels
// cannot take (inside a k block) must fall back (nullopt).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "core/fp8.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "ops/moe_experts.h"

using namespace ts;
using json = nlohmann::json;
namespace fs = std::filesystem;
using Part = models::WeightLoader::Part;

namespace {

struct TmpCkpt {
  fs::path dir;
  explicit TmpCkpt(const std::string& tag) {
    dir = fs::temp_directory_path() / ("ts_linw_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TmpCkpt() { fs::remove_all(dir); }
};

Tensor rand_fp8(int64_t n, int64_t k, std::mt19937& r) {
  Tensor t = Tensor::empty({n, k}, DType::f8_e4m3);
  std::uniform_real_distribution<float> d(-400.0f, 400.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint8_t>()[i] = f32_to_e4m3(d(r));
  return t;
}
Tensor rand_scale(std::vector<int64_t> shape, std::mt19937& r) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  std::uniform_real_distribution<float> d(0.001f, 0.01f);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(r);
  return t;
}

// Writes weights "a" [na, K] and "b" [nb, K] in `format` (block | channel | tensor).
models::WeightLoader write(TmpCkpt& c, const std::string& format, int64_t na, int64_t nb, int64_t K) {
  std::mt19937 r(7);
  json q;
  std::vector<std::pair<std::string, Tensor>> ts;
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  for (auto [name, n] : std::vector<std::pair<std::string, int64_t>>{{"a", na}, {"b", nb}}) {
    if (format == "nvfp4") {
      Tensor w = Tensor::empty({n, K / 2}, DType::u8), sc = Tensor::empty({n, K / 16}, DType::f8_e4m3);
      for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint8_t>()[i] = uint8_t(r() & 0xff);
      std::uniform_real_distribution<float> d(0.25f, 8.0f);
      for (int64_t i = 0; i < sc.numel(); ++i) sc.ptr<uint8_t>()[i] = f32_to_e4m3(d(r));
      ts.push_back({name + ".weight", w});
      ts.push_back({name + ".weight_scale", sc});
      ts.push_back({name + ".weight_scale_2", rand_scale({}, r)});
      continue;
    }
    ts.push_back({name + ".weight", rand_fp8(n, K, r)});
    if (format == "block") ts.push_back({name + ".weight_scale_inv", rand_scale({cdiv(n, 128), cdiv(K, 128)}, r)});
    else if (format == "channel") ts.push_back({name + ".weight_scale", rand_scale({n, 1}, r)});
    else ts.push_back({name + ".weight_scale", rand_scale({1}, r)});
  }
  if (format == "nvfp4") {
    q = json::parse(R"({"quant_method":"modelopt","quant_algo":"NVFP4","group_size":16})");
  } else if (format == "block") {
    q = json::parse(R"({"quant_method":"fp8","fmt":"e4m3","weight_block_size":[128,128]})");
  } else {
    q = json::parse(R"({"quant_method":"compressed-tensors","format":"float-quantized",
        "config_groups":{"g":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"S"}}}})");
    q["config_groups"]["g"]["weights"]["strategy"] = format;
  }
  std::ofstream(c.dir / "config.json") << json{{"quantization_config", q}}.dump();
  io::write_safetensors((c.dir / "model.safetensors").string(), ts);
  return models::WeightLoader(io::Checkpoint::open(c.dir.string()), Device::cpu);
}

void expect_same(models::WeightLoader& wl, const std::vector<Part>& parts, const std::string& what) {
  std::optional<ops::LinearWeight> w = wl.stored_linear(parts);
  ASSERT_TRUE(w.has_value()) << what;
  ASSERT_TRUE(w->quantized() && w->dtype == (w->quant.nvfp4 ? DType::u8 : DType::f8_e4m3)) << what;
  Tensor ref = wl.load_parts(parts);  // the CPU loader: dequantized f32
  Tensor got = models::dequantize_linear(*w);
  ASSERT_EQ(got.dims(), ref.dims()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) bad += got.ptr<float>()[i] != ref.ptr<float>()[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.numel() << " values differ";
}

}  // namespace

TEST(LinearWeight, BlockScalesStackAndShard) {
  TmpCkpt c("block");
  const int64_t K = 400;  // 3 full k blocks and a partial one of 16
  models::WeightLoader wl = write(c, "block", 256, 200, K);
  expect_same(wl, {Part{"a.weight", {256, K}}}, "whole");
  expect_same(wl, {Part{"b.weight", {200, K}}}, "whole, partial last row block");
  expect_same(wl, {Part{"a.weight", {256, K}}, Part{"b.weight", {200, K}}}, "stack on a block edge");
  expect_same(wl, {Part{"b.weight", {200, K}}, Part{"a.weight", {256, K}}}, "stack off a block edge (per-row)");
  expect_same(wl, {Part{"a.weight", {256, K}, 0, 128, 128}, Part{"b.weight", {200, K}, 0, 128, 72}},
              "TP row shards on block edges");
  expect_same(wl, {Part{"a.weight", {256, K}, 0, 64, 100}, Part{"b.weight", {200, K}, 0, 10, 50}},
              "TP row shards inside blocks (per-row)");
  expect_same(wl, {Part{"a.weight", {256, K}, 1, 128, 256}}, "TP column shard on k blocks");
  expect_same(wl, {Part{"a.weight", {256, K}, 1, 256, 144}}, "TP column shard with the partial k block");
  EXPECT_FALSE(wl.stored_linear({Part{"a.weight", {256, K}, 1, 64, 128}}).has_value()) << "cut inside a k block";
  EXPECT_FALSE(wl.stored_linear({Part{"a.weight", {256, K}, 1, 0, 120}}).has_value()) << "K % 16 != 0";
}

TEST(LinearWeight, ChannelAndTensorScales) {
  for (const char* f : {"channel", "tensor"}) {
    TmpCkpt c(f);
    const int64_t K = 96;
    models::WeightLoader wl = write(c, f, 48, 40, K);
    expect_same(wl, {Part{"a.weight", {48, K}}, Part{"b.weight", {40, K}}}, std::string(f) + " stack");
    expect_same(wl, {Part{"a.weight", {48, K}, 0, 8, 24}, Part{"b.weight", {40, K}, 0, 3, 16}},
                std::string(f) + " row shards");
    expect_same(wl, {Part{"a.weight", {48, K}, 1, 32, 48}}, std::string(f) + " column shard");
  }
}

TEST(LinearWeight, Nvfp4StacksAndShards) {
  TmpCkpt c("nvfp4");
  const int64_t K = 128;
  models::WeightLoader wl = write(c, "nvfp4", 48, 40, K);  // a and b: different weight_scale_2
  expect_same(wl, {Part{"a.weight", {48, K}}, Part{"b.weight", {40, K}}}, "nvfp4 stack");
  expect_same(wl, {Part{"a.weight", {48, K}, 0, 5, 20}, Part{"b.weight", {40, K}, 0, 3, 16}}, "nvfp4 row shards");
  expect_same(wl, {Part{"a.weight", {48, K}, 1, 32, 64}}, "nvfp4 column shard");
  expect_same(wl, {Part{"a.weight", {48, K}, 1, 16, 96}}, "nvfp4 column shard on a 16-value group");
  EXPECT_FALSE(wl.stored_linear({Part{"a.weight", {48, K}, 1, 8, 64}}).has_value()) << "cut inside a scale group";
  EXPECT_FALSE(wl.stored_linear({Part{"a.weight", {48, K}, 1, 0, 48}}).has_value()) << "K % 32 != 0";
}

// WeightLoader::stored_experts: routed experts kept as stored, [E, R, K] with per-expert scale
// rows laid out so that experts [e0, e0 + n) read as one 2-D weight (ops::expert_rows): every
// expert's values dequantize to what the CPU loader stacks (load_parts of all parts), exactly.
namespace {

void expect_same_experts(models::WeightLoader& wl, const std::vector<std::vector<Part>>& experts,
                         const std::string& what, int want_bn = -1) {
  std::optional<ops::LinearWeight> w = wl.stored_experts(experts);
  ASSERT_TRUE(w.has_value()) << what;
  const int64_t E = int64_t(experts.size());
  ASSERT_EQ(w->ndim, 3) << what;
  ASSERT_EQ(w->size(0), E) << what;
  ASSERT_EQ(w->quant.scale.ndim, 3) << what;
  if (want_bn >= 0) {
    EXPECT_EQ(w->quant.block_n_log2, want_bn) << what;
  }
  const int64_t R = w->size(1);
  EXPECT_EQ(R % (int64_t(1) << w->quant.block_n_log2), 0) << what << ": rows end inside a row block";
  std::vector<Part> all;
  for (auto& p : experts) all.insert(all.end(), p.begin(), p.end());
  Tensor ref = wl.load_parts(all);  // [E * R, K] dequantized f32
  for (int64_t e0 : {int64_t(0), E - 1}) {
    const int64_t n = e0 == 0 ? E : 1;
    Tensor got = models::dequantize_linear(ops::expert_rows(*w, e0, n));
    ASSERT_EQ(got.size(0), n * R) << what;
    ASSERT_EQ(got.size(1), ref.size(1)) << what;
    int64_t bad = 0;
    for (int64_t i = 0; i < got.numel(); ++i) bad += got.ptr<float>()[i] != ref.ptr<float>()[e0 * R * ref.size(1) + i];
    EXPECT_EQ(bad, 0) << what << " experts [" << e0 << ", +" << n << "): " << bad << " values differ";
  }
}

}  // namespace

TEST(LinearWeight, ExpertsAsStored) {
  {
    TmpCkpt c("exp_block");
    const int64_t K = 400;
    models::WeightLoader wl = write(c, "block", 256, 256, K);
    const Part a{"a.weight", {256, K}}, b{"b.weight", {256, K}};
    expect_same_experts(wl, {{a, b}, {b, a}, {a, b}}, "block gate|up per expert", 7);
    expect_same_experts(wl, {{a}, {b}}, "block down per expert", 7);
    // MoE TP: each expert's row shard (gate and up) and column shard (down) on block edges.
    expect_same_experts(wl, {{Part{"a.weight", {256, K}, 0, 128, 128}, Part{"b.weight", {256, K}, 0, 128, 128}}},
                        "block row shards", 7);
    expect_same_experts(wl, {{Part{"a.weight", {256, K}, 1, 128, 256}}, {Part{"b.weight", {256, K}, 1, 128, 256}}},
                        "block column shards", 7);
    EXPECT_FALSE(wl.stored_experts({{Part{"a.weight", {256, K}, 1, 64, 128}}}).has_value()) << "cut inside a k block";
  }
  {
    TmpCkpt c("exp_block_edge");
    models::WeightLoader wl = write(c, "block", 200, 200, 256);
    const Part a{"a.weight", {200, 256}}, b{"b.weight", {200, 256}};
    // 200 rows (and 400 stacked) end inside a 128-row block: per-row scales.
    expect_same_experts(wl, {{a}, {b}}, "block, partial row block", 0);
    expect_same_experts(wl, {{a, b}, {b, a}}, "block gate|up, partial row blocks", 0);
  }
  {
    TmpCkpt c("exp_nvfp4");
    models::WeightLoader wl = write(c, "nvfp4", 48, 48, 128);  // a and b: different weight_scale_2
    const Part a{"a.weight", {48, 128}}, b{"b.weight", {48, 128}};
    expect_same_experts(wl, {{a, b}, {b, a}}, "nvfp4 gate|up per expert");
    expect_same_experts(wl, {{Part{"a.weight", {48, 128}, 1, 32, 64}}, {Part{"b.weight", {48, 128}, 1, 64, 64}}},
                        "nvfp4 column shards");
  }
  {
    TmpCkpt c("exp_channel");
    models::WeightLoader wl = write(c, "channel", 48, 48, 96);
    expect_same_experts(wl, {{Part{"a.weight", {48, 96}}}, {Part{"b.weight", {48, 96}}}}, "channel");
  }
}
