// bench agentic: multi-turn long-context replay against any OpenAI-compatible endpoint; per-user
// tokens/s vs per-GPU tokens/min at each concurrency level. Definitions: src/bench/agentic.h.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "bench/agentic.h"
#include "cli/commands.h"
#include "core/error.h"

namespace {

using namespace ts;

int cmd_bench_agentic(int argc, char** argv) {
  CLI::App app{
      "Agentic benchmark: replays growing multi-turn coding conversations (long first turn, then the previous "
      "answer + new user text each turn, so the prefix cache matters) against an OpenAI-compatible endpoint "
      "(tokenspeed, vLLM, SGLang) at several concurrency levels. Greedy, streamed (stream_options.include_usage). "
      "Reports per-user tokens/s (1000 / mean inter-token latency) against per-GPU tokens/min (completion tokens "
      "over the level's window x 60 / num-gpus), TTFT p50/p99 for first and later turns (linear-interpolation "
      "percentiles), prefix-cache hit rate (cached_tokens / prompt_tokens) and the speculative accept length "
      "(GET /metrics). Writes results.json, results.csv and pareto.svg into --out; prints a table."};
  app.name("tokenspeed bench agentic");
  bench::AgenticConfig c;
  std::string conc = "1,2,4,8,16,32", turns = "10-15", api = "completions";
  if (const char* k = std::getenv("OPENAI_API_KEY")) c.api_key = k;
  app.add_option("--base-url", c.base_url, "endpoint, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
      ->required();
  app.add_option("--model", c.model, "model name sent in requests (default: the first id of GET /v1/models)");
  app.add_option("--out", c.out_dir, "output directory for results.json, results.csv, pareto.svg")->required();
  app.add_option("--api", api, "completions (text prompt = the whole history; exact token counts) | chat (messages)")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->capture_default_str();
  app.add_option("--conversations", c.conversations,
                 "conversations per concurrency level (default 0 = 2 x that level's concurrency)")
      ->capture_default_str();
  app.add_option("--concurrency", conc, "comma-separated concurrency levels (concurrent users)")->capture_default_str();
  app.add_option("--first-turn-tokens", c.first_turn_tokens,
                 "tokens of the first user turn (clipped so the conversation fits the model's context)")
      ->capture_default_str();
  app.add_option("--turn-tokens", c.turn_tokens, "new user tokens added by each later turn")->capture_default_str();
  app.add_option("--turns", turns, "turns per conversation: a count (12) or a range (10-15)")->capture_default_str();
  app.add_option("--max-tokens", c.max_tokens, "max_tokens of each request")->capture_default_str();
  app.add_flag("--ignore-eos", c.ignore_eos, "send ignore_eos: true (always generate max-tokens)");
  app.add_option("--warmup", c.warmup, "conversations run and discarded before the first level")->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the synthetic conversations")->capture_default_str();
  app.add_option("--num-gpus", c.num_gpus, "GPUs behind the endpoint (per-GPU tokens/min divides by it)")
      ->capture_default_str();
  app.add_option("--tokenizer", c.tokenizer_dir,
                 "optional model dir with tokenizer.json: its identifier-like tokens become the identifier pool");
  app.add_option("--timeout", c.timeout_s, "seconds without data from the server before a request fails")
      ->capture_default_str();
  app.add_option("--context-length", c.context_length,
                 "model context when GET /v1/models has no max_model_len (0 = unknown, no clipping)")
      ->capture_default_str();
  app.add_option("--chars-per-token", c.chars_per_token,
                 "characters per token of the synthetic text (0 = measure with two requests' usage.prompt_tokens)")
      ->capture_default_str();
  app.add_option("--api-key", c.api_key, "bearer token (default: $OPENAI_API_KEY)");
  bool no_progress = false;
  app.add_flag("--no-progress", no_progress, "no progress bar on stderr");
  CLI11_PARSE(app, argc, argv);
  c.api = api == "chat" ? bench::Api::chat : bench::Api::completions;
  c.concurrency = bench::parse_int_list(conc);
  std::tie(c.turns_min, c.turns_max) = bench::parse_range(turns);
  c.progress = !no_progress;

  bench::AgenticRun run = bench::run_agentic(c);
  bench::write_outputs(run, c.out_dir);
  std::printf("%s", bench::results_table(run).c_str());
  std::printf("wrote %s/results.json, results.csv, pareto.svg\n", c.out_dir.c_str());
  int64_t errors = 0, requests = 0;
  for (auto& L : run.levels) {
    errors += L.errors;
    requests += L.requests;
  }
  // Fail when nothing worked, so scripts notice a dead endpoint; partial errors are reported.
  return requests > 0 && errors == requests ? 1 : 0;
}

}  // namespace
TS_COMMAND("bench-agentic", "multi-turn agentic benchmark against an OpenAI-compatible endpoint (also: bench agentic)", cmd_bench_agentic);
