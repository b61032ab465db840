// ModelRunner: owns the model, its paged KV pool and the per-step host/device metadata
// buffers; turns a list of sequence chunks into a ForwardBatch and runs the forward.
// Engine-thread only.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "core/device_memory.h"
#include "models/model.h"
#include "models/forward_batch.h"
#include "ops/logits_proc.h"
#include "runtime/slot_pool.h"

namespace ts {

// One sequence's share of a step: `num_tokens` new tokens starting at position `start_pos`
// (the tokens before it are already in the cache through `block_table`).
struct SeqChunk {
  const int32_t* tokens = nullptr;
  int num_tokens = 0;
  int start_pos = 0;
  const std::vector<int32_t>* block_table = nullptr;
  // Logits wanted: none, the last row, or every row (verify, verify-golden).
  enum class Logits { none, last, all } logits = Logits::last;
  // Recurrent-state row of the sequence (hybrid models: required; from ModelRunner::take_state_slot).
  int state_slot = -1;
};

// Turns sequence chunks into a ForwardBatch on `device`; the host staging vectors are reused
// every step (they only grow).
// Padding (CUDA-graph buckets): the batch is padded to pad_tokens rows and pad_seqs sequences;
// table_width fixes the block-table row length; max_kv_bound is an upper bound on kv lengths
// for kernels whose grid must not change between replays.
struct BuildOptions {
  int pad_tokens = 0, pad_seqs = 0, table_width = 0, max_kv_bound = 0;
  bool all_logits = false;  // logits for every (padded) row, as a decode graph computes them
  size_t reserve = 0;       // device buffer capacity in i32 elements (graphs: the largest bucket)
};

// Told just before a step's first device work is enqueued (its batch metadata upload): the
// engine's idle clock marks the device step's start there, so the host time spent resolving and
// building the batch -- during which the GPU has nothing of this step -- counts as idle.
class StepStartListener {
 public:
  virtual void step_device_start() = 0;

 protected:
  ~StepStartListener() = default;
};

class BatchBuilder {
 public:
  // The listener slot (a ModelRunner's) told before each device upload; null: none.
  void set_start_listener(StepStartListener* const* slot) { listener_ = slot; }
  void build(const std::vector<SeqChunk>& chunks, int block_size, Device device, ForwardBatch& batch,
             const BuildOptions& opt = {});
  // Row of the batch where chunk i starts (valid after build).
  int chunk_row(size_t i) const { return cu_rows_[i]; }
  // i32 elements of one step's metadata buffer for T tokens, S sequences, table width W
  // (device buffers reserved for CUDA graphs must hold the largest bucket's).
  static size_t buffer_elems(size_t T, size_t S, size_t W) { return 4 * T + 3 * S + 1 + S * W; }
  // Attention data parallelism: the chunks' block ids are global (KvCache's DP partitions); this
  // rank's pool holds the ids from `base` on, so every id is written as id - base.
  void set_block_base(int32_t base) { block_base_ = base; }

 private:
  int32_t block_base_ = 0;
  StepStartListener* const* listener_ = nullptr;
  std::vector<int32_t> host_, cu_rows_;
  Tensor dev_, base_;
  std::unique_ptr<StagedUpload> up_;  // CUDA: asynchronous pinned upload
};

class CudaGraphRunner;
class DeviceLogits;
class TokenMaskBuffer;
struct StepMasks;
struct GraphOptions;
class TpWorkers;
class StepChannel;

class ModelRunner {
 public:
  // state_slots: recurrent-state rows for hybrid models (sequences in flight at once; 0: a
  // default of 16; ignored for models without recurrent layers). kv_dtype: the paged K/V
  // cache's element type (nullopt: the model's dtype; f8_e4m3: --kv-cache-dtype fp8, which
  // check_kv_dtype must have accepted for this model).
  ModelRunner(std::shared_ptr<models::Model> model, int64_t num_blocks, int block_size, int state_slots = 0,
              std::optional<DType> kv_dtype = std::nullopt);
  // Bytes of KV cache one token takes in every layer (k, v and aux caches).
  static size_t kv_bytes_per_token(const models::Model& m, std::optional<DType> kv_dtype = std::nullopt);
  // The cache dtype of --kv-cache-dtype NAME (auto | bf16 | fp8 | fp8_e4m3) for this model;
  // an error naming the flag where the model or device cannot store it. auto and bf16 keep the
  // model's dtype (bf16 on CUDA, f32 on the CPU oracle).
  static DType check_kv_dtype(const std::string& name, const models::Model& m);
  DType kv_dtype() const { return kv_.k.empty() ? model_->dtype() : kv_.k[0].dtype; }
  models::Model& model() { return *model_; }
  const std::shared_ptr<models::Model>& model_ptr() const { return model_; }
  KvPool& kv() { return kv_; }
  int block_size() const { return kv_.block_size; }
  int64_t num_blocks() const { return kv_.num_blocks; }
  // Hybrid models: every sequence needs a recurrent-state row, held from its first chunk until
  // it ends (the row is zeroed by the model whenever the sequence starts at position 0).
  bool has_state() const { return kv_.num_state_slots > 0; }
  std::shared_ptr<const int> take_state_slot() { return state_pool_.take(); }
  const SlotPool& state_pool() const { return state_pool_; }
  size_t state_bytes() const { return state_bytes_; }
  ~ModelRunner();
  // Runs one step. Returns f32 logits, one row per requested logits row, in chunk order — on
  // the host, or with host_logits=false on the model's device. Either way they live in buffers
  // the next run() reuses (host: one pinned buffer): copy them to keep them.
  // With capture, aux hidden states of all rows are kept in last_aux().
  const Tensor& run(const std::vector<SeqChunk>& chunks, bool capture_aux = false, bool host_logits = true);
  // Decode step with sampling inside the CUDA graph (rows[i] samples chunk i); false when no
  // graph applies (then call run() and sample).
  // proc: device logits processing of the rows (runtime/device_logits.h; null: none).
  // masks: the rows' grammar masks (runtime/token_mask.h; null: none), uploaded after the
  // forward was launched and applied before the sampler.
  bool run_sampled(const std::vector<SeqChunk>& chunks, const std::vector<ops::SamplingRow>& rows, std::vector<int32_t>& ids,
                   const std::vector<ops::LogitsProcRow>* proc = nullptr, const StepMasks* masks = nullptr);
  // The grammar mask rows of a step (runtime/token_mask.h): created on first use with at least
  // `rows` rows (the engine asks for --max-num-seqs before the decode graphs capture it); it
  // grows only until the graphs captured it.
  TokenMaskBuffer* token_mask(int64_t rows = 0);
  TokenMaskBuffer* token_mask_if_any() { return token_mask_.get(); }
  // Device logits processing (penalties, logit_bias, min_tokens) for a CUDA model: created on
  // first use, or before the decode graphs are captured (they replay its kernels); null on the CPU.
  DeviceLogits* logits_proc();
  DeviceLogits* logits_proc_if_any() { return logits_proc_.get(); }
  // Greedy step without logits (every logits row greedy, no logprobs, penalties or logits
  // processing: runtime/sampler.h greedy_without_logits): ids[i] = argmax of logits row i. On
  // CUDA the LM head and the argmax are one launch where it fuses (1-2 rows; decode graphs of
  // batch 1 and 2 capture it), else logits + argmax on the device. False (nothing done) where it
  // does not apply (CPU, tensor parallel, multi-node): call run() and sample.
  bool run_greedy(const std::vector<SeqChunk>& chunks, std::vector<int32_t>& ids);
  // Captures CUDA graphs (decode buckets, breakable prefill buckets); see cuda_graph_runner.h.
  void enable_graphs(const GraphOptions& o);
  const CudaGraphRunner* graphs() const { return graphs_.get(); }
  // The persistent [rows, n_capture * H] aux buffer (grows only outside graph capture).
  Tensor aux_buffer(int64_t rows);
  const Tensor& last_aux() const { return batch_.aux_hidden; }  // device, model dtype
  const BatchBuilder& builder() const { return builder_; }
  // Host seconds the last run() spent building and uploading the batch metadata.
  double last_build_seconds() const { return build_s_; }
  // Who is told when a step's device work starts (this runner's batch builds, its graphs'
  // included); null: nobody. Set by the thread that drives the step, before it runs.
  void set_step_listener(StepStartListener* l) { listener_ = l; }
  StepStartListener* const* step_listener_slot() const { return &listener_; }
  // Tells the listener now (device work enqueued before the batch build: seeding logits slots).
  void step_device_start() {
    if (listener_) listener_->step_device_start();
  }

  // Tensor parallelism: this runner is rank 0 (its model is shard 0, driven by the calling
  // thread); peers[r] (r >= 1, each built on worker r's thread) hold the other shards. run()
  // and enable_graphs() then drive every rank at once (same chunks, each rank building its own
  // batch on its GPU) and return rank 0's results.
  // Attention data parallelism (the shards' mapping has attn_dp > 1; one node, CPU ranks): every
  // rank's pool holds num_blocks() blocks of its DP group, the chunks' block ids are global
  // (KvCache with dp_groups() groups of num_blocks() blocks) and say each chunk's group; run()
  // gives every rank its group's chunks (a group without any runs a zero-token forward: the MoE
  // collectives need every rank) and returns the logits of all chunks in chunk order, each from
  // its group's first rank. last_aux() is rank 0's: group 0's rows only.
  void attach_tp(std::shared_ptr<TpWorkers> workers, std::vector<std::unique_ptr<ModelRunner>> peers);
  int tp_size() const;
  int dp_groups() const { return dp_groups_; }
  ModelRunner* peer(int rank) { return rank == 0 ? this : peers_.at(size_t(rank)).get(); }
  const std::shared_ptr<TpWorkers>& tp_workers() const { return tp_; }
  // Multi-node, node 0 (node_link.h): every run() first sends its chunks to the worker nodes.
  void set_step_channel(std::shared_ptr<StepChannel> ch) { channel_ = std::move(ch); }

 private:
  std::shared_ptr<models::Model> model_;
  KvPool kv_;
  SlotPool state_pool_;
  size_t state_bytes_ = 0;
  ForwardBatch batch_;
  BatchBuilder builder_;
  Tensor logits_, aux_buf_;
  Tensor greedy_ids_, greedy_scratch_;  // run_greedy's device ids (grow-only) and argmax scratch (zeroed)
  std::shared_ptr<void> host_buf_;  // host logits (pinned where a GPU is present), reused
  size_t host_cap_ = 0;
  double build_s_ = 0;
  StepStartListener* listener_ = nullptr;
  std::unique_ptr<CudaGraphRunner> graphs_;
  std::unique_ptr<DeviceLogits> logits_proc_;
  std::unique_ptr<TokenMaskBuffer> token_mask_;
  bool token_mask_frozen_ = false;  // captured by decode graphs: never reallocated
  std::shared_ptr<TpWorkers> tp_;
  std::vector<std::unique_ptr<ModelRunner>> peers_;  // index = rank; [0] empty
  std::shared_ptr<StepChannel> channel_;             // multi-node node 0 (null: one node)
  const Tensor& run_local(const std::vector<SeqChunk>& chunks, bool capture_aux, bool host_logits);
  const Tensor& run_dp(const std::vector<SeqChunk>& chunks, bool capture_aux);
  int dp_groups_ = 1, dp_attn_tp_ = 1;
  std::vector<SeqChunk> dp_chunks_;  // this rank's group's chunks of the step (reused)
  std::vector<int64_t> dp_cursor_;   // rank 0: next logits row of each group's first rank
  Tensor dp_logits_;                 // rank 0: host logits of every group, grow-only
  void enable_graphs_local(const GraphOptions& o);
  Tensor to_host(const Tensor& logits);
};

}  // namespace ts
