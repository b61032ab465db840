// Reading one HTTP/1.1 request with the front door's limits: the pieces a connection uses on its
// asynchronous reads (transport.cpp), and the same pieces driven synchronously over a byte string
// (parse_one) for the fuzz target and unit tests — so what is fuzzed is what serves.
#pragma once
#include <boost/beast/http.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "server/http/limits.h"
#include "server/http/transport.h"

namespace ts::server::http {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// A fresh parser for the next request: header and body caps from `lim` (chunked bodies count
// against max_body_bytes too: Beast's body_limit covers every transfer encoding).
void configure_parser(RequestParser& p, const HttpLimits& lim);

// After the header is read: 0 when it is within the limits, else the status to answer (414).
int check_request_header(const RequestParser& p, const HttpLimits& lim);

// The status a read error answers (431, 413, 400), or 0 when the connection just closes (the
// peer went away mid-request: end of stream, reset, partial message). Timeouts are the caller's.
int status_for_read_error(const boost::system::error_code& ec);

// The finished message as the handler's Request (the body is moved out of the parser).
Request to_request(RequestParser& p, std::string remote_ip);

// %XX decoding of a path (invalid escapes stay as they are).
std::string percent_decode(std::string_view s);

// One request from the front of `bytes`, parsed as a connection would. status 0 with a request:
// parsed, `consumed` bytes used (what follows is the next pipelined request). status 0 without
// one: the bytes end before the request does. Otherwise the status the connection answers.
struct ParseOutcome {
  int status = 0;
  size_t consumed = 0;
  std::optional<Request> request;
};
ParseOutcome parse_one(std::string_view bytes, const HttpLimits& lim);

}  // namespace ts::server::http
