// KV cache events: the --kv-events-config JSON, the msgpack payload (vLLM's array-like tagged
// structs), and the ZMQ publisher end to end: a SUB socket decodes a real engine's events, and a
// DEALER socket resyncs through the replay socket.
#include <gtest/gtest.h>
#include <unistd.h>

#include <msgpack.hpp>
#include <thread>
#include <zmq.hpp>

#include "../runtime/engine_test_util.h"
#include "runtime/kv_cache.h"
#include "server/backend.h"
#include "server/kv_events.h"
#include "tokenizer/tokenizer.h"

using namespace ts;
using namespace ts::server;

namespace {

TEST(KvEventsConfig, ParsesVllmJson) {
  KvEventsConfig c = KvEventsConfig::parse(
      R"({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001", "buffer_steps": 5, "topic": "kv"})");
  EXPECT_TRUE(c.active());
  EXPECT_EQ(c.endpoint, "tcp://*:6000");
  EXPECT_EQ(c.replay_endpoint, "tcp://*:6001");
  EXPECT_EQ(c.buffer_steps, 5);
  EXPECT_EQ(c.topic, "kv");
  EXPECT_TRUE(KvEventsConfig::parse(R"({"enable_kv_cache_events": true})").active());  // zmq by default
  EXPECT_FALSE(KvEventsConfig::parse(R"({"enable_kv_cache_events": true, "publisher": "null"})").active());
  EXPECT_TRUE(KvEventsConfig::parse(R"({"replay_endpoint": null})").replay_endpoint.empty());
  EXPECT_THROW(KvEventsConfig::parse(R"({"endpiont": "x"})"), std::invalid_argument);
  EXPECT_THROW(KvEventsConfig::parse(R"({"hwm": "many"})"), std::invalid_argument);
  EXPECT_THROW(KvEventsConfig::parse("[1]"), std::invalid_argument);
}

std::vector<int32_t> toks(int a, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(a + i);
  return t;
}

TEST(KvEventsEncode, ArrayLikeTaggedStructsWithChainsCoalesced) {
  using K = KvCacheEvent::Kind;
  using M = KvCacheEvent::Medium;
  std::vector<KvCacheEvent> ev = {
      {K::stored, M::gpu, 11, 0, false, toks(0, 2)},  {K::stored, M::gpu, 12, 11, true, toks(2, 2)},  // one chain
      {K::stored, M::cpu, 11, 0, false, toks(0, 2)},  {K::removed, M::gpu, 11, 0, false, {}},
      {K::removed, M::gpu, 0xffffffffffffffffull, 0, false, {}}, {K::cleared, M::gpu, 0, 0, false, {}}};
  std::string bytes = encode_kv_event_batch(1234.5, ev, 2);
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& o = oh.get();
  ASSERT_EQ(o.type, msgpack::type::ARRAY);
  ASSERT_EQ(o.via.array.size, 2u);
  EXPECT_EQ(o.via.array.ptr[0].as<double>(), 1234.5);
  const msgpack::object& evs = o.via.array.ptr[1];
  ASSERT_EQ(evs.via.array.size, 4u);  // stored x2 (GPU chain, CPU), removed x2 (one), cleared
  auto at = [&](size_t i) { return evs.via.array.ptr[i].via.array; };
  EXPECT_EQ(at(0).ptr[0].as<std::string>(), "BlockStored");
  ASSERT_EQ(at(0).size, 7u);
  EXPECT_EQ(at(0).ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{11, 12}));
  EXPECT_TRUE(at(0).ptr[2].is_nil());
  EXPECT_EQ(at(0).ptr[3].as<std::vector<int32_t>>(), toks(0, 4));
  EXPECT_EQ(at(0).ptr[4].as<int>(), 2);
  EXPECT_TRUE(at(0).ptr[5].is_nil());
  EXPECT_EQ(at(0).ptr[6].as<std::string>(), "GPU");
  EXPECT_EQ(at(1).ptr[6].as<std::string>(), "CPU");
  EXPECT_EQ(at(2).ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(at(2).ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{11, 0xffffffffffffffffull}));
  EXPECT_EQ(at(2).ptr[2].as<std::string>(), "GPU");
  ASSERT_EQ(at(3).size, 1u);
  EXPECT_EQ(at(3).ptr[0].as<std::string>(), "AllBlocksCleared");
}

int64_t be(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return int64_t(v);
}

// A real engine behind the publisher: a SUB socket sees its prompt's full blocks stored on the
// device tier (token ids and chained hashes), and the replay socket returns what it missed.
// Connects `sub` and waits until the connection is up (a socket monitor's CONNECTED event, up to
// 10 s), then 200 ms for the subscription to reach the PUB: a PUB drops what it sends before then
// (ZMQ's slow joiner). A fixed 300 ms sleep was not enough on a loaded 2-core machine.
void join(zmq::socket_t& sub, const std::string& endpoint) {
  struct Connected : zmq::monitor_t {
    bool up = false;
    void on_event_connected(const zmq_event_t&, const char*) override { up = true; }
  } mon;
  static int n = 0;
  mon.init(sub, "inproc://kv-events-test-monitor-" + std::to_string(++n), ZMQ_EVENT_CONNECTED);
  sub.connect(endpoint);
  const auto t0 = std::chrono::steady_clock::now();
  while (!mon.up && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) mon.check_event(100);
  EXPECT_TRUE(mon.up) << "SUB did not connect to " << endpoint;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

TEST(KvEventsPublisher, SubscriberDecodesEngineEventsAndReplayResyncs) {
  const std::string base = "ipc:///tmp/ts-kv-events-test-" + std::to_string(getpid());
  KvEventsConfig cfg = KvEventsConfig::parse(R"({"enable_kv_cache_events": true, "topic": "kv"})");
  cfg.endpoint = base + "-pub";
  cfg.replay_endpoint = base + "-replay";
  EngineOptions eo = test::small_engine(4096, 16);
  auto backend = make_engine_backend(eo, cfg);

  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.set(zmq::sockopt::rcvtimeo, 20000);
  join(sub, cfg.endpoint);

  std::string text;
  for (int i = 0; i < 10; ++i) text += "def f" + std::to_string(i) + "(x):\n    return x + " + std::to_string(i) + "\n";
  std::vector<int32_t> prompt = backend->encode(text, true);
  ASSERT_GE(prompt.size(), 33u);
  GenerateParams p = test::greedy(prompt, 2);
  StreamEvent ev;
  auto st = backend->submit(p);
  while (st->pop(ev, 60000) && !ev.finished) {
  }

  // The first message after the startup AllBlocksCleared (seq 0: the publisher's thread may send
  // it before or after we joined) holds the prompt's first full blocks on "GPU".
  zmq::message_t topic, seq, payload;
  ASSERT_TRUE(sub.recv(topic));
  ASSERT_TRUE(sub.recv(seq));
  ASSERT_TRUE(sub.recv(payload));
  if (be(seq) == 0) {
    msgpack::object_handle o0 = msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
    EXPECT_EQ(o0.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
    ASSERT_TRUE(sub.recv(topic));
    ASSERT_TRUE(sub.recv(seq));
    ASSERT_TRUE(sub.recv(payload));
  }
  EXPECT_EQ(topic.to_string(), "kv");
  const int64_t first_seq = be(seq);
  EXPECT_GE(first_seq, 1);
  msgpack::object_handle oh = msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  const auto& events = oh.get().via.array.ptr[1].via.array;
  ASSERT_GE(events.size, 1u);
  const auto& e0 = events.ptr[0].via.array;
  EXPECT_EQ(e0.ptr[0].as<std::string>(), "BlockStored");
  auto hashes = e0.ptr[1].as<std::vector<uint64_t>>();
  ASSERT_GE(hashes.size(), 1u);
  EXPECT_EQ(hashes[0], KvCache::hash_block(prompt.data(), 16, 0));
  auto ids = e0.ptr[3].as<std::vector<int32_t>>();
  EXPECT_EQ(ids, std::vector<int32_t>(prompt.begin(), prompt.begin() + long(ids.size())));
  EXPECT_EQ(ids.size(), hashes.size() * 16);
  EXPECT_EQ(e0.ptr[6].as<std::string>(), "GPU");

  // Resync from 0: every buffered message in order, then the end marker (-1, empty).
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 20000);
  dealer.connect(cfg.replay_endpoint);
  std::string zero(8, '\0');
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(zero), zmq::send_flags::none);
  std::vector<int64_t> got;
  std::string first_payload;
  while (true) {
    zmq::message_t delim, s, pl;
    ASSERT_TRUE(dealer.recv(delim));
    ASSERT_TRUE(dealer.recv(s));
    ASSERT_TRUE(dealer.recv(pl));
    int64_t v = be(s);
    if (v == -1) {
      EXPECT_EQ(pl.size(), 0u);
      break;
    }
    if (got.empty()) first_payload = pl.to_string();
    got.push_back(v);
  }
  ASSERT_GE(got.size(), 2u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], int64_t(i));
  msgpack::object_handle c = msgpack::unpack(first_payload.data(), first_payload.size());
  EXPECT_EQ(c.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
  backend->stop();
}

}  // namespace
