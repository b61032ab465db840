// Host emulation harness for the v2 attention kernels (src/ops/cuda/attention_v2.cuh): runs the
// kernel source on the CPU, one fiber (a ucontext of its own stack) per CUDA thread, switched
// cooperatively at barriers on one OS thread, with warp-collective emulations of
// shfl / ldmatrix / mma.sync m16n8k16 and a deferred cp.async queue (copies land at
// cp.async.wait_group, so reading a stage before its wait sees stale bytes), then compares with
// an fp64 reference. For logic checks without a GPU (indices, masks, pipeline, split merge);
// and for the deterministic mode's uniform attention, bit-identical rows under any chunking or
// batch. Built with CUDA on (target attention_emu); ctest emulator.attention_uniform runs
// `attention_emu uniform` (those cases only), emulator.attention_window `attention_emu window`
// (sliding-window cases); the whole list by hand:
//   g++ -std=c++20 -O1 -pthread -w -DTS_ATTN_EMU -I src -I /usr/local/cuda/include \
//       bench/kernels/attention_emu.cpp -o /tmp/attention_emu && /tmp/attention_emu
#include <cuda_bf16.h>

#include "core/fp8.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

// ---- CUDA built-ins -------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct Idx3 {
  unsigned x = 0, y = 0, z = 0;
};
// The running fiber's indices (set by the scheduler at each switch: every fiber runs on the one
// OS thread, so a plain global is "thread-local" to the fiber that is running).
Idx3 threadIdx, blockIdx;
Idx3 gridDim, blockDim;
using std::max;
using std::min;

constexpr int kMaxThreads = 256;
alignas(16) unsigned char g_smem[240 * 1024];
uint64_t g_xchg[kMaxThreads / 32][32][8];

// ---- fibers ---------------------------------------------------------------------------------
// One block's CUDA threads as fibers, run round-robin by run_grid on the calling thread. A fiber
// runs until it waits at a barrier (or ends), then yields to the scheduler. With OS threads (the
// first version) every warp collective was a futex round trip of 32 threads: the ctest cases took
// 1,000+ CPU-seconds on the 2-core CI machine.
struct CpOp {
  void* dst;
  const void* src;
};
struct Fiber {
  ucontext_t ctx;
  Idx3 tid;
  bool done = false;
  std::vector<std::vector<CpOp>> groups;  // committed cp.async groups, oldest first
  std::vector<CpOp> pending;              // not yet committed
};
ucontext_t g_sched;     // the scheduler's context (run_grid)
Fiber* g_cur = nullptr;  // the running fiber
inline void fiber_yield() { swapcontext(&g_cur->ctx, &g_sched); }

// A barrier of `expected` fibers; the last to arrive releases the others (by a new generation).
struct Barrier {
  int expected = 0, count = 0;
  uint64_t gen = 0;
  void reset(int n) { expected = n, count = 0; }
  void arrive_and_wait() {
    const uint64_t g = gen;
    if (++count == expected) {
      count = 0, ++gen;
      return;
    }
    while (gen == g) fiber_yield();
  }
  void arrive_and_drop() {  // a fiber that ends: later phases wait for one fewer
    --expected;
    if (count > 0 && count == expected) count = 0, ++gen;
  }
};
Barrier g_block_bar;
Barrier g_warp_bar[kMaxThreads / 32];

inline void __syncthreads() { g_block_bar.arrive_and_wait(); }
inline int lane_id() { return int(threadIdx.x) & 31; }
inline int warp_id() { return int(threadIdx.x) >> 5; }
inline void warp_sync() { g_warp_bar[warp_id()].arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int o) {
  uint64_t* me = g_xchg[warp_id()][lane_id()];
  std::memcpy(me, &v, 4);
  warp_sync();
  float r;
  std::memcpy(&r, g_xchg[warp_id()][lane_id() ^ o], 4);
  warp_sync();
  return r;
}
inline size_t __cvta_generic_to_shared(const void* p) {
  return size_t(static_cast<const unsigned char*>(p) - g_smem);
}

namespace ts::cuda {
inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
}  // namespace ts::cuda

// ---- deferred cp.async: per fiber (Fiber::groups / pending), landing at cp_async_wait ----------

namespace ts::ops::cuda {
namespace {

struct AttnParams {
  const __nv_bfloat16* q;
  int64_t q_s0, q_s1;
  const __nv_bfloat16* kc;
  const __nv_bfloat16* vc;
  const uint8_t* kc8;
  const uint8_t* vc8;
  int64_t kc_tok, vc_tok;
  float k_deq, v_deq, v_out;
  const int32_t* cu_q;
  const int32_t* kv_len;
  const int32_t* bt;
  int64_t bt_ld;
  int max_blocks;
  int block_size, nh, nkv, G, hd, hd_v;
  float scale_log2;
  __nv_bfloat16* out;
  int64_t o_s0, o_s1;
  int num_splits, split_len;
  int split_target, split_min_tiles;
  float* part_o;
  float* part_ml;
  int T, B;
  bool q_vec;
  bool o_vec2;
  int bs_shift;
  int merge_groups;
  int d_rows;
  bool uniform, split_loop;
  int window;
};

// Copies of attention.cu's helpers (kept in sync by hand: tiny).
inline void pdl_wait() {}
inline void pdl_trigger() {}
inline void zero_padding_rows(const AttnParams& p) {
  const int64_t first = p.cu_q[p.B];
  const int64_t nblk = int64_t(gridDim.x) * gridDim.y;
  const int64_t bid = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t per_tok = int64_t(p.nh) * p.hd_v;
  for (int64_t i = bid * blockDim.x + threadIdx.x; i < (p.T - first) * per_tok; i += nblk * blockDim.x) {
    const int64_t tok = first + i / per_tok, r = i % per_tok, h = r / p.hd_v, d = r % p.hd_v;
    p.out[tok * p.o_s0 + h * p.o_s1 + d] = __float2bfloat16(0.0f);
  }
}
inline int64_t slot_of(const AttnParams& p, int b, int tok) {
  const int blk = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
  return int64_t(p.bt[b * p.bt_ld + blk]) * p.block_size + (tok - blk * p.block_size);
}
inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
inline uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
inline float bf_lo(uint32_t u) { return __bfloat162float(__ushort_as_bfloat16(uint16_t(u & 0xffff))); }
inline float bf_hi(uint32_t u) { return __bfloat162float(__ushort_as_bfloat16(uint16_t(u >> 16))); }
inline float bf_at(const unsigned char* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return __bfloat162float(__ushort_as_bfloat16(u));
}

// f16 halves (the FP8 cache's decode MMAs), through GCC's _Float16.
inline float h_lo(uint32_t u) {
  const uint16_t b = uint16_t(u & 0xffff);
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return float(h);
}
inline float h_hi(uint32_t u) { return h_lo(u >> 16); }
inline uint32_t pack_f16(float lo, float hi) {
  const _Float16 h[2] = {_Float16(lo), _Float16(hi)};
  uint32_t u;
  std::memcpy(&u, h, 4);
  return u;
}

// mma.sync.m16n8k16.row.col f32.{bf16,f16}.{bf16,f16}.f32, PTX fragment layout.
inline void mma_impl(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, bool f16) {
  auto lo = [&](uint32_t v) { return f16 ? h_lo(v) : bf_lo(v); };
  auto hi = [&](uint32_t v) { return f16 ? h_hi(v) : bf_hi(v); };
  uint64_t* me = g_xchg[warp_id()][lane_id()];
  for (int i = 0; i < 4; ++i) me[i] = a[i];
  me[4] = b0;
  me[5] = b1;
  warp_sync();
  auto A = [&](int r, int k) {
    const uint64_t* src = g_xchg[warp_id()][(r % 8) * 4 + (k % 8) / 2];
    const uint32_t v = uint32_t(src[(r / 8) + 2 * (k / 8)]);
    return (k & 1) ? hi(v) : lo(v);
  };
  auto Bm = [&](int k, int n) {
    const uint64_t* src = g_xchg[warp_id()][n * 4 + (k % 8) / 2];
    const uint32_t v = uint32_t(src[4 + k / 8]);
    return (k & 1) ? hi(v) : lo(v);
  };
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
  float r[4];
  for (int e = 0; e < 4; ++e) {
    const int row = gq + 8 * (e >> 1), col = 2 * tq + (e & 1);
    double acc = c[e];
    for (int k = 0; k < 16; ++k) acc += double(A(row, k)) * double(Bm(k, col));
    r[e] = float(acc);
  }
  warp_sync();
  for (int e = 0; e < 4; ++e) c[e] = r[e];
}

inline void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) { mma_impl(c, a, b0, b1, false); }
inline void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) { mma_impl(c, a, b0, b1, true); }

inline void cp_async16(void* smem, const void* gmem) { g_cur->pending.push_back({smem, gmem}); }

}  // namespace
}  // namespace ts::ops::cuda

// kv_fp8.cuh's reading: 8 e4m3 bytes -> 8 bf16 (exact in bf16: e4m3 has 3 mantissa bits).
namespace ts::ops::cuda::kvfp8 {
inline uint4 to_f16x8(const uint2& v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  _Float16 h[8];
  for (int i = 0; i < 8; ++i) h[i] = _Float16(::ts::e4m3_to_f32(b[i]));
  uint4 r;
  std::memcpy(&r, h, 16);
  return r;
}
inline uint4 to_bf16x8(const uint2& v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  uint16_t h[8];
  for (int i = 0; i < 8; ++i) h[i] = __bfloat16_as_ushort(__float2bfloat16(::ts::e4m3_to_f32(b[i])));
  uint4 r;
  std::memcpy(&r, h, 16);
  return r;
}
}  // namespace ts::ops::cuda::kvfp8

// PTX helpers of attention_v2.cuh.
namespace ts::ops::cuda {
namespace {
#define TS_DYN_SMEM(name) unsigned char* name = g_smem
inline uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
inline void ldsm_impl(uint32_t* r, uint32_t a, bool trans) {
  uint64_t* me = g_xchg[warp_id()][lane_id()];
  me[0] = a;
  warp_sync();
  const int t = lane_id();
  for (int i = 0; i < 4; ++i) {
    uint16_t h[2];
    for (int j = 0; j < 2; ++j) {
      const unsigned char* p;
      if (!trans) p = g_smem + g_xchg[warp_id()][i * 8 + t / 4][0] + 2 * (2 * (t % 4) + j);
      else p = g_smem + g_xchg[warp_id()][i * 8 + 2 * (t % 4) + j][0] + 2 * (t / 4);
      std::memcpy(&h[j], p, 2);
    }
    r[i] = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
  }
  warp_sync();
}
inline void ldsm_x4(uint32_t* r, uint32_t a) { ldsm_impl(r, a, false); }
inline void ldsm_x4_t(uint32_t* r, uint32_t a) { ldsm_impl(r, a, true); }
inline void cp_async_commit() {
  g_cur->groups.push_back(std::move(g_cur->pending));
  g_cur->pending.clear();
}
template <int N>
inline void cp_async_wait() {
  auto& groups = g_cur->groups;
  while (int(groups.size()) > N) {
    for (const CpOp& op : groups.front()) std::memcpy(op.dst, op.src, 16);
    groups.erase(groups.begin());
  }
}
inline float fast_exp2(float x) { return std::exp2(x); }
// Rounded arithmetic without contraction (-std=c++20: GCC does not contract across statements).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
}  // namespace
}  // namespace ts::ops::cuda

#define TS_ATTN_EMU 1
namespace ts::ops::cuda {
using namespace ::ts::cuda;
namespace {
#include "ops/cuda/attention_v2.cuh"
}
}  // namespace ts::ops::cuda

using namespace ts::ops::cuda;

// Runs one grid: every block's threads as fibers, blocks one after another.
constexpr size_t kFiberStack = 256 * 1024;
const std::function<void()>* g_body = nullptr;
void fiber_main() {
  (*g_body)();
  if (!g_cur->pending.empty() || !g_cur->groups.empty()) cp_async_wait<0>();
  g_warp_bar[int(threadIdx.x) / 32].arrive_and_drop();
  g_block_bar.arrive_and_drop();
  g_cur->done = true;
}  // returns to uc_link: the scheduler

// A fiber's stack with a guard page below it (stacks grow down): an overflow faults instead of
// writing over the next fiber's frames.
static char* new_fiber_stack() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) std::abort();
  return static_cast<char*>(m) + page;
}

static void run_grid(Idx3 grid, int threads, const std::function<void()>& body) {
  static std::vector<char*> stacks;
  static Fiber fibers[kMaxThreads];
  if (threads > kMaxThreads || threads % 32) std::abort();
  while (int(stacks.size()) < threads) stacks.push_back(new_fiber_stack());
  gridDim = grid;
  blockDim = {unsigned(threads), 1, 1};
  g_body = &body;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(g_smem, 0xcd, sizeof(g_smem));  // stale garbage (finite-ish bytes)
        g_block_bar.reset(threads);
        for (int w = 0; w < threads / 32; ++w) g_warp_bar[w].reset(32);
        blockIdx = {x, y, z};
        for (int t = 0; t < threads; ++t) {
          Fiber& f = fibers[t];
          f.tid = {unsigned(t), 0, 0};
          f.done = false;
          f.groups.clear();
          f.pending.clear();
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = stacks[size_t(t)];
          f.ctx.uc_stack.ss_size = kFiberStack;
          f.ctx.uc_link = &g_sched;
          makecontext(&f.ctx, fiber_main, 0);
        }
        for (int alive = threads; alive > 0;) {
          alive = 0;
          for (int t = 0; t < threads; ++t) {
            Fiber& f = fibers[t];
            if (f.done) continue;
            g_cur = &f;
            threadIdx = f.tid;
            swapcontext(&g_sched, &f.ctx);
            alive += !f.done;
          }
        }
        g_cur = nullptr;
      }
}

static std::mt19937 g_rng(5);
static int g_merge_spt = 8;  // kMergeSplitsPerThread (varied below to cover 1..8 groups)
static uint16_t rbf() {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  return __bfloat16_as_ushort(__float2bfloat16(d(g_rng)));
}
static float bf(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }

// The block table, head layout, row counts and output strides (hd_v = hd, o row stride ow).
static void set_layout(AttnParams& p, const int32_t* bt, int max_blocks, int bs, int nkv, int G, int hd, int T, int B,
                       int64_t ow) {
  p.bt = bt;
  p.bt_ld = max_blocks;
  p.max_blocks = max_blocks;
  p.block_size = bs;
  p.nh = nkv * G;
  p.nkv = nkv;
  p.G = G;
  p.hd = p.hd_v = hd;
  p.o_s0 = ow;
  p.o_s1 = hd;
  p.T = T;
  p.B = B;
  p.q_vec = true;
  p.o_vec2 = true;
  p.bs_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if ((1 << sh) == bs) p.bs_shift = sh;
}

struct Seq {
  int q_len, kv_len;
};

// path 3: decode (forced splits; 0 = 1 split), 4/5/6: prefill variants.
// fp8: e4m3 caches (kv_fp8.cuh) with per-tensor scales k_scale / v_scale (0: bf16 caches).
// window > 0: sliding-window attention (keys (pos - window, pos]).
static bool run_case(const std::vector<Seq>& seqs, int nkv, int G, int hd, int bs, int path, int splits,
                     int pad, int bound = 0, float k_scale = 0.0f, float v_scale = 0.0f, int window = 0) {
  const bool f8 = k_scale > 0.0f;
  const int B = int(seqs.size()), nh = nkv * G;
  std::vector<int32_t> cu{0}, kvl;
  int max_q = 0, max_kv = 0, max_blocks = 1, total_blocks = 0;
  for (auto& s : seqs) {
    cu.push_back(cu.back() + s.q_len);
    kvl.push_back(s.kv_len);
    max_q = std::max(max_q, s.q_len);
    max_kv = std::max(max_kv, s.kv_len);
    max_blocks = std::max(max_blocks, (s.kv_len + bs - 1) / bs);
    total_blocks += (s.kv_len + bs - 1) / bs;
  }
  max_kv = std::max(max_kv, bound);
  const int nblk = total_blocks + 2;
  std::vector<int32_t> perm(size_t(nblk), 0);
  for (int i = 0; i < nblk; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), g_rng);
  std::vector<int32_t> bt(size_t(B * max_blocks), -1);
  size_t next = 0;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < (seqs[size_t(b)].kv_len + bs - 1) / bs; ++j) bt[size_t(b * max_blocks + j)] = perm[next++];
  const int T = cu.back() + pad;
  const int64_t qw = int64_t(nh + 2 * nkv) * hd;  // fused-qkv row stride, like the tests
  std::vector<uint16_t> q(size_t(T * qw)), kc(size_t(nblk) * bs * nkv * hd), vc(kc.size());
  for (auto& v : q) v = rbf();
  for (auto& v : kc) v = rbf();
  for (auto& v : vc) v = rbf();
  // FP8: the caches' bytes, and kc / vc become their values (stored x scale) for the reference.
  std::vector<uint8_t> kc8(kc.size()), vc8(vc.size());
  std::vector<double> kref(kc.size()), vref(vc.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    if (f8) {
      kc8[i] = ts::f32_to_e4m3(2.0f * bf(kc[i]) / k_scale);
      vc8[i] = ts::f32_to_e4m3(2.0f * bf(vc[i]) / v_scale);
      kref[i] = double(ts::e4m3_to_f32(kc8[i])) * k_scale;
      vref[i] = double(ts::e4m3_to_f32(vc8[i])) * v_scale;
    } else {
      kref[i] = bf(kc[i]);
      vref[i] = bf(vc[i]);
    }
  }
  const int64_t ow = int64_t(nh) * hd + 16;
  std::vector<uint16_t> out(size_t(T * ow), 0x7fc0);  // NaN fill: every row must be written
  AttnParams p{};
  p.q = reinterpret_cast<const __nv_bfloat16*>(q.data());
  p.q_s0 = qw;
  p.q_s1 = hd;
  if (f8) {
    p.kc8 = kc8.data();
    p.vc8 = vc8.data();
  } else {
    p.kc = reinterpret_cast<const __nv_bfloat16*>(kc.data());
    p.vc = reinterpret_cast<const __nv_bfloat16*>(vc.data());
  }
  p.kc_tok = p.vc_tok = int64_t(nkv) * hd;
  p.k_deq = p.v_deq = 1.0f;
  p.v_out = f8 ? v_scale : 1.0f;
  p.cu_q = cu.data();
  p.kv_len = kvl.data();
  p.window = window;
  set_layout(p, bt.data(), max_blocks, bs, nkv, G, hd, T, B, ow);
  const float scale = 1.0f / std::sqrt(float(hd));
  p.scale_log2 = scale * 1.4426950408889634f * (f8 ? k_scale : 1.0f);
  p.out = reinterpret_cast<__nv_bfloat16*>(out.data()) + 8;
  const int64_t rows = int64_t(max_q) * G;
  std::vector<float> ws;
  if (path == 3) {
    const int chunks = int(std::max<int64_t>(1, (rows + kDRows - 1) / kDRows));
    // (as paged_attention: a window bounds the span the splits cover)
    const int64_t span = window > 0 ? std::min<int64_t>(max_kv, int64_t(window) + max_q + kDTile) : max_kv;
    const int64_t tiles = std::max<int64_t>(1, (span + kDTile - 1) / kDTile);
    int64_t ns = std::max(splits, 1);
    const int64_t split_len = (tiles + ns - 1) / ns * kDTile;
    ns = (tiles * kDTile + split_len - 1) / split_len;
    p.num_splits = int(ns);
    p.split_len = int(split_len);
    ws.assign(size_t(ns) * T * nh * (hd + 2), std::nanf(""));
    p.part_o = ws.data();
    p.part_ml = ws.data() + size_t(ns) * T * nh * hd;
    run_grid({unsigned(ns), unsigned(nkv * chunks), unsigned(B + 1)}, kDThreads, [&] {
      if (hd == 64) f8 ? attn_decode_kernel<64, true>(p, chunks) : attn_decode_kernel<64, false>(p, chunks);
      else f8 ? attn_decode_kernel<128, true>(p, chunks) : attn_decode_kernel<128, false>(p, chunks);
    });
    if (ns > 1) {
      const int nc = hd / 4;
      int groups = 1;
      while (groups * nc < kMThreads && groups * g_merge_spt < ns) groups *= 2;
      p.merge_groups = groups;
      const int rpb = kMThreads / (nc * groups);
      run_grid({unsigned((std::max(max_q, 1) * nh + rpb - 1) / rpb), unsigned(B), 1}, kMThreads,
               [&] { attn_merge_kernel(p); });
    }
  } else {
    const int bm = path == 4 ? 64 : 128;
    const int chunks = int(std::max<int64_t>(1, (rows + bm - 1) / bm));
    run_grid({unsigned(nkv), unsigned(chunks), unsigned(B + 1)}, kPThreads, [&] {
      auto go = [&](auto f8c) {
        constexpr bool F8 = decltype(f8c)::value;
        if (hd == 64) {
          if (path == 4) attn_prefill_kernel<64, 1, 64, F8>(p);
          else if (path == 5) attn_prefill_kernel<64, 2, 32, F8>(p);
          else attn_prefill_kernel<64, 2, 64, F8>(p);
        } else {
          if (path == 4) attn_prefill_kernel<128, 1, 64, F8>(p);
          else if (path == 5) attn_prefill_kernel<128, 2, 32, F8>(p);
          else attn_prefill_kernel<128, 2, 64, F8>(p);
        }
      };
      if (f8) go(std::true_type{});
      else go(std::false_type{});
    });
  }
  // fp64 reference.
  double num = 0, den = 0;
  bool nan = false;
  for (int b = -1; b < B; ++b) {
    const int r_begin = b < 0 ? cu[size_t(B)] : cu[size_t(b)], r_end = b < 0 ? T : cu[size_t(b) + 1];
    for (int r = r_begin; r < r_end; ++r)
      for (int h = 0; h < nh; ++h) {
        std::vector<double> ref(size_t(hd), 0.0);
        if (b >= 0) {
          const int pos = kvl[size_t(b)] - (r_end - r_begin) + (r - r_begin), kvh = h / G;
          const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
          std::vector<double> sc(size_t(std::max(pos + 1, 0)), 0.0);
          double mx = -INFINITY;
          for (int t = lo; t <= pos; ++t) {
            const int64_t slot = int64_t(bt[size_t(b * max_blocks + t / bs)]) * bs + t % bs;
            double d = 0;
            for (int k = 0; k < hd; ++k) d += double(bf(q[size_t(r * qw + h * hd + k)])) * kref[size_t((slot * nkv + kvh) * hd + k)];
            sc[size_t(t)] = d * scale;
            mx = std::max(mx, sc[size_t(t)]);
          }
          double sum = 0;
          for (int t = lo; t <= pos; ++t) sum += (sc[size_t(t)] = std::exp(sc[size_t(t)] - mx));
          for (int t = lo; t <= pos; ++t) {
            const int64_t slot = int64_t(bt[size_t(b * max_blocks + t / bs)]) * bs + t % bs;
            for (int k = 0; k < hd; ++k) ref[size_t(k)] += sc[size_t(t)] / sum * vref[size_t((slot * nkv + kvh) * hd + k)];
          }
        }
        for (int k = 0; k < hd; ++k) {
          const float g = bf(out[size_t(r * ow + 8 + h * hd + k)]);
          if (std::isnan(g)) nan = true;
          num += (g - ref[size_t(k)]) * (g - ref[size_t(k)]);
          den += ref[size_t(k)] * ref[size_t(k)];
        }
      }
  }
  const double err = std::sqrt(num / std::max(den, 1e-30));
  const bool ok = !nan && err < 1e-2;
  std::printf("%s path=%d splits=%d B=%d q0=%d kv0=%d nkv=%d G=%d hd=%d bs=%d pad=%d bound=%d fp8=%g/%g window=%d err=%.2e%s\n",
              ok ? "OK  " : "FAIL", path, splits, B, seqs[0].q_len, seqs[0].kv_len, nkv, G, hd, bs, pad, bound,
              k_scale, v_scale, window, err, nan ? " (NaN/unwritten)" : "");
  return ok;
}


// ---- uniform (deterministic) mode: bit-identical rows under any chunking / batch ------------
// Master data for a few sequences (paged KV of `len` tokens each, a query row per position);
// a "call" runs path 3 in uniform mode (16 rows per block, one split; SplitKvOptions::uniform)
// over parts (seq, first position, rows): part rows are positions [first, first + rows) with
// kv_len = first + rows. Every (seq, position) row must come out bit-identical in every call
// that computes it, and close to the fp64 reference.
struct UniSeq {
  int len;
  std::vector<int32_t> blocks;  // physical block of each logical block
};
struct UniData {
  int nkv, G, hd, bs;
  bool f8;
  float k_scale = 1.0f, v_scale = 1.0f;
  int window = 0;  // sliding window of the attention (0: none)
  std::vector<UniSeq> seqs;
  std::vector<std::vector<uint16_t>> q;  // per seq: [len][nh * hd]
  std::vector<uint16_t> kc, vc;          // [blocks][bs][nkv][hd]
  std::vector<uint8_t> kc8, vc8;
};
struct UniPart {
  int seq, first, rows;
};

static UniData uni_make(const std::vector<int>& lens, int nkv, int G, int hd, int bs, bool f8) {
  UniData d{nkv, G, hd, bs, f8};
  if (f8) d.k_scale = 0.3f, d.v_scale = 2.5f;
  int total = 0;
  for (int L : lens) total += (L + bs - 1) / bs;
  std::vector<int32_t> perm(size_t(total + 1));
  for (int i = 0; i <= total; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), g_rng);
  size_t next = 0;
  const int nh = nkv * G;
  for (int L : lens) {
    UniSeq u{L, {}};
    for (int j = 0; j < (L + bs - 1) / bs; ++j) u.blocks.push_back(perm[next++]);
    d.seqs.push_back(u);
    std::vector<uint16_t> q(size_t(L) * nh * hd);
    for (auto& v : q) v = rbf();
    d.q.push_back(std::move(q));
  }
  d.kc.resize(size_t(total + 1) * bs * nkv * hd);
  d.vc.resize(d.kc.size());
  for (auto& v : d.kc) v = rbf();
  for (auto& v : d.vc) v = rbf();
  d.kc8.resize(d.kc.size());
  d.vc8.resize(d.vc.size());
  for (size_t i = 0; i < d.kc.size(); ++i) {
    d.kc8[i] = ts::f32_to_e4m3(2.0f * bf(d.kc[i]) / d.k_scale);
    d.vc8[i] = ts::f32_to_e4m3(2.0f * bf(d.vc[i]) / d.v_scale);
  }
  return d;
}

// Runs one call with splits of split_tiles tiles: loop = one block walks its splits (as
// paged_attention runs queries longer than 8), else a block per split and the merge kernel (as
// it runs decodes); returns each part's rows [rows][nh * hd] (bf16 bits).
static std::vector<std::vector<uint16_t>> uni_call(const UniData& d, const std::vector<UniPart>& parts, int pad,
                                                   int split_tiles, bool loop) {
  const int B = int(parts.size()), nh = d.nkv * d.G, hd = d.hd;
  std::vector<int32_t> cu{0}, kvl;
  int max_q = 0, max_kv = 0, max_blocks = 1;
  for (auto& pt : parts) {
    cu.push_back(cu.back() + pt.rows);
    kvl.push_back(pt.first + pt.rows);
    max_q = std::max(max_q, pt.rows);
    max_kv = std::max(max_kv, pt.first + pt.rows);
    max_blocks = std::max(max_blocks, int(d.seqs[size_t(pt.seq)].blocks.size()));
  }
  std::vector<int32_t> bt(size_t(B * max_blocks), -1);
  for (int b = 0; b < B; ++b) {
    const auto& blk = d.seqs[size_t(parts[size_t(b)].seq)].blocks;
    for (size_t j = 0; j < blk.size(); ++j) bt[size_t(b * max_blocks) + j] = blk[j];
  }
  const int T = cu.back() + pad;
  const int64_t qw = int64_t(nh) * hd + 8;  // a wider row stride, as a fused qkv buffer has
  std::vector<uint16_t> q(size_t(T) * qw, 0);
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < parts[size_t(b)].rows; ++r)
      std::memcpy(&q[size_t(cu[size_t(b)] + r) * qw],
                  &d.q[size_t(parts[size_t(b)].seq)][size_t(parts[size_t(b)].first + r) * nh * hd], size_t(nh * hd) * 2);
  const int64_t ow = int64_t(nh) * hd;
  std::vector<uint16_t> out(size_t(T) * ow, 0x7fc0);
  AttnParams p{};
  p.q = reinterpret_cast<const __nv_bfloat16*>(q.data());
  p.q_s0 = qw;
  p.q_s1 = hd;
  if (d.f8) {
    p.kc8 = d.kc8.data();
    p.vc8 = d.vc8.data();
  } else {
    p.kc = reinterpret_cast<const __nv_bfloat16*>(d.kc.data());
    p.vc = reinterpret_cast<const __nv_bfloat16*>(d.vc.data());
  }
  p.kc_tok = p.vc_tok = int64_t(d.nkv) * hd;
  p.k_deq = p.v_deq = 1.0f;
  p.v_out = d.f8 ? d.v_scale : 1.0f;
  p.cu_q = cu.data();
  p.kv_len = kvl.data();
  p.window = d.window;
  set_layout(p, bt.data(), max_blocks, d.bs, d.nkv, d.G, hd, T, B, ow);
  p.scale_log2 = 1.0f / std::sqrt(float(hd)) * 1.4426950408889634f * (d.f8 ? d.k_scale : 1.0f);
  p.out = reinterpret_cast<__nv_bfloat16*>(out.data());
  // As paged_attention's uniform mode: 16 rows per block, fixed splits from token 0.
  p.d_rows = 16;
  p.uniform = true;
  p.split_loop = loop;
  const int chunks = int(std::max<int64_t>(1, (int64_t(max_q) * d.G + 15) / 16));
  const int64_t tiles = std::max<int64_t>(1, (max_kv + kDTile - 1) / kDTile);
  const int ns = loop ? 1 : int((tiles + split_tiles - 1) / split_tiles);
  p.num_splits = ns;
  p.split_len = split_tiles * kDTile;
  std::vector<float> ws;
  if (!loop) {
    ws.assign(size_t(ns) * T * nh * (hd + 2), std::nanf(""));
    p.part_o = ws.data();
    p.part_ml = ws.data() + size_t(ns) * T * nh * hd;
  }
  // As decode_launch: split_loop grids put (kv head, row chunk) on x.
  const Idx3 grid = loop ? Idx3{unsigned(d.nkv * chunks), 1, unsigned(B + 1)}
                         : Idx3{unsigned(ns), unsigned(d.nkv * chunks), unsigned(B + 1)};
  run_grid(grid, kDThreads, [&] {
    if (hd == 64) d.f8 ? attn_decode_kernel<64, true, true>(p, chunks) : attn_decode_kernel<64, false, true>(p, chunks);
    else d.f8 ? attn_decode_kernel<128, true, true>(p, chunks) : attn_decode_kernel<128, false, true>(p, chunks);
  });
  if (!loop) {
    p.merge_groups = 1;
    const int rpb = kMThreads / (hd / 4);
    run_grid({unsigned((std::max(max_q, 1) * nh + rpb - 1) / rpb), unsigned(B), 1}, kMThreads,
             [&] { attn_merge_kernel(p); });
  }
  std::vector<std::vector<uint16_t>> res;
  for (int b = 0; b < B; ++b)
    res.emplace_back(out.begin() + cu[size_t(b)] * ow, out.begin() + cu[size_t(b) + 1] * ow);
  for (int t = cu.back(); t < T; ++t)
    for (int64_t i = 0; i < ow; ++i)
      if (out[size_t(t * ow + i)] != 0) return {};  // padding rows must be zeros
  return res;
}

// fp64 reference of one row (seq, pos): relative error of `got` over its nh * hd values.
static double uni_ref_err(const UniData& d, int seq, int pos, const uint16_t* got) {
  const int nh = d.nkv * d.G, hd = d.hd;
  const auto& u = d.seqs[size_t(seq)];
  double num = 0, den = 0;
  for (int h = 0; h < nh; ++h) {
    const int kvh = h / d.G;
    const int lo = d.window > 0 ? std::max(0, pos - d.window + 1) : 0;
    std::vector<double> sc(size_t(pos + 1), 0.0), ref(size_t(hd), 0.0);
    double mx = -INFINITY;
    auto kval = [&](size_t i) {
      return d.f8 ? double(ts::e4m3_to_f32(d.kc8[i])) * d.k_scale : double(bf(d.kc[i]));
    };
    auto vval = [&](size_t i) {
      return d.f8 ? double(ts::e4m3_to_f32(d.vc8[i])) * d.v_scale : double(bf(d.vc[i]));
    };
    for (int t = lo; t <= pos; ++t) {
      const int64_t slot = int64_t(u.blocks[size_t(t / d.bs)]) * d.bs + t % d.bs;
      double s = 0;
      for (int k = 0; k < hd; ++k)
        s += double(bf(d.q[size_t(seq)][size_t(pos) * nh * hd + size_t(h * hd + k)])) * kval(size_t((slot * d.nkv + kvh) * hd + k));
      sc[size_t(t)] = s / std::sqrt(double(hd));
      mx = std::max(mx, sc[size_t(t)]);
    }
    double sum = 0;
    for (int t = lo; t <= pos; ++t) sum += (sc[size_t(t)] = std::exp(sc[size_t(t)] - mx));
    for (int t = lo; t <= pos; ++t) {
      const int64_t slot = int64_t(u.blocks[size_t(t / d.bs)]) * d.bs + t % d.bs;
      for (int k = 0; k < hd; ++k) ref[size_t(k)] += sc[size_t(t)] / sum * vval(size_t((slot * d.nkv + kvh) * hd + k));
    }
    for (int k = 0; k < hd; ++k) {
      const double g = bf(got[h * hd + k]);
      num += (g - ref[size_t(k)]) * (g - ref[size_t(k)]);
      den += ref[size_t(k)] * ref[size_t(k)];
    }
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Sequence 0 (length L) computed five ways -- its whole prompt at once; in uneven chunks; in
// chunks beside other sequences and decodes (a mixed batch); its last rows as decodes in a
// batch; as a 1-row prefill after a cached prefix -- must give identical bits per row.
static bool run_uniform_case(int L, int nkv, int G, int hd, int bs, bool f8, int split_tiles, int window = 0) {
  UniData d = uni_make({L, 150, 70}, nkv, G, hd, bs, f8);
  d.window = window;
  const int row = nkv * G * hd;
  std::vector<std::vector<uint16_t>> ref(static_cast<size_t>(L));
  bool ok = true;
  int compared = 0;
  auto check = [&](int pos, const uint16_t* r, const char* how) {
    if (ref[size_t(pos)].empty()) {
      ref[size_t(pos)].assign(r, r + row);
      return;
    }
    ++compared;
    if (std::memcmp(ref[size_t(pos)].data(), r, size_t(row) * 2) != 0) {
      if (ok) std::printf("  row %d differs (%s)\n", pos, how);
      ok = false;
    }
  };
  auto take = [&](const std::vector<std::vector<uint16_t>>& res, const std::vector<UniPart>& parts, const char* how) {
    if (res.empty()) {
      std::printf("  padding rows not zero (%s)\n", how);
      ok = false;
      return;
    }
    for (size_t i = 0; i < parts.size(); ++i)
      if (parts[i].seq == 0)
        for (int r = 0; r < parts[i].rows; ++r) check(parts[i].first + r, &res[i][size_t(r) * row], how);
  };
  const int S = split_tiles;
  {  // whole prompt: one block walks each row chunk's splits
    std::vector<UniPart> parts{{0, 0, L}};
    take(uni_call(d, parts, 0, S, true), parts, "whole (split loop)");
  }
  {  // uneven chunks, each its own call, alternating the two split schedules
    bool loop = false;
    for (int a = 0; a < L; loop = !loop) {
      const int n = std::min(L - a, a == 0 ? 37 : 61);
      std::vector<UniPart> parts{{0, a, n}};
      take(uni_call(d, parts, 1, S, loop), parts, loop ? "chunked (split loop)" : "chunked (split blocks + merge)");
      a += n;
    }
  }
  {  // mixed batches: decodes of seq 1 first, then seq 0's chunk, then seq 2's prefill
    bool loop = true;
    for (int a = 0; a < L; loop = !loop) {
      const int n = std::min(L - a, 23);
      std::vector<UniPart> parts{{1, 100 + a % 40, 1}, {1, 120, 1}, {0, a, n}, {2, 0, 70}};
      take(uni_call(d, parts, 3, S, loop), parts, loop ? "mixed (split loop)" : "mixed (split blocks + merge)");
      a += n;
    }
  }
  {  // decodes in a batch (the last 5 rows), and a 1-row prefill after its cached prefix
    for (int pos = L - 5; pos < L; ++pos) {
      std::vector<UniPart> parts{{2, 0, 9}, {0, pos, 1}, {1, 149, 1}};
      take(uni_call(d, parts, 0, S, false), parts, "decode (split blocks + merge)");
      std::vector<UniPart> solo{{0, pos, 1}};
      take(uni_call(d, solo, 0, S, pos % 2 == 0), solo, "decode alone");
    }
  }
  double worst = 0;
  for (int pos : {0, 1, L / 2, L - 1}) worst = std::max(worst, uni_ref_err(d, 0, pos, ref[size_t(pos)].data()));
  ok = ok && worst < 1e-2;
  std::printf("%s uniform L=%d nkv=%d G=%d hd=%d bs=%d fp8=%d split=%d tiles window=%d: %d rows compared across calls, err=%.2e\n",
              ok ? "OK  " : "FAIL", L, nkv, G, hd, bs, int(f8), S, window, compared, worst);
  return ok;
}

// `attention_emu uniform`: the uniform-mode cases only (ctest attention_emu_uniform).
// Sliding-window attention (ops::paged_attention's window): the decode kernel with splits that
// start below, inside and past the window, the merge, the prefill variants with windows shorter
// than, equal to and longer than a tile and than the chunk, FP8 caches, and the uniform mode.
// quick (ctest emulator.attention_window): head dim 128 and two prefill variants only.
static bool run_window_cases(bool quick) {
  bool ok = true;
  for (int hd : {64, 128}) {
    if (quick && hd == 64) continue;
    ok &= run_case({{1, 1}, {8, 17}, {3, 65}, {5, 130}}, 2, 4, hd, 16, 3, 1, 2, 0, 0.0f, 0.0f, 5);
    ok &= run_case({{1, 300}, {8, 200}, {2, 15}, {1, 140}}, 2, 8, hd, 64, 3, 3, 0, 0, 0.0f, 0.0f, 100);
    ok &= run_case({{4, 700}, {1, 63}}, 1, 1, hd, 16, 3, 7, 1, 0, 0.0f, 0.0f, 64);
    ok &= run_case({{1, 500}, {6, 470}}, 1, 8, hd, 16, 3, 5, 2, 4096, 0.0f, 0.0f, 1);
    ok &= run_case({{2, 900}, {1, 7}}, 2, 2, hd, 24, 3, 4, 0, 1200, 0.0f, 0.0f, 257);
    ok &= run_case({{3, 400}}, 1, 12, hd, 64, 3, 1, 0, 0, 0.3f, 2.5f, 130);
    for (int path : {4, 5, 6}) {
      if (quick && path == 5) continue;
      ok &= run_case({{70, 70}, {1, 1}, {33, 200}}, 2, 4, hd, 16, path, 0, 3, 0, 0.0f, 0.0f, 20);
      ok &= run_case({{300, 300}}, 1, 1, hd, 64, path, 0, 0, 0, 0.0f, 0.0f, 64);
      ok &= run_case({{130, 450}, {9, 9}}, 1, 8, hd, 16, path, 0, 1, 0, 0.0f, 0.0f, 200);
      ok &= run_case({{100, 100}}, 1, 3, hd, 24, path, 0, 0, 0, 0.0f, 0.0f, 1);
      ok &= run_case({{90, 400}}, 2, 2, hd, 16, path, 0, 0, 0, 0.3f, 2.5f, 77);
    }
  }
  // Uniform (deterministic) mode: rows bit-identical under any chunking with a window shorter
  // and longer than a split.
  if (!quick) ok &= run_uniform_case(300, 2, 4, 64, 16, false, 1, 90);
  ok &= run_uniform_case(260, 1, 4, 128, 24, true, 2, 200);
  return ok;
}

int main(int argc, char** argv) {
  const bool uniform_only = argc > 1 && std::strcmp(argv[1], "uniform") == 0;
  if (argc > 1 && std::strcmp(argv[1], "window") == 0) {
    const bool ok = run_window_cases(true);
    std::printf(ok ? "ALL OK\n" : "SOME FAILED\n");
    return ok ? 0 : 1;
  }
  bool ok = true;
  // Uniform (deterministic) mode first: G 1 / 4 / 12 (a row's heads over several blocks), block
  // sizes 16 / 64 / 24, FP8 caches.
  // Splits of 1 and 2 tiles (64 / 128 tokens) so every case spans several.
  // `attention_emu uniform K` runs case K alone: ctest runs the four as separate tests.
  const int only = uniform_only && argc > 2 ? std::atoi(argv[2]) : -1;
  const struct {
    int L, nkv, G, hd, bs;
    bool f8;
    int split;
  } kUniform[] = {{200, 2, 4, 64, 16, false, 1}, {131, 1, 12, 128, 64, false, 2}, {150, 2, 1, 128, 24, false, 1},
                  {140, 1, 4, 64, 16, true, 2}};
  for (int k = 0; k < 4; ++k)
    if (only < 0 || only == k) {
      const auto& c = kUniform[k];
      ok &= run_uniform_case(c.L, c.nkv, c.G, c.hd, c.bs, c.f8, c.split);
    }
  if (uniform_only) {
    std::printf(ok ? "ALL OK\n" : "SOME FAILED\n");
    return ok ? 0 : 1;
  }
  for (int hd : {64, 128}) {
    // decode / verify: q_len 1..8 mixed, tile/block edges, splits 1/2/3/7, empty splits, padding
    ok &= run_case({{1, 1}, {8, 17}, {3, 65}, {5, 130}}, 2, 4, hd, 16, 3, 1, 2);
    ok &= run_case({{1, 200}, {8, 64}, {2, 15}, {1, 16}}, 2, 8, hd, 64, 3, 3, 0);
    ok &= run_case({{4, 300}, {1, 63}}, 1, 1, hd, 16, 3, 7, 1);
    ok &= run_case({{1, 40}, {6, 70}}, 1, 8, hd, 16, 3, 5, 2, 4096);
    ok &= run_case({{8, 150}, {7, 40}}, 1, 16, hd, 16, 3, 2, 0);  // 2 row chunks
    ok &= run_case({{3, 90}}, 1, 12, hd, 64, 3, 1, 0);            // RT = 4 with a partial m-tile
    ok &= run_case({{8, 66}, {2, 3}}, 1, 16, hd, 16, 3, 2, 1);     // split past chunk 0's rows
    ok &= run_case({{2, 100}, {1, 7}}, 2, 2, hd, 24, 3, 4, 0, 700); // block size not a power of 2
    // prefill
    for (int path : {4, 5, 6}) {
      ok &= run_case({{70, 70}, {1, 1}, {33, 200}}, 2, 4, hd, 16, path, 0, 3);
      ok &= run_case({{130, 130}}, 1, 1, hd, 64, path, 0, 0);
      ok &= run_case({{20, 150}, {9, 9}}, 1, 8, hd, 16, path, 0, 1);
      ok &= run_case({{100, 100}}, 1, 3, hd, 24, path, 0, 0);       // G = 3, block size 24
    }
  }
  // Merge shapes: 1 group (several rows per block), several groups, a row wider than a warp.
  for (int spt : {1, 2, 64}) {
    g_merge_spt = spt;
    ok &= run_case({{1, 700}, {3, 500}}, 2, 4, 64, 16, 3, 11, 1);
    ok &= run_case({{2, 900}}, 1, 8, 128, 64, 3, 13, 0, 1200);
  }
  // FP8 caches (e4m3 staging ring + converted bf16 tile), scales 1 and not.
  for (float ks : {1.0f, 0.3f})
    for (int hd : {64, 128}) {
      const float vs = ks == 1.0f ? 1.0f : 2.5f;
      ok &= run_case({{1, 1}, {8, 17}, {3, 65}, {5, 130}}, 2, 4, hd, 16, 3, 1, 2, 0, ks, vs);
      ok &= run_case({{1, 200}, {8, 64}, {2, 15}, {1, 16}}, 2, 8, hd, 64, 3, 3, 0, 0, ks, vs);
      ok &= run_case({{1, 40}, {6, 70}}, 1, 8, hd, 16, 3, 5, 2, 4096, ks, vs);
      for (int path : {4, 5, 6}) {
        ok &= run_case({{70, 70}, {1, 1}, {33, 200}}, 2, 4, hd, 16, path, 0, 3, 0, ks, vs);
        ok &= run_case({{20, 150}, {9, 9}}, 1, 8, hd, 16, path, 0, 1, 0, ks, vs);
      }
    }
  ok &= run_window_cases(false);
  std::printf(ok ? "ALL OK\n" : "SOME FAILED\n");
  return ok ? 0 : 1;
}
