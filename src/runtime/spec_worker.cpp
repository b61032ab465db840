#include "runtime/spec_worker.h"

#include <chrono>

#include "core/log.h"
#include "ops/cpu/cpu_ops.h"
#include "runtime/sampler.h"

namespace ts {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

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

SpecWorker::SpecWorker(const EngineOptions& o, ModelRunner& target, KvCache& kv) : target_(target), kv_(kv) {
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
  // The draft cache mirrors the target pool block for block, so both share block tables.
  models::KvSpec s = draft_->kv_spec();
  draft_kv_.block_size = target.block_size();
  draft_kv_.num_blocks = target.num_blocks();
  draft_kv_.k.push_back(Tensor::zeros({target.num_blocks(), target.block_size(), s.k_heads, s.k_dim}, draft_->dtype(), draft_->device()));
  draft_kv_.v.push_back(Tensor::zeros({target.num_blocks(), target.block_size(), s.v_heads, s.v_dim}, draft_->dtype(), draft_->device()));
  spdlog::info("EAGLE3: {} tokens per verify ({} draft steps), capture layers {}, draft vocab {}", n_, n_ - 1,
               fmt::join(target.model().capture_layers(), ","), draft_->draft_vocab());
}

static int32_t argmax(const float* l, int64_t v) {
  int64_t b = 0;
  for (int64_t i = 1; i < v; ++i)
    if (l[i] > l[b]) b = i;
  return int32_t(b);
}

// Draft steps 1..N-1 for all decoding requests at once: step s feeds draft token s at
// position n_ctx + s - 1 with the previous step's hidden r.
void SpecWorker::draft_loop(const std::vector<Request*>& decodes, std::vector<std::vector<int32_t>>& drafts) {
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
      Request& q = *decodes[i];
      ids[i] = drafts[i].back();
      chunks[i] = {&ids[i], 1, q.num_computed + s - 1, &q.block_table, SeqChunk::Logits::last};
      Tensor hrow = h.slice_rows(int64_t(i), int64_t(i) + 1);
      ops::copy_rows(q.spec_h, hrow);
    }
    dbuilder_.build(chunks, draft_kv_.block_size, draft_->device(), dbatch_);
    Tensor logits = draft_->forward(dbatch_, draft_kv_, h, r);
    Tensor host = logits.device == Device::cpu ? logits : logits.to(Device::cpu);
    for (size_t i = 0; i < decodes.size(); ++i) {
      drafts[i].push_back(draft_->to_target(argmax(host.ptr<float>() + int64_t(i) * host.size(1), host.size(1))));
      Tensor rrow = r.slice_rows(int64_t(i), int64_t(i) + 1);
      ops::copy_rows(rrow, decodes[i]->spec_h);
    }
  }
}

int SpecWorker::accept(Request& r, const std::vector<int32_t>& drafts, const float* logits, int64_t vocab, const PushFn& push,
                       const EmitFn& emit) {
  StreamEvent ev;
  std::vector<float> row(static_cast<size_t>(vocab)), p;
  int acc = 0;
  // Recorded before the tokens are pushed: a stop inside the run sends the final event (and
  // the trace with it) from within push().
  r.spec_trace.push_back({drafts, 0});
  for (size_t j = 0; j <= drafts.size(); ++j) {
    std::copy(logits + int64_t(j) * vocab, logits + int64_t(j + 1) * vocab, row.begin());
    TokenLogprob lp;
    apply_penalties(row.data(), vocab, r);  // sees every token accepted so far, like plain decoding
    uint64_t ctr = uint64_t(r.num_generated());
    ops::SamplingRow sp{r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p, r.seed, ctr};
    int32_t tok;
    bool is_draft = false;
    if (r.params.temperature <= 0.0f) {
      tok = argmax(row.data(), vocab);
      is_draft = j < drafts.size() && tok == drafts[j];
    } else {
      ops::cpu::sampling_probs(row.data(), vocab, sp, p);
      if (j < drafts.size()) {
        tok = verify_draft_token(p, drafts[j], r.seed, ctr, is_draft);
      } else {
        std::vector<int32_t> one;
        Tensor lt = Tensor::from_blob(row.data(), {1, vocab}, DType::f32, Device::cpu);
        ops::cpu::sample(lt, {sp}, one);  // all drafts accepted: the bonus is a plain sample
        tok = one[0];
      }
    }
    if (r.params.logprobs >= 0) lp = token_logprob(logits + int64_t(j) * vocab, vocab, tok, r.params.logprobs);
    if (is_draft) r.spec_trace.back().accepted = ++acc;
    bool done = push(r, tok, r.params.logprobs >= 0 ? &lp : nullptr, ev);
    if (done || !is_draft) break;
  }
  emit(r, ev);
  return acc;
}

double SpecWorker::step(const std::vector<ScheduledChunk>& chunks, const PushFn& push, const EmitFn& emit) {
  double t0 = now_s();
  std::vector<Request*> decodes;
  for (auto& c : chunks)
    if (c.req->is<state::Decoding>()) decodes.push_back(c.req);
  // 1. Draft tokens for every decoding request.
  std::vector<std::vector<int32_t>> drafts;
  draft_loop(decodes, drafts);
  double fwd = now_s() - t0;
  draft_s_ += fwd;
  // 2. One target forward: verify rows for decodes, chunks for prefills; aux captured.
  std::vector<SeqChunk> seq;
  verify_ids_.resize(decodes.size());
  size_t di = 0;
  std::vector<Request*> prefill_sample;
  for (auto& c : chunks) {
    Request& r = *c.req;
    if (r.is<state::Decoding>()) {
      auto& v = verify_ids_[di];
      v.assign(1, r.tokens.back());
      v.insert(v.end(), drafts[di].begin(), drafts[di].end());
      seq.push_back({v.data(), int(v.size()), r.num_computed, &r.block_table, SeqChunk::Logits::all});
      ++di;
    } else {
      bool last = r.num_computed + c.num_tokens == int(r.tokens.size());
      seq.push_back({r.tokens.data() + r.num_computed, c.num_tokens, r.num_computed, &r.block_table,
                     last ? SeqChunk::Logits::last : SeqChunk::Logits::none});
      if (last) prefill_sample.push_back(&r);
    }
  }
  double f0 = now_s();
  Tensor logits = target_.run(seq, true);
  fwd += now_s() - f0;
  Tensor aux = target_.last_aux();
  const int64_t vocab = logits.size(1);
  // 3. Acceptance (decodes) and first-token sampling (completed prefills), in chunk order.
  std::vector<int> accepted(chunks.size(), -1);
  std::vector<int> ctx_before(chunks.size());
  int64_t lrow = 0;
  std::vector<SampleResult> samples;
  size_t vi = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Request& r = *chunks[i].req;
    ctx_before[i] = r.num_computed;
    if (r.is<state::Decoding>()) {
      const auto& v = verify_ids_[vi++];
      std::vector<int32_t> d(v.begin() + 1, v.end());
      int acc = accept(r, d, logits.ptr<float>() + lrow * vocab, vocab, push, emit);
      lrow += int64_t(v.size());
      accepted[i] = acc;
      r.num_computed += 1 + acc;
      ++verify_steps_;
      accepted_tokens_ += acc + 1;
    } else {
      r.num_computed += chunks[i].num_tokens;
      if (r.num_computed == int(r.tokens.size())) {
        Tensor row = logits.slice_rows(lrow, lrow + 1);
        std::vector<Request*> one{&r};
        sample_batch(row, one, samples);
        ++lrow;
        r.to(state::Decoding{});
        StreamEvent ev;
        push(r, samples[0].token, r.params.logprobs >= 0 ? &samples[0].logprob : nullptr, ev);
        emit(r, ev);
      }
    }
    kv_.commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
  }
  // 4. One draft forward: catch-up over verified positions (ids = accepted drafts + bonus,
  //    hidden = verify aux rows) and the draft prefill of prefill chunks (ids shifted by one).
  double d0 = now_s();
  std::vector<SeqChunk> dseq;
  std::vector<int32_t> aux_rows;
  std::vector<Request*> dreq;
  std::vector<size_t> dchunk;
  int32_t trow = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Request& r = *chunks[i].req;
    int n_in = seq[i].num_tokens;
    int start = ctx_before[i];
    int count = accepted[i] >= 0 ? accepted[i] + 1 : n_in;
    // Draft entry p pairs token p+1 with target hidden p; a prefill chunk that does not end
    // the prompt has its next token in the prompt already.
    bool have_next = start + count < int(r.tokens.size());
    if (!r.terminal() && have_next) {
      bool want_logits = r.is<state::Decoding>() && r.num_computed == int(r.tokens.size()) - 1;
      dseq.push_back({r.tokens.data() + start + 1, count, start, &r.block_table,
                      want_logits ? SeqChunk::Logits::last : SeqChunk::Logits::none});
      for (int k = 0; k < count; ++k) aux_rows.push_back(trow + k);
      dreq.push_back(want_logits ? &r : nullptr);
      dchunk.push_back(i);
    }
    trow += n_in;
  }
  if (!dseq.empty()) {
    const int64_t H = draft_->hidden(), T = int64_t(aux_rows.size());
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
    for (size_t k = 0; k < dseq.size(); ++k) {
      Request* r = dreq[k];
      if (!r) continue;
      int64_t last_row = dbuilder_.chunk_row(k) + dseq[k].num_tokens - 1;
      r->spec_next = draft_->to_target(argmax(host.ptr<float>() + li * host.size(1), host.size(1)));
      if (!r->spec_h.data) r->spec_h = Tensor::empty({1, H}, draft_->dtype(), draft_->device());
      Tensor src = r_out.slice_rows(last_row, last_row + 1);
      ops::copy_rows(src, r->spec_h);
      ++li;
    }
  }
  draft_s_ += now_s() - d0;
  return fwd + (now_s() - d0);  // model time (draft loop, verify, catch-up); the rest is host time
}

}  // namespace ts
