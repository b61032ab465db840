// Errors: the engine throws ts::Error with a one-line message that names the file, tensor or
// field at fault; the CLI prints it and exits non-zero, the server turns it into a JSON error.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace ts {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A request the client got wrong (maps to HTTP 4xx); `param` names the offending field.
class InvalidRequest : public Error {
 public:
  InvalidRequest(const std::string& msg, std::string param = "", int status = 400)
      : Error(msg), param_(std::move(param)), status_(status) {}
  const std::string& param() const { return param_; }
  int status() const { return status_; }

 private:
  std::string param_;
  int status_;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define TS_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::ts::fail(__VA_ARGS__);   \
  } while (0)

}  // namespace ts
