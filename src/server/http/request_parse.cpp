#include "server/http/request_parse.h"

#include <boost/asio/error.hpp>
#include <boost/asio/buffer.hpp>

namespace ts::server::http {

namespace bhttp = boost::beast::http;
namespace net = boost::asio;

void configure_parser(RequestParser& p, const HttpLimits& lim) {
  p.header_limit(static_cast<uint32_t>(lim.max_header_bytes));
  p.body_limit(lim.max_body_bytes);
}

int check_request_header(const RequestParser& p, const HttpLimits& lim) {
  return p.get().target().size() > lim.max_uri_bytes ? 414 : 0;
}

int status_for_read_error(const boost::system::error_code& ec) {
  if (ec == bhttp::error::header_limit) return 431;
  if (ec == bhttp::error::body_limit) return 413;
  if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset || ec == bhttp::error::partial_message)
    return 0;
  return 400;
}

namespace {
int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int a = hexval(s[i + 1]), b = hexval(s[i + 2]);
      if (a >= 0 && b >= 0) {
        out += static_cast<char>(a * 16 + b);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

Request to_request(RequestParser& p, std::string remote_ip) {
  auto& msg = p.get();
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  std::string_view tv(msg.target().data(), msg.target().size());
  req.path = percent_decode(tv.substr(0, tv.find('?')));
  for (auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  req.body = std::move(msg.body());
  req.remote_ip = std::move(remote_ip);
  return req;
}

ParseOutcome parse_one(std::string_view bytes, const HttpLimits& lim) {
  RequestParser p;
  configure_parser(p, lim);
  ParseOutcome out;
  boost::system::error_code ec;
  bool header_checked = false;
  // Beast consumes what it can per put(); need_more means feed the rest (as the async read does
  // when more bytes arrive — here there are no more).
  while (out.consumed < bytes.size() && !p.is_done()) {
    size_t n = p.put(net::buffer(bytes.data() + out.consumed, bytes.size() - out.consumed), ec);
    out.consumed += n;
    if (ec == bhttp::error::need_more) {
      ec = {};
      if (n == 0) break;  // no progress: the rest is an incomplete element
      continue;
    }
    if (ec) {
      out.status = status_for_read_error(ec);
      if (out.status == 0) out.status = 400;  // a whole buffer that does not parse
      return out;
    }
    if (!header_checked && p.is_header_done()) {
      header_checked = true;
      if (int s = check_request_header(p, lim)) {
        out.status = s;
        return out;
      }
    }
  }
  if (!p.is_done()) return out;  // incomplete
  if (!header_checked)
    if (int s = check_request_header(p, lim)) {
      out.status = s;
      return out;
    }
  out.request = to_request(p, "fuzz");
  return out;
}

}  // namespace ts::server::http
