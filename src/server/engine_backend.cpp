#include "server/backend.h"
#include "tokenizer/tokenizer.h"

namespace ts::server {

namespace {
class EngineBackend final : public Backend {
 public:
  explicit EngineBackend(const EngineOptions& opts) : engine_(opts) { engine_.start(); }
  ~EngineBackend() override { stop(); }
  std::shared_ptr<Stream> submit(GenerateParams params) override { return engine_.submit(std::move(params)); }
  EngineMetrics metrics() const override { return engine_.metrics(); }
  std::vector<int32_t> encode(const std::string& text, bool add_special) const override {
    return engine_.tokenizer().encode(text, add_special);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return engine_.tokenizer().decode(ids, skip_special);
  }
  int64_t context_length() const override { return engine_.context_length(); }
  int64_t vocab_size() const override { return engine_.vocab_size(); }
  void stop() override {
    if (!stopped_) {
      stopped_ = true;
      engine_.stop();
    }
  }

 private:
  Engine engine_;
  bool stopped_ = false;
};
}  // namespace

std::shared_ptr<Backend> make_engine_backend(const EngineOptions& opts) {
  return std::make_shared<EngineBackend>(opts);
}

}  // namespace ts::server
