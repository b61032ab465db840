#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "bench/ceilings.h"
#include "bench/model_bench.h"
#include "bench/random_fill.h"
#include "bench/random_model.h"
#include "io/config.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "models/eagle3_draft.h"
#include "models/model.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace ts;
using nlohmann::json;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("ts_random_model_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string sub(const std::string& s) const { return (path / s).string(); }
};

bench::RandomModelOptions tiny(const std::string& preset, const std::string& out) {
  bench::RandomModelOptions o;
  o.preset = preset;
  o.out_dir = out;
  o.seed = 7;
  o.quiet = true;
  o.overrides.num_layers = preset.rfind("eagle3", 0) == 0 ? -1 : 2;
  o.overrides.hidden_size = 64;
  o.overrides.intermediate_size = 96;
  o.overrides.vocab_size = 1024;
  o.overrides.num_heads = 4;
  o.overrides.num_kv_heads = 2;
  o.overrides.head_dim = 16;
  return o;
}

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

double total_params(const std::string& preset) {
  double n = 0;
  for (auto& t : bench::checkpoint_tensors(bench::preset_config(preset), DType::bf16)) n += double(t.numel());
  return n;
}

}  // namespace

TEST(RandomModel, PresetParamCountsMatchTheRealModels) {
  EXPECT_EQ(total_params("llama-3.1-8b"), 8030261248.0);
  EXPECT_EQ(total_params("llama-3.2-1b"), 1235814400.0);
  EXPECT_EQ(total_params("qwen3-8b"), 8190735360.0);
  EXPECT_EQ(total_params("qwen3-30b-a3b"), 30532122624.0);
  auto eagle = bench::checkpoint_tensors(bench::preset_config("eagle3-llama-3.1-8b"), DType::bf16);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& t : eagle) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes["fc.weight"], (std::vector<int64_t>{4096, 3 * 4096}));
  EXPECT_EQ(shapes["midlayer.self_attn.q_proj.weight"], (std::vector<int64_t>{4096, 8192}));
  EXPECT_EQ(shapes["midlayer.self_attn.k_proj.weight"], (std::vector<int64_t>{1024, 8192}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{32000, 4096}));
  EXPECT_EQ(shapes["d2t"], (std::vector<int64_t>{32000}));
  EXPECT_EQ(shapes["t2d"], (std::vector<int64_t>{128256}));
  json e = bench::preset_config("eagle3-llama-3.1-8b");
  EXPECT_EQ(e["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json({1, 15, 28}));
  // The classic Hub rope form, parsed by our config reader.
  io::ModelConfig c = io::parse_config(bench::preset_config("llama-3.1-8b"), "llama-3.1-8b");
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(io::parse_config(bench::preset_config("llama-3.2-1b"), "1b").tie_word_embeddings);
  EXPECT_EQ(io::parse_config(bench::preset_config("qwen3-8b"), "q").rope.theta, 1000000.0);
  EXPECT_THROW(bench::preset_config("gpt-5"), Error);
}

TEST(RandomModel, MoeTensorNames) {
  auto specs = bench::checkpoint_tensors(bench::preset_config("qwen3-30b-a3b"), DType::bf16);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& t : specs) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes["model.layers.0.mlp.gate.weight"], (std::vector<int64_t>{128, 2048}));
  EXPECT_EQ(shapes["model.layers.47.mlp.experts.127.gate_proj.weight"], (std::vector<int64_t>{768, 2048}));
  EXPECT_EQ(shapes["model.layers.47.mlp.experts.127.up_proj.weight"], (std::vector<int64_t>{768, 2048}));
  EXPECT_EQ(shapes["model.layers.47.mlp.experts.127.down_proj.weight"], (std::vector<int64_t>{2048, 768}));
  EXPECT_EQ(shapes["model.layers.3.self_attn.q_norm.weight"], (std::vector<int64_t>{128}));
  EXPECT_EQ(shapes["model.layers.3.self_attn.k_proj.weight"], (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(shapes.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{151936, 2048}));
}

TEST(RandomModel, TinyLlamaLoadsRunsAndIsDeterministic) {
  TempDir d;
  auto o = tiny("llama-3.1-8b", d.sub("a"));
  auto r = bench::make_random_model(o);
  EXPECT_EQ(r.num_files, 1);
  EXPECT_TRUE(fs::exists(d.sub("a/model.safetensors")));
  EXPECT_TRUE(fs::exists(d.sub("a/generation_config.json")));
  EXPECT_NE(r.tokenizer_source.find("generated"), std::string::npos);

  io::ModelConfig cfg = io::load_config(d.sub("a"));
  EXPECT_EQ(cfg.vocab_size, 1024);
  EXPECT_EQ(cfg.num_layers, 2);
  EXPECT_EQ(cfg.rope.type, "llama3");
  auto tk = tok::Tokenizer::from_dir(d.sub("a"));
  EXPECT_EQ(tk->vocab_size(), 1024);
  ASSERT_TRUE(cfg.bos_token_id.has_value());
  EXPECT_EQ(tk->token_to_id("<|begin_of_text|>"), *cfg.bos_token_id);
  EXPECT_EQ(tk->eos_id(), tk->token_to_id("<|eot_id|>"));
  EXPECT_NE(std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), *tk->eos_id()), cfg.eos_token_ids.end());

  // Weights: N(0, 0.02), norms 1.
  io::Checkpoint ck = io::Checkpoint::open(d.sub("a"));
  Tensor e = ck.get("model.embed_tokens.weight", {1024, 64}).to_f32();
  double s = 0, s2 = 0;
  int64_t n = e.numel();
  for (int64_t i = 0; i < n; ++i) s += e.ptr<float>()[i], s2 += double(e.ptr<float>()[i]) * e.ptr<float>()[i];
  EXPECT_NEAR(s / double(n), 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(s2 / double(n)), 0.02, 1e-3);
  Tensor nw = ck.get("model.layers.1.input_layernorm.weight", {64}).to_f32();
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(nw.ptr<float>()[i], 1.0f);
  EXPECT_TRUE(ck.has("lm_head.weight"));

  // The engine's loader and a forward.
  models::LoadOptions lo;
  std::shared_ptr<models::Model> m = models::load_model(d.sub("a"), lo);
  ModelRunner runner(m, 4, 16);
  std::vector<int32_t> table = {0, 1, 2, 3}, ids = {1, 2, 3};
  Tensor logits = runner.run({{ids.data(), 3, 0, &table, SeqChunk::Logits::last}});
  ASSERT_EQ(logits.size(1), 1024);
  for (int64_t i = 0; i < 1024; ++i) ASSERT_TRUE(std::isfinite(logits.ptr<float>()[i]));

  // Same seed, same bytes; another seed, other bytes.
  bench::make_random_model(tiny("llama-3.1-8b", d.sub("b")));
  EXPECT_EQ(read_all(d.sub("a/model.safetensors")), read_all(d.sub("b/model.safetensors")));
  auto o2 = tiny("llama-3.1-8b", d.sub("c"));
  o2.seed = 8;
  bench::make_random_model(o2);
  EXPECT_NE(read_all(d.sub("a/model.safetensors")), read_all(d.sub("c/model.safetensors")));
}

TEST(RandomModel, ShardsWithIndex) {
  TempDir d;
  auto o = tiny("qwen3-8b", d.sub("q"));
  o.max_shard_bytes = 100000;
  auto r = bench::make_random_model(o);
  EXPECT_GT(r.num_files, 2);
  EXPECT_TRUE(fs::exists(d.sub("q/model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(d.sub("q/model-00001-of-" + fmt::format("{:05d}", r.num_files) + ".safetensors")));
  json idx = json::parse(std::ifstream(d.sub("q/model.safetensors.index.json")));
  EXPECT_EQ(idx["metadata"]["total_size"].get<size_t>(), r.total_bytes);
  io::Checkpoint ck = io::Checkpoint::open(d.sub("q"));
  EXPECT_TRUE(ck.has("model.layers.1.self_attn.k_norm.weight"));
  models::LoadOptions lo;
  std::shared_ptr<models::Model> m = models::load_model(d.sub("q"), lo);
  EXPECT_EQ(m->config().architecture, "Qwen3ForCausalLM");
  ModelRunner runner(m, 2, 16);
  std::vector<int32_t> table = {0, 1}, ids = {5, 6, 7, 8};
  Tensor logits = runner.run({{ids.data(), 4, 0, &table, SeqChunk::Logits::last}});
  EXPECT_TRUE(std::isfinite(logits.ptr<float>()[0]));
  auto tk = tok::Tokenizer::from_dir(d.sub("q"));
  EXPECT_EQ(tk->vocab_size(), 1024);
  EXPECT_EQ(tk->eos_id(), tk->token_to_id("<|im_end|>"));
  // A second run into the same directory with one file removes the old shards.
  o.max_shard_bytes = size_t(1) << 30;
  bench::make_random_model(o);
  EXPECT_FALSE(fs::exists(d.sub("q/model.safetensors.index.json")));
  EXPECT_NO_THROW(models::load_model(d.sub("q"), lo));
}

TEST(RandomModel, TinyMoeCheckpoint) {
  TempDir d;
  auto o = tiny("qwen3-30b-a3b", d.sub("moe"));
  o.overrides.num_experts = 4;
  o.overrides.num_experts_per_tok = 2;
  o.overrides.moe_intermediate_size = 32;
  bench::make_random_model(o);
  io::Checkpoint ck = io::Checkpoint::open(d.sub("moe"));
  EXPECT_EQ(ck.get("model.layers.1.mlp.gate.weight").dims(), (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(ck.get("model.layers.1.mlp.experts.3.down_proj.weight").dims(), (std::vector<int64_t>{64, 32}));
  json c = json::parse(std::ifstream(d.sub("moe/config.json")));
  EXPECT_EQ(c["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(c["num_experts"], 4);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
}

TEST(RandomModel, Eagle3DraftLoadsAgainstItsTarget) {
  TempDir d;
  bench::make_random_model(tiny("llama-3.1-8b", d.sub("target")));
  auto o = tiny("eagle3-llama-3.1-8b", d.sub("draft"));
  o.overrides.target_num_layers = 2;  // aux ids [0, 1]: two captured layers
  o.overrides.draft_vocab_size = 300;
  bench::make_random_model(o);
  json c = json::parse(std::ifstream(d.sub("draft/config.json")));
  EXPECT_EQ(c["target_hidden_size"], 64);
  EXPECT_EQ(c["draft_vocab_size"], 300);
  io::Checkpoint ck = io::Checkpoint::open(d.sub("draft"));
  Tensor d2t = ck.get("d2t"), t2d = ck.get("t2d");
  ASSERT_EQ(d2t.dtype, DType::i64);
  ASSERT_EQ(t2d.dtype, DType::boolean);
  ASSERT_EQ(t2d.numel(), 1024);
  int hits = 0;
  for (int64_t i = 0; i < 1024; ++i) hits += t2d.ptr<uint8_t>()[i];
  EXPECT_EQ(hits, 300);
  for (int64_t i = 0; i < 300; ++i) EXPECT_TRUE(t2d.ptr<uint8_t>()[i + d2t.ptr<int64_t>()[i]]);
  models::LoadOptions lo;
  std::shared_ptr<models::Model> target = models::load_model(d.sub("target"), lo);
  models::Eagle3Draft draft(d.sub("draft"), *target);  // checks every d2t offset
  EXPECT_EQ(draft.draft_vocab(), 300);
  EXPECT_EQ(draft.aux_width(), 2 * 64);
  EXPECT_EQ(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"], json({0, 1}));
}

TEST(RandomModel, GeneratedTokenizersRoundTripAscii) {
  const std::string text = "Hello, world! The quick brown fox jumps over 13 lazy dogs.\n\tdef f(x): return x*2  # done";
  struct Case {
    int64_t vocab;
    const char* family;
    const char* bos;
    int32_t bos_id;
  };
  for (Case cs : {Case{1024, "llama3", "<|begin_of_text|>", 992}, Case{128256, "llama3", "<|begin_of_text|>", 128000},
                  Case{151936, "qwen", "<|endoftext|>", 151643}, Case{300, "qwen", "<|endoftext|>", 268}}) {
    bench::GeneratedTokenizer g = bench::generate_tokenizer(cs.vocab, cs.family);
    auto tk = tok::Tokenizer::from_json_string(g.tokenizer_json.dump(), "generated");
    EXPECT_EQ(tk->vocab_size(), cs.vocab) << cs.vocab;
    EXPECT_EQ(tk->token_to_id(cs.bos), cs.bos_id) << cs.vocab;
    for (int32_t id = 0; id < cs.vocab; ++id) ASSERT_TRUE(tk->is_valid_id(id)) << id;
    std::vector<int32_t> ids = tk->encode(text);
    EXPECT_EQ(tk->decode(ids), text) << cs.vocab;
    if (cs.vocab >= 4096) {
      EXPECT_LT(ids.size(), text.size()) << "merges apply";
    }
    std::string all;
    for (int c = 1; c < 128; ++c) all += char(c);
    EXPECT_EQ(tk->decode(tk->encode(all)), all);
  }
  // Real special ids of the families at their real vocabulary sizes.
  auto l = tok::Tokenizer::from_json_string(bench::generate_tokenizer(128256, "llama3").tokenizer_json.dump());
  EXPECT_EQ(l->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(l->token_to_id("<|start_header_id|>"), 128006);
  std::vector<int32_t> with_bos = l->encode("hi", true);
  EXPECT_EQ(with_bos.front(), 128000);
  auto q = tok::Tokenizer::from_json_string(bench::generate_tokenizer(151936, "qwen").tokenizer_json.dump());
  EXPECT_EQ(q->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(q->token_to_id("<|im_end|>"), 151645);
  EXPECT_THROW(bench::generate_tokenizer(200, "llama3"), Error);
}

TEST(RandomFill, DeterministicInAnyChunking) {
  std::vector<uint16_t> a(1001), b(1001);
  uint64_t key = bench::stream_key(3, "w");
  bench::fill_normal(a.data(), DType::bf16, key, 0, 1001, 0.02f);
  bench::fill_normal(b.data(), DType::bf16, key, 0, 3, 0.02f);
  bench::fill_normal(b.data() + 3, DType::bf16, key, 3, 500, 0.02f);
  bench::fill_normal(b.data() + 503, DType::bf16, key, 503, 498, 0.02f);
  EXPECT_EQ(a, b);
  std::vector<float> f(1 << 16);
  bench::fill_normal_parallel(f.data(), DType::f32, key, f.size(), 1.0f);
  double s = 0, s2 = 0;
  for (float v : f) s += v, s2 += double(v) * v;
  EXPECT_NEAR(s / double(f.size()), 0.0, 0.02);
  EXPECT_NEAR(s2 / double(f.size()), 1.0, 0.03);
}

TEST(Bench, CpuCeilingsAndTinyModel) {
  EXPECT_GT(bench::measure_copy_gbs(Device::cpu, size_t(8) << 20, 2), 0.0);
  EXPECT_GT(bench::measure_gemm_tflops(Device::cpu, 64, 64, 64, 2), 0.0);
  TempDir d;
  bench::make_random_model(tiny("llama-3.2-1b", d.sub("m")));
  bench::BenchOptions o;
  o.model_dir = d.sub("m");
  o.device = Device::cpu;
  o.prompt_lens = {32};
  o.batches = {1, 3};
  o.contexts = {16, 100000};  // 3 x 100000 cached tokens do not fit the 1024-token pool
  o.decode_steps = 2;
  o.prefill_repeats = 1;
  o.gemm_size = 64;
  o.copy_bytes = size_t(4) << 20;
  o.kv_tokens = 1024;
  bench::BenchResult r = bench::run_model_bench(o);
  const json& rows = r.json["results"];
  ASSERT_EQ(rows.size(), 6u);  // prefill, decode-after-prefill, 2 x 2 decode
  EXPECT_EQ(rows[0]["phase"], "prefill");
  EXPECT_GT(rows[0]["tflops"].get<double>(), 0.0);
  EXPECT_EQ(rows[1]["phase"], "decode-after-prefill");
  EXPECT_EQ(rows[3]["batch"], 3);
  EXPECT_GT(rows[3]["gb_s"].get<double>(), 0.0);
  EXPECT_TRUE(rows[4].contains("skipped"));  // 100000-token caches do not fit 1024 tokens
  EXPECT_NE(r.markdown.find("| memory bandwidth |"), std::string::npos);
  EXPECT_NE(r.markdown.find("| prefill | 1 | 32 |"), std::string::npos);
  EXPECT_TRUE(r.json["model"]["tied_embeddings"].get<bool>());
}

// --quant writes the published formats; the engine loads them (dequantized on the CPU) and runs.
// The stored values come from the same normal stream as the float weights, so the dequantized
// weights track the unquantized model's.
TEST(RandomModel, QuantizedCheckpointsLoadAndRun) {
  TempDir d;
  auto moe = [](bench::RandomModelOptions o) {
    o.overrides.num_experts = 4;
    o.overrides.num_experts_per_tok = 2;
    o.overrides.moe_intermediate_size = 32;
    return o;
  };
  auto plain = tiny("llama-3.1-8b", d.sub("plain"));
  plain.dtype = DType::f32;
  bench::make_random_model(plain);
  io::Checkpoint pk = io::Checkpoint::open(d.sub("plain"));
  Tensor ref = pk.get("model.layers.0.mlp.down_proj.weight").to_f32();
  struct Case {
    std::string preset, quant, weight_dtype, scale;
  };
  for (const Case& c : {Case{"llama-3.1-8b", "fp8", "F8_E4M3", "weight_scale_inv"},
                        Case{"llama-3.1-8b", "fp8-channel", "F8_E4M3", "weight_scale"},
                        Case{"llama-3.1-8b", "fbgemm-fp8", "F8_E4M3", "weight_scale"},
                        Case{"llama-3.1-8b", "nvfp4", "U8", "weight_scale_2"},
                        Case{"llama-3.1-8b", "ct-nvfp4", "U8", "weight_global_scale"},
                        Case{"llama-3.1-8b", "modelopt-mixed", "U8", "weight_scale_2"},
                        Case{"qwen3-30b-a3b", "fp8", "F8_E4M3", "weight_scale_inv"},
                        Case{"qwen3-30b-a3b", "fbgemm-fp8", "F8_E4M3", "weight_scale"},
                        Case{"qwen3-30b-a3b", "ct-nvfp4", "U8", "weight_global_scale"},
                        Case{"qwen3-30b-a3b", "modelopt-mixed", "U8", "weight_scale_2"}}) {
    SCOPED_TRACE(c.preset + " " + c.quant);
    std::string dir = d.sub(c.preset + "_" + c.quant);
    auto o = tiny(c.preset, dir);
    if (c.preset == "qwen3-30b-a3b") o = moe(o);
    o.quant = c.quant;
    bench::make_random_model(o);
    io::Checkpoint ck = io::Checkpoint::open(dir);
    std::string w = c.preset == "qwen3-30b-a3b" ? "model.layers.1.mlp.experts.3.down_proj" : "model.layers.0.mlp.down_proj";
    EXPECT_EQ(ck.has(w + ".weight_packed"), c.quant == "ct-nvfp4");
    io::adopt_quant_names(ck);  // ct-nvfp4's weight_packed read as weight (what WeightLoader does)
    io::QuantConfig qc = io::load_quant_config(dir);
    EXPECT_TRUE(qc.quantized());
    EXPECT_EQ(fs::exists(dir + "/hf_quant_config.json"), c.quant == "nvfp4" || c.quant == "modelopt-mixed");
    EXPECT_EQ(dtype_name(ck.get(w + ".weight").dtype), c.weight_dtype);
    EXPECT_TRUE(ck.has(w + "." + c.scale));
    EXPECT_EQ(ck.get("model.embed_tokens.weight").dtype, DType::bf16);  // stays as stored
    if (c.preset == "llama-3.1-8b") {
      // Dequantized vs the f32 model of the same seed: correlated (fp8: within e4m3 rounding).
      Tensor dq = io::dequantize_weight(ck, qc, w + ".weight");
      ASSERT_EQ(dq.dims(), ref.dims());
      double num = 0, den = 0, err = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        double a = ref.ptr<float>()[i], b = dq.ptr<float>()[i];
        num += a * b, den += a * a, err += std::abs(a - b);
      }
      EXPECT_GT(num / den, 0.9);
      if (c.quant.find("fp8") != std::string::npos) {
        EXPECT_LT(err / double(ref.numel()), 0.02 * 0.05);
      }
    }
    if (c.quant == "ct-nvfp4" && c.preset == "llama-3.1-8b") {
      // The same codes and block scales as ModelOpt NVFP4 of the seed; the global scale stored as
      // its reciprocal, so the weights agree to an f32 rounding of it.
      std::string mo = d.sub(c.preset + "_nvfp4");
      io::Checkpoint mk = io::Checkpoint::open(mo);
      Tensor a = io::dequantize_weight(ck, qc, w + ".weight");
      Tensor b = io::dequantize_weight(mk, io::load_quant_config(mo), w + ".weight");
      ASSERT_EQ(a.dims(), b.dims());
      double worst = 0;
      for (int64_t i = 0; i < a.numel(); ++i)
        worst = std::max(worst, double(std::abs(a.ptr<float>()[i] - b.ptr<float>()[i])) /
                                    std::max(1e-30, double(std::abs(b.ptr<float>()[i]))));
      EXPECT_LT(worst, 1e-6);
    }
    if (c.quant == "fbgemm-fp8") {
      // As Meta publishes it: F32 per-row scales, attention left in the model dtype and listed.
      EXPECT_EQ(ck.get(w + ".weight_scale").dtype, DType::f32);
      EXPECT_EQ(ck.get(w + ".weight_scale").dims(), (std::vector<int64_t>{ck.get(w + ".weight").size(0), 1}));
      EXPECT_EQ(io::detect_weight_format(ck, w + ".weight"), io::WeightFormat::fp8_channel);
      EXPECT_EQ(ck.get("model.layers.0.self_attn.q_proj.weight").dtype, DType::bf16);
      EXPECT_FALSE(qc.excluded("model.layers.0.self_attn.q_proj").empty());
      EXPECT_FALSE(qc.excluded("lm_head").empty());
      EXPECT_EQ(qc.act_scale_ub, 1200.0f);
    }
    if (c.quant == "modelopt-mixed") {
      // q/k/v MXFP8 (UE8M0 scale per 32), o_proj FP8_PB_WO (128 x 128 F32 blocks).
      EXPECT_EQ(ck.get("model.layers.0.self_attn.q_proj.weight_scale").dtype, DType::u8);
      EXPECT_EQ(ck.get("model.layers.0.self_attn.o_proj.weight_scale").dtype, DType::f32);
      EXPECT_EQ(io::detect_weight_format(ck, "model.layers.0.self_attn.q_proj.weight"), io::WeightFormat::mxfp8);
      // 64 x 64: a one-block grid.
      EXPECT_EQ(ck.get("model.layers.0.self_attn.o_proj.weight_scale").dims(), (std::vector<int64_t>{1, 1}));
      EXPECT_EQ(io::dequantize_weight(ck, qc, "model.layers.0.self_attn.o_proj.weight").dims(),
                (std::vector<int64_t>{64, 64}));
    }
    models::LoadOptions lo;
    std::shared_ptr<models::Model> m = models::load_model(dir, lo);
    ModelRunner runner(m, 4, 16);
    std::vector<int32_t> table = {0, 1, 2, 3}, ids = {1, 2, 3};
    Tensor logits = runner.run({{ids.data(), 3, 0, &table, SeqChunk::Logits::last}});
    ASSERT_EQ(logits.size(1), 1024);
    for (int64_t i = 0; i < 1024; ++i) ASSERT_TRUE(std::isfinite(logits.ptr<float>()[i]));
  }
  EXPECT_THROW(
      {
        auto o = tiny("llama-3.1-8b", d.sub("bad"));
        o.quant = "int4";
        bench::make_random_model(o);
      },
      std::exception);
}
