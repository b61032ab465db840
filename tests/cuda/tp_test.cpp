// Tensor parallelism on 2 GPUs (one process, one thread per GPU): TP=2 against TP=1 logits and
// greedy tokens, vocab-parallel vs replicated embedding, the fused one-shot all-reduce + norm
// against NCCL + norm, CUDA graphs under TP, and EAGLE3 through the engine. Skips with < 2 GPUs.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/device_memory.h"
#include "models/model.h"
#include "core/cuda/runtime.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "runtime/tp_workers.h"

using namespace ts;

namespace {

#define TS_REQUIRE_2GPUS()                                                                  \
  if (!::ts::cuda_available() || ::ts::cuda::device_count() < 2)                            \
  GTEST_SKIP() << "tensor-parallel tests need 2 GPUs (" << (::ts::cuda_available() ? ::ts::cuda::device_count() : 0) \
               << " visible): skipped"

std::string src(const std::string& rel) { return std::string(TS_SOURCE_DIR) + "/" + rel; }

std::unique_ptr<ModelRunner> tp1_runner(const std::string& dir) {
  models::LoadOptions lo;
  lo.device = Device::cuda;
  return std::make_unique<ModelRunner>(std::shared_ptr<models::Model>(models::load_model(dir, lo)), 256, 16);
}

std::unique_ptr<ModelRunner> tp2_runner(const std::string& dir, bool replicate = false, int fusion = 2048) {
  models::LoadOptions lo;
  lo.device = Device::cuda;
  lo.replicate_embedding = replicate;
  TpModels m = load_tp_models(io::load_config(dir), lo, 2, 1, fusion);
  return make_tp_runner(m, 256, 16);
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
};

Seq make_seq(int n, int vocab, int seed) {
  Seq s;
  for (int i = 0; i < n; ++i) s.tokens.push_back(int32_t((i * 7919 + seed * 104729 + 13) % vocab));
  for (int b = 0; b < 16; ++b) s.table.push_back(int32_t(seed * 16 + b));  // 256 tokens per seq
  return s;
}

int argmax(const float* p, int64_t n) { return int(std::max_element(p, p + n) - p); }

// Relative error ||a - b|| / ||b|| over all elements.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = double(a.ptr<float>()[i]) - double(b.ptr<float>()[i]);
    num += d * d;
    den += double(b.ptr<float>()[i]) * double(b.ptr<float>()[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Prefill + `steps` greedy decode steps on both runners (each following its own tokens);
// checks logits within tol and greedy tokens equal unless the reference's top two are a near tie.
void compare_runners(ModelRunner& ref, ModelRunner& tp, int vocab, int steps, double tol) {
  Seq a = make_seq(37, vocab, 1), b = make_seq(37, vocab, 1);
  std::vector<SeqChunk> ca{{a.tokens.data(), int(a.tokens.size()), 0, &a.table, SeqChunk::Logits::last}};
  std::vector<SeqChunk> cb{{b.tokens.data(), int(b.tokens.size()), 0, &b.table, SeqChunk::Logits::last}};
  for (int step = 0; step <= steps; ++step) {
    Tensor la = ref.run(ca), lb = tp.run(cb);
    ASSERT_EQ(la.numel(), lb.numel());
    double e = rel_err(lb, la);
    EXPECT_LT(e, tol) << "step " << step;
    int ta = argmax(la.ptr<float>(), la.numel()), tb = argmax(lb.ptr<float>(), lb.numel());
    if (ta != tb) {
      std::vector<float> v(la.ptr<float>(), la.ptr<float>() + la.numel());
      std::nth_element(v.begin(), v.begin() + 1, v.end(), std::greater<float>());
      EXPECT_LT(v[0] - v[1], 0.05f * std::max(1.0f, std::fabs(v[0]))) << "greedy tokens differ at step " << step
                                                                         << " without a near tie: " << ta << " vs " << tb;
    }
    int pos_a = int(a.tokens.size()), pos_b = int(b.tokens.size());
    a.tokens.push_back(ta);
    b.tokens.push_back(tb);
    ca = {{a.tokens.data() + pos_a, 1, pos_a, &a.table, SeqChunk::Logits::last}};
    cb = {{b.tokens.data() + pos_b, 1, pos_b, &b.table, SeqChunk::Logits::last}};
  }
}

}  // namespace

TEST(TensorParallel, DemoModelMatchesOneGpu) {
  TS_REQUIRE_2GPUS();
  auto ref = tp1_runner(src("models/pycoder"));
  auto tp = tp2_runner(src("models/pycoder"));
  compare_runners(*ref, *tp, int(ref->model().config().vocab_size), 12, 2e-2);
}

TEST(TensorParallel, FixturesMatchOneGpu) {
  TS_REQUIRE_2GPUS();
  for (const char* f : {"tests/data/llama3", "tests/data/qwen3"}) {
    SCOPED_TRACE(f);
    auto ref = tp1_runner(src(f));
    auto tp = tp2_runner(src(f));
    compare_runners(*ref, *tp, int(ref->model().config().vocab_size), 8, 2e-2);
  }
}

TEST(TensorParallel, NcclPathMatchesOneGpu) {  // fusion off: every all-reduce through NCCL
  TS_REQUIRE_2GPUS();
  auto ref = tp1_runner(src("models/pycoder"));
  auto tp = tp2_runner(src("models/pycoder"), false, 0);
  compare_runners(*ref, *tp, int(ref->model().config().vocab_size), 6, 2e-2);
}

TEST(TensorParallel, ShardedAndReplicatedEmbeddingAgree) {
  TS_REQUIRE_2GPUS();
  auto sharded = tp2_runner(src("models/pycoder"), false);
  auto replicated = tp2_runner(src("models/pycoder"), true);
  EXPECT_EQ(sharded->model().embed_layout().tp_size, 2);
  EXPECT_EQ(replicated->model().embed_layout().tp_size, 1);
  EXPECT_EQ(replicated->model().embed_table().size(0), replicated->model().config().vocab_size);
  compare_runners(*replicated, *sharded, int(sharded->model().config().vocab_size), 6, 1e-2);
}

TEST(TensorParallel, FusedAllReduceNormMatchesNccl) {
  TS_REQUIRE_2GPUS();
  const int64_t H = 4096;
  auto fused = parallel::CommGroup::create(2, 2048, H);
  auto plain = parallel::CommGroup::create(2, 0, H);
  TpWorkers w(2);
  for (int64_t T : {1, 3, 64, 200, 2048}) {
    for (bool init : {false, true}) {
      std::vector<std::vector<float>> out_f(2), out_n(2), res_f(2), res_n(2);
      w.run([&](int r) {
        auto cf = fused->rank(r), cn = plain->rank(r);
        auto fill = [&](int64_t n, uint32_t seed) {
          Tensor h = Tensor::empty({n}, DType::f32);
          uint32_t x = seed;
          for (int64_t i = 0; i < n; ++i) {
            x = x * 1664525u + 1013904223u;
            h.ptr<float>()[i] = float(int(x >> 9) % 2001 - 1000) / 1000.0f;
          }
          return h;
        };
        auto to_dev = [&](const Tensor& h, std::vector<int64_t> shape) {
          Tensor d = Tensor::empty(shape, DType::bf16, Device::cuda);
          Tensor hf = h.view(shape).to(Device::cuda);
          ops::cast(hf, d);
          return d;
        };
        Tensor xh = fill(T * H, 17u + uint32_t(r)), rh = fill(T * H, 99u), wh = fill(H, 5u);
        Tensor x1 = to_dev(xh, {T, H}), x2 = to_dev(xh, {T, H});
        Tensor r1 = to_dev(rh, {T, H}), r2 = to_dev(rh, {T, H});
        Tensor wd = to_dev(wh, {H});
        for (int rep = 0; rep < 3; ++rep) {  // repeated calls exercise both buffer parities
          if (rep > 0) {
            x1 = to_dev(xh, {T, H});
            r1 = to_dev(rh, {T, H});
          }
          cf->all_reduce_add_rmsnorm(x1, r1, wd, 1e-5f, init);
        }
        cn->all_reduce_add_rmsnorm(x2, r2, wd, 1e-5f, init);
        auto host = [&](const Tensor& d) {
          Tensor f = Tensor::empty(d.dims(), DType::f32, Device::cuda);
          ops::cast(d, f);
          return f.to_vector_f32();
        };
        out_f[size_t(r)] = host(x1);
        out_n[size_t(r)] = host(x2);
        res_f[size_t(r)] = host(r1);
        res_n[size_t(r)] = host(r2);
      });
      for (int r = 0; r < 2; ++r) {
        double md = 0, mr = 0;
        for (size_t i = 0; i < out_f[size_t(r)].size(); ++i) {
          md = std::max(md, double(std::fabs(out_f[size_t(r)][i] - out_n[size_t(r)][i])));
          mr = std::max(mr, double(std::fabs(res_f[size_t(r)][i] - res_n[size_t(r)][i])));
        }
        EXPECT_LT(md, 0.05) << "T=" << T << " init=" << init << " rank " << r;
        EXPECT_LT(mr, 0.02) << "T=" << T << " init=" << init << " rank " << r;
        EXPECT_EQ(out_f[0], out_f[1]) << "ranks must agree bit for bit (T=" << T << ")";
      }
    }
  }
}

TEST(TensorParallel, CudaGraphsMatchEager) {
  TS_REQUIRE_2GPUS();
  auto eager = tp2_runner(src("models/pycoder"));
  auto graphed = tp2_runner(src("models/pycoder"));
  GraphOptions g;
  g.max_bs = 8;
  g.max_prefill_tokens = 128;
  g.max_context = 256;
  g.eager_max_tokens = 256;
  g.progress = false;
  graphed->enable_graphs(g);
  ASSERT_TRUE(graphed->graphs());
  EXPECT_GT(graphed->graphs()->decode_graphs(), 0);
  compare_runners(*eager, *graphed, int(eager->model().config().vocab_size), 10, 1e-3);
}

namespace {
std::vector<int32_t> engine_greedy(EngineOptions o, const std::vector<int32_t>& prompt, int n) {
  Engine e(o);
  e.start();
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = n;
  p.temperature = 0;
  p.ignore_eos = true;
  auto st = e.submit(p);
  std::vector<int32_t> out;
  StreamEvent ev;
  while (st->pop(ev, 60000)) {
    EXPECT_TRUE(ev.error.empty()) << ev.error;
    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) break;
  }
  e.stop();
  return out;
}
}  // namespace

TEST(TensorParallel, EngineAndEagle3MatchOneGpu) {
  TS_REQUIRE_2GPUS();
  EngineOptions o;
  o.model_dir = src("models/pycoder");
  o.device = "cuda";
  o.max_total_tokens = 4096;
  o.cuda_graph_max_bs = 4;
  o.prefill_graph_max_tokens = 256;
  o.max_num_seqs = 4;
  o.chunked_prefill_size = 512;
  std::vector<int32_t> prompt = make_seq(40, 8192, 3).tokens;
  auto ref = engine_greedy(o, prompt, 24);
  EngineOptions t = o;
  t.tp_size = 2;
  auto tp = engine_greedy(t, prompt, 24);
  EXPECT_EQ(tp, ref) << "TP=2 engine (CUDA graphs) greedy output differs from TP=1";
  EngineOptions s = o;
  s.speculative_algorithm = "EAGLE3";
  s.speculative_draft_model_path = src("models/pycoder-eagle3");
  auto spec1 = engine_greedy(s, prompt, 24);
  s.tp_size = 2;
  auto spec2 = engine_greedy(s, prompt, 24);
  EXPECT_EQ(spec2, spec1) << "EAGLE3 with TP=2 differs from TP=1";
  s.replicate_embedding = true;  // the draft shares the replicated table instead of rebuilding
  auto spec3 = engine_greedy(s, prompt, 24);
  EXPECT_EQ(spec3, spec1) << "EAGLE3 with TP=2 and a replicated embedding differs from TP=1";
}
