// libFuzzer target: a chat template (the Jinja sandbox) rendered against a typical context.
// Bad templates must fail with TemplateError; the sandbox limits (recursion, loop iterations,
// output size, string size, range) must stop runaway templates quickly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string src(reinterpret_cast<const char*>(data), size);
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                  "function": {"name": "f", "arguments": {"a": [1, 2, {"b": null}]}}}]},
                 {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
              "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  try {
    auto t = ts::chat::Template::parse(src);
    ts::chat::RenderOptions o;
    o.now = std::tm{};
    (void)t.render(ctx, o);
  } catch (const ts::Error&) {
  }
  return 0;
}
