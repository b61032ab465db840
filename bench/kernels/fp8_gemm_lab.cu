// FP8 GEMM lab (#16 prefill): W8A8 through cuBLASLt's Hopper block scaling against the other ways a
// block-128 FP8 checkpoint's linear can run, at Llama-3.1-8B shapes.
//  1. Scale orders: cuBLASLt's BLK128x128 (weights) and VEC128 (activations) scale tensors are
//     tried in each candidate element order against the CPU (quantize_act_fp8 + exact e4m3 dot
//     products x scales); the product's order (ops::cuda::fp8_scale_order) must be one that
//     passes. M = 64 and M = 13 (not a multiple of 4).
//  2. The product path (quant_linear_kernel fp8gemm) vs the CPU W8A8 reference and vs W8A16.
//  3. Time per call and TFLOP/s: bf16 cuBLASLt (dequantized weights), W8A16 tiles (dequantize +
//     bf16 GEMM: today's prefill), W8A16 mma (M <= 64), W8A8 fp8gemm (activation quantization
//     included; the quantization alone on its own line).
#include <cstring>

#include "core/fp8.h"
#include "lab_common.cuh"
#include "ops/cuda/quant_linear.h"
#include "ops/linear_weight.h"

namespace {
using ts::Device;
using ts::DType;
using ts::Tensor;

// Random e4m3 codes (no NaN), magnitudes in [2^-4, 2^3).
Tensor rand_codes(int64_t n, int64_t k) {
  Tensor t = Tensor::empty({n, k}, DType::u8);
  std::uniform_int_distribution<int> e(3, 9), m(0, 7), sgn(0, 1);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<uint8_t>()[i] = uint8_t((sgn(lab::rng()) << 7) | (e(lab::rng()) << 3) | m(lab::rng()));
  return t;
}

struct Problem {
  int64_t M, N, K;
  Tensor wcodes, wscale;  // host: u8 [N, K], f32 [N/128, K/128]
  lab::Pair x;            // [M, K]
};

Problem make_problem(int64_t M, int64_t N, int64_t K, bool uniform_w, float xs) {
  Problem p{M, N, K, rand_codes(N, K), Tensor::empty({(N + 127) / 128, K / 128}, DType::f32), lab::rand_pair({M, K}, xs)};
  std::uniform_real_distribution<float> d(0.25f, 4.0f);
  for (int64_t i = 0; i < p.wscale.numel(); ++i) p.wscale.ptr<float>()[i] = uniform_w ? 1.0f : d(lab::rng());
  return p;
}

// CPU W8A8: x quantized as the kernel does, products of exact e4m3 values, f32 scales per block.
Tensor cpu_w8a8(const Problem& p, const Tensor& xq, const Tensor& xsc) {
  const int64_t G = p.K / 128;
  Tensor out = Tensor::empty({p.M, p.N}, DType::f32);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double acc = 0;
      for (int64_t g = 0; g < G; ++g) {
        double part = 0;
        for (int64_t k = g * 128; k < g * 128 + 128; ++k)
          part += double(ts::e4m3_to_f32(xq.ptr<uint8_t>()[m * p.K + k])) *
                  double(ts::e4m3_to_f32(p.wcodes.ptr<uint8_t>()[n * p.K + k]));
        acc += part * double(xsc.ptr<float>()[m * G + g]) * double(p.wscale.ptr<float>()[(n / 128) * G + g]);
      }
      out.ptr<float>()[m * p.N + n] = float(acc);
    }
  return out;
}

// The weight's scale grid in the candidate order, on the device.
Tensor weight_scales(const Problem& p, bool n_major) {
  if (!n_major) return p.wscale.to(Device::cuda);
  const int64_t NB = p.wscale.size(0), G = p.wscale.size(1);
  Tensor t = Tensor::empty({G, NB}, DType::f32);
  for (int64_t nb = 0; nb < NB; ++nb)
    for (int64_t g = 0; g < G; ++g) t.ptr<float>()[g * NB + nb] = p.wscale.ptr<float>()[nb * G + g];
  return t.to(Device::cuda);
}

ts::ops::LinearWeight stored_weight(const Problem& p) {
  Tensor codes = p.wcodes.to(Device::cuda);
  ts::ops::LinearWeight w(Tensor::from_blob(codes.data, {p.N, p.K}, DType::f8_e4m3, Device::cuda));
  w.owner = codes.owner;
  w.quant.scale = p.wscale.to(Device::cuda);
  w.quant.block_n_log2 = 7;
  w.quant.block_k_log2 = 7;
  w.quant.format = "fp8_block";
  w.quant.act_fp8 = true;
  return w;
}

}  // namespace

int main() {
  if (!lab::have_gpu()) return 0;
  using ts::ops::cuda::Fp8ScaleOrder;
  // 1. Scale orders.
  const Fp8ScaleOrder product = ts::ops::cuda::fp8_scale_order();
  bool product_ok = true;
  for (int64_t M : {64, 13}) {
    const Problem p = make_problem(M, 384, 512, false, 2.0f);
    Tensor xq_h = Tensor::empty({M, p.K}, DType::u8), xs_h = Tensor::empty({M, p.K / 128}, DType::f32);
    ts::ops::cpu::quantize_act_fp8(p.x.h, xq_h, xs_h);
    const Tensor ref = cpu_w8a8(p, xq_h, xs_h);
    Tensor wq = p.wcodes.to(Device::cuda);
    Tensor xq = Tensor::empty({M, p.K}, DType::u8, Device::cuda);
    const int64_t G = p.K / 128;
    Tensor xs = Tensor::empty({G * ((M + 3) / 4 * 4)}, DType::f32, Device::cuda);
    Tensor out = Tensor::empty({M, p.N}, DType::bf16, Device::cuda);
    for (int ak = 0; ak < 2; ++ak)
      for (int pad = 0; pad < (ak ? 1 : 2); ++pad)
        for (int wn = 0; wn < 2; ++wn) {
          const Fp8ScaleOrder o{bool(ak), bool(pad), bool(wn)};
          const int64_t ld = pad ? (M + 3) / 4 * 4 : M;
          ts::ops::cuda::quantize_act_fp8(p.x.d, xq, xs.ptr<float>(), ld, o.act_k_major);
          // The device quantization must equal the CPU's bit for bit (codes and scales).
          Tensor xq_d = xq.to(Device::cpu), xs_d = xs.to(Device::cpu);
          bool same = std::memcmp(xq_d.data, xq_h.data, size_t(M * p.K)) == 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t g = 0; g < G; ++g)
              same = same && xs_d.ptr<float>()[o.act_k_major ? m * G + g : g * ld + m] == xs_h.ptr<float>()[m * G + g];
          const Tensor wsc = weight_scales(p, o.weight_n_major);
          const bool ran = ts::ops::cuda::fp8_block_matmul(M, p.N, p.K, xq.data, xs.ptr<float>(), wq.data, p.K,
                                                           wsc.ptr<float>(), nullptr, out.data, p.N, o);
          const double e = ran ? lab::rel_err(out, ref) : INFINITY;
          const bool is_product = o.act_k_major == product.act_k_major && o.act_ld_pad4 == product.act_ld_pad4 &&
                                  o.weight_n_major == product.weight_n_major;
          // cuBLASLt has no algorithm for M % 4 != 0 (the product pads the last rows to 4).
          if (is_product && M % 4 == 0) product_ok = product_ok && ran && e < 1e-2 && same;
          std::printf("fp8 scale order M=%-3ld act %-11s weight %-9s: %s, quantize %s, rel err %.2e %s%s\n", long(M),
                      o.act_k_major ? "k-major" : (o.act_ld_pad4 ? "token/pad4" : "token"),
                      o.weight_n_major ? "n-major" : "as stored", ran ? "ran" : "no algorithm",
                      same ? "bit-equal" : "DIFFERS", e, ran ? lab::verdict(e) : "FAIL",
                      is_product ? "  <- product order" : "");
        }
  }
  std::printf("fp8 scale order: product order %s\n", product_ok ? "OK" : "FAIL");

  // 2. The product path: W8A8 vs the CPU W8A8 reference, and the W8A8 - W8A16 difference.
  {
    for (int64_t M : {200, 13}) {
    const Problem p = make_problem(M, 1024, 2048, false, 1.0f);
    Tensor xq_h = Tensor::empty({p.M, p.K}, DType::u8), xs_h = Tensor::empty({p.M, p.K / 128}, DType::f32);
    ts::ops::cpu::quantize_act_fp8(p.x.h, xq_h, xs_h);
    const Tensor ref = cpu_w8a8(p, xq_h, xs_h);
    const ts::ops::LinearWeight w = stored_weight(p);
    Tensor out = Tensor::empty({p.M, p.N}, DType::bf16, Device::cuda), o16 = Tensor::empty({p.M, p.N}, DType::bf16, Device::cuda);
    ts::ops::cuda::quant_linear_kernel(p.x.d, w, out, nullptr, ts::ops::cuda::QuantKernel::fp8gemm);
    ts::ops::cuda::quant_linear_kernel(p.x.d, w, o16, nullptr, ts::ops::cuda::QuantKernel::tiles);
    const double e8 = lab::rel_err(out, ref);
    Tensor r16 = o16.to(Device::cpu).to_f32();
    std::printf("fp8gemm product path M=%ld N=1024 K=2048: vs CPU W8A8 rel err %.2e %s; vs W8A16 rel err %.2e\n",
                long(M), e8, lab::verdict(e8), lab::rel_err(out, r16));
    product_ok = product_ok && e8 < 1e-2;
    }
  }

  // 3. Timing at Llama-3.1-8B shapes.
  const double gemm_ceiling = lab::gemm_ceiling_tflops();
  struct Shape {
    int64_t N, K;
    const char* name;
  };
  for (const Shape& s : {Shape{6144, 4096, "qkv"}, Shape{4096, 4096, "o_proj"}, Shape{28672, 4096, "gate_up"},
                         Shape{4096, 14336, "down"}}) {
    const Problem p = make_problem(1, s.N, s.K, false, 1.0f);
    const ts::ops::LinearWeight w = stored_weight(p);
    Tensor wb = Tensor::empty({s.N, s.K}, DType::bf16, Device::cuda);
    ts::ops::cuda::dequantize_rows(w, 0, s.N, wb);
    for (int64_t M : {16, 32, 64, 128, 512, 2048, 8192}) {
      Tensor x = lab::rand_dev({M, s.K});
      Tensor out = Tensor::empty({M, s.N}, DType::bf16, Device::cuda);
      const double flop = 2.0 * double(M) * double(s.N) * double(s.K);
      auto row = [&](const char* what, double us) {
        std::printf("fp8 gemm %-8s M=%-5ld %-14s %10.2f us %7.1f TFLOP/s (%4.1f%% of bf16 GEMM ceiling)\n", s.name,
                    long(M), what, us, flop / (us * 1e6), 100.0 * flop / (us * 1e6) / gemm_ceiling);
      };
      const int it = M >= 2048 ? 10 : 30;
      row("bf16 cublasLt", lab::time_us([&] { ts::ops::cuda::linear(x, wb, out, nullptr, {}); }, it));
      row("w8a16 tiles", lab::time_us([&] {
            ts::ops::cuda::quant_linear_kernel(x, w, out, nullptr, ts::ops::cuda::QuantKernel::tiles);
          }, it));
      if (M <= 64)
        row("w8a16 mma", lab::time_us([&] {
              ts::ops::cuda::quant_linear_kernel(x, w, out, nullptr, ts::ops::cuda::QuantKernel::mma);
            }, it));
      row("w8a8 fp8gemm", lab::time_us([&] {
            ts::ops::cuda::quant_linear_kernel(x, w, out, nullptr, ts::ops::cuda::QuantKernel::fp8gemm);
          }, it));
      Tensor xq = Tensor::empty({M, s.K}, DType::u8, Device::cuda);
      Tensor xs = Tensor::empty({M * s.K / 128}, DType::f32, Device::cuda);
      const double qus = lab::time_us([&] { ts::ops::cuda::quantize_act_fp8(x, xq, xs.ptr<float>(), M, false); }, it);
      std::printf("fp8 gemm %-8s M=%-5ld %-14s %10.2f us %7.0f GB/s\n", s.name, long(M), "(act quantize)", qus,
                  double(M) * double(s.K) * 3.0 / (qus * 1e3));
    }
  }
  return product_ok ? 0 : 1;
}
