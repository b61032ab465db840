// Stored responses of /v1/responses (store: true): what previous_response_id continues and
// GET /v1/responses/{id} returns. In memory only, bounded: the least recently used entry goes
// when --responses-store-size is reached (0: nothing is stored). Thread-safe (one mutex; the
// entries are small JSON values copied in and out).
#pragma once
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/protocol.h"

namespace ts::server {

class ResponseStore {
 public:
  struct Entry {
    Json conversation;  // chat-form messages up to and including this response's output
    Json response;      // the response object as returned
  };
  explicit ResponseStore(size_t capacity) : cap_(capacity) {}
  void put(const std::string& id, Entry e) {
    if (cap_ == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = map_.find(id); it != map_.end()) {
      order_.erase(it->second.pos);
      map_.erase(it);
    }
    order_.push_front(id);
    map_.emplace(id, Slot{std::move(e), order_.begin()});
    while (map_.size() > cap_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }
  std::optional<Entry> get(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second.pos);  // most recently used
    return it->second.entry;
  }
  bool erase(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return false;
    order_.erase(it->second.pos);
    map_.erase(it);
    return true;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.size();
  }
  size_t capacity() const { return cap_; }

 private:
  struct Slot {
    Entry entry;
    std::list<std::string>::iterator pos;
  };
  size_t cap_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // most recent first
  std::unordered_map<std::string, Slot> map_;
};

}  // namespace ts::server
