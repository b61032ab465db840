// The event-driven HTTP/1.1 front door (Boost.Asio + Boost.Beast's request parser): a few I/O
// threads own every connection, a small worker pool runs the CPU-heavy request preparation
// (JSON parse, chat template, tokenisation, submit), and engine streams wake their connections
// through one StreamWaker (core/stream_waker.h: one post per engine step, whatever the number of
// streams with output) — nothing polls and no thread waits per request.
//
// Per connection (one strand, so its handlers never run concurrently):
//   idle --first byte--> headers --(Expect: 100-continue)--> body --> [prepare on a worker]
//        --> respond (buffered reply, or chunked SSE pumped from a Producer) --> idle (keep-alive)
// While a request is prepared or answered the connection keeps one read pending: EOF/reset
// means the client went away and its Producer is cancelled (the engine aborts the request at
// its next step). Bytes that arrive meanwhile are pipelined requests, answered in order after
// the current response (up to HttpLimits::max_pipelined_bytes read ahead).
// Shutdown (stop()): stop accepting, close idle connections, let in-flight responses finish
// for drain_timeout_s, then make every Producer write its final bytes and close.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/stream_waker.h"
#include "server/http/limits.h"

namespace ts::server {
struct ServerMetrics;
}

namespace ts::server::http {

struct Request {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query
  std::string path;     // target without the query, percent-decoded
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_ip;
};

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// A response made over time (an engine request). Every call but wake() runs on the owning
// connection's strand, one at a time.
class Producer {
 public:
  virtual ~Producer() = default;
  virtual bool streaming() const = 0;  // chunked SSE, or one buffered Reply at the end
  // Called once: attach the producer's engine streams to `waker` under `tag`
  // (Stream::set_waker), so that the engine's output wakes this connection (coalesced with the
  // other connections' output of the same step: one post to the loop per step).
  virtual void start(const std::shared_ptr<StreamWaker>& waker, uint64_t tag) = 0;
  // Takes what is ready. Streaming: appends body bytes to `out`. Returns true once complete
  // (streaming: the last bytes are in `out`; buffered: reply() is ready).
  virtual bool poll(std::string& out) = 0;
  virtual Reply reply() = 0;  // buffered only, after poll() returned true
  virtual void cancel() = 0;  // the client went away: abort the engine requests
  // Drain deadline: abort and finish now. Streaming: appends the final bytes (an error event
  // and [DONE]) to `out`; buffered: reply() then answers 503.
  virtual void shutdown(std::string& out) = 0;
  // Streaming: bytes to send after a silence of HttpLimits::stream_keepalive_s (an SSE comment),
  // so that proxies and clients with read timeouts keep a queued stream open.
  virtual std::string keepalive() { return {}; }
};

struct Result {
  Reply reply;                          // streaming: status, content type and headers of the stream
  std::unique_ptr<Producer> producer;   // null: `reply` is the whole answer
};

class Handler {
 public:
  virtual ~Handler() = default;
  // On an I/O thread, must be cheap (routing, /health, /metrics, admission control): true with
  // `out` filled, or false to have prepare() run on the worker pool.
  virtual bool handle_inline(const Request& req, Result& out) = 0;
  virtual Result prepare(Request& req) = 0;  // on a worker thread; must not throw
  // The error body for a transport-level rejection (limits, timeouts, shutdown).
  virtual Reply error_reply(int status, const std::string& message) = 0;
};

class Transport {
 public:
  Transport(Handler& handler, ServerMetrics& metrics, HttpLimits limits, int io_threads, int workers,
            double drain_timeout_s);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int bind(const std::string& host, int port);  // returns the bound port; throws ts::Error
  void run();        // serves until stop() has drained; returns on the calling thread
  void stop();       // thread-safe, idempotent: starts the drain
  bool running() const;
  int open_connections() const;

  struct Impl;  // public for the connections in transport.cpp; opaque elsewhere

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ts::server::http
