// tokenspeed bench serving: load-tests an OpenAI-compatible server (ours or any other) with
// streaming completions and prints req/s, output tok/s, TTFT and inter-token latency per
// concurrency level.
#include <cstdio>
#include <fstream>
#include <iterator>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "server/bench_client.h"

namespace {

int cmd_bench_serving(int argc, char** argv) {
  CLI::App app{"tokenspeed bench serving: streaming-completions load test against a running server"};
  ts::server::BenchServingOptions o;
  app.add_option("--base-url", o.base_url, "server URL, e.g. http://127.0.0.1:30000")->capture_default_str();
  app.add_option("--model", o.model, "model name (default: the first of GET /v1/models)");
  app.add_option("--concurrency", o.concurrency, "concurrency levels, e.g. 1,4,16,64")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--num-prompts", o.num_prompts, "requests per concurrency level (0: max(8, 2 x concurrency))")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt_tokens, "random token ids per prompt")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "tokens generated per request (ignore_eos)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for the random prompts")->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "per-request timeout in seconds")->capture_default_str();
  std::string schema;
  app.add_option("--json-schema", schema,
                 "constrain every request by this JSON Schema (inline JSON, or @FILE) as structured_outputs.json, "
                 "to measure the grammar's cost against the same run without it");
  std::string tools;
  app.add_option("--tools", tools,
                 "JSON array of OpenAI function tools (inline, or @FILE): the load goes to /v1/chat/completions with "
                 "random-word prompts and these tools, to measure tool calling (tool_choice auto: a grammar triggered "
                 "when the model opens a call) against the same load without");
  app.add_option("--tool-choice", o.tool_choice, "tool_choice with --tools: auto | required | none")
      ->check(CLI::IsMember({"auto", "required", "none"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!schema.empty() && schema[0] == '@') {
    std::ifstream f(schema.substr(1), std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "bench serving: cannot read %s\n", schema.c_str() + 1);
      return 2;
    }
    schema.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  o.json_schema = schema;
  if (!tools.empty() && tools[0] == '@') {
    std::ifstream f(tools.substr(1), std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "bench serving: cannot read %s\n", tools.c_str() + 1);
      return 2;
    }
    tools.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  o.tools = tools;
  if (!o.tools.empty() && !o.json_schema.empty()) {
    std::fprintf(stderr, "bench serving: --tools and --json-schema are separate loads (one at a time)\n");
    return 2;
  }
  std::fprintf(stderr, "bench serving: %s, prompt %d tokens, %d output tokens per request%s\n", o.base_url.c_str(),
               o.prompt_tokens, o.max_tokens, !schema.empty() ? " (JSON-schema constrained: up to)" : !tools.empty() ? " (chat with tools: up to)" : "");
  auto results = ts::server::run_bench_serving(o);
  std::fputs(ts::server::format_bench_table(results).c_str(), stdout);
  for (auto& r : results)
    if (r.failed) return 1;
  return 0;
}

}  // namespace
TS_COMMAND("bench-serving", "load-test a running OpenAI-compatible server (bench serving --base-url URL)", cmd_bench_serving);
