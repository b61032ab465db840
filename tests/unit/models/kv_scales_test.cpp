// The FP8 KV cache's per-tensor scales as checkpoints ship them (models/blocks.h
// load_kv_scales): vLLM's, ModelOpt's, compressed-tensors' and the old kv_scale names, 1.0
// without; bad scales are startup errors naming the file and tensor; and a model run over an FP8
// cache reads them (its logits move with the scales and stay near the f32 cache's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/fp8.h"
#include "io/safetensors.h"
#include "model_test_util.h"
#include "models/blocks.h"
#include "models/weights.h"

using namespace ts;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path dir;
  explicit TmpDir(const std::string& tag) {
    dir = fs::temp_directory_path() / ("ts_kvscale_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TmpDir() { fs::remove_all(dir); }
};

Tensor scalar(float v, DType dt = DType::f32, std::vector<int64_t> shape = {}) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::f32) t.ptr<float>()[i] = v;
    else t.ptr<uint16_t>()[i] = f32_to_bf16(v);
  }
  return t;
}

std::string load_error(const fs::path& dir, const std::string& pre) {
  try {
    models::WeightLoader wl(io::Checkpoint::open(dir.string()), Device::cpu);
    models::load_kv_scales(wl, pre);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KvScales, EveryPublishedNameAndTheDefault) {
  TmpDir d("names");
  std::ofstream(d.dir / "config.json") << "{}";
  const std::string L = "model.layers.";
  io::write_safetensors((d.dir / "model.safetensors").string(),
                        {{L + "0.self_attn.k_scale", scalar(0.5f)},
                         {L + "0.self_attn.v_scale", scalar(2.0f)},
                         {L + "1.self_attn.k_proj.k_scale", scalar(0.25f, DType::bf16, {1})},
                         {L + "1.self_attn.v_proj.v_scale", scalar(4.0f, DType::bf16, {1})},
                         {L + "2.self_attn.k_proj.output_scale", scalar(0.125f, DType::f32, {1})},
                         {L + "2.self_attn.v_proj.output_scale", scalar(8.0f)},
                         {L + "3.self_attn.kv_scale", scalar(3.0f)},
                         {L + "5.self_attn.k_scale", scalar(0.75f)}});
  models::WeightLoader wl(io::Checkpoint::open(d.dir.string()), Device::cpu);
  auto at = [&](int l) { return models::load_kv_scales(wl, L + std::to_string(l) + "."); };
  EXPECT_EQ(at(0).k, 0.5f);
  EXPECT_EQ(at(0).v, 2.0f);
  EXPECT_EQ(at(1).k, 0.25f);
  EXPECT_EQ(at(1).v, 4.0f);
  EXPECT_EQ(at(2).k, 0.125f);
  EXPECT_EQ(at(2).v, 8.0f);
  EXPECT_EQ(at(3).k, 3.0f);  // kv_scale: both
  EXPECT_EQ(at(3).v, 3.0f);
  EXPECT_EQ(at(4).k, 1.0f);  // none
  EXPECT_EQ(at(4).v, 1.0f);
  EXPECT_EQ(at(5).k, 0.75f);  // only k given: v stays 1
  EXPECT_EQ(at(5).v, 1.0f);
}

TEST(KvScales, BadScalesNameTheFileAndTensor) {
  for (auto [tag, t] : {std::pair<std::string, Tensor>{"neg", scalar(-1.0f)}, {"zero", scalar(0.0f)},
                        {"vector", scalar(1.0f, DType::f32, {2})}, {"int", Tensor::zeros({}, DType::i32)}}) {
    TmpDir d(tag);
    std::ofstream(d.dir / "config.json") << "{}";
    io::write_safetensors((d.dir / "model.safetensors").string(), {{"model.layers.0.self_attn.v_scale", t}});
    const std::string err = load_error(d.dir, "model.layers.0.");
    EXPECT_NE(err.find("model.layers.0.self_attn.v_scale"), std::string::npos) << tag << ": " << err;
    EXPECT_NE(err.find("model.safetensors"), std::string::npos) << tag << ": " << err;
  }
}

// A small random Llama with and without scales in its checkpoint, run over an FP8 cache: the
// scales change the logits (the model passes them to the ops) and both stay near the f32 cache.
TEST(KvScales, ModelReadsThemOverAnFp8Cache) {
  TmpDir plain("plain"), scaled("scaled");
  test::write_small_llama(plain.dir.string(), "", 2, 1024);
  test::write_small_llama(scaled.dir.string(), "", 2, 1024);
  std::vector<std::pair<std::string, Tensor>> sc;
  for (int l = 0; l < 2; ++l) {
    sc.push_back({"model.layers." + std::to_string(l) + ".self_attn.k_scale", scalar(0.037f)});
    sc.push_back({"model.layers." + std::to_string(l) + ".self_attn.v_scale", scalar(0.0061f)});
  }
  io::write_safetensors((scaled.dir / "kv_scales.safetensors").string(), sc);
  models::LoadOptions lo;
  lo.device = Device::cpu;
  auto run = [&](const fs::path& dir, std::optional<DType> kv) {
    std::shared_ptr<models::Model> m = models::load_model(dir.string(), lo);
    std::vector<int32_t> ids(40), table(8);
    for (int i = 0; i < 40; ++i) ids[size_t(i)] = int32_t((17 + 31 * i) % 1000);
    std::iota(table.begin(), table.end(), 0);
    ModelRunner r(m, 8, 16, 0, kv);
    return r.run({SeqChunk{ids.data(), 40, 0, &table, SeqChunk::Logits::all}}).to_f32();
  };
  const Tensor f32 = run(plain.dir, std::nullopt), a = run(plain.dir, DType::f8_e4m3), b = run(scaled.dir, DType::f8_e4m3);
  const Tensor f32s = run(scaled.dir, std::nullopt);
  EXPECT_EQ(test::max_abs_diff(f32s, f32), 0.0) << "an f32 cache ignores the scales";
  const double da = test::max_abs_diff(a, f32), db = test::max_abs_diff(b, f32), dab = test::max_abs_diff(a, b);
  std::printf("fp8 cache vs f32: scale 1 %.4g, checkpoint scales %.4g; between them %.4g\n", da, db, dab);
  EXPECT_GT(dab, 0.0) << "the checkpoint's scales did not reach the cache";
  EXPECT_LT(db, std::max(0.05, 4 * da));
}
