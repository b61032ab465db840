// The agentic benchmark: multi-turn, long-context conversation replay against any
// OpenAI-compatible endpoint (ours, vLLM, SGLang), measuring per-user speed (tokens/s one user
// sees while decoding) against per-GPU throughput (tokens/min) at several concurrency levels.
//
// Definitions (also in README / --help):
//  - Times are client-side: a request starts when its body is handed to the socket, a chunk
//    arrives when its `data:` line has been read.
//  - A chunk "carries tokens" when it has non-empty text (completions `choices[0].text`, chat
//    `delta.content` or `delta.reasoning_content`).
//  - Tokens per chunk: when every token-carrying chunk has `usage` (per-chunk usage, e.g. vLLM's
//    continuous_usage_stats), a chunk's tokens are the increase of usage.completion_tokens.
//    Otherwise the first chunk is taken to carry 1 token (the one sampled by prefill) and the
//    remaining completion_tokens of the final usage are spread evenly over the later chunks
//    (so multi-token chunks from speculative decoding are counted right); with no usage at all,
//    1 token per chunk.
//  - ITL (inter-token latency) of a request: (t_last_chunk - t_first_chunk) / decode_tokens,
//    decode_tokens = completion tokens after the first chunk. A level's mean ITL is token
//    weighted: sum of decode times / sum of decode tokens over its requests (= the mean over every
//    inter-token gap). Per-user TPS = 1000 / mean ITL in ms.
//  - Per-GPU TPM = completion tokens of the level's successful requests / the level's window
//    (first request sent -> last response done) x 60 / num_gpus.
//  - TTFT = first token-carrying chunk - request start; p50/p99 by linear interpolation (stats.h),
//    separately for first turns and later turns.
//  - Cache hit rate = sum usage.prompt_tokens_details.cached_tokens / sum usage.prompt_tokens
//    (null when the server reports no cached_tokens).
//  - Accept length (speculative decoding) from GET /metrics before/after each level: the delta of
//    accepted tokens / delta of verify steps, or the accept-length gauge; null when absent.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ts::bench {

enum class Api { completions, chat };

struct AgenticConfig {
  std::string base_url;          // http://host:port[/prefix][/v1]
  std::string model;             // empty: first id from GET /v1/models
  std::string out_dir;
  Api api = Api::completions;
  std::string api_key;           // Authorization: Bearer (empty: none)
  int conversations = 0;         // per level; 0 = 2 x the level's concurrency
  std::vector<int> concurrency{1, 2, 4, 8, 16, 32};
  int64_t first_turn_tokens = 50000;
  int64_t turn_tokens = 800;
  int turns_min = 10, turns_max = 15;
  int64_t max_tokens = 500;
  bool ignore_eos = false;
  int warmup = 2;                // conversations run and discarded before the first level
  uint64_t seed = 0;
  int num_gpus = 1;
  std::string tokenizer_dir;     // optional: identifier pool from tokenizer.json
  double timeout_s = 600;        // read timeout per request (no byte for this long -> error)
  int64_t context_length = 0;    // used when /v1/models has no max_model_len; 0 = unknown
  double chars_per_token = 0;    // 0 = calibrate against the server
  bool progress = true;          // progress bar on stderr
};

nlohmann::json config_to_json(const AgenticConfig& c);

// "1,2,4" -> {1,2,4}; "12" -> {12,12}; "10-15" -> {10,15}. Throw ts::Error on bad input.
std::vector<int> parse_int_list(const std::string& s);
std::pair<int, int> parse_range(const std::string& s);

// ---- one streamed request -------------------------------------------------------------------
struct RequestRecord {
  int conversation = 0, turn = 0;  // turn 0 = the first turn
  double t_start_ms = 0, t_end_ms = 0;
  std::vector<double> chunk_ms;       // arrival of each token-carrying chunk
  std::vector<int64_t> chunk_usage;   // usage.completion_tokens on that chunk, -1 if absent
  std::optional<int64_t> prompt_tokens, completion_tokens, cached_tokens;
  std::string text;                   // the assistant text (appended to the history)
  std::string finish_reason;
  std::string error;                  // non-empty: the request failed
  bool ok() const { return error.empty(); }
  std::optional<double> ttft_ms() const;
  // Tokens of each token-carrying chunk, by the rules above.
  std::vector<double> chunk_tokens() const;
  int64_t output_tokens() const;      // completion_tokens, else sum of chunk_tokens
  double decode_ms() const;           // last chunk - first chunk (0 with < 2 chunks)
  double decode_tokens() const;       // output tokens after the first chunk
};

// Incremental SSE reader: feed raw bytes as they arrive with their arrival time; it calls back
// once per complete `data:` payload (multi-line data joined by '\n'; comments and other fields
// ignored; "\r\n" accepted).
class SseParser {
 public:
  using Handler = std::function<void(std::string_view payload, double t_ms)>;
  explicit SseParser(Handler h) : h_(std::move(h)) {}
  void feed(std::string_view bytes, double t_ms);
  void finish(double t_ms);  // flushes an unterminated last event

 private:
  Handler h_;
  std::string line_, data_;
  bool has_data_ = false;
  void line(std::string_view l, double t_ms);
};

// Applies one `data:` payload of a completions or chat stream to a record. Returns false for
// "[DONE]" (the stream is over).
bool apply_stream_payload(RequestRecord& r, std::string_view payload, double t_ms);

// ---- one concurrency level ------------------------------------------------------------------
struct LevelResult {
  int concurrency = 0;
  int conversations = 0;
  int64_t requests = 0, errors = 0, truncated_conversations = 0;
  double duration_s = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::optional<int64_t> cached_tokens;
  std::optional<double> per_user_tps, per_gpu_tpm, output_tps;
  std::optional<double> itl_mean_ms, itl_p50_ms, itl_p99_ms;
  std::optional<double> ttft_first_p50_ms, ttft_first_p99_ms, ttft_later_p50_ms, ttft_later_p99_ms;
  std::optional<double> cache_hit_rate, cache_hit_rate_later;
  std::optional<double> accept_length;
  // KV tiers, from GET /metrics deltas (ours; null elsewhere): prompt tokens found in the device
  // tier / in the host tier (loaded back) per level prompt token, and GB loaded from the host.
  std::optional<double> device_hit_rate, host_hit_rate, host_loaded_gb;
  std::optional<double> mean_prompt_tokens;
  std::string first_error;
};

// Turns the records of one level into its result. window_ms = [start, end] of the level; when
// both are 0 they are taken from the records.
LevelResult compute_level(const std::vector<RequestRecord>& recs, int concurrency, int conversations,
                          int num_gpus, double window_start_ms = 0, double window_end_ms = 0);

// ---- /metrics (Prometheus text) --------------------------------------------------------------
// name -> value, summed over label sets. Comments and malformed lines are skipped.
std::map<std::string, double> parse_prometheus(std::string_view text);
// Mean accepted length between two scrapes; recognizes ours (tokenspeed_spec_accept_length,
// tokenspeed_spec_[decode_]accepted_tokens_total / ..._verify_steps_total), vLLM
// (vllm:spec_decode_num_accepted_tokens_total / num_drafts_total, +1 bonus) and SGLang
// (sglang:spec_accept_length). nullopt when none is present or nothing was verified.
std::optional<double> accept_length_between(const std::map<std::string, double>& before,
                                            const std::map<std::string, double>& after);

// Fills L.device_hit_rate / host_hit_rate / host_loaded_gb from two scrapes of ours
// (tokenspeed_prefix_cache_{device,host}_hit_tokens_total over L.prompt_tokens,
// tokenspeed_kvstore_loaded_bytes_total); leaves them null when the counters are absent.
void tier_stats_between(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                        LevelResult& L);

// ---- synthetic code text ----------------------------------------------------------------------
struct Rng {  // splitmix64: the same sequence on every platform / standard library
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  bool chance(int percent) { return below(100) < uint64_t(percent); }
};
uint64_t mix_seed(uint64_t a, uint64_t b);

class CodeTextGen {
 public:
  explicit CodeTextGen(std::vector<std::string> ident_pool = {});  // empty: built-in word list
  // Python-like code of at least `chars` characters (cut at a line end), deterministic in rng.
  std::string code(Rng& rng, size_t chars) const;
  // A user turn: an instruction line then code of about `chars` characters.
  std::string user_turn(Rng& rng, size_t chars, bool first) const;
  const std::vector<std::string>& words() const { return words_; }

 private:
  std::vector<std::string> words_;
  std::string ident(Rng& rng) const;
  std::string class_name(Rng& rng) const;
  std::string expr(Rng& rng, int depth = 0) const;
};

// ASCII identifier-like tokens (3..12 lowercase letters, byte-level 'Ġ' / sentencepiece '▁'
// prefixes stripped) from DIR/tokenizer.json's model.vocab, sorted and de-duplicated.
std::vector<std::string> identifier_pool_from_tokenizer(const std::string& dir);

// ---- the run ---------------------------------------------------------------------------------
struct AgenticRun {
  AgenticConfig config;           // as run (model resolved, first_turn_tokens clipped)
  int64_t context_length = 0;     // 0 = unknown
  double chars_per_token = 0;
  std::vector<LevelResult> levels;
  std::vector<std::string> warnings;
};

// Runs the whole benchmark (calibration, warmup, every level) and returns the results; writes
// nothing. Throws ts::Error when the endpoint cannot be reached or the model cannot be resolved.
AgenticRun run_agentic(const AgenticConfig& cfg);

// ---- output ------------------------------------------------------------------------------------
nlohmann::json results_json(const AgenticRun& run);
std::string results_csv(const AgenticRun& run);
std::string pareto_svg(const AgenticRun& run);
std::string results_table(const AgenticRun& run);
// Writes results.json, results.csv and pareto.svg into dir (created if needed).
void write_outputs(const AgenticRun& run, const std::string& dir);

}  // namespace ts::bench
