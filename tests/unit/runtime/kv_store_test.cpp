// The two-tier KV cache: KvCache (device tier) + KvStore (host tier) bookkeeping, the ops a
// plan carries and their copies on CPU pools (per rank); then the engine with and without the
// tier: greedy outputs identical under eviction, retraction and aborts (also with slow staged
// loads), other requests decoding while a load is in flight, and a multi-turn workload that
// overflows the device pool reusing every later turn's whole history. (Staged loads in the
// scheduler and the randomized simulation with the tier: scheduler_test.cpp.)
#include <cstdio>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "engine_test_util.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_store.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::test;

namespace {

std::vector<int32_t> seq(int n, int base) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), base);
  return t;
}

// One sequence's life in the cache: allocate, "compute" every token, release.
void run_seq(KvCache& kv, const std::vector<int32_t>& toks) {
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  ASSERT_TRUE(kv.ensure(table, int64_t(toks.size())));
  kv.commit(toks.data(), int64_t(toks.size()), table, hashes);
  kv.release(table, hashes);
}

TEST(KvStoreTiers, EvictedBlocksAreWrittenBackAndLoadedOnAPrefixHit) {
  KvCache kv(4, 4, true);
  KvStore store(8, 4);
  kv.set_store(&store);
  auto a = seq(12, 100), b = seq(16, 500);
  kv.begin_plan();
  run_seq(kv, a);  // 3 hashed blocks, cached on the device LRU
  KvBlockOps ops;
  kv.take_ops(ops);
  EXPECT_TRUE(ops.empty());
  kv.begin_plan();
  run_seq(kv, b);  // needs all 4 blocks: a's 3 are evicted and written back
  kv.take_ops(ops);
  ASSERT_EQ(ops.writeback.size(), 3u);
  EXPECT_TRUE(ops.load.empty());
  EXPECT_EQ(store.cached_blocks(), 3);
  kv.check();
  store.check();

  // a again: nothing on the device, all 3 full blocks in the host tier (the 13th token would
  // be the one recomputed: max_tokens = 12 still allows 3 blocks).
  kv.begin_plan();
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  int got = kv.match_prefix(a.data(), 12, table, hashes);
  EXPECT_EQ(got, 12);
  EXPECT_EQ(kv.last_host_tokens(), 12);
  EXPECT_EQ(kv.host_hit_blocks(), 3);
  const uint64_t seq = kv.last_wait_seq();
  EXPECT_NE(seq, 0u);
  kv.take_ops(ops);
  ASSERT_EQ(ops.load.size(), 3u);
  // Taking 3 device blocks evicted 3 of b's 4: those are written back too, before the loads.
  EXPECT_EQ(ops.writeback.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ops.load[i].device_block, table[i]);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(kv.refs(table[i]), 2);  // the sequence's and the load's
  kv.check();
  store.check();
  EXPECT_EQ(store.cached_blocks(), 6);
  store.execute(ops);
  EXPECT_FALSE(kv.loaded(seq));  // known only at the next plan's poll
  // The loaded blocks are indexed on the device already: a second lookup hits the device tier
  // and waits for the same batch.
  kv.release(table, hashes);
  EXPECT_EQ(kv.available_blocks(), 1);  // the three loading blocks stay with their batch
  got = kv.match_prefix(a.data(), 12, table, hashes);
  EXPECT_EQ(got, 12);
  EXPECT_EQ(kv.last_host_tokens(), 0);
  EXPECT_EQ(kv.last_wait_seq(), seq);
  kv.release(table, hashes);
  kv.begin_plan();  // the batch completed (bookkeeping only): its references are dropped
  EXPECT_TRUE(kv.loaded(seq));
  EXPECT_EQ(kv.available_blocks(), 4);
  got = kv.match_prefix(a.data(), 12, table, hashes);
  EXPECT_EQ(got, 12);
  EXPECT_EQ(kv.last_wait_seq(), 0u);
  kv.take_ops(ops);
  EXPECT_TRUE(ops.empty());
  kv.release(table, hashes);
  kv.check();
  store.check();
}

TEST(KvStoreTiers, HostLruDropsTheOldestAndNeverReusesABlockThisPlanLoads) {
  KvCache kv(2, 4, true);
  KvStore store(2, 4);
  kv.set_store(&store);
  KvBlockOps ops;
  // Three one-block sequences through a 2-block device pool: x is evicted by z, y by w ...
  auto x = seq(4, 10), y = seq(4, 20), z = seq(4, 30), w = seq(4, 40), v = seq(4, 50);
  for (auto* s : {&x, &y, &z, &w, &v}) {
    kv.begin_plan();
    run_seq(kv, *s);
    kv.take_ops(ops);
  }
  // Device holds w, v; the host tier (2 blocks) holds the two most recent evictions: y, z.
  std::vector<int32_t> t;
  std::vector<uint64_t> h;
  kv.begin_plan();
  EXPECT_EQ(kv.match_prefix(x.data(), 4, t, h), 0);  // x was dropped by the host LRU
  EXPECT_EQ(kv.match_prefix(y.data(), 4, t, h), 4);  // y comes back from the host
  EXPECT_EQ(kv.last_host_tokens(), 4);
  kv.take_ops(ops);
  ASSERT_EQ(ops.load.size(), 1u);
  ASSERT_EQ(ops.writeback.size(), 1u);
  // The writeback (of w, evicted for y's device block) must not land in the host block the
  // load reads in the same plan.
  EXPECT_NE(ops.writeback[0].host_block, ops.load[0].host_block);
  // A load still in flight keeps its host block pinned across plans: a later eviction's
  // writeback takes another host block.
  const int32_t y_host = ops.load[0].host_block;
  store.set_load_delay_polls(2);
  store.execute(ops);
  kv.release(t, h);
  kv.check();
  store.check();
  kv.begin_plan();  // poll 1 of 3: in flight
  EXPECT_EQ(store.loads_in_flight(), 1);
  run_seq(kv, z);   // evicts v; its writeback must not land in y's host block
  kv.take_ops(ops);
  ASSERT_EQ(ops.writeback.size(), 1u);
  EXPECT_NE(ops.writeback[0].host_block, y_host);
  EXPECT_TRUE(store.contains(KvCache::hash_block(y.data(), 4, 0)));
  kv.check();
  store.check();
}

// Write-through: a committed block is copied to the host tier in the background (a copy
// nobody waits for) at the second plan after its commit (the step in flight may still write
// it), so evicting it later needs no copy. Evicted before then, the copy becomes the eviction's
// writeback; evicted while its copy may still run, the forward waits (wait_writebacks).
TEST(KvStoreTiers, WriteThroughCopiesCommittedBlocksSoEvictionsNeedNoCopy) {
  KvCache kv(4, 4, true);
  KvStore store(16, 4);
  store.set_write_through(true);
  kv.set_store(&store);
  KvBlockOps ops, ops2;
  auto plan = [&](const std::vector<int32_t>* s, bool execute = true) {
    kv.begin_plan();
    if (s) run_seq(kv, *s);
    kv.take_ops(ops);
    if (execute) store.execute(ops);
  };
  auto a = seq(12, 100), b = seq(16, 500), c = seq(16, 900), d = seq(16, 1300);
  plan(&a);  // 3 committed blocks: their write-throughs wait one plan
  EXPECT_TRUE(ops.through.empty());
  plan(nullptr);
  EXPECT_EQ(ops.through.size(), 3u);
  EXPECT_TRUE(ops.writeback.empty());
  EXPECT_FALSE(ops.wait_writebacks());
  EXPECT_FALSE(ops.needs_drain());
  plan(&b);  // evicts a's 3 blocks: the host holds them already, their copy is done
  EXPECT_TRUE(ops.writeback.empty());
  EXPECT_FALSE(ops.wait_writebacks());
  EXPECT_EQ(store.stats().writeback_skipped, 3);
  plan(&c);  // evicts b's 4 blocks before their write-through: they are written back now
  EXPECT_EQ(ops.writeback.size(), 4u);
  EXPECT_TRUE(ops.through.empty());  // b's deferred copies were void
  EXPECT_TRUE(ops.needs_drain());
  plan(nullptr, false);  // c's write-throughs are issued (not executed yet) ...
  EXPECT_EQ(ops.through.size(), 4u);
  kv.begin_plan();
  run_seq(kv, d);  // ... when d evicts c's blocks: its forward waits for the writebacks
  kv.take_ops(ops2);
  EXPECT_TRUE(ops2.wait_writebacks());
  EXPECT_TRUE(ops2.writeback.empty());
  store.execute(ops);
  store.execute(ops2);
  // a comes back from the host tier.
  kv.begin_plan();
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(kv.match_prefix(a.data(), 12, table, hashes), 12);
  EXPECT_EQ(kv.last_host_tokens(), 12);
  kv.take_ops(ops);
  EXPECT_EQ(ops.load.size(), 3u);
  store.execute(ops);
  kv.release(table, hashes);
  kv.check();
  store.check();
  EXPECT_EQ(store.stats().through_blocks, 3 + 4 + 4 + 4);
}

TEST(KvStoreTiers, EventsReportBothTiersInOrder) {
  KvCache kv(1, 4, true);
  KvStore store(4, 4);
  kv.set_store(&store);
  kv.enable_events();
  KvBlockOps ops;
  auto a = seq(4, 1), b = seq(4, 9);
  run_seq(kv, a);
  run_seq(kv, b);
  std::vector<KvCacheEvent> ev;
  kv.drain_events(ev);
  using K = KvCacheEvent::Kind;
  using M = KvCacheEvent::Medium;
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_TRUE(ev[0].kind == K::stored && ev[0].medium == M::gpu && !ev[0].has_parent && ev[0].tokens == a);
  EXPECT_TRUE(ev[1].kind == K::stored && ev[1].medium == M::cpu && ev[1].hash == ev[0].hash && ev[1].tokens == a);
  EXPECT_TRUE(ev[2].kind == K::removed && ev[2].medium == M::gpu && ev[2].hash == ev[0].hash);
  EXPECT_TRUE(ev[3].kind == K::stored && ev[3].medium == M::gpu && ev[3].tokens == b);
  kv.drain_events(ev);
  EXPECT_EQ(ev.size(), 4u);  // appended, nothing new
}

TEST(KvStoreTiers, CopiesRoundTripBlockContentsOnCpuPools) {
  // A 2-layer MHA-shaped pool and an MLA-shaped one (latent in k, no v), [blocks, bs, heads, dim].
  for (bool mla : {false, true}) {
    KvPool pool;
    pool.block_size = 4;
    pool.num_blocks = 3;
    for (int l = 0; l < 2; ++l) {
      pool.k.push_back(Tensor::zeros({3, 4, 2, 8}, DType::f32));
      pool.v.push_back(mla ? Tensor() : Tensor::zeros({3, 4, 2, 8}, DType::bf16));
      pool.aux.push_back(Tensor());
    }
    KvStore store(5, 4);
    store.attach(pool);
    EXPECT_EQ(store.bytes_per_block(), size_t(2 * (4 * 2 * 8 * 4 + (mla ? 0 : 4 * 2 * 8 * 2))));
    auto fill = [&](int blk, int val) {
      for (int l = 0; l < 2; ++l) {
        float* k = static_cast<float*>(pool.k[size_t(l)].data) + blk * 64;
        for (int i = 0; i < 64; ++i) k[i] = float(val + l + i);
        if (!mla) std::memset(static_cast<char*>(pool.v[size_t(l)].data) + blk * 128, val + l, 128);
      }
    };
    fill(1, 7);
    fill(2, 9);
    KvBlockOps ops;
    ops.writeback = {{1, 3}, {2, 4}};  // a run: one copy per tensor
    store.execute(ops);
    fill(1, 0);
    fill(2, 0);
    // Loads are batches the bookkeeping hands out (take_ops), then issued.
    store.begin_plan();
    store.queue_load(4, 0);
    store.queue_load(3, 2);
    store.take_ops(ops);
    store.execute(ops);
    for (int l = 0; l < 2; ++l) {
      const float* k = static_cast<const float*>(pool.k[size_t(l)].data);
      EXPECT_EQ(k[0 * 64 + 5], float(9 + l + 5));
      EXPECT_EQ(k[2 * 64 + 5], float(7 + l + 5));
      if (!mla) {
        EXPECT_EQ(static_cast<const char*>(pool.v[size_t(l)].data)[2 * 128 + 3], char(7 + l));
      }
    }
    EXPECT_EQ(store.stats().bytes_loaded, int64_t(2 * store.bytes_per_block()));
  }
}

// Two ranks' shards (TP): each rank's tensors get their own mirrors and its copies run through
// the rank runner (on the rank's thread in the engine; here: recorded); one bookkeeping serves
// both. A delayed load lands only when its batch completes (the slow copy of the tests).
TEST(KvStoreTiers, EachRankCopiesItsShardAndDelayedLoadsLandAtCompletion) {
  KvPool pools[2];
  for (int r = 0; r < 2; ++r) {
    pools[r].block_size = 2;
    pools[r].num_blocks = 4;
    pools[r].k.push_back(Tensor::zeros({4, 2, 1, 4}, DType::f32));
    pools[r].v.push_back(Tensor::zeros({4, 2, 1, 4}, DType::f32));
    pools[r].aux.push_back(Tensor());
  }
  KvStore store(4, 2);
  store.attach(pools[0], 0);
  store.attach(pools[1], 1);
  EXPECT_EQ(store.ranks(), 2);
  EXPECT_EQ(store.bytes_per_block(), size_t(2 * 2 * (2 * 4 * 4)));
  std::vector<int> ran;
  store.set_rank_runner([&](const std::function<void(int)>& fn) {
    for (int r = 1; r >= 0; --r) {  // any order: ranks touch only their own state
      ran.push_back(r);
      fn(r);
    }
  });
  auto val = [&](int r, int blk) { return pools[r].k[0].ptr<float>()[blk * 8]; };
  for (int r = 0; r < 2; ++r) pools[r].k[0].ptr<float>()[1 * 8] = float(10 + r);  // block 1, rank r
  KvBlockOps ops;
  ops.writeback = {{1, 2}};
  store.execute(ops);
  EXPECT_EQ(ran, (std::vector<int>{1, 0}));
  // A load of host block 2 into device block 3, delayed two polls: the batch comes from the
  // bookkeeping (find + queue_load + take_ops), as the scheduler makes it.
  store.set_load_delay_polls(2);
  store.begin_plan();
  store.offer(1, 77, 0, false, nullptr);  // host block for hash 77 (block 0: free list order)
  KvBlockOps taken;
  store.take_ops(taken);
  store.execute(taken);  // writes device block 1 to host block 0 (both ranks)
  store.begin_plan();
  const int32_t host = store.find(77);
  ASSERT_GE(host, 0);
  store.queue_load(host, 3);
  const uint64_t seq = store.plan_seq();
  store.take_ops(taken);
  store.execute(taken);
  for (int poll = 0; poll < 2; ++poll) {
    EXPECT_EQ(val(0, 3), 0.0f) << "landed early";
    store.begin_plan();
    EXPECT_FALSE(store.loaded(seq));
  }
  store.begin_plan();
  EXPECT_TRUE(store.loaded(seq));
  EXPECT_EQ(val(0, 3), 10.0f);
  EXPECT_EQ(val(1, 3), 11.0f);
  EXPECT_EQ(store.retired_blocks(), (std::vector<int32_t>{3}));
  EXPECT_EQ(store.stats().loaded_bytes_done, int64_t(store.bytes_per_block()));
  store.check();
}

TEST(KvStoreSizing, RatioSizeAndTheAvailableMemoryCap) {
  size_t avail = 0;
  EXPECT_EQ(kvstore_blocks(100, 1024, 2.0, 0, avail), 200);
  EXPECT_EQ(kvstore_blocks(100, 1 << 20, 2.0, 0.5, avail), 512);  // 0.5 GiB of 1 MiB blocks
  EXPECT_GT(avail, 0u);
  // Never more than half of what is free.
  EXPECT_LE(kvstore_blocks(100, 1 << 20, 1e9, 0, avail), int64_t(avail / 2 / (1 << 20)));
}

// --- the engine with the tier --------------------------------------------------------------

std::vector<Result> run_conc(Engine& e, const std::vector<GenerateParams>& ps) {
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) st.push_back(e.submit(p));
  std::vector<Result> out;
  for (auto& s : st) out.push_back(collect(s));
  return out;
}

EngineOptions tiny(bool tier, int64_t pool = 192) {
  EngineOptions o = small_engine(pool, 16);
  o.disable_kvstore = !tier;
  o.kvstore_ratio = 8.0;
  return o;
}

TEST(KvStoreEngine, GreedyIdenticalWithAndWithoutTheTierUnderRetraction) {
  Engine with(tiny(true)), without(tiny(false));
  with.start();
  without.start();
  auto prompts = code_prompts(with, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 24));
  for (int round = 0; round < 2; ++round) {  // round 2: prefixes come back from the host tier
    auto a = run_conc(with, ps), b = run_conc(without, ps);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(a[i].error.empty()) << a[i].error;
      EXPECT_EQ(a[i].tokens, b[i].tokens) << "round " << round << " prompt " << i;
    }
  }
  EngineMetrics m = with.metrics();
  EXPECT_GT(m.retractions, 0);
  EXPECT_GT(m.kvstore_writeback_blocks, 0);
  EXPECT_GT(m.prefix_host_hit_blocks, 0);
  EXPECT_GT(m.kvstore_bytes_loaded, 0);
  EXPECT_EQ(without.metrics().kvstore_total_blocks, 0);
}

// CPU TP 2 (#19: "with TP, each rank its shard"): one bookkeeping, a host mirror per rank's
// KV-head shard under the same block ids; the tier changes no token under eviction pressure.
TEST(KvStoreEngine, Tp2EachRankItsShardGreedyIdenticalWithAndWithoutTheTier) {
  EngineOptions ow = tiny(true), oo = tiny(false);
  ow.parallel.tp_size = oo.parallel.tp_size = 2;
  Engine with(ow), without(oo);
  with.start();
  without.start();
  auto prompts = code_prompts(with, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 12));
  for (int round = 0; round < 2; ++round) {
    auto a = run_conc(with, ps), b = run_conc(without, ps);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(a[i].error.empty()) << a[i].error;
      EXPECT_EQ(a[i].tokens, b[i].tokens) << "round " << round << " prompt " << i;
    }
  }
  EngineMetrics m = with.metrics();
  EXPECT_GT(m.kvstore_total_blocks, 0);
  EXPECT_GT(m.kvstore_writeback_blocks, 0);
  EXPECT_GT(m.prefix_host_hit_blocks, 0);
}

TEST(KvStoreEngine, AbortsLeaveTheTierConsistent) {
  Engine with(tiny(true)), without(tiny(false));
  with.start();
  without.start();
  auto prompts = code_prompts(with, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 16));
  // Cancel every other request right away (some abort waiting, some mid-prefill/decode).
  std::vector<std::shared_ptr<Stream>> st;
  for (auto& p : ps) st.push_back(with.submit(p));
  for (size_t i = 0; i < st.size(); i += 2) st[i]->cancel();
  for (auto& s : st) collect(s);
  auto a = run_conc(with, ps), b = run_conc(without, ps);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens) << "prompt " << i;
  EXPECT_GT(with.metrics().requests_aborted, 0);
}

// Staged loads with slow copies (each batch lands 4 plans late, on the CPU only then): greedy
// outputs still equal the run without the tier, under retraction and aborts, and steps ran
// other requests' rows while loads were in flight.
TEST(KvStoreEngine, SlowStagedLoadsGreedyIdenticalUnderRetractionAndAborts) {
 for (const char* policy : {"write_back", "write_through"}) {
  SCOPED_TRACE(policy);
  EngineOptions ow = tiny(true);
  ow.kvstore_test_load_delay_polls = 4;
  ow.kvstore_write_policy = policy;
  Engine with(ow), without(tiny(false));
  with.start();
  without.start();
  auto prompts = code_prompts(with, 6);
  std::vector<GenerateParams> ps;
  for (auto& p : prompts) ps.push_back(greedy(p, 20));
  auto ref = run_conc(without, ps);
  for (int round = 0; round < 3; ++round) {
    // Round 1: cancel every third request right away (aborted waiting, loading, or running).
    std::vector<std::shared_ptr<Stream>> st;
    for (auto& p : ps) st.push_back(with.submit(p));
    if (round == 1)
      for (size_t i = 0; i < st.size(); i += 3) st[i]->cancel();
    for (size_t i = 0; i < st.size(); ++i) {
      Result a = collect(st[i]);
      if (round == 1 && i % 3 == 0) continue;
      EXPECT_TRUE(a.error.empty()) << a.error;
      EXPECT_EQ(a.tokens, ref[i].tokens) << "round " << round << " prompt " << i;
    }
  }
  EngineMetrics m = with.metrics();
  EXPECT_GT(m.retractions, 0);
  EXPECT_GT(m.requests_aborted, 0);
  EXPECT_GT(m.prefix_host_hit_blocks, 0);
  EXPECT_GT(m.kvstore_staged_steps, 0);
  EXPECT_EQ(m.kvstore_loaded_bytes_done, m.kvstore_bytes_loaded);  // every issued load completed
 }
}

// While a request's prefix is loaded back from the host tier, another request keeps decoding:
// X's prompt goes to the host tier, A decodes, then X's prompt comes back as B, whose load
// takes 6 plans. B's output equals X's (computed from scratch), and A decoded beside the load.
TEST(KvStoreEngine, OtherRequestsDecodeWhileALoadIsInFlight) {
  for (bool overlap : {true, false}) {
    EngineOptions o = tiny(true);
    o.kvstore_test_load_delay_polls = 6;
    o.disable_overlap_schedule = !overlap;
    Engine e(o);
    e.start();
    auto prompts = code_prompts(e, 6);
    std::vector<int32_t> x;
    while (x.size() < 64) x.insert(x.end(), prompts[0].begin(), prompts[0].end());
    x.resize(64);
    Result rx = collect(e.submit(greedy(x, 8)));
    for (int i = 1; i < 4; ++i) {  // push X out of the 192-token device pool
      std::vector<int32_t> y;
      while (y.size() < 150) y.insert(y.end(), prompts[size_t(i)].begin(), prompts[size_t(i)].end());
      y.resize(150);
      collect(e.submit(greedy(y, 4)));
    }
    const int64_t staged0 = e.metrics().kvstore_staged_steps;
    auto sa = e.submit(greedy(prompts[4], 40));
    StreamEvent ev;
    ASSERT_TRUE(sa->pop(ev, 60000));  // A has its first token: it is decoding
    Result rb = collect(e.submit(greedy(x, 8)));
    Result ra = collect(sa);
    EXPECT_TRUE(rb.error.empty() && ra.error.empty()) << rb.error << ra.error;
    EXPECT_EQ(rb.tokens, rx.tokens) << "overlap " << overlap;
    EXPECT_GE(rb.cached_tokens, 48) << "X's prefix should come back from the host tier";
    EngineMetrics m = e.metrics();
    EXPECT_GT(m.prefix_host_hit_tokens, 0);
    // Every plan of B's load ran A's decode (6 polls; A has 40 tokens to go).
    EXPECT_GE(m.kvstore_staged_steps - staged0, 5) << "overlap " << overlap;
    EXPECT_GE(m.kvstore_loaded_requests, 1);
    EXPECT_GT(m.kvstore_loaded_load_s, 0.0);
  }
}

// Four conversations over a device pool that holds about two: round-robin turns, each turn's
// prompt = the previous prompt + its answer + a short new user message.
struct TurnStats {
  double later_ttft = 0;
  int later_turns = 0, min_slack = 1 << 30;  // min over later turns of cached - (history - block)
  int64_t later_prefilled = 0;               // prompt tokens later turns computed (not cached)
};

TurnStats multi_turn(bool tier) {
  EngineOptions o = tiny(tier, 256);
  Engine e(o);
  e.start();
  auto starts = code_prompts(e, 6);
  std::vector<std::vector<int32_t>> conv(4);
  std::vector<int32_t> filler = e.tokenizer().encode("    return result\n", false);
  for (size_t c = 0; c < conv.size(); ++c) {
    conv[c] = starts[c];
    while (conv[c].size() < 100) conv[c].insert(conv[c].end(), starts[(c + 1) % 6].begin(), starts[(c + 1) % 6].end());
  }
  TurnStats ts;
  for (int turn = 0; turn < 3; ++turn) {
    for (size_t c = 0; c < conv.size(); ++c) {
      size_t history = conv[c].size();
      if (turn > 0) conv[c].insert(conv[c].end(), filler.begin(), filler.end());
      auto t0 = std::chrono::steady_clock::now();
      auto st = e.submit(greedy(conv[c], 4));
      StreamEvent ev;
      double ttft = -1;
      Result r;
      while (st->pop(ev, 60000)) {
        if (ttft < 0 && !ev.tokens.empty()) ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) {
          r.cached_tokens = ev.cached_tokens;
          break;
        }
      }
      if (turn > 0) {
        ts.later_ttft += ttft;
        ++ts.later_turns;
        ts.min_slack = std::min(ts.min_slack, r.cached_tokens - (int(history) - o.block_size));
        ts.later_prefilled += int64_t(conv[c].size()) - r.cached_tokens;
      }
      conv[c].insert(conv[c].end(), r.tokens.begin(), r.tokens.end());
    }
  }
  ts.later_ttft /= ts.later_turns;
  return ts;
}

// The prefill work later turns skip is exact and asserted on one run. The TTFT it buys (the
// issue's CPU target: <= 0.6x without the tier) is a wall-clock ratio: a loaded 2-core CI machine
// (ctest -j) once gave 234 vs 163 ms, so the pair is measured up to three times and the target
// must hold in one of them (a tier that does not cut TTFT fails all three).
TEST(KvStoreEngine, OverflowingMultiTurnReusesWholeHistoryAndCutsTtft) {
  bool ttft_ok = false;
  for (int attempt = 0; attempt < 3 && !ttft_ok; ++attempt) {
    TurnStats with = multi_turn(true), without = multi_turn(false);
    std::printf("later turns: %lld vs %lld prompt tokens prefilled, TTFT %.1f vs %.1f ms (tier on vs off)\n",
                static_cast<long long>(with.later_prefilled), static_cast<long long>(without.later_prefilled),
                with.later_ttft * 1e3, without.later_ttft * 1e3);
    // Every later turn: all of its history but at most one block came from a cache tier.
    ASSERT_GE(with.min_slack, 0);
    ASSERT_LT(without.min_slack, 0);  // the workload does overflow the device pool
    ASSERT_LE(double(with.later_prefilled), 0.3 * double(without.later_prefilled));
    ttft_ok = with.later_ttft <= 0.6 * without.later_ttft;
  }
  EXPECT_TRUE(ttft_ok) << "later-turn TTFT with the tier above 0.6x the run without it in 3 attempts";
}

}  // namespace
