#include "runtime/prompt_pass.h"
#include "server/backend.h"
#include "server/kv_events.h"
#include "runtime/structured.h"
#include "server/output_processor.h"
#include "tokenizer/tokenizer.h"

namespace ts::server {

namespace {
class EngineBackend final : public Backend {
 public:
  EngineBackend(const EngineOptions& opts, const KvEventsConfig& events, std::vector<std::string> grammar_markers)
      : engine_(with_events(opts, events)),
        eos_(engine_.eos_token_ids()),
        grammars_(engine_.tokenizer_ptr(), eos_, 256, std::move(grammar_markers)) {
    if (events.active()) {
      publisher_ = std::make_unique<KvEventPublisher>(events, opts.block_size);
      engine_.set_kv_event_sink([p = publisher_.get()](std::vector<KvCacheEvent>& ev) { p->publish(ev); });
    }
    engine_.start();
  }
  ~EngineBackend() override { stop(); }
  // The engine sends ids; the text (detok, stop strings) is made when the HTTP side pops each
  // event, on its thread (StreamEvent::text).
  std::shared_ptr<Stream> submit(GenerateParams params) override { return submit(std::move(params), SubmitOptions{}); }
  std::shared_ptr<Stream> submit(GenerateParams params, const SubmitOptions& so) override {
    GenerateParams text_params;
    text_params.stop = params.stop;
    text_params.stop_token_ids = params.stop_token_ids;
    text_params.ignore_eos = params.ignore_eos;
    // Structured outputs: compile (or find) the grammar here, on the HTTP worker thread.
    if (params.structured && !params.structured->compiled) params.structured = grammars_.prepare(*params.structured);
    std::shared_ptr<Stream> st = engine_.submit(std::move(params));
    attach_output_processor(*st, engine_.tokenizer_ptr(), text_params, eos_, so.include_stop_str, so.stop_info,
                            so.skip_special);
    return st;
  }
  std::vector<float> embed(const std::vector<int32_t>& ids, bool mean_pooling) override {
    PromptPassRequest r;
    r.ids = ids;
    r.hidden = true;
    r.mean = mean_pooling;
    return pass(std::move(r)).hidden;
  }
  PromptLogprobs prompt_logprobs(const std::vector<int32_t>& ids, int top) override {
    PromptPassRequest r;
    r.ids = ids;
    r.logprobs = std::max(top, 0);
    PromptPassResult res = pass(std::move(r));
    return {std::move(res.logprobs), std::move(res.ranks)};
  }
  EngineMetrics metrics() const override { return engine_.metrics(); }
  std::vector<int32_t> encode(const std::string& text, bool add_special) const override {
    return engine_.tokenizer().encode(text, add_special);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return engine_.tokenizer().decode(ids, skip_special);
  }
  std::string token_bytes(int32_t id) const override {
    std::string b = engine_.tokenizer().is_valid_id(id) ? engine_.tokenizer().token_bytes(id) : std::string();
    return b.empty() ? engine_.tokenizer().decode(std::vector<int32_t>{id}, false) : b;
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
  PromptPassResult pass(PromptPassRequest r) {
    PromptPassResult res = engine_.prompt_pass(std::move(r));
    if (!res.error.empty()) throw ApiError(res.error.find("retry") != std::string::npos ? 503 : 400, res.error);
    return res;
  }
  static EngineOptions with_events(EngineOptions o, const KvEventsConfig& events) {
    o.kv_events = events.active();
    return o;
  }
  Engine engine_;
  std::unique_ptr<KvEventPublisher> publisher_;  // null: events off
  std::vector<int32_t> eos_;
  GrammarCache grammars_;
  bool stopped_ = false;
};
}  // namespace

std::shared_ptr<Backend> make_engine_backend(const EngineOptions& opts, const KvEventsConfig& events,
                                             std::vector<std::string> grammar_markers) {
  return std::make_shared<EngineBackend>(opts, events, std::move(grammar_markers));
}

}  // namespace ts::server
