#include "server/output_processor.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace ts::server {

OutputProcessor::OutputProcessor(std::shared_ptr<const tok::Tokenizer> tok, OutputOptions opts)
    : tok_(std::move(tok)), detok_(std::make_unique<tok::StreamDecoder>(*tok_, opts.skip_special)), opts_(std::move(opts)) {
  for (auto& s : opts_.stop)
    if (!s.empty()) hold_ = std::max(hold_, s.size() - 1);
}
OutputProcessor::~OutputProcessor() = default;
OutputProcessor::OutputProcessor(OutputProcessor&&) noexcept = default;
OutputProcessor& OutputProcessor::operator=(OutputProcessor&&) noexcept = default;

void OutputProcessor::feed_token(int32_t id, bool final_stop_id) {
  if (final_stop_id) return;
  text_ += detok_->push(id);
}

bool OutputProcessor::match_stop() {
  if (opts_.stop.empty()) return false;
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (auto& s : opts_.stop) {
    if (s.empty()) continue;
    // Only text not yet sent can start a match (sent text was checked with its hold-back).
    size_t from = emitted_ >= s.size() ? emitted_ - s.size() + 1 : 0;
    size_t pos = text_.find(s, from);
    if (pos < best) best = pos, which = &s;
  }
  if (!which) return false;
  stop_str_ = *which;
  text_.resize(opts_.include_stop_str ? best + which->size() : best);
  return true;
}

OutputProcessor::Delta OutputProcessor::take(bool final) {
  Delta d;
  size_t end = text_.size();
  if (!final && hold_ > 0) {
    end = end > hold_ ? end - hold_ : 0;
    while (end > emitted_ && end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;
  }
  if (end > emitted_) {
    d.text = text_.substr(emitted_, end - emitted_);
    emitted_ = end;
  }
  return d;
}

OutputProcessor::Delta OutputProcessor::feed(const StreamEvent& ev) {
  if (stopped()) return {};
  int counted = 0;
  const size_t n = ev.tokens.size();
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ev.tokens[i];
    bool final_stop_id = ev.finished && ev.reason == FinishReason::stop && i + 1 == n && opts_.stop_ids.count(id) &&
                         !opts_.keep_ids.count(id);
    feed_token(id, final_stop_id);
    ++counted;
    if (match_stop()) {
      Delta d = take(true);
      d.tokens = counted;
      return d;
    }
  }
  if (ev.finished) {
    text_ += detok_->flush();
    if (match_stop()) {
      Delta d = take(true);
      d.tokens = counted;
      return d;
    }
  }
  Delta d = take(ev.finished);
  d.tokens = counted;
  return d;
}

OutputOptions output_options(const GenerateParams& p, const std::vector<int32_t>& eos_ids) {
  OutputOptions o;
  o.stop = p.stop;
  if (!p.ignore_eos) o.stop_ids.insert(eos_ids.begin(), eos_ids.end());
  o.stop_ids.insert(p.stop_token_ids.begin(), p.stop_token_ids.end());
  return o;
}

void attach_output_processor(Stream& st, std::shared_ptr<const tok::Tokenizer> tok, const GenerateParams& p,
                             const std::vector<int32_t>& eos_ids) {
  attach_output_processor(st, std::move(tok), p, eos_ids, false, nullptr);
}

void attach_output_processor(Stream& st, std::shared_ptr<const tok::Tokenizer> tok, const GenerateParams& p,
                             const std::vector<int32_t>& eos_ids, bool include_stop_str,
                             std::shared_ptr<StopInfo> info, bool skip_special) {
  OutputOptions oo = output_options(p, eos_ids);
  oo.include_stop_str = include_stop_str;
  oo.skip_special = skip_special;
  if (include_stop_str) oo.keep_ids.insert(p.stop_token_ids.begin(), p.stop_token_ids.end());
  auto proc = std::make_shared<OutputProcessor>(std::move(tok), std::move(oo));
  auto counted = std::make_shared<int>(0);
  Stream* self = &st;  // the filter lives inside the Stream: a raw pointer, no cycle
  std::vector<int32_t> stop_ids = p.stop_token_ids;
  st.set_filter([proc, counted, self, info, stop_ids](StreamEvent& ev) {
    const bool was_stopped = proc->stopped();
    // The engine's final token is the stop id it stopped on (the OutputProcessor adds no text for it).
    if (info && ev.finished && ev.reason == FinishReason::stop && !was_stopped && !ev.tokens.empty() &&
        std::find(stop_ids.begin(), stop_ids.end(), ev.tokens.back()) != stop_ids.end())
      info->stop_token = ev.tokens.back();
    OutputProcessor::Delta d = proc->feed(ev);
    ev.text = std::move(d.text);
    if (was_stopped) d.tokens = 0;  // tokens the engine made after the match do not count
    if (size_t(d.tokens) < ev.tokens.size()) ev.tokens.resize(size_t(d.tokens));
    if (ev.logprobs.size() > ev.tokens.size()) ev.logprobs.resize(ev.tokens.size());
    *counted += d.tokens;
    if (proc->stopped()) {
      if (info && !was_stopped) {
        info->stop_str = proc->stop_str();
        info->stop_token = -1;
      }
      if (!was_stopped) self->request_stop();
      ev.completion_tokens = std::min(ev.completion_tokens, *counted);
      if (ev.finished && ev.reason == FinishReason::length) ev.reason = FinishReason::stop;
    }
  });
}

}  // namespace ts::server
