#include "runtime/structured.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <thread>

#include "grammar/ir.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace ts {

// --- the mask threads ----------------------------------------------------------------------
namespace {
class MaskPool {
 public:
  MaskPool() {
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~MaskPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> job, bool urgent) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (urgent) q_.push_front(std::move(job));
      else q_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        job = std::move(q_.front());
        q_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};
}  // namespace

void mask_pool_run(std::function<void()> job, bool urgent) {
  static MaskPool pool;
  pool.run(std::move(job), urgent);
}

// A matcher step past the grammar's per-step bound (grammar::Stepper: a grammar too ambiguous at
// this state) throws; for the request that is a refusal (the output cannot go on), never a
// failed engine step or a mask thread's uncaught exception.
namespace {
bool accepts(grammar::Matcher& m, int32_t t) {
  try {
    return m.accept_token(t);
  } catch (const Error&) {
    return false;
  }
}
bool accepts(grammar::Matcher& m, std::string_view bytes) {
  try {
    return m.accept_bytes(bytes);
  } catch (const Error&) {
    return false;
  }
}
}  // namespace

std::vector<int32_t> forced_tokens(const tok::Tokenizer& tok, const grammar::Vocab& vocab, std::string_view bytes) {
  // A marker written as its special token (grammar::special_token_bytes) is that one id; forced
  // text runs up to the next such marker (the tokenizer takes text, not sentinels).
  if (!bytes.empty() && bytes[0] == grammar::kSpecialTokenByte) {
    for (int32_t id : vocab.marker_ids())
      if (bytes.starts_with(vocab.bytes(id))) return {id};
    return {};
  }
  bytes = bytes.substr(0, bytes.find(grammar::kSpecialTokenByte));
  // Whole UTF-8 characters only: a forced run may stop inside one (enum values that share a
  // lead byte), and the tokenizer takes text.
  size_t end = bytes.size(), k = end;
  while (k > 0 && end - k < 4 && (uint8_t(bytes[k - 1]) & 0xC0) == 0x80) --k;  // continuation bytes
  if (k > 0) {
    const uint8_t lead = uint8_t(bytes[k - 1]);
    const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
    if (k - 1 + len > end) end = k - 1;  // the last character is cut: leave it to the sampler
  }
  if (end == 0) return {};
  std::vector<int32_t> ids = tok.encode(bytes.substr(0, end), false);
  // Keep the last token back when a longer token starts with its bytes: the bytes after the run
  // are the sampler's, and they may belong to that longer token (`"ap` + `ple"` -> `"apple"`).
  // Byte-level BPE never merges across a pre-tokenizer split (the GPT-2 / Llama-3 / Qwen splits
  // cut at every change between letters, digits, spaces and punctuation), so the following bytes
  // can only re-tokenize the run's last piece, and in the runs a grammar forces (JSON punctuation
  // and key names, both closed by the next split) that piece's earlier tokens stay as they are
  // when its last token cannot grow. Whatever happens, every token still passes the matcher:
  // this rule is about staying close to the model's own tokenization, not about validity.
  if (!ids.empty() && vocab.extendable(ids.back())) ids.pop_back();
  return ids;
}

// --- GrammarCache ----------------------------------------------------------------------------
GrammarCache::GrammarCache(std::shared_ptr<const tok::Tokenizer> tok, std::vector<int32_t> stop_ids, size_t capacity,
                           std::vector<std::string> special_texts)
    : tok_(std::move(tok)),
      stop_ids_(std::move(stop_ids)),
      capacity_(std::max<size_t>(capacity, 1)),
      special_texts_(std::move(special_texts)) {}
GrammarCache::~GrammarCache() = default;

std::shared_ptr<const grammar::Vocab> GrammarCache::vocab() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!vocab_) vocab_ = grammar::Vocab::from_tokenizer(*tok_, stop_ids_, special_texts_);
  return vocab_;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

std::shared_ptr<const StructuredRequest> GrammarCache::prepare(const StructuredRequest& req) {
  auto out = std::make_shared<StructuredRequest>(req);
  if (!out->compiled) {
    TS_CHECK(out->ir != nullptr, "GrammarCache::prepare: no grammar");
    auto v = vocab();
    std::shared_ptr<const grammar::CompiledGrammar> cg;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (auto it = map_.find(req.key); it != map_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        cg = it->second.first;
      }
    }
    if (!cg) {
      // Compiled outside the lock (0.1-5 ms); two racing requests for a new key both compile
      // and the second insert wins, which is harmless.
      try {
        cg = std::make_shared<const grammar::CompiledGrammar>(*out->ir, v);
      } catch (const InvalidRequest& e) {  // found while lowering (left recursion): name the field
        if (out->field.empty()) throw;
        throw InvalidRequest(fmt::format("Invalid {} in '{}': {}", out->kind, out->field, e.what()), out->field);
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (auto it = map_.find(req.key); it != map_.end()) {
        lru_.erase(it->second.second);
        map_.erase(it);
      }
      lru_.push_front(req.key);
      map_[req.key] = {cg, lru_.begin()};
      while (map_.size() > capacity_) {
        map_.erase(lru_.back());
        lru_.pop_back();
      }
    }
    out->compiled = std::move(cg);
  }
  out->tokenizer = tok_;
  if (out->reasoning != StructuredRequest::Reasoning::none) {
    auto s = tok_->token_to_id("<think>"), e = tok_->token_to_id("</think>");
    if (s && e) {
      out->think_start = *s;
      out->think_end = *e;
    } else {
      out->reasoning = StructuredRequest::Reasoning::none;  // no single-token tags: grammar from the start
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> bad_word_ids(const tok::Tokenizer& t, const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    const size_t b = word.find_first_not_of(" \t\n\r");
    const std::string w = b == std::string::npos ? std::string() : word.substr(b);
    std::vector<int32_t> plain = w.empty() ? std::vector<int32_t>() : t.encode(w, false);
    if (plain.empty()) throw InvalidRequest(fmt::format("'bad_words' entry '{}' has no tokens", word), "bad_words");
    std::vector<int32_t> spaced = t.encode(" " + w, false);
    // (vLLM keeps the spaced run only when it is as long as the plain one, so banning
    // "polynomials" there misses " polynomials" when the two split differently; a banned word
    // is banned after a space too here.)
    const bool other = !spaced.empty() && spaced != plain;
    out.push_back(std::move(plain));
    if (other) out.push_back(std::move(spaced));
  }
  return out;
}

// --- LogitsConstraints -----------------------------------------------------------------------
bool has_constraints(const GenerateParams& p) {
  return (p.structured && p.structured->compiled) || !p.logit_bias.empty() || p.min_tokens > 0;
}

std::shared_ptr<LogitsConstraints> LogitsConstraints::make(const GenerateParams& p, const std::vector<int32_t>& stop_ids,
                                                           std::vector<std::vector<int32_t>> bad_words) {
  if (!has_constraints(p) && bad_words.empty()) return nullptr;
  return std::make_shared<LogitsConstraints>(p, stop_ids, std::move(bad_words));
}

LogitsConstraints::LogitsConstraints(const GenerateParams& p, const std::vector<int32_t>& stop_ids,
                                     std::vector<std::vector<int32_t>> bad_words)
    : bias_(p.logit_bias), min_tokens_(p.min_tokens) {
  for (auto& w : bad_words) {
    if (w.size() == 1) bias_.emplace_back(w[0], -INFINITY);  // banned everywhere: a bias (device paths too)
    else if (w.size() > 1) bad_seqs_.push_back(std::move(w));
  }
  if (min_tokens_ > 0) {
    min_stop_ = stop_ids;
    min_stop_.insert(min_stop_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  if (p.structured && p.structured->compiled) {
    compiled_ = p.structured->compiled;
    matcher_ = std::make_unique<grammar::Matcher>(compiled_);
    think_start_ = p.structured->think_start;
    think_end_ = p.structured->think_end;
    trigger_ = p.structured->trigger;
    trigger_repeat_ = p.structured->trigger_repeat;
    trigger_at_start_ = p.structured->trigger_at_start;
    trigger_in_grammar_ = p.structured->trigger_in_grammar;
    switch (p.structured->reasoning) {
      case StructuredRequest::Reasoning::qwen3: phase_ = Phase::first_optional_think; break;
      case StructuredRequest::Reasoning::deepseek_r1: phase_ = Phase::reasoning; break;
      default: phase_ = trigger_.empty() ? Phase::active : Phase::free;
    }
    mask_.assign(size_t(matcher_->grammar().vocab().mask_words()), 0);
    has_grammar_ = true;
    tok_ = p.structured->tokenizer;
    jump_ = p.jump_forward && tok_ && p.logprobs < 0;
    max_tokens_ = p.max_tokens;
    start_mask(false);
  }
}

LogitsConstraints::~LogitsConstraints() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !pending_; });
}

bool LogitsConstraints::grammar_applies() const {
  if (!matcher_ || failed_ || matcher_->is_terminated()) return false;
  // qwen3's optional <think> opens the grammar itself, or free text when it is triggered.
  return phase_ == Phase::active || (phase_ == Phase::first_optional_think && trigger_.empty());
}

void LogitsConstraints::start_mask(bool counted) {
  const bool applies = grammar_applies();
  // Forced runs only inside the grammar proper (not the optional <think> position).
  const bool jump = applies && jump_ && phase_ == Phase::active;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (counted) ++accepted_;
    applies_ = applies;
    mask_valid_ = false;
    pending_ = applies;
    forced_.clear();
    forced_ready_ = !jump;
  }
  cv_.notify_all();
  if (!applies) return;
  if (jump) {
    mask_pool_run(
        [this] {
          compute_forced();
          mask_pool_run([this] { compute_mask(); });
        },
        true);
  } else {
    mask_pool_run([this] { compute_mask(); });
  }
}

void LogitsConstraints::compute_forced() {
  std::vector<int32_t> ids;
  int64_t budget;
  {
    std::lock_guard<std::mutex> lk(mu_);
    budget = max_tokens_ - accepted_ - 1;  // one token is left to sample after the run
  }
  std::string bytes;
  try {
    if (budget > 0) bytes = matcher_->jump_forward();
  } catch (const Error&) {  // too ambiguous here: no forced run (the mask ends the output)
  }
  if (!bytes.empty()) {
    ids = forced_tokens(*tok_, compiled_->vocab(), bytes);
    if (int64_t(ids.size()) > budget) ids.resize(size_t(budget));
    // Accepted as advance() accepts sampled tokens, except that a token the grammar refuses
    // (a tokenizer that normalizes, an added token) ends the run before it instead of failing.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!accepts(*matcher_, ids[i])) {
        ids.resize(i);
        break;
      }
      // A triggered match whose end tag was forced: free text again (as in advance()).
      if (!trigger_.empty() && trigger_repeat_ && matcher_->can_terminate()) {
        enter_free_text();
        matcher_ = std::make_unique<grammar::Matcher>(compiled_);
        ids.resize(i + 1);
        break;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    forced_ = std::move(ids);
    accepted_ += int64_t(forced_.size());
    applies_ = grammar_applies();
    forced_ready_ = true;
  }
  cv_.notify_all();
}

void LogitsConstraints::fill_mask(uint32_t* row) {
  try {
    matcher_->fill_bitmask(row);
  } catch (const Error&) {
    // The grammar is too ambiguous at this state to step through (grammar::Stepper's bound):
    // only a stop id may follow, so the output ends here instead of leaving the grammar.
    std::fill(row, row + mask_.size(), 0u);
    for (int32_t id : compiled_->vocab().stop_ids()) row[size_t(id) >> 5] |= 1u << (id & 31);
    return;
  }
  if (phase_ == Phase::first_optional_think && think_start_ >= 0 && think_start_ < int32_t(mask_.size() * 32))
    row[size_t(think_start_ >> 5)] |= 1u << (think_start_ & 31);
}

void LogitsConstraints::compute_mask() {
  bool applies;
  {
    std::lock_guard<std::mutex> lk(mu_);
    applies = applies_;
  }
  if (applies) fill_mask(mask_.data());
  std::lock_guard<std::mutex> lk(mu_);
  mask_valid_ = applies;
  pending_ = false;
  cv_.notify_all();
}

const uint32_t* LogitsConstraints::wait_mask() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !pending_; });
  // A finished grammar allows nothing: its request is done, its row is left alone.
  return applies_ && mask_valid_ ? mask_.data() : nullptr;
}

int64_t LogitsConstraints::accepted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return accepted_;
}

bool LogitsConstraints::mask_after(int64_t after, uint32_t* row, int64_t words) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return closed_ || (accepted_ >= after && !pending_); });
  if (closed_ || !applies_ || !mask_valid_) return false;
  const int64_t n = std::min<int64_t>(words, int64_t(mask_.size()));
  std::copy(mask_.begin(), mask_.begin() + n, row);
  std::fill(row + n, row + words, 0u);  // ids past the tokenizer's vocabulary (a padded embedding)
  return true;
}

void LogitsConstraints::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void LogitsConstraints::take_forced(std::vector<int32_t>& out) {
  out.clear();
  if (!jump_) return;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return forced_ready_ || closed_; });
  out.swap(forced_);
  forced_.clear();
}

bool LogitsConstraints::forced_ready() {
  std::lock_guard<std::mutex> lk(mu_);
  return forced_ready_;
}

void LogitsConstraints::apply_bad_sequences(float* l, int64_t vocab, const int32_t* out, size_t n) const {
  for (const auto& w : bad_seqs_) {
    const size_t k = w.size() - 1;  // the tokens that must end the output
    if (k > n || !std::equal(w.begin(), w.begin() + long(k), out + (n - k))) continue;
    if (w.back() >= 0 && w.back() < vocab) l[w.back()] = -INFINITY;
  }
}

void LogitsConstraints::apply(float* l, int64_t vocab, int n_generated) {
  apply_with(l, vocab, n_generated, nullptr);
}

void LogitsConstraints::apply_with(float* l, int64_t vocab, int n_generated, const uint32_t* m) {
  for (auto& [id, b] : bias_)
    if (id >= 0 && id < vocab) l[id] += b;
  const bool ban_stop = n_generated < min_tokens_;
  thread_local std::vector<std::pair<int32_t, float>> saved;
  saved.clear();
  if (ban_stop)
    for (int32_t id : min_stop_)
      if (id >= 0 && id < vocab && l[id] != -INFINITY) {
        saved.emplace_back(id, l[id]);
        l[id] = -INFINITY;
      }
  if (!spec_ || spec_steps_ == 0) m = wait_mask();
  if (!m) return;
  const int64_t covered = std::min<int64_t>(vocab, int64_t(mask_.size()) * 32);
  bool any = false;
  for (int64_t i = 0; i < covered; ++i) {
    if (!((m[i >> 5] >> (i & 31)) & 1u)) l[i] = -INFINITY;
    else any = any || l[i] != -INFINITY;
  }
  // Ids past the tokenizer's vocabulary (a padded embedding) are never grammar tokens.
  for (int64_t i = covered; i < vocab; ++i) l[i] = -INFINITY;
  if (!any) {
    // The grammar can only end here but min_tokens banned the stop ids: the grammar wins.
    for (auto& [id, v] : saved)
      if (id < covered && ((m[id >> 5] >> (id & 31)) & 1u)) l[id] = v, any = true;
    if (!any)  // nothing the grammar allows has a finite logit (a bias of -inf): allow its set uniformly
      for (int64_t i = 0; i < covered; ++i)
        if ((m[i >> 5] >> (i & 31)) & 1u) l[i] = 0.0f;
  }
}

void LogitsConstraints::accept(int32_t t) {
  // The job of the previous state first: until it is done the matcher (and the phase) are its.
  if (has_grammar_) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !pending_; });
  }
  if (!has_grammar_ || failed_) {
    std::lock_guard<std::mutex> lk(mu_);
    ++accepted_;
    applies_ = false;
    return;
  }
  advance(t);
  done_ = matcher_->is_terminated();
  start_mask(true);
}

void LogitsConstraints::enter_free_text() {
  phase_ = trigger_.empty() ? Phase::active : Phase::free;
  tail_.clear();
  trigger_dead_ = false;
}

void LogitsConstraints::free_text(int32_t t) {
  const grammar::Vocab& v = compiled_->vocab();
  if (t < 0 || t >= v.size()) return;
  if (trigger_at_start_) {
    if (trigger_dead_) return;
    tail_ += v.text(t);
    const size_t b = tail_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return;  // only whitespace so far
    const std::string_view head = std::string_view(tail_).substr(b);
    if (head.size() < trigger_.size()) {  // a possible start of the trigger: wait
      if (std::string_view(trigger_).substr(0, head.size()) != head) trigger_dead_ = true;
      return;
    }
    if (!head.starts_with(trigger_)) {
      trigger_dead_ = true;
      return;
    }
    const std::string first(trigger_in_grammar_ ? head : head.substr(trigger_.size()));
    tail_.clear();
    trigger_dead_ = true;  // one match per output, whatever the grammar says of its first bytes
    if (!first.empty()) {
      if (!accepts(*matcher_, std::string_view(first))) return;  // rejected: the text stays free
      if (spec_) ++matcher_steps_;
    }
    phase_ = Phase::active;
    return;
  }
  tail_ += v.text(t);  // specials too: a trigger may be one special token
  const size_t at = tail_.find(trigger_);
  if (at == std::string::npos) {
    if (tail_.size() >= trigger_.size()) tail_.erase(0, tail_.size() - (trigger_.size() - 1));
    return;
  }
  // The token may run past the trigger ("<tool_call" + ">\n"): the rest is the grammar's first
  // bytes. A rest the grammar rejects leaves the text free (the parser then sees no valid call).
  const std::string rest = tail_.substr(at + trigger_.size());
  tail_.clear();
  if (!rest.empty()) {
    if (!accepts(*matcher_, std::string_view(rest))) return;
    if (spec_) ++matcher_steps_;
  }
  phase_ = Phase::active;
}

bool LogitsConstraints::advance(int32_t t) {
  switch (phase_) {
    case Phase::reasoning:
      if (t == think_end_) enter_free_text();
      return true;
    case Phase::free:
      free_text(t);
      return true;
    case Phase::first_optional_think:
      if (t == think_start_) {
        phase_ = Phase::reasoning;
        return true;
      }
      enter_free_text();
      if (phase_ == Phase::free) {
        free_text(t);
        return true;
      }
      [[fallthrough]];
    case Phase::active:
      if (!accepts(*matcher_, t)) {
        failed_ = true;
        return false;
      }
      if (spec_) ++matcher_steps_;
      // A triggered match ends with its end tag (can_terminate: nothing else may follow).
      if (!trigger_.empty() && trigger_repeat_ && !matcher_->is_terminated() && matcher_->can_terminate()) {
        enter_free_text();
        if (spec_) return false;  // the fresh matcher is accept()'s to make
        matcher_ = std::make_unique<grammar::Matcher>(compiled_);
      }
      return true;
  }
  return true;
}

void LogitsConstraints::spec_begin() {
  spec_ = true;
  spec_steps_ = matcher_steps_ = 0;
  spec_phase_ = phase_;
  spec_failed_ = failed_;
  spec_tail_ = tail_;
  spec_trigger_dead_ = trigger_dead_;
  if (!matcher_) return;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !pending_; });  // the background mask of the current state is done
}

void LogitsConstraints::spec_apply(float* l, int64_t vocab, int n_generated) {
  const uint32_t* m = nullptr;
  if (spec_steps_ > 0 && grammar_applies()) {
    spec_mask_.resize(mask_.size());
    fill_mask(spec_mask_.data());
    m = spec_mask_.data();
  }
  apply_with(l, vocab, n_generated, m);
}

bool LogitsConstraints::spec_advance(int32_t t) {
  ++spec_steps_;
  if (!matcher_ || failed_) return !failed_;
  return advance(t);
}

void LogitsConstraints::spec_end() {
  if (matcher_ && matcher_steps_ > 0) matcher_->rollback(matcher_steps_);
  phase_ = spec_phase_;
  failed_ = spec_failed_;
  tail_ = std::move(spec_tail_);
  trigger_dead_ = spec_trigger_dead_;
  spec_ = false;
  spec_steps_ = matcher_steps_ = 0;
}

}  // namespace ts
