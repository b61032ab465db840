// Expert-parallel dispatch / combine on the CPU (the reference for ops/cuda/moe_dispatch.cu).
// ep_fold's loop is written exactly as ops::cpu::moe_experts' weighted sum (same expression,
// same order, same compiler flags), so a combine over per-slot expert outputs reproduces the
// single-rank MoE output bit for bit.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/moe_dispatch.h"

namespace ts::ops::cpu {

namespace {

void check_i32(const Tensor& t, const char* what) {
  TS_CHECK(t.device == Device::cpu && t.dtype == DType::i32, "{}: i32 host tensor expected ({} {})", what,
           dtype_name(t.dtype), t.shape_str());
}

int owner_of(int32_t e, int64_t experts, int64_t per_rank, const char* what) {
  TS_CHECK(e >= 0 && e < experts, "{}: expert id {} outside 0..{}", what, e, experts - 1);
  return int(e / per_rank);
}

}  // namespace

void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token) {
  check_i32(ids, "ep_plan ids");
  check_i32(counts, "ep_plan counts");
  check_i32(row_pos, "ep_plan row_pos");
  check_i32(slot_pos, "ep_plan slot_pos");
  check_i32(row_token, "ep_plan row_token");
  const int64_t T = ids.rows(), k = ids.size(-1), R = ranks;
  TS_CHECK(R >= 1 && experts >= 1 && experts % R == 0, "ep_plan: {} experts over {} ranks", experts, R);
  TS_CHECK(counts.is_contiguous() && counts.numel() == 2 * R, "ep_plan: counts {} for {} ranks (want [2, {}])",
           counts.shape_str(), R, R);
  TS_CHECK(row_pos.rows() == T && row_pos.size(-1) == k && slot_pos.rows() == T && slot_pos.size(-1) == k,
           "ep_plan: ids {} row_pos {} slot_pos {}", ids.shape_str(), row_pos.shape_str(), slot_pos.shape_str());
  TS_CHECK(row_token.is_contiguous() && row_token.numel() >= T * std::min<int64_t>(k, R),
           "ep_plan: row_token {} holds fewer than T * min(k, R) = {} rows", row_token.shape_str(),
           T * std::min<int64_t>(k, R));
  const int64_t per = experts / R;
  int32_t* c = counts.ptr<int32_t>();
  std::memset(c, 0, size_t(2 * R) * 4);
  std::vector<int32_t> seen(size_t(R), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int r = owner_of(ids.ptr<int32_t>()[t * ids.row_stride() + j], experts, per, "ep_plan");
      ++c[R + r];
      if (seen[size_t(r)] != int32_t(t)) {
        seen[size_t(r)] = int32_t(t);
        ++c[r];
      }
    }
  std::vector<int32_t> row_fill(static_cast<size_t>(R)), slot_fill(static_cast<size_t>(R));
  for (int64_t r = 1; r < R; ++r) {
    row_fill[size_t(r)] = row_fill[size_t(r - 1)] + c[r - 1];
    slot_fill[size_t(r)] = slot_fill[size_t(r - 1)] + c[R + r - 1];
  }
  std::fill(seen.begin(), seen.end(), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int r = owner_of(ids.ptr<int32_t>()[t * ids.row_stride() + j], experts, per, "ep_plan");
      slot_pos.ptr<int32_t>()[t * slot_pos.row_stride() + j] = slot_fill[size_t(r)]++;
      int32_t& rp = row_pos.ptr<int32_t>()[t * row_pos.row_stride() + j];
      if (seen[size_t(r)] != int32_t(t)) {
        seen[size_t(r)] = int32_t(t);
        rp = row_fill[size_t(r)];
        row_token.ptr<int32_t>()[row_fill[size_t(r)]++] = int32_t(t);
      } else {
        rp = -1;
      }
    }
}

void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w) {
  check_i32(ids, "ep_pack ids");
  check_i32(row_token, "ep_pack row_token");
  check_i32(counts, "ep_pack counts");
  check_i32(send_ids, "ep_pack send_ids");
  TS_CHECK(weights.dtype == DType::f32 && send_w.dtype == DType::f32, "ep_pack: weights must be f32");
  const int64_t R = counts.numel() / 2, k = ids.size(-1), S = send_x.rows(), H = x.size(-1);
  TS_CHECK(R >= 1 && experts % R == 0, "ep_pack: {} experts over {} ranks", experts, R);
  int64_t total = 0;
  for (int64_t r = 0; r < R; ++r) total += counts.ptr<int32_t>()[r];
  TS_CHECK(total == S && send_ids.rows() == S && send_w.rows() == S && send_ids.size(-1) == k &&
               send_w.size(-1) == k && send_x.size(-1) == H && send_x.dtype == x.dtype &&
               weights.rows() == ids.rows() && weights.size(-1) == k && row_token.numel() >= S,
           "ep_pack: {} rows planned, send_x {} send_ids {} send_w {} (x {}, ids {})", total, send_x.shape_str(),
           send_ids.shape_str(), send_w.shape_str(), x.shape_str(), ids.shape_str());
  const int64_t per = experts / R;
  const size_t es = dtype_size(x.dtype);
  int64_t p = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = counts.ptr<int32_t>()[r];
    for (int64_t i = 0; i < n; ++i, ++p) {
      const int64_t t = row_token.ptr<int32_t>()[p];
      TS_CHECK(t >= 0 && t < x.rows(), "ep_pack: send row {} names token {} of {}", p, t, x.rows());
      std::memcpy(static_cast<char*>(send_x.data) + size_t(p * send_x.row_stride()) * es,
                  static_cast<const char*>(x.data) + size_t(t * x.row_stride()) * es, size_t(H) * es);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids.ptr<int32_t>()[t * ids.row_stride() + j];
        send_ids.ptr<int32_t>()[p * send_ids.row_stride() + j] = e / per == r ? int32_t(e - r * per) : -1;
        send_w.ptr<float>()[p * send_w.row_stride() + j] = weights.ptr<float>()[t * weights.row_stride() + j];
      }
    }
  }
}

void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos) {
  check_i32(ids, "ep_expand ids");
  check_i32(exp_row, "ep_expand exp_row");
  check_i32(exp_id, "ep_expand exp_id");
  check_i32(exp_pos, "ep_expand exp_pos");
  TS_CHECK(exp_w.dtype == DType::f32, "ep_expand: exp_w must be f32");
  const int64_t N = ids.rows(), k = ids.size(-1), M = exp_row.numel();
  TS_CHECK(exp_pos.rows() == N && exp_pos.size(-1) == k && exp_id.numel() == M && exp_w.numel() == M &&
               exp_row.is_contiguous() && exp_id.is_contiguous() && exp_w.is_contiguous(),
           "ep_expand: ids {} exp_pos {} exp_row {} exp_id {} exp_w {}", ids.shape_str(), exp_pos.shape_str(),
           exp_row.shape_str(), exp_id.shape_str(), exp_w.shape_str());
  int64_t m = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.ptr<int32_t>()[n * ids.row_stride() + j];
      int32_t& pos = exp_pos.ptr<int32_t>()[n * exp_pos.row_stride() + j];
      if (e < 0) {
        pos = -1;
        continue;
      }
      TS_CHECK(m < M, "ep_expand: more valid slots than the {} rows given", M);
      exp_row.ptr<int32_t>()[m] = int32_t(n);
      exp_id.ptr<int32_t>()[m] = e;
      exp_w.ptr<float>()[m] = 1.0f;
      pos = int32_t(m++);
    }
  TS_CHECK(m == M, "ep_expand: {} valid slots, {} rows given", m, M);
}

void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out) {
  check_i32(pos, "ep_fold pos");
  TS_CHECK(y.dtype == DType::f32 && out.dtype == DType::f32, "cpu ep_fold: f32 only");
  const int64_t t_n = out.rows(), hid = out.size(-1), k = pos.size(-1);
  TS_CHECK(pos.rows() == t_n && (y.rows() == 0 || y.size(-1) == hid) &&
               (!weights || (weights->dtype == DType::f32 && weights->rows() == t_n && weights->size(-1) == k)),
           "ep_fold: y {} pos {} weights {} out {}", y.shape_str(), pos.shape_str(),
           weights ? weights->shape_str() : "-", out.shape_str());
  if (t_n == 0) return;
  const int64_t y_rows = y.rows();
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = pos.ptr<int32_t>()[t * pos.row_stride() + j];
      TS_CHECK(p < y_rows, "ep_fold: slot ({}, {}) reads row {} of {}", t, j, p, y_rows);
    }
  const int64_t os = out.row_stride(), ys = y_rows ? y.row_stride() : 0, ps = pos.row_stride();
  const int64_t wsd = weights ? weights->row_stride() : 0;
#pragma omp parallel for schedule(static) if (t_n > 16)
  for (int64_t t = 0; t < t_n; ++t) {
    float* o = out.ptr<float>() + t * os;
    for (int64_t i = 0; i < hid; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = pos.ptr<int32_t>()[t * ps + j];
      if (p < 0) continue;
      float w = weights ? weights->ptr<float>()[t * wsd + j] : 1.0f;
      const float* yr = y.ptr<float>() + p * ys;
      for (int64_t i = 0; i < hid; ++i) o[i] += yr[i] * w;
    }
  }
}

void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local) {
  check_i32(ids, "ep_local_ids ids");
  check_i32(local, "ep_local_ids local");
  const int64_t T = ids.rows(), k = ids.size(-1);
  TS_CHECK(local.rows() == T && local.size(-1) == k, "ep_local_ids: ids {} local {}", ids.shape_str(), local.shape_str());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.ptr<int32_t>()[t * ids.row_stride() + j];
      local.ptr<int32_t>()[t * local.row_stride() + j] = e >= e0 && e < e0 + n ? int32_t(e - e0) : -1;
    }
}

}  // namespace ts::ops::cpu
