// Shared setup for the attention labs: a batch of sequences over a paged cache with shuffled
// blocks, host metadata for the CPU reference and device metadata for the kernels.
#pragma once
#include "lab_common.cuh"

namespace lab {

struct AttnCase {
  ts::ops::AttnMeta mh, md;
  ts::Tensor kc_d, vc_d, q_d, out_d;
  int64_t T = 0, nh = 0, nkv = 0, hd = 0, kv_tokens = 0;
};

inline ts::Tensor i32(const std::vector<int32_t>& v) {
  ts::Tensor t = ts::Tensor::empty({int64_t(v.size())}, ts::DType::i32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

inline AttnCase make_case(int B, int q_len, int kv_len, int64_t nkv, int64_t G, int64_t hd, int bs) {
  AttnCase c;
  c.nkv = nkv;
  c.nh = nkv * G;
  c.hd = hd;
  std::vector<int32_t> cu{0}, kvl;
  for (int b = 0; b < B; ++b) {
    cu.push_back(cu.back() + q_len);
    kvl.push_back(kv_len);
  }
  const int nb = (kv_len + bs - 1) / bs;
  std::vector<int32_t> perm(static_cast<size_t>(B) * nb);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng());
  ts::Tensor bt = ts::Tensor::empty({B, nb}, ts::DType::i32);
  std::copy(perm.begin(), perm.end(), bt.ptr<int32_t>());
  c.T = cu.back();
  c.kv_tokens = int64_t(B) * kv_len;
  c.mh.cu_q = i32(cu);
  c.mh.kv_len = i32(kvl);
  c.mh.block_tables = bt;
  c.mh.block_size = bs;
  c.mh.num_seqs = B;
  c.mh.max_q_len = q_len;
  c.mh.max_kv_len = kv_len;
  c.md = c.mh;
  c.md.cu_q = c.mh.cu_q.to(ts::Device::cuda);
  c.md.kv_len = c.mh.kv_len.to(ts::Device::cuda);
  c.md.block_tables = bt.to(ts::Device::cuda);
  c.kc_d = rand_dev({int64_t(B) * nb, bs, nkv, hd});
  c.vc_d = rand_dev({int64_t(B) * nb, bs, nkv, hd});
  c.q_d = rand_dev({c.T, c.nh, hd});
  c.out_d = ts::Tensor::empty({c.T, c.nh, hd}, ts::DType::bf16, ts::Device::cuda);
  return c;
}

// CPU reference on the same data (only for modest sizes).
inline double check_case(AttnCase& c, float scale, const ts::ops::KernelPolicy& kp = {}) {
  ts::Tensor q = c.q_d.to(ts::Device::cpu).to_f32(), kc = c.kc_d.to(ts::Device::cpu).to_f32(),
             vc = c.vc_d.to(ts::Device::cpu).to_f32();
  ts::Tensor ref = ts::Tensor::empty({c.T, c.nh, c.hd}, ts::DType::f32);
  ts::ops::cpu::paged_attention(q, kc, vc, c.mh, scale, ref);
  TS_CUDA_CHECK(cudaMemset(c.out_d.data, 0xff, c.out_d.nbytes()));
  ts::ops::cuda::paged_attention(c.q_d, c.kc_d, c.vc_d, c.md, scale, c.out_d, kp);
  return rel_err(c.out_d, ref);
}

// Extra copies of the case's K/V caches (same contents, different addresses) so that the timed
// loop streams from HBM: enough copies that together they exceed ~3x L2 (at least 2).
struct Rotation {
  std::vector<ts::Tensor> kc, vc;
};
inline Rotation make_rotation(const AttnCase& c, double min_bytes = 180e6) {
  Rotation r;
  const double bytes = double(c.kc_d.nbytes() + c.vc_d.nbytes());
  const int copies = std::max(2, int(std::ceil(min_bytes / std::max(bytes, 1.0))));
  for (int i = 0; i < copies; ++i) {
    if (i == 0) {
      r.kc.push_back(c.kc_d);
      r.vc.push_back(c.vc_d);
      continue;
    }
    ts::Tensor k = ts::Tensor::empty(c.kc_d.dims(), ts::DType::bf16, ts::Device::cuda);
    ts::Tensor v = ts::Tensor::empty(c.vc_d.dims(), ts::DType::bf16, ts::Device::cuda);
    TS_CUDA_CHECK(cudaMemcpy(k.data, c.kc_d.data, k.nbytes(), cudaMemcpyDeviceToDevice));
    TS_CUDA_CHECK(cudaMemcpy(v.data, c.vc_d.data, v.nbytes(), cudaMemcpyDeviceToDevice));
    r.kc.push_back(k);
    r.vc.push_back(v);
  }
  return r;
}

// Median per-call time (us) of back-to-back calls cycling through the rotation (one event pair
// around each full cycle, so launch gaps are what a graph/stream of kernels would see).
inline double time_rot_us(AttnCase& c, Rotation& r, float scale, int reps = 20, int warmup = 2,
                          const ts::ops::KernelPolicy& kp = {}) {
  cudaStream_t s = ts::cuda::stream();
  const int n = int(r.kc.size());
  auto cycle = [&] {
    for (int i = 0; i < n; ++i) ts::ops::cuda::paged_attention(c.q_d, r.kc[size_t(i)], r.vc[size_t(i)], c.md, scale, c.out_d, kp);
  };
  for (int i = 0; i < warmup; ++i) cycle();
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(a, s));
    cycle();
    TS_CUDA_CHECK(cudaEventRecord(b, s));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f / float(n));
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  TS_CUDA_CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace lab
