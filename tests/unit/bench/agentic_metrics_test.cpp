// The agentic benchmark's arithmetic on a RECORDED stream (tests/unit/bench/data/recorded_streams.json):
// raw SSE bytes with their arrival times go through the same SseParser + apply_stream_payload +
// compute_level as a live run, and every number is checked exactly.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "bench/agentic.h"
#include "bench/stats.h"
#include "core/error.h"

using namespace ts::bench;

namespace {

struct Recorded {
  nlohmann::json meta;
  std::vector<RequestRecord> recs;
};

Recorded replay() {
  std::ifstream f(std::string(TS_SOURCE_DIR) + "/tests/unit/bench/data/recorded_streams.json");
  EXPECT_TRUE(f.good());
  Recorded out;
  out.meta = nlohmann::json::parse(f);
  for (auto& q : out.meta["requests"]) {
    RequestRecord r;
    r.conversation = q["conversation"];
    r.turn = q["turn"];
    r.t_start_ms = q["t_start_ms"];
    r.t_end_ms = q["t_end_ms"];
    bool done = false;
    SseParser p([&](std::string_view payload, double t) {
      if (!done && !apply_stream_payload(r, payload, t)) done = true;
    });
    for (auto& rd : q["reads"]) p.feed(rd[1].get<std::string>(), rd[0].get<double>());
    p.finish(r.t_end_ms);
    if (q.contains("error")) r.error = q["error"];
    if (!q["reads"].empty()) {
      EXPECT_TRUE(done) << q["note"];
    }
    out.recs.push_back(std::move(r));
  }
  return out;
}

}  // namespace

TEST(AgenticStream, PerRequestParsing) {
  auto rec = replay().recs;
  ASSERT_EQ(rec.size(), 4u);
  // A: 4 token chunks, usage only at the end -> 1 token per chunk.
  EXPECT_EQ(rec[0].text, "def f(x)");
  EXPECT_EQ(rec[0].chunk_ms, (std::vector<double>{100, 110, 120, 130}));
  EXPECT_EQ(rec[0].finish_reason, "length");
  EXPECT_EQ(*rec[0].prompt_tokens, 1000);
  EXPECT_EQ(*rec[0].completion_tokens, 4);
  EXPECT_EQ(*rec[0].cached_tokens, 0);
  EXPECT_EQ(rec[0].chunk_tokens(), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(*rec[0].ttft_ms(), 100);
  EXPECT_DOUBLE_EQ(rec[0].decode_ms(), 30);
  EXPECT_DOUBLE_EQ(rec[0].decode_tokens(), 3);
  // B: the role-only chunk carries no token; 7 tokens in 3 chunks -> 1, 3, 3.
  EXPECT_EQ(rec[1].text, "return x + 1\n");
  EXPECT_EQ(rec[1].chunk_ms, (std::vector<double>{250, 270, 290}));
  EXPECT_EQ(rec[1].finish_reason, "stop");
  EXPECT_EQ(rec[1].chunk_tokens(), (std::vector<double>{1, 3, 3}));
  EXPECT_DOUBLE_EQ(*rec[1].ttft_ms(), 50);
  EXPECT_DOUBLE_EQ(rec[1].decode_tokens(), 6);
  EXPECT_EQ(*rec[1].cached_tokens, 1000);
  // C: per-chunk usage -> deltas 1, 2, 1; no prompt_tokens_details.
  EXPECT_EQ(rec[2].text, "abcd");
  EXPECT_EQ(rec[2].chunk_tokens(), (std::vector<double>{1, 2, 1}));
  EXPECT_FALSE(rec[2].cached_tokens.has_value());
  EXPECT_EQ(rec[2].output_tokens(), 4);
  EXPECT_DOUBLE_EQ(*rec[2].ttft_ms(), 80);
  // D: the failed request.
  EXPECT_FALSE(rec[3].ok());
  EXPECT_TRUE(rec[0].ok() && rec[1].ok() && rec[2].ok());
}

TEST(AgenticStream, LevelMetricsExact) {
  auto r = replay();
  LevelResult L = compute_level(r.recs, r.meta["concurrency"], 2, r.meta["num_gpus"], r.meta["window_ms"][0],
                                r.meta["window_ms"][1]);
  EXPECT_EQ(L.concurrency, 2);
  EXPECT_EQ(L.requests, 4);
  EXPECT_EQ(L.errors, 1);
  EXPECT_EQ(L.first_error, "HTTP 500: boom");
  EXPECT_DOUBLE_EQ(L.duration_s, 0.3);
  EXPECT_EQ(L.completion_tokens, 4 + 7 + 4);
  EXPECT_EQ(L.prompt_tokens, 1000 + 1200 + 800);
  // Throughput: 15 tokens / 0.3 s = 50 tok/s; x 60 / 2 GPUs = 1500 tok/min per GPU.
  EXPECT_DOUBLE_EQ(*L.output_tps, 50);
  EXPECT_DOUBLE_EQ(*L.per_gpu_tpm, 1500);
  // Mean ITL = (30 + 40 + 30) ms / (3 + 6 + 3) tokens = 8.333 ms -> 120 tok/s per user.
  EXPECT_DOUBLE_EQ(*L.itl_mean_ms, 100.0 / 12.0);
  EXPECT_DOUBLE_EQ(*L.per_user_tps, 120);
  // ITL samples (gap / tokens of the chunk): 10,10,10 | 20/3,20/3 | 5,20 -> sorted
  // 5, 6.67, 6.67, 10, 10, 10, 20: p50 = x[3] = 10, p99 = x[5] + 0.94 (x[6] - x[5]) = 19.4.
  EXPECT_DOUBLE_EQ(*L.itl_p50_ms, 10);
  EXPECT_NEAR(*L.itl_p99_ms, 19.4, 1e-12);
  // TTFT: first turns {100, 80}: p50 90, p99 80 + 0.99 * 20; later turns {50}.
  EXPECT_DOUBLE_EQ(*L.ttft_first_p50_ms, 90);
  EXPECT_NEAR(*L.ttft_first_p99_ms, 99.8, 1e-12);
  EXPECT_DOUBLE_EQ(*L.ttft_later_p50_ms, 50);
  EXPECT_DOUBLE_EQ(*L.ttft_later_p99_ms, 50);
  // Cache: 1000 cached of 3000 prompt tokens; later turns 1000 of 1200.
  EXPECT_EQ(*L.cached_tokens, 1000);
  EXPECT_DOUBLE_EQ(*L.cache_hit_rate, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(*L.cache_hit_rate_later, 1000.0 / 1200.0);
  EXPECT_DOUBLE_EQ(*L.mean_prompt_tokens, 1000);
  EXPECT_FALSE(L.accept_length.has_value());
}

TEST(AgenticStream, WindowFromRecordsWhenNotGiven) {
  auto r = replay();
  LevelResult L = compute_level(r.recs, 2, 2, 1);
  EXPECT_DOUBLE_EQ(L.duration_s, 0.3);  // earliest start 0, latest end 300
  EXPECT_DOUBLE_EQ(*L.per_gpu_tpm, 3000);
}

TEST(AgenticStream, NoCachedTokensReportedIsNull) {
  auto r = replay();
  std::vector<RequestRecord> only_c{r.recs[2]};
  LevelResult L = compute_level(only_c, 1, 1, 1);
  EXPECT_FALSE(L.cache_hit_rate.has_value());
  EXPECT_FALSE(L.cached_tokens.has_value());
  EXPECT_FALSE(L.ttft_later_p50_ms.has_value());
}

TEST(AgenticStream, NoUsageAtAllCountsOneTokenPerChunk) {
  RequestRecord r;
  SseParser p([&](std::string_view payload, double t) { apply_stream_payload(r, payload, t); });
  p.feed("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n", 10);
  p.feed("data: {\"choices\":[{\"text\":\"c\"}]}", 25);  // no trailing blank line: flushed by finish()
  p.finish(30);
  EXPECT_EQ(r.chunk_ms, (std::vector<double>{10, 10, 30}));
  EXPECT_EQ(r.chunk_tokens(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(r.output_tokens(), 3);
}

TEST(AgenticStream, ErrorEventAndMalformedChunk) {
  RequestRecord r;
  EXPECT_TRUE(apply_stream_payload(r, R"({"error":{"message":"context too long","code":400}})", 1));
  EXPECT_NE(r.error.find("context too long"), std::string::npos);
  RequestRecord m;
  EXPECT_TRUE(apply_stream_payload(m, "{not json", 1));
  EXPECT_FALSE(m.ok());
  RequestRecord d;
  EXPECT_FALSE(apply_stream_payload(d, " [DONE] ", 1));
  EXPECT_TRUE(d.ok());
}

TEST(AgenticStream, SseMultiLineDataAndOtherFields) {
  std::vector<std::string> got;
  SseParser p([&](std::string_view d, double) { got.emplace_back(d); });
  p.feed("event: message\nid: 3\ndata: one\ndata:two\nretry: 5\n\n: comment\n\ndata: three\r\n\r\n", 0);
  EXPECT_EQ(got, (std::vector<std::string>{"one\ntwo", "three"}));
}

// ---- percentiles --------------------------------------------------------------------------------
TEST(Stats, PercentileLinearInterpolation) {
  EXPECT_FALSE(percentile({}, 50).has_value());
  EXPECT_DOUBLE_EQ(*percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(*percentile({4, 1, 3, 2}, 50), 2.5);  // unsorted input
  EXPECT_DOUBLE_EQ(*percentile({1, 2, 3, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(*percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_DOUBLE_EQ(*percentile({1, 2, 3, 4}, 25), 1.75);
  std::vector<double> h;
  for (int i = 1; i <= 100; ++i) h.push_back(i);
  EXPECT_NEAR(*percentile(h, 99), 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(*percentile(h, 50), 50.5);
  EXPECT_DOUBLE_EQ(*mean({1, 2, 6}), 3);
}

TEST(Stats, NiceTicks) {
  auto t = nice_ticks(0, 97);
  EXPECT_EQ(t, (std::vector<double>{0, 20, 40, 60, 80, 100}));
  t = nice_ticks(0, 0.9);
  EXPECT_DOUBLE_EQ(t.back(), 1.0);
  EXPECT_DOUBLE_EQ(t.front(), 0.0);
  t = nice_ticks(0, 123456);
  EXPECT_GE(t.back(), 123456);
  EXPECT_LE(t.size(), 8u);
}

// ---- /metrics -------------------------------------------------------------------------------------
TEST(AgenticMetrics, PrometheusParseAndAcceptLength) {
  auto before = parse_prometheus(
      "# HELP x\n# TYPE tokenspeed_spec_decode_verify_steps_total counter\n"
      "tokenspeed_spec_decode_verify_steps_total{model_name=\"a}b\"} 100\n"
      "tokenspeed_spec_decode_accepted_tokens_total{model_name=\"m\"} 250\n"
      "bad line here\nother_metric{le=\"+Inf\"} +Inf\n");
  EXPECT_DOUBLE_EQ(before.at("tokenspeed_spec_decode_verify_steps_total"), 100);
  EXPECT_TRUE(std::isinf(before.at("other_metric")));
  auto after = parse_prometheus(
      "tokenspeed_spec_decode_verify_steps_total{model_name=\"m\"} 140 1700000000\n"
      "tokenspeed_spec_decode_accepted_tokens_total{model_name=\"m\"} 370\n");
  EXPECT_DOUBLE_EQ(*accept_length_between(before, after), 120.0 / 40.0);
  // Counters present but no verify step in the window -> null, not a stale lifetime value.
  EXPECT_FALSE(accept_length_between(after, after).has_value());
  // Counters absent before (our server only exports them once speculative decoding ran).
  EXPECT_DOUBLE_EQ(*accept_length_between({}, after), 370.0 / 140.0);
  // The brief's names and the gauge.
  EXPECT_DOUBLE_EQ(*accept_length_between({}, parse_prometheus("tokenspeed_spec_accepted_tokens_total 30\n"
                                                                "tokenspeed_spec_verify_steps_total 10\n")),
                   3.0);
  EXPECT_DOUBLE_EQ(*accept_length_between({}, parse_prometheus("tokenspeed_spec_accept_length 2.5\n")), 2.5);
  // vLLM: accepted draft tokens per draft, plus the bonus token.
  EXPECT_DOUBLE_EQ(*accept_length_between({}, parse_prometheus("vllm:spec_decode_num_accepted_tokens_total 30\n"
                                                                "vllm:spec_decode_num_drafts_total 20\n")),
                   2.5);
  EXPECT_FALSE(accept_length_between({}, parse_prometheus("tokenspeed_requests_total 5\n")).has_value());
}

TEST(AgenticConfig, ParseLists) {
  EXPECT_EQ(parse_int_list("1,2,4, 8"), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(parse_range("12"), (std::pair<int, int>{12, 12}));
  EXPECT_EQ(parse_range("10-15"), (std::pair<int, int>{10, 15}));
  EXPECT_THROW(parse_int_list("1,,2"), ts::Error);
  EXPECT_THROW(parse_int_list("x"), ts::Error);
  EXPECT_THROW(parse_range("15-10"), ts::Error);
  EXPECT_THROW(parse_range("a-b"), ts::Error);
}

TEST(AgenticMetrics, KvTierHitRatesFromMetricsDeltas) {
  LevelResult L;
  L.prompt_tokens = 1000;
  std::map<std::string, double> before = {{"tokenspeed_prefix_cache_device_hit_tokens_total", 100},
                                          {"tokenspeed_prefix_cache_host_hit_tokens_total", 0},
                                          {"tokenspeed_kvstore_loaded_bytes_total", 0}};
  std::map<std::string, double> after = {{"tokenspeed_prefix_cache_device_hit_tokens_total", 400},
                                         {"tokenspeed_prefix_cache_host_hit_tokens_total", 500},
                                         {"tokenspeed_kvstore_loaded_bytes_total", 2e9}};
  tier_stats_between(before, after, L);
  EXPECT_DOUBLE_EQ(*L.device_hit_rate, 0.3);
  EXPECT_DOUBLE_EQ(*L.host_hit_rate, 0.5);
  EXPECT_DOUBLE_EQ(*L.host_loaded_gb, 2.0);
  LevelResult other;  // another engine: no counters, nulls
  other.prompt_tokens = 10;
  tier_stats_between({}, {{"vllm:num_requests_running", 1}}, other);
  EXPECT_FALSE(other.device_hit_rate || other.host_hit_rate || other.host_loaded_gb);
}
