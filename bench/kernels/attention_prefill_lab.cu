// Prefill attention lab: tensor-core flash-attention kernel vs the generic kernel, causal,
// GQA. Compute-bound: TFLOP/s counting 4 * q * kv_visible * hd per head (QK^T and PV).
#include "attention_lab.cuh"

int main() {
  if (!lab::have_gpu()) return 0;
  lab::copy_ceiling_gbs();
  struct Cfg { int B, q; int64_t nkv, G, hd; int bs; };
  const Cfg cfgs[] = {{1, 512, 8, 4, 128, 16}, {1, 2048, 8, 4, 128, 16}, {1, 8192, 8, 4, 128, 64},
                      {4, 1024, 8, 4, 128, 16}, {1, 4096, 2, 8, 64, 64},  {2, 300, 4, 1, 16, 16}};
  for (const Cfg& f : cfgs) {
    lab::AttnCase c = lab::make_case(f.B, f.q, f.q, f.nkv, f.G, f.hd, f.bs);
    const float scale = 1.0f / std::sqrt(float(f.hd));
    // Causal: query i sees i + 1 keys.
    const double flops = 4.0 * double(f.B) * double(c.nh) * double(f.hd) * double(f.q) * double(f.q + 1) / 2.0;
    for (int path : {2, 1}) {
      if (path == 2 && f.hd != 64 && f.hd != 128) continue;
      ts::ops::cuda::set_attention_path(path, 0);
      const double e = (int64_t(f.q) * f.q * f.B <= 4 * 2048 * 2048) ? lab::check_case(c, scale) : -1.0;
      const double us = lab::time_us([&] {
        ts::ops::cuda::paged_attention(c.q_d, c.kc_d, c.vc_d, c.md, scale, c.out_d);
      }, 20, 3);
      std::printf("prefill B=%d q=kv=%-5d nkv=%ld G=%ld hd=%-3ld bs=%-2d %-10s err %.2e %-4s %10.1f us %7.1f TFLOP/s\n",
                  f.B, f.q, long(f.nkv), long(f.G), long(f.hd), f.bs, path == 2 ? "tensorcore" : "generic",
                  e, e < 0 ? "n/a" : lab::verdict(e), us, flops / (us * 1e6));
    }
    ts::ops::cuda::set_attention_path(0, 0);
  }
  return 0;
}
