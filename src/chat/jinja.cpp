#include "chat/jinja.h"

#include <fmt/format.h>

#include "chat/jinja_ast.h"
#include "chat/jinja_interp.h"

namespace ts::chat {

TemplateError::TemplateError(std::string k, std::string m, int l, int c)
    : ts::Error(l > 0 ? fmt::format("template error at line {}, column {}: {}: {}", l, c, k, m)
                      : fmt::format("template error: {}: {}", k, m)),
      kind(std::move(k)),
      message(std::move(m)),
      line(l),
      col(c) {}

struct Template::Impl {
  std::unique_ptr<jinja::Program> prog;
};

Template Template::parse(const std::string& source) {
  auto impl = std::make_shared<Impl>();
  impl->prog = jinja::parse_program(source);
  Template t;
  t.impl_ = std::move(impl);
  return t;
}

std::string Template::render(const nlohmann::ordered_json& context) const { return render(context, RenderOptions{}); }

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  if (!impl_) throw TemplateError("TemplateError", "render() called on an empty Template", 0, 0);
  jinja::Interp interp(*impl_->prog, options);
  return interp.render(context);
}

}  // namespace ts::chat
