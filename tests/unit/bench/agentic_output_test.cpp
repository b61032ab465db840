// results.json / results.csv / pareto.svg / the table, and the synthetic text generator.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/agentic.h"
#include "core/error.h"

using namespace ts::bench;

namespace {

AgenticRun sample_run() {
  AgenticRun run;
  run.config.base_url = "http://127.0.0.1:1";
  run.config.model = "m<&>";
  run.config.num_gpus = 2;
  run.config.concurrency = {1, 8};
  run.context_length = 4096;
  run.chars_per_token = 3.5;
  for (int c : {8, 1}) {  // out of order on purpose: the polyline follows concurrency
    LevelResult L;
    L.concurrency = c;
    L.conversations = 2 * c;
    L.requests = 10 * c;
    L.duration_s = 12.5;
    L.completion_tokens = 1000 * c;
    L.prompt_tokens = 5000 * c;
    L.per_user_tps = 100.0 / c;
    L.per_gpu_tpm = 3000.0 * c;
    L.output_tps = 100.0 * c;
    L.itl_mean_ms = 10.0 * c;
    L.itl_p50_ms = 10.0 * c;
    L.itl_p99_ms = 20.0 * c;
    L.ttft_first_p50_ms = 300;
    L.ttft_first_p99_ms = 900;
    L.ttft_later_p50_ms = 40;
    L.ttft_later_p99_ms = 80;
    L.cached_tokens = 4000 * c;
    L.cache_hit_rate = 0.8;
    L.cache_hit_rate_later = 0.9;
    L.mean_prompt_tokens = 500;
    if (c == 8) L.accept_length = 2.75;  // c=1: null
    run.levels.push_back(L);
  }
  return run;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t count(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(AgenticOutput, FilesRoundTrip) {
  auto dir = std::filesystem::temp_directory_path() / ("ts_agentic_out_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  AgenticRun run = sample_run();
  write_outputs(run, (dir / "nested").string());

  // results.json parses back with every field.
  auto j = nlohmann::json::parse(slurp((dir / "nested/results.json").string()));
  EXPECT_EQ(j["benchmark"], "agentic");
  EXPECT_EQ(j["config"]["model"], "m<&>");
  EXPECT_EQ(j["config"]["num_gpus"], 2);
  EXPECT_EQ(j["config"]["concurrency"], nlohmann::json({1, 8}));
  EXPECT_EQ(j["endpoint"]["context_length"], 4096);
  EXPECT_DOUBLE_EQ(j["endpoint"]["chars_per_token"].get<double>(), 3.5);
  ASSERT_EQ(j["levels"].size(), 2u);
  for (const char* k :
       {"concurrency", "conversations", "requests", "errors", "truncated_conversations", "duration_s", "per_user_tps",
        "per_gpu_tpm", "output_tps", "itl_mean_ms", "itl_p50_ms", "itl_p99_ms", "ttft_first_turn_p50_ms",
        "ttft_first_turn_p99_ms", "ttft_later_turns_p50_ms", "ttft_later_turns_p99_ms", "prompt_tokens",
        "completion_tokens", "cached_tokens", "cache_hit_rate", "cache_hit_rate_later_turns", "mean_prompt_tokens",
        "accept_length", "first_error"})
    EXPECT_TRUE(j["levels"][0].contains(k)) << k;
  auto& l8 = j["levels"][0];
  EXPECT_EQ(l8["concurrency"], 8);
  EXPECT_DOUBLE_EQ(l8["per_gpu_tpm"].get<double>(), 24000);
  EXPECT_DOUBLE_EQ(l8["accept_length"].get<double>(), 2.75);
  EXPECT_TRUE(j["levels"][1]["accept_length"].is_null());
  EXPECT_TRUE(j["levels"][1]["first_error"].is_null());
  EXPECT_TRUE(j["definitions"].contains("per_user_tps"));

  // results.csv: a header and one row per level, same columns as the JSON levels.
  std::string csv = slurp((dir / "nested/results.csv").string());
  std::vector<std::string> lines;
  std::stringstream ss(csv);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("concurrency,conversations,requests,errors,", 0), 0u);
  EXPECT_EQ(count(lines[0], ","), j["levels"][0].size() - 1);
  EXPECT_EQ(count(lines[1], ","), count(lines[0], ","));
  EXPECT_EQ(lines[1].rfind("8,16,80,0,0,12.5,12.5,24000,", 0), 0u) << lines[1];
  EXPECT_NE(lines[2].find(",,"), std::string::npos);  // null accept length -> empty cell

  // pareto.svg: one point and one "c=N" label per level, a polyline, ticks and axis titles.
  std::string svg = slurp((dir / "nested/pareto.svg").string());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 2u);
  EXPECT_NE(svg.find(">c=1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">c=8</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_GE(count(svg, "class=\"xtick\""), 3u);
  EXPECT_GE(count(svg, "class=\"ytick\""), 3u);
  EXPECT_NE(svg.find("per-user tokens/s"), std::string::npos);
  EXPECT_NE(svg.find("per-GPU tokens/min"), std::string::npos);
  EXPECT_NE(svg.find("m&lt;&amp;&gt;"), std::string::npos);  // escaped model name
  EXPECT_EQ(svg.find("m<&>"), std::string::npos);
  // Polyline in concurrency order: c=1 (x = 100 tok/s, right) first, then c=8 (x = 12.5, left).
  size_t pl = svg.find("points=\"");
  double xa = std::stod(svg.substr(pl + 8));
  size_t sp = svg.find(' ', pl + 8);
  double xb = std::stod(svg.substr(sp + 1));
  EXPECT_GT(xa, xb);
  std::filesystem::remove_all(dir);
}

TEST(AgenticOutput, SvgWithoutData) {
  AgenticRun run;
  std::string svg = pareto_svg(run);
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 0u);
}

TEST(AgenticOutput, Table) {
  std::string t = results_table(sample_run());
  EXPECT_NE(t.find("user tok/s"), std::string::npos);
  EXPECT_NE(t.find("24000"), std::string::npos);
  EXPECT_NE(t.find("2.75"), std::string::npos);
  EXPECT_EQ(count(t, "\n"), 5u);  // title, header, 2 rows, footnote
}

// ---- synthetic text ---------------------------------------------------------------------------------
TEST(AgenticText, DeterministicCodeOfTheRequestedSize) {
  CodeTextGen g;
  Rng a(42), b(42), c(43);
  std::string x = g.code(a, 5000), y = g.code(b, 5000), z = g.code(c, 5000);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_GE(x.size(), 5000u);
  EXPECT_LT(x.size(), 5300u);
  EXPECT_EQ(x.back(), '\n');
  for (const char* kw : {"def ", "return ", "    ", "# "}) EXPECT_NE(x.find(kw), std::string::npos) << kw;
  for (char ch : x) EXPECT_TRUE(ch == '\n' || (ch >= 32 && ch < 127)) << int(ch);
  Rng u(7);
  std::string first = g.user_turn(u, 2000, true);
  EXPECT_NE(first.find("# file: src/"), std::string::npos);
  EXPECT_GE(first.size(), 2000u);
  // The seed mix spreads neighbouring ids.
  EXPECT_NE(mix_seed(1, 0), mix_seed(1, 1));
  EXPECT_NE(mix_seed(0, 1), mix_seed(1, 0));
}

TEST(AgenticText, IdentifierPoolFromTokenizer) {
  auto pool = identifier_pool_from_tokenizer(std::string(TS_SOURCE_DIR) + "/models/pycoder");
  ASSERT_GE(pool.size(), 50u);
  EXPECT_TRUE(std::is_sorted(pool.begin(), pool.end()));
  for (auto& w : pool) {
    EXPECT_GE(w.size(), 3u);
    for (char ch : w) EXPECT_TRUE(ch >= 'a' && ch <= 'z') << w;
  }
  CodeTextGen g(pool);
  Rng r(1);
  std::string code = g.code(r, 1000);
  EXPECT_GE(code.size(), 1000u);
  EXPECT_THROW(identifier_pool_from_tokenizer("/nonexistent"), ts::Error);
}
