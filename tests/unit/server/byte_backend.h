// Shared by the HTTP-layer tests that run against a scripted backend (no model): tokens are
// bytes + 1 (vocab 257), so prompts and replies read as text in assertions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/backend.h"

// Chat templates need the Jinja engine (src/chat); skip where this build lacks it.
#if __has_include("chat/jinja.h")
#define NEED_JINJA() (void)0
#else
#define NEED_JINJA() GTEST_SKIP() << "no Jinja engine in this build"
#endif

namespace ts::server::fake {

class ByteBackend : public Backend {
 public:
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c + 1);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id - 1);
    return s;
  }
  int64_t vocab_size() const override { return 257; }
};

}  // namespace ts::server::fake
