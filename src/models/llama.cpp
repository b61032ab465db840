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
    const int tp = mapping_.tp_size, rank = mapping_.tp_rank;
    TS_CHECK(tp == 1 || (comm_ && comm_->size() == tp && comm_->rank() == rank), "{}: communicator does not match {}",
             cfg.path, mapping_.str());
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim, qw = p_.heads * hd, kw = p_.kv_heads * hd;
    // This rank's shard (the whole model at tp 1): q/kv heads, MLP columns, vocabulary rows.
    const parallel::HeadShard hs = parallel::shard_heads(p_.heads, p_.kv_heads, mapping_.attn_tp, rank);
    const parallel::Range ir = parallel::even_shard(p_.inter, mapping_.dense_tp, rank, "intermediate_size");
    const int64_t q0 = hs.q.start * hd, qn = hs.q.count * hd, k0 = hs.kv.start * hd, kn = hs.kv.count * hd;
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    TS_CHECK(embed_tp_ == 1 || embed_tp_ == tp, "{}: embedding tp size {} must be 1 or {}", cfg.path, embed_tp_, tp);
    const parallel::VocabShard ev = parallel::shard_vocab(p_.vocab, embed_tp_, embed_tp_ == 1 ? 0 : rank);
    const parallel::VocabShard hv = parallel::shard_vocab(p_.vocab, tp, rank);
    embed_start_ = ev.start;
    using Part = WeightLoader::Part;
    embed_ = wl.load_parts({Part{"model.embed_tokens.weight", {p_.vocab, H}, 0, ev.start, ev.count}});
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      LlamaLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      L.attn.qkv = wl.load_parts({Part{pre + "self_attn.q_proj.weight", {qw, H}, 0, q0, qn},
                                  Part{pre + "self_attn.k_proj.weight", {kw, H}, 0, k0, kn},
                                  Part{pre + "self_attn.v_proj.weight", {kw, H}, 0, k0, kn}});
      if (p_.qkv_bias)
        L.attn.qkv_bias = wl.load_parts({Part{pre + "self_attn.q_proj.bias", {qw}, 0, q0, qn},
                                         Part{pre + "self_attn.k_proj.bias", {kw}, 0, k0, kn},
                                         Part{pre + "self_attn.v_proj.bias", {kw}, 0, k0, kn}});
      L.attn.o = wl.load_parts({Part{pre + "self_attn.o_proj.weight", {H, qw}, 1, q0, qn}});
      if (p_.qk_norm) {
        L.attn.q_norm = wl.load(pre + "self_attn.q_norm.weight", {hd});
        L.attn.k_norm = wl.load(pre + "self_attn.k_norm.weight", {hd});
      }
      // Column-parallel gate|up: this shard's gate rows, then its up rows.
      L.mlp.gate_up = wl.load_parts({Part{pre + "mlp.gate_proj.weight", {p_.inter, H}, 0, ir.start, ir.count},
                                     Part{pre + "mlp.up_proj.weight", {p_.inter, H}, 0, ir.start, ir.count}});
      L.mlp.down = wl.load_parts({Part{pre + "mlp.down_proj.weight", {H, p_.inter}, 1, ir.start, ir.count}});
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    // Tied checkpoints usually omit lm_head.weight; some ship it anyway (then it must match).
    // The LM head is vocab-parallel at tp > 1 (a shard of the tied table when the embedding is
    // replicated).
    const std::string head_name = (p_.tied && !wl.has("lm_head.weight")) ? "model.embed_tokens.weight" : "lm_head.weight";
    if (head_name == "model.embed_tokens.weight" && ev.start == hv.start && ev.count == hv.count) head_ = embed_;
    else if (head_name == "model.embed_tokens.weight" && embed_tp_ == 1) head_ = embed_.narrow(0, hv.start, hv.count);
    else head_ = wl.load_parts({Part{head_name, {p_.vocab, H}, 0, hv.start, hv.count}});
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
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    if (mapping_.tp_size > 1) return forward_tp(b, kv);
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) {
          attention_block(h, layers_[size_t(l)].attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, x);
        },
        [&](int64_t l, Tensor& x, Tensor& y) { mlp_block(x, layers_[size_t(l)].mlp, ws_, y); });
  }

  // Tensor-parallel forward: every rank runs it on its shard. Sub-layer outputs of the
  // row-parallel o_proj / down_proj are partial sums; each is all-reduced together with the
  // residual add and the next norm (comm.all_reduce_add_rmsnorm). The vocab-parallel embedding
  // gives partial rows too; its all-reduce is fused into layer 0's norm — only when the table
  // is actually sharded (embed_tp_ > 1); a replicated table needs no all-reduce at all.
  Tensor forward_tp(ForwardBatch& b, KvPool& kv) {
    ws_.reset();
    parallel::Comm& comm = *comm_;
    const int64_t T = b.num_tokens, H = p_.hidden;
    Tensor residual = ws_.alloc({T, H}, dtype_);
    Tensor x = ws_.alloc({T, H}, dtype_);
    Tensor h = ws_.alloc({T, H}, dtype_);
    Tensor y = ws_.alloc({T, H}, dtype_);
    if (embed_tp_ > 1) ops::embedding(b.input_ids, embed_, x, embed_start_);  // partial rows
    else ops::embedding(b.input_ids, embed_, residual);
    ops::graph_segment_begin();
    for (int64_t l = 0; l < p_.layers; ++l) {
      LlamaLayer& L = layers_[size_t(l)];
      if (l == 0) {
        if (embed_tp_ > 1) {
          comm.all_reduce_add_rmsnorm(x, residual, L.input_norm, p_.eps, /*residual_init=*/true);
          h = x;
        } else {
          ops::rmsnorm(residual, L.input_norm, p_.eps, h);
        }
        capture_aux(b, residual, capture_slot(0));
      } else {
        comm.all_reduce_add_rmsnorm(x, residual, L.input_norm, p_.eps, false);  // residual = input of layer l
        capture_aux(b, residual, capture_slot(int(l)));
        h = x;
      }
      attention_block(h, L.attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, y);
      std::swap(x, y);  // x: attention partial sums (h may alias the other buffer)
      comm.all_reduce_add_rmsnorm(x, residual, L.post_norm, p_.eps, false);
      mlp_block(x, L.mlp, ws_, y);
      std::swap(x, y);
    }
    comm.all_reduce(x);
    ops::add_inplace(residual, x);
    capture_aux(b, residual, capture_slot(int(p_.layers)));
    return lm_head_logits_tp(b, residual, norm_, p_.eps, head_, p_.vocab, comm, ws_);
  }

 private:
  LlamaParams p_;
  std::shared_ptr<parallel::Comm> comm_;
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<LlamaLayer> layers_;
  ops::Rope rope_;
  AttentionShape shape_{};
};

}  // namespace

std::unique_ptr<Model> make_llama(const io::ModelConfig& c, const LoadOptions& o) { return std::make_unique<Llama>(c, o); }

}  // namespace ts::models
