// Small blocking TCP helpers for the multi-node bootstrap (rendezvous.h) and the CPU backend's
// cross-process transport (cpu_transport.h): listen, accept and connect with deadlines, and
// whole-buffer send/receive. POSIX sockets, IPv4 and IPv6 (getaddrinfo). Every failure is a
// ts::Error naming the peer address and what went wrong.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ts::parallel::net {

using Clock = std::chrono::steady_clock;

// "host:port" (or "[v6]:port"); `flag` names the option in errors (e.g. "--dist-init-addr").
struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;
};
HostPort parse_host_port(const std::string& s, const char* flag);

// An owned socket descriptor (closed on destruction; movable).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Shuts both directions down (wakes a thread blocked in recv on this socket).
  void shutdown();

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0: an ephemeral port; host "" or "0.0.0.0": every interface).
Socket listen_tcp(const std::string& host, int port, int backlog = 64);
// The port a listening socket is bound to.
int bound_port(const Socket& s);
// The local address of a connected socket (the interface that reaches its peer).
std::string local_host(const Socket& s);
// The local address this host would use to reach `to` (a UDP route lookup; sends nothing).
std::string outbound_host(const HostPort& to);
// Waits for one connection until `deadline`; returns an invalid socket on timeout.
Socket accept_until(const Socket& listener, Clock::time_point deadline);
// Connects, retrying refused/unreachable attempts every ~100 ms until `deadline`; throws an
// error that names the address, the last failure and the time waited.
Socket connect_until(const HostPort& to, Clock::time_point deadline, const char* what);

// Sends all n bytes (MSG_NOSIGNAL: a closed peer is an error, not a signal).
void send_all(const Socket& s, const void* data, size_t n, const char* what);
// Receives exactly n bytes. Returns false when the peer closed the connection before the first
// byte (a clean end of stream); throws on errors, on a close mid-message and at the deadline
// (Clock::time_point::max(): no deadline).
bool recv_all(const Socket& s, void* data, size_t n, const char* what,
              Clock::time_point deadline = Clock::time_point::max());

}  // namespace ts::parallel::net
