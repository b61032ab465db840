// Qwen3.5 text model (Qwen3_5ForCausalLM, model_type qwen3_5_text): a hybrid of Gated DeltaNet
// linear-attention layers and gated full-attention layers (config layer_types), each followed
// by a SwiGLU MLP.
//  - Full attention: GQA with per-head q/k norms and partial RoPE; q_proj emits, per head, the
//    query then an output gate of the same width; the attention output is scaled by
//    sigmoid(gate) before o_proj. Only these layers have paged K/V.
//  - Linear attention: in_proj_qkv -> depthwise causal conv (kernel linear_conv_kernel_dim) +
//    SiLU -> q, k (linear_num_key_heads x linear_key_head_dim), v (linear_num_value_heads x
//    linear_value_head_dim) -> gated delta rule with g = -exp(A_log) softplus(a + dt_bias),
//    beta = sigmoid(b) -> per-head RMSNorm gated by silu(z) -> out_proj. Their conv window and
//    recurrent matrix live in state slots (StateSpec), one row per sequence.
// Every RMSNorm but the gated one is zero-centred (scale 1 + w, stored as 1 + w at load).
#include <cmath>
#include <cstring>

#include "models/blocks.h"
#include "models/rope.h"
#include "models/weights.h"
#include "ops/graph_hooks.h"

namespace ts::models {
namespace {

// --- hyper-parameters ---------------------------------------------------------------------
struct Qwen35Params {
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, rot_dim;
  int64_t lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel;
  float eps;
  bool tied;
  std::vector<uint8_t> linear;  // per layer: linear attention (1) or full attention (0)
  int64_t key_dim() const { return lin_k_heads * lin_k_dim; }
  int64_t value_dim() const { return lin_v_heads * lin_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

Qwen35Params qwen3_5_params(const io::ModelConfig& c) {
  Qwen35Params p;
  p.vocab = c.vocab_size;
  p.hidden = c.hidden_size;
  p.inter = c.intermediate_size;
  p.layers = c.num_layers;
  p.heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.eps = float(c.rms_norm_eps);
  p.tied = c.tie_word_embeddings;
  p.rot_dim = int64_t(double(p.head_dim) * c.partial_rotary_factor);
  TS_CHECK(p.rot_dim > 0 && p.rot_dim % 2 == 0 && p.rot_dim <= p.head_dim, "{}: rotary dim {} vs head_dim {}", c.path,
           p.rot_dim, p.head_dim);
  TS_CHECK(p.inter > 0, "{}: missing field intermediate_size", c.path);
  TS_CHECK(!c.attention_bias, "{}: attention_bias=true is not supported for {}", c.path, c.architecture);
  TS_CHECK(c.get<std::string>("hidden_act", "silu") == "silu", "{}: hidden_act {} is not supported (silu only)", c.path,
           c.get<std::string>("hidden_act", ""));
  p.lin_k_heads = c.require<int64_t>("linear_num_key_heads");
  p.lin_v_heads = c.require<int64_t>("linear_num_value_heads");
  p.lin_k_dim = c.require<int64_t>("linear_key_head_dim");
  p.lin_v_dim = c.require<int64_t>("linear_value_head_dim");
  p.conv_kernel = c.require<int64_t>("linear_conv_kernel_dim");
  TS_CHECK(p.lin_k_heads > 0 && p.lin_v_heads % p.lin_k_heads == 0,
           "{}: linear_num_value_heads {} must be a multiple of linear_num_key_heads {}", c.path, p.lin_v_heads,
           p.lin_k_heads);
  TS_CHECK(p.conv_kernel >= 2, "{}: linear_conv_kernel_dim {} must be at least 2", c.path, p.conv_kernel);
  auto types = c.require<std::vector<std::string>>("layer_types");
  TS_CHECK(int64_t(types.size()) == p.layers, "{}: layer_types has {} entries for {} layers", c.path, types.size(), p.layers);
  for (auto& s : types) {
    TS_CHECK(s == "full_attention" || s == "linear_attention", "{}: unknown layer_types entry '{}'", c.path, s);
    p.linear.push_back(s == "linear_attention");
  }
  return p;
}

// --- tensors --------------------------------------------------------------------------------
struct DeltaNetWeights {
  Tensor in_proj;          // [conv_dim + value_dim + 2 nv, H]: qkv | z | b | a rows stacked
  Tensor conv;             // [conv_dim, K]
  Tensor A_log, dt_bias;   // f32 [nv]
  Tensor norm;             // [dv] gated RMSNorm scale (plain w)
  Tensor out;              // [H, value_dim]
};

struct Qwen35Layer {
  Tensor input_norm, post_norm;
  AttentionWeights attn;   // full-attention layers
  DeltaNetWeights lin;     // linear-attention layers
  MlpWeights mlp;
  int kv_index = -1;       // full-attention layers: index into the paged KV pool
};

class Qwen35 final : public DecoderModel {
 public:
  Qwen35(const io::ModelConfig& cfg, const LoadOptions& opts) : DecoderModel(cfg, opts.device), p_(qwen3_5_params(cfg)) {
    TS_CHECK(opts.device == Device::cpu, "{}: qwen3_5 on cuda is not implemented (use --device cpu)", cfg.path);
    TS_CHECK(opts.capture_layers.empty(), "{}: EAGLE3 speculative decoding is not supported for {}", cfg.path,
             cfg.architecture);
    mapping_ = opts.mapping;
    comm_ = opts.comm;
    groups_ = opts.groups;
    const int tp = mapping_.tp_size, rank = mapping_.tp_rank;
    TS_CHECK(tp == 1 || (comm_ && comm_->size() == tp), "{}: communicator does not match {}", cfg.path, mapping_.str());
    check_sharded_load(cfg, opts);
    WeightLoader wl(io::Checkpoint::open(cfg.dir), opts.device);
    wl.set_simulate_w8a8(opts.simulate_w8a8);
    device_ = opts.device;
    dtype_ = wl.dtype();
    const int64_t H = p_.hidden, hd = p_.head_dim, qw = p_.heads * hd, kw = p_.kv_heads * hd;
    const int64_t nv = p_.lin_v_heads, cd = p_.conv_dim(), vd = p_.value_dim();
    // This rank's shard: linear attention's value heads (key heads split or replicated like KV
    // heads): in_proj_qkv rows and conv channels q | k | v, z / b / a rows, A_log / dt_bias,
    // out_proj columns; full attention's heads (per-head query|gate rows); MLP columns; the
    // vocabulary rows of the LM head (and of the table unless replicated).
    const parallel::LinearAttnShard ls =
        parallel::shard_linear_attn(p_.lin_k_heads, nv, p_.lin_k_dim, p_.lin_v_dim, mapping_.attn_tp, rank);
    const parallel::HeadShard hs = parallel::shard_heads(p_.heads, p_.kv_heads, mapping_.attn_tp, rank);
    const parallel::Range ir = parallel::even_shard(p_.inter, mapping_.dense_tp, mapping_.dense_tp_rank, "intermediate_size");
    nk_ = ls.k_heads.count;
    nv_ = ls.v_heads.count;
    const int64_t cd_l = 2 * nk_ * p_.lin_k_dim + nv_ * p_.lin_v_dim;
    const int64_t k0 = hs.kv.start * hd, kn = hs.kv.count * hd;
    using Part = WeightLoader::Part;
    embed_tp_ = resolve_embed(mapping_, opts.replicate_embedding);
    EmbedHead eh = load_embed_head(wl, p_.vocab, H, p_.tied, tp, rank, embed_tp_);
    embed_ = eh.embed;
    head_ = eh.head;
    embed_start_ = eh.embed_start;
    int kv_layers = 0;
    for (int64_t l = 0; l < p_.layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      Qwen35Layer L;
      L.input_norm = centred_norm(wl, pre + "input_layernorm.weight", H);
      L.post_norm = centred_norm(wl, pre + "post_attention_layernorm.weight", H);
      if (p_.linear[size_t(l)]) {
        std::string at = pre + "linear_attn.";
        const std::string qkv = at + "in_proj_qkv.weight";
        L.lin.in_proj = wl.load_parts({Part{qkv, {cd, H}, 0, ls.q_rows.start, ls.q_rows.count},
                                       Part{qkv, {cd, H}, 0, ls.k_rows.start, ls.k_rows.count},
                                       Part{qkv, {cd, H}, 0, ls.v_rows.start, ls.v_rows.count},
                                       Part{at + "in_proj_z.weight", {vd, H}, 0, ls.z_rows.start, ls.z_rows.count},
                                       Part{at + "in_proj_b.weight", {nv, H}, 0, ls.v_heads.start, ls.v_heads.count},
                                       Part{at + "in_proj_a.weight", {nv, H}, 0, ls.v_heads.start, ls.v_heads.count}});
        // Conv channels follow in_proj_qkv's rows (q | k | v of this rank); CPU-only model: the
        // loaded table is on the host.
        const int64_t K = p_.conv_kernel;
        Tensor conv = wl.load(at + "conv1d.weight", {cd, 1, K}).view({cd, K});
        if (cd_l == cd) {
          L.lin.conv = conv;
        } else {
          L.lin.conv = Tensor::empty({cd_l, K}, conv.dtype, Device::cpu);
          int64_t row = 0;
          for (const parallel::Range& r : {ls.q_rows, ls.k_rows, ls.v_rows}) {
            std::memcpy(static_cast<char*>(L.lin.conv.data) + size_t(row * K) * dtype_size(conv.dtype),
                        static_cast<const char*>(conv.data) + size_t(r.start * K) * dtype_size(conv.dtype),
                        size_t(r.count * K) * dtype_size(conv.dtype));
            row += r.count;
          }
        }
        L.lin.A_log = wl.load_f32(at + "A_log", {nv}).narrow(0, ls.v_heads.start, ls.v_heads.count);
        L.lin.dt_bias = wl.load_f32(at + "dt_bias", {nv}).narrow(0, ls.v_heads.start, ls.v_heads.count);
        L.lin.norm = wl.load(at + "norm.weight", {p_.lin_v_dim});
        L.lin.out = wl.load_parts({Part{at + "out_proj.weight", {H, vd}, 1, ls.z_rows.start, ls.z_rows.count}});
      } else {
        // q_proj rows are per head [query (hd) | gate (hd)]: regrouped to q | k | v | gate.
        std::string at = pre + "self_attn.";
        std::vector<Part> parts;
        for (int64_t h = hs.q.start; h < hs.q.end(); ++h)
          parts.push_back(Part{at + "q_proj.weight", {2 * qw, H}, 0, 2 * h * hd, hd});
        parts.push_back(Part{at + "k_proj.weight", {kw, H}, 0, k0, kn});
        parts.push_back(Part{at + "v_proj.weight", {kw, H}, 0, k0, kn});
        for (int64_t h = hs.q.start; h < hs.q.end(); ++h)
          parts.push_back(Part{at + "q_proj.weight", {2 * qw, H}, 0, 2 * h * hd + hd, hd});
        L.attn.qkv = wl.load_linear(parts);
        L.attn.output_gate = true;
        L.attn.o = wl.load_linear({Part{at + "o_proj.weight", {H, qw}, 1, hs.q.start * hd, hs.q.count * hd}});
        L.attn.q_norm = centred_norm(wl, at + "q_norm.weight", hd);
        L.attn.k_norm = centred_norm(wl, at + "k_norm.weight", hd);
        L.kv_index = kv_layers++;
      }
      L.mlp = load_mlp_shard(wl, pre + "mlp.", H, p_.inter, ir);
      layers_.push_back(std::move(L));
    }
    kv_layers_ = kv_layers;
    norm_ = centred_norm(wl, "model.norm.weight", H);
    weight_bytes_ = wl.bytes_loaded();
    int64_t table = std::max<int64_t>(cfg.max_position_embeddings, 1);
    rope_ = build_rope(cfg.rope, int(p_.rot_dim), cfg.max_position_embeddings, table, false, device_);
    shape_ = {hs.q.count, hs.kv.count, hd, float(1.0 / std::sqrt(double(hd))), p_.eps};
  }

  // Paged K/V on the full-attention layers only (KvPool index = Qwen35Layer::kv_index).
  KvSpec kv_spec() const override {
    KvSpec s;
    s.num_layers = kv_layers_;
    s.k_heads = s.v_heads = int(shape_.num_kv_heads);
    s.k_dim = s.v_dim = int(p_.head_dim);
    return s;
  }
  StateSpec state_spec() const override {
    StateSpec s;
    s.layers = p_.linear;
    s.conv_dim = int(2 * nk_ * p_.lin_k_dim + nv_ * p_.lin_v_dim);  // this rank's channels
    s.conv_len = int(p_.conv_kernel - 1);
    s.heads = int(nv_);
    s.k_dim = int(p_.lin_k_dim);
    s.v_dim = int(p_.lin_v_dim);
    return s;
  }

  // --- forward ------------------------------------------------------------------------------
  Tensor forward(ForwardBatch& b, KvPool& kv) override {
    return decoder_forward(
        *this, b, ws_, {p_.layers, p_.hidden, p_.eps, dtype_}, embed_, norm_, head_,
        [&](int64_t l) { return std::pair<const Tensor&, const Tensor&>(layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm); },
        [&](int64_t l, Tensor& h, Tensor& x) {
          Qwen35Layer& L = layers_[size_t(l)];
          if (p_.linear[size_t(l)]) {
            TS_CHECK(kv.conv.size() > size_t(l) && kv.conv[size_t(l)].data, "qwen3_5: no recurrent state for layer {}", l);
            delta_net_block(h, L.lin, b, kv.conv[size_t(l)], kv.ssm[size_t(l)], x);
          } else {
            attention_block(h, L.attn, shape_, rope_, b, kv.k[size_t(L.kv_index)], kv.v[size_t(L.kv_index)], ws_, x);
          }
        },
        [&](int64_t l, Tensor& x, Tensor& y) {
          return dense_mlp(groups_.get(), span_, x, y, ws_,
                           [&](const Tensor& in, Tensor& out) { mlp_block(in, layers_[size_t(l)].mlp, ws_, out); });
        },
        DecoderTp{comm_.get(), embed_tp_, embed_start_, mapping_.tp_size, p_.vocab});
  }
  EmbedLayout embed_layout() const override { return {embed_tp_, embed_start_, embed_.size(0)}; }

 private:
  // Zero-centred norm weight: the checkpoint stores w, the norm scales by 1 + w.
  Tensor centred_norm(WeightLoader& wl, const std::string& name, int64_t n) {
    Tensor w = wl.checkpoint().get(name, {n}).to_f32();
    for (int64_t i = 0; i < n; ++i) w.ptr<float>()[i] = 1.0f + w.ptr<float>()[i];
    return convert(w, wl.dtype(), wl.device());
  }

  // h [T, H] -> out [T, H] (out may alias h: h is read only by the first projection).
  void delta_net_block(const Tensor& h, const DeltaNetWeights& w, ForwardBatch& b, Tensor& conv_state, Tensor& ssm_state,
                       Tensor& out) {
    WorkspaceScope scope(ws_);
    const int64_t T = h.rows(), nk = nk_, nv = nv_, dk = p_.lin_k_dim, dv = p_.lin_v_dim;
    const int64_t kd = nk * dk, vd = nv * dv, cd = 2 * kd + vd;  // this rank's heads
    Tensor proj = ws_.alloc({T, cd + vd + 2 * nv}, dtype_);  // qkv | z | b | a
    ops::linear(h, w.in_proj, proj);
    Tensor mixed = ws_.alloc({T, cd}, dtype_);
    ops::causal_conv1d(proj.narrow(1, 0, cd), w.conv, conv_state, b.state_slots, b.attn, mixed);
    Tensor q = as_heads(mixed.narrow(1, 0, kd), nk, dk);
    Tensor k = as_heads(mixed.narrow(1, kd, kd), nk, dk);
    Tensor v = as_heads(mixed.narrow(1, 2 * kd, vd), nv, dv);
    Tensor g = ws_.alloc({T, nv}, DType::f32), beta = ws_.alloc({T, nv}, DType::f32);
    ops::gdn_gates(proj.narrow(1, cd + vd + nv, nv), proj.narrow(1, cd + vd, nv), w.A_log, w.dt_bias, g, beta);
    Tensor core = ws_.alloc({T, nv, dv}, dtype_);
    ops::gated_delta_rule(q, k, v, g, beta, ssm_state, b.state_slots, b.attn, core);
    ops::rmsnorm_gated(core, as_heads(proj.narrow(1, cd, vd), nv, dv), w.norm, p_.eps, core);
    ops::linear(core.view({T, vd}), w.out, out);
  }

  Qwen35Params p_;
  int64_t nk_ = 0, nv_ = 0;  // this rank's linear-attention key / value heads
  std::shared_ptr<parallel::Comm> comm_;
  std::shared_ptr<const parallel::ParallelGroups> groups_;  // null in a world of one
  parallel::SpanGather span_;                               // dense TP spanning attention groups
  int embed_tp_ = 1;
  int64_t embed_start_ = 0;
  std::vector<Qwen35Layer> layers_;
  int kv_layers_ = 0;
  ops::Rope rope_;
  AttentionShape shape_{};
};

}  // namespace

std::unique_ptr<Model> make_qwen3_5(const io::ModelConfig& c, const LoadOptions& o) { return std::make_unique<Qwen35>(c, o); }

}  // namespace ts::models
