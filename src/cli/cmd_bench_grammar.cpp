// `tokenspeed bench-grammar`: JSON-schema grammar compile time and token-mask time per token
// (p50/p99/max) on a real tokenizer, walking a valid instance of each schema token by token.
// Times are this thread's CPU time (the machine may be shared). "cold" = the first request on a
// freshly compiled grammar (per-position caches fill as it goes), with the vocabulary's shared
// masks as the schemas before it left them (a running server meeting a new schema); "fresh" =
// the same against a fresh vocabulary (nothing shared yet: a server's very first schema);
// "warm" = a later request on the same compiled grammar (what a server with a grammar cache sees).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_clock.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::ordered_json;  // schema key order = property order
using Clock = std::chrono::steady_clock;

double thread_cpu_us() { return ts::thread_cpu_seconds() * 1e6; }

struct Case {
  std::string name;
  json schema;    // null = json_object
  json instance;  // a valid value the bench walks through
};

std::vector<Case> builtin_cases() {
  return {
      {"tool:get_weather",
       json::parse(R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},
         "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location","unit"],"additionalProperties":false})"),
       json::parse(R"({"location": "Paris, France", "unit": "celsius"})")},
      {"tool:search",
       json::parse(R"({"type":"object","properties":{"query":{"type":"string"},"max_results":{"type":"integer","minimum":1,"maximum":50},
         "filters":{"type":"array","items":{"type":"object","properties":{"field":{"type":"string"},"op":{"enum":["eq","lt","gt"]},
         "value":{"anyOf":[{"type":"string"},{"type":"number"}]}},"required":["field","op","value"]}},
         "since":{"type":"string","format":"date"}},"required":["query"]})"),
       json::parse(R"({"query": "grammar constrained decoding benchmarks", "max_results": 10,
         "filters": [{"field": "year", "op": "gt", "value": 2022}, {"field": "venue", "op": "eq", "value": "ACL"}], "since": "2023-01-15"})")},
      {"pydantic:user",
       json::parse(R"({"$defs":{"Address":{"properties":{"street":{"type":"string"},"zip":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},
         "required":["street"],"type":"object"}},"properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
         "emails":{"type":"array","items":{"type":"string"},"maxItems":4},"addresses":{"type":"array","items":{"$ref":"#/$defs/Address"}},
         "active":{"type":"boolean"}},"required":["name","age","emails","addresses","active"],"type":"object"})"),
       json::parse(R"({"name": "Ada Lovelace", "age": 36, "emails": ["ada@example.com"],
         "addresses": [{"street": "12 St James's Square", "zip": "SW1Y 4JH"}, {"street": "Ockham Park", "zip": null}], "active": true})")},
      {"json_object", json(),
       json::parse(R"({"id": 12345, "tags": ["x", "y"], "nested": {"ok": false, "score": -3.25e2, "note": "free text, any keys"}})")},
  };
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Walks the instance's tokens: mask, then accept. Returns per-token mask times in µs.
std::vector<double> walk(const std::shared_ptr<const ts::grammar::CompiledGrammar>& cg, const std::vector<int32_t>& ids,
                         const std::string& name) {
  ts::grammar::Matcher m(cg);
  std::vector<uint32_t> row(static_cast<size_t>(cg->vocab().mask_words()));
  std::vector<double> us;
  for (int32_t id : ids) {
    double t0 = thread_cpu_us();
    m.fill_bitmask(row.data());
    us.push_back(thread_cpu_us() - t0);
    if (!((row[id >> 5] >> (id & 31)) & 1)) ts::fail("bench-grammar: {}: token {} of the instance is masked out", name, id);
    if (!m.accept_token(id)) ts::fail("bench-grammar: {}: token {} of the instance is rejected", name, id);
  }
  if (!m.can_terminate()) ts::fail("bench-grammar: {}: the instance is not a complete sentence", name);
  return us;
}

int cmd_bench_grammar(int argc, char** argv) {
  CLI::App app{"Measure JSON-schema grammar compile time and token-mask time per token", "tokenspeed bench-grammar"};
  std::string tokenizer;
  std::vector<std::string> schemas;
  int repeats = 5;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or a model directory")->required();
  app.add_option("--schema", schemas,
                 "a JSON file {\"schema\": ..., \"instance\": ...} to bench instead of the built-in tool schemas (repeatable)");
  app.add_option("--repeats", repeats, "warm walks per schema")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    auto tok = ts::tok::Tokenizer::load(tokenizer);
    auto t0 = Clock::now();
    auto vocab = ts::grammar::Vocab::from_tokenizer(*tok);
    double vocab_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("tokenizer %s: vocab %d (%zu normal tokens), vocab tables %.1f ms\n", tokenizer.c_str(), vocab->size(),
                vocab->sorted().size(), vocab_ms);
    std::vector<Case> cases;
    if (schemas.empty()) cases = builtin_cases();
    for (const auto& f : schemas) {
      std::ifstream in(f);
      if (!in) ts::fail("bench-grammar: cannot open {}", f);
      json j = json::parse(in);
      cases.push_back({f, j.at("schema"), j.at("instance")});
    }
    std::printf("%-18s %6s %10s %9s %10s %9s %9s %9s %9s %9s %9s\n", "schema", "tokens", "compile_ms", "fresh_ms",
                "cold_ms", "cold_p50", "cold_p99", "cold_max", "warm_p50", "warm_p99", "warm_max");
    std::vector<double> all_warm;
    for (const auto& c : cases) {
      double c0 = thread_cpu_us();
      ts::grammar::Grammar g =
          c.schema.is_null() ? ts::grammar::json_object_grammar() : ts::grammar::json_schema_grammar(c.schema);
      auto cg = std::make_shared<const ts::grammar::CompiledGrammar>(g, vocab);
      double compile_ms = (thread_cpu_us() - c0) / 1000;
      std::vector<int32_t> ids = tok->encode(c.instance.dump());
      double fresh_ms = 0;
      {
        auto fresh_vocab = ts::grammar::Vocab::from_tokenizer(*tok);
        auto fresh = std::make_shared<const ts::grammar::CompiledGrammar>(g, fresh_vocab);
        for (double x : walk(fresh, ids, c.name)) fresh_ms += x / 1000;
      }
      std::vector<double> cold = walk(cg, ids, c.name);
      std::vector<double> warm;
      for (int r = 0; r < repeats; ++r) {
        auto w = walk(cg, ids, c.name);
        warm.insert(warm.end(), w.begin(), w.end());
      }
      all_warm.insert(all_warm.end(), warm.begin(), warm.end());
      double cold_ms = 0;
      for (double x : cold) cold_ms += x / 1000;
      std::printf("%-18s %6zu %10.2f %9.1f %10.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", c.name.c_str(), ids.size(),
                  compile_ms, fresh_ms, cold_ms, pct(cold, 0.5), pct(cold, 0.99), pct(cold, 1.0), pct(warm, 0.5), pct(warm, 0.99),
                  pct(warm, 1.0));
    }
    std::printf("all schemas, warm: p50 %.1f us, p99 %.1f us per mask (%zu masks)\n", pct(all_warm, 0.5),
                pct(all_warm, 0.99), all_warm.size());
    std::printf("vocabulary-shared context masks: %zu, reused %zu times\n", vocab->shared_masks().size(),
                vocab->shared_masks().hits());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

TS_COMMAND("bench-grammar", "Measure JSON-schema grammar compile time and token-mask time per token", cmd_bench_grammar);
