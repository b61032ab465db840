// Routed experts kept as stored on CUDA (ops::cuda::moe_experts over FP8 / NVFP4 LinearWeight
// [E, rows, K], src/ops/cuda/moe.cu) vs the CPU oracle (the experts dequantized exactly to f32,
// ops::cpu::moe_experts): FP8 block-128, per-channel and MXFP8 scales and NVFP4, at M = 1, 4, 64
// tokens (decode: the grouped GEMV over the active experts) and a prefill size (experts dequantized
// a chunk at a time + the bf16 grouped GEMM), each path also forced; the prefill path must equal
// the bf16 path run on the dequantized experts bit for bit.
#include "cuda_test_util.h"

#include <algorithm>
#include <numeric>

#include "core/fp8.h"
#include "models/weights.h"
#include "ops/cuda/quant_linear.h"
#include "ops/moe_experts.h"

using namespace ts;
using namespace ts::test;

namespace {

enum class Fmt { block128, channel, mxfp8, nvfp4 };
const char* fmt_name(Fmt f) {
  return f == Fmt::block128 ? "block128" : f == Fmt::channel ? "channel" : f == Fmt::mxfp8 ? "mxfp8" : "nvfp4";
}

int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// Random experts [E, R, K] in format f, on the GPU; magnitudes so that x . row is O(1).
ops::LinearWeight rand_experts(Fmt f, int64_t E, int64_t R, int64_t K) {
  ops::LinearWeight w;
  if (f == Fmt::nvfp4) {
    Tensor q = Tensor::empty({E, R, K / 2}, DType::u8), s = Tensor::empty({E, R, K / 16}, DType::f8_e4m3);
    Tensor s2 = Tensor::empty({E, R}, DType::f32);
    for (int64_t i = 0; i < q.numel(); ++i) q.ptr<uint8_t>()[i] = uint8_t(rng()() & 0xff);
    std::uniform_real_distribution<float> ds(0.25f, 8.0f), d2(0.5f, 1.5f);
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = f32_to_e4m3(ds(rng()));
    for (int64_t i = 0; i < s2.numel(); ++i) s2.ptr<float>()[i] = d2(rng()) * 0.2f / std::sqrt(float(K));
    w = ops::LinearWeight(q.to(Device::cuda));
    w.quant.scale = s.to(Device::cuda);
    w.quant.scale2 = s2.to(Device::cuda);
    w.quant.nvfp4 = true;
    w.quant.block_k_log2 = 4;
    w.quant.format = "nvfp4";
    return w;
  }
  const int bn = f == Fmt::block128 ? 7 : 0;
  const int bk = f == Fmt::block128 ? 7 : f == Fmt::mxfp8 ? 5 : std::max(4, ceil_log2(K));
  Tensor q = Tensor::empty({E, R, K}, DType::f8_e4m3);
  for (int64_t i = 0; i < q.numel(); ++i) {
    const uint8_t c = uint8_t(rng()() & 0xff);
    q.ptr<uint8_t>()[i] = (c & 0x7f) == 0x7f ? uint8_t(c ^ 1) : c;  // every code but NaN
  }
  const int64_t sr = R >> bn, sc = (K + (int64_t(1) << bk) - 1) >> bk;
  Tensor s = Tensor::empty({E, sr, sc}, DType::f32);
  std::uniform_real_distribution<float> ds(0.5f, 2.0f);
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = ds(rng()) * 0.02f / std::sqrt(float(K));
  w = ops::LinearWeight(q.to(Device::cuda));
  w.quant.scale = s.to(Device::cuda);
  w.quant.block_n_log2 = bn;
  w.quant.block_k_log2 = bk;
  w.quant.format = fmt_name(f);
  return w;
}

// The oracle's experts: exactly dequantized f32 [E, R, K] on the host.
Tensor dequant_experts(const ops::LinearWeight& w) {
  const int64_t E = w.size(0), R = w.size(1);
  return models::dequantize_linear(ops::expert_rows(w, 0, E)).view({E, R, ops::expert_in_features(w)});
}

// Sorted distinct ids per token; skew: every token on the first k experts (many rows per expert).
Tensor rand_ids(int64_t T, int64_t E, int64_t k, bool skew) {
  Tensor ids = Tensor::empty({T, k}, DType::i32);
  std::vector<int32_t> all(static_cast<size_t>(E));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    if (!skew) std::shuffle(all.begin(), all.end(), rng());
    std::vector<int32_t> pick(all.begin(), all.begin() + k);
    std::sort(pick.begin(), pick.end());
    for (int64_t j = 0; j < k; ++j) ids.ptr<int32_t>()[t * k + j] = pick[size_t(j)];
  }
  return ids;
}

struct Case {
  int64_t T, H, I, E, k;
  Fmt f;
  bool skew = false;
};

void check(const Case& c, ops::LinearPath path, const ops::GluAct& act = {}) {
  ops::LinearWeight gu = rand_experts(c.f, c.E, 2 * c.I, c.H), dn = rand_experts(c.f, c.E, c.H, c.I);
  Tensor gu_ref = dequant_experts(gu), dn_ref = dequant_experts(dn);
  Pair x = Pair::rand({c.T, c.H});
  Tensor ids_h = rand_ids(c.T, c.E, c.k, c.skew), w_h = Tensor::empty({c.T, c.k}, DType::f32);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  for (int64_t i = 0; i < w_h.numel(); ++i) w_h.ptr<float>()[i] = ud(rng());
  Tensor ids_d = to_dev(ids_h), w_d = to_dev(w_h);
  Tensor oh = Tensor::empty({c.T, c.H}, DType::f32);
  Tensor od = Tensor::empty({c.T, c.H}, DType::bf16, Device::cuda);
  ops::cpu::moe_experts(x.h, ids_h, w_h, gu_ref, dn_ref, act, oh);
  ops::cuda::moe_experts_stored(x.d, ids_d, w_d, gu, dn, act, od, ops::KernelPolicy{.linear = path});
  const char* pn = path == ops::LinearPath::gemv       ? "gemv"
                   : path == ops::LinearPath::cublaslt ? "tiles"
                   : path == ops::LinearPath::mma      ? "mma"
                                                       : "auto";
  EXPECT_CLOSE(to_host_f32(od), oh,
               fmt::format("{} T={} H={} I={} E={} k={} skew={} path={}", fmt_name(c.f), c.T, c.H, c.I, c.E, c.k,
                           c.skew, pn));
  if (path != ops::LinearPath::cublaslt) return;
  // The prefill path is the bf16 path over the dequantized (bf16-rounded) experts, bit for bit.
  Tensor gu_b = to_dev_bf16(gu_ref), dn_b = to_dev_bf16(dn_ref);
  Tensor ob = Tensor::empty({c.T, c.H}, DType::bf16, Device::cuda);
  ops::cuda::moe_experts(x.d, ids_d, w_d, gu_b, dn_b, act, ob);
  ::ts::cuda::synchronize();
  Tensor a = od.to(Device::cpu), b = ob.to(Device::cpu);
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) bad += a.ptr<uint16_t>()[i] != b.ptr<uint16_t>()[i];
  EXPECT_EQ(bad, 0) << fmt_name(c.f) << " T=" << c.T << ": dequantized tiles differ from the bf16 path";
}

constexpr Fmt kFmts[] = {Fmt::block128, Fmt::nvfp4, Fmt::channel, Fmt::mxfp8};

}  // namespace

// Decode and prefill sizes on Qwen3-MoE-like proportions (top-8 of 32 experts here, H 256, I 128).
TEST(CudaMoeQuant, Auto) {
  TS_REQUIRE_CUDA();
  for (Fmt f : kFmts)
    for (int64_t T : {1, 4, 64, 300}) check({T, 256, 128, 32, 8, f}, ops::LinearPath::automatic);
}

TEST(CudaMoeQuant, ForcedPaths) {
  TS_REQUIRE_CUDA();
  for (Fmt f : {Fmt::block128, Fmt::nvfp4})
    for (int64_t T : {1, 4, 64, 300})
      for (auto p : {ops::LinearPath::gemv, ops::LinearPath::cublaslt}) check({T, 256, 128, 32, 8, f}, p);
}

// The grouped tensor-core MMA over the stored experts (LinearPath::mma; automatic from 2 to 32
// expected rows per expert): every format (k blocks of 128, 32 and per channel; NVFP4 groups),
// token tiles of 8 / 16 / 32 rows (T 300: 75 rows per expert, passes of 32).
TEST(CudaMoeQuant, TensorCoreStoredExperts) {
  TS_REQUIRE_CUDA();
  for (Fmt f : kFmts)
    for (int64_t T : {1, 4, 16, 40, 300}) check({T, 256, 128, 32, 8, f}, ops::LinearPath::mma);
  ops::GluAct oai;
  oai.kind = ops::GluKind::swiglu_oai;
  oai.limit = 1.0f;
  for (Fmt f : {Fmt::block128, Fmt::nvfp4}) {
    check({3, 512, 256, 16, 4, f}, ops::LinearPath::mma, oai);
    check({70, 256, 128, 8, 2, f, true}, ops::LinearPath::mma);  // 70 rows on one expert
    check({5, 256, 128, 1, 1, f}, ops::LinearPath::mma);         // one expert, top-1
  }
  check({9, 384, 192, 12, 3, Fmt::channel}, ops::LinearPath::mma);  // I not a multiple of 128
  // I = 96: the down GEMM's 3 chunks of 32 leave a warp idle (block128's 128-row blocks do not fit).
  for (Fmt f : {Fmt::nvfp4, Fmt::channel, Fmt::mxfp8}) check({12, 256, 96, 4, 2, f}, ops::LinearPath::mma);
}

TEST(CudaMoeQuant, ShapesAndActivations) {
  TS_REQUIRE_CUDA();
  ops::GluAct oai;
  oai.kind = ops::GluKind::swiglu_oai;
  oai.limit = 1.0f;
  for (Fmt f : {Fmt::block128, Fmt::nvfp4}) {
    check({3, 512, 256, 16, 4, f}, ops::LinearPath::automatic, oai);
    check({70, 256, 128, 8, 2, f, true}, ops::LinearPath::gemv);   // 70 rows on one expert: passes of 8
    check({70, 256, 128, 8, 2, f, true}, ops::LinearPath::cublaslt);  // several work items per expert
    check({5, 256, 128, 1, 1, f}, ops::LinearPath::automatic);      // one expert, top-1
  }
  check({9, 384, 192, 12, 3, Fmt::channel}, ops::LinearPath::gemv);  // I not a multiple of 128
  check({9, 384, 192, 12, 3, Fmt::channel}, ops::LinearPath::cublaslt);
}

// A token's output does not depend on the batch on the GEMV path (each row's dot is its own) nor
// on the MMA path (each output element is its own fixed sequence of k-chunk MMAs).
TEST(CudaMoeQuant, GemvBatchInvariant) {
  TS_REQUIRE_CUDA();
  const int64_t T = 6, H = 256, I = 128, E = 16, k = 4;
  for (Fmt f : {Fmt::block128, Fmt::nvfp4}) {
    ops::LinearWeight gu = rand_experts(f, E, 2 * I, H), dn = rand_experts(f, E, H, I);
    Pair x = Pair::rand({T, H});
    Tensor ids = to_dev(rand_ids(T, E, k, false)), w = to_dev(rand_host({T, k}));
    for (auto path : {ops::LinearPath::gemv, ops::LinearPath::mma}) {
      const ops::KernelPolicy pol{.linear = path};
      Tensor full = Tensor::empty({T, H}, DType::bf16, Device::cuda);
      ops::cuda::moe_experts_stored(x.d, ids, w, gu, dn, ops::GluAct{}, full, pol);
      ::ts::cuda::synchronize();
      Tensor fh = full.to(Device::cpu);
      int64_t bad = 0;
      for (int64_t t = 0; t < T; ++t) {
        Tensor one = Tensor::empty({1, H}, DType::bf16, Device::cuda);
        ops::cuda::moe_experts_stored(x.d.slice_rows(t, t + 1), ids.slice_rows(t, t + 1), w.slice_rows(t, t + 1), gu,
                                      dn, ops::GluAct{}, one, pol);
        ::ts::cuda::synchronize();
        Tensor oh = one.to(Device::cpu);
        for (int64_t i = 0; i < H; ++i) bad += oh.ptr<uint16_t>()[i] != fh.ptr<uint16_t>()[t * H + i];
      }
      EXPECT_EQ(bad, 0) << fmt_name(f) << (path == ops::LinearPath::mma ? " mma" : " gemv")
                        << ": quantized experts' results depend on the batch";
    }
  }
}
