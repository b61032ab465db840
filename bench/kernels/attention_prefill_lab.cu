// Prefill attention lab: v1 tensor-core kernel and the generic kernel next to the v2 FA2-style
// kernels (64-row blocks; 128-row blocks with 32- or 64-token score slices), causal, GQA, plus a
// chunked-prefill case (cached prefix). Each variant is checked against the CPU reference where
// that is affordable (relative-norm error, OK/FAIL), then timed (median of back-to-back calls).
// FLOP counting: causal, each head's query i (at position p_i) sees p_i + 1 keys; QK^T and PV
// each cost 2 * hd FLOPs per (query, key) pair: flops = 4 * hd * nh * sum_i (p_i + 1)
// (for q = kv = n this is 4 * hd * nh * n(n+1)/2 ~= 2 * 2 * n^2 * hd / 2 per head).
#include "attention_lab.cuh"

int main() {
  if (!lab::have_gpu()) return 0;
  lab::copy_ceiling_gbs();
  struct Cfg { int B, q, kv; int64_t nkv, G, hd; int bs; };
  const Cfg cfgs[] = {{1, 512, 512, 8, 4, 128, 16},    {1, 2048, 2048, 8, 4, 128, 16},
                      {1, 8192, 8192, 8, 4, 128, 64},  {4, 1024, 1024, 8, 4, 128, 16},
                      {1, 4096, 4096, 2, 8, 64, 64},   {1, 8192, 8192, 8, 8, 64, 64},
                      {1, 16384, 16384, 8, 4, 128, 64}, {1, 512, 4096, 8, 4, 128, 16},
                      {1, 2048, 10240, 8, 4, 128, 16},
                      {2, 300, 300, 4, 1, 16, 16}};
  for (const Cfg& f : cfgs) {
    lab::AttnCase c = lab::make_case(f.B, f.q, f.kv, f.nkv, f.G, f.hd, f.bs);
    lab::Rotation rot = lab::make_rotation(c, 0.0);  // compute-bound: two copies are plenty
    const float scale = 1.0f / std::sqrt(float(f.hd));
    const double pre = double(f.kv - f.q);  // cached prefix: query i at position pre + i
    const double pairs = double(f.q) * pre + double(f.q) * double(f.q + 1) / 2.0;
    const double flops = 4.0 * double(f.B) * double(c.nh) * double(f.hd) * pairs;
    struct Variant { const char* name; int path; };
    const Variant vs[] = {{"v1-tensorcore", 2}, {"v1-generic", 1}, {"v2-fa2-m64", 4},
                          {"v2-fa2-m128-n32", 5}, {"v2-fa2-m128-n64", 6}, {"auto", 0}};
    for (const Variant& v : vs) {
      const bool fast_hd = f.hd == 64 || f.hd == 128;
      if (v.path >= 2 && !fast_hd) continue;
      if (v.path == 1 && fast_hd && f.q > 2048) continue;  // minutes per call
      ts::ops::KernelPolicy kp;
      kp.attn_path = v.path;
      const double e = (pairs * f.B * c.nh <= 4.0 * 2048 * 2048 * 16) ? lab::check_case(c, scale, kp) : -1.0;
      const double us = lab::time_rot_us(c, rot, scale, 10, 1, kp);
      std::printf("prefill B=%d q=%-5d kv=%-5d nkv=%ld G=%ld hd=%-3ld bs=%-2d %-16s err %.2e %-4s %10.1f us %7.1f TFLOP/s\n",
                  f.B, f.q, f.kv, long(f.nkv), long(f.G), long(f.hd), f.bs, v.name, e,
                  e < 0 ? "n/a" : lab::verdict(e), us, flops / (us * 1e6));
      std::fflush(stdout);
    }
  }
  return 0;
}
