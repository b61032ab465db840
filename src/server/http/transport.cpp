#include "server/http/transport.h"

#include "server/http/request_parse.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "server/metrics.h"

namespace ts::server::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using Strand = net::strand<net::io_context::executor_type>;

namespace {

const char* reason_phrase(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return s < 300 ? "OK" : s < 500 ? "Client Error" : "Server Error";
  }
}

// The status line and headers. `length` < 0: no Content-Length (chunked, or close-delimited).
std::string head(const Reply& r, bool chunked, long long length, bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", r.status, reason_phrase(r.status), r.content_type);
  for (auto& [k, v] : r.headers) h += k + ": " + v + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  else if (length >= 0) h += fmt::format("Content-Length: {}\r\n", length);
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

std::string chunk(const std::string& data) { return fmt::format("{:x}\r\n", data.size()) + data + "\r\n"; }

net::steady_timer::duration secs(double s) {
  return std::chrono::duration_cast<net::steady_timer::duration>(std::chrono::duration<double>(s));
}

const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
}  // namespace

class Connection;

struct Transport::Impl : std::enable_shared_from_this<Transport::Impl> {
  Handler& handler;
  ServerMetrics& metrics;
  HttpLimits lim;
  int io_threads;
  double drain_s;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::thread_pool workers;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  net::steady_timer drain_timer{ioc}, hard_timer{ioc}, accept_retry{ioc};
  std::atomic<bool> in_run{false};  // inside Transport::run (its I/O threads may be running)
  std::atomic<bool> running{false}, stop_requested{false}, stopping{false}, deadline_passed{false}, finished{false};
  std::atomic<int> nconn{0};
  std::mutex mu;  // guards conns and per_ip
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
  // Engine output for connections (tags = Connection*): woken once per engine step that had
  // output, it posts one pump_marked() to the loop. Holds the Impl weakly: a stream that
  // outlives the transport keeps nothing of the I/O side alive, and a wake after shutdown
  // queues nothing that would hold it.
  struct Waker : StreamWaker {
    std::weak_ptr<Impl> im;
    void wake() override {
      auto t = im.lock();
      if (!t || t->finished.load()) return;
      net::post(t->ioc, [w = im] {
        if (auto t2 = w.lock()) t2->pump_marked();
      });
    }
  };
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();
  std::vector<uint64_t> marked;  // pump_marked's take buffer (guarded by marked_mu)
  std::mutex marked_mu;
  void pump_marked();
  std::unordered_map<std::string, int> per_ip;

  Impl(Handler& h, ServerMetrics& m, HttpLimits l, int io, int nworkers, double drain)
      : handler(h), metrics(m), lim(l), io_threads(std::max(io, 1)), drain_s(drain),
        workers(static_cast<size_t>(std::max(nworkers, 1))) {
    guard.emplace(ioc.get_executor());
  }

  void accept();
  void begin_stop();
  // With no I/O thread running: closes the acceptor and every connection, cancels the timers and
  // runs the aborted handlers until none is left. Every pending handler holds the Impl (or a
  // Connection, which holds it), and the Impl owns the io_context that holds the handlers: a
  // handler left queued is a reference cycle, i.e. the whole transport leaks at exit (ASan's
  // leak check found it). A connection destroyed here posts finish(): the loop runs that too.
  void quiesce();
  void finish() {
    if (finished.exchange(true)) return;
    guard.reset();
    ioc.stop();
  }
  template <class Fn>
  void each_connection(Fn&& fn);
  // Registers a new connection; returns 0, or the status to reject it with (503 / 429).
  int enter(Connection* c, const std::shared_ptr<Connection>& sp, const std::string& ip) {
    std::lock_guard<std::mutex> lk(mu);
    conns[c] = sp;
    int n = ++nconn;
    int per = ++per_ip[ip];
    metrics.connections_open = n;
    ++metrics.connections_total;
    if (lim.max_connections > 0 && n > lim.max_connections) return 503;
    if (lim.max_connections_per_ip > 0 && per > lim.max_connections_per_ip) return 429;
    return 0;
  }
  void leave(Connection* c, const std::string& ip) {
    int n;
    {
      std::lock_guard<std::mutex> lk(mu);
      conns.erase(c);
      auto it = per_ip.find(ip);
      if (it != per_ip.end() && --it->second <= 0) per_ip.erase(it);
      n = --nconn;
      metrics.connections_open = n;
    }
    if (n == 0 && stopping.load()) net::post(ioc, [self = shared_from_this()] { self->finish(); });
  }
};

// One client connection; every member runs on its strand (the socket's executor).
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Transport::Impl> t, tcp::socket s, std::string ip)
      : t_(std::move(t)), sock_(std::move(s)), ip_(std::move(ip)), timer_(sock_.get_executor()) {}
  ~Connection() { t_->leave(this, ip_); }
  auto executor() { return sock_.get_executor(); }
  void force_close() { close(); }
  // Engine output may be ready (Impl::pump_marked, on this connection's strand).
  void on_output() { pump(); }

  void start() {
    int reject_status = t_->enter(this, shared_from_this(), ip_);
    error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    if (reject_status == 503) return reject(503, "Too many open connections (--max-connections)", "connections");
    if (reject_status == 429)
      return reject(429, "Too many connections from this client address (--max-connections-per-ip)", "connections_per_ip");
    read_request();
  }

  // Posted to every connection when the drain starts: idle ones close, busy ones finish.
  void on_shutdown() {
    close_after_ = true;
    if (phase_ == Phase::idle) close();
  }
  // The drain deadline: busy ones end now, with their final bytes.
  void on_drain_deadline() {
    if (phase_ == Phase::respond && prod_ && !complete_) {
      std::string out;
      prod_->shutdown(out);
      finish_producer(out);
    } else if (phase_ != Phase::respond && phase_ != Phase::prepare && phase_ != Phase::lingering) {
      close();
    }
  }

 private:
  enum class Phase { idle, header, body, prepare, respond, lingering, closed };

  // --- timers ----------------------------------------------------------------------------------
  void arm(double s) {
    uint64_t g = ++timer_gen_;
    timer_.expires_after(secs(s));
    timer_.async_wait([self = shared_from_this(), g](error_code ec) {
      if (ec || g != self->timer_gen_) return;
      self->on_timeout();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }
  void on_timeout() {
    switch (phase_) {
      case Phase::idle:
        t_->metrics.count_limit("idle_timeout");
        close();
        break;
      case Phase::header:
      case Phase::body: {
        timed_out_ = true;
        error_code ec;
        sock_.cancel(ec);  // the read completes with operation_aborted and answers 408
        break;
      }
      case Phase::lingering: close(); break;
      case Phase::respond:  // a silent stream: a keep-alive comment, then wait again
        if (prod_ && prod_->streaming() && !complete_) {
          std::string k = prod_->keepalive();
          bool silent = std::chrono::steady_clock::now() - last_write_ >= secs(t_->lim.stream_keepalive_s / 2);
          if (!k.empty() && silent && !write_pending_) send(chunked_ ? chunk(k) : k);
          arm(t_->lim.stream_keepalive_s);
        }
        break;
      default: break;
    }
  }

  // --- reading a request -----------------------------------------------------------------------
  void read_request() {
    if (phase_ == Phase::closed) return;
    if (close_after_ || t_->stopping.load()) {
      if (buf_.size() == 0) return close();
    }
    parser_.emplace();
    configure_parser(*parser_, t_->lim);
    timed_out_ = false;
    if (buf_.size() > 0) return begin_header();
    buf_.shrink_to_fit();  // an idle connection keeps no buffer from its last request
    phase_ = Phase::idle;
    arm(t_->lim.idle_timeout_s);
    // Idle keep-alive connections hold no buffer: wait for readability, then parse.
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (self->phase_ != Phase::idle) return;
      if (ec) return self->close();
      self->begin_header();
    });
  }

  void begin_header() {
    phase_ = Phase::header;
    arm(t_->lim.header_timeout_s);
    bhttp::async_read_header(sock_, buf_, *parser_,
                             [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  // Maps a read error to an answer (or a silent close) and returns true when there was one.
  bool read_failed(error_code ec, const char* phase_name) {
    if (!ec) return false;
    if (timed_out_) {
      bool header = std::string_view(phase_name) == "header";
      reject(408,
             header ? "Timed out reading the request headers (--http-header-timeout)"
                    : "Timed out reading the request body (--http-body-timeout)",
             header ? "header_timeout" : "body_timeout");
    } else {
      switch (status_for_read_error(ec)) {
        case 431:
          reject(431, fmt::format("The request headers are larger than the limit of {} bytes (--max-header-bytes)",
                                  t_->lim.max_header_bytes),
                 "header_too_large");
          break;
        case 413:
          reject(413, fmt::format("The request body is larger than the limit of {} bytes (--max-request-bytes)",
                                  t_->lim.max_body_bytes),
                 "body_too_large");
          break;
        case 0: close(); break;
        default: reject(400, "Malformed HTTP request: " + ec.message(), "bad_request");
      }
    }
    return true;
  }

  void on_header(error_code ec) {
    if (phase_ == Phase::closed) return;
    disarm();
    if (read_failed(ec, "header")) return;
    auto& h = parser_->get();
    if (check_request_header(*parser_, t_->lim) == 414)
      return reject(414, fmt::format("The request target is longer than the limit of {} bytes (--max-uri-bytes)",
                                     t_->lim.max_uri_bytes),
                    "uri_too_long");
    if (parser_->is_done()) return on_request();
    phase_ = Phase::body;
    arm(t_->lim.body_timeout_s);
    auto expect = h[bhttp::field::expect];
    if (boost::beast::iequals(expect, "100-continue") && h.version() >= 11) {
      net::async_write(sock_, net::buffer(kContinue, sizeof(kContinue) - 1),
                       [self = shared_from_this()](error_code wec, size_t) {
                         if (self->phase_ != Phase::body) return;
                         if (wec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    bhttp::async_read(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      self->disarm();
      if (self->read_failed(ec, "body")) return;
      self->on_request();
    });
  }

  void on_request() {
    auto& msg = parser_->get();
    keep_alive_ = msg.keep_alive();
    version_ = static_cast<int>(msg.version());
    auto req = std::make_shared<Request>(to_request(*parser_, ip_));
    parser_.reset();
    phase_ = Phase::prepare;
    complete_ = false;
    if (t_->stopping.load()) {
      keep_alive_ = false;
      return respond(Result{t_->handler.error_reply(503, "The server is shutting down"), nullptr});
    }
    Result res;
    bool inline_done = false;
    try {
      inline_done = t_->handler.handle_inline(*req, res);
    } catch (const std::exception& e) {
      res = Result{t_->handler.error_reply(500, e.what()), nullptr};
      inline_done = true;
    }
    if (inline_done) return respond(std::move(res));
    // CPU-heavy preparation off the I/O threads; meanwhile watch for a hang-up.
    arm_disconnect_read();
    net::post(t_->workers, [self = shared_from_this(), req] {
      auto r = std::make_shared<Result>(self->t_->handler.prepare(*req));
      net::post(self->sock_.get_executor(), [self, r] { self->on_prepared(std::move(*r)); });
    });
  }

  void on_prepared(Result r) {
    if (phase_ != Phase::prepare) {  // the client went away meanwhile
      if (r.producer) r.producer->cancel();
      return;
    }
    if (r.producer && t_->deadline_passed.load()) {
      r.producer->cancel();
      keep_alive_ = false;
      r = Result{t_->handler.error_reply(503, "The server is shutting down"), nullptr};
    }
    respond(std::move(r));
  }

  // --- answering ---------------------------------------------------------------------------------
  bool keep() const { return keep_alive_ && !close_after_ && !t_->stopping.load(); }

  void send_reply(const Reply& r) {
    t_->metrics.count_http(r.status);
    send(head(r, false, static_cast<long long>(r.body.size()), keep()) + r.body);
  }

  void respond(Result r) {
    phase_ = Phase::respond;
    if (!r.producer) {
      send_reply(r.reply);
      complete_ = true;
      return;
    }
    prod_ = std::move(r.producer);
    if (prod_->streaming()) {
      chunked_ = version_ >= 11;
      if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends with the connection
      t_->metrics.count_http(r.reply.status);
      send(head(r.reply, chunked_, -1, keep()));
      arm(t_->lim.stream_keepalive_s);
    }
    arm_disconnect_read();
    // The streams mark this connection on the transport's waker (the tag is its address,
    // looked up in `conns` when the marks are taken: a connection gone by then is skipped).
    prod_->start(t_->waker, reinterpret_cast<uint64_t>(this));
    pump();
  }

  // Takes what the producer has ready; runs again after each write and on each wake.
  void pump() {
    if (phase_ != Phase::respond || !prod_ || complete_ || write_pending_) return;
    std::string out;
    bool done = prod_->poll(out);
    if (prod_->streaming()) {
      if (done) return finish_producer(out);
      if (!out.empty()) send(chunked_ ? chunk(out) : out);
    } else if (done) {
      finish_producer(out);
    }
  }

  void finish_producer(std::string& out) {
    if (prod_->streaming()) {
      std::string bytes = out.empty() ? "" : (chunked_ ? chunk(out) : out);
      if (chunked_) bytes += "0\r\n\r\n";
      complete_ = true;
      send(bytes);
    } else {
      Reply rep = prod_->reply();
      complete_ = true;
      send_reply(rep);
    }
    prod_.reset();
  }

  void send(const std::string& bytes) {
    wbuf_ += bytes;
    if (!write_pending_) flush();
  }

  void flush() {
    if (wbuf_.empty()) return;
    inflight_.swap(wbuf_);
    wbuf_.clear();
    write_pending_ = true;
    last_write_ = std::chrono::steady_clock::now();
    net::async_write(sock_, net::buffer(inflight_), [self = shared_from_this()](error_code ec, size_t) {
      self->write_pending_ = false;
      self->inflight_.clear();
      if (self->phase_ == Phase::closed) return;
      if (ec) return self->client_gone();
      if (!self->wbuf_.empty()) return self->flush();
      if (self->complete_) return self->finish_response();
      self->pump();
    });
  }

  void finish_response() {
    complete_ = false;
    prod_.reset();
    if (!keep()) return graceful_close();
    if (read_pending_) {  // the hang-up watch: cancel it, its handler starts the next request
      want_next_ = true;
      error_code ec;
      sock_.cancel(ec);
      return;
    }
    read_request();
  }

  // One read kept pending while a request is prepared or answered: EOF/reset = the client went
  // away. What it reads is kept (pipelined requests), up to max_pipelined_bytes.
  void arm_disconnect_read() {
    if (read_pending_ || phase_ == Phase::closed) return;
    if (phase_ != Phase::lingering && buf_.size() >= t_->lim.max_pipelined_bytes) return;
    read_pending_ = true;
    sock_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->on_raw_read(ec, n);
    });
  }

  void on_raw_read(error_code ec, size_t n) {
    read_pending_ = false;
    buf_.commit(n);
    if (phase_ == Phase::closed) return;
    if (phase_ == Phase::lingering) {
      buf_.consume(buf_.size());
      lingered_ += n;
      if (ec || lingered_ > (64u << 20)) return close();
      return arm_disconnect_read();
    }
    if (ec && ec != net::error::operation_aborted) return client_gone();
    if (want_next_) {
      want_next_ = false;
      return read_request();
    }
    if (phase_ == Phase::prepare || phase_ == Phase::respond) arm_disconnect_read();
  }

  void client_gone() {
    if (phase_ == Phase::closed) return;
    if (prod_) {
      prod_->cancel();
      ++t_->metrics.client_disconnects;
    } else if (phase_ == Phase::prepare) {
      ++t_->metrics.client_disconnects;  // on_prepared cancels what was submitted
    }
    prod_.reset();
    close();
  }

  // An error answer, then a lingering close (so the client reads it before any reset).
  void reject(int status, const std::string& message, const char* reason) {
    t_->metrics.count_limit(reason);
    keep_alive_ = false;
    phase_ = Phase::respond;
    complete_ = true;
    parser_.reset();
    send_reply(t_->handler.error_reply(status, message));
  }

  // Half-close and discard what the client still sends for a moment: closing with unread data
  // would reset the connection and could destroy the answer in flight.
  void graceful_close() {
    phase_ = Phase::lingering;
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    arm(2.0);
    if (!read_pending_) {  // else the pending read's handler discards
      buf_.consume(buf_.size());
      arm_disconnect_read();
    }
  }

  void close() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    disarm();
    if (prod_) prod_->cancel();
    prod_.reset();
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  std::shared_ptr<Transport::Impl> t_;
  tcp::socket sock_;
  std::string ip_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  boost::beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::idle;
  bool timed_out_ = false, read_pending_ = false, want_next_ = false, write_pending_ = false;
  bool keep_alive_ = true, close_after_ = false, complete_ = false, chunked_ = false;
  int version_ = 11;
  size_t lingered_ = 0;
  std::chrono::steady_clock::time_point last_write_{};
  std::string wbuf_, inflight_;
  std::unique_ptr<Producer> prod_;
};

template <class Fn>
void Transport::Impl::each_connection(Fn&& fn) {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [p, w] : conns)
      if (auto c = w.lock()) all.push_back(std::move(c));
  }
  for (auto& c : all) fn(c);
}

void Transport::Impl::pump_marked() {
  std::vector<uint64_t> tags;
  {
    // `marked` keeps its capacity across takes and the waker swaps it with its own list, so
    // the engine's marks never allocate; the copy out (this thread's) lets two I/O threads
    // pump at once.
    std::lock_guard<std::mutex> lk(marked_mu);
    waker->take(marked);
    tags.assign(marked.begin(), marked.end());
  }
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  std::vector<std::shared_ptr<Connection>> live;
  live.reserve(tags.size());
  {
    std::lock_guard<std::mutex> lk(mu);
    for (uint64_t t : tags) {
      auto it = conns.find(reinterpret_cast<Connection*>(t));
      if (it == conns.end()) continue;
      if (auto c = it->second.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) net::dispatch(c->executor(), [c] { c->on_output(); });
}

void Transport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](error_code ec, tcp::socket s) {
    if (self->stopping.load() || !self->acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (or a transient error): back off instead of spinning.
      spdlog::warn("accept: {}", ec.message());
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](error_code) { self->accept(); });
      return;
    }
    error_code rec;
    auto ep = s.remote_endpoint(rec);
    std::string ip = rec ? std::string("?") : ep.address().to_string();
    auto c = std::make_shared<Connection>(self, std::move(s), ip);
    net::dispatch(c->executor(), [c] { c->start(); });
    self->accept();
  });
}

void Transport::Impl::quiesce() {
  for (int round = 0; round < 16; ++round) {
    error_code ec;
    acceptor.close(ec);
    drain_timer.cancel();
    hard_timer.cancel();
    accept_retry.cancel();
    each_connection([](const std::shared_ptr<Connection>& c) { c->force_close(); });
    ioc.restart();
    if (ioc.poll() == 0) return;
  }
}

void Transport::Impl::begin_stop() {
  if (stopping.exchange(true)) return;
  error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  spdlog::info("http: draining {} connection(s) (up to {:.0f} s)", nconn.load(), drain_s);
  each_connection([](const std::shared_ptr<Connection>& c) {
    net::post(c->executor(), [c] { c->on_shutdown(); });
  });
  drain_timer.expires_after(secs(drain_s));
  drain_timer.async_wait([self = shared_from_this()](error_code e) {
    if (e) return;
    self->deadline_passed = true;
    spdlog::warn("http: drain timeout: ending {} connection(s)", self->nconn.load());
    self->each_connection([](const std::shared_ptr<Connection>& c) {
      net::post(c->executor(), [c] { c->on_drain_deadline(); });
    });
    self->hard_timer.expires_after(std::chrono::seconds(3));
    self->hard_timer.async_wait([self](error_code e2) {
      if (!e2) self->finish();
    });
  });
  if (nconn.load() == 0) finish();
}

Transport::Transport(Handler& handler, ServerMetrics& metrics, HttpLimits limits, int io_threads, int workers,
                     double drain_timeout_s)
    : impl_(std::make_shared<Impl>(handler, metrics, limits, io_threads, workers, drain_timeout_s)) {
  impl_->waker->im = impl_;
}

Transport::~Transport() {
  stop();
  impl_->workers.join();
  // run() has returned (or never ran): release what the queued handlers hold (see quiesce).
  if (!impl_->in_run.load()) impl_->quiesce();
}

int Transport::bind(const std::string& host, int port) {
  try {
    tcp::resolver res(impl_->ioc);
    auto eps = res.resolve(host, std::to_string(port), tcp::resolver::passive);
    error_code ec;
    for (auto& e : eps) {
      tcp::endpoint ep = e.endpoint();
      impl_->acceptor.open(ep.protocol(), ec);
      if (ec) continue;
      impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
      impl_->acceptor.bind(ep, ec);
      if (!ec) {
        impl_->acceptor.listen(4096, ec);
        if (!ec) return impl_->acceptor.local_endpoint().port();
      }
      error_code ec2;
      impl_->acceptor.close(ec2);
    }
    fail("cannot bind {}:{} ({})", host, port, ec ? ec.message() : "no address");
  } catch (const boost::system::system_error& e) {
    fail("cannot bind {}:{} ({})", host, port, e.what());
  }
}

void Transport::run() {
  auto& im = *impl_;
  if (im.stop_requested.load()) return;
  im.in_run = true;
  im.accept();
  im.running = true;
  std::vector<std::thread> threads;
  for (int i = 1; i < im.io_threads; ++i) threads.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
  im.running = false;
  // Connections still open at the hard deadline: close them here (no I/O thread runs now), then
  // run the aborted handlers so they release their connections (and those their producers).
  im.quiesce();
  im.in_run = false;
}

void Transport::stop() {
  auto im = impl_;
  if (im->stop_requested.exchange(true)) return;
  net::post(im->ioc, [im] { im->begin_stop(); });  // run() not started yet: it returns at once
}

bool Transport::running() const { return impl_->running.load(); }
int Transport::open_connections() const { return impl_->nconn.load(); }

}  // namespace ts::server::http
