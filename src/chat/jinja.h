// A Jinja interpreter for Hugging Face chat templates, byte-exact with what transformers renders:
// jinja2's ImmutableSandboxedEnvironment with trim_blocks + lstrip_blocks, the loopcontrols
// extension, and transformers' globals (raise_exception, strftime_now) and tojson filter.
// Values behave like the Python objects jinja2 works on (str(), repr(), truthiness, `+`, `in`, ...),
// because chat templates print them and the rendered prompt must match token for token.
//
// Parse once, render many times: a Template is immutable after parse() and render() is const and
// thread-safe (each call keeps its state on its own stack), so one Template serves all requests.
#pragma once
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ts::chat {

// A template failed to parse or render. `kind` names the Python exception jinja2 would raise
// (TemplateSyntaxError, TypeError, UndefinedError, SecurityError, ...; TemplateError for
// raise_exception), `message` is its text without position; what() reads
// "template error at line 3, column 12: TypeError: ...". line/col are 1-based (col counts characters).
struct TemplateError : ts::Error {
  TemplateError(std::string kind, std::string message, int line, int col);
  std::string kind;
  std::string message;
  int line = 0;
  int col = 0;
};

// A host function callable from a template: positional arguments arrive as a JSON array, keyword
// arguments as a JSON object; the result goes back into the template as a value.
using TemplateFunction =
    std::function<nlohmann::ordered_json(const nlohmann::ordered_json& args, const nlohmann::ordered_json& kwargs)>;

struct RenderOptions {
  // The calendar time strftime_now() formats; unset means the current local time.
  std::optional<std::tm> now;
  // Extra globals. Like jinja2 globals, a context variable of the same name hides them.
  std::map<std::string, TemplateFunction> functions;
};

class Template {
 public:
  // Throws TemplateError (kind TemplateSyntaxError) with the position of the offending token.
  static Template parse(const std::string& source);

  // `context` must be a JSON object; its keys become template variables (messages, tools,
  // add_generation_prompt, bos_token, ...). Key order is kept, since tojson prints dicts in order.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ts::chat
