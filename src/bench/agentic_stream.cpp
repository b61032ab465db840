// Stream parsing, per-request and per-level metrics arithmetic, /metrics parsing.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "bench/agentic.h"
#include "bench/stats.h"
#include "core/error.h"

namespace ts::bench {

// ---- SSE ---------------------------------------------------------------------------------------
void SseParser::feed(std::string_view bytes, double t_ms) {
  for (char c : bytes) {
    if (c == '\n') {
      std::string_view l(line_);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      line(l, t_ms);
      line_.clear();
    } else {
      line_ += c;
    }
  }
}

void SseParser::finish(double t_ms) {
  if (!line_.empty()) {
    std::string l = std::move(line_);
    line_.clear();
    if (!l.empty() && l.back() == '\r') l.pop_back();
    line(l, t_ms);
  }
  line("", t_ms);  // dispatch a pending event
}

void SseParser::line(std::string_view l, double t_ms) {
  if (l.empty()) {  // event boundary
    if (has_data_) {
      std::string d = std::move(data_);
      data_.clear();
      has_data_ = false;
      h_(d, t_ms);
    }
    return;
  }
  if (l[0] == ':') return;  // comment / keep-alive
  size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = l.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

// ---- one payload -------------------------------------------------------------------------------
namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
std::string str_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::optional<int64_t> int_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<int64_t>();
}
}  // namespace

bool apply_stream_payload(RequestRecord& r, std::string_view payload, double t_ms) {
  payload = trim(payload);
  if (payload == "[DONE]") return false;
  if (payload.empty()) return true;
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (r.error.empty()) r.error = "malformed stream chunk: " + std::string(payload.substr(0, 200));
    return true;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    std::string msg = e->is_object() ? str_field(*e, "message") : (e->is_string() ? e->get<std::string>() : "");
    r.error = "server error in stream: " + (msg.empty() ? e->dump() : msg);
    return true;
  }
  int64_t chunk_usage = -1;
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto v = int_field(*u, "prompt_tokens")) r.prompt_tokens = v;
    if (auto v = int_field(*u, "completion_tokens")) {
      r.completion_tokens = v;
      chunk_usage = *v;
    }
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
      if (auto v = int_field(*d, "cached_tokens")) r.cached_tokens = v;
  }
  auto ch = j.find("choices");
  if (ch == j.end() || !ch->is_array() || ch->empty()) return true;
  const nlohmann::json& c = (*ch)[0];
  if (!c.is_object()) return true;
  std::string content, reasoning;
  if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
    content = str_field(*d, "content");
    reasoning = str_field(*d, "reasoning_content");
    if (reasoning.empty()) reasoning = str_field(*d, "reasoning");
  } else {
    content = str_field(c, "text");
  }
  if (std::string f = str_field(c, "finish_reason"); !f.empty()) r.finish_reason = f;
  if (!content.empty() || !reasoning.empty()) {
    r.chunk_ms.push_back(t_ms);
    r.chunk_usage.push_back(chunk_usage);
    r.text += content;
  }
  return true;
}

// ---- per request -------------------------------------------------------------------------------
std::optional<double> RequestRecord::ttft_ms() const {
  if (chunk_ms.empty()) return std::nullopt;
  return chunk_ms.front() - t_start_ms;
}

std::vector<double> RequestRecord::chunk_tokens() const {
  size_t n = chunk_ms.size();
  std::vector<double> t(n, 1.0);
  if (n == 0) return t;
  bool per_chunk = std::all_of(chunk_usage.begin(), chunk_usage.end(), [](int64_t u) { return u >= 0; });
  if (per_chunk && chunk_usage.size() == n) {
    int64_t prev = 0;
    for (size_t i = 0; i < n; ++i) {
      t[i] = double(std::max<int64_t>(0, chunk_usage[i] - prev));
      prev = std::max(prev, chunk_usage[i]);
    }
  } else if (completion_tokens) {
    double total = double(*completion_tokens);
    if (n == 1) {
      t[0] = total;
    } else {
      t[0] = std::min(1.0, total);
      double rest = std::max(0.0, total - t[0]) / double(n - 1);
      for (size_t i = 1; i < n; ++i) t[i] = rest;
    }
  }
  return t;
}

int64_t RequestRecord::output_tokens() const {
  if (completion_tokens) return *completion_tokens;
  double s = 0;
  for (double v : chunk_tokens()) s += v;
  return int64_t(std::llround(s));
}

double RequestRecord::decode_ms() const {
  return chunk_ms.size() < 2 ? 0.0 : chunk_ms.back() - chunk_ms.front();
}

double RequestRecord::decode_tokens() const {
  if (chunk_ms.size() < 2) return 0.0;
  auto t = chunk_tokens();
  double s = 0;
  for (size_t i = 1; i < t.size(); ++i) s += t[i];
  return s;
}

// ---- per level ---------------------------------------------------------------------------------
LevelResult compute_level(const std::vector<RequestRecord>& recs, int concurrency, int conversations, int num_gpus,
                          double window_start_ms, double window_end_ms) {
  LevelResult L;
  L.concurrency = concurrency;
  L.conversations = conversations;
  L.requests = int64_t(recs.size());
  if (window_start_ms == 0 && window_end_ms == 0 && !recs.empty()) {
    window_start_ms = recs.front().t_start_ms;
    window_end_ms = recs.front().t_end_ms;
    for (auto& r : recs) {
      window_start_ms = std::min(window_start_ms, r.t_start_ms);
      window_end_ms = std::max(window_end_ms, r.t_end_ms);
    }
  }
  L.duration_s = std::max(0.0, window_end_ms - window_start_ms) / 1000.0;

  std::vector<double> ttft_first, ttft_later, itl_samples, prompts;
  double decode_ms = 0, decode_tok = 0;
  int64_t cached = 0, prompt_all = 0, prompt_later = 0, cached_later = 0;
  bool any_cached = false;
  for (auto& r : recs) {
    if (!r.ok()) {
      ++L.errors;
      if (L.first_error.empty()) L.first_error = r.error;
      continue;
    }
    L.completion_tokens += r.output_tokens();
    if (r.prompt_tokens) {
      L.prompt_tokens += *r.prompt_tokens;
      prompts.push_back(double(*r.prompt_tokens));
      prompt_all += *r.prompt_tokens;
      if (r.turn > 0) prompt_later += *r.prompt_tokens;
      if (r.cached_tokens) {
        any_cached = true;
        cached += *r.cached_tokens;
        if (r.turn > 0) cached_later += *r.cached_tokens;
      }
    }
    if (auto t = r.ttft_ms()) (r.turn == 0 ? ttft_first : ttft_later).push_back(*t);
    decode_ms += r.decode_ms();
    decode_tok += r.decode_tokens();
    auto tok = r.chunk_tokens();
    for (size_t i = 1; i < r.chunk_ms.size(); ++i)
      if (tok[i] > 0) itl_samples.push_back((r.chunk_ms[i] - r.chunk_ms[i - 1]) / tok[i]);
  }
  if (decode_tok > 0 && decode_ms > 0) {
    L.itl_mean_ms = decode_ms / decode_tok;
    L.per_user_tps = 1000.0 / *L.itl_mean_ms;
  }
  L.itl_p50_ms = percentile(itl_samples, 50);
  L.itl_p99_ms = percentile(itl_samples, 99);
  L.ttft_first_p50_ms = percentile(ttft_first, 50);
  L.ttft_first_p99_ms = percentile(ttft_first, 99);
  L.ttft_later_p50_ms = percentile(ttft_later, 50);
  L.ttft_later_p99_ms = percentile(ttft_later, 99);
  if (L.duration_s > 0 && L.requests > L.errors) {
    L.output_tps = double(L.completion_tokens) / L.duration_s;
    L.per_gpu_tpm = *L.output_tps * 60.0 / std::max(1, num_gpus);
  }
  if (any_cached) {
    L.cached_tokens = cached;
    if (prompt_all > 0) L.cache_hit_rate = double(cached) / double(prompt_all);
    if (prompt_later > 0) L.cache_hit_rate_later = double(cached_later) / double(prompt_later);
  }
  L.mean_prompt_tokens = mean(prompts);
  return L;
}

// ---- Prometheus --------------------------------------------------------------------------------
std::map<std::string, double> parse_prometheus(std::string_view text) {
  std::map<std::string, double> m;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = trim(text.substr(pos, eol - pos));
    pos = eol + 1;
    if (l.empty() || l[0] == '#') continue;
    size_t i = 0;
    while (i < l.size() && l[i] != '{' && l[i] != ' ' && l[i] != '\t') ++i;
    std::string name(l.substr(0, i));
    if (name.empty()) continue;
    if (i < l.size() && l[i] == '{') {
      bool quoted = false;
      for (++i; i < l.size(); ++i) {
        if (quoted && l[i] == '\\') {
          ++i;
        } else if (l[i] == '"') {
          quoted = !quoted;
        } else if (!quoted && l[i] == '}') {
          ++i;
          break;
        }
      }
    }
    std::string_view rest = trim(l.substr(std::min(i, l.size())));
    size_t sp = rest.find_first_of(" \t");
    std::string v(rest.substr(0, sp));
    if (v.empty()) continue;
    char* end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size()) continue;
    m[name] += d;
  }
  return m;
}

std::optional<double> accept_length_between(const std::map<std::string, double>& before,
                                            const std::map<std::string, double>& after) {
  auto get = [](const std::map<std::string, double>& m, const std::string& k) -> std::optional<double> {
    auto it = m.find(k);
    if (it == m.end() || !std::isfinite(it->second)) return std::nullopt;
    return it->second;
  };
  struct Pair {
    const char *tokens, *steps;
    double bonus;
  };
  static const Pair pairs[] = {
      {"tokenspeed_spec_accepted_tokens_total", "tokenspeed_spec_verify_steps_total", 0},
      {"tokenspeed_spec_decode_accepted_tokens_total", "tokenspeed_spec_decode_verify_steps_total", 0},
      {"vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total", 1},
  };
  bool counters_seen = false;
  for (auto& p : pairs) {
    auto ta = get(after, p.tokens), sa = get(after, p.steps);
    if (!ta || !sa) continue;
    counters_seen = true;
    double dt = *ta - get(before, p.tokens).value_or(0), ds = *sa - get(before, p.steps).value_or(0);
    if (ds > 0) return dt / ds + p.bonus;
  }
  if (counters_seen) return std::nullopt;  // speculative decoding on, but nothing verified here
  for (const char* g : {"tokenspeed_spec_accept_length", "tokenspeed_spec_decode_accepted_length",
                        "sglang:spec_accept_length"})
    if (auto v = get(after, g); v && *v > 0) return v;
  return std::nullopt;
}

}  // namespace ts::bench

namespace ts::bench {
void tier_stats_between(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                        LevelResult& L) {
  auto delta = [&](const char* k) -> std::optional<double> {
    auto a = after.find(k);
    if (a == after.end() || !std::isfinite(a->second)) return std::nullopt;
    auto b = before.find(k);
    return a->second - (b == before.end() ? 0.0 : b->second);
  };
  const double prompt = double(L.prompt_tokens);
  if (auto d = delta("tokenspeed_prefix_cache_device_hit_tokens_total"); d && prompt > 0) L.device_hit_rate = *d / prompt;
  if (auto h = delta("tokenspeed_prefix_cache_host_hit_tokens_total"); h && prompt > 0) L.host_hit_rate = *h / prompt;
  if (auto g = delta("tokenspeed_kvstore_loaded_bytes_total")) L.host_loaded_gb = *g / 1e9;
}
}  // namespace ts::bench
