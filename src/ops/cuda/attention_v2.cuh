// v2 attention kernels (included by attention.cu inside its anonymous namespace, after
// AttnParams, slot_of, zero_padding_rows, mma_bf16 / mma_f16, pack_bf16 / pack_f16 and cp_async16): the split-KV
// flash-decoding kernel, its merge kernel and the FA2-style prefill kernel.
// TS_ATTN_EMU builds them as host code for the thread-level emulation harness
// (bench/kernels/attention_emu.cpp): the few PTX helpers below then come from the harness.
#pragma once

// ==== FlashAttention-2 style kernels (v2) ====================================================
// Shared pieces: ldmatrix fragment loads, pipelined cp.async, ex2.approx.
//
// Fragment conventions (mma.sync m16n8k16, gq = lane / 4, tq = lane % 4):
//   A (16 x 16, row): a0 = A[gq][2tq..], a1 = A[gq+8][2tq..], a2 = A[gq][8+2tq..], a3 = A[gq+8][8+2tq..]
//   B (16 x 8, col):  b0 = B[2tq..][gq], b1 = B[8+2tq..][gq]
//   C (16 x 8):       c0,c1 = C[gq][2tq..], c2,c3 = C[gq+8][2tq..]
// K tiles live in smem as [token][dim] (rows padded by 16 bytes: conflict-free ldmatrix), which
// is exactly the "col" B operand of S = Q K^T, so plain ldmatrix gives the B fragments; V tiles
// are [token][dim] too and are the "row" B of O = P V, so ldmatrix.trans gives them.

#ifndef TS_ATTN_EMU
#define TS_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// 2^x (MUFU); ex2.approx.ftz(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif  // TS_ATTN_EMU
__device__ __forceinline__ void zero16(void* smem) {
  *reinterpret_cast<uint4*>(smem) = make_uint4(0, 0, 0, 0);
}

// Copies KV tokens [t0, t0 + NTOK) of sequence b, kv head g, from caches kc / vc (elements of T)
// into smem tiles [NTOK][SLD] for K and V with 16-byte cp.async; tokens at or past t_lim are
// zero-filled (so masked scores meet zero V rows, never stale NaN/Inf bytes). All NTHR threads of
// the block take part.
template <int HD, int NTOK, int NTHR, typename T, int SLD>
__device__ __forceinline__ void load_tile(const AttnParams& p, int b, int g, int t0, int t_lim, const T* kc,
                                          const T* vc, T* sk, T* sv) {
  constexpr int E = 16 / int(sizeof(T)), CH = HD / E;  // elements per 16-byte chunk, chunks per row
  static_assert((NTOK * CH) % NTHR == 0, "tile chunks must split evenly over the block");
  const int tid = threadIdx.x;
#pragma unroll
  for (int it = 0; it < NTOK * CH / NTHR; ++it) {
    const int i = it * NTHR + tid;
    const int r = i / CH, c = i % CH, tok = t0 + r;
    T* kd = sk + r * SLD + c * E;
    T* vd = sv + r * SLD + c * E;
    if (tok < t_lim) {
      const int64_t slot = slot_of(p, b, tok);
      cp_async16(kd, kc + slot * p.kc_tok + int64_t(g) * HD + c * E);
      cp_async16(vd, vc + slot * p.vc_tok + int64_t(g) * HD + c * E);
    } else {
      zero16(kd);
      zero16(vd);
    }
  }
}

// bf16 caches: straight into the compute tiles [NTOK][HD + 8] (rows padded by 16 bytes).
template <int HD, int NTOK, int NTHR>
__device__ __forceinline__ void load_kv_tile(const AttnParams& p, int b, int g, int t0, int t_lim,
                                             __nv_bfloat16* sk, __nv_bfloat16* sv) {
  load_tile<HD, NTOK, NTHR, __nv_bfloat16, HD + 8>(p, b, g, t0, t_lim, p.kc, p.vc, sk, sv);
}

// FP8 caches (p.kc8 / p.vc8, e4m3): 16 values per cp.async into an e4m3 staging tile [NTOK][HD];
// convert_kv_tile turns a landed one into the 16-bit tiles the MMA loops read. The staging ring
// holds the pipeline's stages, one 16-bit tile the compute: half the bytes in flight per token,
// and the MMA code unchanged.
template <int HD, int NTOK, int NTHR>
__device__ __forceinline__ void load_kv_tile_f8(const AttnParams& p, int b, int g, int t0, int t_lim,
                                                uint8_t* sk, uint8_t* sv) {
  load_tile<HD, NTOK, NTHR, uint8_t, HD>(p, b, g, t0, t_lim, p.kc8, p.vc8, sk, sv);
}

// e4m3 staging tiles [NTOK][HD] -> 16-bit tiles [NTOK][HD + 8] (F16: f16, else bf16), exactly
// (kv_fp8.cuh); the caller syncs the block before (the staging landed, the 16-bit tiles are free)
// and after.
template <int HD, int NTOK, int NTHR, bool F16>
__device__ __forceinline__ void convert_kv_tile(const uint8_t* sk8, const uint8_t* sv8, __nv_bfloat16* sk,
                                                __nv_bfloat16* sv) {
  constexpr int LD = HD + 8, CH = HD / 8;
  for (int i = threadIdx.x; i < NTOK * CH; i += NTHR) {
    const int r = i / CH, c = i % CH;
    const uint2 k8 = *reinterpret_cast<const uint2*>(sk8 + r * HD + c * 8);
    const uint2 v8 = *reinterpret_cast<const uint2*>(sv8 + r * HD + c * 8);
    *reinterpret_cast<uint4*>(sk + r * LD + c * 8) = F16 ? kvfp8::to_f16x8(k8) : kvfp8::to_bf16x8(k8);
    *reinterpret_cast<uint4*>(sv + r * LD + c * 8) = F16 ? kvfp8::to_f16x8(v8) : kvfp8::to_bf16x8(v8);
  }
}

// The decode kernel's MMA operand type: bf16, or f16 over an FP8 cache (its tiles convert to f16
// in one instruction per pair; q and p are rounded to f16 then: q of the usual magnitudes and
// p in [0, 1] lose nothing to f16's range, and gain 3 mantissa bits; a q element past f16's
// range is clamped to +-65504 rather than becoming inf, so its row's scores stay finite).
__device__ __forceinline__ float clamp_f16(float x) { return fminf(fmaxf(x, -65504.0f), 65504.0f); }
template <bool F16>
__device__ __forceinline__ void mma_kv(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (F16) mma_f16(c, a, b0, b1);
  else mma_bf16(c, a, b0, b1);
}
template <bool F16>
__device__ __forceinline__ uint32_t pack_kv(float lo, float hi) {
  if constexpr (F16) return pack_f16(lo, hi);
  else return pack_bf16(lo, hi);
}

// ---- split-KV flash-decoding kernel (tensor cores) -------------------------------------------
// grid: x = KV split, y = kv head * row chunks + chunk, z = sequence (z == B: padding rows).
// A block owns up to kDRows packed rows (query i, head-in-group j -> row i*G + j) of one KV head
// and the split's token range [split * split_len, +split_len) clipped to the causal range. K/V
// stream through a kDStages-deep cp.async ring of kDTile-token tiles. The rows form RT m16 tiles
// (1, 2 or 4); each m16 tile is served by 4/RT warps that take interleaved 16-token slices of
// every KV tile, each keeping its own online softmax; the warps of an m16 tile are merged
// through smem at the end. One split: normalised bf16 out; several: fp32 partials (o unnormalised,
// m in the log2 domain, l) merged by attn_merge_kernel.
// Uniform mode (UNI, p.uniform: SplitKvOptions::uniform, the deterministic mode): every block is
// one m16 tile (16 rows) served by 4 warps, and splits are fixed token ranges of split_len from
// token 0, so a row's arithmetic is fixed by its own position: its tokens [0, pos] are cut into
// the same splits, 64-token tiles and 16-token warp slices whatever the call, the tokens a block
// walks past a row's position (its other rows' causal ranges, a longer kv_len) are masked to
// exact no-ops (p = 0, alpha = 1), and its splits fold in order through one running merge
// (uni_fold) -- inside the block (split_loop) or in attn_merge_kernel -- where an empty split is
// a no-op too. So a row's output is bit-identical whatever its chunk's length, the batch around
// it, or whether it is a decode or a prefill row.
// F8: e4m3 caches staged in a kDStages ring and converted into one f16 tile per KV tile (two
// block syncs per tile; load_kv_tile_f8), the MMAs in f16; k's scale is in scale_log2, v's in
// v_out. H100 (bench --attention-lab, 2026-12-06): FP8 reads at 59% of copy at batch 64 x 1k and
// 72% at 64 x 8k where bf16 reads at 88-90% and 96-100%; a 4-stage e4m3 ring (1.5x the bytes in
// flight, still two blocks per SM) timed the same (75.5 vs 75.2 us at 64 x 1k), so the
// conversion pass and its syncs, not the loads, set the pace: converting in registers at
// fragment load (K: 2-byte loads from padded staging rows; V: byte gathers, no 8-bit ldmatrix
// transpose on sm_90) is the next thing to try.
constexpr int kDTile = 64;
constexpr int kDStages = 3;
constexpr int kDThreads = 128;
constexpr int kDRows = 64;
// Uniform (deterministic) mode: split length in tiles (1024 tokens). A batch-1 decode at 32k then
// runs 32 splits per KV head, about one wave of blocks on an H100/H200.
constexpr int kUniformSplitTiles = 16;

// Split length (tokens) of sequence b's KV range. Batch-invariant mode (split_target > 0): from
// the sequence's own kv_len alone — tiles per split = max(min_tiles, ceil(tiles / target)), so a
// sequence is cut the same way whatever else is in the batch (the merge then sums the same
// partials in the same order); at most min(target, ceil(tiles / min_tiles)) splits, which the
// host's grid covers for every kv_len <= max_kv_len. Otherwise the host's split_len.
__device__ __forceinline__ int seq_split_len(const AttnParams& p, int kv_len) {
  if (p.split_target <= 0) return p.split_len;
  const int tiles = max(1, (kv_len + kDTile - 1) / kDTile);
  return max(p.split_min_tiles, (tiles + p.split_target - 1) / p.split_target) * kDTile;
}

// Where sequence b's splits start: token 0, or with a sliding window the lowest key its first
// query reads (pos - window + 1), rounded down to a tile -- in uniform mode to a split, so the
// split boundaries stay the fixed ones from token 0 and a split below a row's window is an
// exact no-op wherever the cut falls. From the sequence's own kv_len / q_len: the decode and
// merge kernels agree on it. Split s of b covers [base + s * split_len, +split_len), the split
// length sized (seq_split_len) from kv_len - base.
__device__ __forceinline__ int seq_kv_base(const AttnParams& p, int kv_len, int q_len) {
  if (p.window <= 0) return 0;
  const int unit = p.uniform ? p.split_len : kDTile;
  return max(0, kv_len - q_len - p.window + 1) / unit * unit;
}

// Uniform mode's fixed-split merge (attention_v2 "uniform", SplitKvOptions::uniform): a row's
// splits s = 0, 1, ... (fixed token ranges [s * split_len, +split_len)) fold into a running
// (M, L, O) in that order, whether one block walks the splits (split_loop) or each split is its
// own block and attn_merge_kernel folds their partials: the same operations on the same values,
// so the same bits. Rounded explicitly (_rn: no FMA contraction that could differ between the two
// kernels); an empty split (m = -inf, l = 0, o = 0) is an exact no-op.
__device__ __forceinline__ void uni_weights(float m_run, float m_s, float& m_new, float& a, float& b) {
  m_new = fmaxf(m_run, m_s);
  a = m_run == -INFINITY ? 0.0f : fast_exp2(m_run - m_new);
  b = m_s == -INFINITY ? 0.0f : fast_exp2(m_s - m_new);
}
__device__ __forceinline__ float uni_fold(float x_run, float a, float x_s, float b) {
  return __fadd_rn(__fmul_rn(x_run, a), __fmul_rn(x_s, b));
}
__device__ __forceinline__ float uni_out(float o, float l, float v_out) {
  return l > 0.0f ? __fmul_rn(__fdiv_rn(o, l), v_out) : 0.0f;
}

// bf16 tiles of the compute: the ring's stages (bf16 caches) or the one converted tile (F8).
template <bool F8>
constexpr int dec_bf16_stages() {
  return F8 ? 1 : kDStages;
}

template <int HD, bool F8 = false>
constexpr size_t dec_smem() {
  constexpr size_t pipe = size_t(dec_bf16_stages<F8>()) * 2 * kDTile * (HD + 8) * sizeof(__nv_bfloat16) +
                          (F8 ? size_t(kDStages) * 2 * kDTile * HD : 0);
  constexpr size_t comb = sizeof(float) * (size_t(4) * 16 * (HD + 4) + 2 * 4 * 16 + 2 * kDRows);
  return pipe > comb ? pipe : comb;
}

// UNI: uniform mode (p.uniform; 16 rows per block, fixed split_len, always partials or the
// running merge, never the per-grid single-split shortcut); a separate instantiation, so the
// default kernel is compiled as before.
template <int HD, bool F8, bool UNI = false>
__global__ void __launch_bounds__(kDThreads, 2) attn_decode_kernel(AttnParams p, int chunks) {
  constexpr int LD = HD + 8, NB = dec_bf16_stages<F8>();
  TS_DYN_SMEM(smraw);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smraw);  // [NB][kDTile][LD]
  __nv_bfloat16* sV = sK + NB * kDTile * LD;                     // [NB][kDTile][LD]
  uint8_t* sK8 = reinterpret_cast<uint8_t*>(sV + NB * kDTile * LD);  // F8: [stages][kDTile][HD]
  uint8_t* sV8 = sK8 + kDStages * kDTile * HD;                        // F8: [stages][kDTile][HD]
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  // Uniform mode with split_loop: this block walks its splits itself, from the first that holds
  // a key of its rows to s_last (the grid has one); otherwise it computes the grid's split. The
  // split_loop grid puts (kv head, row chunk) on x: a long chunk's nkv x rows/16 blocks exceed
  // grid.y's 65535 (16k rows at G = 8, nkv = 8).
  const bool loop = UNI && p.split_loop;
  const int gc = loop ? int(blockIdx.x) : int(blockIdx.y);
  const int b = blockIdx.z, g = gc / chunks, chunk = gc % chunks;
  const int split = loop ? 0 : int(blockIdx.x);
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int d_rows = p.d_rows > 0 ? p.d_rows : kDRows;
  const int rows_total = q_len * p.G, r0 = chunk * d_rows;
  const int kv_base = seq_kv_base(p, kv_len, q_len);
  const int split_len = seq_split_len(p, kv_len - kv_base);
  const int nrows = min(d_rows, max(rows_total - r0, 1));
  const int off = kv_len - q_len;                       // position of query 0
  const int min_pos = off + r0 / p.G;                   // first row's position
  const int max_pos = off + (r0 + nrows - 1) / p.G;     // last row's position
  // A window: no row of the block reads below w_lo (its first row's lowest key), and keys
  // below w_hi (its last row's lowest) need the mask.
  const int w_lo = p.window > 0 ? max(0, min_pos - p.window + 1) : 0;
  const int w_hi = p.window > 0 ? max_pos - p.window + 1 : INT_MIN;
  int cur = loop ? (w_lo - kv_base) / split_len : split;
  int t_begin = kv_base + cur * split_len;
  // Splits at or past the real length write nothing (the merge reads only live splits); split 0
  // always runs, so a (degenerate) empty sequence still gets its zero rows.
  if (r0 >= rows_total || (split > 0 && t_begin >= kv_len)) return;
  const int t_stop = min(kv_len, max_pos + 1);          // no row of the block reads past it
  const int s_last = loop ? max(t_stop - 1 - kv_base, 0) / split_len : cur;
  // The split's tiles from the one holding w_lo (the tiles below it are masked for every row).
  int t_first = max(t_begin, w_lo / kDTile * kDTile);
  int t_end = min(t_begin + split_len, t_stop);
  int n_tiles = t_end > t_first ? (t_end - t_first + kDTile - 1) / kDTile : 0;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int RT = nrows <= 16 ? 1 : nrows <= 32 ? 2 : 4;  // m16 tiles
  const int WPM = 4 / RT;                                // warps per m16 tile
  const int mt = warp / WPM, sub = warp % WPM;
  // Per-lane ldmatrix row addresses (bytes): K x4 = {tok 0-7, tok 8-15} x {dims +0, +8},
  // V x4.trans = {dims +0, +8} x {tok 0-7, tok 8-15}.
  const uint32_t k_lane = smem_u32(sK) + ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = smem_u32(sV) + ((((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;

  // Starts the split's tile `t` into ring stage `st` (FP8: its e4m3 staging ring).
  auto load_stage = [&](int t, int st) {
    if constexpr (F8)
      load_kv_tile_f8<HD, kDTile, kDThreads>(p, b, g, t_first + t * kDTile, t_end, sK8 + st * kDTile * HD,
                                             sV8 + st * kDTile * HD);
    else
      load_kv_tile<HD, kDTile, kDThreads>(p, b, g, t_first + t * kDTile, t_end, sK + st * kDTile * LD,
                                          sV + st * kDTile * LD);
  };
  // Prologue: start the first kDStages-1 tiles of the split.
  auto prologue = [&]() {
#pragma unroll
    for (int s = 0; s < kDStages - 1; ++s) {
      if (s < n_tiles) load_stage(s, s);
      cp_async_commit();
    }
  };
  prologue();

  // This thread's rows (mt*16 + gq, + 8) and Q fragments (registers for the whole split).
  int pos[2];
  uint32_t qf[HD / 16][4];
  {
    int64_t qoff[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = mt * 16 + gq + 8 * i;
      valid[i] = r < nrows;
      const int pr = r0 + (valid[i] ? r : 0), qi = pr / p.G, h = g * p.G + pr % p.G;
      pos[i] = valid[i] ? off + qi : INT_MAX;  // padding rows: unmasked, never written
      qoff[i] = int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1;
    }
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = j & 1, col = kk * 16 + 2 * tq + (j >> 1) * 8;
        if constexpr (F8)
          qf[kk][j] = valid[i] ? pack_f16(clamp_f16(__bfloat162float(p.q[qoff[i] + col])),
                                          clamp_f16(__bfloat162float(p.q[qoff[i] + col + 1])))
                               : 0u;
        else
          qf[kk][j] = valid[i] ? pack_bf16(p.q[qoff[i] + col], p.q[qoff[i] + col + 1]) : 0u;
      }
  }

  // split_loop: the running (M, L, O) of this thread's output elements i = tid + j * kDThreads
  // (j < HD / 8: 16 rows x HD over the block's threads), folded split by split (uni_fold).
  constexpr int NJ = UNI ? HD / 8 : 1;
  float run_o[NJ], run_m[NJ], run_l[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) run_o[j] = 0.0f, run_m[j] = -INFINITY, run_l[j] = 0.0f;

  for (;;) {  // once, or (split_loop) once per split
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kDStages - 2>();
    __syncthreads();  // tile `it` visible to all; tile it-1's stage free for reuse
    {
      const int nt = it + kDStages - 1;
      if (nt < n_tiles) load_stage(nt, nt % kDStages);
      cp_async_commit();
    }
    if constexpr (F8) {  // tile `it` landed (staging); the bf16 tile is free (the sync above)
      const int s8 = it % kDStages;
      convert_kv_tile<HD, kDTile, kDThreads, true>(sK8 + s8 * kDTile * HD, sV8 + s8 * kDTile * HD, sK, sV);
      __syncthreads();
    }
    const int st = F8 ? 0 : it % kDStages;
    const int t0 = t_first + it * kDTile;
    for (int j = sub; j < kDTile / 16; j += WPM) {
      const int tb = t0 + j * 16;
      if (tb >= t_end) break;
      const uint32_t kb = k_lane + (st * kDTile + j * 16) * LD * 2;
      const uint32_t vb = v_lane + (st * kDTile + j * 16) * LD * 2;
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t bk[4];
        ldsm_x4(bk, kb + kk * 32);
        mma_kv<F8>(s[0], qf[kk], bk[0], bk[1]);
        mma_kv<F8>(s[1], qf[kk], bk[2], bk[3]);
      }
      const bool need_mask = tb + 15 >= t_end || tb + 15 > min_pos || tb < w_hi;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[nt][e] * p.scale_log2;
          if (need_mask) {
            const int tok = tb + nt * 8 + 2 * tq + (e & 1);
            if (tok >= t_end || tok > pos[e >> 1] || (p.window > 0 && tok + p.window <= pos[e >> 1])) v = -INFINITY;
          }
          s[nt][e] = v;
        }
      float ref[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx);
        ref[i] = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(m[i] - ref[i]);
        m[i] = m_new;
        l[i] *= alpha;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
          o[dt][2 * i] *= alpha;
          o[dt][2 * i + 1] *= alpha;
        }
      }
      uint32_t pf[4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float p0 = fast_exp2(s[nt][0] - ref[0]), p1 = fast_exp2(s[nt][1] - ref[0]);
        const float p2 = fast_exp2(s[nt][2] - ref[1]), p3 = fast_exp2(s[nt][3] - ref[1]);
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pf[nt * 2 + 0] = pack_kv<F8>(p0, p1);
        pf[nt * 2 + 1] = pack_kv<F8>(p2, p3);
      }
#pragma unroll
      for (int dt2 = 0; dt2 < HD / 16; ++dt2) {
        uint32_t bv[4];
        ldsm_x4_t(bv, vb + dt2 * 32);
        mma_kv<F8>(o[2 * dt2], pf, bv[0], bv[1]);
        mma_kv<F8>(o[2 * dt2 + 1], pf, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // all warps done with the ring: reuse it for the cross-warp merge
  if (cur == s_last) pdl_trigger();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  float* co = reinterpret_cast<float*>(smraw);  // [4 warps][16][HD + 4]
  float* cm = co + 4 * 16 * (HD + 4);           // [4][16]
  float* cl = cm + 4 * 16;                      // [4][16]
  float* rowM = cl + 4 * 16;                    // [kDRows]
  float* rowL = rowM + kDRows;                  // [kDRows]
  if (tq == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      cm[warp * 16 + gq + 8 * i] = m[i];
      cl[warp * 16 + gq + 8 * i] = l[i];
    }
  }
  __syncthreads();
  // One split: the normalised output straight away. Batch-invariant mode decides per sequence
  // (its own split count), so a sequence rounds the same whatever the grid is.
  const bool single = UNI ? false : p.split_target > 0 ? kv_len - kv_base <= split_len : p.num_splits == 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rr = gq + 8 * i;
    float M = -INFINITY;
    for (int k = 0; k < WPM; ++k) M = fmaxf(M, cm[(mt * WPM + k) * 16 + rr]);
    float L = 0.0f;
    for (int k = 0; k < WPM; ++k) {
      const float mk = cm[(mt * WPM + k) * 16 + rr];
      if (mk != -INFINITY) L += fast_exp2(mk - M) * cl[(mt * WPM + k) * 16 + rr];
    }
    float w = m[i] == -INFINITY ? 0.0f : fast_exp2(m[i] - M);
    if (single) w = L > 0.0f ? w / L * p.v_out : 0.0f;
    float* dst = co + (warp * 16 + rr) * (HD + 4);
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8 + 2 * tq) = make_float2(o[dt][2 * i] * w, o[dt][2 * i + 1] * w);
    if (sub == 0 && tq == 0) {
      rowM[mt * 16 + rr] = M;
      rowL[mt * 16 + rr] = L;
    }
  }
  __syncthreads();
  // Element (r, d) of this split's unnormalised output: its warps' weighted o, summed in warp
  // order. One expression for the partial a split block writes and the value split_loop folds, so
  // the two uniform-mode schedules agree bit for bit.
  auto split_out = [&](int r, int d) {
    const int rm = r >> 4, rr = r & 15;
    float acc = 0.0f;
    for (int k = 0; k < WPM; ++k) acc += co[((rm * WPM + k) * 16 + rr) * (HD + 4) + d];
    return acc;
  };
  if constexpr (UNI) {
    if (loop) {
      // Fold this split's (rowM, rowL, acc) -- the partial a split block would write -- into the
      // running merge, as attn_merge_kernel does in uniform mode.
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int i = tid + j * kDThreads;
        if (i < nrows * HD) {
          const int r = i / HD, d = i % HD;
          const float acc = split_out(r, d);
          float mn, wa, wb;
          uni_weights(run_m[j], rowM[r], mn, wa, wb);
          run_o[j] = uni_fold(run_o[j], wa, acc, wb);
          run_l[j] = uni_fold(run_l[j], wa, rowL[r], wb);
          run_m[j] = mn;
        }
      }
      if (cur == s_last) break;
      __syncthreads();  // co / rowM / rowL read: the next split's loads reuse the ring
      ++cur;
      t_begin = kv_base + cur * split_len;
      t_first = max(t_begin, w_lo / kDTile * kDTile);
      t_end = min(t_begin + split_len, t_stop);
      n_tiles = t_end > t_first ? (t_end - t_first + kDTile - 1) / kDTile : 0;
      prologue();
      continue;
    }
  }
  for (int i = tid; i < nrows * HD; i += kDThreads) {
    const int r = i / HD, d = i % HD;
    const float acc = split_out(r, d);
    const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr % p.G;
    const int64_t tok = q0 + qi;
    if (single) {
      p.out[tok * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(acc);
    } else {
      const int64_t row = (int64_t(split) * p.T + tok) * p.nh + h;
      p.part_o[row * HD + d] = acc;
      if (d == 0) {
        p.part_ml[row * 2] = rowM[r];
        p.part_ml[row * 2 + 1] = rowL[r];
      }
    }
  }
  break;
  }  // splits
  if constexpr (UNI) {
    if (loop) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int i = tid + j * kDThreads;
        if (i < nrows * HD) {
          const int r = i / HD, d = i % HD, pr = r0 + r, qi = pr / p.G, h = g * p.G + pr % p.G;
          p.out[int64_t(q0 + qi) * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16(uni_out(run_o[j], run_l[j], p.v_out));
        }
      }
    }
  }
}

// Merges the live splits of each (query, head) row (hd_v % 4 == 0, hd_v <= 256). A row gets
// tpr = nc * ng threads (nc = hd_v / 4 float4 columns, ng = p.merge_groups split groups, both
// powers of two; tpr <= kMThreads): group k sums splits k, k + ng, ... (independent loads, so
// the latency chain is only ~n_live / ng deep), then the groups are reduced through smem.
// A block holds kMThreads / tpr rows. The host sizes ng from the split count (~8 splits per
// thread), so many-row / few-split merges pack several rows per block and one-row / many-split
// merges spread a row over the block.
// grid: x = ceil(max_q_len * nh / rows per block), y = sequence; kMThreads threads.
constexpr int kMThreads = 256;
__global__ void __launch_bounds__(kMThreads) attn_merge_kernel(AttnParams p) {
  __shared__ float4 red[kMThreads];
  __shared__ float redl[kMThreads];
  __shared__ float redm[kMThreads / 32];
  pdl_wait();
  const int b = blockIdx.y, tid = threadIdx.x;
  const int nc = p.hd_v / 4, ng = p.merge_groups, tpr = nc * ng, rpb = kMThreads / tpr;
  const int lr = tid / tpr, t2 = tid % tpr, c = t2 % nc, grp = t2 / nc;
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int row = blockIdx.x * rpb + lr;
  const bool live = lr < rpb && row < q_len * p.nh;
  const int qi = live ? row / p.nh : 0, h = live ? row % p.nh : 0;
  const int64_t tok = q0 + qi;
  const int kv_base = seq_kv_base(p, kv_len, q_len);
  const int kv_span = kv_len - kv_base;  // the splits' range (all of kv_len without a window)
  const int split_len = seq_split_len(p, kv_span);
  // Batch-invariant mode: a one-split sequence was written by the decode kernel (uniform over
  // the block: one sequence per blockIdx.y).
  if (p.split_target > 0 && kv_span <= split_len) return;
  if (p.uniform) {
    // Uniform mode (merge_groups 1): the row's live splits folded in order, exactly as a
    // split_loop block folds them (uni_fold); no block-wide reduction, so no sync to meet.
    pdl_trigger();
    if (!live) return;
    const int n = min(p.num_splits, (kv_span + split_len - 1) / split_len);
    const int64_t stride1 = int64_t(p.T) * p.nh, base1 = tok * p.nh + h;
    float M = -INFINITY, L = 0.0f, O[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < n; ++s) {
      const int64_t r = s * stride1 + base1;
      const float ms = p.part_ml[r * 2], ls = p.part_ml[r * 2 + 1];
      float mn, wa, wb;
      uni_weights(M, ms, mn, wa, wb);
#pragma unroll
      for (int e = 0; e < 4; ++e) O[e] = uni_fold(O[e], wa, p.part_o[r * p.hd_v + c * 4 + e], wb);
      L = uni_fold(L, wa, ls, wb);
      M = mn;
    }
    __nv_bfloat16* orow = p.out + tok * p.o_s0 + int64_t(h) * p.o_s1 + c * 4;
#pragma unroll
    for (int e = 0; e < 4; ++e) orow[e] = __float2bfloat16(uni_out(O[e], L, p.v_out));
    return;
  }
  const int n_live = live ? min(p.num_splits, (kv_span + split_len - 1) / split_len) : 0;
  const int64_t stride = int64_t(p.T) * p.nh;  // rows per split
  const int64_t base = tok * p.nh + h;
  // Row max of m over the live splits: strided over the row's threads, then reduced over them
  // (xor offsets below tpr stay inside the row's aligned lane group; rows wider than a warp
  // finish through smem).
  float M = -INFINITY;
  for (int s = t2; s < n_live; s += tpr) M = fmaxf(M, p.part_ml[(s * stride + base) * 2]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    if (o < tpr) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (tpr > 32) {
    if ((tid & 31) == 0) redm[tid >> 5] = M;
    __syncthreads();
    const int w0 = (lr * tpr) >> 5;
    M = redm[w0];
    for (int w = 1; w < tpr / 32; ++w) M = fmaxf(M, redm[w0 + w]);
  }
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float L = 0.0f;
#pragma unroll 4
  for (int s = grp; s < n_live; s += ng) {
    const int64_t r = s * stride + base;
    const float2 ml = *reinterpret_cast<const float2*>(p.part_ml + r * 2);
    const float4 v = *reinterpret_cast<const float4*>(p.part_o + r * p.hd_v + c * 4);
    const float w = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - M);
    L += w * ml.y;
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  if (ng > 1) {
    red[tid] = acc;
    redl[tid] = L;
    __syncthreads();
    if (grp == 0) {
      for (int k = 1; k < ng; ++k) {
        const float4 v = red[tid + k * nc];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
        L += redl[tid + k * nc];
      }
    }
  }
  pdl_trigger();
  if (!live || grp != 0) return;
  const float inv = L > 0.0f ? p.v_out / L : 0.0f;
  __nv_bfloat16* orow = p.out + tok * p.o_s0 + int64_t(h) * p.o_s1 + c * 4;
  if (p.o_vec2) {
    reinterpret_cast<__nv_bfloat162*>(orow)[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    reinterpret_cast<__nv_bfloat162*>(orow)[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  } else {
    orow[0] = __float2bfloat16(acc.x * inv);
    orow[1] = __float2bfloat16(acc.y * inv);
    orow[2] = __float2bfloat16(acc.z * inv);
    orow[3] = __float2bfloat16(acc.w * inv);
  }
}

// ---- FA2-style prefill kernel (tensor cores) ---------------------------------------------------
// grid: x = kv head, y = packed-row chunk of BM = 64*MW rows (reversed: the heaviest causal
// chunks of every head are scheduled first), z = sequence (z == B: padding rows). 4 warps, each owning 16*MW rows; Q tile in smem
// (ldmatrix per k-step), K/V 64-token tiles double-buffered with cp.async; S computed in NS-token
// slices (exp2 online softmax with the log2e-prescaled scale); tiles past the chunk's last
// position are never loaded, warps whose rows end before a tile skip it, and the causal mask is
// applied only on tiles that cross a warp's first position.
constexpr int kPThreads = 128;
constexpr int kPBN = 64;

// F8: K/V staged as e4m3 ([2][BN][HD] each) and converted into one bf16 tile pair per KV tile.
template <int HD, int MW, bool F8 = false>
constexpr size_t prefill_smem() {
  return (size_t(64) * MW + (F8 ? 2 : 4) * kPBN) * (HD + 8) * sizeof(__nv_bfloat16) + 64 * MW * sizeof(int) +
         (F8 ? size_t(4) * kPBN * HD : 0);
}

template <int HD, int MW, int NS, bool F8>
__global__ void __launch_bounds__(kPThreads) attn_prefill_kernel(AttnParams p) {
  constexpr int LD = HD + 8, CH = HD / 8, BM = 64 * MW, BN = kPBN, NB = F8 ? 1 : 2;
  static_assert(BN % NS == 0 && NS % 16 == 0, "bad NS");
  TS_DYN_SMEM(smraw);
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smraw);  // [BM][LD]
  __nv_bfloat16* sK = sQ + BM * LD;                              // [NB][BN][LD]
  __nv_bfloat16* sV = sK + NB * BN * LD;                         // [NB][BN][LD]
  int* spos = reinterpret_cast<int*>(sV + NB * BN * LD);         // [BM]
  uint8_t* sK8 = reinterpret_cast<uint8_t*>(spos + BM);          // F8: [2][BN][HD]
  uint8_t* sV8 = sK8 + 2 * BN * HD;                              // F8: [2][BN][HD]
  pdl_wait();
  if (int(blockIdx.z) == p.B) {
    zero_padding_rows(p);
    return;
  }
  const int b = blockIdx.z, g = blockIdx.x;
  const int chunk = int(gridDim.y) - 1 - int(blockIdx.y);
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv_len[b];
  const int rows_total = q_len * p.G, r0 = chunk * BM;
  if (r0 >= rows_total) return;
  const int nrows = min(BM, rows_total - r0);
  const int off = kv_len - q_len;
  const int t_end = min(kv_len, off + (r0 + nrows - 1) / p.G + 1);
  const int n_tiles = t_end > 0 ? (t_end + BN - 1) / BN : 0;
  // A window: the tiles below the block's first row's lowest key are masked for every row.
  const int j_first = p.window > 0 ? max(0, off + r0 / p.G - p.window + 1) / BN : 0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;

  // Q tile -> smem (zero rows past nrows), joined to the first K/V commit group.
  for (int i = tid; i < BM * CH; i += kPThreads) {
    const int r = i / CH, c = i % CH;
    __nv_bfloat16* dst = sQ + r * LD + c * 8;
    if (r < nrows) {
      const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr - qi * p.G;
      const __nv_bfloat16* src = p.q + int64_t(q0 + qi) * p.q_s0 + int64_t(h) * p.q_s1 + c * 8;
      if (p.q_vec) {
        cp_async16(dst, src);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = src[e];
      }
    } else {
      zero16(dst);
    }
  }
  // Starts KV tile `j` into double-buffer stage `st` (FP8: its e4m3 staging pair).
  auto load_stage = [&](int j, int st) {
    if constexpr (F8) load_kv_tile_f8<HD, BN, kPThreads>(p, b, g, j * BN, t_end, sK8 + st * BN * HD, sV8 + st * BN * HD);
    else load_kv_tile<HD, BN, kPThreads>(p, b, g, j * BN, t_end, sK + st * BN * LD, sV + st * BN * LD);
  };
  if (j_first < n_tiles) load_stage(j_first, j_first & 1);
  cp_async_commit();

  const int wrow0 = warp * 16 * MW;                 // warp's first row in the chunk
  // Per-lane ldmatrix row addresses (bytes): Q x4 = {rows 0-7, 8-15} x {k +0, +8};
  // K x4 = {tok 0-7, tok 8-15} x {dims +0, +8}; V x4.trans = {dims +0, +8} x {tok 0-7, 8-15}.
  const uint32_t q_lane = smem_u32(sQ) + ((wrow0 + (lane & 15)) * LD + (lane >> 4) * 8) * 2;
  const uint32_t k_lane = smem_u32(sK) + ((((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = smem_u32(sV) + ((((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2;
  const bool warp_live = wrow0 < nrows;
  const int w_min_pos = off + (r0 + wrow0) / p.G;
  const int w_max_pos = warp_live ? off + (r0 + min(wrow0 + 16 * MW, nrows) - 1) / p.G : -1;
  // Window: keys below w_max_pos - window + 1 are masked for some row of the warp; slices that
  // end below w_min_pos - window + 1, for all of them (skipped).
  const int w_win_hi = p.window > 0 ? w_max_pos - p.window + 1 : INT_MIN;
  // Row positions live in smem (read only on tiles that need the causal mask: saves registers).
  for (int r = tid; r < BM; r += kPThreads)
    spos[r] = r < nrows ? off + (r0 + r) / p.G : INT_MAX;  // padding rows: never written

  float o[MW][HD / 8][4];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.0f;
  float m[MW][2], l[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;

  for (int j = j_first; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) load_stage(j + 1, (j + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (F8) {  // tile j landed (staging j & 1); the bf16 tile is free (end-of-tile sync)
      convert_kv_tile<HD, BN, kPThreads, false>(sK8 + (j & 1) * BN * HD, sV8 + (j & 1) * BN * HD, sK, sV);
      __syncthreads();
    }
    const int stg = F8 ? 0 : j & 1, t0 = j * BN;
    if (t0 <= w_max_pos) {
#pragma unroll
      for (int hf = 0; hf < BN / NS; ++hf) {
        const int tb = t0 + hf * NS;
        if (tb > w_max_pos) break;
        if (p.window > 0 && tb + NS - 1 + p.window <= w_min_pos) continue;
        const uint32_t kb = k_lane + (stg * BN + hf * NS) * LD * 2;
        const uint32_t vb = v_lane + (stg * BN + hf * NS) * LD * 2;
        float s[MW][NS / 8][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
          for (int nt = 0; nt < NS / 8; ++nt) s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          uint32_t a[MW][4];
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
            ldsm_x4(a[mi], q_lane + (mi * 16 * LD + kk * 16) * 2);
#pragma unroll
          for (int n2 = 0; n2 < NS / 16; ++n2) {
            uint32_t bk[4];
            ldsm_x4(bk, kb + (n2 * 16 * LD + kk * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
              mma_bf16(s[mi][2 * n2], a[mi], bk[0], bk[1]);
              mma_bf16(s[mi][2 * n2 + 1], a[mi], bk[2], bk[3]);
            }
          }
        }
        // Scores stay raw (m too); scale_log2 > 0 folds into the exponent: p = 2^(s*c - m*c).
        if (tb + NS - 1 > w_min_pos || tb < w_win_hi) {
#pragma unroll
          for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NS / 8; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int tok = tb + nt * 8 + 2 * tq + (e & 1), rp = spos[wrow0 + mi * 16 + gq + 8 * (e >> 1)];
                if (tok > rp || (p.window > 0 && tok + p.window <= rp)) s[mi][nt][e] = -INFINITY;
              }
        }
        const float sl2 = p.scale_log2;
        uint32_t pf[MW][NS / 16][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          float ref[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NS / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mi][nt][2 * i], s[mi][nt][2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[mi][i], mx);
            ref[i] = m_new == -INFINITY ? 0.0f : m_new * sl2;
            const float alpha = fast_exp2(fmaf(m[mi][i], sl2, -ref[i]));
            m[mi][i] = m_new;
            l[mi][i] *= alpha;
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
              o[mi][dt][2 * i] *= alpha;
              o[mi][dt][2 * i + 1] *= alpha;
            }
          }
#pragma unroll
          for (int nt = 0; nt < NS / 8; ++nt) {
            const float p0 = fast_exp2(fmaf(s[mi][nt][0], sl2, -ref[0]));
            const float p1 = fast_exp2(fmaf(s[mi][nt][1], sl2, -ref[0]));
            const float p2 = fast_exp2(fmaf(s[mi][nt][2], sl2, -ref[1]));
            const float p3 = fast_exp2(fmaf(s[mi][nt][3], sl2, -ref[1]));
            l[mi][0] += p0 + p1;
            l[mi][1] += p2 + p3;
            pf[mi][nt >> 1][(nt & 1) * 2 + 0] = pack_bf16(p0, p1);
            pf[mi][nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p2, p3);
          }
        }
#pragma unroll
        for (int kc = 0; kc < NS / 16; ++kc)
#pragma unroll
          for (int dt2 = 0; dt2 < HD / 16; ++dt2) {
            uint32_t bv[4];
            ldsm_x4_t(bv, vb + (kc * 16 * LD + dt2 * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
              mma_bf16(o[mi][2 * dt2], pf[mi][kc], bv[0], bv[1]);
              mma_bf16(o[mi][2 * dt2 + 1], pf[mi][kc], bv[2], bv[3]);
            }
          }
      }
    }
    __syncthreads();  // stage j&1 is refilled by the next iteration's prefetch
  }
  pdl_trigger();
#pragma unroll
  for (int mi = 0; mi < MW; ++mi)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[mi][i];
      li += __shfl_xor_sync(0xffffffffu, li, 1);
      li += __shfl_xor_sync(0xffffffffu, li, 2);
      const int r = wrow0 + mi * 16 + gq + 8 * i;
      if (r >= nrows) continue;
      const int pr = r0 + r, qi = pr / p.G, h = g * p.G + pr - qi * p.G;
      __nv_bfloat16* orow = p.out + int64_t(q0 + qi) * p.o_s0 + int64_t(h) * p.o_s1;
      const float inv = li > 0.0f ? p.v_out / li : 0.0f;
#pragma unroll
      for (int dt = 0; dt < HD / 8; ++dt) {
        const float v0 = o[mi][dt][2 * i] * inv, v1 = o[mi][dt][2 * i + 1] * inv;
        if (p.o_vec2) {
          *reinterpret_cast<__nv_bfloat162*>(orow + dt * 8 + 2 * tq) = __floats2bfloat162_rn(v0, v1);
        } else {
          orow[dt * 8 + 2 * tq] = __float2bfloat16(v0);
          orow[dt * 8 + 2 * tq + 1] = __float2bfloat16(v1);
        }
      }
    }
}

