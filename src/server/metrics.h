// /metrics: Prometheus text exposition (version 0.0.4) of the engine's counters and gauges plus
// the latency histograms the HTTP layer observes per request (cumulative since start).
#pragma once
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ts::server {

class LatencyHistogram {
 public:
  explicit LatencyHistogram(std::vector<double> bounds);  // upper bounds, ascending (+Inf implied)
  void observe(double v, int64_t count = 1);
  // Appends # HELP/# TYPE and the _bucket/_sum/_count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  int64_t n_ = 0;
};

struct ServerMetrics {
  ServerMetrics();
  LatencyHistogram ttft, itl, e2e;              // seconds
  void count_http(int status);
  std::atomic<int64_t> generate_requests{0};  // completions + chat requests accepted (before n / batch fan-out)
  // The front door: open connections, accepted ever, requests whose client hung up before the
  // answer was complete (they are aborted), admitted requests waiting for their first token.
  std::atomic<int64_t> connections_open{0}, connections_total{0}, client_disconnects{0}, queued_requests{0};
  // A limit breach (HttpLimits) or timeout, by reason ("body_too_large", "header_timeout", ...).
  void count_limit(const std::string& reason);
  std::map<int, int64_t> http_by_status;
  std::map<std::string, int64_t> limit_by_reason;
  std::mutex mu;
};

// The full exposition: engine snapshot (may be null while the model loads) + server metrics.
std::string render_prometheus(const EngineMetrics* engine, ServerMetrics& server, const std::string& model_name);

}  // namespace ts::server
