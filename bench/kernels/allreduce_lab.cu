// Lab: latency of the fused one-shot all-reduce + residual add + RMSNorm (peer buffers, one
// kernel) against NCCL all-reduce + fused_add_rmsnorm, for 1..2048 tokens x hidden on 2 GPUs
// (one thread per GPU, one process). Prints rank 0's median per call in microseconds.
// Usage: lab_allreduce [hidden=4096] [iters=200]
#include <cstdio>
#include <cstdlib>

#include "core/tensor.h"
#include "core/cuda/runtime.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "runtime/tp_workers.h"

using namespace ts;

int main(int argc, char** argv) {
  const int64_t H = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  if (cuda::device_count() < 2) {
    std::printf("allreduce lab: needs 2 GPUs (%d visible); skipped\n", cuda::device_count());
    return 0;
  }
  try {
    auto fused = parallel::CommGroup::create(2, 2048, H);
    auto plain = parallel::CommGroup::create(2, 0, H);
    TpWorkers w(2);
    std::printf("# 2 GPUs: %s; hidden %lld, bf16; median of %d calls (rank 0)\n", cuda::device_description().c_str(),
                (long long)H, iters);
    std::printf("%8s %14s %14s %9s\n", "tokens", "oneshot_us", "nccl+norm_us", "speedup");
    for (int64_t T : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}) {
      double t_f[2] = {0, 0}, t_n[2] = {0, 0};
      w.run([&](int r) {
        auto cf = fused->rank(r), cn = plain->rank(r);
        Tensor x = Tensor::zeros({T, H}, DType::bf16, Device::cuda);
        Tensor res = Tensor::zeros({T, H}, DType::bf16, Device::cuda);
        Tensor wt = Tensor::zeros({H}, DType::bf16, Device::cuda);
        // Both ranks time the same number of calls, so every collective has its partner.
        t_f[r] = cuda::time_ms([&] { cf->all_reduce_add_rmsnorm(x, res, wt, 1e-5f, false); }, iters, 10);
        t_n[r] = cuda::time_ms([&] { cn->all_reduce_add_rmsnorm(x, res, wt, 1e-5f, false); }, iters, 10);
      });
      std::printf("%8lld %14.2f %14.2f %8.2fx\n", (long long)T, t_f[0] * 1e3, t_n[0] * 1e3, t_n[0] / t_f[0]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
