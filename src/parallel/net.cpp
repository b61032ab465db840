#include "parallel/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace ts::parallel::net {

namespace {

std::string errno_str(int e) { return std::strerror(e); }

int ms_until(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) freeaddrinfo(head);
  }
};

// Resolves host:port; passive (bind) when host is empty.
void resolve(const std::string& host, int port, bool passive, AddrList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const std::string p = std::to_string(port);
  const char* h = host.empty() || host == "0.0.0.0" ? (passive ? nullptr : "127.0.0.1") : host.c_str();
  if (host == "0.0.0.0") hints.ai_family = AF_INET;
  int rc = getaddrinfo(h, p.c_str(), &hints, &out.head);
  TS_CHECK(rc == 0 && out.head, "cannot resolve address {}:{}: {}", host, port, gai_strerror(rc));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string addr_host(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace

std::string HostPort::str() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

HostPort parse_host_port(const std::string& s, const char* flag) {
  HostPort hp;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    TS_CHECK(close != std::string::npos && close + 1 < s.size() && s[close + 1] == ':',
             "{} '{}': expected host:port or [ipv6]:port", flag, s);
    hp.host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    TS_CHECK(colon != std::string::npos && colon > 0 && s.find(':') == colon, "{} '{}': expected host:port", flag, s);
    hp.host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  TS_CHECK(!port.empty() && port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5,
           "{} '{}': the port must be a number in 1..65535", flag, s);
  hp.port = std::stoi(port);
  TS_CHECK(hp.port >= 1 && hp.port <= 65535, "{} '{}': the port must be in 1..65535", flag, s);
  return hp;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Socket listen_tcp(const std::string& host, int port, int backlog) {
  AddrList al;
  resolve(host, port, true, al);
  int last = 0;
  for (addrinfo* a = al.head; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last = errno;
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd(), backlog) == 0) return s;
    last = errno;
  }
  fail("cannot listen on {}: {}", HostPort{host.empty() ? "0.0.0.0" : host, port}.str(), errno_str(last));
}

int bound_port(const Socket& s) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  TS_CHECK(getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) == 0, "getsockname: {}", errno_str(errno));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string local_host(const Socket& s) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  TS_CHECK(getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) == 0, "getsockname: {}", errno_str(errno));
  return addr_host(reinterpret_cast<sockaddr*>(&ss));
}

std::string outbound_host(const HostPort& to) {
  AddrList al;
  resolve(to.host, to.port, false, al);
  for (addrinfo* a = al.head; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s.valid() || ::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) continue;
    return local_host(s);
  }
  fail("no route from this host to {}", to.str());
}

Socket accept_until(const Socket& listener, Clock::time_point deadline) {
  while (true) {
    pollfd p{listener.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc == 0) return Socket();
    if (rc < 0) {
      if (errno == EINTR) continue;
      fail("accept: poll failed: {}", errno_str(errno));
    }
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      fail("accept failed: {}", errno_str(errno));
    }
    set_nodelay(fd);
    return Socket(fd);
  }
}

Socket connect_until(const HostPort& to, Clock::time_point deadline, const char* what) {
  const auto start = Clock::now();
  std::string last = "timed out";
  while (true) {
    AddrList al;
    resolve(to.host, to.port, false, al);
    for (addrinfo* a = al.head; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!s.valid()) {
        last = errno_str(errno);
        continue;
      }
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) {
        set_nodelay(s.fd());
        return s;
      }
      last = errno_str(errno);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  fail("{}: could not connect to {} within {:.0f} s (last error: {})", what, to.str(), waited, last);
}

void send_all(const Socket& s, const void* data, size_t n, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(s.fd(), p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("{}: send failed: {}", what, errno_str(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

bool recv_all(const Socket& s, void* data, size_t n, const char* what, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    if (deadline != Clock::time_point::max()) {
      pollfd pf{s.fd(), POLLIN, 0};
      int rc = ::poll(&pf, 1, ms_until(deadline));
      if (rc == 0) fail("{}: timed out waiting for the peer", what);
      if (rc < 0) {
        if (errno == EINTR) continue;
        fail("{}: poll failed: {}", what, errno_str(errno));
      }
    }
    ssize_t r = ::recv(s.fd(), p + got, n - got, 0);
    if (r == 0) {
      if (got == 0) return false;
      fail("{}: the peer closed the connection in the middle of a message", what);
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (got == 0 && (errno == ECONNRESET || errno == EPIPE)) return false;
      fail("{}: receive failed: {}", what, errno_str(errno));
    }
    got += size_t(r);
  }
  return true;
}

}  // namespace ts::parallel::net
