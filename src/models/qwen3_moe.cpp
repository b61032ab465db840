// Qwen3MoeForCausalLM: the Qwen3 attention layer (GQA, per-head q/k RMSNorm) with a softmax
// top-k mixture of experts on the sparse layers; dense MLP layers are those listed in
// mlp_only_layers or off the decoder_sparse_step grid.
#include <algorithm>
#include <cmath>

#include "models/moe.h"
#include "models/rope.h"
#include "ops/graph_hooks.h"
#include "models/weights.h"

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
  TS_CHECK(c.partial_rotary_factor == 1.0, "{}: partial_rotary_factor != 1 is not supported for {}", c.path,
           c.architecture);
  TS_CHECK(!c.get<bool>("use_sliding_window", false), "{}: sliding-window attention is not supported", c.path);
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
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim, qw = p_.heads * hd, kw = p_.kv_heads * hd;
    embed_ = wl.load("model.embed_tokens.weight", {p_.vocab, H});
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      Qwen3MoeLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      L.attn.qkv = wl.load_stacked({pre + "self_attn.q_proj.weight", pre + "self_attn.k_proj.weight", pre + "self_attn.v_proj.weight"},
                                   {{qw, H}, {kw, H}, {kw, H}});
      if (p_.qkv_bias)
        L.attn.qkv_bias = wl.load_stacked({pre + "self_attn.q_proj.bias", pre + "self_attn.k_proj.bias", pre + "self_attn.v_proj.bias"},
                                          {{qw}, {kw}, {kw}});
      L.attn.o = wl.load(pre + "self_attn.o_proj.weight", {H, qw});
      L.attn.q_norm = wl.load(pre + "self_attn.q_norm.weight", {hd});
      L.attn.k_norm = wl.load(pre + "self_attn.k_norm.weight", {hd});
      if (p_.sparse[size_t(l)]) {
        L.moe.router = wl.load(pre + "mlp.gate.weight", {p_.experts, H});
        load_experts(wl, pre + "mlp.experts", p_.experts, p_.moe_inter, H, L.moe);
      } else {
        TS_CHECK(p_.inter > 0, "{}: missing field intermediate_size", cfg.path);
        L.mlp.gate_up = wl.load_stacked({pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"}, {{p_.inter, H}, {p_.inter, H}});
        L.mlp.down = wl.load(pre + "mlp.down_proj.weight", {H, p_.inter});
      }
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    head_ = (p_.tied && !wl.has("lm_head.weight")) ? embed_ : wl.load("lm_head.weight", {p_.vocab, H});
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(hd), cfg.max_position_embeddings, table, false, device_);
    shape_ = {p_.heads, p_.kv_heads, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
    moe_shape_.routing = p_.routing;
    for (int c : capture_layers_)
      TS_CHECK(c >= 0 && c <= p_.layers, "capture layer {} outside 0..{}", c, p_.layers);
  }

  KvSpec kv_spec() const override {
    KvSpec s;
    s.num_layers = int(p_.layers);
    s.k_heads = s.v_heads = int(p_.kv_heads);
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
          if (p_.sparse[size_t(l)]) moe_block(x, layers_[size_t(l)].moe, moe_shape_, ws_, y);
          else mlp_block(x, layers_[size_t(l)].mlp, ws_, y);
        });
  }

 private:
  Qwen3MoeParams p_;
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
