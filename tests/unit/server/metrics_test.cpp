#include <gtest/gtest.h>
#include <sstream>
#include <string>

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
        "tokenspeed_inter_token_latency_seconds_count 0", "tokenspeed_http_requests_total{code=\"200\"} 1",
        // the caching device allocator (core/caching_allocator.h)
        "tokenspeed_device_malloc_calls_total{", "tokenspeed_device_free_calls_total{",
        "tokenspeed_device_alloc_cache_hits_total{", "tokenspeed_device_memory_in_use_bytes{",
        "tokenspeed_device_memory_cached_bytes{", "tokenspeed_host_pinned_alloc_calls_total{"})
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

TEST(Metrics, VllmNamesBesideTokenspeed) {
  EngineMetrics e;
  e.running = 3;
  e.waiting = 2;
  e.kv_usage = 0.5;
  e.prompt_tokens = 100;
  e.cached_prompt_tokens = 60;
  e.block_size = 16;
  e.prefix_host_hit_tokens = 32;
  e.kvstore_total_blocks = 64;
  e.kvstore_bytes_loaded = 4096;
  e.ttft_s = Histogram({0.5, 1.0});
  e.ttft_s.counts = {1, 2, 2};
  e.ttft_s.count = 2;
  e.ttft_s.sum = 1.25;
  e.queue_s = Histogram({1.0});
  ServerMetrics s;
  std::string out = render_prometheus(&e, s, "m");
  for (const char* needle :
       {"vllm:num_requests_running{model_name=\"m\"} 3\n", "vllm:num_requests_waiting{model_name=\"m\"} 2\n",
        "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", "# TYPE vllm:prefix_cache_queries_total counter\n",
        "vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n", "vllm:prefix_cache_hits_total{model_name=\"m\"} 60\n",
        "# TYPE vllm:time_to_first_token_seconds histogram\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n",
        "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 2\n",
        "vllm:request_queue_time_seconds_count{model_name=\"m\"} 0\n",
        "tokenspeed_prefix_cache_host_hit_tokens_total{model_name=\"m\"} 32\n",
        "tokenspeed_kvstore_total_blocks{model_name=\"m\"} 64\n",
        "tokenspeed_kvstore_loaded_bytes_total{model_name=\"m\"} 4096\n"})
    EXPECT_NE(out.find(needle), std::string::npos) << needle;
  // Text format 0.0.4: a family's samples carry its TYPE line's name (counters: both end in
  // _total, as prometheus_client writes them; histograms: _bucket/_sum/_count after the name).
  {
    std::istringstream in(out);
    std::string line, typed;
    int checked = 0;
    while (std::getline(in, line)) {
      if (line.rfind("# TYPE ", 0) == 0) {
        typed = line.substr(7, line.find(' ', 7) - 7);
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      const std::string name = line.substr(0, line.find_first_of("{ "));
      EXPECT_EQ(name.rfind(typed, 0), 0u) << "sample " << name << " under # TYPE " << typed;
      ++checked;
    }
    EXPECT_GT(checked, 20);
  }
  // Not before the model is loaded.
  EXPECT_EQ(render_prometheus(nullptr, s, "m").find("vllm:"), std::string::npos);
}
