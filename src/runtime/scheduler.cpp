#include "runtime/scheduler.h"

#include <algorithm>

namespace ts {

void Scheduler::commit(Request& r) { kv_.commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes); }

void Scheduler::release(Request& r) {
  commit(r);
  kv_.release(r.block_table, r.block_hashes);  // blocks still being loaded stay with their batch
  r.kv_wait_seq = 0;
  r.state_slot.reset();  // a retracted request restarts from position 0, with fresh state
  r.logits_slot.reset();  // its token counts are reseeded from r.tokens when it samples again
}

void Scheduler::retract_at(size_t idx, StepPlan& plan) {
  std::shared_ptr<Request> rp = running_[idx];
  Request& r = *rp;
  release(r);
  r.num_computed = 0;
  r.spec_next = -1;
  plan.retracted.push_back(&r);  // the engine moves it Retracted -> Waiting
  waiting_.push_front(rp);
  running_.erase(running_.begin() + long(idx));
  ++retractions_;
}

bool Scheduler::retract_newest(size_t after, StepPlan& plan, int group) {
  for (size_t j = running_.size(); j-- > after + 1;) {
    if (running_[j]->terminal()) continue;
    const std::vector<int32_t>& t = running_[j]->block_table;
    if (group >= 0 && (t.empty() || kv_.table_group(t) != group)) continue;
    retract_at(j, plan);
    return true;
  }
  return false;
}

void Scheduler::plan(StepPlan& plan) {
  plan.clear();
  kv_.begin_plan();
  std::vector<ScheduledChunk>& out = plan.chunks;
  std::vector<std::shared_ptr<Request>>& rejected = plan.rejected;
  const int64_t avail0 = kv_.available_blocks();
  int budget = opts_.token_budget;
  // 1. Decodes, oldest first. A decode that cannot get a block retracts the newest request.
  int64_t remaining = 0;  // decode steps the planned decodes still need (mixed budget horizon)
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    if (!r.is<state::Decoding>() || r.finishing) continue;  // finishing: ends with the step in flight
    remaining += std::max(1, r.params.max_tokens - r.num_generated());
    // One token (or the verify width), or, after a jump-forward appended tokens the grammar
    // forced (plain decoding only), all of them as one chunk that samples after the last.
    int n = opts_.decode_tokens == 1 ? std::max(r.remaining_to_compute(), 1)
                                     : std::min(r.remaining_to_compute(), opts_.decode_tokens);
    int64_t need = int64_t(r.num_computed) + std::max(n, opts_.decode_tokens) + opts_.extra_decode_slots;
    const int group = kv_.groups() > 1 && !r.block_table.empty() ? kv_.table_group(r.block_table) : -1;
    bool self_retracted = false;
    while (!kv_.ensure(r.block_table, need)) {
      if (!retract_newest(i, plan, group)) {  // nothing newer to preempt: r itself waits
        retract_at(i, plan);
        self_retracted = true;
        break;
      }
    }
    if (self_retracted) {
      if (group < 0) break;  // r was the newest; everything older is already scheduled
      --i;  // DP: r left running_ (the next request is at i now); other groups' decodes still run
      continue;
    }
    out.push_back({&r, n});
    budget -= std::max(n, opts_.decode_tokens);
  }
  plan.decode_rows = int(out.size());
  // Mixed batches: decodes were planned, so the prefill share is capped.
  if (!out.empty()) {
    if (mixed_ && mixed_->automatic()) {
      const MixedBudgetOptions& mo = mixed_->options();
      const int64_t backlog = prefill_backlog(int64_t(mo.max_tokens) * mo.horizon);
      budget = std::min(budget, mixed_->tokens(int(out.size()), backlog, remaining / int64_t(out.size())));
    } else if (opts_.mixed_prefill_tokens > 0) {
      budget = std::min(budget, opts_.mixed_prefill_tokens);
    }
  }
  const int budget_prefill = std::max(budget, 0);
  // 2. Prefills in progress. A request whose prefix is still being loaded from the host tier
  // waits (it holds its blocks); its first chunk runs in the first plan after the load.
  for (auto& rp : running_) {
    Request& r = *rp;
    if (!r.is<state::Prefilling>()) continue;
    if (r.kv_wait_seq) {
      if (!kv_.loaded(r.kv_wait_seq)) {
        ++plan.kv_loading;
        continue;
      }
      r.kv_wait_seq = 0;
      r.kv_load_wait_s += std::chrono::duration<double>(Clock::now() - r.kv_wait_since).count();
    }
    if (budget <= 0) continue;
    int n = std::min(r.remaining_to_compute(), budget);
    if (!kv_.ensure(r.block_table, r.num_computed + n)) continue;
    out.push_back({&r, n});
    budget -= n;
  }
  // 3. Admissions.
  while (budget > 0 && !waiting_.empty() && int(running_.size()) < opts_.max_num_seqs) {
    std::shared_ptr<Request> rp = waiting_.front();
    Request& r = *rp;
    // (With a window release the request holds the window's blocks, not its whole context.)
    const int64_t step = std::max(opts_.token_budget, opts_.decode_tokens) + opts_.extra_decode_slots;
    int64_t total_need = kv_.peak_blocks(int64_t(r.tokens.size()) + opts_.decode_tokens + opts_.extra_decode_slots, step);
    if (total_need > kv_.group_blocks()) {
      waiting_.pop_front();
      rejected.push_back(rp);
      continue;
    }
    // Reuse cached full blocks; the last token is always computed (its logits are needed).
    const int group = kv_.pick_group(r.tokens.data(), int(r.tokens.size()) - 1);
    int cached = kv_.match_prefix(r.tokens.data(), int(r.tokens.size()) - 1, r.block_table, r.block_hashes, group);
    // Window release: the hit's blocks below what its first chunk reads go back at once.
    if (kv_.window_release() > 0 && cached > 0) kv_.commit(r.tokens.data(), cached, r.block_table, r.block_hashes);
    int n = std::min(int(r.tokens.size()) - cached, budget);
    if (!kv_.ensure(r.block_table, cached + n, group)) {
      kv_.release(r.block_table, r.block_hashes);
      break;  // wait for blocks (FIFO: do not let later requests overtake)
    }
    waiting_.pop_front();
    r.num_computed = cached;
    if (!r.admitted_once) {
      r.cached_tokens = std::min(cached, r.prompt_len);
      r.host_cached_tokens = std::min(kv_.last_host_tokens(), r.cached_tokens);
      kv_.count_admission(r.cached_tokens - r.host_cached_tokens, r.host_cached_tokens);
      r.admitted_once = true;
      r.scheduled = Clock::now();
    }
    plan.admitted.push_back(&r);  // the engine moves it Waiting -> Prefilling
    running_.push_back(rp);
    r.kv_wait_seq = kv_.last_wait_seq();
    if (!kv_.loaded(r.kv_wait_seq)) {
      // Its prefix comes from the host tier (or is being loaded for another request): the
      // first chunk (its blocks taken above) runs once the load has landed; the rows of this
      // plan run meanwhile.
      r.kv_wait_since = Clock::now();
      ++plan.kv_loading;
      continue;
    }
    r.kv_wait_seq = 0;
    out.push_back({&r, n});
    budget -= n;
  }
  plan.prefill_tokens = budget_prefill - std::max(budget, 0);
  plan.blocks_allocated = avail0 - kv_.available_blocks();  // net of blocks retractions freed
  kv_.take_ops(plan.kv_ops);
}

int64_t Scheduler::prefill_backlog(int64_t cap, int64_t* requests) const {
  int64_t n = 0, k = 0;
  for (const auto& r : running_)
    if (r->is<state::Prefilling>()) n += r->remaining_to_compute(), ++k;
  for (const auto& r : waiting_) {
    if (n >= cap) break;
    if (!r->terminal()) n += int64_t(r->tokens.size()) - r->num_computed, ++k;
  }
  if (requests) *requests = k;
  return n;
}

void Scheduler::reap() {
  auto done = [&](const std::shared_ptr<Request>& r) {
    if (!r->terminal()) return false;
    release(*r);
    return true;
  };
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
}

void apply_plan_transitions(const StepPlan& plan) {
  // Retractions first: a request retracted by this plan may have been admitted again by it.
  for (Request* r : plan.retracted) {
    r->transit<state::Decoding, state::Prefilling>(state::Retracted{});
    r->transit<state::Retracted>(state::Waiting{});
  }
  for (Request* r : plan.admitted) r->transit<state::Waiting>(state::Prefilling{});
}

}  // namespace ts
