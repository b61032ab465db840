// `tokenspeed bench serving`: a load generator for any OpenAI-compatible server. Each client
// thread streams /v1/completions with random token-id prompts (ignore_eos, so every request
// makes exactly max_tokens tokens, unless a JSON schema constrains it), or /v1/chat/completions
// with tools, and records TTFT and the gaps between streamed chunks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ts::server {

struct BenchServingOptions {
  std::string base_url = "http://127.0.0.1:30000";  // a trailing /v1 is accepted
  std::string model;                  // empty: the first id of GET /v1/models
  std::vector<int> concurrency{1, 4, 16, 64};
  int num_prompts = 0;                // per concurrency level; 0: max(8, 2 x concurrency)
  int prompt_tokens = 128;
  int max_tokens = 64;
  uint64_t seed = 0;
  int token_id_min = 100, token_id_max = 1100;  // prompt ids drawn from [min, max)
  double timeout_s = 600;
  // Non-empty: every request carries it as `structured_outputs.json` (a JSON Schema, the text of
  // a JSON value), so the same load runs grammar-constrained: its cost is the difference in tok/s
  // and ITL against a run without. Requests then end where the grammar does (<= max_tokens).
  std::string json_schema;
  // Non-empty (a JSON array of OpenAI function tools): the load goes to /v1/chat/completions
  // instead, with a prompt of `prompt_tokens` random words, these tools and `tool_choice` (auto:
  // free text with calls enforced by a triggered grammar once the model opens one; required:
  // every output is calls). Requests end where a required call ends (<= max_tokens).
  std::string tools;
  std::string tool_choice = "auto";
};

struct BenchServingResult {
  int concurrency = 0, requests = 0, failed = 0;
  int64_t output_tokens = 0;
  double duration_s = 0, req_per_s = 0, output_tok_per_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  // Share of device time idle between engine steps during this level, from the server's
  // /metrics counters (tokenspeed_device_{idle,busy}_seconds_total); -1: not available.
  double device_idle_pct = -1;
  std::string first_error;
};

// Linear-interpolated percentile (p in [0, 100]) of unsorted samples; 0 when empty.
double percentile(std::vector<double> v, double p);

// Runs every concurrency level in turn (throws ts::Error when the server cannot be reached).
std::vector<BenchServingResult> run_bench_serving(const BenchServingOptions& o);
std::string format_bench_table(const std::vector<BenchServingResult>& r);

}  // namespace ts::server
