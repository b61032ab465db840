// Qwen3MoeForCausalLM: the Qwen3 attention layer (GQA, per-head q/k RMSNorm) with a softmax
// top-k mixture of experts on the sparse layers; dense MLP layers are those listed in
// mlp_only_layers or off the decoder_sparse_step grid.
#include <algorithm>
#include <cmath>

#include "models/moe.h"
#include "models/rope.h"
#include "ops/graph_hooks.h"
#include "models/weights.h"
#include "parallel/world.h"

namespace ts::models {
namespace {

// --- hyper-parameters ---------------------------------------------------------------------
struct Qwen3MoeParams {
  int64_t vocab, hidden, inter, moe_inter, layers, heads, kv_heads, head_dim, experts;
  float eps;
  bool tied, qkv_bias;
  ops::MoeRouting routing;
  std::vector<uint8_t> sparse;  // per layer: MoE (1) or dense MLP (0)
};

Qwen3MoeParams qwen3_moe_params(const io::ModelConfig& c) {
  Qwen3MoeParams p;
  p.vocab = c.vocab_size;
  p.hidden = c.hidden_size;
  p.inter = c.intermediate_size;
  p.layers = c.num_layers;
  p.heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.eps = float(c.rms_norm_eps);
  p.tied = c.tie_word_embeddings;
  p.qkv_bias = c.attention_bias;
  p.experts = c.has("num_experts") ? c.require<int64_t>("num_experts") : c.get<int64_t>("num_local_experts", 0);
  p.moe_inter = c.require<int64_t>("moe_intermediate_size");
  p.routing.scoring = ops::MoeScoring::softmax;
  p.routing.top_k = c.require<int>("num_experts_per_tok");
  p.routing.renormalize = c.get<bool>("norm_topk_prob", false);
  auto mlp_only = c.get<std::vector<int64_t>>("mlp_only_layers", {});
  int64_t step = c.get<int64_t>("decoder_sparse_step", 1);
  TS_CHECK(step >= 1, "{}: decoder_sparse_step must be >= 1", c.path);
  for (int64_t l = 0; l < p.layers; ++l) {
    bool dense = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
    p.sparse.push_back(!dense && p.experts > 0 && (l + 1) % step == 0);
  }
  TS_CHECK(!c.mlp_bias, "{}: mlp_bias=true is not supported", c.path);
  c.require_silu_mlp();
  TS_CHECK(c.partial_rotary_factor == 1.0, "{}: partial_rotary_factor != 1 is not supported for {}", c.path,
           c.architecture);
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct Qwen3MoeLayer {
  Tensor input_norm, post_norm;
  AttentionWeights attn;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // sparse layers
};

class Qwen3Moe final : public DecoderModel {
 public:
  Qwen3Moe(const io::ModelConfig& cfg, const LoadOptions& opts) : DecoderModel(cfg, opts.device), p_(qwen3_moe_params(cfg)) {
    capture_layers_ = opts.capture_layers;
    mapping_ = opts.mapping;
    comm_ = opts.comm;
    groups_ = opts.groups;
    check_sharded_load(cfg, opts);
    const int tp = mapping_.tp_size, rank = mapping_.tp_rank;
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    wl.set_simulate_w8a8(opts.simulate_w8a8);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim;
    // This rank's shard: attention heads (attention TP), dense MLP columns (dense TP), experts
    // (EP: whole experts [er]; MoE TP: every expert's intermediate rows [mr]).
    const parallel::HeadShard hs = parallel::shard_heads(p_.heads, p_.kv_heads, mapping_.attn_tp, rank);
    const parallel::Range er = parallel::expert_range(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    const parallel::Range mr = parallel::even_shard(p_.moe_inter, mapping_.moe_tp, mapping_.moe_tp_rank,
                                                    "moe_intermediate_size");
    if (mapping_.world > 1) moe_par_ = std::make_unique<parallel::MoeParallel>(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    EmbedHead eh = load_embed_head(wl, p_.vocab, H, p_.tied, tp, rank, embed_tp_);
    embed_ = eh.embed;
    head_ = eh.head;
    embed_start_ = eh.embed_start;
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      Qwen3MoeLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      L.attn = load_attention_shard(wl, pre, H, p_.heads, p_.kv_heads, hd, p_.qkv_bias, /*qk_norm=*/true, hs);
      L.attn.window = cfg.window_of(l);
      if (p_.sparse[size_t(l)]) {
        L.moe.router = wl.load(pre + "mlp.gate.weight", {p_.experts, H});  // replicated
        load_experts_shard(wl, pre + "mlp.experts", p_.experts, p_.moe_inter, H, er, mr, L.moe);
      } else {
        TS_CHECK(p_.inter > 0, "{}: missing field intermediate_size", cfg.path);
        const parallel::Range ir =
            parallel::even_shard(p_.inter, mapping_.dense_tp, mapping_.dense_tp_rank, "intermediate_size");
        L.mlp = load_mlp_shard(wl, pre + "mlp.", H, p_.inter, ir);
      }
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(hd), cfg.max_position_embeddings, table, false, device_);
    shape_ = {hs.q.count, hs.kv.count, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
    moe_shape_.routing = p_.routing;
    for (int c : capture_layers_)
      TS_CHECK(c >= 0 && c <= p_.layers, "capture layer {} outside 0..{}", c, p_.layers);
  }

  KvSpec kv_spec() const override {
    KvSpec s;
    s.num_layers = int(p_.layers);
    s.k_heads = s.v_heads = int(shape_.num_kv_heads);
    s.k_dim = s.v_dim = int(p_.head_dim);
    return s;
  }

  // --- forward ------------------------------------------------------------------------------
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) {
          attention_block(h, layers_[size_t(l)].attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, x);
        },
        [&](int64_t l, Tensor& x, Tensor& y) {
          // true: y is a partial sum over the attention TP group (reduced with the next norm).
          if (!p_.sparse[size_t(l)])
            return dense_mlp(groups_.get(), span_, x, y, ws_,
                             [&](const Tensor& in, Tensor& out) { mlp_block(in, layers_[size_t(l)].mlp, ws_, out); });
          if (!moe_par_) {
            moe_block(x, layers_[size_t(l)].moe, moe_shape_, ws_, y);
            return true;
          }
          return moe_block_parallel(x, layers_[size_t(l)].moe, moe_shape_, *groups_, *moe_par_, ws_, y);
        },
        DecoderTp{comm_.get(), embed_tp_, embed_start_, mapping_.tp_size, p_.vocab});
  }

  EmbedLayout embed_layout() const override { return {embed_tp_, embed_start_, embed_.size(0)}; }

 private:
  Qwen3MoeParams p_;
  std::shared_ptr<parallel::Comm> comm_;
  std::shared_ptr<const parallel::ParallelGroups> groups_;
  std::unique_ptr<parallel::MoeParallel> moe_par_;  // world > 1: this rank's experts
  parallel::SpanGather span_;                        // dense TP spanning attention groups
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<Qwen3MoeLayer> layers_;
  ops::Rope rope_;
  AttentionShape shape_{};
  MoeShape moe_shape_;
};

}  // namespace

std::unique_ptr<Model> make_qwen3_moe(const io::ModelConfig& c, const LoadOptions& o) {
  return std::make_unique<Qwen3Moe>(c, o);
}

}  // namespace ts::models
