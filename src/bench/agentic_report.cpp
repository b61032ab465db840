// Outputs of the agentic benchmark: results.json, results.csv, pareto.svg (our own SVG, no
// plotting dependency) and the stdout table.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "bench/agentic.h"
#include "bench/stats.h"
#include "core/error.h"

namespace ts::bench {

nlohmann::json config_to_json(const AgenticConfig& c) {
  return {{"base_url", c.base_url},
          {"model", c.model},
          {"api", c.api == Api::chat ? "chat" : "completions"},
          {"conversations", c.conversations},
          {"concurrency", c.concurrency},
          {"first_turn_tokens", c.first_turn_tokens},
          {"turn_tokens", c.turn_tokens},
          {"turns_min", c.turns_min},
          {"turns_max", c.turns_max},
          {"max_tokens", c.max_tokens},
          {"ignore_eos", c.ignore_eos},
          {"temperature", 0},
          {"warmup", c.warmup},
          {"seed", c.seed},
          {"num_gpus", c.num_gpus},
          {"tokenizer", c.tokenizer_dir},
          {"timeout_s", c.timeout_s},
          {"context_length", c.context_length},
          {"chars_per_token", c.chars_per_token}};
}

namespace {

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// The per-level fields, in output order (JSON keys and CSV columns).
std::vector<std::pair<std::string, nlohmann::json>> level_fields(const LevelResult& L) {
  return {{"concurrency", L.concurrency},
          {"conversations", L.conversations},
          {"requests", L.requests},
          {"errors", L.errors},
          {"truncated_conversations", L.truncated_conversations},
          {"duration_s", L.duration_s},
          {"per_user_tps", opt(L.per_user_tps)},
          {"per_gpu_tpm", opt(L.per_gpu_tpm)},
          {"output_tps", opt(L.output_tps)},
          {"itl_mean_ms", opt(L.itl_mean_ms)},
          {"itl_p50_ms", opt(L.itl_p50_ms)},
          {"itl_p99_ms", opt(L.itl_p99_ms)},
          {"ttft_first_turn_p50_ms", opt(L.ttft_first_p50_ms)},
          {"ttft_first_turn_p99_ms", opt(L.ttft_first_p99_ms)},
          {"ttft_later_turns_p50_ms", opt(L.ttft_later_p50_ms)},
          {"ttft_later_turns_p99_ms", opt(L.ttft_later_p99_ms)},
          {"prompt_tokens", L.prompt_tokens},
          {"completion_tokens", L.completion_tokens},
          {"cached_tokens", opt(L.cached_tokens)},
          {"cache_hit_rate", opt(L.cache_hit_rate)},
          {"cache_hit_rate_later_turns", opt(L.cache_hit_rate_later)},
          {"mean_prompt_tokens", opt(L.mean_prompt_tokens)},
          {"accept_length", opt(L.accept_length)},
          {"device_hit_rate", opt(L.device_hit_rate)},
          {"host_hit_rate", opt(L.host_hit_rate)},
          {"host_loaded_gb", opt(L.host_loaded_gb)},
          {"first_error", L.first_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(L.first_error)}};
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string tick_label(double v) {
  double a = std::fabs(v);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:g}", v);
}

std::string csv_cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) {
    std::string s = v.get<std::string>(), o = "\"";
    for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
    return o + "\"";
  }
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

}  // namespace

nlohmann::json results_json(const AgenticRun& run) {
  nlohmann::json j;
  j["benchmark"] = "agentic";
  j["config"] = config_to_json(run.config);
  j["endpoint"] = {{"model", run.config.model},
                   {"context_length", run.context_length ? nlohmann::json(run.context_length) : nlohmann::json(nullptr)},
                   {"chars_per_token", run.chars_per_token}};
  j["levels"] = nlohmann::json::array();
  for (auto& L : run.levels) {
    nlohmann::json l = nlohmann::json::object();
    for (auto& [k, v] : level_fields(L)) l[k] = v;
    j["levels"].push_back(l);
  }
  j["warnings"] = run.warnings;
  j["definitions"] = {
      {"per_user_tps", "1000 / mean inter-token latency (ms); mean ITL = sum of (last chunk - first chunk) / sum of "
                       "tokens after the first chunk, over the level's requests"},
      {"per_gpu_tpm", "completion tokens / level window (first request sent to last response done) * 60 / num_gpus"},
      {"ttft", "first token-carrying chunk - request start; first turn and later turns separately"},
      {"percentiles", "linear interpolation between closest ranks (NumPy default)"},
      {"tokens_per_chunk", "per-chunk usage deltas when every chunk has usage; else 1 for the first chunk and the "
                           "rest of usage.completion_tokens spread over the later chunks; else 1 per chunk"},
      {"cache_hit_rate", "sum usage.prompt_tokens_details.cached_tokens / sum usage.prompt_tokens"},
      {"accept_length", "from GET /metrics deltas over the level (speculative decoding); null when absent"},
      {"device_hit_rate", "prompt tokens found in the device KV tier / prompt tokens (GET /metrics deltas; ours only)"},
      {"host_hit_rate", "prompt tokens loaded back from the host KV tier / prompt tokens (GET /metrics deltas; ours only)"},
      {"host_loaded_gb", "GB copied host tier -> device over the level (GET /metrics deltas; ours only)"}};
  return j;
}

std::string results_csv(const AgenticRun& run) {
  std::string out;
  LevelResult empty;
  auto header = level_fields(empty);
  for (size_t i = 0; i < header.size(); ++i) {
    if (i) out += ',';
    out += header[i].first;
  }
  out += "\n";
  for (auto& L : run.levels) {
    auto f = level_fields(L);
    for (size_t i = 0; i < f.size(); ++i) {
      if (i) out += ',';
      out += csv_cell(f[i].second);
    }
    out += "\n";
  }
  return out;
}

std::string pareto_svg(const AgenticRun& run) {
  const double W = 760, H = 500, ml = 96, mr = 40, mt = 56, mb = 72;
  const double pw = W - ml - mr, ph = H - mt - mb;
  struct Pt {
    double x, y;
    int c;
  };
  std::vector<Pt> pts;
  for (auto& L : run.levels)
    if (L.per_user_tps && L.per_gpu_tpm) pts.push_back({*L.per_user_tps, *L.per_gpu_tpm, L.concurrency});
  std::sort(pts.begin(), pts.end(), [](const Pt& a, const Pt& b) { return a.c < b.c; });
  double xmax = 1, ymax = 1;
  for (auto& p : pts) {
    xmax = std::max(xmax, p.x * 1.08);
    ymax = std::max(ymax, p.y * 1.08);
  }
  auto xt = nice_ticks(0, xmax, 8), yt = nice_ticks(0, ymax, 8);
  double x1 = xt.back(), y1 = yt.back();
  auto X = [&](double v) { return ml + v / x1 * pw; };
  auto Y = [&](double v) { return mt + ph - v / y1 * ph; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                   W / 2, xml_escape("Agentic benchmark: " + run.config.model));
  s += "<g class=\"grid\" stroke=\"#e0e0e0\">\n";
  for (double t : xt) s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", X(t), mt, mt + ph);
  for (double t : yt) s += fmt::format("<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", Y(t), ml, ml + pw);
  s += "</g>\n<g class=\"axes\" stroke=\"black\">\n";
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>\n", ml, mt + ph, ml + pw);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", ml, mt, mt + ph);
  for (double t : xt) s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", X(t), mt + ph, mt + ph + 5);
  for (double t : yt) s += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>\n", Y(t), ml - 5, ml);
  s += "</g>\n<g class=\"ticks\">\n";
  for (double t : xt)
    s += fmt::format("<text class=\"xtick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X(t), mt + ph + 20,
                     tick_label(t));
  for (double t : yt)
    s += fmt::format("<text class=\"ytick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", ml - 8, Y(t) + 4,
                     tick_label(t));
  s += "</g>\n";
  s += fmt::format("<text class=\"xtitle\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\">"
                   "per-user tokens/s (1000 / mean ITL)</text>\n",
                   ml + pw / 2, H - 22);
  s += fmt::format("<text class=\"ytitle\" x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" font-size=\"14\" "
                   "transform=\"rotate(-90 {0} {1})\">per-GPU tokens/min</text>\n",
                   22, mt + ph / 2);
  if (pts.empty()) {
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n", ml + pw / 2,
                     mt + ph / 2);
  } else {
    s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"";
    for (size_t i = 0; i < pts.size(); ++i) s += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", X(pts[i].x), Y(pts[i].y));
    s += "\"/>\n";
    for (auto& p : pts) {
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill=\"#1f77b4\"/>\n", X(p.x), Y(p.y));
      s += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\">c={}</text>\n", X(p.x) + 7, Y(p.y) - 7, p.c);
    }
  }
  s += "</svg>\n";
  return s;
}

std::string results_table(const AgenticRun& run) {
  auto f = [](const std::optional<double>& v, const char* spec = "{:.1f}") {
    return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
  };
  std::string out = fmt::format("model {}  ({} GPU{}, context {}, {} API)\n", run.config.model, run.config.num_gpus,
                                run.config.num_gpus == 1 ? "" : "s", run.context_length,
                                run.config.api == Api::chat ? "chat" : "completions");
  out += fmt::format("{:>5} {:>6} {:>4} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6} {:>6} {:>8}\n", "conc",
                     "reqs", "err", "user tok/s", "GPU tok/min", "TTFT1 p50", "TTFT1 p99", "TTFTn p50", "TTFTn p99",
                     "ITL p50", "ITL p99", "cache", "accept", "time s");
  bool tiers = false;
  for (auto& L : run.levels) tiers = tiers || L.host_hit_rate.has_value();
  for (auto& L : run.levels)
    out += fmt::format("{:>5} {:>6} {:>4} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6} {:>6} {:>8.1f}\n",
                       L.concurrency, L.requests, L.errors, f(L.per_user_tps), f(L.per_gpu_tpm, "{:.0f}"),
                       f(L.ttft_first_p50_ms, "{:.0f}"), f(L.ttft_first_p99_ms, "{:.0f}"),
                       f(L.ttft_later_p50_ms, "{:.0f}"), f(L.ttft_later_p99_ms, "{:.0f}"), f(L.itl_p50_ms, "{:.2f}"),
                       f(L.itl_p99_ms, "{:.2f}"), f(L.cache_hit_rate, "{:.3f}"), f(L.accept_length, "{:.2f}"),
                       L.duration_s);
  out += "(TTFT/ITL in ms; TTFT1 = first turns, TTFTn = later turns; cache = cached / prompt tokens)\n";
  if (tiers) {
    out += fmt::format("{:>5} {:>12} {:>12} {:>12}\n", "conc", "device hits", "host hits", "host GB in");
    for (auto& L : run.levels)
      out += fmt::format("{:>5} {:>12} {:>12} {:>12}\n", L.concurrency, f(L.device_hit_rate, "{:.3f}"),
                         f(L.host_hit_rate, "{:.3f}"), f(L.host_loaded_gb, "{:.2f}"));
  }
  return out;
}

void write_outputs(const AgenticRun& run, const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto put = [&](const std::string& name, const std::string& data) {
    std::string p = dir + "/" + name;
    std::ofstream f(p, std::ios::binary);
    TS_CHECK(f.good(), "cannot write {}", p);
    f << data;
    TS_CHECK(f.good(), "cannot write {}", p);
  };
  put("results.json", results_json(run).dump(2) + "\n");
  put("results.csv", results_csv(run));
  put("pareto.svg", pareto_svg(run));
}

}  // namespace ts::bench
