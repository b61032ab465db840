// Decode attention lab: the v1 kernels (generic CUDA-core split-KV, v1 tensor-core) next to the
// v2 split-KV flash-decoding kernel (tensor cores, cp.async ring, GQA rows packed, merge kernel),
// auto and forced split counts, on decode and speculative-verify batches (q_len 1/4/8).
// Every variant is checked against the CPU reference (relative-norm error, OK/FAIL) and then
// timed as the median over back-to-back calls that rotate through copies of the KV cache
// totalling > 3x L2 (so K/V stream from HBM). Memory-bound: bytes = K+V actually read
// (every sequence's kv_len tokens, each KV head once) + q + out; GB/s and % of the measured
// device-to-device copy ceiling.
#include "attention_lab.cuh"

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  struct Cfg { int B, q, kv; int64_t nkv, G, hd; int bs; };
  const Cfg cfgs[] = {
      {1, 1, 1024, 8, 4, 128, 16},  {1, 1, 8192, 8, 4, 128, 16}, {1, 1, 32768, 8, 4, 128, 64},
      {8, 1, 4096, 8, 4, 128, 16},  {32, 1, 2048, 8, 4, 128, 16}, {64, 1, 1024, 8, 4, 128, 64},
      {16, 1, 4096, 2, 8, 64, 64},  {1, 1, 32768, 1, 8, 128, 64}, {4, 1, 1000, 4, 1, 16, 16},
      {128, 1, 2048, 8, 4, 128, 16}, {1, 1, 131072, 8, 8, 128, 64},
      // speculative verify: 4 and 8 query tokens per sequence
      {1, 4, 32768, 8, 4, 128, 64}, {16, 4, 4096, 8, 4, 128, 16}, {16, 8, 4096, 2, 8, 64, 64},
      {1, 8, 32768, 1, 8, 128, 64}, {64, 8, 2048, 8, 8, 128, 16}};
  for (const Cfg& f : cfgs) {
    lab::AttnCase c = lab::make_case(f.B, f.q, f.kv, f.nkv, f.G, f.hd, f.bs);
    lab::Rotation rot = lab::make_rotation(c);
    const float scale = 1.0f / std::sqrt(float(f.hd));
    const double bytes = 2.0 * double(c.kv_tokens) * double(f.nkv) * double(f.hd) * 2.0 +
                         2.0 * double(c.T) * double(c.nh) * double(f.hd) * 2.0;
    struct Variant { const char* name; int path, splits; };
    const Variant vs[] = {{"v1-generic-auto", 1, 0}, {"v1-generic-s32", 1, 32}, {"v1-tensorcore", 2, 0},
                          {"v2-split-auto", 3, 0},   {"v2-split-s1", 3, 1},     {"v2-split-s8", 3, 8},
                          {"v2-split-s32", 3, 32},   {"v2-split-s128", 3, 128}, {"v2-split-s512", 3, 512},
                          {"auto", 0, 0}};
    for (const Variant& v : vs) {
      const bool fast_hd = f.hd == 64 || f.hd == 128;
      if (v.path >= 2 && !fast_hd) continue;
      // The v1 kernels are 10-100x slower on long contexts: skip the hopeless ones.
      if (v.path == 1 && v.splits == 0 && c.kv_tokens * f.nkv * f.q > 4 * 32768 * 8) continue;
      if (v.path == 2 && f.B * f.q * f.nkv < 16) continue;
      ts::ops::KernelPolicy kp;
      kp.attn_path = v.path;
      kp.attn_splits = v.splits;
      const double e = (c.kv_tokens * c.nh * f.q <= int64_t(1) << 26) ? lab::check_case(c, scale, kp) : -1.0;
      const double us = lab::time_rot_us(c, rot, scale, 20, 2, kp);
      std::printf("decode B=%-3d q=%d kv=%-6d nkv=%ld G=%ld hd=%-3ld bs=%-2d %-16s err %.2e %-4s %9.2f us %6.0f GB/s (%5.1f%% of copy)\n",
                  f.B, f.q, f.kv, long(f.nkv), long(f.G), long(f.hd), f.bs, v.name, e,
                  e < 0 ? "n/a" : lab::verdict(e), us, bytes / (us * 1e3),
                  100.0 * bytes / (us * 1e3) / ceiling);
      std::fflush(stdout);
    }
  }
  return 0;
}
