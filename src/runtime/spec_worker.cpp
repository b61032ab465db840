#include "runtime/spec_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/device_memory.h"
#include "core/log.h"
#include "ops/cpu/cpu_ops.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/sampler.h"
#include "runtime/structured.h"

#ifdef TS_WITH_CUDA
#include "ops/cuda/graph.h"
#include "core/cuda/runtime.h"
#endif

namespace ts {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

// Rows of the draft-state pool. A request holds its row through a handle that gives it back
// when the request is destroyed (on any thread) or finishes.
struct SpecWorker::FreeSlots {
  std::mutex mu;
  std::vector<int> free;
  static std::shared_ptr<const int> take(const std::shared_ptr<FreeSlots>& self) {
    std::lock_guard<std::mutex> lk(self->mu);
    TS_CHECK(!self->free.empty(), "EAGLE3: every draft-state slot is in use");
    int s = self->free.back();
    self->free.pop_back();
    std::weak_ptr<FreeSlots> w = self;
    return std::shared_ptr<const int>(new int(s), [w](const int* p) {
      if (auto f = w.lock()) {
        std::lock_guard<std::mutex> lk(f->mu);
        f->free.push_back(*p);
      }
      delete p;
    });
  }
};

// Per (context bound, bucket): the three phases of the fixed-shape step as separate graphs
// (host acceptance goes between verify and catch-up; phase timing) and all three as one graph
// (greedy steps: one launch).
struct SpecWorker::LaneGraphs {
#ifdef TS_WITH_CUDA
  using GraphPtr = std::unique_ptr<cuda::Graph>;
#else
  using GraphPtr = std::unique_ptr<int>;
#endif
  GraphPtr draft, verify, catchup, all;
  Tensor vlogits;  // the verify graph's logits (in the target's arena)
};

// The fixed-shape decode step. Every request gets n rows:
//   draft steps s = 1..n-2: one row per request (input d_s at position ctx+s-1, hidden from the
//     pool for s = 1, else the previous step's r); the argmax (mapped by d2t) is written straight
//     into the verify inputs and the next step's inputs on the device;
//   verify: n one-token rows per request, row j = [last, d1..d_{n-1}][j] at position ctx+j with
//     the request's block table (the cache writes of all rows happen before any row attends, so
//     row j sees rows < j: causal verify through the decode attention kernel);
//   acceptance: target argmax per row -> tgt, acc = leading drafts equal to tgt (greedy on the
//     device; sampled/penalised requests are accepted on the host between the two segments);
//   catch-up: the draft over all n rows with ids tgt (= accepted drafts, then the bonus) and the
//     verify's aux hidden states; rows past acc write draft-cache entries that the next step
//     overwrites before anything reads them. The state row acc goes to the pool.
// Shapes depend only on (bucket, n), so a lane's buffers and batches are graph inputs.
struct SpecWorker::Lane {
  int cap = 0, n = 0;
  // io (i32): slots [cap] | vids [cap*n] | tgt [cap*n] | acc [cap] | next [cap] | cnext [cap*n]
  Tensor io;
  std::vector<int32_t> host;
  std::unique_ptr<StagedUpload> up;  // CUDA: slots | vids upload
  Tensor ha, ch;  // [cap, H] draft-step hidden; [cap*n, H] catch-up hidden (both in place)
  std::vector<BatchBuilder> dbuild;
  std::vector<ForwardBatch> dfb;  // draft steps 1..n-2 at index s-1
  BatchBuilder vbuild;
  ForwardBatch vfb, cfb;
  Tensor vlogits;  // f32 [bucket*n, V] of the last segment A
  std::vector<std::vector<int32_t>> step_ids;
  std::vector<int32_t> vids_host;
  std::vector<SeqChunk> chunks;
  int width = 0;  // graph lanes: fixed block-table width
#ifdef TS_WITH_CUDA
  std::unique_ptr<cuda::StreamMarks> marks;  // device-time markers (CUDA lanes)
#endif
  using Graphs = LaneGraphs;
  std::map<std::pair<int, int>, Graphs> graphs;  // (kv bound, bucket)
  std::vector<int> kv_bounds, buckets;

  Tensor slots(int b) { return io.narrow(0, 0, b); }
  Tensor vids(int b) { return io.narrow(0, cap, int64_t(b) * n); }
  Tensor tgt(int b) { return io.narrow(0, cap + int64_t(cap) * n, int64_t(b) * n); }
  Tensor acc(int b) { return io.narrow(0, cap + 2 * int64_t(cap) * n, b); }
  Tensor next(int b) { return io.narrow(0, 2 * cap + 2 * int64_t(cap) * n, b); }
  Tensor cnext(int b) { return io.narrow(0, 3 * cap + 2 * int64_t(cap) * n, int64_t(b) * n); }

  void alloc(int c, int tokens_per_verify, int64_t H, DType dt, Device dev) {
    cap = c;
    n = tokens_per_verify;
    io = Tensor::zeros({3 * int64_t(cap) + 3 * int64_t(cap) * n}, DType::i32, dev);
    host.assign(size_t(io.numel()), 0);
    ha = Tensor::zeros({cap, H}, dt, dev);
    ch = Tensor::zeros({int64_t(cap) * n, H}, dt, dev);
    dbuild.resize(size_t(std::max(n - 2, 0)));
    dfb.resize(dbuild.size());
    step_ids.resize(dbuild.size());
  }
};

std::vector<int> SpecWorker::capture_layers_for(const EngineOptions& o, const io::ModelConfig& target) {
  std::vector<int> ids = o.eagle3_layers_to_capture;
  if (ids.empty() && !o.speculative_draft_model_path.empty()) {
    io::ModelConfig dc = io::load_config(o.speculative_draft_model_path);
    if (dc.raw.contains("eagle_config") && dc.raw["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"))
      ids = dc.raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>();
  }
  std::vector<int> layers;
  if (ids.empty()) {
    int L = int(target.num_layers);
    layers = {2, L / 2, L - 3};
  } else {
    for (int i : ids) layers.push_back(i + 1);
  }
  for (int l : layers)
    TS_CHECK(l >= 0 && l <= target.num_layers, "EAGLE3 capture layer {} outside 0..{}", l, target.num_layers);
  return layers;
}

SpecWorker::SpecWorker(const EngineOptions& o, ModelRunner& target) : target_(target) {
  TS_CHECK(o.speculative_algorithm == "EAGLE3" || o.speculative_algorithm == "eagle3",
           "--speculative-algorithm {} is not supported (supported: EAGLE3)", o.speculative_algorithm);
  TS_CHECK(!o.speculative_draft_model_path.empty(), "--speculative-algorithm EAGLE3 needs --speculative-draft-model-path");
  TS_CHECK(o.speculative_eagle_topk == 1, "--speculative-eagle-topk {} is not supported: only chain drafting (topk 1) is implemented",
           o.speculative_eagle_topk);
  TS_CHECK(o.speculative_num_steps >= 1, "--speculative-num-steps must be >= 1 (got {})", o.speculative_num_steps);
  TS_CHECK(o.drafter_attention_backend == "paged" || o.drafter_attention_backend == "default",
           "--drafter-attention-backend {} is not available (backends: paged)", o.drafter_attention_backend);
  n_ = o.speculative_num_draft_tokens > 0 ? o.speculative_num_draft_tokens : o.speculative_num_steps + 1;
  TS_CHECK(n_ >= 2, "--speculative-num-draft-tokens must be >= 2 (got {})", n_);
  draft_ = std::make_unique<models::Eagle3Draft>(o.speculative_draft_model_path, target.model());
  TS_CHECK(draft_->aux_width() == int64_t(target.model().capture_layers().size()) * target.model().config().hidden_size,
           "EAGLE3 draft fc expects {} aux features but the target captures {} layers of {}", draft_->aux_width(),
           target.model().capture_layers().size(), target.model().config().hidden_size);
  // The draft cache mirrors the target pool block for block, so both share block tables; it
  // takes the target's FP8 cache type under --kv-cache-dtype fp8 (the draft's attention reads
  // it through the same ops, scales 1.0: draft checkpoints ship none).
  models::KvSpec s = draft_->kv_spec();
  draft_kv_.block_size = target.block_size();
  draft_kv_.num_blocks = target.num_blocks();
  const DType kvt = target.kv_dtype() == DType::f8_e4m3 ? DType::f8_e4m3 : draft_->dtype();
  draft_kv_.k.push_back(Tensor::zeros({target.num_blocks(), target.block_size(), s.k_heads, s.k_dim}, kvt, draft_->device()));
  draft_kv_.v.push_back(Tensor::zeros({target.num_blocks(), target.block_size(), s.v_heads, s.v_dim}, kvt, draft_->device()));
  // Draft-state pool: running requests plus as many finished ones whose handles are still
  // alive, and one padding row.
  int slots = 2 * std::max(o.max_num_seqs, 1) + 16;
  h_pool_ = Tensor::zeros({slots + 1, draft_->hidden()}, draft_->dtype(), draft_->device());
  pad_slot_ = slots;
  free_slots_ = std::make_shared<FreeSlots>();
  for (int i = slots - 1; i >= 0; --i) free_slots_->free.push_back(i);
  eager_ = std::make_unique<Lane>();
  spdlog::info("EAGLE3: {} tokens per verify ({} draft steps), capture layers {}, draft vocab {}", n_, n_ - 1,
               fmt::join(target.model().capture_layers(), ","), draft_->draft_vocab());
}

SpecWorker::~SpecWorker() = default;

std::shared_ptr<const int> SpecWorker::acquire_slot() { return FreeSlots::take(free_slots_); }

int SpecWorker::slot_of(const Request& r) const {
  TS_CHECK(r.spec_slot, "EAGLE3: request {} runs without a draft-state slot", r.id);
  return *r.spec_slot;
}

static int32_t argmax(const float* l, int64_t v) {
  int64_t b = 0;
  for (int64_t i = 1; i < v; ++i)
    if (l[i] > l[b]) b = i;
  return int32_t(b);
}

// Draft steps 1..N-1 for all decoding requests at once: step s feeds draft token s at
// position n_ctx + s - 1 with the previous step's hidden r.
void SpecWorker::draft_loop(const std::vector<const Request*>& decodes, std::vector<std::vector<int32_t>>& drafts) {
  const int steps = n_ - 1;
  const int64_t H = draft_->hidden(), B = int64_t(decodes.size());
  drafts.assign(decodes.size(), {});
  for (size_t i = 0; i < decodes.size(); ++i) drafts[i].push_back(decodes[i]->spec_next);
  if (steps < 2 || B == 0) return;
  Tensor h = Tensor::empty({B, H}, draft_->dtype(), draft_->device());
  Tensor r = Tensor::empty({B, H}, draft_->dtype(), draft_->device());
  std::vector<int32_t> ids(decodes.size());
  std::vector<SeqChunk> chunks(decodes.size());
  for (int s = 1; s < steps; ++s) {
    for (size_t i = 0; i < decodes.size(); ++i) {
      const Request& q = *decodes[i];
      ids[i] = drafts[i].back();
      chunks[i] = {&ids[i], 1, q.num_computed + s - 1, &q.block_table, SeqChunk::Logits::last};
      Tensor hrow = h.slice_rows(int64_t(i), int64_t(i) + 1);
      ops::copy_rows(pool_row(q), hrow);
    }
    dbuilder_.build(chunks, draft_kv_.block_size, draft_->device(), dbatch_);
    Tensor logits = draft_->forward(dbatch_, draft_kv_, h, r);
    Tensor host = logits.device == Device::cpu ? logits : logits.to(Device::cpu);
    for (size_t i = 0; i < decodes.size(); ++i) {
      drafts[i].push_back(draft_->to_target(argmax(host.ptr<float>() + int64_t(i) * host.size(1), host.size(1))));
      Tensor rrow = r.slice_rows(int64_t(i), int64_t(i) + 1);
      Tensor dst = pool_row(*decodes[i]);
      ops::copy_rows(rrow, dst);
    }
  }
}

int SpecWorker::accept(const Request& r, const int32_t* drafts, int num_drafts, const float* logits, int64_t vocab,
                       StepResult& out, RowResult& row) {
  std::vector<float>& buf = accept_row_;
  std::vector<float>& p = accept_p_;
  buf.resize(size_t(vocab));
  const bool want_lp = r.params.logprobs >= 0;
  row.first = int(out.tokens.size());
  row.count = 0;
  row.lp_first = want_lp ? int(out.logprobs.size()) : -1;
  row.draft_first = int(out.drafts.size());
  row.draft_count = num_drafts;
  out.drafts.insert(out.drafts.end(), drafts, drafts + num_drafts);
  int acc = 0;
  // Structured outputs / logit_bias / min_tokens: verify position j is constrained by the grammar
  // state after drafts 1..j (the matcher walks over the drafts it accepts and is rolled back
  // after; the engine's apply() advances it over the ids it keeps). A draft the grammar forbids
  // has probability 0 under the masked logits, so it is rejected and the bonus token comes from
  // the masked distribution: greedy output equals plain decoding with the same constraints.
  // A draft the walk cannot follow (spec_advance false: a grammar phase change that needs a
  // fresh matcher) ends the drafts there: the next position is sampled as the bonus, under the
  // mask the walk still knows, so every row keeps accepted + 1 tokens (the catch-up reads them).
  LogitsConstraints* cons = r.constraints.get();
  if (cons) cons->spec_begin();
  int live = num_drafts;  // drafts still eligible
  for (int j = 0; j <= live; ++j) {
    std::copy(logits + int64_t(j) * vocab, logits + int64_t(j + 1) * vocab, buf.begin());
    // Penalties see every token accepted so far, like plain decoding.
    apply_penalties(buf.data(), vocab, r, out.tokens.data() + row.first, size_t(row.count));
    if (cons) cons->spec_apply(buf.data(), vocab, r.num_generated() + j);
    uint64_t ctr = uint64_t(r.num_generated() + j);
    ops::SamplingRow sp{r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p, r.seed, ctr};
    int32_t tok;
    bool is_draft = false;
    if (r.params.temperature <= 0.0f) {
      tok = argmax(buf.data(), vocab);
      is_draft = j < live && tok == drafts[j];
    } else {
      ops::cpu::sampling_probs(buf.data(), vocab, sp, p);
      if (j < live) {
        tok = verify_draft_token(p, drafts[j], r.seed, ctr, is_draft);
      } else {
        std::vector<int32_t> one;
        Tensor lt = Tensor::from_blob(buf.data(), {1, vocab}, DType::f32, Device::cpu);
        ops::cpu::sample(lt, {sp}, one);  // all drafts accepted: the bonus is a plain sample
        tok = one[0];
      }
    }
    if (want_lp) out.logprobs.push_back(token_logprob(logits + int64_t(j) * vocab, vocab, tok, r.params.logprobs));
    out.tokens.push_back(tok);
    ++row.count;
    if (!is_draft) break;
    ++acc;
    if (cons && !cons->spec_advance(tok)) live = j + 1;  // the bonus comes next
  }
  if (cons) cons->spec_end();
  row.accepted = acc;
  return acc;
}

double SpecWorker::mixed_step(const StepPlan& plan, const std::vector<size_t>& rows, StepResult& out) {
  double t0 = now_s();
  std::vector<const Request*> decodes;
  for (size_t k : rows)
    if (plan.chunks[k].req->is<state::Decoding>()) decodes.push_back(plan.chunks[k].req.get());
  // 1. Draft tokens for every decoding request.
  std::vector<std::vector<int32_t>> drafts;
  draft_loop(decodes, drafts);
  double fwd = now_s() - t0;
  draft_s_ += fwd;
  // 2. One target forward: verify rows for decodes, chunks for prefills; aux captured.
  std::vector<SeqChunk> seq;
  verify_ids_.resize(decodes.size());
  size_t di = 0;
  for (size_t k : rows) {
    const Request& r = *plan.chunks[k].req;
    const int num = plan.chunks[k].num_tokens;
    if (r.is<state::Decoding>()) {
      auto& v = verify_ids_[di];
      v.assign(1, r.tokens.back());
      v.insert(v.end(), drafts[di].begin(), drafts[di].end());
      seq.push_back({v.data(), int(v.size()), r.num_computed, &r.block_table, SeqChunk::Logits::all});
      ++di;
    } else {
      bool last = r.num_computed + num == int(r.tokens.size());
      seq.push_back({r.tokens.data() + r.num_computed, num, r.num_computed, &r.block_table,
                     last ? SeqChunk::Logits::last : SeqChunk::Logits::none});
    }
  }
  double f0 = now_s();
  Tensor logits = target_.run(seq, true);
  fwd += now_s() - f0;
  Tensor aux = target_.last_aux();
  const int64_t vocab = logits.size(1);
  // 3. Acceptance (decodes) and first-token sampling (completed prefills), in row order.
  int64_t lrow = 0;
  std::vector<SampleResult> samples;
  di = 0;
  for (size_t k : rows) {
    const Request& r = *plan.chunks[k].req;
    RowResult& row = out.rows[k];
    if (r.is<state::Decoding>()) {
      const auto& v = verify_ids_[di++];
      accept(r, v.data() + 1, int(v.size()) - 1, logits.ptr<float>() + lrow * vocab, vocab, out, row);
      lrow += int64_t(v.size());
    } else if (r.num_computed + plan.chunks[k].num_tokens == int(r.tokens.size())) {
      Tensor lrow_t = logits.slice_rows(lrow, lrow + 1);
      std::vector<const Request*> one{&r};
      sample_batch(lrow_t, one, samples);
      ++lrow;
      row.first = int(out.tokens.size());
      row.count = 1;
      out.tokens.push_back(samples[0].token);
      if (r.params.logprobs >= 0) {
        row.lp_first = int(out.logprobs.size());
        out.logprobs.push_back(samples[0].logprob);
      }
    }
  }
  // 4. One draft forward: catch-up over verified positions (ids = accepted drafts + bonus,
  //    hidden = verify aux rows) and the draft prefill of prefill chunks (ids shifted by one:
  //    draft entry p pairs token p+1 with target hidden p). Every row has its next token —
  //    the prompt's, or one produced above — so every row catches up; rows the engine then
  //    finishes wrote draft entries that nothing reads.
  double d0 = now_s();
  std::vector<SeqChunk> dseq;
  std::vector<int32_t> aux_rows;
  std::vector<size_t> drow;  // plan row of each dseq entry that wants the next draft input
  std::vector<int> dcount;
  // Catch-up ids: tokens [start + 1, start + count] of the request as it will be after apply
  // (its tokens, then the ids produced this step). Filled first, pointed into after.
  catch_ids_.clear();
  int32_t trow = 0;
  for (size_t q = 0; q < rows.size(); ++q) {
    const size_t k = rows[q];
    const Request& r = *plan.chunks[k].req;
    const RowResult& row = out.rows[k];
    const int n_in = seq[q].num_tokens, start = r.num_computed;
    const int count = row.accepted >= 0 ? row.accepted + 1 : n_in;
    const int have = int(r.tokens.size());
    for (int p = start + 1; p <= start + count; ++p)
      catch_ids_.push_back(p < have ? r.tokens[size_t(p)] : out.tokens[size_t(row.first + (p - have))]);
    dcount.push_back(count);
    for (int c = 0; c < count; ++c) aux_rows.push_back(trow + c);
    trow += n_in;
  }
  size_t off = 0;
  for (size_t q = 0; q < rows.size(); ++q) {
    const size_t k = rows[q];
    const Request& r = *plan.chunks[k].req;
    const bool want_logits = out.rows[k].count > 0;  // the row produced ids: it needs the next draft input
    dseq.push_back({catch_ids_.data() + off, dcount[q], r.num_computed, &r.block_table,
                    want_logits ? SeqChunk::Logits::last : SeqChunk::Logits::none});
    off += size_t(dcount[q]);
    drow.push_back(want_logits ? k : SIZE_MAX);
  }
  if (!dseq.empty()) {
    const int64_t H = draft_->hidden(), T = int64_t(aux_rows.size());  // [T, H] catch-up rows
    dbuilder_.build(dseq, draft_kv_.block_size, draft_->device(), dbatch_);
    Tensor idx = Tensor::from_blob(aux_rows.data(), {T}, DType::i32, Device::cpu);
    if (aux.device != Device::cpu) idx = idx.to(aux.device);
    Tensor sel = Tensor::empty({T, aux.size(1)}, aux.dtype, aux.device);
    ops::gather_rows(aux, idx, sel);
    Tensor h = Tensor::empty({T, H}, draft_->dtype(), draft_->device());
    draft_->project(sel, h);
    Tensor r_out = Tensor::empty({T, H}, draft_->dtype(), draft_->device());
    Tensor dl = draft_->forward(dbatch_, draft_kv_, h, r_out);
    Tensor host = dl.device == Device::cpu ? dl : dl.to(Device::cpu);
    int64_t li = 0;
    for (size_t q = 0; q < dseq.size(); ++q) {
      if (drow[q] == SIZE_MAX) continue;
      const Request& r = *plan.chunks[drow[q]].req;
      int64_t last_row = dbuilder_.chunk_row(q) + dseq[q].num_tokens - 1;
      out.rows[drow[q]].spec_next = draft_->to_target(argmax(host.ptr<float>() + li * host.size(1), host.size(1)));
      Tensor src = r_out.slice_rows(last_row, last_row + 1), dst = pool_row(r);
      ops::copy_rows(src, dst);
      ++li;
    }
  }
  draft_s_ += now_s() - d0;
  return fwd + (now_s() - d0);  // model time (draft loop, verify, catch-up); the rest is host time
}

void SpecWorker::execute(const StepPlan& plan, StepResult& out) {
  out.clear(plan.chunks.size());
  // Reused every step (the engine loop allocates nothing in steady state).
  decodes_.clear();
  decode_rows_.clear();
  rest_rows_.clear();  // prefill chunks (and decodes without a draft input yet)
  all_rows_.clear();
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    const Request* r = plan.chunks[k].req.get();
    all_rows_.push_back(k);
    if (r->is<state::Decoding>() && r->spec_next >= 0) {
      decodes_.push_back(r);
      decode_rows_.push_back(k);
    } else {
      rest_rows_.push_back(k);
    }
  }
  // The fixed-shape path drives the target model directly (rank 0 only): tensor-parallel
  // targets keep the mixed path, which runs every rank through the ModelRunner.
  if (decodes_.empty() || target_.tp_size() != 1) {
    out.forward_s = mixed_step(plan, all_rows_, out);
    return;
  }
  // Decodes take the fixed-shape (graph) step; prefill chunks scheduled with them run after it
  // as their own step, so a busy server's decodes are not dragged onto the eager mixed path.
  out.forward_s = decode_step(decodes_, decode_rows_, out);
  if (!rest_rows_.empty()) out.forward_s += mixed_step(plan, rest_rows_, out);
}

// Uploads one step's inputs into lane L. Graph lanes (bucket > 0) pad to the bucket with
// dummy rows (cache slot -1, pool row pad_slot_) and a fixed block-table width.
void SpecWorker::build_lane(Lane& L, const std::vector<const Request*>& reqs, int bucket, int kv_bound) {
  const int B = int(reqs.size()), n = n_, Bb = bucket > 0 ? bucket : B, bs = draft_kv_.block_size;
  const Device dev = draft_->device();
  auto opts = [&](int rows) {
    BuildOptions o;
    o.all_logits = true;
    if (bucket > 0) {
      o.pad_tokens = o.pad_seqs = rows;
      o.table_width = L.width;
      o.max_kv_bound = kv_bound;
      o.reserve = BatchBuilder::buffer_elems(size_t(L.cap) * size_t(n), size_t(L.cap) * size_t(n), size_t(L.width));
    }
    return o;
  };
  // Draft steps: input d_s at position ctx+s-1 (d1 known here; later ones come from the device).
  for (int s = 1; s <= n - 2; ++s) {
    auto& ids = L.step_ids[size_t(s - 1)];
    ids.assign(size_t(B), 0);
    L.chunks.clear();
    for (int i = 0; i < B; ++i) {
      const Request& r = *reqs[size_t(i)];
      if (s == 1) ids[size_t(i)] = r.spec_next;
      L.chunks.push_back({&ids[size_t(i)], 1, r.num_computed + s - 1, &r.block_table, SeqChunk::Logits::last});
    }
    L.dbuild[size_t(s - 1)].build(L.chunks, bs, dev, L.dfb[size_t(s - 1)], opts(Bb));
  }
  // Verify and catch-up rows: n per request, row j at position ctx+j.
  L.vids_host.assign(size_t(L.cap) * size_t(n), 0);
  L.chunks.clear();
  for (int i = 0; i < B; ++i) {
    const Request& r = *reqs[size_t(i)];
    L.vids_host[size_t(i * n)] = r.tokens.back();
    L.vids_host[size_t(i * n + 1)] = r.spec_next;
    for (int j = 0; j < n; ++j)
      L.chunks.push_back({&L.vids_host[size_t(i * n + j)], 1, r.num_computed + j, &r.block_table, SeqChunk::Logits::last});
  }
  L.vbuild.build(L.chunks, bs, dev, L.vfb, opts(Bb * n));
  L.vfb.input_ids = L.vids(Bb);
  L.vfb.capture_aux = true;
  L.vfb.aux_hidden = target_.aux_buffer(int64_t(Bb) * n);
  // The catch-up has the verify's rows exactly (positions, slots, tables): it shares that
  // upload and reads its ids from tgt.
  L.cfb = L.vfb;
  L.cfb.input_ids = L.tgt(Bb);
  L.cfb.capture_aux = false;
  L.cfb.aux_hidden = Tensor();
  // io: slots | vids in one copy.
  for (int i = 0; i < L.cap; ++i) L.host[size_t(i)] = i < B ? slot_of(*reqs[size_t(i)]) : pad_slot_;
  std::copy(L.vids_host.begin(), L.vids_host.end(), L.host.begin() + L.cap);
  const size_t bytes = (size_t(L.cap) + L.vids_host.size()) * sizeof(int32_t);
  if (dev == Device::cpu) {
    device_copy(L.io.data, dev, L.host.data(), Device::cpu, bytes);
  } else {
    if (!L.up) L.up = std::make_unique<StagedUpload>();
    L.up->upload(L.io.data, L.host.data(), bytes);
  }
}

// Draft steps (pool row -> d2..d_{n-1}), split from the verify so each can be timed.
void SpecWorker::segment_a(Lane& L, int Bb) {
  const int n = n_;
  Tensor h = L.ha.slice_rows(0, Bb);  // the hidden, updated in place by every step
  if (n > 2) ops::gather_rows(h_pool_, L.slots(Bb), h);
  const Tensor* off = draft_->target_offsets();
  Tensor vids = L.vids(Bb);
  for (int s = 1; s <= n - 2; ++s) {
    Tensor lg = draft_->forward(L.dfb[size_t(s - 1)], draft_kv_, h, h);  // [Bb, Vd]
    Tensor col = vids.narrow(0, s + 1, int64_t(Bb - 1) * n + 1);          // d_{s+1} of every request
    // d_{s+1} goes into the verify inputs and, when another step follows, its inputs.
    ops::argmax_rows(lg, off, col, n, s + 1 <= n - 2 ? &L.dfb[size_t(s)].input_ids : nullptr);
  }
}

// Target verify over [Bb*n] rows, its argmax, greedy acceptance.
void SpecWorker::segment_v(Lane& L, int Bb) {
  L.vlogits = target_.model().forward(L.vfb, target_.kv());  // f32 [Bb*n, V]
  Tensor tgt = L.tgt(Bb), acc = L.acc(Bb);
  ops::argmax_rows(L.vlogits, nullptr, tgt, 1);
  ops::spec_accept(L.vids(Bb), tgt, n_, acc);
}

void SpecWorker::segment_all(Lane& L, int Bb) {
  segment_a(L, Bb);
  segment_v(L, Bb);
  segment_b(L, Bb);
}

// Draft catch-up over all n rows per request; state row acc -> pool, its argmax -> next.
void SpecWorker::segment_b(Lane& L, int Bb) {
  const int64_t rows = int64_t(Bb) * n_;
  Tensor ch = L.ch.slice_rows(0, rows);
  draft_->project(target_.aux_buffer(rows), ch);
  Tensor lg = draft_->forward(L.cfb, draft_kv_, ch, ch);  // [Bb*n, Vd]; ch becomes r in place
  Tensor cn = L.cnext(Bb), nx = L.next(Bb);
  ops::argmax_rows(lg, draft_->target_offsets(), cn, 1);
  ops::spec_select(ch, cn, L.acc(Bb), L.slots(Bb), n_, h_pool_, nx);
}

namespace {

// Replays one segment graph; false when the step runs eagerly (no graph).
template <typename G, typename M>
bool replay(G* g, M member) {
#ifdef TS_WITH_CUDA
  if (!g) return false;
  (g->*member)->replay();
  return true;
#else
  (void)g;
  (void)member;
  return false;
#endif
}

}  // namespace

// Phase timing of one step: CUDA events on the device, the host clock on the CPU (where every
// op is synchronous).
struct SpecWorker::Marks {
  explicit Marks(Lane* L) : lane(L) {}
  void record(int i) {
#ifdef TS_WITH_CUDA
    if (lane->marks) return lane->marks->record(i);
#endif
    host[i] = now_s();
  }
  double seconds(int a, int b) const {
#ifdef TS_WITH_CUDA
    if (lane->marks) return 1e-3 * double(lane->marks->elapsed_ms(a, b));
#endif
    return host[b] - host[a];
  }
  Lane* lane;
  double host[5] = {};
};

// The graph lane and its graphs for this batch, or the eager lane (g null) when no captured
// bucket fits (batch above the largest bucket, context above the largest bound, no graphs).
SpecWorker::Lane* SpecWorker::pick_lane(const std::vector<const Request*>& decodes, int& bucket, int& kv_bound, LaneGraphs*& g) {
  const int B = int(decodes.size());
  bucket = kv_bound = 0;
  g = nullptr;
#ifdef TS_WITH_CUDA
  if (graph_ && B <= graph_->buckets.back()) {
    int max_kv = 0;
    bool fits = true;
    for (const Request* r : decodes) {
      max_kv = std::max(max_kv, r->num_computed + n_);
      fits = fits && int(r->block_table.size()) <= graph_->width;
    }
    auto kv = std::lower_bound(graph_->kv_bounds.begin(), graph_->kv_bounds.end(), max_kv);
    auto bb = std::lower_bound(graph_->buckets.begin(), graph_->buckets.end(), B);
    if (fits && kv != graph_->kv_bounds.end() && bb != graph_->buckets.end()) {
      auto it = graph_->graphs.find({*kv, *bb});
      if (it != graph_->graphs.end()) {
        bucket = *bb;
        kv_bound = *kv;
        g = &it->second;
        return graph_.get();
      }
    }
  }
#endif
  Lane* L = eager_.get();
  if (L->cap < B) {
    L->alloc(std::max(B, 2 * L->cap), n_, draft_->hidden(), draft_->dtype(), draft_->device());
#ifdef TS_WITH_CUDA
    if (draft_->device() == Device::cuda && !L->marks) L->marks = std::make_unique<cuda::StreamMarks>(5);
#endif
  }
  return L;
}

// Rejection sampling against the target's filtered distribution for every request of the step
// (their ids go to `out`), then the accepted ids and counts go back for the catch-up.
void SpecWorker::host_accept(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows, Lane& L,
                             StepResult& out) {
  const int B = int(decodes.size()), n = n_;
  const int64_t cap = L.cap, V = L.vlogits.size(1);
  int32_t* hv = L.host.data() + cap;  // vids [cap*n] | tgt [cap*n] | acc [cap]
  int32_t* ht = hv + cap * n;
  int32_t* ha = ht + cap * n;
  Tensor lg = L.vlogits.slice_rows(0, int64_t(B) * n);
  if (lg.device != Device::cpu) lg = lg.to(Device::cpu);
  device_copy(hv, Device::cpu, L.io.ptr<int32_t>() + cap, L.io.device, size_t(B) * n * sizeof(int32_t));
  for (int i = 0; i < B; ++i) {
    const Request& r = *decodes[size_t(i)];
    RowResult& row = out.rows[rows[size_t(i)]];
    const int acc = accept(r, hv + int64_t(i) * n + 1, n - 1, lg.ptr<float>() + int64_t(i) * n * V, V, out, row);
    for (int j = 0; j < n; ++j) ht[int64_t(i) * n + j] = j <= acc ? out.tokens[size_t(row.first + j)] : 0;
    ha[i] = acc;
  }
  device_copy(L.io.ptr<int32_t>() + cap + cap * n, L.io.device, ht, Device::cpu, size_t(B) * n * sizeof(int32_t));
  device_copy(L.io.ptr<int32_t>() + cap + 2 * cap * n, L.io.device, ha, Device::cpu, size_t(B) * sizeof(int32_t));
}

double SpecWorker::decode_step(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows,
                               StepResult& out) {
  const int B = int(decodes.size()), n = n_;
  double t0 = now_s();
  int bucket = 0, kvb = 0;
  Lane::Graphs* g = nullptr;
  Lane* L = pick_lane(decodes, bucket, kvb, g);
  const int Bb = bucket > 0 ? bucket : B;
  build_lane(*L, decodes, bucket, kvb);
  bool host = false;  // sampling, penalties or logprobs: acceptance on the host
  for (const Request* r : decodes)  // grammar masks too: verify rows are masked on the host
    host = host || r->params.temperature > 0.0f || needs_host_logits(*r) || needs_mask(*r);
  // Greedy graph steps run as one launch, except every 8th, which runs the phase graphs so
  // the draft/verify split stays measured.
  const bool timed = !(g && !host) || fixed_steps_ % 8 == 0;
  if (g && !host && !timed) {
    replay(g, &Lane::Graphs::all);
    return finish_decode_step(decodes, rows, *L, host, true, true, t0, out);
  }
  // Draft steps, verify, greedy acceptance; host acceptance; catch-up. Marks: 0 draft 1 verify 2
  // (host acceptance) 3 catch-up 4.
  Marks marks(L);
  marks.record(0);
  if (!replay(g, &Lane::Graphs::draft)) segment_a(*L, Bb);
  marks.record(1);
  if (replay(g, &Lane::Graphs::verify)) L->vlogits = g->vlogits;
  else segment_v(*L, Bb);
  marks.record(2);
  if (host) host_accept(decodes, rows, *L, out);
  marks.record(3);
  if (!replay(g, &Lane::Graphs::catchup)) segment_b(*L, Bb);
  marks.record(4);
  // One read-back: drafts, target ids, accepted counts, next drafts.
  const int64_t cap = L->cap;
  device_copy(L->host.data() + cap, Device::cpu, L->io.ptr<int32_t>() + cap, L->io.device,
              size_t(2 * cap + 2 * cap * n) * sizeof(int32_t));
  draft_s_ += marks.seconds(0, 1) + marks.seconds(3, 4);
  verify_s_ += marks.seconds(1, 2);
  ++timed_steps_;
  return finish_decode_step(decodes, rows, *L, host, bucket > 0, false, t0, out);
}

// Reports the greedy requests' accepted drafts and bonus token (host-accepted requests have
// theirs already) and every request's next draft input.
double SpecWorker::finish_decode_step(const std::vector<const Request*>& decodes, const std::vector<size_t>& rows,
                                      Lane& lane, bool host, bool graph, bool read_back, double t0, StepResult& out) {
  Lane* L = &lane;
  const int B = int(decodes.size()), n = n_;
  const int64_t cap = L->cap;
  int32_t* hv = L->host.data() + cap;  // vids [cap*n] | tgt [cap*n] | acc [cap] | next [cap]
  int32_t* ht = hv + cap * n;
  int32_t* ha = ht + cap * n;
  int32_t* hn = ha + cap;
  if (read_back)  // the one-launch path
    device_copy(hv, Device::cpu, L->io.ptr<int32_t>() + cap, L->io.device, size_t(2 * cap + 2 * cap * n) * sizeof(int32_t));
  double fwd = now_s() - t0;
  for (int i = 0; i < B; ++i) {
    RowResult& row = out.rows[rows[size_t(i)]];
    if (!host) {
      const int a = ha[i];
      row.accepted = a;
      row.draft_first = int(out.drafts.size());
      row.draft_count = n - 1;
      out.drafts.insert(out.drafts.end(), hv + int64_t(i) * n + 1, hv + int64_t(i + 1) * n);
      row.first = int(out.tokens.size());
      row.count = a + 1;
      out.tokens.insert(out.tokens.end(), ht + int64_t(i) * n, ht + int64_t(i) * n + a + 1);
    }
    row.spec_next = hn[i];
  }
  ++fixed_steps_;
  if (graph) ++graph_steps_;
  return fwd;
}

int SpecWorker::graphs() const {
#ifdef TS_WITH_CUDA
  return graph_ ? int(graph_->graphs.size()) : 0;
#else
  return 0;
#endif
}

void SpecWorker::size_for_graphs(const GraphOptions& go) {
#ifdef TS_WITH_CUDA
  if (draft_->device() != Device::cuda || target_.tp_size() > 1 || !go.decode) return;
  const int n = n_, bs = draft_kv_.block_size;
  auto G = std::make_unique<Lane>();
  for (int b : {1, 2, 4, 8, 16, 24, 32, 48, 64})
    if (b <= go.max_bs) G->buckets.push_back(b);
  if (G->buckets.empty()) return;
  G->kv_bounds = context_buckets(go.max_context);
  G->width = (go.max_context + bs - 1) / bs;
  G->alloc(G->buckets.back(), n, draft_->hidden(), draft_->dtype(), draft_->device());
  G->marks = std::make_unique<cuda::StreamMarks>(5);
  // Dummy requests: context 1 in the first blocks of the pool, pool row pad_slot_.
  const int blocks = (n + 1 + bs - 1) / bs;
  TS_CHECK(blocks <= target_.num_blocks(), "EAGLE3 graphs need {} KV blocks", blocks);
  dummies_.assign(size_t(G->buckets.back()), Request{});
  for (Request& r : dummies_) {
    r.tokens = {0, 0};
    r.num_computed = 1;
    r.spec_next = 0;
    r.block_table.clear();
    for (int i = 0; i < blocks; ++i) r.block_table.push_back(i);
    r.spec_slot = std::make_shared<const int>(pad_slot_);
  }
  // The largest step, eagerly: the draft's and the target's arenas reach their high-water marks.
  int b = G->buckets.back();
  std::vector<const Request*> reqs;
  for (int i = 0; i < b; ++i) reqs.push_back(&dummies_[size_t(i)]);
  build_lane(*G, reqs, b, G->kv_bounds.back());
  segment_a(*G, b);
  segment_v(*G, b);
  segment_b(*G, b);
  // And the largest eager draft forward (draft prefill of a full token budget), so mixed steps
  // do not take their scratch from outside the frozen arena.
  {
    int t = int(std::min<int64_t>(go.eager_max_tokens, target_.num_blocks() * bs));
    std::vector<int32_t> ids(size_t(t), 0), table;
    for (int i = 0; i < (t + bs - 1) / bs; ++i) table.push_back(i);
    ForwardBatch fb;
    BatchBuilder bb;
    bb.build({{ids.data(), t, 0, &table, SeqChunk::Logits::last}}, bs, draft_->device(), fb);
    Tensor h = Tensor::zeros({t, draft_->hidden()}, draft_->dtype(), draft_->device());
    Tensor r = Tensor::empty({t, draft_->hidden()}, draft_->dtype(), draft_->device());
    draft_->project(target_.aux_buffer(t), h);
    draft_->forward(fb, draft_kv_, h, r);
  }
  cuda::synchronize();
  draft_->workspace().reset();
  draft_->workspace().freeze();
  pending_ = std::move(G);
#else
  (void)go;
#endif
}

void SpecWorker::enable_graphs(const GraphOptions& go) {
#ifdef TS_WITH_CUDA
  (void)go;
  if (!pending_ || !target_.graphs()) return;
  double t0 = now_s();
  std::unique_ptr<Lane> G = std::move(pending_);
  Workspace* tws = target_.model().workspace();
  Workspace& dws = draft_->workspace();
  auto reqs = [&](int b) {
    std::vector<const Request*> v;
    for (int i = 0; i < b; ++i) v.push_back(&dummies_[size_t(i)]);
    return v;
  };
  for (int kvb : G->kv_bounds)
    for (auto it = G->buckets.rbegin(); it != G->buckets.rend(); ++it) {
      int b = *it;
      try {
        build_lane(*G, reqs(b), b, kvb);
        segment_a(*G, b);  // warm-up: GEMM algorithms, kernel workspaces
        segment_v(*G, b);
        segment_b(*G, b);
        cuda::synchronize();
        size_t over = dws.overflow_allocs() + (tws ? tws->overflow_allocs() : 0);
        Lane::Graphs gr;
        auto capture = [&](std::unique_ptr<cuda::Graph>& out, void (SpecWorker::*seg)(Lane&, int)) {
          out = std::make_unique<cuda::Graph>();
          out->begin_capture();
          try {
            (this->*seg)(*G, b);
          } catch (...) {
            try { out->end_capture(); } catch (...) {}
            throw;
          }
          out->end_capture();
        };
        capture(gr.draft, &SpecWorker::segment_a);
        capture(gr.verify, &SpecWorker::segment_v);
        gr.vlogits = G->vlogits;
        capture(gr.catchup, &SpecWorker::segment_b);
        capture(gr.all, &SpecWorker::segment_all);
        // Scratch outside the arenas would be freed after capture: such a graph is unusable.
        TS_CHECK(dws.overflow_allocs() + (tws ? tws->overflow_allocs() : 0) == over, "scratch did not fit the frozen arenas");
        G->graphs[{kvb, b}] = std::move(gr);
      } catch (const std::exception& e) {
        spdlog::warn("EAGLE3 graph bs={} context<={} not captured ({}); that size runs eagerly", b, kvb, e.what());
      }
    }
  cuda::synchronize();
  spdlog::info("EAGLE3: {} decode-step graphs (draft steps, verify, catch-up) for batch <= {} captured in {:.2f} s",
               G->graphs.size(), G->buckets.back(), now_s() - t0);
  graph_ = std::move(G);
#else
  (void)go;
#endif
}

}  // namespace ts
