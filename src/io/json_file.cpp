#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ts::io {

int json_depth(std::string_view s, int limit) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;  // skip the escaped character (\" does not end the string)
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > limit) return limit + 1;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

void check_json_depth(std::string_view text, int limit, std::string_view what) {
  if (json_depth(text, limit) > limit) fail("{}: JSON nesting deeper than {} levels", what, limit);
}

std::string json_error_text(const std::exception& e) {
  std::string w = e.what();
  if (w.rfind("[json.exception.", 0) == 0) {
    auto pos = w.find("] ");
    if (pos != std::string::npos) return w.substr(pos + 2);
  }
  return w;
}

int open_regular_file(const std::string& path, size_t& size) {
  // O_NONBLOCK: opening a FIFO with no writer must not hang; it is rejected by fstat below.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat ({})", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    fail("{}: is {}, expected a regular file", path, kind);
  }
  // Back to blocking reads (no effect on regular files, but keeps read() semantics plain).
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  size = size_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  size_t size = 0;
  int fd = open_regular_file(path, size);
  if (size > max_bytes) {
    ::close(fd);
    fail("{}: file too large ({} bytes, limit {})", path, size, max_bytes);
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      fail("{}: read failed ({})", path, n == 0 ? "file shrank while reading" : std::strerror(err));
    }
    got += size_t(n);
  }
  ::close(fd);
  return out;
}

nlohmann::json parse_json_text(std::string_view text, const std::string& name, int max_depth) {
  check_json_depth(text, max_depth, name);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", name, json_error_text(e));
  }
}

nlohmann::json read_json_file(const std::string& path, int max_depth) {
  return parse_json_text(read_regular_file(path), path, max_depth);
}

}  // namespace ts::io
