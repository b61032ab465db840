// LlamaForCausalLM and the architectures that share its layer: Qwen2 (qkv bias), Qwen3
// (per-head q/k RMSNorm), Mistral. GQA or MHA, tied or untied embeddings.
#include <cmath>

#include "models/blocks.h"
#include "ops/graph_hooks.h"
#include "models/rope.h"
#include "models/weights.h"
#include "parallel/comm.h"
#include <spdlog/spdlog.h>

namespace ts::models {
namespace {

// --- hyper-parameters ---------------------------------------------------------------------
struct LlamaParams {
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim;
  float eps;
  bool qk_norm, qkv_bias, tied;
};

LlamaParams llama_params(const io::ModelConfig& c) {
  LlamaParams p;
  p.vocab = c.vocab_size;
  p.hidden = c.hidden_size;
  p.inter = c.intermediate_size;
  p.layers = c.num_layers;
  p.heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.eps = float(c.rms_norm_eps);
  p.qk_norm = c.architecture == "Qwen3ForCausalLM";
  p.qkv_bias = c.architecture == "Qwen2ForCausalLM" || c.attention_bias;
  p.tied = c.tie_word_embeddings;
  TS_CHECK(p.inter > 0, "{}: missing field intermediate_size", c.path);
  TS_CHECK(!c.mlp_bias, "{}: mlp_bias=true is not supported", c.path);
  c.require_silu_mlp();
  TS_CHECK(c.partial_rotary_factor == 1.0, "{}: partial_rotary_factor != 1 is not supported for {}", c.path, c.architecture);
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct LlamaLayer {
  Tensor input_norm, post_norm;
  AttentionWeights attn;
  MlpWeights mlp;
};

class Llama final : public DecoderModel {
 public:
  Llama(const io::ModelConfig& cfg, const LoadOptions& opts) : DecoderModel(cfg, opts.device), p_(llama_params(cfg)) {
    capture_layers_ = opts.capture_layers;
    mapping_ = opts.mapping;
    comm_ = opts.comm;
    groups_ = opts.groups;
    const int tp = mapping_.tp_size, rank = mapping_.tp_rank;
    TS_CHECK(tp == 1 || (comm_ && comm_->size() == tp && comm_->rank() == rank), "{}: communicator does not match {}",
             cfg.path, mapping_.str());
    check_sharded_load(cfg, opts);
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    wl.set_simulate_w8a8(opts.simulate_w8a8);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim;
    // This rank's shard (the whole model at tp 1): q/kv heads, MLP columns, vocabulary rows.
    const parallel::HeadShard hs = parallel::shard_heads(p_.heads, p_.kv_heads, mapping_.attn_tp, rank);
    const parallel::Range ir = parallel::even_shard(p_.inter, mapping_.dense_tp, mapping_.dense_tp_rank, "intermediate_size");
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    EmbedHead eh = load_embed_head(wl, p_.vocab, H, p_.tied, tp, rank, embed_tp_);
    embed_ = eh.embed;
    head_ = eh.head;
    embed_start_ = eh.embed_start;
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      LlamaLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      L.attn = load_attention_shard(wl, pre, H, p_.heads, p_.kv_heads, hd, p_.qkv_bias, p_.qk_norm, hs);
      L.attn.window = cfg.window_of(l);  // Mistral, Qwen2/3 sliding layers
      L.mlp = load_mlp_shard(wl, pre + "mlp.", H, p_.inter, ir);
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(hd), cfg.max_position_embeddings, table, false, device_);
    shape_ = {hs.q.count, hs.kv.count, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
    for (int c : capture_layers_)
      TS_CHECK(c >= 0 && c <= p_.layers, "capture layer {} outside 0..{}", c, p_.layers);
    if (tp > 1 && rank == 0) {
      const size_t es = dtype_size(dtype_);
      spdlog::info("tensor parallel: {}; attention {} q / {} kv heads per GPU{}; embedding {} ({:.1f} MiB per GPU; "
                   "vocab-parallel {:.1f} MiB, replicated {:.1f} MiB)",
                   mapping_.str(), hs.q.count, hs.kv.count, hs.kv_replicated ? " (kv heads replicated)" : "",
                   embed_tp_ > 1 ? "vocab-parallel" : "replicated",
                   double(parallel::embed_bytes_per_gpu(p_.vocab, H, embed_tp_, es)) / double(1 << 20),
                   double(parallel::embed_bytes_per_gpu(p_.vocab, H, tp, es)) / double(1 << 20),
                   double(parallel::embed_bytes_per_gpu(p_.vocab, H, 1, es)) / double(1 << 20));
    }
  }

  KvSpec kv_spec() const override {
    return {int(p_.layers), int(shape_.num_kv_heads), int(p_.head_dim), int(shape_.num_kv_heads), int(p_.head_dim)};
  }
  EmbedLayout embed_layout() const override { return {embed_tp_, embed_start_, embed_.size(0)}; }

  // --- forward ------------------------------------------------------------------------------
  // One forward at every TP size: at tp > 1 the o_proj / down_proj outputs are partial sums,
  // reduced with the next residual add + norm inside decoder_forward (DecoderTp).
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    if (mapping_.world == 1 && ops::fuses_norm_gemv(device_, b.num_tokens))  // decode rows (#22)
      return dense_decoder_forward_fused(*this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
                                         [&](int64_t l, Tensor& residual) {
                                           LlamaLayer& L = layers_[size_t(l)];
                                           attention_block_residual(residual, L.input_norm, p_.eps, L.attn, shape_,
                                                                    rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_);
                                           mlp_block_residual(residual, L.post_norm, p_.eps, L.mlp, ws_);
                                         });
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) {
          attention_block(h, layers_[size_t(l)].attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, x);
        },
        [&](int64_t l, Tensor& x, Tensor& y) {
          return dense_mlp(groups_.get(), span_, x, y, ws_,
                           [&](const Tensor& in, Tensor& out) { mlp_block(in, layers_[size_t(l)].mlp, ws_, out); });
        },
        DecoderTp{comm_.get(), embed_tp_, embed_start_, mapping_.tp_size, p_.vocab});
  }

 private:
  LlamaParams p_;
  std::shared_ptr<parallel::Comm> comm_;
  std::shared_ptr<const parallel::ParallelGroups> groups_;  // null in a world of one
  parallel::SpanGather span_;                               // dense TP spanning attention groups
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<LlamaLayer> layers_;
  ops::Rope rope_;
  AttentionShape shape_{};
};

}  // namespace

std::unique_ptr<Model> make_llama(const io::ModelConfig& c, const LoadOptions& o) { return std::make_unique<Llama>(c, o); }

}  // namespace ts::models
