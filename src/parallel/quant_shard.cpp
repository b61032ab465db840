#include "parallel/quant_shard.h"

#include "core/error.h"

namespace ts::parallel {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The blocks of size `block` that [r.start, r.end()) of a dimension of size n covers. A boundary
// inside a block is an error unless split blocks are allowed; the dimension's end is always a
// legal boundary (the checkpoint's own partial edge block).
Range covered_blocks(Range r, int64_t n, int64_t block, bool allow_split, const std::string& name, const char* dim,
                     int64_t& phase) {
  TS_CHECK(block >= 1, "{}: block size {} along {}", name, block, dim);
  const bool start_ok = r.start % block == 0;
  const bool end_ok = r.end() % block == 0 || r.end() == n;
  if (!allow_split && !(start_ok && end_ok)) {
    const int64_t at = start_ok ? r.end() : r.start;
    fail("{}: the shard's {} [{}, {}) of {} splits the {}-wide scale block {} at {} — ranks would share a block (pick a "
         "parallel size that divides {} into multiples of {}, or keep this weight replicated)",
         name, dim, r.start, r.end(), n, block, at / block, at, n, block);
  }
  phase = r.start % block;
  if (r.count == 0) return {r.start / block, 0};
  return {r.start / block, ceil_div(r.end(), block) - r.start / block};
}

}  // namespace

QuantShard shard_quantized(const ScaleSpec& spec, int64_t N, int64_t K, Range rows, Range cols, const std::string& name,
                           bool allow_split_blocks) {
  TS_CHECK(N >= 1 && K >= 1 && rows.start >= 0 && rows.count >= 0 && rows.end() <= N && cols.start >= 0 &&
               cols.count >= 0 && cols.end() <= K,
           "{}: shard rows [{}, {}) cols [{}, {}) outside the weight [{}, {}]", name, rows.start, rows.end(), cols.start,
           cols.end(), N, K);
  QuantShard q;
  q.rows = rows;
  q.cols = cols;
  switch (spec.layout) {
    case ScaleLayout::none: break;
    case ScaleLayout::per_tensor: q.scale_replicated = true; break;
    case ScaleLayout::per_channel:
      // [N, 1]: one multiplier per output row; a column shard keeps them all.
      q.scale_rows = rows;
      q.scale_cols = {0, 1};
      break;
    case ScaleLayout::block:
      q.scale_rows = covered_blocks(rows, N, spec.block_n, allow_split_blocks, name, "rows", q.row_phase);
      q.scale_cols = covered_blocks(cols, K, spec.block_k, allow_split_blocks, name, "columns", q.col_phase);
      break;
    case ScaleLayout::group_k:
      // Rows are independent; a K group is never split (its scale belongs to all its elements,
      // and the kernels step through K a group at a time).
      TS_CHECK(K % spec.group == 0, "{}: K {} is not a multiple of the quantization group {}", name, K, spec.group);
      q.scale_rows = rows;
      q.scale_cols = covered_blocks(cols, K, spec.group, false, name, "columns", q.col_phase);
      break;
  }
  if (spec.packed_fp4) {
    TS_CHECK(K % 2 == 0 && cols.start % 2 == 0 && cols.count % 2 == 0,
             "{}: packed FP4 columns [{}, {}) must start and end on a byte (two elements)", name, cols.start, cols.end());
    q.packed_cols = {cols.start / 2, cols.count / 2};
  }
  return q;
}

QuantShard shard_quantized_rows(const ScaleSpec& spec, int64_t N, int64_t K, Range rows, const std::string& name,
                                bool allow_split_blocks) {
  return shard_quantized(spec, N, K, rows, {0, K}, name, allow_split_blocks);
}

QuantShard shard_quantized_cols(const ScaleSpec& spec, int64_t N, int64_t K, Range cols, const std::string& name,
                                bool allow_split_blocks) {
  return shard_quantized(spec, N, K, {0, N}, cols, name, allow_split_blocks);
}

}  // namespace ts::parallel
