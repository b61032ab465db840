// KV cache events for external prefix-aware routers (llm-d, Dynamo, the Gateway API Inference
// Extension), in vLLM's KV-events wire format so their vLLM subscribers read us unchanged:
//   ZMQ PUB, one multipart message per engine step with events:
//     [topic, seq (int64 big-endian, from 0, +1 per message), payload]
//   payload = msgpack array [ts (float64 seconds since the epoch), [event, ...]]
//   event   = ["BlockStored", [hash, ...], parent_hash | nil, [token ids], block_size, nil (lora_id), medium]
//           | ["BlockRemoved", [hash, ...], medium]
//           | ["AllBlocksCleared"]
//   (vLLM's msgspec structs with array_like + tag: the tag first, then the fields in order;
//   medium "GPU" for the device tier — also on the CPU backend — and "CPU" for the host tier.)
// Block hashes are our chained xxh64 block hashes (KvCache::hash_block), unsigned 64-bit.
// Consecutive stores of one chain are one BlockStored (hashes in order, token ids concatenated,
// the parent of the first), consecutive removals of one medium one BlockRemoved.
// Resync: an optional ROUTER replay socket; a client sends [empty, start seq (int64 BE)] (a REQ
// or DEALER socket) and gets every buffered message with seq >= start as [empty, seq, payload],
// then [empty, -1, empty]. At start the publisher sends AllBlocksCleared so a router drops what
// it knew of an earlier run of this replica.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kv_store.h"

namespace ts::server {

// vLLM's --kv-events-config JSON (KVEventsConfig): enable_kv_cache_events, publisher ("null" |
// "zmq"), endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic. Unknown keys are
// an error naming the key.
struct KvEventsConfig {
  bool enable = false;
  std::string publisher = "null";
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // empty: no replay socket
  int buffer_steps = 10000;     // messages kept for replay
  int hwm = 100000;             // PUB high-water mark
  int max_queue_size = 100000;  // batches queued for the publisher thread before dropping
  std::string topic;
  bool active() const { return enable && publisher == "zmq"; }
  static KvEventsConfig parse(const std::string& json);  // throws std::invalid_argument
};

// One message's payload (see the header comment).
std::string encode_kv_event_batch(double ts, const std::vector<KvCacheEvent>& events, int block_size);

class KvEventPublisher {
 public:
  KvEventPublisher(const KvEventsConfig& cfg, int block_size);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;
  // Engine thread: hands one step's events to the publisher thread (`events` is emptied).
  void publish(std::vector<KvCacheEvent>& events);
  int64_t published() const;  // messages sent so far
  int64_t dropped() const;    // batches dropped because the queue was full

 private:
  void run();
  KvEventsConfig cfg_;
  int block_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<KvCacheEvent>> queue_;
  bool stop_ = false;
  int64_t published_ = 0, dropped_ = 0;
  std::thread thread_;
  struct Sockets;
  std::unique_ptr<Sockets> z_;
};

}  // namespace ts::server
