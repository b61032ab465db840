// `tokenspeed bench-tokenizer` (or `bench tokenizer`): single-thread encode and decode throughput.
#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_clock.h"
#include "tokenizer/tokenizer.h"

namespace {

// Python-like source with varied identifiers, literals, comments and indentation, so the word
// cache sees a realistic mix of repeats and new words rather than one block repeated.
std::string synth_python(size_t bytes) {
  static const char* words[] = {"data", "value", "index", "result", "config", "request", "buffer", "tokens", "batch",
                                "model", "layer", "weight", "cache", "offset", "length", "count", "items", "parser",
                                "stream", "handler", "context", "options", "logger", "session", "matrix", "vector"};
  static const char* mods[] = {"os", "sys", "json", "re", "math", "typing", "numpy as np", "collections"};
  std::mt19937 rng(1234);
  auto pick = [&](auto& arr) { return std::string(arr[rng() % std::size(arr)]); };
  auto ident = [&] {
    std::string s = pick(words);
    if (rng() % 2) s += "_" + pick(words);
    if (rng() % 5 == 0) s += std::to_string(rng() % 100);
    return s;
  };
  std::string out;
  out.reserve(bytes + 4096);
  while (out.size() < bytes) {
    switch (rng() % 6) {
      case 0:
        out += "import " + pick(mods) + "\n";
        break;
      case 1: {
        std::string cls = ident();
        cls[0] = static_cast<char>(std::toupper(cls[0]));
        out += "\n\nclass " + cls + ":\n    \"\"\"Holds the " + ident() + " for each " + ident() + ".\"\"\"\n\n";
        out += "    def __init__(self, " + ident() + ", " + ident() + "=None):\n";
        out += "        self." + ident() + " = {}\n        self._" + ident() + " = []\n";
        break;
      }
      case 2: {
        std::string f = ident(), a = ident(), b = ident();
        out += "\ndef " + f + "(" + a + ", " + b + ": int = " + std::to_string(rng() % 1000) + ") -> dict:\n";
        out += "    # " + ident() + " is clamped to the " + ident() + " range\n";
        out += "    if " + a + " is None or len(" + a + ") == 0:\n        return {}\n";
        out += "    for i, x in enumerate(" + a + "):\n        " + b + " += x * " + std::to_string(rng() % 97) + "\n";
        out += "    return {\"" + f + "\": " + b + ", \"n\": len(" + a + ")}\n";
        break;
      }
      case 3:
        out += "    " + ident() + " = [" + std::to_string(rng() % 10000) + ", " + std::to_string(rng() % 10000) + ", 0x" +
               std::to_string(rng() % 0xFFFF) + "]\n";
        break;
      case 4:
        out += "        print(f\"" + ident() + "={" + ident() + "!r} took {elapsed:.3f}s\")\n";
        break;
      default:
        out += "    while " + ident() + " < " + std::to_string(rng() % 512) + ":\n        " + ident() + ".append(" +
               ident() + "[i:i + 2])\n";
    }
  }
  out.resize(bytes);
  return out;
}

int cmd_bench_tokenizer(int argc, char** argv) {
  CLI::App app{"Measure single-thread tokenizer encode/decode throughput (MB = 10^6 bytes)", "tokenspeed bench-tokenizer"};
  std::string tokenizer, text_file;
  double mb = 8;
  int iters = 3;
  app.add_option("--tokenizer", tokenizer, "model directory or tokenizer.json path")->required();
  app.add_option("--text-file", text_file, "text to encode (repeated up to --mb); default: synthesized Python source");
  app.add_option("--mb", mb, "megabytes of text to encode per iteration")->check(CLI::Range(0.001, 4096.0));
  app.add_option("--iters", iters, "timed iterations (the best is reported)")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto tok = ts::tok::Tokenizer::load(tokenizer);
  size_t bytes = static_cast<size_t>(mb * 1e6);
  std::string text;
  if (!text_file.empty()) {
    std::ifstream f(text_file, std::ios::binary);
    if (!f) ts::fail("cannot open --text-file {}", text_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string base = ss.str();
    if (base.empty()) ts::fail("--text-file {} is empty", text_file);
    while (text.size() < bytes) text += base;
    text.resize(bytes);
  } else {
    text = synth_python(bytes);
  }
  using clock = std::chrono::steady_clock;
  double best_enc = 1e30, best_dec = 1e30, best_enc_cpu = 1e30;
  std::vector<int32_t> ids;
  for (int i = 0; i < iters; ++i) {
    auto t0 = clock::now();
    double c0 = ts::thread_cpu_seconds();
    ids = tok->encode(text);
    double c1 = ts::thread_cpu_seconds();
    auto t1 = clock::now();
    std::string back = tok->decode(ids);
    auto t2 = clock::now();
    best_enc = std::min(best_enc, std::chrono::duration<double>(t1 - t0).count());
    best_enc_cpu = std::min(best_enc_cpu, c1 - c0);
    best_dec = std::min(best_dec, std::chrono::duration<double>(t2 - t1).count());
    if (i == 0 && back != text) std::fprintf(stderr, "warning: decode(encode(text)) differs from the text\n");
  }
  double mb_total = text.size() / 1e6;
  std::printf("text: %.2f MB (%s), %zu tokens, %.2f bytes/token\n", mb_total,
              text_file.empty() ? "synthesized Python" : text_file.c_str(), ids.size(),
              ids.empty() ? 0.0 : static_cast<double>(text.size()) / ids.size());
  std::printf("encode: %.1f MB/s  (%.2f M tokens/s, best of %d; %.1f MB per CPU-second)\n", mb_total / best_enc,
              ids.size() / 1e6 / best_enc, iters, mb_total / best_enc_cpu);
  std::printf("decode: %.1f MB/s  (%.2f M tokens/s)\n", mb_total / best_dec, ids.size() / 1e6 / best_dec);
  return 0;
}

}  // namespace
TS_COMMAND("bench-tokenizer", "benchmark tokenizer encode/decode speed in MB/s (also: bench tokenizer)", cmd_bench_tokenizer);
