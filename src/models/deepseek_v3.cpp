// DeepseekV3ForCausalLM: multi-head latent attention (MLA) and a DeepSeek mixture of experts
// (sigmoid scores + e_score_correction_bias, grouped top-k, shared experts).
//
// MLA caches one vector per token and layer: the compressed latent c = kv_a_layernorm(kv_a(h))
// [kv_lora_rank] followed by the roped k_pe [qk_rope_head_dim]. Attention runs in the absorbed
// form for prefill and decode alike: q_nope goes through W_UK (kv_b_proj's key rows) into latent
// space, scores are q_lat . c + q_pe . k_pe, and the latent-space output goes through W_UV
// (kv_b_proj's value rows) per head before o_proj.
#include <cmath>

#include "models/moe.h"
#include "models/rope.h"
#include "ops/graph_hooks.h"
#include "models/weights.h"
#include "parallel/world.h"

namespace ts::models {
namespace {

// --- hyper-parameters ---------------------------------------------------------------------
struct DeepseekParams {
  int64_t vocab, hidden, inter, moe_inter, layers, heads;
  int64_t q_rank, kv_rank, nope, rope_dim, v_dim;  // q_rank 0: no q LoRA (q_proj)
  int64_t experts, shared, first_dense;
  float eps, scale;
  bool tied, interleave, attn_bias;
  ops::MoeRouting routing;
};

DeepseekParams deepseek_params(const io::ModelConfig& c) {
  DeepseekParams p;
  p.vocab = c.vocab_size;
  p.hidden = c.hidden_size;
  p.inter = c.intermediate_size;
  p.layers = c.num_layers;
  p.heads = c.num_heads;
  p.q_rank = c.get<int64_t>("q_lora_rank", 0);
  p.kv_rank = c.require<int64_t>("kv_lora_rank");
  p.nope = c.require<int64_t>("qk_nope_head_dim");
  p.rope_dim = c.require<int64_t>("qk_rope_head_dim");
  p.v_dim = c.require<int64_t>("v_head_dim");
  p.experts = c.get<int64_t>("n_routed_experts", 0);
  p.shared = c.get<int64_t>("n_shared_experts", 0);
  p.first_dense = c.get<int64_t>("first_k_dense_replace", 0);
  p.moe_inter = c.get<int64_t>("moe_intermediate_size", 0);
  p.eps = float(c.rms_norm_eps);
  p.tied = c.tie_word_embeddings;
  p.interleave = c.get<bool>("rope_interleave", true);
  p.attn_bias = c.attention_bias;
  TS_CHECK(!p.attn_bias, "{}: attention_bias=true is not supported for {}", c.path, c.architecture);
  TS_CHECK(!c.mlp_bias, "{}: mlp_bias=true is not supported", c.path);
  c.require_silu_mlp();
  TS_CHECK(c.sliding_window == 0, "{}: sliding-window layers are not supported for {} (MLA attends to the whole context)", c.path, c.architecture);
  TS_CHECK(p.rope_dim % 2 == 0 && p.kv_rank > 0, "{}: bad MLA dimensions", c.path);
  // Softmax scale: 1/sqrt(qk_head_dim), times mscale^2 under YaRN with mscale_all_dim (the
  // config's own `factor`, as transformers reads it).
  double scale = 1.0 / std::sqrt(double(p.nope + p.rope_dim));
  if (c.rope.type != "default" && c.rope.mscale_all_dim && *c.rope.mscale_all_dim != 0) {
    double m = yarn_get_mscale(c.rope.factor, *c.rope.mscale_all_dim);
    scale *= m * m;
  }
  p.scale = float(scale);
  p.routing.scoring = ops::MoeScoring::sigmoid;
  p.routing.top_k = c.get<int>("num_experts_per_tok", 1);
  p.routing.n_group = c.get<int>("n_group", 1);
  p.routing.topk_group = c.get<int>("topk_group", 1);
  p.routing.renormalize = c.get<bool>("norm_topk_prob", true);
  p.routing.renorm_eps = 1e-20f;
  p.routing.scale = float(c.get<double>("routed_scaling_factor", 1.0));
  std::string method = c.get<std::string>("topk_method", "noaux_tc");
  TS_CHECK(method == "noaux_tc", "{}: topk_method '{}' is not supported (noaux_tc only)", c.path, method);
  std::string scoring = c.get<std::string>("scoring_func", "sigmoid");
  TS_CHECK(scoring == "sigmoid", "{}: scoring_func '{}' is not supported (sigmoid only)", c.path, scoring);
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct MlaWeights {
  ops::LinearWeight qkv_a;  // [q_rank + kv_rank + rope, H]: q_a_proj rows then kv_a_proj_with_mqa rows
  Tensor q_a_norm;   // [q_rank]
  ops::LinearWeight q_b;    // [nh * (nope + rope), q_rank] (or q_proj [nh * (nope + rope), H] without q LoRA)
  Tensor kv_a_norm;  // [kv_rank]
  Tensor w_uk_t;     // [nh, kv_rank, nope]: per head, W_UK transposed (absorbs q_nope into latent space)
  Tensor kv_b;       // [nh * (nope + v), kv_rank]; W_UV of head h = rows h*(nope+v)+nope ..
  ops::LinearWeight o;      // [H, nh * v]
  // The FP8 latent cache's scale (--kv-cache-dtype fp8): the checkpoint's k_scale (load_kv_scales;
  // the latent is the keys, and the values are its first kv_rank features), 1.0 without.
  float latent_scale = 1.0f;
};

struct DeepseekLayer {
  Tensor input_norm, post_norm;
  MlaWeights attn;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // sparse layers
  bool sparse = false;
};

class DeepseekV3 final : public DecoderModel {
 public:
  DeepseekV3(const io::ModelConfig& cfg, const LoadOptions& opts) : DecoderModel(cfg, opts.device), p_(deepseek_params(cfg)) {
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
    const int64_t H = p_.hidden, nh = p_.heads, qd = p_.nope + p_.rope_dim, r = p_.kv_rank;
    // This rank's MLA heads: q_b (or q_proj) rows, kv_b rows (and W_UK from them), o_proj
    // columns; q_a / kv_a, their norms and the latent cache are replicated (every rank writes the
    // same latent). Experts: EP ranges or every expert's intermediate shard (MoE TP), the shared
    // experts sharded the same way under MoE TP and whole under EP.
    const parallel::MlaShard ms = parallel::shard_mla(nh, p_.nope, p_.rope_dim, p_.v_dim, mapping_.attn_tp, rank);
    nh_ = ms.heads.count;
    const parallel::Range er = parallel::expert_range(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    const parallel::Range mr = p_.experts > 0 ? parallel::even_shard(p_.moe_inter, mapping_.moe_tp, mapping_.moe_tp_rank,
                                                                     "moe_intermediate_size")
                                              : parallel::Range{};
    if (mapping_.world > 1 && p_.experts > 0)
      moe_par_ = std::make_unique<parallel::MoeParallel>(p_.experts, mapping_.moe_ep, mapping_.moe_ep_rank);
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    EmbedHead eh = load_embed_head(wl, p_.vocab, H, p_.tied, tp, rank, embed_tp_);
    embed_ = eh.embed;
    head_ = eh.head;
    embed_start_ = eh.embed_start;
    using Part = WeightLoader::Part;
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      std::string at = pre + "self_attn.";
      DeepseekLayer L;
      L.input_norm = wl.load(pre + "input_layernorm.weight", {H});
      L.post_norm = wl.load(pre + "post_attention_layernorm.weight", {H});
      if (p_.q_rank > 0) {
        L.attn.qkv_a = wl.load_linear({Part{at + "q_a_proj.weight", {p_.q_rank, H}},
                                       Part{at + "kv_a_proj_with_mqa.weight", {r + p_.rope_dim, H}}});
        L.attn.q_a_norm = wl.load(at + "q_a_layernorm.weight", {p_.q_rank});
        L.attn.q_b = wl.load_linear({Part{at + "q_b_proj.weight", {nh * qd, p_.q_rank}, 0, ms.q_rows.start, ms.q_rows.count}});
      } else {
        L.attn.qkv_a = wl.load_linear(at + "kv_a_proj_with_mqa.weight", {r + p_.rope_dim, H});
        L.attn.q_b = wl.load_linear({Part{at + "q_proj.weight", {nh * qd, H}, 0, ms.q_rows.start, ms.q_rows.count}});
      }
      L.attn.kv_a_norm = wl.load(at + "kv_a_layernorm.weight", {r});
      L.attn.kv_b = wl.load_parts(
          {Part{at + "kv_b_proj.weight", {nh * (p_.nope + p_.v_dim), r}, 0, ms.kv_b_rows.start, ms.kv_b_rows.count}});
      L.attn.w_uk_t = absorb_uk(L.attn.kv_b);
      L.attn.latent_scale = load_kv_scales(wl, pre).k;
      L.attn.o = wl.load_linear({Part{at + "o_proj.weight", {H, nh * p_.v_dim}, 1, ms.o_cols.start, ms.o_cols.count}});
      L.sparse = p_.experts > 0 && l >= p_.first_dense;
      if (L.sparse) {
        L.moe.router = wl.load(pre + "mlp.gate.weight", {p_.experts, H});
        if (wl.has(pre + "mlp.gate.e_score_correction_bias"))
          L.moe.router_bias = wl.load_f32(pre + "mlp.gate.e_score_correction_bias", {p_.experts});
        load_experts_shard(wl, pre + "mlp.experts", p_.experts, p_.moe_inter, H, er, mr, L.moe);
        if (p_.shared > 0) {
          const int64_t si = p_.moe_inter * p_.shared;
          const parallel::Range sr = mapping_.moe_ep == 1
                                         ? parallel::even_shard(si, mapping_.moe_tp, mapping_.moe_tp_rank,
                                                                "n_shared_experts x moe_intermediate_size")
                                         : parallel::Range{0, si};
          L.moe.shared = load_mlp_shard(wl, pre + "mlp.shared_experts.", H, si, sr);
        }
      } else {
        const parallel::Range ir =
            parallel::even_shard(p_.inter, mapping_.dense_tp, mapping_.dense_tp_rank, "intermediate_size");
        L.mlp = load_mlp_shard(wl, pre + "mlp.", H, p_.inter, ir);
      }
      layers_.push_back(std::move(L));
    }
    norm_ = wl.load("model.norm.weight", {H});
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(p_.rope_dim), cfg.max_position_embeddings, table, p_.interleave, device_);
    moe_shape_.routing = p_.routing;
    for (int c : capture_layers_)
      TS_CHECK(c >= 0 && c <= p_.layers, "capture layer {} outside 0..{}", c, p_.layers);
  }

  KvSpec kv_spec() const override {
    KvSpec s;
    s.num_layers = int(p_.layers);
    s.k_heads = 1;
    s.k_dim = int(p_.kv_rank + p_.rope_dim);
    s.v_heads = 0;
    return s;
  }

  // --- forward ------------------------------------------------------------------------------
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) { mla_block(h, layers_[size_t(l)].attn, b, kv.k[size_t(l)], x); },
        [&](int64_t l, Tensor& x, Tensor& y) {
          // true: y is a partial sum over the attention TP group (reduced with the next norm).
          DeepseekLayer& L = layers_[size_t(l)];
          if (!L.sparse)
            return dense_mlp(groups_.get(), span_, x, y, ws_,
                             [&](const Tensor& in, Tensor& out) { mlp_block(in, L.mlp, ws_, out); });
          if (!moe_par_) moe_block(x, L.moe, moe_shape_, ws_, y);
          else return moe_block_parallel(x, L.moe, moe_shape_, *groups_, *moe_par_, ws_, y);
          return true;
        },
        DecoderTp{comm_.get(), embed_tp_, embed_start_, mapping_.tp_size, p_.vocab});
  }
  EmbedLayout embed_layout() const override { return {embed_tp_, embed_start_, embed_.size(0)}; }

 private:
  // W_UK^T per head, from kv_b_proj's key rows: [nh, kv_rank, nope].
  Tensor absorb_uk(const Tensor& kv_b) const {
    const int64_t nh = nh_, r = p_.kv_rank, nope = p_.nope, rows = p_.nope + p_.v_dim;
    Tensor src = kv_b.device == Device::cpu ? kv_b.to_f32() : kv_b.to(Device::cpu).to_f32();
    Tensor t = Tensor::empty({nh, r, nope}, DType::f32);
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t c = 0; c < r; ++c)
          t.ptr<float>()[(hh * r + c) * nope + d] = src.ptr<float>()[(hh * rows + d) * r + c];
    return convert(t, dtype_, device_);
  }

  // h [T, H] normed input -> out [T, H]; writes this layer's latent + k_pe into `cache`.
  void mla_block(const Tensor& h, const MlaWeights& w, ForwardBatch& b, Tensor& cache, Tensor& out) {
    const int64_t T = h.rows(), nh = nh_, nope = p_.nope, rd = p_.rope_dim, r = p_.kv_rank, vd = p_.v_dim;
    const int64_t qd = nope + rd, qa = p_.q_rank, kvw = r + rd;
    WorkspaceScope scope(ws_);
    Tensor a = ws_.alloc({T, qa + kvw}, dtype_);
    ops::linear(h, w.qkv_a, a);
    Tensor q = ws_.alloc({T, nh * qd}, dtype_);
    if (qa > 0) {
      Tensor qa_part = a.narrow(1, 0, qa);
      ops::rmsnorm(qa_part, w.q_a_norm, p_.eps, qa_part);
      ops::linear(qa_part, w.q_b, q);
    } else {
      ops::linear(h, w.q_b, q);
    }
    Tensor ckv = a.narrow(1, qa, kvw);  // [latent | k_pe]
    Tensor latent = ckv.narrow(1, 0, r);
    ops::rmsnorm(latent, w.kv_a_norm, p_.eps, latent);
    Tensor q3 = as_heads(q, nh, qd);
    Tensor q_pe = q3.narrow(2, nope, rd);
    Tensor k_pe = as_heads(ckv.narrow(1, r, rd), 1, rd);
    ops::rope(q_pe, k_pe, b.positions, rope_);
    ops::cache_write(as_heads(ckv, 1, kvw), cache, b.slot_mapping, w.latent_scale);
    // q in latent space: [q_nope W_UK | q_pe] per head.
    Tensor qc = ws_.alloc({T, nh * kvw}, dtype_);
    for (int64_t hh = 0; hh < nh; ++hh) {
      Tensor dst = qc.narrow(1, hh * kvw, r);
      ops::linear(q.narrow(1, hh * qd, nope), w.w_uk_t.row(hh), dst);
      Tensor pe_dst = qc.narrow(1, hh * kvw + r, rd);
      ops::copy_rows(q.narrow(1, hh * qd + nope, rd), pe_dst);
    }
    Tensor olat = ws_.alloc({T, nh * r}, dtype_);
    Tensor olat3 = as_heads(olat, nh, r);
    ops::mla_attention(as_heads(qc, nh, kvw), cache, b.attn, p_.scale, r, olat3, w.latent_scale);
    Tensor attn = ws_.alloc({T, nh * vd}, dtype_);
    for (int64_t hh = 0; hh < nh; ++hh) {
      Tensor dst = attn.narrow(1, hh * vd, vd);
      ops::linear(olat.narrow(1, hh * r, r), w.kv_b.narrow(0, hh * (nope + vd) + nope, vd), dst);
    }
    ops::linear(attn, w.o, out);
  }

  DeepseekParams p_;
  int64_t nh_ = 0;  // this rank's heads (all at tp 1)
  std::shared_ptr<parallel::Comm> comm_;
  std::shared_ptr<const parallel::ParallelGroups> groups_;
  std::unique_ptr<parallel::MoeParallel> moe_par_;  // world > 1 with experts: this rank's experts
  parallel::SpanGather span_;                        // dense TP spanning attention groups
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<DeepseekLayer> layers_;
  ops::Rope rope_;
  MoeShape moe_shape_;
};

}  // namespace

std::unique_ptr<Model> make_deepseek_v3(const io::ModelConfig& c, const LoadOptions& o) {
  return std::make_unique<DeepseekV3>(c, o);
}

}  // namespace ts::models
