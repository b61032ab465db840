// Decode attention lab: the generic split-KV kernel (auto splits and a few forced counts) vs the
// tensor-core kernel on decode batches. Memory-bound: GB/s of K/V read vs the copy ceiling.
#include "attention_lab.cuh"

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  struct Cfg { int B, kv; int64_t nkv, G, hd; int bs; };
  const Cfg cfgs[] = {{1, 1024, 8, 4, 128, 16},  {1, 8192, 8, 4, 128, 16}, {1, 32768, 8, 4, 128, 64},
                      {8, 4096, 8, 4, 128, 16},  {32, 2048, 8, 4, 128, 16}, {64, 1024, 8, 4, 128, 64},
                      {16, 4096, 2, 8, 64, 64},  {1, 32768, 1, 8, 128, 64}, {4, 1000, 4, 1, 16, 16}};
  for (const Cfg& f : cfgs) {
    lab::AttnCase c = lab::make_case(f.B, 1, f.kv, f.nkv, f.G, f.hd, f.bs);
    const float scale = 1.0f / std::sqrt(float(f.hd));
    const double bytes = 2.0 * double(c.kv_tokens) * double(f.nkv) * double(f.hd) * 2.0;
    struct Variant { const char* name; int path, splits; };
    const Variant vs[] = {{"generic-auto", 1, 0}, {"generic-s1", 1, 1}, {"generic-s8", 1, 8},
                          {"generic-s32", 1, 32}, {"tensorcore", 2, 0}};
    for (const Variant& v : vs) {
      if (v.path == 2 && f.hd != 64 && f.hd != 128) continue;
      ts::ops::cuda::set_attention_path(v.path, v.splits);
      const double e = (c.kv_tokens <= 300000) ? lab::check_case(c, scale) : -1.0;
      const double us = lab::time_us([&] {
        ts::ops::cuda::paged_attention(c.q_d, c.kc_d, c.vc_d, c.md, scale, c.out_d);
      });
      std::printf("decode B=%-3d kv=%-6d nkv=%ld G=%ld hd=%-3ld bs=%-2d %-13s err %.2e %-4s %9.2f us %6.0f GB/s (%4.1f%% of copy)\n",
                  f.B, f.kv, long(f.nkv), long(f.G), long(f.hd), f.bs, v.name, e,
                  e < 0 ? "n/a" : lab::verdict(e), us, bytes / (us * 1e3),
                  100.0 * bytes / (us * 1e3) / ceiling);
    }
    ts::ops::cuda::set_attention_path(0, 0);
  }
  return 0;
}
