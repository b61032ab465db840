#include "parallel/cpu_transport.h"

#include <cstring>

#include "core/error.h"

namespace ts::parallel {

namespace {

constexpr uint32_t kFrameMagic = 0x46435354;  // "TSCF"
constexpr uint32_t kHandshakeMagic = 0x54435354;  // "TSCT"

struct Frame {
  uint32_t magic = kFrameMagic;
  int32_t src = 0, dst = 0;
  uint32_t pad = 0;
  uint64_t tag = 0, bytes = 0;
};
struct Handshake {
  uint32_t magic = kHandshakeMagic;
  int32_t node = 0, world = 0, local = 0;
};

double seconds(std::chrono::milliseconds t) { return double(t.count()) / 1000.0; }

}  // namespace

CpuTransport::CpuTransport(int world, int first, int local, std::chrono::milliseconds timeout)
    : world_(world), first_(first), local_(local), timeout_(timeout) {
  TS_CHECK(world >= 1 && local >= 1 && first >= 0 && first + local <= world, "cpu transport: ranks [{}, {}) of {}", first,
           first + local, world);
  for (int i = 0; i < local; ++i) boxes_.push_back(std::make_unique<Mailbox>());
}

std::shared_ptr<CpuTransport> CpuTransport::local(int world, std::chrono::milliseconds timeout) {
  return std::shared_ptr<CpuTransport>(new CpuTransport(world, 0, world, timeout));
}

std::shared_ptr<CpuTransport> CpuTransport::connect(const DistInit& d, int local_ranks) {
  check_dist_init(d);
  TS_CHECK(local_ranks >= 1, "cpu transport: {} ranks per node", local_ranks);
  auto t = std::shared_ptr<CpuTransport>(
      new CpuTransport(d.nnodes * local_ranks, d.node_rank * local_ranks, local_ranks, d.timeout));
  if (d.nnodes == 1) return t;
  t->links_.resize(size_t(d.nnodes));
  // This node's endpoint: every interface, an ephemeral port, advertised under the address
  // that routes towards node 0 (on one machine: loopback).
  const net::HostPort init = net::parse_host_port(d.addr, "--dist-init-addr");
  net::Socket listener = net::listen_tcp("", 0);
  const std::string me = net::HostPort{net::outbound_host(init), net::bound_port(listener)}.str();
  const std::string ranks = std::to_string(local_ranks);
  std::vector<std::string> all = rendezvous_all_gather(d, ranks + "@" + me);
  const auto deadline = net::Clock::now() + d.timeout;
  for (int n = 0; n < d.nnodes; ++n) {
    const std::string& b = all[size_t(n)];
    const size_t at = b.find('@');
    TS_CHECK(at != std::string::npos, "cpu transport: bad endpoint '{}' from node {}", b, n);
    TS_CHECK(b.substr(0, at) == ranks, "cpu transport: node {} hosts {} ranks, node {} hosts {}: every node must run the "
             "same number of ranks", n, b.substr(0, at), d.node_rank, ranks);
  }
  Handshake hs;
  hs.node = d.node_rank;
  hs.world = t->world_;
  hs.local = local_ranks;
  // Lower nodes first (their listeners queue our connection even before they accept), then
  // accept the higher ones: no node waits on another's accept.
  for (int n = 0; n < d.nnodes; ++n) {
    if (n == d.node_rank) continue;
    auto link = std::make_unique<Link>();
    if (n < d.node_rank) {
      const std::string& b = all[size_t(n)];
      net::HostPort to = net::parse_host_port(b.substr(b.find('@') + 1), "cpu transport endpoint");
      link->sock = net::connect_until(to, deadline, fmt::format("node {}: connecting to node {}", d.node_rank, n).c_str());
      net::send_all(link->sock, &hs, sizeof(hs), "cpu transport handshake");
      t->links_[size_t(n)] = std::move(link);
    }
  }
  for (int pending = d.nnodes - 1 - d.node_rank; pending > 0; --pending) {
    net::Socket c = net::accept_until(listener, deadline);
    TS_CHECK(c.valid(), "node {}: a higher node did not open its data connection within {:.0f} s", d.node_rank,
             seconds(d.timeout));
    Handshake h;
    TS_CHECK(net::recv_all(c, &h, sizeof(h), "cpu transport handshake", deadline) && h.magic == kHandshakeMagic,
             "node {}: bad data-connection handshake", d.node_rank);
    TS_CHECK(h.node > d.node_rank && h.node < d.nnodes && !t->links_[size_t(h.node)] && h.world == t->world_,
             "node {}: unexpected data connection from node {} (world {})", d.node_rank, h.node, h.world);
    auto link = std::make_unique<Link>();
    link->sock = std::move(c);
    t->links_[size_t(h.node)] = std::move(link);
  }
  for (int n = 0; n < d.nnodes; ++n)
    if (t->links_[size_t(n)]) t->links_[size_t(n)]->reader = std::thread([tp = t.get(), n] { tp->read_loop(n); });
  return t;
}

CpuTransport::~CpuTransport() {
  closing_ = true;
  for (auto& l : links_)
    if (l) l->sock.shutdown();
  for (auto& l : links_)
    if (l && l->reader.joinable()) l->reader.join();
}

void CpuTransport::deliver(int src, int dst, uint64_t tag, const void* data, size_t bytes) {
  Mailbox& box = *boxes_[size_t(dst - first_)];
  std::vector<char> buf;
  {
    std::lock_guard<std::mutex> lk(box.mu);
    if (!box.pool.empty()) {
      buf = std::move(box.pool.back());
      box.pool.pop_back();
    }
  }
  buf.resize(bytes);
  if (bytes) std::memcpy(buf.data(), data, bytes);
  {
    std::lock_guard<std::mutex> lk(box.mu);
    box.queues[{src, tag}].push_back(std::move(buf));
  }
  box.cv.notify_all();
}

void CpuTransport::send(int src, int dst, uint64_t tag, const void* data, size_t bytes) {
  TS_CHECK(is_local(src) && dst >= 0 && dst < world_, "cpu transport: send from rank {} to rank {} (world {}, local "
           "ranks [{}, {}))", src, dst, world_, first_, first_ + local_);
  if (is_local(dst)) {
    deliver(src, dst, tag, data, bytes);
    return;
  }
  Link& l = *links_[size_t(node_of(dst))];
  TS_CHECK(!l.dead, "rank {}: cannot send to rank {} (node {}): {}", src, dst, node_of(dst), l.why);
  Frame f;
  f.src = src;
  f.dst = dst;
  f.tag = tag;
  f.bytes = bytes;
  std::lock_guard<std::mutex> lk(l.send_mu);
  net::send_all(l.sock, &f, sizeof(f), "cpu transport send");
  net::send_all(l.sock, data, bytes, "cpu transport send");
}

void CpuTransport::recv(int dst, int src, uint64_t tag, void* data, size_t bytes, const char* what) {
  TS_CHECK(is_local(dst) && src >= 0 && src < world_, "cpu transport: recv at rank {} from rank {} (world {})", dst, src,
           world_);
  Mailbox& box = *boxes_[size_t(dst - first_)];
  const Link* link = is_local(src) ? nullptr : links_[size_t(node_of(src))].get();
  std::unique_lock<std::mutex> lk(box.mu);
  auto& q = box.queues[{src, tag}];
  const bool ok = box.cv.wait_for(lk, timeout_, [&] { return !q.empty() || (link && link->dead); });
  if (q.empty()) {
    if (link && link->dead)
      fail("{}: rank {} lost rank {} (node {}): {}", what, dst, src, node_of(src), link->why);
    TS_CHECK(ok, "{}: rank {} waited {:.0f} s for rank {}{} and gave up (a rank that stopped, or ranks that issued "
             "different collectives)", what, dst, seconds(timeout_), src,
             is_local(src) ? "" : fmt::format(" on node {}", node_of(src)));
  }
  std::vector<char> buf = std::move(q.front());
  q.pop_front();
  if (buf.size() != bytes) {
    const size_t got = buf.size();
    box.pool.push_back(std::move(buf));
    fail("{}: rank {} expected {} bytes from rank {} but got {} (tensor shapes or counts differ across ranks)", what,
         dst, bytes, src, got);
  }
  if (bytes) std::memcpy(data, buf.data(), bytes);
  box.pool.push_back(std::move(buf));
}

void CpuTransport::link_failed(int node, const std::string& why) {
  Link& l = *links_[size_t(node)];
  l.why = why;
  l.dead = true;
  for (auto& b : boxes_) {
    std::lock_guard<std::mutex> lk(b->mu);  // orders `dead` with a waiter's predicate check
    b->cv.notify_all();
  }
}

void CpuTransport::read_loop(int node) {
  Link& l = *links_[size_t(node)];
  try {
    while (true) {
      Frame f;
      if (!net::recv_all(l.sock, &f, sizeof(f), "cpu transport receive")) {
        link_failed(node, closing_ ? "transport closed" : "node closed the connection (it exited or failed)");
        return;
      }
      TS_CHECK(f.magic == kFrameMagic && is_local(f.dst) && node_of(f.src) == node,
               "cpu transport: corrupt frame from node {} (src {}, dst {})", node, f.src, f.dst);
      Mailbox& box = *boxes_[size_t(f.dst - first_)];
      std::vector<char> buf;
      {
        std::lock_guard<std::mutex> lk(box.mu);
        if (!box.pool.empty()) {
          buf = std::move(box.pool.back());
          box.pool.pop_back();
        }
      }
      buf.resize(size_t(f.bytes));
      if (f.bytes && !net::recv_all(l.sock, buf.data(), buf.size(), "cpu transport receive"))
        fail("node {} closed the connection in the middle of a message", node);
      {
        std::lock_guard<std::mutex> lk(box.mu);
        box.queues[{f.src, f.tag}].push_back(std::move(buf));
      }
      box.cv.notify_all();
    }
  } catch (const std::exception& e) {
    link_failed(node, closing_ ? std::string("transport closed") : std::string(e.what()));
  }
}

}  // namespace ts::parallel
