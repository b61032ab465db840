// What the HTTP layer needs from the model side. The real one wraps ts::Engine
// (make_engine_backend); tests plug in a scripted fake to drive the HTTP layer without a model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ts::server {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::shared_ptr<Stream> submit(GenerateParams params) = 0;  // thread-safe
  virtual EngineMetrics metrics() const = 0;                          // thread-safe
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual void stop() {}
};

// Loads the model and tokenizer (may throw ts::Error) and starts the engine thread.
struct KvEventsConfig;
// `events`: KV cache events (--kv-events-config); off unless active().
std::shared_ptr<Backend> make_engine_backend(const EngineOptions& opts, const KvEventsConfig& events);

}  // namespace ts::server
