#include "runtime/model_runner.h"
#include "runtime/node_link.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/device_memory.h"
#include "ops/lm_head.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/device_logits.h"
#include "runtime/token_mask.h"
#include "runtime/tp_workers.h"

namespace ts {

// Batch rows one step's device logits processing can hold (more than any --max-num-seqs in use;
// 16384 x 32 B of row parameters).
constexpr int64_t kLogitsProcRows = 16384;

size_t ModelRunner::kv_bytes_per_token(const models::Model& m, std::optional<DType> kv_dtype) {
  return m.kv_spec().bytes_per_token(kv_dtype.value_or(m.dtype())) + m.aux_kv_spec().bytes_per_token(m.dtype());
}

DType ModelRunner::check_kv_dtype(const std::string& name, const models::Model& m) {
  if (name == "auto" || name == "bf16") return m.dtype();
  TS_CHECK(name == "fp8" || name == "fp8_e4m3", "--kv-cache-dtype '{}' is not supported (supported: auto, bf16, fp8, fp8_e4m3)",
           name);
  // The FP8 cache (e4m3, per-layer scales from the checkpoint or 1.0: stored = e4m3(x / scale),
  // read = stored x scale) is written and read by the ops of both backends (ops/cpu/attention.cpp,
  // the oracle; ops/cuda: kv_write, rope_kv_write, paged_attention).
  // Paged K/V (Llama family, Qwen3, Qwen3-MoE) and the MLA latent (DeepSeek-V3: v_heads 0, one
  // latent row per token, models/deepseek_v3.cpp); not the MiniMax-M3 indexer's auxiliary cache
  // nor recurrent state.
  TS_CHECK(m.aux_kv_spec().bytes_per_token(DType::u8) == 0 && !m.state_spec().any(),
           "--kv-cache-dtype {}: {} keeps an auxiliary (indexer) or recurrent cache; the FP8 cache covers paged K/V "
           "attention (Llama family, Qwen3, Qwen3-MoE) and the MLA latent (DeepSeek-V3) only",
           name, m.config().architecture);
  return DType::f8_e4m3;
}

ModelRunner::ModelRunner(std::shared_ptr<models::Model> model, int64_t num_blocks, int block_size, int state_slots,
                         std::optional<DType> kv_dtype)
    : model_(std::move(model)) {
  TS_CHECK(num_blocks > 0 && block_size > 0, "KV pool needs blocks (got {} blocks of {})", num_blocks, block_size);
  builder_.set_start_listener(&listener_);
  models::KvSpec s = model_->kv_spec();
  models::AuxKvSpec aux = model_->aux_kv_spec();
  kv_.block_size = block_size;
  kv_.num_blocks = num_blocks;
  const DType kvt = kv_dtype.value_or(model_->dtype());
  for (int l = 0; l < s.num_layers; ++l) {
    kv_.k.push_back(Tensor::zeros({num_blocks, block_size, s.k_heads, s.k_dim}, kvt, model_->device()));
    if (s.v_heads > 0)
      kv_.v.push_back(Tensor::zeros({num_blocks, block_size, s.v_heads, s.v_dim}, kvt, model_->device()));
    else
      kv_.v.push_back(Tensor());
    if (aux.on(l))
      kv_.aux.push_back(Tensor::zeros({num_blocks, block_size, aux.heads, aux.dim}, model_->dtype(), model_->device()));
    else
      kv_.aux.push_back(Tensor());
  }
  models::StateSpec st = model_->state_spec();
  if (st.any()) {
    int rows = state_slots > 0 ? state_slots : 16;
    kv_.num_state_slots = rows;
    for (size_t l = 0; l < st.layers.size(); ++l) {
      bool on = st.on(int(l));
      kv_.conv.push_back(on ? Tensor::zeros({rows, st.conv_len, st.conv_dim}, model_->dtype(), model_->device()) : Tensor());
      kv_.ssm.push_back(on ? Tensor::zeros({rows, st.heads, st.k_dim, st.v_dim}, DType::f32, model_->device()) : Tensor());
    }
    state_pool_ = SlotPool(rows);
    state_bytes_ = size_t(rows) * st.bytes_per_slot(model_->dtype());
  }
}

// All metadata of a step lives in one i32 buffer (one host->device copy per step):
//   ids[T] pos[T] slots[T] logit_rows[T] cu_q[S+1] kv_len[S] tables[S*W] state_slots[S]
// T, S, W are the padded sizes, so a CUDA graph captured for a bucket always finds its
// inputs at the same addresses.
void BatchBuilder::build(const std::vector<SeqChunk>& chunks, int bs, Device dev, ForwardBatch& batch,
                         const BuildOptions& opt) {
  int real_t = 0, real_s = int(chunks.size()), max_q = 0, max_kv = 0;
  size_t width = 1;
  for (auto& c : chunks) {
    real_t += c.num_tokens;
    width = std::max(width, c.block_table->size());
  }
  int T = std::max(real_t, opt.pad_tokens), S = std::max(real_s, opt.pad_seqs);
  int W = std::max(int(width), opt.table_width);
  TS_CHECK(S - real_s <= T - real_t, "padding: {} dummy sequences need as many padding tokens", S - real_s);
  size_t n = buffer_elems(size_t(T), size_t(S), size_t(W));
  host_.assign(n, 0);
  int32_t* ids = host_.data();
  int32_t *pos = ids + T, *slots = pos + T, *lrows = slots + T, *cu = lrows + T, *kvl = cu + S + 1, *tab = kvl + S;
  int32_t* sslots = tab + size_t(S) * size_t(W);
  int t = 0, nl = 0;
  for (int b = 0; b < real_s; ++b) {
    const SeqChunk& c = chunks[size_t(b)];
    const auto& table = *c.block_table;
    int end = c.start_pos + c.num_tokens;
    TS_CHECK(int64_t(table.size()) * bs >= end, "block table covers {} tokens, needs {}", table.size() * bs, end);
    for (int i = 0; i < c.num_tokens; ++i, ++t) {
      int p = c.start_pos + i;
      if (!opt.all_logits && (c.logits == SeqChunk::Logits::all || (c.logits == SeqChunk::Logits::last && i == c.num_tokens - 1)))
        lrows[nl++] = t;
      ids[t] = c.tokens[i];
      pos[t] = p;
      slots[t] = (table[size_t(p / bs)] - block_base_) * bs + p % bs;
    }
    cu[b + 1] = t;
    kvl[b] = end;
    sslots[b] = c.state_slot;
    int32_t* row = tab + size_t(b) * size_t(W);
    for (size_t j = 0; j < table.size(); ++j) row[j] = table[j] - block_base_;
    max_q = std::max(max_q, c.num_tokens);
    max_kv = std::max(max_kv, end);
  }
  // Padding: dummy sequences (one token each, one cached token in block 0, never written),
  // then rows that belong to no sequence (attention zeroes them).
  for (int b = real_s; b < S; ++b, ++t) {
    slots[t] = -1;
    sslots[b] = -1;
    cu[b + 1] = t + 1;
    kvl[b] = 1;
  }
  for (; t < T; ++t) slots[t] = -1;
  if (opt.all_logits) {
    for (int r = 0; r < T; ++r) lrows[r] = r;
    nl = T;
  }
  if (dev == Device::cpu) {
    base_ = Tensor::from_blob(host_.data(), {int64_t(n)}, DType::i32, Device::cpu);
  } else {
    // Grows geometrically (from 64k entries): block tables widen as contexts grow, and each
    // growth is an allocation inside the step.
    if (!dev_.data || dev_.numel() < int64_t(n))
      dev_ = Tensor::empty({int64_t(std::max({n + n / 2, opt.reserve, size_t(1) << 16}))}, DType::i32, dev);
    if (!up_) up_ = std::make_unique<StagedUpload>();
    if (listener_ && *listener_) (*listener_)->step_device_start();
    up_->upload(dev_.data, host_.data(), n * sizeof(int32_t));
    base_ = dev_;
  }
  auto view = [&](int64_t off, std::vector<int64_t> shape) {
    Tensor v = base_.narrow(0, off, [&] { int64_t k = 1; for (auto x : shape) k *= x; return k; }());
    return v.view(std::move(shape));
  };
  batch.num_tokens = T;
  batch.input_ids = view(0, {T});
  batch.positions = view(T, {T});
  batch.slot_mapping = view(2 * T, {T});
  batch.logits_index = view(3 * T, {nl});
  batch.num_logits = nl;
  batch.logits_all_rows = opt.all_logits;
  batch.attn.cu_q = view(4 * T, {S + 1});
  batch.attn.kv_len = view(4 * T + S + 1, {S});
  batch.attn.block_tables = view(4 * T + 2 * S + 1, {S, W});
  batch.state_slots = view(4 * T + 2 * S + 1 + int64_t(S) * W, {S});
  batch.attn.block_size = bs;
  batch.attn.num_seqs = S;
  batch.attn.max_q_len = std::max(max_q, S > real_s ? 1 : 0);
  batch.attn.max_kv_len = std::max(max_kv, opt.max_kv_bound);
  ops::set_decode_lead(batch.attn, cu);
  batch.mode = max_q <= 1 ? ForwardMode::decode : ForwardMode::prefill;
  cu_rows_.assign(cu, cu + S + 1);
}

ModelRunner::~ModelRunner() {
  if (tp_ && !peers_.empty()) {
    // Each shard is torn down on its own GPU's thread.
    try {
      tp_->run([&](int r) {
        if (r > 0) peers_[size_t(r)].reset();
      });
    } catch (...) {
    }
  }
}

void ModelRunner::attach_tp(std::shared_ptr<TpWorkers> workers, std::vector<std::unique_ptr<ModelRunner>> peers) {
  TS_CHECK(workers && int(peers.size()) == workers->size(), "attach_tp: {} peers for {} ranks", peers.size(),
           workers ? workers->size() : 0);
  for (int r = 1; r < workers->size(); ++r) {
    TS_CHECK(peers[size_t(r)], "attach_tp: rank {} has no runner", r);
    TS_CHECK(peers[size_t(r)]->num_blocks() == num_blocks() && peers[size_t(r)]->block_size() == block_size(),
             "attach_tp: rank {} KV pool differs from rank 0's", r);
  }
  tp_ = std::move(workers);
  peers_ = std::move(peers);
  const parallel::Mapping& m = model_->mapping();
  if (m.attn_dp > 1) {
    TS_CHECK(m.nnodes == 1 && tp_->size() == m.world, "attention data parallelism runs on one node (a world of {} "
             "ranks, {} here)", m.world, tp_->size());
    dp_groups_ = m.attn_dp;
    dp_attn_tp_ = m.attn_tp;
    for (int r = 0; r < tp_->size(); ++r) {
      ModelRunner* p = peer(r);
      p->builder_.set_block_base(int32_t(p->model().mapping().attn_dp_rank * num_blocks()));
    }
  }
}

int ModelRunner::tp_size() const { return tp_ ? tp_->size() : 1; }

void ModelRunner::enable_graphs(const GraphOptions& o) {
  if (!tp_) return enable_graphs_local(o);
  // Every rank captures its own graphs, all at once: the warm-up forwards between captures
  // run collectives that need every rank. Only rank 0 draws progress bars.
  tp_->run([&](int r) {
    if (r == 0) return enable_graphs_local(o);
    GraphOptions po = o;
    po.progress = false;
    peers_[size_t(r)]->enable_graphs_local(po);
  });
}

void ModelRunner::enable_graphs_local(const GraphOptions& o) {
  if (model_->device() != Device::cuda) return;
  graphs_ = std::make_unique<CudaGraphRunner>(*this, o);
  graphs_->capture_all();
}

DeviceLogits* ModelRunner::logits_proc() {
  if (!logits_proc_ && model_->device() == Device::cuda)
    logits_proc_ = std::make_unique<DeviceLogits>(DeviceLogits::kDefaultSlots, model_->config().vocab_size,
                                                  kLogitsProcRows, Device::cuda);
  return logits_proc_.get();
}

bool ModelRunner::run_sampled(const std::vector<SeqChunk>& chunks, const std::vector<ops::SamplingRow>& rows,
                              std::vector<int32_t>& ids, const std::vector<ops::LogitsProcRow>* proc,
                              const StepMasks* masks) {
  build_s_ = 0;
  // Under tensor parallelism every rank must replay its graph (the collectives inside wait for
  // all of them): such steps go through run(), which drives every rank, and sample after it.
  if (tp_) return false;
  return graphs_ && graphs_->try_run_sampled(chunks, rows, batch_, ids, proc, masks);
}

TokenMaskBuffer* ModelRunner::token_mask(int64_t rows) {
  const int64_t want = std::max<int64_t>(rows, 256);
  if (!token_mask_ || (!token_mask_frozen_ && token_mask_->rows_cap() < rows)) {
    const int64_t cap = token_mask_ ? std::max(want, token_mask_->rows_cap()) : want;
    token_mask_ = std::make_unique<TokenMaskBuffer>(cap, model_->config().vocab_size, model_->device());
  }
  if (graphs_) token_mask_frozen_ = true;
  return token_mask_.get();
}

bool ModelRunner::run_greedy(const std::vector<SeqChunk>& chunks, std::vector<int32_t>& ids) {
  build_s_ = 0;
  // TP ranks must all run (run() drives them); worker nodes replay run()'s steps only.
  if (tp_ || channel_ || model_->device() == Device::cpu || chunks.empty()) return false;
  // With graphs, only a greedy graph (batch 1-2 decode): elsewhere the sampling decode graph
  // beats an eager forward, and steps no graph fits take run() as before.
  if (graphs_) return graphs_->try_run_greedy(chunks, batch_, ids);
  if (has_state()) return false;  // run_local checks the state slots; keep one place for it
  int n = 0;
  for (const SeqChunk& c : chunks)
    n += c.logits == SeqChunk::Logits::none ? 0 : c.logits == SeqChunk::Logits::last ? 1 : c.num_tokens;
  if (!greedy_ids_.data || greedy_ids_.numel() < n) {
    greedy_ids_ = Tensor::zeros({std::max<int64_t>(n + n / 2, 256)}, DType::i32, model_->device());
    if (!greedy_scratch_.data) greedy_scratch_ = Tensor::zeros({ops::kLmArgmaxScratch}, DType::i64, model_->device());
  }
  auto t0 = std::chrono::steady_clock::now();
  builder_.build(chunks, kv_.block_size, model_->device(), batch_);
  build_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  batch_.capture_aux = false;
  batch_.greedy_ids = greedy_ids_;
  batch_.greedy_scratch = greedy_scratch_;
  try {
    logits_ = model_->forward(batch_, kv_);
  } catch (...) {
    batch_.greedy_ids = batch_.greedy_scratch = Tensor();
    throw;
  }
  batch_.greedy_ids = batch_.greedy_scratch = Tensor();
  Tensor dev_ids = greedy_ids_.narrow(0, 0, n);
  if (!batch_.greedy_done) ops::argmax_rows(logits_, nullptr, dev_ids);  // the head did not fuse at these rows
  ids.resize(size_t(n));
  if (n > 0) device_copy(ids.data(), Device::cpu, dev_ids.data, dev_ids.device, size_t(n) * sizeof(int32_t));
  return true;
}

Tensor ModelRunner::aux_buffer(int64_t rows) {
  int64_t width = int64_t(model_->capture_layers().size()) * model_->config().hidden_size;
  if (!aux_buf_.data || aux_buf_.size(0) < rows)
    aux_buf_ = Tensor::empty({std::max<int64_t>(rows, 256), width}, model_->dtype(), model_->device());
  return aux_buf_.slice_rows(0, rows);
}

const Tensor& ModelRunner::run(const std::vector<SeqChunk>& chunks, bool capture_aux, bool host_logits) {
  if (channel_) channel_->send_step(chunks, capture_aux);  // the worker nodes run the same step
  if (!tp_) return run_local(chunks, capture_aux, host_logits);
  if (dp_groups_ > 1) return run_dp(chunks, capture_aux);
  // All ranks run the same step; only rank 0's logits are returned (all ranks hold them).
  tp_->run([&](int r) {
    if (r == 0) run_local(chunks, capture_aux, host_logits);
    else peers_[size_t(r)]->run_local(chunks, capture_aux, false);
  });
  return logits_;
}

const Tensor& ModelRunner::run_local(const std::vector<SeqChunk>& chunks, bool capture_aux, bool host_logits) {
  bool cap = capture_aux && !model_->capture_layers().empty();
  auto t0 = std::chrono::steady_clock::now();
  build_s_ = 0;
  if (has_state())
    for (auto& c : chunks)
      TS_CHECK(c.state_slot >= 0 && c.state_slot < kv_.num_state_slots,
               "{}: every sequence needs a recurrent-state slot (got {}; pool of {})", model_->config().architecture,
               c.state_slot, kv_.num_state_slots);
  if (!graphs_ || !graphs_->try_run(chunks, cap, batch_, logits_)) {
    builder_.build(chunks, kv_.block_size, model_->device(), batch_);
    build_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    batch_.capture_aux = cap;
    if (cap) batch_.aux_hidden = aux_buffer(batch_.num_tokens);
    logits_ = model_->forward(batch_, kv_);
  }
  if (host_logits && logits_.device != Device::cpu) logits_ = to_host(logits_);
  return logits_;
}

const Tensor& ModelRunner::run_dp(const std::vector<SeqChunk>& chunks, bool capture_aux) {
  auto group_of = [&](const SeqChunk& c) {
    TS_CHECK(c.block_table && !c.block_table->empty(), "data parallel step: a chunk without blocks");
    const int64_t g = c.block_table->back() / num_blocks();  // (KvCache::table_group)
    TS_CHECK(g >= 0 && g < dp_groups_, "data parallel step: block {} outside {} groups of {} blocks",
             c.block_table->back(), dp_groups_, num_blocks());
    return int(g);
  };
  tp_->run([&](int r) {
    ModelRunner& me = *peer(r);
    const int g = me.model().mapping().attn_dp_rank;
    me.dp_chunks_.clear();
    for (const SeqChunk& c : chunks)
      if (group_of(c) == g) me.dp_chunks_.push_back(c);
    me.run_local(me.dp_chunks_, capture_aux, true);
  });
  // Every chunk's logits rows, in chunk order, from its group's first rank (rows in that
  // rank's chunk order, which keeps the step's order).
  auto rows_of = [](const SeqChunk& c) -> int64_t {
    return c.logits == SeqChunk::Logits::none ? 0 : c.logits == SeqChunk::Logits::last ? 1 : c.num_tokens;
  };
  int64_t n = 0;
  for (const SeqChunk& c : chunks) n += rows_of(c);
  const int64_t V = model_->config().vocab_size;
  if (!dp_logits_.data || dp_logits_.size(0) < n)
    dp_logits_ = Tensor::empty({std::max<int64_t>(n + n / 4, 16), V}, DType::f32, Device::cpu);
  dp_cursor_.assign(size_t(dp_groups_), 0);
  int64_t row = 0;
  for (const SeqChunk& c : chunks) {
    const int g = group_of(c);
    const int64_t k = rows_of(c);
    if (k == 0) continue;
    const Tensor& src = peer(g * dp_attn_tp_)->logits_;
    TS_CHECK(src.device == Device::cpu && src.dtype == DType::f32 && src.size(-1) == V && src.is_contiguous(),
             "data parallel step: group {} logits {} ({})", g, src.shape_str(), dtype_name(src.dtype));
    const int64_t at = dp_cursor_[size_t(g)];
    TS_CHECK(at + k <= src.size(0), "data parallel step: group {} returned {} logits rows, needs {}", g, src.size(0),
             at + k);
    std::memcpy(dp_logits_.ptr<float>() + row * V, src.ptr<float>() + at * V, size_t(k * V) * sizeof(float));
    dp_cursor_[size_t(g)] = at + k;
    row += k;
  }
  logits_ = dp_logits_.slice_rows(0, n);
  return logits_;
}

Tensor ModelRunner::to_host(const Tensor& logits) {
  // One reused pinned buffer: Tensor::to(cpu) took a fresh pageable buffer every step, paying
  // its page faults (glibc maps blocks over 32 MiB anew each time, e.g. 64 rows x 152k vocab
  // f32) plus a staged copy, several ms a step the engine's device-sampled steps never pay.
  TS_CHECK(logits.is_contiguous(), "logits to host: not contiguous ({})", logits.shape_str());
  const size_t bytes = logits.nbytes();
  if (!host_buf_ || host_cap_ < bytes) {
    host_cap_ = bytes + bytes / 4;  // batches grow a little at a time
    host_buf_ = host_pinned_alloc(host_cap_);
  }
  Tensor h = Tensor::from_blob(host_buf_.get(), logits.dims(), logits.dtype, Device::cpu, host_buf_);
  device_copy(h.data, Device::cpu, logits.data, logits.device, bytes);
  return h;
}

}  // namespace ts
