#include "server/kv_events.h"

#include <chrono>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <zmq.hpp>

#include "core/log.h"

namespace ts::server {

KvEventsConfig KvEventsConfig::parse(const std::string& text) {
  KvEventsConfig c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("--kv-events-config: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("--kv-events-config: expected a JSON object");
  for (auto& [k, v] : j.items()) {
    try {
      if (k == "enable_kv_cache_events") c.enable = v.get<bool>();
      else if (k == "publisher") c.publisher = v.get<std::string>();
      else if (k == "endpoint") c.endpoint = v.get<std::string>();
      else if (k == "replay_endpoint") c.replay_endpoint = v.is_null() ? "" : v.get<std::string>();
      else if (k == "buffer_steps") c.buffer_steps = v.get<int>();
      else if (k == "hwm") c.hwm = v.get<int>();
      else if (k == "max_queue_size") c.max_queue_size = v.get<int>();
      else if (k == "topic") c.topic = v.get<std::string>();
      else throw std::invalid_argument("--kv-events-config: unknown key \"" + k + "\"");
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument("--kv-events-config: \"" + k + "\" has the wrong type");
    }
  }
  if (c.publisher != "null" && c.publisher != "zmq")
    throw std::invalid_argument("--kv-events-config: publisher must be \"zmq\" or \"null\" (got \"" + c.publisher + "\")");
  if (c.buffer_steps < 0 || c.hwm < 0 || c.max_queue_size < 1)
    throw std::invalid_argument("--kv-events-config: buffer_steps/hwm must be >= 0 and max_queue_size >= 1");
  // vLLM's default publisher is "zmq" once events are enabled without naming one.
  if (c.enable && !j.contains("publisher")) c.publisher = "zmq";
  return c;
}

std::string encode_kv_event_batch(double ts, const std::vector<KvCacheEvent>& events, int block_size) {
  using K = KvCacheEvent::Kind;
  auto medium = [](KvCacheEvent::Medium m) { return m == KvCacheEvent::Medium::gpu ? "GPU" : "CPU"; };
  // Coalesce runs: stores that continue one chain on one medium, removals on one medium.
  struct Group {
    size_t first, last;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!groups.empty()) {
      const KvCacheEvent &a = events[groups.back().last], &b = events[i];
      bool same = a.kind == b.kind && a.medium == b.medium && a.kind != K::cleared &&
                  (a.kind == K::removed || (b.has_parent && b.parent == a.hash));
      if (same) {
        groups.back().last = i;
        continue;
      }
    }
    groups.push_back({i, i});
  }
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(2);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(groups.size()));
  for (const Group& g : groups) {
    const KvCacheEvent& e0 = events[g.first];
    const uint32_t n = uint32_t(g.last - g.first + 1);
    auto hashes = [&] {
      pk.pack_array(n);
      for (size_t i = g.first; i <= g.last; ++i) pk.pack_uint64(events[i].hash);
    };
    if (e0.kind == K::stored) {
      pk.pack_array(7);
      pk.pack(std::string("BlockStored"));
      hashes();
      if (e0.has_parent) pk.pack_uint64(e0.parent);
      else pk.pack_nil();
      size_t ntok = 0;
      for (size_t i = g.first; i <= g.last; ++i) ntok += events[i].tokens.size();
      pk.pack_array(uint32_t(ntok));
      for (size_t i = g.first; i <= g.last; ++i)
        for (int32_t t : events[i].tokens) pk.pack_int32(t);
      pk.pack_int32(block_size);
      pk.pack_nil();  // lora_id
      pk.pack(std::string(medium(e0.medium)));
    } else if (e0.kind == K::removed) {
      pk.pack_array(3);
      pk.pack(std::string("BlockRemoved"));
      hashes();
      pk.pack(std::string(medium(e0.medium)));
    } else {
      pk.pack_array(1);
      pk.pack(std::string("AllBlocksCleared"));
    }
  }
  return std::string(buf.data(), buf.size());
}

struct KvEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> replay;
  std::deque<std::pair<int64_t, std::string>> buffer;
  int64_t seq = 0;
};

static std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[size_t(i)] = char(v & 0xff);
  return s;
}

static int64_t from_be64(const zmq::message_t& m) {
  if (m.size() != 8) return -1;
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return int64_t(v);
}

// vLLM's convention: an endpoint with a wildcard host (or ipc/inproc) is bound, any other is
// connected to (a router that listens).
static bool binds(const std::string& ep) {
  return ep.find('*') != std::string::npos || ep.find("::") != std::string::npos || ep.rfind("ipc://", 0) == 0 ||
         ep.rfind("inproc://", 0) == 0;
}

KvEventPublisher::KvEventPublisher(const KvEventsConfig& cfg, int block_size)
    : cfg_(cfg), block_size_(block_size), z_(std::make_unique<Sockets>()) {
  z_->pub.set(zmq::sockopt::sndhwm, cfg.hwm);
  z_->pub.set(zmq::sockopt::linger, 0);
  if (binds(cfg.endpoint)) z_->pub.bind(cfg.endpoint);
  else z_->pub.connect(cfg.endpoint);
  if (!cfg.replay_endpoint.empty()) {
    z_->replay = std::make_unique<zmq::socket_t>(z_->ctx, zmq::socket_type::router);
    z_->replay->set(zmq::sockopt::linger, 0);
    z_->replay->bind(cfg.replay_endpoint);
  }
  spdlog::info("kv events: publishing on {} (topic \"{}\"{}{})", cfg.endpoint, cfg.topic,
               cfg.replay_endpoint.empty() ? "" : ", replay on ", cfg.replay_endpoint);
  queue_.push_back({KvCacheEvent{KvCacheEvent::Kind::cleared, KvCacheEvent::Medium::gpu, 0, 0, false, {}}});
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::publish(std::vector<KvCacheEvent>& events) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (int(queue_.size()) >= cfg_.max_queue_size) {
      ++dropped_;
      events.clear();
      return;
    }
    queue_.push_back(std::move(events));
  }
  events.clear();
  cv_.notify_one();
}

int64_t KvEventPublisher::published() const {
  std::lock_guard<std::mutex> lk(mu_);
  return published_;
}

int64_t KvEventPublisher::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

// The sockets live on this thread only (ZMQ sockets are not thread-safe): it sends queued
// batches as they come and answers replay requests between them (polled every 20 ms at most).
void KvEventPublisher::run() {
  std::vector<KvCacheEvent> batch;
  while (true) {
    bool have = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (queue_.empty() && !stop_) cv_.wait_for(lk, std::chrono::milliseconds(20));
      if (!queue_.empty()) {
        batch = std::move(queue_.front());
        queue_.pop_front();
        have = true;
      } else if (stop_) {
        break;
      }
    }
    try {
      if (have) {
        double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        std::string payload = encode_kv_event_batch(ts, batch, block_size_);
        const int64_t seq = z_->seq++;
        std::string sb = be64(seq);
        z_->pub.send(zmq::buffer(cfg_.topic), zmq::send_flags::sndmore);
        z_->pub.send(zmq::buffer(sb), zmq::send_flags::sndmore);
        z_->pub.send(zmq::buffer(payload), zmq::send_flags::none);
        if (cfg_.buffer_steps > 0) {
          z_->buffer.emplace_back(seq, std::move(payload));
          if (int(z_->buffer.size()) > cfg_.buffer_steps) z_->buffer.pop_front();
        }
        std::lock_guard<std::mutex> lk(mu_);
        ++published_;
      }
      while (z_->replay) {
        zmq::message_t id, delim, start;
        if (!z_->replay->recv(id, zmq::recv_flags::dontwait)) break;
        // ROUTER frames: [identity, empty, start seq]; anything else is ignored.
        bool ok = id.more() && z_->replay->recv(delim) && delim.size() == 0 && delim.more() && z_->replay->recv(start);
        while (z_->replay->get(zmq::sockopt::rcvmore)) {
          zmq::message_t extra;
          (void)z_->replay->recv(extra);
          ok = false;
        }
        if (!ok) continue;
        const int64_t from = from_be64(start);
        auto reply = [&](const std::string& seq_bytes, const std::string& payload) {
          z_->replay->send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
          z_->replay->send(zmq::message_t(), zmq::send_flags::sndmore);
          z_->replay->send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
          z_->replay->send(zmq::buffer(payload), zmq::send_flags::none);
        };
        for (auto& [seq, payload] : z_->buffer)
          if (seq >= from) reply(be64(seq), payload);
        reply(be64(-1), std::string());
      }
    } catch (const std::exception& e) {
      spdlog::warn("kv events: {}", e.what());
    }
  }
}

}  // namespace ts::server
