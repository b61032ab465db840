// The model interface. One file per architecture (llama.cpp covers Llama, Qwen2, Qwen3,
// Mistral), each in three parts: hyper-parameters, tensors, forward built from shared blocks.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/workspace.h"
#include "io/config.h"
#include "parallel/mapping.h"
#include "models/forward_batch.h"

namespace ts::parallel {
class Comm;
struct ParallelGroups;
}

namespace ts::models {

// What one layer's KV-cache entry looks like (per token).
struct KvSpec {
  int num_layers = 0;
  int k_heads = 0, k_dim = 0;  // k cache: [blocks, block_size, k_heads, k_dim]
  int v_heads = 0, v_dim = 0;  // v cache (0 heads: none, as in MLA)
  size_t bytes_per_token(DType dt) const {
    return size_t(num_layers) * (size_t(k_heads) * k_dim + size_t(v_heads) * v_dim) * dtype_size(dt);
  }
};

// Optional third per-token cache, paged like k/v: `heads` x `dim` per token on the layers
// flagged in `layers` (MiniMax-M3: the lightning indexer's keys on its sparse layers).
struct AuxKvSpec {
  int heads = 0, dim = 0;
  std::vector<uint8_t> layers;  // per layer: has the cache (1) or not (0)
  bool on(int layer) const { return heads > 0 && size_t(layer) < layers.size() && layers[size_t(layer)]; }
  size_t bytes_per_token(DType dt) const {
    size_t n = 0;
    for (size_t l = 0; l < layers.size(); ++l) n += on(int(l)) ? size_t(heads) * dim : 0;
    return n * dtype_size(dt);
  }
};

// Per-sequence recurrent state of hybrid models' linear-attention layers (Gated DeltaNet), kept
// in state slots (rows indexed by ForwardBatch::state_slots), not in paged blocks: on each
// flagged layer a conv window [conv_len, conv_dim] (the last kernel - 1 inputs of the short
// conv) and a recurrent matrix per head [heads, k_dim, v_dim] (always f32).
struct StateSpec {
  std::vector<uint8_t> layers;  // per layer: has state (1) or not (0)
  int conv_dim = 0, conv_len = 0;
  int heads = 0, k_dim = 0, v_dim = 0;
  bool any() const {
    for (auto v : layers)
      if (v) return true;
    return false;
  }
  bool on(int layer) const { return size_t(layer) < layers.size() && layers[size_t(layer)]; }
  size_t bytes_per_slot(DType conv_dt) const {
    size_t n = 0;
    for (size_t l = 0; l < layers.size(); ++l)
      if (layers[l])
        n += size_t(conv_len) * conv_dim * dtype_size(conv_dt) + size_t(heads) * k_dim * v_dim * sizeof(float);
    return n;
  }
};

struct LoadOptions {
  Device device = Device::cpu;
  std::vector<int> capture_layers;  // EAGLE3: layers whose input residual is captured
  // Tensor parallelism: this rank's place (tp_size 1: the whole model) and its communicator
  // (required when tp_size > 1; used only from this rank's thread).
  parallel::Mapping mapping;
  std::shared_ptr<parallel::Comm> comm;
  // Every group of this rank (attention TP / dense TP / MoE TP / MoE EP; world.h); null at TP 1
  // (then the model uses groups of one). comm == groups->attn_tp when set.
  std::shared_ptr<const parallel::ParallelGroups> groups;
  bool replicate_embedding = false;  // --replicate-embedding: force a replicated table
  // CPU: FP8 linears whose CUDA form takes W8A8 quantize their activations as CUDA does in
  // forwards of ops::kW8A8MinRows rows or more (verify-golden --simulate-w8a8: the oracle of the
  // CUDA W8A8 path; the goldens themselves are of the exact weights).
  bool simulate_w8a8 = false;
};

// How the token embedding table is laid out on this rank: tp_size 1 = replicated (the whole
// vocabulary, no mask, no all-reduce); tp_size > 1 = vocab-parallel (rows [vocab_start,
// vocab_start + rows) of the vocabulary; lookups are masked and all-reduced).
struct EmbedLayout {
  int tp_size = 1;
  int64_t vocab_start = 0, rows = 0;
};

class Model {
 public:
  // Column block of aux_hidden that receives the input of `layer`, or -1 if not captured.
  int capture_slot(int layer) const {
    for (size_t i = 0; i < capture_layers_.size(); ++i)
      if (capture_layers_[i] == layer) return int(i);
    return -1;
  }
  virtual ~Model() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual KvSpec kv_spec() const = 0;
  virtual AuxKvSpec aux_kv_spec() const { return {}; }
  // Recurrent layers (hybrid models): their state cannot be rebuilt from cached KV blocks, so
  // the engine turns prefix reuse off for such models.
  virtual StateSpec state_spec() const { return {}; }
  // Runs one batch and returns logits [num_logits, vocab] (f32, on the model's device) for
  // the rows in batch.logits_index. Writes the batch's K/V into `kv` at batch.slot_mapping.
  virtual Tensor forward(ForwardBatch& batch, KvPool& kv) = 0;
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;  // activation/weight dtype (f32 on cpu, bf16 on cuda)
  // Token embedding table [vocab, H] (EAGLE3 drafts share it) and the LM head [vocab, H].
  virtual Tensor embed_table() const = 0;
  virtual Tensor lm_head() const = 0;
  virtual size_t weight_bytes() const = 0;  // bytes of weights a decode step reads
  // Tensor parallelism (defaults: unsharded).
  virtual const parallel::Mapping& mapping() const { return mapping_; }
  virtual EmbedLayout embed_layout() const { return {1, 0, embed_table().size(0)}; }
  // The forward's scratch arena (CUDA graphs pin its size before capturing).
  virtual Workspace* workspace() { return nullptr; }
  const std::vector<int>& capture_layers() const { return capture_layers_; }

 protected:
  // The embedding's tp size for this model under `m`: vocab-parallel (m.tp_size) by default,
  // replicated (1) when forced; a model whose table is cheap to replicate, or whose lookups
  // should skip the all-reduce, overrides it.
  virtual int resolve_embed(const parallel::Mapping& m, bool force_replicate) const {
    return force_replicate ? 1 : m.tp_size;
  }
  std::vector<int> capture_layers_;
  parallel::Mapping mapping_;
};

// The state every model file keeps (config, device, dtype, scratch arena, embedding, final norm,
// LM head, weight bytes) and the accessors over it; model files derive from this.
class DecoderModel : public Model {
 public:
  const io::ModelConfig& config() const override { return cfg_; }
  Device device() const override { return device_; }
  DType dtype() const override { return dtype_; }
  Tensor embed_table() const override { return embed_; }
  Tensor lm_head() const override { return head_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  Workspace* workspace() override { return &ws_; }

 protected:
  DecoderModel(const io::ModelConfig& cfg, Device device) : cfg_(cfg), ws_(device), device_(device) {}
  io::ModelConfig cfg_;
  Workspace ws_;
  Device device_ = Device::cpu;
  DType dtype_ = DType::f32;
  Tensor embed_, norm_, head_;
  size_t weight_bytes_ = 0;
};

using ModelFactory = std::function<std::unique_ptr<Model>(const io::ModelConfig&, const LoadOptions&)>;

// Architectures register in registry.cpp; load_model picks by config.json's architectures[0].
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& opts);
std::unique_ptr<Model> create_model(const io::ModelConfig& cfg, const LoadOptions& opts);
std::vector<std::string> supported_architectures();
// Whether the config describes a hybrid model with recurrent (linear-attention) layers
// (layer_types lists "linear_attention"), known before any weight is loaded.
bool has_recurrent_layers(const io::ModelConfig& cfg);

}  // namespace ts::models
