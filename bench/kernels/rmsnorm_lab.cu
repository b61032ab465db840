// rmsnorm lab: CPU reference, a naive one-thread-per-row kernel and the production kernel
// (block per row, 16-byte vectors, PDL launch), checked and timed side by side.
#include "lab_common.cuh"

namespace {
// v0: one thread per row, scalar loads (the baseline).
__global__ void rmsnorm_naive(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out,
                              int T, int H, float eps) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const __nv_bfloat16* r = x + int64_t(t) * H;
  float ss = 0.0f;
  for (int i = 0; i < H; ++i) ss += __bfloat162float(r[i]) * __bfloat162float(r[i]);
  const float inv = rsqrtf(ss / H + eps);
  for (int i = 0; i < H; ++i)
    out[int64_t(t) * H + i] = __float2bfloat16(__bfloat162float(r[i]) * inv * __bfloat162float(w[i]));
}
}  // namespace

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  const float eps = 1e-6f;
  for (int64_t H : {4096, 5120, 8192}) {
    for (int64_t T : {1, 16, 256, 16384}) {
      lab::Pair x = lab::rand_pair({T, H}, 2.0f), w = lab::rand_pair({H});
      ts::Tensor ref = ts::Tensor::empty({T, H}, ts::DType::f32);
      ts::ops::cpu::rmsnorm(x.h, w.h, eps, ref);
      ts::Tensor out = ts::Tensor::empty({T, H}, ts::DType::bf16, ts::Device::cuda);
      const double bytes = 2.0 * double(T) * double(H) * 2.0;  // read x, write out
      auto report = [&](const char* name, const std::function<void()>& fn) {
        TS_CUDA_CHECK(cudaMemset(out.data, 0xff, out.nbytes()));
        fn();
        const double e = lab::rel_err(out, ref);
        const double us = lab::time_us(fn);
        std::printf("rmsnorm %-10s T=%-6ld H=%-5ld err %.2e %-4s %9.2f us %7.0f GB/s (%4.1f%% of copy)\n",
                    name, long(T), long(H), e, lab::verdict(e), us, bytes / (us * 1e3),
                    100.0 * bytes / (us * 1e3) / ceiling);
      };
      report("naive", [&] {
        rmsnorm_naive<<<unsigned((T + 127) / 128), 128, 0, ts::cuda::stream()>>>(
            x.d.ptr<__nv_bfloat16>(), w.d.ptr<__nv_bfloat16>(), out.ptr<__nv_bfloat16>(), int(T),
            int(H), eps);
        TS_CUDA_CHECK(cudaGetLastError());
      });
      report("production", [&] { ts::ops::cuda::rmsnorm(x.d, w.d, eps, out); });
    }
  }
  return 0;
}
