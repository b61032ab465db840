// linear: out = x @ w^T (+ bias), bf16 in/out, fp32 accumulation.
// Small M (batch-1/small decode, memory-bound): a GEMV kernel that streams each weight row once
// with 16-byte loads. Otherwise cuBLASLt with a per-shape cached algorithm and a 32 MB workspace.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_helpers.cuh"

#define TS_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                  \
    cublasStatus_t s_ = (expr);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::ts::fail("cuBLASLt error {} ({}) at {}:{}", int(s_), cublasLtGetStatusString(s_), \
                 __FILE__, __LINE__);                                                   \
  } while (0)

namespace ts::ops::cuda {
using namespace ::ts::cuda;

namespace {

// lab_linear on H200 (Llama-8B lm_head, K=4096): the GEMV matches cuBLASLt at M<=2 and falls
// behind from M=4 (3.2 vs 4.3 TB/s), so large weights only take it at M<=2. Small weights are
// latency-bound (a few microseconds of reading): there one GEMV launch beats cuBLASLt's kernel
// up to M=8 — the speculative verify (4 rows per request) of small models lives there.
constexpr int kGemvMaxM = 2;
constexpr int kGemvMaxMSmall = 8;
constexpr int64_t kGemvSmallBytes = 8ll << 20;
constexpr int kGemvWarps = 8;
constexpr int kGemvUnroll = 4;

// One warp per output feature n; all M rows of x are read (L1-resident) for each weight vector.
// Requires K % 8 == 0 and 16-byte aligned rows of x and w.
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

// OutT: bf16 activations, or f32 (LM-head logits straight from the fp32 accumulators).
template <int M, typename OutT>
__global__ void __launch_bounds__(kGemvWarps * 32)
gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t x_ld, const __nv_bfloat16* __restrict__ w,
            int64_t w_ld, const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ out,
            int64_t out_ld, int N, int K) {
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (n >= N) return;
  const __nv_bfloat16* wr = w + n * w_ld;
  const int nv = K / 8;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int base = 0; base < nv; base += 32 * kGemvUnroll) {
    uint4 wv[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int i = base + u * 32 + lane;
      wv[u] = i < nv ? ld_stream16(wr + int64_t(i) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = *reinterpret_cast<const uint4*>(x + m * x_ld + int64_t(i) * 8);
          acc[m] += dot8_bf16(wv[u], xv);
        }
      }
    }
  }
  pdl_trigger();
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias ? __bfloat162float(bias[n]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) store_out(out + m * out_ld + n, acc[m] + b);
  }
}

template <int M, typename OutT>
void gemv_launch(const __nv_bfloat16* x, int64_t x_ld, const __nv_bfloat16* w, int64_t w_ld,
                 const __nv_bfloat16* bias, OutT* out, int64_t out_ld, int N, int K) {
  launch(gemv_kernel<M, OutT>, dim3(unsigned(ceil_div(N, kGemvWarps))), dim3(kGemvWarps * 32), 0, true,
         x, x_ld, w, w_ld, bias, out, out_ld, N, K);
}

template <typename OutT>
void gemv(int M, const __nv_bfloat16* x, int64_t x_ld, const __nv_bfloat16* w, int64_t w_ld,
          const __nv_bfloat16* bias, OutT* out, int64_t out_ld, int N, int K) {
  switch (M) {
    case 1: gemv_launch<1, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 2: gemv_launch<2, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 3: gemv_launch<3, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 4: gemv_launch<4, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 5: gemv_launch<5, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 6: gemv_launch<6, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 7: gemv_launch<7, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    case 8: gemv_launch<8, OutT>(x, x_ld, w, w_ld, bias, out, out_ld, N, K); break;
    default: fail("gemv: M {} > {}", M, kGemvMaxMSmall);
  }
}

// ---- cuBLASLt ------------------------------------------------------------------------------------
int align_bytes(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int b : {16, 8, 4}) if (a % b == 0) return b;
  return 2;
}

// The algorithm cache's key: the exact shape. It was M's power-of-two bucket, filled by whichever
// size came first — with a largest-first graph capture the bucket's largest — and cuBLASLt's pick
// for 1024 rows ran a 576-row prefill/mixed step at 19.8 ms against 12.4 ms for 512 rows (H200, 8B
// shapes, bench --graphs; bench --gemm-lab has the per-GEMM figures). One heuristic query per new
// shape (tens of microseconds) is what PyTorch pays too.
struct AlgoKey {
  int64_t m, n, k, ldx, ldw, ldc;
  int bias, ax, aw, ac, ab, f32out;
  int fp8 = 0;  // 0: bf16 operands; else 1 + the FP8 block-scaled GEMM's scale orders
  bool operator<(const AlgoKey& o) const {
    return std::tie(m, n, k, ldx, ldw, ldc, bias, ax, aw, ac, ab, f32out, fp8) <
           std::tie(o.m, o.n, o.k, o.ldx, o.ldw, o.ldc, o.bias, o.ax, o.aw, o.ac, o.ab, o.f32out, o.fp8);
  }
};

struct Lt {
  cublasLtHandle_t handle = nullptr;
  std::shared_ptr<void> ws;
  size_t ws_size = size_t(32) << 20;
  std::mutex mu;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
  std::map<AlgoKey, bool> fp8_unsupported;  // block-scaled FP8 shapes the heuristic refused
  // Deterministic mode: the algorithm of each shape without its M (key.m = -1), and the exact
  // shapes it was checked to run.
  std::map<AlgoKey, cublasLtMatmulAlgo_t> invariant_algos;
  std::map<AlgoKey, bool> invariant_checked;
  GemmAlgoStats stats;  // under mu
  Lt() {
    TS_CUBLAS_CHECK(cublasLtCreate(&handle));
    ws = alloc(ws_size);
  }
};

Lt& lt() {
  // One per device (handle, workspace and algorithm cache); never destroyed: they outlive
  // static tensors at exit.
  static std::mutex mu;
  static Lt* s[32] = {};
  std::lock_guard<std::mutex> g(mu);
  Lt*& l = s[current_device() & 31];
  if (!l) l = new Lt();
  return *l;
}

struct Layouts {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The bf16 GEMM's operation and layouts for out[M,N] = x[M,K] @ w[N,K]^T (+ bias): column-major
// out^T[N,M] = op(A) B with A = w viewed as column-major [K,N] (TRANSA = T) and B = x viewed as
// column-major [K,M].
void bf16_layouts(Layouts& d, int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldw, int64_t ldc,
                  const void* bias, bool f32out) {
  TS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_16BF;
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                   sizeof(bt)));
  }
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, uint64_t(K), uint64_t(N), ldw));
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, uint64_t(K), uint64_t(M), ldx));
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, f32out ? CUDA_R_32F : CUDA_R_16BF, uint64_t(N), uint64_t(M), ldc));
}

// The heuristic's first `want` algorithms for this operation (fewer where it has fewer).
int lt_heuristic(Lt& L, const Layouts& d, const AlgoKey& key, int want, cublasLtMatmulHeuristicResult_t* res) {
  cublasLtMatmulPreference_t pref = nullptr;
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t wsz = L.ws_size;
  uint32_t ax = uint32_t(key.ax), aw = uint32_t(key.aw), ac = uint32_t(key.ac);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof(wsz));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(L.handle, d.op, d.a, d.b, d.c, d.c, pref, want, res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  return st == CUBLAS_STATUS_SUCCESS ? n : 0;
}

// Deterministic mode (LaunchConfig::batch_invariant): one algorithm per shape for every M, the
// heuristic's pick for this many rows with split-K off. A per-M pick (the default) changes the
// tile shape and splits K at small M, so a row's dot products would be summed in another order
// alone than in a batch; with one algorithm, every output element is the same sequence of
// k-tile MMAs whatever M is. 128 rows: tiles that still spread a decode's few rows over N.
constexpr int64_t kInvariantRows = 128;

cublasLtMatmulAlgo_t invariant_algo(Lt& L, const Layouts& d, AlgoKey key, int64_t M, int64_t N, int64_t K,
                                    int64_t ldx, int64_t ldw, int64_t ldc, const void* bias, bool f32out) {
  const AlgoKey exact = key;
  key.m = -1;
  cublasLtMatmulAlgo_t algo;
  bool have = false, checked = false;
  {
    std::lock_guard<std::mutex> g(L.mu);
    auto it = L.invariant_algos.find(key);
    if (it != L.invariant_algos.end()) algo = it->second, have = true;
    checked = have && L.invariant_checked.count(exact) > 0;
  }
  if (!have) {
    Layouts rep;
    const int64_t rows = kInvariantRows, ldx_rep = std::max(ldx, K), ldc_rep = std::max(ldc, N);
    bf16_layouts(rep, rows, N, K, ldx_rep, ldw, ldc_rep, bias, f32out);
    cublasLtMatmulHeuristicResult_t res[8] = {};
    const int n = lt_heuristic(L, rep, key, 8, res);
    TS_CHECK(n > 0, "cuBLASLt: no algorithm for linear N={} K={} (deterministic inference)", N, K);
    // The first candidate that takes split-K off (most have it off already).
    int pick = -1;
    for (int i = 0; i < n && pick < 0; ++i) {
      int32_t one = 1;
      uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasLtMatmulAlgo_t a = res[i].algo;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)) !=
              CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t chk = {};
      if (cublasLtMatmulAlgoCheck(L.handle, rep.op, rep.a, rep.b, rep.c, rep.c, &a, &chk) != CUBLAS_STATUS_SUCCESS) continue;
      algo = a;
      pick = i;
    }
    TS_CHECK(pick >= 0, "cuBLASLt: no algorithm without split-K for linear N={} K={} (deterministic inference)", N, K);
    std::lock_guard<std::mutex> g(L.mu);
    L.invariant_algos[key] = algo;
  }
  if (!checked) {
    // Host-only (graph-safe): the shape's algorithm must run these M rows as they are.
    cublasLtMatmulHeuristicResult_t chk = {};
    TS_CHECK(cublasLtMatmulAlgoCheck(L.handle, d.op, d.a, d.b, d.c, d.c, &algo, &chk) == CUBLAS_STATUS_SUCCESS,
             "cuBLASLt: the deterministic algorithm of linear N={} K={} does not run M={} (ldx {} ldc {})", N, K, M, ldx,
             ldc);
    std::lock_guard<std::mutex> g(L.mu);
    L.invariant_checked[exact] = true;
  }
  return algo;
}

// GEMM autotuning (LaunchConfig::gemm_autotune, `--gemm-autotune`): for a new
// shape of at most kAutotuneMaxM rows the heuristic's first kAutotuneCandidates algorithms are
// timed on the real operands and the fastest is cached for the shape (PyTorch's TunableOp does
// the same); bench --gemm-lab prints the heuristic's first pick next to the best of its first 8
// per 8B shape and M, and bench --gemm-autotune the whole step's difference. The rows bound keeps
// tuning to the shapes that repeat (decode batches, graph buckets): an arbitrary prefill length
// would pay the tuning's synchronisations once each. Host-synchronising, so never while a stream
// is captured; the warm-up forward before each capture tunes the graph's shapes.
constexpr int64_t kAutotuneMaxM = 256;
constexpr int kAutotuneCandidates = 8;
constexpr int kAutotuneRuns = 5;

bool stream_capturing() {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  TS_CUDA_CHECK(cudaStreamIsCapturing(stream(), &cs));
  return cs != cudaStreamCaptureStatusNone;
}

// The fastest of res[0..n) for this operation; candidates that fail to run are skipped. Writes
// `out` (the caller's GEMM overwrites it next). A shape cached while the flag was off (the cache
// is per device, shared by every engine on it) keeps its first pick.
cublasLtMatmulAlgo_t autotune(Lt& L, const Layouts& d, const cublasLtMatmulHeuristicResult_t* res, int n,
                              const void* x, const void* w, void* out) {
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& a) {
    return cublasLtMatmul(L.handle, d.op, &alpha, w, d.a, x, d.b, &beta, out, d.c, out, d.c, &a, L.ws.get(), L.ws_size,
                          stream()) == CUBLAS_STATUS_SUCCESS;
  };
  // One untimed call (lazy module load; a candidate that refuses the shape is skipped), then the
  // median of kAutotuneRuns timed calls (core's time_ms).
  int best = 0;
  double best_ms = -1.0;
  for (int i = 0; i < n; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || !run(res[i].algo)) continue;
    bool ok = true;
    const double ms = time_ms([&] { ok = run(res[i].algo) && ok; }, kAutotuneRuns, 0);
    {
      std::lock_guard<std::mutex> g(L.mu);
      ++L.stats.candidates_timed;
    }
    if (ok && (best_ms < 0 || ms < best_ms)) best_ms = ms, best = i;
  }
  return res[best].algo;
}

void lt_matmul(int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w,
               int64_t ldw, const void* bias, void* out, int64_t ldc, bool f32out) {
  Lt& L = lt();
  Layouts d;
  bf16_layouts(d, M, N, K, ldx, ldw, ldc, bias, f32out);
  const AlgoKey key{M, N, K, ldx, ldw, ldc, bias ? 1 : 0, align_bytes(x), align_bytes(w),
                    align_bytes(out), bias ? align_bytes(bias) : 16, f32out ? 1 : 0};
  if (launch_config().batch_invariant) {
    const cublasLtMatmulAlgo_t algo = invariant_algo(L, d, key, M, N, K, ldx, ldw, ldc, bias, f32out);
    const float alpha = 1.0f, beta = 0.0f;
    TS_CUBLAS_CHECK(cublasLtMatmul(L.handle, d.op, &alpha, w, d.a, x, d.b, &beta, out, d.c, out, d.c, &algo, L.ws.get(),
                                   L.ws_size, stream()));
    return;
  }
  // The key holds everything the heuristic is asked about (shape, strides, alignments, bias,
  // output type), so a cached algorithm fits this call.
  cublasLtMatmulAlgo_t algo;
  bool have = false;
  {
    std::lock_guard<std::mutex> g(L.mu);
    auto it = L.algos.find(key);
    if (it != L.algos.end()) algo = it->second, have = true;
  }
  if (!have) {
    const bool capturing = stream_capturing();
    const bool tune = launch_config().gemm_autotune && M <= kAutotuneMaxM && !capturing;
    cublasLtMatmulHeuristicResult_t res[kAutotuneCandidates] = {};
    const int n = lt_heuristic(L, d, key, tune ? kAutotuneCandidates : 1, res);
    TS_CHECK(n > 0, "cuBLASLt: no algorithm for linear M={} N={} K={}", M, N, K);
    algo = n > 1 ? autotune(L, d, res, n, x, w, out) : res[0].algo;
    // Under capture (a shape its warm-up did not see) the heuristic's pick serves the graph and
    // is not cached, so the next eager call still tunes.
    if (!capturing) {
      std::lock_guard<std::mutex> g(L.mu);
      L.algos[key] = algo;
      ++(n > 1 ? L.stats.tuned_shapes : L.stats.heuristic_shapes);
    }
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(L.handle, d.op, &alpha, w, d.a, x, d.b, &beta, out, d.c, out, d.c, &algo,
                                           L.ws.get(), L.ws_size, stream());
  TS_CUBLAS_CHECK(st);
}

}  // namespace

bool fp8_block_matmul(int64_t M, int64_t N, int64_t K, const void* xq, const float* x_scale, const void* wq,
                      int64_t ldw, const float* w_scale, const void* bias, void* out, int64_t ldc,
                      const Fp8ScaleOrder& order) {
  // Row-major out[M,N] = column-major out^T[N,M] = op(A) B, as in lt_matmul: A = the weight (e4m3,
  // column-major [K,N], TRANSA = T) with one f32 scale per 128x128 block (BLK128x128_32F), B = the
  // quantized activations (e4m3, column-major [K,M]) with one f32 scale per token and 128 channels
  // (VEC128_32F). Hopper's FP8 tensor cores take only this TN form.
  Lt& L = lt();
  const AlgoKey key{M, N, K, K, ldw, ldc, bias ? 1 : 0, 16, 16, align_bytes(out),
                    bias ? align_bytes(bias) : 16, 0,
                    1 + int(order.act_k_major) + 2 * int(order.weight_n_major) + 4 * int(order.act_ld_pad4)};
  {
    std::lock_guard<std::mutex> g(L.mu);
    if (L.fp8_unsupported.count(key)) return false;
  }
  Layouts d;
  TS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
  if (bias) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_16BF;
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), ldw));
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), K));
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_16BF, uint64_t(N), uint64_t(M), ldc));
  cublasLtMatmulAlgo_t algo;
  bool have = false;
  {
    std::lock_guard<std::mutex> g(L.mu);
    auto it = L.algos.find(key);
    if (it != L.algos.end()) algo = it->second, have = true;
  }
  auto query = [&]() {
    cublasLtMatmulPreference_t pref = nullptr;
    TS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = L.ws_size;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof(wsz));
    cublasLtMatmulHeuristicResult_t res[1] = {};
    int n = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(L.handle, d.op, d.a, d.b, d.c, d.c, pref, 1, res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    std::lock_guard<std::mutex> g(L.mu);
    if (st != CUBLAS_STATUS_SUCCESS || n == 0) {
      L.fp8_unsupported[key] = true;  // e.g. a cuBLAS without Hopper block scaling: callers fall back
      return false;
    }
    algo = res[0].algo;
    L.algos[key] = algo;
    return true;
  };
  if (!have && !query()) return false;
  const float alpha = 1.0f, beta = 0.0f;
  // As in lt_matmul, the key fixes what the heuristic was asked about: a cached algorithm fits.
  TS_CUBLAS_CHECK(cublasLtMatmul(L.handle, d.op, &alpha, wq, d.a, xq, d.b, &beta, out, d.c, out, d.c, &algo,
                                 L.ws.get(), L.ws_size, stream()));
  return true;
}

void linear(const Tensor& x, const Tensor& w, Tensor& out, const Tensor* bias, const KernelPolicy& policy) {
  check_dev(x, DType::bf16, "linear x");
  check_dev(w, DType::bf16, "linear w");
  // f32 output (bf16 inputs, fp32 accumulate): the LM head keeps logits at full precision.
  const bool f32out = out.dtype == DType::f32;
  if (!f32out) check_dev(out, DType::bf16, "linear out");
  TS_CHECK(w.ndim == 2, "linear: weight must be [N, K], got {}", w.shape_str());
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.size(1) == K && out.rows() == M && out.size(-1) == N,
           "linear: x {} w {} out {}", x.shape_str(), w.shape_str(), out.shape_str());
  const __nv_bfloat16* bp = nullptr;
  if (bias && bias->data) {
    check_dev(*bias, DType::bf16, "linear bias");
    TS_CHECK(bias->numel() == N && bias->is_contiguous(), "linear: bias {} for N={}",
             bias->shape_str(), N);
    bp = bias->ptr<__nv_bfloat16>();
  }
  if (M == 0 || N == 0) return;
  TS_CHECK(K > 0, "linear: K must be positive");
  TS_CHECK(N <= 0x7fffffff && K <= 0x7fffffff, "linear: too large");
  const int64_t ldx = x.row_stride(), ldw = w.row_stride(), ldc = out.row_stride();
  const bool small_w = N * K * 2 <= kGemvSmallBytes || policy.linear == LinearPath::gemv;
  const bool gemv_ok = M <= (small_w ? kGemvMaxMSmall : kGemvMaxM) && vec8_ok(x.data, K, ldx) && vec8_ok(w.data, K, ldw);
  // Deterministic mode: never the GEMV (its dot order is not cuBLASLt's; rows would round
  // differently at M <= 8 than in a larger batch), unless a lab forces it.
  const bool use_gemv = gemv_ok && policy.linear != LinearPath::cublaslt &&
                        (policy.linear == LinearPath::gemv || !launch_config().batch_invariant);
  if (use_gemv) {
    if (f32out)
      gemv(int(M), x.ptr<__nv_bfloat16>(), ldx, w.ptr<__nv_bfloat16>(), ldw, bp, out.ptr<float>(), ldc, int(N), int(K));
    else
      gemv(int(M), x.ptr<__nv_bfloat16>(), ldx, w.ptr<__nv_bfloat16>(), ldw, bp, out.ptr<__nv_bfloat16>(), ldc, int(N),
           int(K));
    return;
  }
  lt_matmul(M, N, K, x.data, ldx, w.data, ldw, bp, out.data, ldc, f32out);
}

GemmAlgoStats gemm_algo_stats() {
  Lt& L = lt();
  std::lock_guard<std::mutex> g(L.mu);
  return L.stats;
}

bool linear_lab_algo(const Tensor& x, const Tensor& w, Tensor& out, int64_t query_m, int index) {
  check_dev(x, DType::bf16, "linear x");
  check_dev(w, DType::bf16, "linear w");
  check_dev(out, DType::bf16, "linear out");
  const int64_t M = x.rows(), K = x.size(-1), N = w.size(0);
  TS_CHECK(w.ndim == 2 && w.size(1) == K && out.rows() == M && out.size(-1) == N && index >= 0 && index < 32 && query_m >= 1,
           "linear_lab_algo: x {} w {} out {} index {}", x.shape_str(), w.shape_str(), out.shape_str(), index);
  Lt& L = lt();
  const int64_t ldx = x.row_stride(), ldw = w.row_stride(), ldc = out.row_stride();
  const AlgoKey key{query_m, N, K, ldx, ldw, ldc, 0, align_bytes(x.data), align_bytes(w.data), align_bytes(out.data), 16, 0};
  cublasLtMatmulHeuristicResult_t res[32] = {};
  int n = 0;
  {
    Layouts q;  // the heuristic is asked about query_m rows
    bf16_layouts(q, query_m, N, K, ldx, ldw, ldc, nullptr, false);
    n = lt_heuristic(L, q, key, index + 1, res);
  }
  if (index >= n) return false;
  Layouts d;
  bf16_layouts(d, M, N, K, ldx, ldw, ldc, nullptr, false);
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(L.handle, d.op, &alpha, w.data, d.a, x.data, d.b, &beta, out.data, d.c, out.data, d.c,
                        &res[index].algo, L.ws.get(), L.ws_size, stream()) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace ts::ops::cuda
