// generate: one request through the full engine (scheduler, paged KV cache, sampler,
// speculative decoding when enabled), text streamed to stdout as it is produced.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/engine_flags.h"
#include "runtime/engine.h"
#include "server/output_processor.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace ts;

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt (streams to stdout)"};
  EngineOptions eo;
  eo.model_dir = cli::default_model_dir();
  std::string prompt, prompt_ids, trace_file;
  bool have_prompt = false, print_ids = false;
  GenerateParams gp;
  gp.temperature = 0.0f;
  gp.max_tokens = 64;
  int64_t seed = -1;
  app.add_option("--model,--model-path", eo.model_dir, "model directory (default: the bundled demo model)");
  app.add_option("--prompt", prompt, "prompt text (BOS added as the tokenizer's post-processor says)")
      ->each([&](const std::string&) { have_prompt = true; });
  bool have_ids = false;
  app.add_option("--prompt-ids", prompt_ids, "prompt as token ids 1,2,3 (taken as given: no BOS added)")
      ->each([&](const std::string&) { have_ids = true; });
  app.add_option("--max-tokens", gp.max_tokens, "tokens to generate");
  app.add_option("--temperature", gp.temperature, "0 = greedy (default)");
  app.add_option("--top-p", gp.top_p, "nucleus sampling mass");
  app.add_option("--top-k", gp.top_k, "keep the k most likely tokens (0 = off)");
  app.add_option("--min-p", gp.min_p, "drop tokens below min_p * p(max)");
  app.add_option("--seed", seed, "sampling seed");
  app.add_flag("--ignore-eos", gp.ignore_eos, "do not stop at end-of-sequence tokens");
  app.add_option("--repetition-penalty", gp.repetition_penalty, "HF repetition penalty on prompt and output tokens (1 = off)");
  app.add_option("--presence-penalty", gp.presence_penalty, "OpenAI presence penalty on output tokens (0 = off)");
  app.add_option("--frequency-penalty", gp.frequency_penalty, "OpenAI frequency penalty on output tokens (0 = off)");
  app.add_option("--min-tokens", gp.min_tokens, "mask the eos ids until this many tokens are generated");
  app.add_option("--bad-words", gp.bad_words, "words never generated (vLLM's bad_words; repeatable)");
  app.add_option("--logprobs", gp.logprobs, "also print each token's logprob and the top-k alternatives (JSON, stderr)");
  app.add_flag("--print-ids", print_ids, "print the generated token ids as a JSON list instead of text");
  app.add_option("--spec-trace", trace_file, "write the speculative decoding trace (tokens, drafts, accepted) as JSON");
  cli::add_engine_flags(app, eo);
  CLI11_PARSE(app, argc, argv);
  TS_CHECK(have_prompt != have_ids, "give exactly one of --prompt or --prompt-ids");
  TS_CHECK(!(have_prompt && prompt.empty()), "the prompt is empty");
  if (seed >= 0) gp.seed = uint64_t(seed);
  gp.return_spec_trace = !trace_file.empty();
  if (eo.max_total_tokens <= 0) eo.max_total_tokens = 65536;  // one request: a small pool is plenty
  if (cli::run_if_worker_node(eo)) return 0;  // --node-rank > 0: worker ranks, no output
  Engine engine(eo);
  gp.prompt = have_prompt ? engine.tokenizer().encode(prompt, true) : cli::parse_ids(prompt_ids);
  TS_CHECK(!gp.prompt.empty(), "the prompt is empty (no tokens)");
  engine.start();
  std::shared_ptr<Stream> st;
  try {
    st = engine.submit(gp);
    // Text (detok, stop strings) is made here as events are popped, not on the engine thread.
    server::attach_output_processor(*st, engine.tokenizer_ptr(), gp, engine.eos_token_ids());
  } catch (const std::exception& e) {
    engine.stop();
    throw;
  }
  std::vector<int32_t> out;
  StreamEvent ev;
  while (true) {
    if (!st->pop(ev, 1000)) continue;
    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    for (auto& lp : ev.logprobs) {
      nlohmann::json j = {{"id", lp.id}, {"logprob", lp.logprob}, {"top", nlohmann::json::array()}};
      for (auto& [id, v] : lp.top) j["top"].push_back({id, v});
      std::fprintf(stderr, "%s\n", j.dump().c_str());
    }
    if (!print_ids && !ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) break;
  }
  engine.stop();
  TS_CHECK(ev.error.empty(), "{}", ev.error);
  if (print_ids) std::printf("%s\n", nlohmann::json(out).dump().c_str());
  if (!trace_file.empty()) {
    nlohmann::json j;
    j["tokens"] = out;
    j["iterations"] = nlohmann::json::array();
    for (auto& [d, a] : ev.spec_trace) j["iterations"].push_back({{"drafts", d}, {"accepted", a}});
    std::ofstream(trace_file) << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

TS_COMMAND("generate", "generate text from a prompt (streams to stdout)", cmd_generate);
