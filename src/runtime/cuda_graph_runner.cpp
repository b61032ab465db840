#include "runtime/cuda_graph_runner.h"

#include <chrono>
#include <cstdio>

#include "core/log.h"
#include "ops/graph_hooks.h"
#include "ops/lm_head.h"
#include "runtime/device_logits.h"
#include "runtime/token_mask.h"

#ifdef TS_WITH_CUDA
#include "core/device_memory.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/graph.h"
#include "ops/cuda/logits_proc.h"
#include "core/cuda/runtime.h"
#endif

namespace ts {

std::vector<int> decode_buckets(int max_bs) {
  std::vector<int> b;
  for (int s : {1, 2, 4, 8})
    if (s <= max_bs) b.push_back(s);
  for (int s = 16; s <= max_bs; s += 8) b.push_back(s);
  if (!b.empty() && b.back() != max_bs && max_bs > 8) b.push_back(max_bs);
  return b;
}

std::vector<int> context_buckets(int max_context) {
  std::vector<int> b;
  for (int k = 1024; k < max_context; k *= 4) b.push_back(k);
  b.push_back(max_context);
  return b;
}

std::vector<int> prefill_buckets(int max_tokens) {
  std::vector<int> b;
  for (int s = 16; s <= max_tokens;) {
    b.push_back(s);
    int step = 1;
    while (step * 2 <= s / 8) step *= 2;
    s += std::min(step, 512);
  }
  if (max_tokens >= 16 && b.back() != max_tokens) b.push_back(max_tokens);
  return b;
}

#ifdef TS_WITH_CUDA

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void progress(const char* what, size_t done, size_t total, int bucket) {
  int width = 30, filled = int(width * done / std::max<size_t>(total, 1));
  std::fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu (bucket=%d avail_mem=%.1f GB)", what, filled,
               "##############################", width - filled, "", done, total, bucket,
               double(cuda::free_memory()) / 1e9);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// Records segment graphs between break ops (see ops/graph_hooks.h).
class CaptureHooks final : public ops::GraphHooks {
 public:
  explicit CaptureHooks(std::vector<std::unique_ptr<cuda::Graph>>& segs) : segs_(segs) {}
  bool in_segment() const override { return in_; }
  bool skip_ops() const override { return false; }
  void before_break() override { end(); }
  void after_break() override { begin(); }
  void segment_begin() override {
    in_ = true;
    begin();
  }
  void segment_end() override {
    if (!in_) return;
    end();
    in_ = false;
  }

 private:
  void begin() {
    segs_.push_back(std::make_unique<cuda::Graph>());
    segs_.back()->begin_capture();
  }
  void end() { segs_.back()->end_capture(); }
  std::vector<std::unique_ptr<cuda::Graph>>& segs_;
  bool in_ = false;
};

class ReplayHooks final : public ops::GraphHooks {
 public:
  explicit ReplayHooks(const std::vector<std::unique_ptr<cuda::Graph>>& segs) : segs_(segs) {}
  bool in_segment() const override { return in_; }
  bool skip_ops() const override { return in_; }
  void before_break() override { next(); }
  void after_break() override {}
  void segment_begin() override { in_ = true; }
  void segment_end() override {
    if (!in_) return;
    next();
    in_ = false;
  }

 private:
  void next() {
    TS_CHECK(i_ < segs_.size(), "prefill graph replay: more segments than were captured");
    segs_[i_++]->replay();
  }
  const std::vector<std::unique_ptr<cuda::Graph>>& segs_;
  size_t i_ = 0;
  bool in_ = false;
};

struct HooksGuard {
  explicit HooksGuard(ops::GraphHooks* h) { ops::graph_hooks() = h; }
  ~HooksGuard() { ops::graph_hooks() = nullptr; }
};

}  // namespace

struct CudaGraphRunner::Impl {
  ModelRunner& runner;
  GraphOptions o;
  BatchBuilder builder;
  BuildOptions reserve_opts;
  int width = 1;  // block-table row length of every graph batch
  struct Decode {
    std::unique_ptr<cuda::Graph> graph;  // the forward: logits [bs, V] into `logits`
    std::unique_ptr<cuda::Graph> tail;   // mask, processing, sampling of `logits` into samp_ids
    Tensor logits;
  };
  std::map<std::pair<int, int>, Decode> decode;  // (kv bound, bs) -> graph
  // Greedy decode graphs (forward with the fused LM head + argmax into greedy_ids), for the
  // small batch sizes where the head fuses; same keys.
  std::map<std::pair<int, int>, std::unique_ptr<cuda::Graph>> greedy;
  Tensor greedy_ids, greedy_scratch;
  std::vector<int> kv_bounds;                     // context buckets of the decode graphs
  std::map<int, std::vector<std::unique_ptr<cuda::Graph>>> prefill;          // tokens -> segments
  std::vector<int32_t> dummy_ids;
  std::vector<std::vector<int32_t>> dummy_tables;
  // Sampling inside the decode graphs: parameters and ids live in one static device buffer
  // (8-byte fields first): seed i64, counter i64, temperature f32, top_k i32, top_p f32, min_p f32,
  // ids i32 — each [max_bs]; one host->device copy per step.
  Tensor samp_buf;
  ops::cuda::DeviceSamplingParams samp;
  Tensor samp_ids;
  std::vector<unsigned char> samp_host;
  StagedUpload samp_up;  // pinned, asynchronous: a pageable copy per step stalled the host
  int samp_cap = 0;

  void init_sampling(int cap) {
    samp_cap = std::max(cap, 1);
    size_t n = size_t(samp_cap);
    samp_buf = Tensor::zeros({int64_t(n * 36)}, DType::u8, Device::cuda);
    char* base = samp_buf.ptr<char>();
    auto view = [&](size_t off, DType dt) { return Tensor::from_blob(base + off, {int64_t(n)}, dt, Device::cuda, samp_buf.owner); };
    samp.seed = view(0, DType::i64);
    samp.counter = view(8 * n, DType::i64);
    samp.temperature = view(16 * n, DType::f32);
    samp.top_k = view(20 * n, DType::i32);
    samp.top_p = view(24 * n, DType::f32);
    samp.min_p = view(28 * n, DType::f32);
    samp_ids = view(32 * n, DType::i32);
    samp_host.assign(n * 32, 0);
  }
  // Uploads rows (padding rows: greedy) for a graph of batch size bs.
  void upload_sampling(const std::vector<ops::SamplingRow>& rows) {
    size_t n = size_t(samp_cap);
    std::fill(samp_host.begin(), samp_host.end(), 0);
    unsigned char* h = samp_host.data();
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(h + 8 * i, &rows[i].seed, 8);
      std::memcpy(h + 8 * n + 8 * i, &rows[i].counter, 8);
      std::memcpy(h + 16 * n + 4 * i, &rows[i].temperature, 4);
      std::memcpy(h + 20 * n + 4 * i, &rows[i].top_k, 4);
      std::memcpy(h + 24 * n + 4 * i, &rows[i].top_p, 4);
      std::memcpy(h + 28 * n + 4 * i, &rows[i].min_p, 4);
    }
    for (size_t i = rows.size(); i < n; ++i) {  // padding rows: top_p 1 (greedy needs no more)
      float one = 1.0f;
      std::memcpy(h + 24 * n + 4 * i, &one, 4);
    }
    samp_up.upload(samp_buf.data, h, samp_host.size());
  }

  // The sampling tail of a decode graph: grammar bitmask (all-ones rows are skipped by the
  // kernel), logits processing, sampling, count update. A row has a mask or processing, never
  // both (DeviceLogits::supported excludes grammars).
  void process(DeviceLogits* proc, TokenMaskBuffer* mask, Tensor& logits, Tensor& ids) {
    if (mask) {
      Tensor m = mask->rows(logits.size(0));
      ops::cuda::apply_token_bitmask(logits, m);
    }
    if (proc) ops::cuda::logits_process(logits, proc->state());
    ops::cuda::sample_device(logits, samp, ids);
    if (proc) ops::cuda::logits_count(ids, proc->state());
  }

  Impl(ModelRunner& r, const GraphOptions& opt) : runner(r), o(opt) {
    builder.set_start_listener(r.step_listener_slot());
    int bs = r.block_size();
    width = (o.max_context + bs - 1) / bs;
    // Decode attention sizes its split-KV grid from the context bound baked into the graph;
    // one bound for all contexts would make short contexts pay for the longest (on H200 an
    // 8B decode at 1k context ran 20% slower than eager). So each batch size has a graph
    // per context bucket.
    kv_bounds = context_buckets(o.max_context);
  }

  void set_greedy(ForwardBatch& batch) {
    batch.greedy_ids = greedy_ids;
    batch.greedy_scratch = greedy_scratch;
  }
  // Decode graphs never copy aux hidden states (EAGLE3 verifies run through prefill graphs).
  static void no_aux(ForwardBatch& batch) {
    batch.capture_aux = false;
    batch.aux_hidden = Tensor();
  }
  BuildOptions decode_opts(int bs, int kv_bound) const {
    BuildOptions b;
    b.pad_tokens = b.pad_seqs = bs;
    b.table_width = width;
    b.max_kv_bound = kv_bound;
    b.all_logits = true;
    b.reserve = reserve_elems();
    return b;
  }
  void set_aux(ForwardBatch& batch) {
    batch.capture_aux = o.capture_aux;
    if (o.capture_aux) batch.aux_hidden = runner.aux_buffer(batch.num_tokens);
  }
  BuildOptions prefill_opts(int tokens) const {
    BuildOptions b;
    b.pad_tokens = tokens;
    b.reserve = reserve_elems();
    return b;
  }
  size_t reserve_elems() const {
    size_t t = size_t(std::max(o.eager_max_tokens, std::max(o.max_prefill_tokens, o.max_bs)));
    size_t s = size_t(std::max(o.max_bs, 256));
    return BatchBuilder::buffer_elems(t, s, size_t(width));
  }

  // `n` dummy sequences of `len` tokens each, caches in the first blocks of the pool.
  std::vector<SeqChunk> dummy(int n, int len) {
    int bs = runner.block_size();
    int blocks = (len + bs - 1) / bs;
    TS_CHECK(int64_t(blocks) <= runner.num_blocks(), "graph capture needs {} KV blocks, the pool has {}", blocks, runner.num_blocks());
    dummy_ids.assign(size_t(len), 0);
    dummy_tables.assign(size_t(n), std::vector<int32_t>());
    for (auto& t : dummy_tables)
      for (int i = 0; i < blocks; ++i) t.push_back(i);
    std::vector<SeqChunk> c;
    for (int i = 0; i < n; ++i) c.push_back({dummy_ids.data(), len, 0, &dummy_tables[size_t(i)], SeqChunk::Logits::last});
    return c;
  }
};

CudaGraphRunner::CudaGraphRunner(ModelRunner& runner, const GraphOptions& o) : impl_(std::make_unique<Impl>(runner, o)) {}
CudaGraphRunner::~CudaGraphRunner() = default;

void CudaGraphRunner::capture_all() {
  Impl& I = *impl_;
  models::Model& m = I.runner.model();
  Workspace* ws = m.workspace();
  TS_CHECK(ws, "CUDA graphs need a model with a workspace arena");
  double t0 = now_s();
  ForwardBatch batch;
  // 1. Size the arena for the largest eager forward, then freeze it: captured graphs keep
  //    pointing into it.
  int eager_t = int(std::min<int64_t>(I.o.eager_max_tokens, I.runner.num_blocks() * I.runner.block_size()));
  I.builder.build(I.dummy(1, eager_t), I.runner.block_size(), Device::cuda, batch, I.prefill_opts(eager_t));
  I.set_aux(batch);
  m.forward(batch, I.runner.kv());
  auto dec = I.o.decode ? decode_buckets(I.o.max_bs) : std::vector<int>{};
  for (auto it = dec.rbegin(); it != dec.rend(); ++it) {  // the largest decode batch too
    I.builder.build(I.dummy(*it, 1), I.runner.block_size(), Device::cuda, batch, I.decode_opts(*it, I.o.max_context));
    I.no_aux(batch);
    m.forward(batch, I.runner.kv());
    break;
  }
  cuda::synchronize();
  ws->reset();
  ws->freeze();
  // 2. Decode graphs (forward + sampling), largest first, one per context bucket.
  I.init_sampling(dec.empty() ? 1 : dec.back());
  I.upload_sampling({});
  // Device logits processing runs in every decode graph (a no-op for rows without a slot), so
  // requests with penalties, logit_bias or min_tokens replay the same graphs.
  DeviceLogits* proc = I.runner.logits_proc();
  if (proc) proc->upload({}, proc->rows_cap());
  // Grammar masks too: every decode graph reads rows [0, bs) of the runner's mask buffer
  // (all-ones unless a step uploaded masks), which is never reallocated from here on.
  TokenMaskBuffer* mask = dec.empty() ? nullptr : I.runner.token_mask(dec.back());
  if (mask) mask->clear();
  size_t done = 0;
  for (auto it = dec.rbegin(); it != dec.rend(); ++it) {
    int bs = *it;
    for (int kvb : I.kv_bounds) try {
      I.builder.build(I.dummy(bs, 1), I.runner.block_size(), Device::cuda, batch, I.decode_opts(bs, kvb));
      I.no_aux(batch);
      {
        Tensor warm = m.forward(batch, I.runner.kv());  // warm-up: GEMM algorithms, kernel workspaces
        Tensor ids = I.samp_ids.narrow(0, 0, bs);
        I.process(proc, mask, warm, ids);
      }
      cuda::synchronize();
      auto g = std::make_unique<cuda::Graph>(), tail = std::make_unique<cuda::Graph>();
      Tensor logits;
      cuda::Graph* open = g.get();
      try {
        g->begin_capture();
        logits = m.forward(batch, I.runner.kv());
        g->end_capture();
        open = tail.get();
        tail->begin_capture();
        Tensor ids = I.samp_ids.narrow(0, 0, bs);
        I.process(proc, mask, logits, ids);
        tail->end_capture();
      } catch (...) {
        try { open->end_capture(); } catch (...) {}
        throw;
      }
      I.decode[{kvb, bs}] = {std::move(g), std::move(tail), logits};
    } catch (const std::exception& e) {
      spdlog::warn("decode graph bs={} context<={} not captured ({}); it runs eagerly", bs, kvb, e.what());
    }
    if (I.o.progress) progress("Capturing decode buckets", ++done, dec.size(), bs);
  }
  // 2b. Greedy decode graphs for the batch sizes whose LM head fuses with the argmax (the
  //     forward says so through greedy_done on its warm-up run).
  I.greedy_ids = Tensor::zeros({std::max<int64_t>(dec.empty() ? 1 : dec.back(), 8)}, DType::i32, Device::cuda);
  I.greedy_scratch = Tensor::zeros({ops::kLmArgmaxScratch}, DType::i64, Device::cuda);
  for (int bs : dec) {
    bool fused = true;
    for (int kvb : I.kv_bounds) try {
      I.builder.build(I.dummy(bs, 1), I.runner.block_size(), Device::cuda, batch, I.decode_opts(bs, kvb));
      I.no_aux(batch);
      I.set_greedy(batch);
      m.forward(batch, I.runner.kv());
      cuda::synchronize();
      if (!batch.greedy_done) {
        fused = false;
        break;
      }
      auto g = std::make_unique<cuda::Graph>();
      g->begin_capture();
      try {
        m.forward(batch, I.runner.kv());
      } catch (...) {
        try { g->end_capture(); } catch (...) {}
        throw;
      }
      g->end_capture();
      I.greedy[{kvb, bs}] = std::move(g);
    } catch (const std::exception& e) {
      spdlog::warn("greedy decode graph bs={} context<={} not captured ({}); it runs the sampling graph", bs, kvb, e.what());
    }
    batch.greedy_ids = batch.greedy_scratch = Tensor();
    if (!fused) break;  // larger batches do not fuse either
  }
  // 3. Breakable prefill graphs, largest first.
  auto pre = I.o.prefill ? prefill_buckets(I.o.max_prefill_tokens) : std::vector<int>{};
  done = 0;
  for (auto it = pre.rbegin(); it != pre.rend(); ++it) {
    int t = *it;
    std::vector<std::unique_ptr<cuda::Graph>> segs;
    try {
      I.builder.build(I.dummy(1, t), I.runner.block_size(), Device::cuda, batch, I.prefill_opts(t));
      I.set_aux(batch);
      m.forward(batch, I.runner.kv());
      cuda::synchronize();
      CaptureHooks hooks(segs);
      {
        HooksGuard guard(&hooks);
        m.forward(batch, I.runner.kv());
      }
      cuda::synchronize();
      I.prefill[t] = std::move(segs);
    } catch (const std::exception& e) {
      ops::graph_hooks() = nullptr;
      spdlog::warn("prefill graph tokens={} not captured ({}); that size runs eagerly", t, e.what());
    }
    if (I.o.progress) progress("Capturing prefill buckets", ++done, pre.size(), t);
  }
  cuda::synchronize();
  capture_s_ = now_s() - t0;
  spdlog::info("CUDA graphs: {} decode + {} prefill buckets captured in {:.2f} s, shared pool {:.1f} MiB", I.decode.size(),
               I.prefill.size(), capture_s_, double(pool_bytes()) / (1 << 20));
}

bool CudaGraphRunner::try_run(const std::vector<SeqChunk>& chunks, bool capture_aux, ForwardBatch& batch, Tensor& logits) {
  Impl& I = *impl_;
  if (chunks.empty()) return false;
  int tokens = 0, max_kv = 0;
  bool decode = true;
  for (auto& c : chunks) {
    tokens += c.num_tokens;
    max_kv = std::max(max_kv, c.start_pos + c.num_tokens);
    decode = decode && c.num_tokens == 1 && c.logits == SeqChunk::Logits::last;
    if (int(c.block_table->size()) > I.width) return false;
  }
  models::Model& m = I.runner.model();
  if (decode && !capture_aux) {
    auto kv = std::lower_bound(I.kv_bounds.begin(), I.kv_bounds.end(), max_kv);
    if (kv == I.kv_bounds.end()) return false;
    auto it = I.decode.lower_bound({*kv, int(chunks.size())});
    if (it == I.decode.end() || it->first.first != *kv) return false;
    I.builder.build(chunks, I.runner.block_size(), Device::cuda, batch, I.decode_opts(it->first.second, *kv));
    I.no_aux(batch);
    // The forward only: the caller samples (and processes) these logits itself.
    it->second.graph->replay();
    logits = it->second.logits.slice_rows(0, int64_t(chunks.size()));
    return true;
  }
  if (capture_aux && !I.o.capture_aux) return false;
  auto it = I.prefill.lower_bound(tokens);
  if (it == I.prefill.end()) return false;
  I.builder.build(chunks, I.runner.block_size(), Device::cuda, batch, I.prefill_opts(it->first));
  I.set_aux(batch);
  ReplayHooks hooks(it->second);
  HooksGuard guard(&hooks);
  logits = m.forward(batch, I.runner.kv());
  return true;
}

bool CudaGraphRunner::try_run_sampled(const std::vector<SeqChunk>& chunks, const std::vector<ops::SamplingRow>& rows,
                                      ForwardBatch& batch, std::vector<int32_t>& ids,
                                      const std::vector<ops::LogitsProcRow>* proc, const StepMasks* masks) {
  Impl& I = *impl_;
  if (chunks.empty() || rows.size() != chunks.size() || int(chunks.size()) > I.samp_cap) return false;
  DeviceLogits* dl = I.runner.logits_proc_if_any();
  if (proc && (!dl || proc->size() != chunks.size())) return false;
  int max_kv = 0;
  for (auto& c : chunks) {
    if (c.num_tokens != 1 || c.logits != SeqChunk::Logits::last || int(c.block_table->size()) > I.width) return false;
    max_kv = std::max(max_kv, c.start_pos + 1);
  }
  auto kv = std::lower_bound(I.kv_bounds.begin(), I.kv_bounds.end(), max_kv);
  if (kv == I.kv_bounds.end()) return false;
  auto it = I.decode.lower_bound({*kv, int(chunks.size())});
  if (it == I.decode.end() || it->first.first != *kv) return false;
  I.builder.build(chunks, I.runner.block_size(), Device::cuda, batch, I.decode_opts(it->first.second, *kv));
  I.no_aux(batch);
  TokenMaskBuffer* mask = I.runner.token_mask_if_any();
  if (masks && masks->any && (!mask || masks->cons.size() != chunks.size())) return false;
  I.upload_sampling(rows);
  if (dl) dl->upload(proc ? *proc : std::vector<ops::LogitsProcRow>{}, it->first.second);
  it->second.graph->replay();
  // The forward is queued; now wait for the masks (overlap: the engine thread is still applying
  // the previous step, whose tokens they follow), then the tail samples under them.
  if (mask) {
    if (masks && masks->any) mask->upload(*masks);
    else mask->clear();
  }
  it->second.tail->replay();
  ids.resize(chunks.size());
  device_copy(ids.data(), Device::cpu, I.samp_ids.data, Device::cuda, ids.size() * sizeof(int32_t));
  return true;
}

bool CudaGraphRunner::try_run_greedy(const std::vector<SeqChunk>& chunks, ForwardBatch& batch, std::vector<int32_t>& ids) {
  Impl& I = *impl_;
  if (chunks.empty() || I.greedy.empty()) return false;
  int max_kv = 0;
  for (auto& c : chunks) {
    if (c.num_tokens != 1 || c.logits != SeqChunk::Logits::last || int(c.block_table->size()) > I.width) return false;
    max_kv = std::max(max_kv, c.start_pos + 1);
  }
  auto kv = std::lower_bound(I.kv_bounds.begin(), I.kv_bounds.end(), max_kv);
  if (kv == I.kv_bounds.end()) return false;
  auto it = I.greedy.lower_bound({*kv, int(chunks.size())});
  if (it == I.greedy.end() || it->first.first != *kv) return false;
  I.builder.build(chunks, I.runner.block_size(), Device::cuda, batch, I.decode_opts(it->first.second, *kv));
  I.no_aux(batch);
  it->second->replay();
  ids.resize(chunks.size());
  device_copy(ids.data(), Device::cpu, I.greedy_ids.data, Device::cuda, ids.size() * sizeof(int32_t));
  return true;
}

size_t CudaGraphRunner::pool_bytes() const {
  Workspace* ws = impl_->runner.model().workspace();
  return ws ? ws->capacity() : 0;
}
int CudaGraphRunner::decode_graphs() const { return int(impl_->decode.size()); }
int CudaGraphRunner::prefill_graphs() const { return int(impl_->prefill.size()); }

#else  // no CUDA backend: graphs never apply

struct CudaGraphRunner::Impl {};
CudaGraphRunner::CudaGraphRunner(ModelRunner&, const GraphOptions&) {}
CudaGraphRunner::~CudaGraphRunner() = default;
void CudaGraphRunner::capture_all() {}
bool CudaGraphRunner::try_run(const std::vector<SeqChunk>&, bool, ForwardBatch&, Tensor&) { return false; }
bool CudaGraphRunner::try_run_sampled(const std::vector<SeqChunk>&, const std::vector<ops::SamplingRow>&, ForwardBatch&,
                                      std::vector<int32_t>&, const std::vector<ops::LogitsProcRow>*, const StepMasks*) {
  return false;
}
bool CudaGraphRunner::try_run_greedy(const std::vector<SeqChunk>&, ForwardBatch&, std::vector<int32_t>&) { return false; }

size_t CudaGraphRunner::pool_bytes() const { return 0; }
int CudaGraphRunner::decode_graphs() const { return 0; }
int CudaGraphRunner::prefill_graphs() const { return 0; }

#endif

}  // namespace ts
