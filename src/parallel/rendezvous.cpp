#include "parallel/rendezvous.h"

#include <cstring>
#include <map>

#include "core/error.h"
#include "parallel/net.h"

namespace ts::parallel {

namespace {

constexpr uint32_t kMagic = 0x5a525354;  // "TSRZ"
constexpr uint32_t kVersion = 1;

struct Hello {
  uint32_t magic = kMagic, version = kVersion;
  int32_t nnodes = 0, node_rank = 0;
  uint64_t blob_len = 0;
};
struct Reply {
  uint32_t magic = kMagic, status = 0;  // 0: ok (payload = every blob), 1: error (payload = message)
  uint64_t len = 0;
};

std::string pack(const std::vector<std::string>& blobs) {
  std::string out;
  uint32_t n = uint32_t(blobs.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  for (const auto& b : blobs) {
    uint64_t len = b.size();
    out.append(reinterpret_cast<const char*>(&len), 8);
    out.append(b);
  }
  return out;
}

std::vector<std::string> unpack(const std::string& s, int expect) {
  std::vector<std::string> out;
  size_t off = 0;
  auto take = [&](void* dst, size_t n) {
    TS_CHECK(off + n <= s.size(), "rendezvous: truncated reply from node 0");
    std::memcpy(dst, s.data() + off, n);
    off += n;
  };
  uint32_t n = 0;
  take(&n, 4);
  TS_CHECK(int(n) == expect, "rendezvous: node 0 answered with {} nodes, expected {}", n, expect);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t len = 0;
    take(&len, 8);
    TS_CHECK(off + len <= s.size(), "rendezvous: truncated reply from node 0");
    out.emplace_back(s.data() + off, size_t(len));
    off += size_t(len);
  }
  return out;
}

void send_reply(const net::Socket& s, uint32_t status, const std::string& payload) {
  Reply r;
  r.status = status;
  r.len = payload.size();
  net::send_all(s, &r, sizeof(r), "rendezvous reply");
  net::send_all(s, payload.data(), payload.size(), "rendezvous reply");
}

double seconds(std::chrono::milliseconds t) { return double(t.count()) / 1000.0; }

std::vector<std::string> serve(const DistInit& d, const net::HostPort& at, const std::string& blob) {
  net::Socket listener = net::listen_tcp(at.host, at.port);
  const auto deadline = net::Clock::now() + d.timeout;
  std::map<int, std::pair<net::Socket, std::string>> peers;  // node rank -> (connection, blob)
  auto fail_all = [&](const std::string& msg) {
    for (auto& [r, p] : peers) {
      try {
        send_reply(p.first, 1, msg);
      } catch (const Error&) {
      }
    }
    throw Error(msg);
  };
  while (int(peers.size()) < d.nnodes - 1) {
    net::Socket c = net::accept_until(listener, deadline);
    if (!c.valid()) {
      std::string missing;
      for (int r = 1; r < d.nnodes; ++r)
        if (!peers.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail_all(fmt::format("rendezvous at {}: {} of {} nodes joined within {:.0f} s; node rank(s) {} never connected "
                           "(started with --nnodes {} --dist-init-addr {}?)",
                           at.str(), peers.size() + 1, d.nnodes, seconds(d.timeout), missing, d.nnodes, d.addr));
    }
    Hello h;
    try {
      if (!net::recv_all(c, &h, sizeof(h), "rendezvous hello", deadline)) continue;
    } catch (const Error&) {
      continue;  // not one of ours (a port scan, a dead client): ignore it
    }
    if (h.magic != kMagic) continue;
    if (h.version != kVersion) fail_all(fmt::format("rendezvous: a node speaks protocol version {}, node 0 speaks {}", h.version, kVersion));
    std::string b(size_t(h.blob_len), '\0');
    if (!net::recv_all(c, b.data(), b.size(), "rendezvous hello", deadline)) continue;
    if (h.nnodes != d.nnodes) {
      send_reply(c, 1, fmt::format("node {} was started with --nnodes {}, node 0 with --nnodes {}", h.node_rank, h.nnodes, d.nnodes));
      fail_all(fmt::format("rendezvous: node {} was started with --nnodes {}, node 0 with --nnodes {}", h.node_rank,
                           h.nnodes, d.nnodes));
    }
    if (h.node_rank <= 0 || h.node_rank >= d.nnodes || peers.count(h.node_rank)) {
      std::string why = h.node_rank == 0 || peers.count(h.node_rank)
                            ? fmt::format("two nodes were started with --node-rank {}", h.node_rank)
                            : fmt::format("--node-rank {} is outside 0..{}", h.node_rank, d.nnodes - 1);
      send_reply(c, 1, why);
      fail_all("rendezvous: " + why);
    }
    peers.emplace(h.node_rank, std::make_pair(std::move(c), std::move(b)));
  }
  std::vector<std::string> all(size_t(d.nnodes));
  all[0] = blob;
  for (auto& [r, p] : peers) all[size_t(r)] = p.second;
  const std::string payload = pack(all);
  for (auto& [r, p] : peers) send_reply(p.first, 0, payload);
  return all;
}

std::vector<std::string> join(const DistInit& d, const net::HostPort& at, const std::string& blob) {
  const auto deadline = net::Clock::now() + d.timeout;
  net::Socket s = net::connect_until(at, deadline, fmt::format("node {}: rendezvous with node 0", d.node_rank).c_str());
  Hello h;
  h.nnodes = d.nnodes;
  h.node_rank = d.node_rank;
  h.blob_len = blob.size();
  net::send_all(s, &h, sizeof(h), "rendezvous hello");
  net::send_all(s, blob.data(), blob.size(), "rendezvous hello");
  Reply r;
  const std::string what = fmt::format("node {}: waiting for node 0 at {} to gather all {} nodes (timeout {:.0f} s)",
                                       d.node_rank, at.str(), d.nnodes, seconds(d.timeout));
  if (!net::recv_all(s, &r, sizeof(r), what.c_str(), deadline))
    fail("{}: node 0 closed the connection (it failed or gave up waiting for another node)", what);
  TS_CHECK(r.magic == kMagic, "node {}: {} is not a tokenspeed rendezvous", d.node_rank, at.str());
  std::string payload(size_t(r.len), '\0');
  if (!net::recv_all(s, payload.data(), payload.size(), what.c_str(), deadline))
    fail("{}: node 0 closed the connection", what);
  if (r.status != 0) fail("node {}: rendezvous refused by node 0: {}", d.node_rank, payload);
  return unpack(payload, d.nnodes);
}

}  // namespace

void check_dist_init(const DistInit& d) {
  TS_CHECK(d.nnodes >= 1, "--nnodes must be at least 1 (got {})", d.nnodes);
  TS_CHECK(d.node_rank >= 0 && d.node_rank < d.nnodes, "--node-rank {} is outside 0..{} (--nnodes {})", d.node_rank,
           d.nnodes - 1, d.nnodes);
  TS_CHECK(d.nnodes == 1 || !d.addr.empty(), "--nnodes {} needs --dist-init-addr host:port (node 0's address)",
           d.nnodes);
  TS_CHECK(d.timeout.count() > 0, "--dist-timeout must be positive");
  if (!d.addr.empty()) net::parse_host_port(d.addr, "--dist-init-addr");
}

std::vector<std::string> rendezvous_all_gather(const DistInit& d, const std::string& blob) {
  check_dist_init(d);
  if (d.nnodes == 1) return {blob};
  const net::HostPort at = net::parse_host_port(d.addr, "--dist-init-addr");
  return d.node_rank == 0 ? serve(d, at, blob) : join(d, at, blob);
}

}  // namespace ts::parallel
