// Host bookkeeping of device logits processing (runtime/device_logits.h): which requests qualify,
// slot assignment and seeding, the per-step rows (min_tokens ban), and slots going back to the
// pool when a request ends or is retracted, so counts never leak between requests. The device
// kernels are tested against the CPU sampler in tests/cuda/logits_proc_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "runtime/device_logits.h"
#include "runtime/kv_cache.h"
#include "runtime/plain_worker.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/structured.h"

namespace ts {
namespace {

constexpr int32_t kEos = 2;

std::shared_ptr<Request> make_req(int64_t id, GenerateParams p, std::vector<int32_t> prompt, int out = 0) {
  auto r = std::make_shared<Request>();
  r->id = id;
  r->tokens = std::move(prompt);
  r->prompt_len = int(r->tokens.size());
  for (int i = 0; i < out; ++i) r->tokens.push_back(100 + i);
  r->params = std::move(p);
  r->constraints = LogitsConstraints::make(r->params, {kEos});
  return r;
}

GenerateParams pen(float rep, float pres = 0, float freq = 0) {
  GenerateParams p;
  p.repetition_penalty = rep;
  p.presence_penalty = pres;
  p.frequency_penalty = freq;
  return p;
}

TEST(DeviceLogits, WhoQualifies) {
  GenerateParams plain;
  EXPECT_FALSE(DeviceLogits::wants(*make_req(1, plain, {1})));
  for (auto p : {pen(1.2f), pen(1, 0.5f), pen(1, 0, -0.3f)}) {
    EXPECT_TRUE(DeviceLogits::wants(*make_req(1, p, {1})));
    EXPECT_TRUE(DeviceLogits::supported(*make_req(1, p, {1})));
  }
  GenerateParams bias;
  bias.logit_bias = {{3, 1.0f}, {9, -2.0f}};
  EXPECT_TRUE(DeviceLogits::supported(*make_req(1, bias, {1})));
  GenerateParams min;
  min.min_tokens = 4;
  EXPECT_TRUE(DeviceLogits::supported(*make_req(1, min, {1})));
  GenerateParams lp = pen(1.2f);
  lp.logprobs = 0;  // raw logprobs need host logits
  EXPECT_TRUE(DeviceLogits::wants(*make_req(1, lp, {1})));
  EXPECT_FALSE(DeviceLogits::supported(*make_req(1, lp, {1})));
  GenerateParams dup;
  dup.logit_bias = {{3, 1.0f}, {3, 2.0f}};  // summed in order on the host: not on the device
  EXPECT_FALSE(DeviceLogits::supported(*make_req(1, dup, {1})));
  GenerateParams many;
  for (int i = 0; i <= ops::kLogitsMaxBias; ++i) many.logit_bias.emplace_back(i, 1.0f);
  EXPECT_FALSE(DeviceLogits::supported(*make_req(1, many, {1})));
  GenerateParams stops;
  stops.min_tokens = 2;
  for (int i = 0; i < ops::kLogitsMaxStops; ++i) stops.stop_token_ids.push_back(10 + i);  // + eos: one too many
  EXPECT_FALSE(DeviceLogits::supported(*make_req(1, stops, {1})));
}

TEST(DeviceLogits, AcquireSeedsFromTheWholeHistory) {
  DeviceLogits dl(2, 1000, 8, Device::cpu);
  GenerateParams p = pen(1.3f, 0.2f, 0.1f);
  p.logit_bias = {{5, 1.5f}, {7, -3.0f}};
  p.min_tokens = 3;
  p.stop_token_ids = {11};
  auto r = make_req(1, p, {4, 5, 6}, 2);
  ASSERT_TRUE(dl.acquire(*r));
  ASSERT_TRUE(r->logits_slot);
  EXPECT_TRUE(dl.pending(*r->logits_slot));
  EXPECT_EQ(dl.seeds(), 0) << "seeded with the step that first samples it, not when planned";
  LogitsSeeds staged;
  ASSERT_TRUE(dl.stage_seed(*r, staged));
  EXPECT_FALSE(dl.pending(*r->logits_slot));
  EXPECT_FALSE(dl.stage_seed(*r, staged)) << "staged once";
  dl.run_seeds(staged);
  EXPECT_EQ(dl.seeds(), 1);
  const DeviceLogits::Seed& s = dl.last_seed();
  EXPECT_EQ(s.slot, *r->logits_slot);
  EXPECT_EQ(s.prompt_len, 3);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{4, 5, 6, 100, 101}));
  ASSERT_EQ(s.info.size(), size_t(ops::kLogitsSlotInfo));
  EXPECT_EQ(s.info[0], 2);  // bias entries
  EXPECT_EQ(s.info[1], 2);  // stop ids: eos + stop_token_ids
  EXPECT_EQ(s.info[2], 5);
  EXPECT_EQ(s.info[3], 7);
  float b1;
  std::memcpy(&b1, &s.info[2 + ops::kLogitsMaxBias + 1], 4);
  EXPECT_EQ(b1, -3.0f);
  EXPECT_EQ(s.info[2 + 2 * ops::kLogitsMaxBias], kEos);
  EXPECT_EQ(s.info[2 + 2 * ops::kLogitsMaxBias + 1], 11);
  // A second acquire keeps the slot and does not reseed (the counts are updated on the device).
  const int slot = *r->logits_slot;
  EXPECT_TRUE(dl.acquire(*r));
  EXPECT_EQ(*r->logits_slot, slot);
  LogitsSeeds again;
  EXPECT_FALSE(dl.stage_seed(*r, again));
  EXPECT_TRUE(again.empty());
  // Rows: the parameters, and the min_tokens ban until 3 tokens are generated.
  ops::LogitsProcRow row = dl.row(*r);
  EXPECT_EQ(row.slot, slot);
  EXPECT_EQ(row.repetition, 1.3f);
  EXPECT_EQ(row.presence, 0.2f);
  EXPECT_EQ(row.frequency, 0.1f);
  EXPECT_EQ(row.ban_stop, 1);  // 2 generated < 3
  r->tokens.push_back(42);
  EXPECT_EQ(dl.row(*r).ban_stop, 0);
  // Bound requests no longer need host logits, and overlap (counts live on the device).
  EXPECT_FALSE(needs_host_logits(*r));
  EXPECT_TRUE(PlainWorker::can_overlap(*r));
  // A request without a slot: row slot -1, host logits as before.
  auto q = make_req(2, pen(1.1f), {1});
  EXPECT_EQ(dl.row(*q).slot, -1);
  EXPECT_TRUE(needs_host_logits(*q));
  EXPECT_FALSE(PlainWorker::can_overlap(*q));
}

TEST(DeviceLogits, SlotsGoBackWhenRequestsEndAndAreNeverShared) {
  DeviceLogits dl(2, 100, 8, Device::cpu);
  auto a = make_req(1, pen(1.2f), {1, 2});
  auto b = make_req(2, pen(1.2f), {3});
  auto c = make_req(3, pen(1.2f), {4});
  ASSERT_TRUE(dl.acquire(*a));
  ASSERT_TRUE(dl.acquire(*b));
  EXPECT_NE(*a->logits_slot, *b->logits_slot);
  EXPECT_FALSE(dl.acquire(*c));  // every slot held: c samples on the host
  EXPECT_FALSE(c->logits_slot);
  EXPECT_EQ(dl.free_slots(), 0);
  const int freed = *a->logits_slot;
  a.reset();  // the request ended
  EXPECT_EQ(dl.free_slots(), 1);
  ASSERT_TRUE(dl.acquire(*c));
  EXPECT_EQ(*c->logits_slot, freed);
  EXPECT_TRUE(dl.pending(freed)) << "a reused slot is reseeded";
  LogitsSeeds st;
  ASSERT_TRUE(dl.stage_seed(*c, st));
  dl.run_seeds(st);
  EXPECT_EQ(dl.last_seed().tokens, (std::vector<int32_t>{4}));  // reseeded with c's tokens only
  EXPECT_EQ(dl.last_seed().slot, freed);
  // Unsupported requests never take a slot.
  c.reset();
  auto g = make_req(5, GenerateParams{}, {5});
  EXPECT_FALSE(dl.acquire(*g));
  EXPECT_EQ(dl.free_slots(), 1);
}

TEST(DeviceLogits, SeedsWithFuturesResolveWithTheirStep) {
  // Overlap scheduling: a request retracted while its step was in flight is readmitted with a
  // future at the end of its history (the id that step samples). It takes a slot anyway; the
  // seed is staged with the future and resolved by the step that runs it, from the previous
  // step's result (PlainWorker::resolve_futures), before the slot is seeded.
  DeviceLogits dl(4, 1000, 8, Device::cpu);
  auto a = make_req(1, pen(1.2f), {7, 8}, 1);  // prompt 7 8, output 100
  auto b = make_req(2, pen(1.0f, 0.5f), {9});
  a->tokens.push_back(-2);  // row 1 of the step in flight
  b->tokens.push_back(-1);  // row 0
  ASSERT_TRUE(dl.acquire(*a));
  ASSERT_TRUE(dl.acquire(*b));
  LogitsSeeds st;
  ASSERT_TRUE(dl.stage_seed(*a, st));
  ASSERT_TRUE(dl.stage_seed(*b, st));
  ASSERT_EQ(st.items.size(), 2u);
  EXPECT_EQ(st.tokens, (std::vector<int32_t>{7, 8, 100, -2, 9, -1}));
  EXPECT_EQ(st.info.size(), size_t(2 * ops::kLogitsSlotInfo));
  EXPECT_THROW(dl.run_seeds(st), Error) << "futures must be resolved first";
  StepResult prev;
  prev.rows.resize(2);
  prev.rows[0] = {0, 1};
  prev.rows[1] = {1, 1};
  prev.tokens = {555, 444};
  PlainWorker::resolve_futures(st.tokens, &prev);
  EXPECT_EQ(st.tokens, (std::vector<int32_t>{7, 8, 100, 444, 9, 555}));
  dl.run_seeds(st);
  EXPECT_EQ(dl.seeds(), 2);
  EXPECT_EQ(dl.last_seed().slot, *b->logits_slot);
  EXPECT_EQ(dl.last_seed().tokens, (std::vector<int32_t>{9, 555}));
  EXPECT_EQ(dl.last_seed().prompt_len, 1);
  // A future the previous step did not produce (a prefill row samples nothing) is an error.
  std::vector<int32_t> bad = {1, -3};
  EXPECT_THROW(PlainWorker::resolve_futures(bad, &prev), Error);
  prev.rows[0].count = 0;
  bad = {-1};
  EXPECT_THROW(PlainWorker::resolve_futures(bad, &prev), Error);
  std::vector<int32_t> none = {-1};
  EXPECT_THROW(PlainWorker::resolve_futures(none, nullptr), Error);
}

TEST(DeviceLogits, SchedulerDropsTheSlotOnRetractionAndEnd) {
  // Two requests that outgrow a 16-token pool: the newest is retracted (its slot must go back,
  // to be reseeded from its tokens when it runs again); finished requests are reaped (slot back).
  DeviceLogits dl(4, 100, 8, Device::cpu);
  KvCache kv(4, 4, false);
  SchedulerOptions so;
  so.token_budget = 64;
  Scheduler s(kv, so);
  auto r1 = make_req(1, pen(1.2f), std::vector<int32_t>(7, 1));
  auto r2 = make_req(2, pen(1.2f), std::vector<int32_t>(7, 2));
  r1->params.max_tokens = r2->params.max_tokens = 20;
  s.add(r1);
  s.add(r2);
  std::mt19937 rng(2);
  StepPlan p;
  bool retracted = false;
  for (int step = 0; step < 40 && !(retracted && !r1->logits_slot); ++step) {
    s.plan(p);
    apply_plan_transitions(p);
    for (Request* r : p.retracted) {
      retracted = true;
      EXPECT_EQ(r->id, 2);
      EXPECT_FALSE(r->logits_slot) << "a retracted request keeps no slot";
    }
    for (ScheduledChunk& c : p.chunks) dl.acquire(*c.req);  // what the engine does per plan
    EXPECT_EQ(dl.free_slots(), 4 - int(bool(r1->logits_slot)) - int(bool(r2->logits_slot)));
    for (ScheduledChunk& c : p.chunks) {  // the engine's apply, minimal
      Request& r = *c.req;
      r.num_computed += c.num_tokens;
      if (r.num_computed < int(r.tokens.size())) continue;
      if (r.is<state::Prefilling>()) r.transit<state::Prefilling>(state::Decoding{});
      r.tokens.push_back(int32_t(rng() % 50));
      if (r.num_generated() >= 3) r.transit<state::Decoding>(state::Finished{FinishReason::length});
      kv.commit(r.tokens.data(), r.num_computed, r.block_table, r.block_hashes);
    }
    s.reap();
  }
  EXPECT_TRUE(retracted);
  EXPECT_FALSE(r1->logits_slot) << "a finished request gives its slot back when reaped";
}

}  // namespace
}  // namespace ts
