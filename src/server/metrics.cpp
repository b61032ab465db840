#include "server/metrics.h"

#include <cmath>
#include <fmt/format.h>

#include "core/device_memory.h"

namespace ts::server {

namespace {
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}
void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& labels,
            double v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name, labels, num(v));
}
// ts::Histogram counts are cumulative already (counts[i] = observations <= bounds[i], last = +Inf).
void render_engine_histogram(std::string& out, const Histogram& h, const std::string& name, const std::string& help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  for (size_t i = 0; i < h.bounds.size(); ++i)
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(h.bounds[i]), h.counts[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.counts.back(), name, num(h.sum),
                     name, h.count);
}
// The same with labels on every line (the vLLM names carry model_name): `lab` is `k="v"`.
void render_labeled_histogram(std::string& out, const Histogram& h, const std::string& name, const std::string& help,
                              const std::string& lab) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  for (size_t i = 0; i < h.bounds.size(); ++i)
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, lab, num(h.bounds[i]), h.counts[i]);
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, lab,
                     h.counts.empty() ? 0 : h.counts.back(), name, lab, num(h.sum), name, lab, h.count);
}
// A counter as prometheus_client writes the 0.0.4 text format (vLLM's /metrics): HELP, TYPE and
// the sample all name `family`_total (a TYPE line naming the family without it leaves the sample
// untyped for strict parsers such as Go's expfmt).
void counter(std::string& out, const char* family, const char* help, const std::string& labels, double v) {
  out += fmt::format("# HELP {}_total {}\n# TYPE {}_total counter\n{}_total{} {}\n", family, help, family, family, labels,
                     num(v));
}

// The names fleet routers and dashboards read from vLLM (llm-d, the Gateway API Inference
// Extension, Dynamo, vLLM's Grafana boards), with vLLM's semantics: usage as a fraction,
// prefix-cache queries/hits in tokens, latency histograms per request.
void render_vllm(std::string& out, const EngineMetrics& e, const std::string& model_name) {
  const std::string lab = fmt::format("model_name=\"{}\"", model_name), l = "{" + lab + "}";
  metric(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", l, e.running);
  metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", l, e.waiting);
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l, e.kv_usage);
  counter(out, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", l,
          static_cast<double>(e.prompt_tokens));
  counter(out, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", l,
          static_cast<double>(e.cached_prompt_tokens));
  counter(out, "vllm:prompt_tokens", "Number of prefill tokens processed.", l, static_cast<double>(e.prompt_tokens));
  counter(out, "vllm:generation_tokens", "Number of generation tokens processed.", l,
          static_cast<double>(e.generation_tokens));
  counter(out, "vllm:num_preemptions", "Cumulative number of preemptions from the engine.", l,
          static_cast<double>(e.retractions));
  auto hist = [&](const Histogram& h, const char* name, const char* help) {
    if (!h.bounds.empty() && h.counts.size() == h.bounds.size() + 1) render_labeled_histogram(out, h, name, help, lab);
  };
  hist(e.ttft_s, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.");
  hist(e.itl_s, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.");
  hist(e.e2e_s, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.");
  hist(e.queue_s, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.");
  hist(e.prefill_s, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.");
  hist(e.decode_s, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.");
}

// The host KV tier (KvStore) and the per-tier prefix hits.
void render_kvstore(std::string& out, const EngineMetrics& e, const std::string& l) {
  metric(out, "tokenspeed_prefix_cache_device_hit_tokens_total", "counter",
         "Prompt tokens of admitted requests found in the device KV tier (first admission).", l,
         static_cast<double>(e.prefix_device_hit_tokens));
  metric(out, "tokenspeed_prefix_cache_host_hit_tokens_total", "counter",
         "Prompt tokens of admitted requests found in the host KV tier and loaded back (first admission).", l,
         static_cast<double>(e.prefix_host_hit_tokens));
  metric(out, "tokenspeed_kvstore_hit_blocks_total", "counter",
         "Host-tier blocks found by prefix lookups and loaded (retried and re-admitted lookups included).", l,
         static_cast<double>(e.prefix_host_hit_blocks));
  metric(out, "tokenspeed_host_cached_prompt_tokens_total", "counter",
         "Of the cached prompt tokens of finished requests, those loaded from the host KV tier.", l,
         static_cast<double>(e.host_cached_prompt_tokens));
  metric(out, "tokenspeed_kvstore_total_blocks", "gauge", "Blocks in the host KV tier (0: off).", l,
         static_cast<double>(e.kvstore_total_blocks));
  metric(out, "tokenspeed_kvstore_used_blocks", "gauge", "Host KV tier blocks holding a cached prefix block.", l,
         static_cast<double>(e.kvstore_used_blocks));
  metric(out, "tokenspeed_kvstore_writeback_blocks_total", "counter", "Device blocks written back to the host tier.", l,
         static_cast<double>(e.kvstore_writeback_blocks));
  metric(out, "tokenspeed_kvstore_written_bytes_total", "counter", "Bytes copied device -> host tier.", l,
         static_cast<double>(e.kvstore_bytes_written));
  metric(out, "tokenspeed_kvstore_loaded_bytes_total", "counter", "Bytes copied host tier -> device.", l,
         static_cast<double>(e.kvstore_bytes_loaded));
  metric(out, "tokenspeed_kvstore_load_seconds_total", "counter",
         "Copy seconds of completed host-tier loads (CUDA: device time on rank 0's load stream).", l,
         e.kvstore_load_seconds);
  metric(out, "tokenspeed_kvstore_load_completed_bytes_total", "counter",
         "Bytes of completed host-tier loads (over tokenspeed_kvstore_load_seconds_total: the load GB/s).", l,
         static_cast<double>(e.kvstore_loaded_bytes_done));
  metric(out, "tokenspeed_kvstore_load_batches_total", "counter", "Engine steps that loaded blocks from the host tier.",
         l, static_cast<double>(e.kvstore_load_batches));
  metric(out, "tokenspeed_kvstore_staged_steps_total", "counter",
         "Engine steps that ran other requests' rows while an admitted request waited for its host-tier load.", l,
         static_cast<double>(e.kvstore_staged_steps));
  metric(out, "tokenspeed_kvstore_loaded_requests_total", "counter",
         "Finished requests whose prefix was partly loaded from the host tier.", l,
         static_cast<double>(e.kvstore_loaded_requests));
  // {model_name="m"} -> {model_name="m",phase="..."}
  const std::string lp = l.empty() ? "{phase=\"" : l.substr(0, l.size() - 1) + ",phase=\"";
  out += "# HELP tokenspeed_kvstore_loaded_request_seconds_total Time to first token of host-tier hits by phase: "
         "queue (submit -> admission), load (admission -> blocks loaded), prefill (loaded -> first token).\n"
         "# TYPE tokenspeed_kvstore_loaded_request_seconds_total counter\n";
  for (auto [ph, v] : {std::pair<const char*, double>{"queue", e.kvstore_loaded_queue_s},
                       {"load", e.kvstore_loaded_load_s}, {"prefill", e.kvstore_loaded_prefill_s}})
    out += fmt::format("tokenspeed_kvstore_loaded_request_seconds_total{}{}\"}} {}\n", lp, ph, num(v));
}
}  // namespace

LatencyHistogram::LatencyHistogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void LatencyHistogram::observe(double v, int64_t count) {
  if (count <= 0) return;
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lk(mu_);
  counts_[i] += count;
  sum_ += v * static_cast<double>(count);
  n_ += count;
}

void LatencyHistogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, num(bounds_[i]), cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, num(sum_), name, n_);
}

ServerMetrics::ServerMetrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
           0.5, 0.75, 1, 2.5}),
      e2e({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}) {}

void ServerMetrics::count_http(int status) {
  std::lock_guard<std::mutex> lk(mu);
  ++http_by_status[status];
}

void ServerMetrics::count_limit(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu);
  ++limit_by_reason[reason];
}

std::string render_prometheus(const EngineMetrics* e, ServerMetrics& s, const std::string& model_name) {
  std::string out;
  std::string l = fmt::format("{{model_name=\"{}\"}}", model_name);
  metric(out, "tokenspeed_model_ready", "gauge", "1 once the model is loaded and serving.", l, e ? 1 : 0);
  if (e) {
    metric(out, "tokenspeed_requests_total", "counter", "Generation requests submitted to the engine.", l,
           static_cast<double>(e->requests_total));
    metric(out, "tokenspeed_requests_finished_total", "counter", "Requests that finished (stop or length).", l,
           static_cast<double>(e->requests_finished));
    metric(out, "tokenspeed_requests_aborted_total", "counter", "Requests aborted (client gone, cancel, error).", l,
           static_cast<double>(e->requests_aborted));
    metric(out, "tokenspeed_prompt_tokens_total", "counter", "Prompt tokens processed.", l,
           static_cast<double>(e->prompt_tokens));
    metric(out, "tokenspeed_generation_tokens_total", "counter", "Tokens generated.", l,
           static_cast<double>(e->generation_tokens));
    metric(out, "tokenspeed_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache.", l,
           static_cast<double>(e->cached_prompt_tokens));
    metric(out, "tokenspeed_num_requests_running", "gauge", "Requests in the running batch.", l, e->running);
    metric(out, "tokenspeed_num_requests_waiting", "gauge", "Requests waiting to be scheduled.", l, e->waiting);
    metric(out, "tokenspeed_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use.", l, e->kv_usage);
    metric(out, "tokenspeed_kv_cache_total_blocks", "gauge", "KV cache blocks in the pool.", l,
           static_cast<double>(e->kv_total_blocks));
    metric(out, "tokenspeed_kv_cache_used_blocks", "gauge", "KV cache blocks in use.", l,
           static_cast<double>(e->kv_used_blocks));
    metric(out, "tokenspeed_prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens.", l,
           e->prefix_hit_rate);
    metric(out, "tokenspeed_engine_step_host_time_us", "gauge", "Engine thread CPU time per step (microseconds, EWMA).", l,
           e->step_host_us_mean);
    metric(out, "tokenspeed_engine_step_host_seconds_total", "counter",
           "Engine thread CPU time spent in steps (plan, batch build, apply), all steps.", l, e->step_host_seconds);
    metric(out, "tokenspeed_engine_steps_total", "counter", "Engine steps run.", l, static_cast<double>(e->steps));
    metric(out, "tokenspeed_engine_overlap_steps_total", "counter",
           "Engine steps launched while the previous step was still running (overlap scheduling).", l,
           static_cast<double>(e->overlap_steps));
    {
      // {model_name="m"} -> {model_name="m",kind="..."}
      const std::string lk = l.substr(0, l.size() - 1) + ",kind=\"";
      static constexpr const char* kKinds[3] = {"decode", "mixed", "prefill"};
      out += "# HELP tokenspeed_engine_steps_by_kind_total Engine steps by what they carried: decode only, mixed "
             "(decodes + prefill chunks), prefill only.\n# TYPE tokenspeed_engine_steps_by_kind_total counter\n";
      for (size_t k = 0; k < 3; ++k)
        out += fmt::format("tokenspeed_engine_steps_by_kind_total{}{}\"}} {}\n", lk, kKinds[k], e->steps_by_kind[k]);
      out += "# HELP tokenspeed_engine_step_seconds_by_kind_total Device seconds (forward + sampling) of engine steps by "
             "kind.\n# TYPE tokenspeed_engine_step_seconds_by_kind_total counter\n";
      for (size_t k = 0; k < 3; ++k)
        out += fmt::format("tokenspeed_engine_step_seconds_by_kind_total{}{}\"}} {}\n", lk, kKinds[k],
                           num(e->step_seconds_by_kind[k]));
    }
    metric(out, "tokenspeed_engine_step_decode_rows_total", "counter",
           "Decode rows over all engine steps (/ decode + mixed steps: the mean decode batch).", l,
           static_cast<double>(e->step_decode_rows));
    metric(out, "tokenspeed_engine_step_prefill_tokens_total", "counter", "Prefill tokens over all engine steps.", l,
           static_cast<double>(e->step_prefill_tokens));
    metric(out, "tokenspeed_device_idle_seconds_total", "counter",
           "Seconds the device sat idle between consecutive engine steps (not counting idle server time).", l,
           e->device_idle_seconds);
    metric(out, "tokenspeed_device_busy_seconds_total", "counter", "Seconds of engine steps on the device.", l,
           e->device_busy_seconds);
    metric(out, "tokenspeed_device_idle_between_steps_us", "gauge",
           "Mean device idle time between consecutive engine steps (microseconds, moving average).", l,
           e->device_idle_us_mean);
    {
      const std::string lk = l.substr(0, l.size() - 1);
      static constexpr const char* kKinds[3] = {"decode", "mixed", "prefill"};
      out += "# HELP tokenspeed_device_idle_seconds_by_step_total Device idle seconds before engine steps, by the "
             "step's kind and launch (overlap: launched while the previous step ran; sync: with none in flight).\n"
             "# TYPE tokenspeed_device_idle_seconds_by_step_total counter\n";
      for (size_t k = 0; k < 3; ++k)
        for (size_t b = 0; b < 2; ++b)
          out += fmt::format("tokenspeed_device_idle_seconds_by_step_total{},kind=\"{}\",launch=\"{}\"}} {}\n", lk,
                             kKinds[k], b == 0 ? "overlap" : "sync", num(e->device_idle_seconds_by[k][b]));
      render_engine_histogram(out, e->device_idle_gap_s, "tokenspeed_device_idle_gap_seconds",
                              "Device idle gaps between consecutive engine steps.");
    }
    {
      // The device caching allocator (core/caching_allocator.h): in steady state the cudaMalloc
      // and cudaFree counters stand still.
      const DeviceMemoryStats dm = device_memory_stats();
      metric(out, "tokenspeed_device_malloc_calls_total", "counter",
             "cudaMalloc calls made by the caching device allocator (cache misses).", l, static_cast<double>(dm.malloc_calls));
      metric(out, "tokenspeed_device_free_calls_total", "counter",
             "cudaFree calls made by the caching device allocator (empty_cache, graph-capture blocks).", l,
             static_cast<double>(dm.free_calls));
      metric(out, "tokenspeed_device_alloc_cache_hits_total", "counter", "Device allocations served from the cache.", l,
             static_cast<double>(dm.cache_hits));
      metric(out, "tokenspeed_device_memory_in_use_bytes", "gauge", "Device memory held by live tensors (allocator blocks).",
             l, static_cast<double>(dm.bytes_in_use));
      metric(out, "tokenspeed_device_memory_cached_bytes", "gauge", "Device memory kept in the allocator's free lists.", l,
             static_cast<double>(dm.bytes_cached));
      metric(out, "tokenspeed_host_pinned_alloc_calls_total", "counter", "cudaMallocHost calls (pinned staging buffers).", l,
             static_cast<double>(dm.pinned_alloc_calls));
    }
    metric(out, "tokenspeed_retractions_total", "counter", "Requests preempted (retracted) for lack of KV blocks.", l,
           static_cast<double>(e->retractions));
    render_kvstore(out, *e, l);
    if (e->spec_verify_steps > 0) {
      metric(out, "tokenspeed_spec_decode_verify_steps_total", "counter", "Speculative verify steps.", l,
             static_cast<double>(e->spec_verify_steps));
      metric(out, "tokenspeed_spec_decode_accepted_tokens_total", "counter", "Tokens accepted by verification.", l,
             static_cast<double>(e->spec_accepted_tokens));
      metric(out, "tokenspeed_spec_decode_accepted_length", "gauge", "Mean tokens accepted per verify step.", l,
             static_cast<double>(e->spec_accepted_tokens) / static_cast<double>(e->spec_verify_steps));
      metric(out, "tokenspeed_spec_decode_graph_steps_total", "counter",
             "Speculative decode steps replayed as CUDA graphs (draft steps, verify, catch-up).", l,
             static_cast<double>(e->spec_graph_steps));
      metric(out, "tokenspeed_spec_decode_draft_seconds_total", "counter",
             "Device seconds in the draft model on fixed-shape decode steps (draft steps + catch-up).", l,
             e->spec_draft_seconds);
      metric(out, "tokenspeed_spec_decode_verify_seconds_total", "counter",
             "Device seconds in the target verify on fixed-shape decode steps.", l, e->spec_verify_seconds);
      metric(out, "tokenspeed_spec_decode_timed_steps_total", "counter",
             "Fixed-shape decode steps the draft/verify seconds cover (greedy graph steps: one in 8).", l,
             static_cast<double>(e->spec_timed_steps));
    }
  }
  // Latency histograms: the engine's (measured on the engine thread) when it keeps them, else the
  // ones the HTTP layer observes.
  auto hist = [&](const Histogram* eh, const LatencyHistogram& sh, const char* name, const char* help) {
    if (eh && !eh->bounds.empty() && eh->counts.size() == eh->bounds.size() + 1) render_engine_histogram(out, *eh, name, help);
    else sh.render(out, name, help);
  };
  hist(e ? &e->ttft_s : nullptr, s.ttft, "tokenspeed_time_to_first_token_seconds", "Time to first token.");
  hist(e ? &e->itl_s : nullptr, s.itl, "tokenspeed_inter_token_latency_seconds", "Time between output tokens.");
  hist(e ? &e->e2e_s : nullptr, s.e2e, "tokenspeed_e2e_request_latency_seconds", "End-to-end request latency.");
  if (e) render_vllm(out, *e, model_name);
  metric(out, "tokenspeed_http_generate_requests_total", "counter",
         "Completion and chat requests accepted by the HTTP layer (before n / batch fan-out).", l,
         static_cast<double>(s.generate_requests.load()));
  metric(out, "tokenspeed_http_connections_open", "gauge", "Open client connections.", l,
         static_cast<double>(s.connections_open.load()));
  metric(out, "tokenspeed_http_connections_total", "counter", "Client connections accepted.", l,
         static_cast<double>(s.connections_total.load()));
  metric(out, "tokenspeed_http_client_disconnects_total", "counter",
         "Requests whose client went away before the answer was complete (aborted).", l,
         static_cast<double>(s.client_disconnects.load()));
  metric(out, "tokenspeed_http_queued_requests", "gauge",
         "Generation requests admitted and waiting for their first token (--max-queued-requests).", l,
         static_cast<double>(s.queued_requests.load()));
  out += "# HELP tokenspeed_http_limit_rejections_total Requests or connections refused by an HTTP limit or timeout.\n"
         "# TYPE tokenspeed_http_limit_rejections_total counter\n";
  {
    std::lock_guard<std::mutex> lk(s.mu);
    for (auto& [reason, n] : s.limit_by_reason)
      out += fmt::format("tokenspeed_http_limit_rejections_total{{reason=\"{}\"}} {}\n", reason, n);
  }
  out += "# HELP tokenspeed_http_requests_total HTTP responses by status code.\n"
         "# TYPE tokenspeed_http_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lk(s.mu);
    for (auto& [code, n] : s.http_by_status)
      out += fmt::format("tokenspeed_http_requests_total{{code=\"{}\"}} {}\n", code, n);
  }
  return out;
}

}  // namespace ts::server
