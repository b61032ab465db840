// libFuzzer target: an HTTP request body through the OpenAI request validation, as the server
// runs it (parse_body, then the chat or completions parser). Client errors are ApiError (400/404)
// or ts::Error; anything else escaping (a nlohmann type_error, a crash) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "server/protocol.h"

using namespace ts::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  ModelInfo info{"m", "/models/m", 4096, 1000};
  try {
    Json j = parse_body(body);
    if (j.contains("messages")) {
      ChatRequest r = parse_chat_request(j, info);
      (void)dump(r.messages);
    } else {
      auto encode = [](const std::string& s) {
        std::vector<int32_t> ids;
        for (unsigned char c : s) ids.push_back(c);
        return ids;
      };
      auto decode = [](const std::vector<int32_t>& ids) { return std::string(ids.size(), 'x'); };
      CompletionRequest r = parse_completion_request(j, info, encode, decode);
      (void)r;
    }
  } catch (const ApiError&) {
  } catch (const ts::Error&) {
  }
  return 0;
}
