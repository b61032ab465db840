#include "runtime/plain_worker.h"

#include "runtime/structured.h"

#include <chrono>

namespace ts {

void PlainWorker::execute(const StepPlan& plan, StepResult& out) {
  stage(plan, sync_);
  sync_.live = true;
  run_staged(sync_, nullptr, out);
}

void PlainWorker::stage(const StepPlan& plan, StagedStep& s) const {
  const size_t n = plan.chunks.size();
  s.rows = n;
  s.ids.clear();
  s.seq.clear();
  s.sample_row.clear();
  s.sampling.clear();
  s.reqs.clear();
  s.logprobs.clear();
  s.proc.clear();
  s.proc_any = false;
  s.seeds.clear();
  s.host = false;
  s.masks.clear();
  s.greedy = true;
  s.live = false;
  if (s.tables.size() < n) s.tables.resize(n);
  size_t total = 0;
  for (const ScheduledChunk& c : plan.chunks) total += size_t(c.num_tokens);
  s.ids.reserve(total);  // SeqChunk::tokens point into it: no reallocation below
  // Penalties, logit_bias, min_tokens on the device for requests holding a logits slot (the
  // engine binds them: EngineImpl::apply_plan).
  DeviceLogits* proc = runner_.logits_proc_if_any();
  TS_CHECK(!proc || int64_t(n) <= proc->rows_cap(), "a step of {} rows: device logits processing holds {}", n,
           proc ? proc->rows_cap() : 0);
  for (size_t k = 0; k < n; ++k) {
    if (k + 2 < n) {  // the copies' sources and destination two rows ahead (their misses overlap)
      const Request& a = *plan.chunks[k + 2].req;
      __builtin_prefetch(a.tokens.data() + a.num_computed);
      __builtin_prefetch(a.block_table.data());
      __builtin_prefetch(s.tables[k + 2].data(), 1);
    }
    const ScheduledChunk& c = plan.chunks[k];
    const Request& r = *c.req;
    const bool last = r.num_computed + c.num_tokens == int(r.tokens.size());
    const size_t at = s.ids.size();
    s.ids.insert(s.ids.end(), r.tokens.begin() + r.num_computed, r.tokens.begin() + r.num_computed + c.num_tokens);
    // (the request reserved its whole table: EngineImpl::reserve_for; so does the copy, which
    // then never reallocates as the sequence grows)
    if (s.tables[k].capacity() < r.block_table.capacity()) s.tables[k].reserve(r.block_table.capacity());
    s.tables[k].assign(r.block_table.begin(), r.block_table.end());
    s.seq.push_back({s.ids.data() + at, c.num_tokens, r.num_computed, &s.tables[k],
                     last ? SeqChunk::Logits::last : SeqChunk::Logits::none, r.state_slot ? *r.state_slot : -1});
    if (last) {
      const ops::LogitsProcRow row = proc ? proc->row(r) : ops::LogitsProcRow{};
      if (row.slot >= 0) proc->stage_seed(r, s.seeds);  // a slot taken since its last step
      s.proc_any = s.proc_any || row.slot >= 0;
      s.proc.push_back(row);
      s.sample_row.push_back(k);
      s.sampling.push_back(sampling_row(r));
      s.logprobs.push_back(r.params.logprobs);
      s.reqs.push_back(&r);
      const bool host = needs_host_logits(r);  // host rows: sample_batch applies their constraints
      s.host = s.host || host;
      const bool grammar = !host && r.constraints && r.constraints->has_grammar();
      s.masks.cons.push_back(grammar ? r.constraints : nullptr);
      s.masks.after.push_back(r.num_generated());  // a future id counts: its token comes first
      s.masks.any = s.masks.any || grammar;
      s.greedy = s.greedy && greedy_without_logits(r);
    }
  }
  s.greedy = s.greedy && !s.sampling.empty();
}

void PlainWorker::resolve_futures(std::vector<int32_t>& ids, const StepResult* prev) {
  for (int32_t& t : ids) {
    if (t >= 0) continue;
    const size_t k = size_t(-(int64_t(t) + 1));
    TS_CHECK(prev && k < prev->rows.size() && prev->rows[k].count > 0,
             "step input holds future id {} the previous step did not produce", t);
    t = prev->tokens[size_t(prev->rows[k].first)];
  }
}

void PlainWorker::run_staged(StagedStep& s, const StepResult* prev, StepResult& out) {
  TS_CHECK(s.live || !s.host, "a step that needs host logits cannot run overlapped");
  out.clear(s.rows);
  // Futures: the previous step's sampled ids (host copies, as that step returned them).
  resolve_futures(s.ids, prev);
  auto f0 = std::chrono::steady_clock::now();
  if (!s.seeds.empty()) {
    // Slots taken since their requests' last step, seeded after every step launched before
    // this one (a reused slot's previous owner may still have had a row in the last one).
    resolve_futures(s.seeds.tokens, prev);
    runner_.step_device_start();  // the seeds' uploads and kernels are this step's first device work
    runner_.logits_proc_if_any()->run_seeds(s.seeds);
  }
  // Pure decode steps sample inside the decode CUDA graph when one fits.
  bool sampled = false;
  // All greedy, nothing to process: the LM head may write the ids without logits.
  if (s.greedy && !s.proc_any) sampled = runner_.run_greedy(s.seq, ids_);
  if (!sampled && !s.host && s.sample_row.size() == s.seq.size())
    sampled = runner_.run_sampled(s.seq, s.sampling, ids_, s.proc_any ? &s.proc : nullptr, s.masks.any ? &s.masks : nullptr);
  if (sampled) {
    samples_.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) samples_[i].token = ids_[i];
  } else {
    Tensor logits = runner_.run(s.seq, false, s.host);
    DeviceLogits* proc = s.proc_any ? runner_.logits_proc_if_any() : nullptr;
    if (proc) proc->upload(s.proc);
    if (proc && !s.host) proc->apply(logits);  // host logits: sample_batch applies the CPU's
    if (!s.host && s.masks.any) {
      // The forward is queued (or, on the CPU, done): wait for the masks, then mask on the device.
      TokenMaskBuffer* tm = runner_.token_mask(int64_t(s.masks.cons.size()));
      tm->upload(s.masks);
      Tensor m = tm->rows(int64_t(s.masks.cons.size()));
      ops::apply_token_bitmask(logits, m);
    }
    // The device work (forward + sampling) completes inside the copy of the ids: it counts as
    // device time, not host time.
    if (s.host) {
      sample_batch(logits, s.reqs, samples_);
    } else if (!s.sampling.empty()) {
      ops::sample(logits, s.sampling, ids_);
      samples_.resize(ids_.size());
      for (size_t i = 0; i < ids_.size(); ++i) samples_[i].token = ids_[i];
    } else {
      samples_.clear();
    }
    if (proc) {  // the sampled ids join the counts (the graph path does it inside the graph)
      ids_.resize(samples_.size());
      for (size_t i = 0; i < samples_.size(); ++i) ids_[i] = samples_[i].token;
      proc->count(ids_);
    }
  }
  out.forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count() - runner_.last_build_seconds();
  for (size_t i = 0; i < s.sample_row.size(); ++i) {
    RowResult& row = out.rows[s.sample_row[i]];
    row.first = int(out.tokens.size());
    row.count = 1;
    out.tokens.push_back(samples_[i].token);
    if (s.logprobs[i] >= 0) {
      row.lp_first = int(out.logprobs.size());
      out.logprobs.push_back(std::move(samples_[i].logprob));
    }
  }
}

}  // namespace ts
