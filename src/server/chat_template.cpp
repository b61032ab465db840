#include "server/chat_template.h"

#include "io/json_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#if __has_include("chat/jinja.h")
#include "chat/jinja.h"
#define TS_HAVE_JINJA 1
#endif
#include "core/error.h"
#include "core/log.h"

namespace ts::server {

struct ChatTemplates::Entry {
#ifdef TS_HAVE_JINJA
  std::optional<chat::Template> tpl;
#else
  std::optional<std::string> tpl;  // never set: this build has no template engine
#endif
  std::string error;  // parse error, reported per request
};

namespace {
namespace fs = std::filesystem;

// Absent -> nullopt; present but not a regular file (a FIFO would block the load) -> ts::Error.
std::optional<std::string> read_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  return io::read_regular_file(p.string());
}


std::string token_string(const Json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

std::shared_ptr<const ChatTemplates::Entry> make_entry(const std::string& src, bool strict, const std::string& origin) {
  auto e = std::make_shared<ChatTemplates::Entry>();
  try {
#ifdef TS_HAVE_JINJA
    e->tpl = chat::Template::parse(src);
#else
    (void)src;
    fail("this build has no Jinja engine (src/chat)");
#endif
  } catch (const std::exception& ex) {
    if (strict) fail("chat template {}: {}", origin, ex.what());
    e->error = fmt::format("The chat template ({}) failed to parse: {}", origin, ex.what());
    spdlog::warn("{}", e->error);
  }
  return e;
}
}  // namespace

ChatTemplates ChatTemplates::from_sources(const std::string& default_src, const std::string& tool_use_src,
                                          const std::string& bos, const std::string& eos) {
  ChatTemplates t;
  t.bos_ = bos;
  t.eos_ = eos;
  t.origin_ = "inline";
  if (!default_src.empty()) t.default_ = make_entry(default_src, true, "inline");
  if (!tool_use_src.empty()) t.tool_use_ = make_entry(tool_use_src, true, "inline tool_use");
  return t;
}

ChatTemplates ChatTemplates::load(const std::string& model_dir, const std::string& template_file) {
  ChatTemplates t;
  fs::path dir(model_dir);
  Json cfg = Json::object();
  if (auto s = read_file(dir / "tokenizer_config.json")) {
    Json j = Json::parse(*s, nullptr, false);
    if (j.is_object()) cfg = std::move(j);
  }
  t.bos_ = token_string(cfg, "bos_token");
  t.eos_ = token_string(cfg, "eos_token");

  if (!template_file.empty()) {
    auto src = read_file(template_file);
    if (!src) fail("--chat-template: cannot read '{}'", template_file);
    t.origin_ = template_file;
    t.default_ = make_entry(*src, true, template_file);
    return t;
  }
  std::vector<TemplateSource> all = model_chat_templates(model_dir);
  if (const TemplateSource* d = pick_template(all, false)) {
    t.origin_ = d->origin;
    t.default_ = make_entry(d->source, false, d->origin);
  }
  if (const TemplateSource* u = pick_template(all, true); u && u->name == "tool_use")
    t.tool_use_ = make_entry(u->source, false, u->origin);
  return t;
}

std::vector<TemplateSource> model_chat_templates(const std::string& model_dir) {
  const fs::path dir(model_dir);
  std::vector<TemplateSource> all;
  auto put = [&](const std::string& name, std::string src, const std::string& origin) {
    for (auto& e : all)
      if (e.name == name) {
        e.source = std::move(src), e.origin = origin;
        return;
      }
    all.push_back({name, std::move(src), origin});
  };
  if (auto s = read_file(dir / "chat_template.jinja")) {
    put("default", *s, (dir / "chat_template.jinja").string());
  } else if (auto c = read_file(dir / "tokenizer_config.json")) {
    Json cfg = Json::parse(*c, nullptr, false);
    const std::string origin = (dir / "tokenizer_config.json").string();
    if (cfg.is_object() && cfg.contains("chat_template")) {
      const Json& ct = cfg["chat_template"];
      if (ct.is_string()) put("default", ct.get<std::string>(), origin);
      if (ct.is_array())
        for (auto& e : ct)
          if (e.is_object() && e.contains("template") && e["template"].is_string()) {
            std::string name = e.value("name", "");
            put(name, e["template"].get<std::string>(), origin + " (" + name + ")");
          }
    }
  }
  if (all.empty())
    if (auto s = read_file(dir / "chat_template.json")) {
      Json j = Json::parse(*s, nullptr, false);
      if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
        put("default", j["chat_template"].get<std::string>(), (dir / "chat_template.json").string());
    }
  // transformers' additional_chat_templates/NAME.jinja (sorted, so the result does not depend on
  // the directory's order).
  std::error_code ec;
  const fs::path extra = dir / "additional_chat_templates";
  if (fs::is_directory(extra, ec)) {
    std::vector<fs::path> files;
    for (auto& f : fs::directory_iterator(extra, ec))
      if (f.path().extension() == ".jinja") files.push_back(f.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files)
      if (auto s = read_file(f)) put(f.stem().string(), *s, f.string());
  }
  return all;
}

const TemplateSource* pick_template(const std::vector<TemplateSource>& all, bool has_tools) {
  const TemplateSource* def = nullptr;
  for (auto& e : all) {
    if (has_tools && e.name == "tool_use") return &e;
    if (e.name == "default" && !def) def = &e;
  }
  return def ? def : all.empty() ? nullptr : &all.front();
}

std::string ChatTemplates::render(const Json& messages, const Json& tools, const Json& kwargs,
                                  bool add_generation_prompt) const {
  if (!default_)
    throw ApiError(400,
                   "This model has no chat template (none in tokenizer_config.json, chat_template.jinja or "
                   "chat_template.json); start the server with --chat-template FILE to chat with it, or use "
                   "/v1/completions",
                   "messages", "no_chat_template");
  const Entry& e = (tool_use_ && !tools.is_null() && !tools.empty()) ? *tool_use_ : *default_;
  if (!e.tpl) throw ApiError(400, e.error, "", "chat_template_error");
  Json ctx = Json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = bos_;
  ctx["eos_token"] = eos_;
  if (kwargs.is_object())
    for (auto& [k, v] : kwargs.items())
      if (k != "messages" && k != "tools") ctx[k] = v;
  try {
#ifdef TS_HAVE_JINJA
    return e.tpl->render(ctx);
#else
    throw ApiError(500, "this build has no Jinja engine (src/chat)");
#endif
#ifdef TS_HAVE_JINJA
  } catch (const chat::TemplateError& ex) {
    throw ApiError(400, "Chat template error: " + (ex.kind == "TemplateError" ? ex.message : std::string(ex.what())),
                   "messages", "chat_template_error");
#endif
  } catch (const ts::Error& ex) {
    throw ApiError(400, std::string("Chat template error: ") + ex.what(), "messages", "chat_template_error");
  }
}

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
std::string_view strip_left(std::string_view v) {
  while (!v.empty() && is_space(v.front())) v.remove_prefix(1);
  return v;
}
std::string_view strip(std::string_view v) {
  v = strip_left(v);
  while (!v.empty() && is_space(v.back())) v.remove_suffix(1);
  return v;
}
}  // namespace

std::string ChatTemplates::render(const ChatRequest& cr) const {
  if (!cr.continue_final_message || !cr.messages.is_array() || cr.messages.empty())
    return render(cr.messages, cr.tools, cr.template_kwargs, cr.add_generation_prompt);
  const Json& last = cr.messages.back();
  const std::string text = last.contains("content") && last["content"].is_string() ? last["content"].get<std::string>() : "";
  if (strip(text).empty()) {
    Json head = cr.messages;
    head.erase(head.size() - 1);
    return render(head, cr.tools, cr.template_kwargs, true);
  }
  std::string full = render(cr.messages, cr.tools, cr.template_kwargs, false);
  const std::string_view core = strip(text);
  const size_t at = full.rfind(core);
  if (at == std::string::npos)
    throw ApiError(400,
                   "'continue_final_message': the chat template does not reproduce the final message's text, so it "
                   "cannot be continued",
                   "continue_final_message");
  // Past the message's own trailing whitespace where the template kept it verbatim, else past
  // its stripped text.
  const std::string_view lead_stripped = strip_left(text);
  const bool verbatim = full.compare(at, lead_stripped.size(), lead_stripped) == 0;
  full.resize(at + (verbatim ? lead_stripped.size() : core.size()));
  return full;
}

}  // namespace ts::server
