// Chat templates for /v1/chat/completions: where the template comes from and how it is rendered.
// Resolution (model_chat_templates, as transformers loads them): --chat-template FILE; else
// chat_template.jinja (it replaces tokenizer_config.json's); else tokenizer_config.json
// "chat_template" (a string, or a list of {name, template}); else chat_template.json; then
// additional_chat_templates/NAME.jinja add or replace named ones. "tool_use" is used when the
// request has tools and it exists, else "default", else the first.
// The context is what transformers passes: messages, tools, add_generation_prompt, bos_token,
// eos_token (strings from tokenizer_config.json), plus chat_template_kwargs.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/protocol.h"

namespace ts::chat {
class Template;
}

namespace ts::server {

// One named template source of a model directory.
struct TemplateSource {
  std::string name;    // "default", "tool_use", ...
  std::string source;  // the Jinja text
  std::string origin;  // the file (and entry) it came from
};
// The model directory's templates in the order above (empty: none). Throws ts::Error only for an
// unreadable file (a FIFO, a directory named like a template).
std::vector<TemplateSource> model_chat_templates(const std::string& model_dir);
// The entry a render uses: "tool_use" when `has_tools` and it exists, else "default", else the
// first (nullptr: none).
const TemplateSource* pick_template(const std::vector<TemplateSource>& all, bool has_tools);

class ChatTemplates {
 public:
  // Throws ts::Error when `template_file` is given but cannot be read or parsed. A template from
  // the model directory that fails to parse is kept as an error each chat request reports (400).
  static ChatTemplates load(const std::string& model_dir, const std::string& template_file = "");
  // Builds from sources directly (tests): an empty default means "no template".
  static ChatTemplates from_sources(const std::string& default_src, const std::string& tool_use_src = "",
                                    const std::string& bos = "", const std::string& eos = "");

  bool available() const { return default_ != nullptr; }
  const std::string& origin() const { return origin_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

  // The prompt text. Throws ApiError 400 when there is no template (naming --chat-template) or
  // when the template raises (with its message).
  std::string render(const Json& messages, const Json& tools, const Json& kwargs,
                     bool add_generation_prompt = true) const;
  // A chat request's prompt: its messages, tools and chat_template_kwargs, add_generation_prompt,
  // and continue_final_message (vLLM / transformers): the final message left open so the model
  // continues it -- rendered without a generation prompt, then cut right after the final
  // message's text (its last occurrence, leading and trailing whitespace as the template kept
  // them); 400 when the template does not reproduce that text. An empty final message is
  // dropped and the generation prompt added instead (nothing to continue: a fresh turn).
  std::string render(const ChatRequest& cr) const;

  struct Entry;  // a parsed template, or the parse error to report

 private:
  std::shared_ptr<const Entry> default_, tool_use_;
  std::string bos_, eos_, origin_;
};

}  // namespace ts::server
