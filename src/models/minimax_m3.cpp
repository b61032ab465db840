// MiniMax-M3 text model (MiniMaxM3VLForCausalLM, model_type minimax_m3_vl_text; fields at the top
// level or under text_config). GQA attention with per-head q/k norms and partial RoPE; layers of
// type `minimax_m3_sparse` restrict attention to the key blocks picked by a lightning indexer
// (index_n_heads x index_head_dim scores, max-pooled over blocks of index_block_size keys,
// top index_topk_blocks per query, the index_local_blocks local ones always among them). MLPs are dense or a sigmoid
// top-k MoE with a shared expert, all with the clamped SwiGLU-OAI activation. Every RMSNorm is
// Gemma-style (scale 1 + w); the weights are stored as 1 + w at load.
#include <cmath>

#include "models/block_select.h"
#include "models/moe.h"
#include "models/rope.h"
#include "ops/graph_hooks.h"
#include "models/weights.h"
#include "parallel/world.h"

namespace ts::models {
namespace {

// --- hyper-parameters ---------------------------------------------------------------------
struct MiniMaxM3Params {
  int64_t vocab, hidden, moe_inter, dense_inter, shared_inter, layers, heads, kv_heads, head_dim, experts;
  int64_t rot_dim;
  float eps;
  bool tied;
  ops::GluAct act;
  ops::MoeRouting routing;
  std::vector<uint8_t> sparse_mlp, sparse_attn;  // per layer
  int64_t idx_heads = 0, idx_dim = 0;
  ops::BlockIndexer indexer;
};

MiniMaxM3Params minimax_m3_params(const io::ModelConfig& c) {
  MiniMaxM3Params p;
  p.vocab = c.vocab_size;
  p.hidden = c.hidden_size;
  p.layers = c.num_layers;
  p.heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.eps = float(c.rms_norm_eps);
  p.tied = c.tie_word_embeddings;
  p.experts = c.has("num_local_experts") ? c.require<int64_t>("num_local_experts") : c.get<int64_t>("num_experts", 0);
  p.moe_inter = c.intermediate_size;
  p.dense_inter = c.get<int64_t>("dense_intermediate_size", 0);
  p.shared_inter = c.get<int64_t>("shared_intermediate_size", 0) * c.get<int64_t>("n_shared_experts", 1);
  p.act.kind = ops::GluKind::swiglu_oai;
  p.act.alpha = float(c.get<double>("swiglu_alpha", 1.702));
  p.act.limit = float(c.get<double>("swiglu_limit", 7.0));
  p.routing.scoring = ops::MoeScoring::sigmoid;
  p.routing.top_k = c.require<int>("num_experts_per_tok");
  p.routing.renormalize = true;
  p.routing.scale = float(c.get<double>("routed_scaling_factor", 1.0));
  // RoPE rotates head_dim * partial_rotary_factor channels (capped by rotary_dim when given).
  p.rot_dim = int64_t(double(p.head_dim) * c.partial_rotary_factor);
  if (c.has("rotary_dim")) p.rot_dim = std::min(p.rot_dim, c.require<int64_t>("rotary_dim"));
  TS_CHECK(p.rot_dim > 0 && p.rot_dim % 2 == 0 && p.rot_dim <= p.head_dim, "{}: rotary dim {} vs head_dim {}", c.path,
           p.rot_dim, p.head_dim);
  // Per-layer MLP kind: mlp_layer_types ("dense"/"sparse") or moe_layer_freq (0/1).
  if (c.has("mlp_layer_types")) {
    auto t = c.require<std::vector<std::string>>("mlp_layer_types");
    TS_CHECK(int64_t(t.size()) == p.layers, "{}: mlp_layer_types has {} entries for {} layers", c.path, t.size(), p.layers);
    for (auto& s : t) {
      TS_CHECK(s == "dense" || s == "sparse", "{}: unknown mlp_layer_types entry '{}'", c.path, s);
      p.sparse_mlp.push_back(s == "sparse");
    }
  } else if (c.has("moe_layer_freq")) {
    auto f = c.require<std::vector<int>>("moe_layer_freq");
    TS_CHECK(int64_t(f.size()) == p.layers, "{}: moe_layer_freq has {} entries for {} layers", c.path, f.size(), p.layers);
    for (int v : f) p.sparse_mlp.push_back(v != 0);
  } else {
    p.sparse_mlp.assign(size_t(p.layers), 1);
  }
  auto types = c.get<std::vector<std::string>>("layer_types", std::vector<std::string>(size_t(p.layers), "full_attention"));
  TS_CHECK(int64_t(types.size()) == p.layers, "{}: layer_types has {} entries for {} layers", c.path, types.size(), p.layers);
  for (auto& s : types) {
    TS_CHECK(s == "full_attention" || s == "minimax_m3_sparse", "{}: unknown layer_types entry '{}'", c.path, s);
    p.sparse_attn.push_back(s == "minimax_m3_sparse");
  }
  p.idx_heads = c.get<int64_t>("index_n_heads", 0);
  p.idx_dim = c.get<int64_t>("index_head_dim", 0);
  p.indexer.block_size = c.get<int>("index_block_size", 128);
  p.indexer.top_k = c.get<int>("index_topk_blocks", 16);
  p.indexer.local_blocks = c.get<int>("index_local_blocks", 1);
  TS_CHECK(c.get<int>("index_init_blocks", 0) == 0 && c.get<int>("sparse_init_block", 0) == 0,
           "{}: initial (sink) index blocks are not supported", c.path);
  for (auto s : p.sparse_attn)
    if (s) {
      TS_CHECK(p.idx_heads > 0 && p.idx_dim >= p.rot_dim, "{}: indexer {} heads of {} (rotary dim {})", c.path, p.idx_heads,
               p.idx_dim, p.rot_dim);
      break;
    }
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct IndexerWeights {
  Tensor q, k;            // [Hi * D, H], [D, H]
  Tensor q_norm, k_norm;  // [D] (1 + w)
};

struct MiniMaxM3Layer {
  Tensor input_norm, post_norm;
  AttentionWeights attn;
  IndexerWeights idx;  // sparse-attention layers
  MlpWeights mlp;      // dense layers
  MoeWeights moe;      // sparse layers
};

class MiniMaxM3 final : public DecoderModel {
 public:
  MiniMaxM3(const io::ModelConfig& cfg, const LoadOptions& opts) : DecoderModel(cfg, opts.device), p_(minimax_m3_params(cfg)) {
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
    const int64_t H = p_.hidden, hd = p_.head_dim, qw = p_.heads * hd, kw = p_.kv_heads * hd, D = p_.idx_dim;
    // This rank's shard: q heads, KV heads (replicated past num_kv_heads), index heads following
    // the q heads (indexer.k_proj, its norms and cache replicated), experts (EP ranges or every
    // expert's intermediate shard), the shared expert sharded under MoE TP, whole under EP. The
    // embedding is replicated (resolve_embed: the seed), the LM head vocab-parallel.
    const parallel::HeadShard hs = parallel::shard_heads(p_.heads, p_.kv_heads, mapping_.attn_tp, rank);
    bool any_sparse = false;
    for (auto v : p_.sparse_attn) any_sparse = any_sparse || v;
    const parallel::IndexerShard is = any_sparse ? parallel::shard_indexer(p_.heads, p_.idx_heads, D, mapping_.attn_tp, rank)
                                                 : parallel::IndexerShard{};
    idx_heads_ = any_sparse ? is.heads.count : 0;
    const parallel::Range er = parallel::expert_range(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    const parallel::Range mr = parallel::even_shard(p_.moe_inter, mapping_.moe_tp, mapping_.moe_tp_rank, "intermediate_size");
    const parallel::Range sr = mapping_.moe_ep == 1 && p_.shared_inter > 0
                                   ? parallel::even_shard(p_.shared_inter, mapping_.moe_tp, mapping_.moe_tp_rank,
                                                          "shared_intermediate_size")
                                   : parallel::Range{0, p_.shared_inter};
    if (mapping_.world > 1) moe_par_ = std::make_unique<parallel::MoeParallel>(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    const int64_t q0 = hs.q.start * hd, qn = hs.q.count * hd, k0 = hs.kv.start * hd, kn = hs.kv.count * hd;
    using Part = WeightLoader::Part;
    // Text-only checkpoints use model.*; the full VL checkpoint nests it in model.language_model.*.
    std::string root = wl.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    EmbedHead eh = load_embed_head(wl, p_.vocab, H, p_.tied, tp, rank, embed_tp_, root);
    embed_ = eh.embed;
    head_ = eh.head;
    embed_start_ = eh.embed_start;
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = root + "layers." + std::to_string(l) + ".";
      std::string at = pre + "self_attn.";
      MiniMaxM3Layer L;
      L.input_norm = gemma_norm(wl, pre + "input_layernorm.weight", H);
      L.post_norm = gemma_norm(wl, pre + "post_attention_layernorm.weight", H);
      L.attn.qkv = wl.load_linear({Part{at + "q_proj.weight", {qw, H}, 0, q0, qn}, Part{at + "k_proj.weight", {kw, H}, 0, k0, kn},
                                  Part{at + "v_proj.weight", {kw, H}, 0, k0, kn}});
      L.attn.o = wl.load_linear({Part{at + "o_proj.weight", {H, qw}, 1, q0, qn}});
      L.attn.q_norm = gemma_norm(wl, at + "q_norm.weight", hd);
      L.attn.k_norm = gemma_norm(wl, at + "k_norm.weight", hd);
      if (p_.sparse_attn[size_t(l)]) {
        L.idx.q = wl.load_parts(
            {Part{at + "indexer.q_proj.weight", {p_.idx_heads * D, H}, 0, is.q_rows.start, is.q_rows.count}});
        L.idx.k = wl.load(at + "indexer.k_proj.weight", {D, H});
        L.idx.q_norm = gemma_norm(wl, at + "indexer.q_norm.weight", D);
        L.idx.k_norm = gemma_norm(wl, at + "indexer.k_norm.weight", D);
      }
      if (p_.sparse_mlp[size_t(l)]) {
        L.moe.router = wl.load(pre + "mlp.gate.weight", {p_.experts, H});
        for (const char* n : {"mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"})
          if (!L.moe.router_bias.data && wl.has(pre + n)) L.moe.router_bias = wl.load_f32(pre + n, {p_.experts});
        load_experts_shard(wl, pre + "mlp.experts", p_.experts, p_.moe_inter, H, er, mr, L.moe);
        if (wl.has(pre + "mlp.shared_experts.gate_up_proj.weight"))
          L.moe.shared = load_fused_mlp(wl, pre + "mlp.shared_experts.", H, p_.shared_inter, sr);
      } else {
        const parallel::Range ir =
            parallel::even_shard(p_.dense_inter, mapping_.dense_tp, mapping_.dense_tp_rank, "dense_intermediate_size");
        L.mlp = load_fused_mlp(wl, pre + "mlp.", H, p_.dense_inter, ir);
      }
      layers_.push_back(std::move(L));
    }
    norm_ = gemma_norm(wl, root + "norm.weight", H);
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(p_.rot_dim), cfg.max_position_embeddings, table, false, device_);
    shape_ = {hs.q.count, hs.kv.count, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
    moe_shape_.routing = p_.routing;
    moe_shape_.act = p_.act;
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
  // The indexer's keys: one head of index_head_dim per token, on the sparse-attention layers.
  AuxKvSpec aux_kv_spec() const override {
    AuxKvSpec s;
    for (auto v : p_.sparse_attn)
      if (v) {
        s.heads = 1;
        s.dim = int(p_.idx_dim);
        s.layers = p_.sparse_attn;
      }
    return s;
  }

  // --- forward ------------------------------------------------------------------------------
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) {
          MiniMaxM3Layer& L = layers_[size_t(l)];
          if (p_.sparse_attn[size_t(l)]) sparse_attention_block(h, L, b, kv.k[size_t(l)], kv.v[size_t(l)], kv.aux[size_t(l)], x);
          else attention_block(h, L.attn, shape_, rope_, b, kv.k[size_t(l)], kv.v[size_t(l)], ws_, x);
        },
        [&](int64_t l, Tensor& x, Tensor& y) {
          // true: y is a partial sum over the attention TP group (reduced with the next norm).
          if (!p_.sparse_mlp[size_t(l)])
            return dense_mlp(groups_.get(), span_, x, y, ws_, [&](const Tensor& in, Tensor& out) {
              glu_mlp_block(in, layers_[size_t(l)].mlp, p_.act, ws_, out);
            });
          if (!moe_par_) moe_block(x, layers_[size_t(l)].moe, moe_shape_, ws_, y);
          else return moe_block_parallel(x, layers_[size_t(l)].moe, moe_shape_, *groups_, *moe_par_, ws_, y);
          return true;
        },
        DecoderTp{comm_.get(), embed_tp_, embed_start_, mapping_.tp_size, p_.vocab});
  }
  EmbedLayout embed_layout() const override { return {embed_tp_, embed_start_, embed_.size(0)}; }

 protected:
  // The seed: MiniMax-M3 keeps the whole embedding table on every rank (no vocab mask, no
  // embedding all-reduce); the LM head stays vocab-parallel.
  int resolve_embed(const parallel::Mapping&, bool) const override { return 1; }

 private:
  // A fused gate_up_proj [2I, H] (gate rows then up rows) + down_proj [H, I] MLP under `pre`:
  // gate rows [ir], up rows [I + ir], down's columns [ir].
  static MlpWeights load_fused_mlp(WeightLoader& wl, const std::string& pre, int64_t H, int64_t inter,
                                   const parallel::Range& ir) {
    using Part = WeightLoader::Part;
    MlpWeights m;
    m.gate_up = wl.load_linear({Part{pre + "gate_up_proj.weight", {2 * inter, H}, 0, ir.start, ir.count},
                               Part{pre + "gate_up_proj.weight", {2 * inter, H}, 0, inter + ir.start, ir.count}});
    m.down = wl.load_linear({Part{pre + "down_proj.weight", {H, inter}, 1, ir.start, ir.count}});
    return m;
  }

  // Gemma-style norm weight: the checkpoint stores w, the norm scales by 1 + w.
  Tensor gemma_norm(WeightLoader& wl, const std::string& name, int64_t n) {
    Tensor w = wl.checkpoint().get(name, {n}).to_f32();
    for (int64_t i = 0; i < n; ++i) w.ptr<float>()[i] = 1.0f + w.ptr<float>()[i];
    return convert(w, wl.dtype(), wl.device());
  }

  // Attention restricted to the key blocks the lightning indexer picks for each query.
  void sparse_attention_block(const Tensor& h, const MiniMaxM3Layer& L, ForwardBatch& b, Tensor& kc, Tensor& vc,
                              Tensor& idx_cache, Tensor& out) {
    const int64_t T = h.rows(), nh = shape_.num_heads, nkv = shape_.num_kv_heads, hd = p_.head_dim, D = p_.idx_dim,
                  Hi = idx_heads_;
    const int64_t qw = nh * hd, kw = nkv * hd;
    TS_CHECK(idx_cache.data || T == 0, "minimax_m3: no indexer cache for a sparse layer");
    WorkspaceScope scope(ws_);
    Tensor qkv = ws_.alloc({T, qw + 2 * kw}, dtype_);
    ops::linear(h, L.attn.qkv, qkv);
    Tensor q = as_heads(qkv.narrow(1, 0, qw), nh, hd);
    Tensor k = as_heads(qkv.narrow(1, qw, kw), nkv, hd);
    Tensor v = as_heads(qkv.narrow(1, qw + kw, kw), nkv, hd);
    ops::qk_norm_rope(q, k, L.attn.q_norm, L.attn.k_norm, p_.eps, b.positions, rope_);
    ops::kv_write(k, v, kc, vc, b.slot_mapping);
    // Lightning indexer: normed, roped index queries/keys; keys cached per token.
    Tensor iq = ws_.alloc({T, Hi * D}, dtype_);
    ops::linear(h, L.idx.q, iq);
    Tensor ik = ws_.alloc({T, D}, dtype_);
    ops::linear(h, L.idx.k, ik);
    Tensor iq3 = as_heads(iq, Hi, D), ik3 = as_heads(ik, 1, D);
    ops::qk_norm_rope(iq3, ik3, L.idx.q_norm, L.idx.k_norm, p_.eps, b.positions, rope_);
    ops::cache_write(ik3, idx_cache, b.slot_mapping);
    Tensor sel = ws_.alloc({T, Hi, int64_t(p_.indexer.top_k)}, DType::i32);  // per indexer head
    ops::block_indexer(iq3, idx_cache, b.attn, p_.indexer, sel);
    BlockSelectHook* hook = block_select_hook();
    const int hook_layer = hook ? hook->calls++ : -1;
    if (hook) {
      TS_CHECK(!ops::graph_hooks(), "block select hook: eager forwards only (a CUDA graph cannot replay its copies)");
      hook->on_select(hook_layer, iq3, ik3, b.positions, p_.indexer, sel);
    }
    Tensor attn = ws_.alloc({T, nh, hd}, dtype_);
    ops::block_sparse_attention(q, kc, vc, b.attn, shape_.scale, sel, p_.indexer.block_size, attn);
    if (hook)
      hook->on_attention(hook_layer, {&iq3, &idx_cache, &q, &kc, &vc, &b.attn, &p_.indexer, shape_.scale, &sel, &attn});
    ops::linear(attn.view({T, qw}), L.attn.o, out);
  }

  MiniMaxM3Params p_;
  int64_t idx_heads_ = 0;  // this rank's index heads (all at tp 1)
  std::shared_ptr<parallel::Comm> comm_;
  std::shared_ptr<const parallel::ParallelGroups> groups_;
  std::unique_ptr<parallel::MoeParallel> moe_par_;  // world > 1: this rank's experts
  parallel::SpanGather span_;                        // dense TP spanning attention groups
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<MiniMaxM3Layer> layers_;
  ops::Rope rope_;
  AttentionShape shape_{};
  MoeShape moe_shape_;
};

}  // namespace

std::unique_ptr<Model> make_minimax_m3(const io::ModelConfig& c, const LoadOptions& o) {
  return std::make_unique<MiniMaxM3>(c, o);
}

}  // namespace ts::models
