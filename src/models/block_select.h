// The block-selection hook: observe or override which key blocks MiniMax-M3's lightning indexer
// picks (route-diff, tests) — the block-sparse counterpart of the MoE route hook (models/moe.h),
// for the same question: does bf16 flip a top-k choice on a near-tie, and does that explain the
// device's logit error? A hook may also check the device's sparse-attention kernels against the
// CPU reference on the very inputs the model fed them.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace ts::models {

// Everything one sparse-attention layer fed its two kernels, on the model's device.
struct SparseAttnCall {
  const Tensor* idx_q;      // [T, Hi, D] index queries (normed, roped)
  const Tensor* idx_cache;  // [blocks, block_size, 1, D] index keys (this forward's written)
  const Tensor* q;          // [T, nh, hd] attention queries
  const Tensor* k_cache;    // [blocks, block_size, nkv, hd]
  const Tensor* v_cache;
  const ops::AttnMeta* meta;
  const ops::BlockIndexer* indexer;
  float scale;
  const Tensor* sel;  // [T, Hi, top_k] i32, as attention used it (after any override)
  const Tensor* out;  // [T, nh, hd] attention output
};

// Installed per thread, null by default (one thread-local load and a branch per sparse layer).
// Copies device tensors to and from the host, so eager forwards only (the model refuses it under
// breakable CUDA graphs).
class BlockSelectHook {
 public:
  virtual ~BlockSelectHook() = default;
  // layer: sparse-attention layers since `calls` was last set to 0. idx_q [T, Hi, D] and idx_k
  // [T, 1, D]: this forward's index queries and keys; positions i32 [T]; sel i32 [T, Hi, top_k]
  // as block_indexer wrote it. The hook may overwrite sel; attention then reads it.
  virtual void on_select(int layer, const Tensor& idx_q, const Tensor& idx_k, const Tensor& positions,
                         const ops::BlockIndexer& p, Tensor& sel) = 0;
  // After block_sparse_attention, same layer number.
  virtual void on_attention(int /*layer*/, const SparseAttnCall& /*c*/) {}
  int calls = 0;
};
BlockSelectHook*& block_select_hook();

class ScopedBlockSelectHook {
 public:
  explicit ScopedBlockSelectHook(BlockSelectHook* h) : prev_(block_select_hook()) { block_select_hook() = h; }
  ~ScopedBlockSelectHook() { block_select_hook() = prev_; }
  ScopedBlockSelectHook(const ScopedBlockSelectHook&) = delete;
  ScopedBlockSelectHook& operator=(const ScopedBlockSelectHook&) = delete;

 private:
  BlockSelectHook* prev_;
};

// One sparse layer's selection on the host: q [T, Hi, D] f32, k [T, D] f32, positions [T] i32,
// sel [T, Hi, top_k] i32 (the indexer's own pick, before any override).
struct BlockRecord {
  Tensor q, k, positions, sel;
  ops::BlockIndexer indexer;
};

// The device kernels against the CPU reference on the device's own inputs (one layer):
// sel_differ: (row, head) pairs whose CPU indexer pick differs from the device's own;
// out_diff: max |CPU block_sparse_attention - device output|, both reading the selection
// attention used; out_max: max |CPU output| (the scale out_diff is measured against).
struct SparseCheck {
  int64_t pairs = 0, sel_differ = 0;
  double out_diff = 0, out_max = 0;
};

// The hook route-diff and the tests use. record: a host copy of every sparse layer's selection;
// force: records too, then overwrites sel with forced[layer] (same shape); check: also runs
// the SparseCheck on every layer (host copies of the caches: small models only).
class BlockTape final : public BlockSelectHook {
 public:
  std::vector<BlockRecord> seen;    // [layer]
  std::vector<BlockRecord> forced;  // [layer]; empty: record only
  bool check = false;
  std::vector<SparseCheck> checks;  // [layer] when check
  void start() {  // before each forward
    calls = 0;
    seen.clear();
    checks.clear();
  }
  void on_select(int layer, const Tensor& idx_q, const Tensor& idx_k, const Tensor& positions, const ops::BlockIndexer& p,
                 Tensor& sel) override;
  void on_attention(int layer, const SparseAttnCall& c) override;
};

// The scores block_indexer ranks the key blocks of one query row / index head by (+inf for the
// local blocks), recomputed on the host from a record. Assumes the record's forward was one
// sequence from position 0 (its k row j is position j), as route-diff and the tests run it.
std::vector<float> block_scores(const BlockRecord& r, int64_t row, int64_t head);

}  // namespace ts::models
