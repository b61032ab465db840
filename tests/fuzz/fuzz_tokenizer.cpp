// libFuzzer target: tokenizer.json text; a tokenizer that loads must then encode and decode
// without crashing (decode of its own ids must not throw).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<ts::tok::Tokenizer> t;
  try {
    t = ts::tok::Tokenizer::from_json_string(text, "tokenizer.json");
  } catch (const ts::Error&) {
    return 0;
  }
  for (const char* s : {"Hello world! 123", " \xe4\xbd\xa0\xe5\xa5\xbd <s>", "\xff\xfe bad utf8"}) {
    std::vector<int32_t> ids;
    try {
      ids = t->encode(s, true);
    } catch (const ts::Error&) {
      continue;  // e.g. an unk_token missing from the vocab: a clean error
    }
    (void)t->decode(ids, false);
    (void)t->decode(ids, true);
  }
  return 0;
}
