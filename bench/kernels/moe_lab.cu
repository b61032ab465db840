// MoE lab: the routed experts (moe_experts: sort, gate_up+glu, down, combine) at Qwen3-30B-A3B
// shapes (hidden 2048, 128 experts, top-8, moe_intermediate 768, bf16) for decode batches of
// 1, 8, 64 tokens and a prefill-sized 1024. Bandwidth counts the weights of the experts actually
// selected (each read once) plus activations, against the measured copy ceiling. Each timed call
// uses the next of 16 routings so the selected experts rotate and do not sit in L2. Also: the
// router (moe_route) and a correctness check against the CPU reference at a reduced expert count.
#include <set>

#include "lab_common.cuh"

namespace {

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t z = uint32_t(i) * 0x9e3779b9u ^ uint32_t(i >> 32) * 0x85ebca6bu ^ seed;
    z ^= z >> 16;
    z *= 0x7feb352du;
    z ^= z >> 15;
    z *= 0x846ca68bu;
    z ^= z >> 16;
    p[i] = __float2bfloat16((float(z >> 8) * (1.0f / 8388608.0f) - 1.0f) * scale);
  }
}

ts::Tensor dev_random(std::vector<int64_t> shape, float scale, uint32_t seed) {
  ts::Tensor t = ts::Tensor::empty(shape, ts::DType::bf16, ts::Device::cuda);
  fill_bf16<<<1024, 256, 0, ts::cuda::stream()>>>(t.ptr<__nv_bfloat16>(), size_t(t.numel()), seed, scale);
  TS_CUDA_CHECK(cudaGetLastError());
  return t;
}

// Random distinct experts per token, ascending; returns the number of distinct experts used.
int make_routing(int64_t T, int64_t E, int64_t k, ts::Tensor& ids, ts::Tensor& w) {
  ids = ts::Tensor::empty({T, k}, ts::DType::i32);
  w = ts::Tensor::empty({T, k}, ts::DType::f32);
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) all[size_t(e)] = int32_t(e);
  std::set<int32_t> used;
  std::uniform_real_distribution<float> ud(0.05f, 0.3f);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), lab::rng());
    std::vector<int32_t> pick(all.begin(), all.begin() + k);
    std::sort(pick.begin(), pick.end());
    for (int64_t j = 0; j < k; ++j) {
      ids.ptr<int32_t>()[t * k + j] = pick[size_t(j)];
      w.ptr<float>()[t * k + j] = ud(lab::rng());
      used.insert(pick[size_t(j)]);
    }
  }
  return int(used.size());
}

}  // namespace

int main() {
  if (!lab::have_gpu()) return 0;
  const double ceiling = lab::copy_ceiling_gbs();
  const int64_t H = 2048, E = 128, K = 8, I = 768;
  ts::ops::GluAct act;

  // Correctness at the real hidden/intermediate sizes with 16 experts (CPU reference in f32).
  {
    const int64_t Ec = 16, kc = 4;
    lab::Pair gu = lab::rand_pair({Ec, 2 * I, H}, 0.04f), dn = lab::rand_pair({Ec, H, I}, 0.06f);
    for (int64_t T : {1, 8, 64}) {
      lab::Pair x = lab::rand_pair({T, H});
      ts::Tensor ids, w;
      make_routing(T, Ec, kc, ids, w);
      ts::Tensor ref = ts::Tensor::empty({T, H}, ts::DType::f32);
      ts::ops::cpu::moe_experts(x.h, ids, w, gu.h, dn.h, act, ref);
      ts::Tensor out = ts::Tensor::empty({T, H}, ts::DType::bf16, ts::Device::cuda);
      for (int nt : {0, 1, 8}) {
        ts::ops::KernelPolicy kp;
        kp.moe_tile = nt;
        ts::ops::cuda::moe_experts(x.d, ids.to(ts::Device::cuda), w.to(ts::Device::cuda), gu.d, dn.d, act, out, kp);
        const double e = lab::rel_err(out, ref);
        std::printf("moe_experts check T=%-3ld E=%ld k=%ld tile=%d: rel err %.2e %s\n", long(T), long(Ec), long(kc), nt,
                    e, lab::verdict(e));
      }
    }
  }

  // Timing at the full shape.
  ts::Tensor gate_up = dev_random({E, 2 * I, H}, 0.04f, 1), down = dev_random({E, H, I}, 0.06f, 2);
  const double expert_bytes = double(3 * I * H) * 2.0;
  std::printf("\nQwen3-30B-A3B experts: H=%ld E=%ld top-%ld I=%ld, %.2f MB per expert, %.0f MB total\n", long(H),
              long(E), long(K), long(I), expert_bytes / 1e6, expert_bytes * double(E) / 1e6);
  std::printf("%-7s %-6s %-9s %-10s %-11s %-9s %-8s\n", "tokens", "tile", "experts", "MB read", "us", "GB/s", "% copy");
  const int R = 16;
  for (int64_t T : {1, 8, 64, 1024}) {
    std::vector<ts::Tensor> ids(R), w(R);
    double used_sum = 0;
    for (int r = 0; r < R; ++r) {
      ts::Tensor ih, wh;
      used_sum += make_routing(T, E, K, ih, wh);
      ids[size_t(r)] = ih.to(ts::Device::cuda);
      w[size_t(r)] = wh.to(ts::Device::cuda);
    }
    const double used = used_sum / R;
    ts::Tensor x = dev_random({T, H}, 1.0f, 3);
    ts::Tensor out = ts::Tensor::empty({T, H}, ts::DType::bf16, ts::Device::cuda);
    // weights of the selected experts + x + act/y round trips (bf16) + out
    const double bytes = used * expert_bytes + double(T) * double(H) * 4.0 +
                         double(T * K) * double(2 * I + 2 * H) * 2.0;
    for (int nt : {0, 1, 2, 4, 8}) {
      ts::ops::KernelPolicy kp;
      kp.moe_tile = nt;
      int it = 0;
      const double us = lab::time_us(
          [&] {
            const size_t r = size_t(it++ % R);
            ts::ops::cuda::moe_experts(x, ids[r], w[r], gate_up, down, act, out, kp);
          },
          T >= 1024 ? 20 : 100);
      std::printf("%-7ld %-6s %-9.1f %-10.1f %-11.2f %-9.0f %-8.1f\n", long(T), nt == 0 ? "auto" : std::to_string(nt).c_str(),
                  used, bytes / 1e6, us, bytes / (us * 1e3), 100.0 * bytes / (us * 1e3) / ceiling);
    }
  }

  // Router: softmax top-8 of 128 (Qwen3) and grouped sigmoid top-8 of 256 (DeepSeek-V3).
  std::printf("\nmoe_route\n");
  for (int64_t T : {1, 64, 1024}) {
    for (int ds = 0; ds < 2; ++ds) {
      const int64_t Er = ds ? 256 : 128;
      ts::ops::MoeRouting r;
      r.top_k = 8;
      r.renormalize = true;
      if (ds) {
        r.scoring = ts::ops::MoeScoring::sigmoid;
        r.n_group = 8;
        r.topk_group = 4;
        r.renorm_eps = 1e-20f;
        r.scale = 2.5f;
      }
      lab::Pair lg16 = lab::rand_pair({T, Er}, 3.0f);
      ts::Tensor logits = lg16.h.to(ts::Device::cuda);  // f32 logits
      ts::Tensor bias = lab::rand_pair({Er}, 0.1f).h.to(ts::Device::cuda);
      ts::Tensor ids = ts::Tensor::empty({T, 8}, ts::DType::i32, ts::Device::cuda);
      ts::Tensor wts = ts::Tensor::empty({T, 8}, ts::DType::f32, ts::Device::cuda);
      const double us = lab::time_us([&] { ts::ops::cuda::moe_route(logits, ds ? &bias : nullptr, r, ids, wts); });
      std::printf("  %-24s T=%-5ld %8.2f us\n", ds ? "sigmoid grouped 8/4 E=256" : "softmax E=128", long(T), us);
    }
  }
  return 0;
}
