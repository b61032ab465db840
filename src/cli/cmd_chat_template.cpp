// `tokenspeed chat-template`: render a model's chat template exactly as transformers'
// apply_chat_template(tokenize=False) would, for checking prompts by hand and from scripts.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "chat/jinja.h"
#include "cli/commands.h"
#include "core/error.h"
#include "server/chat_template.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) ts::fail("cannot read {}", path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

json read_json(const std::string& path) {
  std::string text = path == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {}) : read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ts::fail("{}: invalid JSON: {}", path, e.what());
  }
}

// tokenizer_config.json stores special tokens as a string or as an AddedToken object.
std::optional<std::string> token_text(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::tm parse_date(const std::string& s) {
  std::tm tm{};
  int y = 0, m = 0, d = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
    ts::fail("--date must be YYYY-MM-DD, got '{}'", s);
  tm.tm_year = y - 1900;
  tm.tm_mon = m - 1;
  tm.tm_mday = d;
  tm.tm_hour = 0;
  std::time_t t = timegm(&tm);  // normalizes and fills weekday / day of year for %a, %j, ...
  gmtime_r(&t, &tm);
  if (tm.tm_mday != d) ts::fail("--date: no such day '{}'", s);
  return tm;
}

int cmd_chat_template(int argc, char** argv) {
  CLI::App app{"Render a chat template with the given variables and print the prompt (nothing appended)",
               "tokenspeed chat-template"};
  std::string model, tmpl, context_path, date;
  auto* m = app.add_option("--model", model, "model directory: chat_template.jinja or tokenizer_config.json");
  auto* t = app.add_option("--template", tmpl, "a Jinja chat template file");
  m->excludes(t);
  app.add_option("--context-json", context_path,
                 "JSON object whose keys become template variables (messages, tools, add_generation_prompt, "
                 "bos_token, eos_token, extra kwargs); '-' reads stdin")
      ->required();
  app.add_option("--date", date, "the date strftime_now() reports, YYYY-MM-DD (default: now)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (model.empty() && tmpl.empty()) {
    std::fprintf(stderr, "error: one of --model or --template is required\n");
    return 2;
  }

  json context = read_json(context_path);
  if (!context.is_object()) ts::fail("{}: the context must be a JSON object", context_path);
  std::string source;
  if (!model.empty()) {
    fs::path dir(model);
    json cfg = json::object();
    if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json((dir / "tokenizer_config.json").string());
    // The server's choice: chat_template.jinja, tokenizer_config.json, additional templates;
    // "tool_use" when the context has tools.
    std::vector<ts::server::TemplateSource> all = ts::server::model_chat_templates(model);
    const bool has_tools = context.contains("tools") && context["tools"].is_array() && !context["tools"].empty();
    const ts::server::TemplateSource* pick = ts::server::pick_template(all, has_tools);
    if (!pick)
      ts::fail("{}: no chat_template.jinja, no chat_template in tokenizer_config.json, no chat_template.json",
               dir.string());
    source = pick->source;
    for (const char* key : {"bos_token", "eos_token"})
      if (!context.contains(key))
        if (auto v = token_text(cfg, key)) context[key] = *v;
  } else {
    source = read_file(tmpl);
  }

  ts::chat::RenderOptions opts;
  if (!date.empty()) opts.now = parse_date(date);
  std::string out = ts::chat::Template::parse(source).render(context, opts);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

TS_COMMAND("chat-template", "render a chat template (from --model DIR or --template FILE) with a JSON context",
           cmd_chat_template);
