#include <gtest/gtest.h>

#include "server/metrics.h"

using namespace ts;
using namespace ts::server;

TEST(Metrics, HistogramIsCumulative) {
  LatencyHistogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5, 2);
  h.observe(5);
  std::string out;
  h.render(out, "x_seconds", "help");
  EXPECT_NE(out.find("# TYPE x_seconds histogram"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_count 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_sum 6.05\n"), std::string::npos) << out;
}

TEST(Metrics, Exposition) {
  EngineMetrics e;
  e.requests_total = 3;
  e.running = 2;
  e.waiting = 1;
  e.kv_usage = 0.25;
  e.spec_verify_steps = 10;
  e.spec_accepted_tokens = 25;
  ServerMetrics s;
  s.ttft.observe(0.01);
  s.count_http(200);
  std::string out = render_prometheus(&e, s, "pycoder");
  for (const char* needle :
       {"tokenspeed_requests_total{model_name=\"pycoder\"} 3\n", "tokenspeed_num_requests_running{model_name=\"pycoder\"} 2\n",
        "tokenspeed_num_requests_waiting{model_name=\"pycoder\"} 1\n",
        "tokenspeed_kv_cache_usage_ratio{model_name=\"pycoder\"} 0.25\n",
        "tokenspeed_spec_decode_accepted_length{model_name=\"pycoder\"} 2.5\n", "tokenspeed_prompt_tokens_total",
        "tokenspeed_generation_tokens_total", "tokenspeed_cached_prompt_tokens_total", "tokenspeed_prefix_cache_hit_rate",
        "tokenspeed_engine_step_host_time_us", "tokenspeed_time_to_first_token_seconds_bucket{le=\"0.01\"} 1",
        "tokenspeed_inter_token_latency_seconds_count 0", "tokenspeed_http_requests_total{code=\"200\"} 1"})
    EXPECT_NE(out.find(needle), std::string::npos) << needle;
  // The engine's histograms win when it keeps them (cumulative counts).
  EngineMetrics h;
  h.ttft_s = Histogram({0.5, 1.0});
  h.ttft_s.counts = {2, 3, 4};
  h.ttft_s.count = 4;
  h.ttft_s.sum = 3.5;
  std::string ho = render_prometheus(&h, s, "m");
  EXPECT_NE(ho.find("tokenspeed_time_to_first_token_seconds_bucket{le=\"1\"} 3\n"), std::string::npos) << ho;
  EXPECT_NE(ho.find("tokenspeed_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << ho;
  EXPECT_NE(ho.find("tokenspeed_time_to_first_token_seconds_count 4\n"), std::string::npos) << ho;
  // No speculative metrics without speculative steps.
  EngineMetrics plain;
  EXPECT_EQ(render_prometheus(&plain, s, "m").find("spec_decode"), std::string::npos);
  EXPECT_NE(render_prometheus(nullptr, s, "m").find("tokenspeed_model_ready{model_name=\"m\"} 0"), std::string::npos);
}
