// linear lab: GEMV kernel vs cuBLASLt for small M (memory-bound decode: GB/s of weights against
// the copy ceiling) and cuBLASLt for large M (TFLOP/s). Llama-3.1-8B shapes. Weights rotate over
// enough copies to exceed L2.
#include "lab_common.cuh"

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  struct Shape { int64_t N, K; const char* name; };
  const Shape shapes[] = {{6144, 4096, "qkv"}, {4096, 4096, "o_proj"}, {28672, 4096, "gate_up"},
                          {4096, 14336, "down"}, {128256, 4096, "lm_head"},
                          // the demo model (pycoder): latency-bound, where GEMV takes M <= 8
                          {640, 384, "demo_qkv"}, {2048, 384, "demo_gu"}, {384, 1024, "demo_down"}};
  for (const Shape& s : shapes) {
    const double wbytes = double(s.N) * double(s.K) * 2.0;
    const int copies = int(std::max(1.0, std::ceil(200e6 / wbytes)));
    std::vector<ts::Tensor> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(lab::rand_dev({s.N, s.K}));
    // Correctness on a slice of rows (CPU reference on the first weight copy).
    {
      const int64_t M = 3, Nc = std::min<int64_t>(s.N, 512);
      lab::Pair x = lab::rand_pair({M, s.K});
      ts::Tensor wh = ws[0].narrow(0, 0, Nc).to(ts::Device::cpu).to_f32();
      ts::Tensor ref = ts::Tensor::empty({M, Nc}, ts::DType::f32);
      ts::ops::cpu::linear(x.h, wh, ref, nullptr);
      ts::Tensor wd = ws[0].narrow(0, 0, Nc);
      ts::Tensor out = ts::Tensor::empty({M, Nc}, ts::DType::bf16, ts::Device::cuda);
      for (int path : {1, 2}) {
        ts::ops::KernelPolicy kp;
        kp.linear = ts::ops::LinearPath(path);
        ts::ops::cuda::linear(x.d, wd, out, nullptr, kp);
        const double e = lab::rel_err(out, ref);
        std::printf("linear %-8s check path=%s err %.2e %s\n", s.name, path == 1 ? "cublasLt" : "gemv", e,
                    lab::verdict(e));
      }
    }
    for (int64_t M : {1, 2, 4, 8, 16, 64, 512, 4096}) {
      if (s.N * s.K < 4096 * 4096 && M > 16) continue;
      ts::Tensor x = lab::rand_dev({M, s.K});
      ts::Tensor out = ts::Tensor::empty({M, s.N}, ts::DType::bf16, ts::Device::cuda);
      for (int path : {1, 2}) {
        if (path == 2 && M > 8) continue;
        ts::ops::KernelPolicy kp;
        kp.linear = ts::ops::LinearPath(path);
        int it = 0;
        const double us = lab::time_us([&] { ts::ops::cuda::linear(x, ws[size_t(it++ % copies)], out, nullptr, kp); },
                                       M >= 512 ? 20 : 100);
        const double bytes = wbytes + double(M) * double(s.K + s.N) * 2.0;
        const double tflops = 2.0 * double(M) * double(s.N) * double(s.K) / (us * 1e6);
        std::printf("linear %-8s N=%-6ld K=%-5ld M=%-5ld %-8s %9.2f us %6.0f GB/s (%4.1f%% of copy) %7.1f TFLOP/s\n",
                    s.name, long(s.N), long(s.K), long(M), path == 1 ? "cublasLt" : "gemv", us,
                    bytes / (us * 1e3), 100.0 * bytes / (us * 1e3) / ceiling, tflops);
      }
    }
  }
  return 0;
}
