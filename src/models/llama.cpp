// LlamaForCausalLM and the architectures that share its layer: Qwen2 (qkv bias), Qwen3
// (per-head q/k RMSNorm), Mistral. GQA or MHA, tied or untied embeddings.
#include <cmath>

#include "models/blocks.h"
#include "ops/graph_hooks.h"
#include "models/rope.h"
#include "models/weights.h"

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
  TS_CHECK(c.partial_rotary_factor == 1.0, "{}: partial_rotary_factor != 1 is not supported for {}", c.path, c.architecture);
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct LlamaLayer {
  Tensor input_norm, post_norm;
  AttentionWeights attn;
  MlpWeights mlp;
};

class Llama final : public Model {
 public:
  Llama(const io::ModelConfig& cfg, const LoadOptions& opts) : cfg_(cfg), p_(llama_params(cfg)), ws_(opts.device) {
    capture_layers_ = opts.capture_layers;
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim, qw = p_.heads * hd, kw = p_.kv_heads * hd;
    embed_ = wl.load("model.embed_tokens.weight", {p_.vocab, H});
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      LlamaLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      L.attn.qkv = wl.load_stacked({pre + "self_attn.q_proj.weight", pre + "self_attn.k_proj.weight", pre + "self_attn.v_proj.weight"},
                                   {{qw, H}, {kw, H}, {kw, H}});
      if (p_.qkv_bias)
        L.attn.qkv_bias = wl.load_stacked({pre + "self_attn.q_proj.bias", pre + "self_attn.k_proj.bias", pre + "self_attn.v_proj.bias"},
                                          {{qw}, {kw}, {kw}});
      L.attn.o = wl.load(pre + "self_attn.o_proj.weight", {H, qw});
      if (p_.qk_norm) {
        L.attn.q_norm = wl.load(pre + "self_attn.q_norm.weight", {hd});
        L.attn.k_norm = wl.load(pre + "self_attn.k_norm.weight", {hd});
      }
      L.mlp.gate_up = wl.load_stacked({pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"}, {{p_.inter, H}, {p_.inter, H}});
      L.mlp.down = wl.load(pre + "mlp.down_proj.weight", {H, p_.inter});
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    // Tied checkpoints usually omit lm_head.weight; some ship it anyway (then it must match).
    head_ = (p_.tied && !wl.has("lm_head.weight")) ? embed_ : wl.load("lm_head.weight", {p_.vocab, H});
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(hd), cfg.max_position_embeddings, table, false, device_);
    shape_ = {p_.heads, p_.kv_heads, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
    for (int c : capture_layers_)
      TS_CHECK(c >= 0 && c <= p_.layers, "capture layer {} outside 0..{}", c, p_.layers);
  }

  const io::ModelConfig& config() const override { return cfg_; }
  KvSpec kv_spec() const override {
    return {int(p_.layers), int(p_.kv_heads), int(p_.head_dim), int(p_.kv_heads), int(p_.head_dim)};
  }
  Device device() const override { return device_; }
  DType dtype() const override { return dtype_; }
  Tensor embed_table() const override { return embed_; }
  Tensor lm_head() const override { return head_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  Workspace* workspace() override { return &ws_; }

  // --- forward ------------------------------------------------------------------------------
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    ws_.reset();
    const int64_t T = b.num_tokens, H = p_.hidden;
    Tensor residual = ws_.alloc({T, H}, dtype_);
    Tensor x = ws_.alloc({T, H}, dtype_);  // sub-layer output, then its normed sum
    Tensor h = ws_.alloc({T, H}, dtype_);
    Tensor y = ws_.alloc({T, H}, dtype_);  // ping-pong with x across layers
    ops::embedding(b.input_ids, embed_, residual);
    ops::graph_segment_begin();  // the embedding stays outside the captured region
    for (int64_t l = 0; l < p_.layers; ++l) {
      LlamaLayer& L = layers_[size_t(l)];
      if (l == 0) {
        capture_aux(b, residual, capture_slot(0));
        ops::rmsnorm(residual, L.input_norm, p_.eps, h);
      } else {
        ops::fused_add_rmsnorm(x, residual, L.input_norm, p_.eps);  // residual = input of layer l
        capture_aux(b, residual, capture_slot(int(l)));
        h = x;
      }
      attention_block(h, L.attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, x);
      ops::fused_add_rmsnorm(x, residual, L.post_norm, p_.eps);
      mlp_block(x, L.mlp, ws_, y);
      std::swap(x, y);
    }
    ops::add_inplace(residual, x);  // the final residual stream
    capture_aux(b, residual, capture_slot(int(p_.layers)));
    return lm_head_logits(b, residual, norm_, p_.eps, head_, ws_);
  }

 private:
  int capture_slot(int layer) const {
    for (size_t i = 0; i < capture_layers_.size(); ++i)
      if (capture_layers_[i] == layer) return int(i);
    return -1;
  }

  io::ModelConfig cfg_;
  LlamaParams p_;
  Workspace ws_;
  Device device_ = Device::cpu;
  DType dtype_ = DType::f32;
  Tensor embed_, norm_, head_;
  std::vector<LlamaLayer> layers_;
  ops::Rope rope_;
  AttentionShape shape_{};
  size_t weight_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_llama(const io::ModelConfig& c, const LoadOptions& o) { return std::make_unique<Llama>(c, o); }

}  // namespace ts::models
