// Chat template resolution (explicit file, tokenizer_config.json string / named list,
// chat_template.jinja) and rendering errors (no template, raise_exception).
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "server/chat_template.h"

using namespace ts;
using namespace ts::server;
namespace fs = std::filesystem;

// Chat templates need the Jinja engine (src/chat); skip where this build lacks it.
#if __has_include("chat/jinja.h")
#define NEED_JINJA() (void)0
#else
#define NEED_JINJA() GTEST_SKIP() << "no Jinja engine in this build"
#endif

namespace {
struct TempDir {
  fs::path p;
  explicit TempDir(const std::string& name) : p(fs::temp_directory_path() / (name + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
  void write(const std::string& file, const std::string& text) const { std::ofstream(p / file) << text; }
};
Json user(const std::string& s) { return Json::array({Json{{"role", "user"}, {"content", s}}}); }
}  // namespace

TEST(ChatTemplate, ContextHasTransformersVariables) {
  NEED_JINJA();
  auto t = ChatTemplates::from_sources(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
      "{% if tools %}T{{ tools | length }}{% endif %}{% if enable_thinking is defined %}E{{ enable_thinking }}{% endif %}"
      "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}",
      "", "<s>", "</s>");
  EXPECT_EQ(t.render(user("hi"), nullptr, Json::object()), "<s>[user:hi]></s>");
  Json tools = Json::array({Json{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(t.render(user("hi"), tools, Json{{"enable_thinking", false}}), "<s>[user:hi]T1EFalse></s>");
}

// continue_final_message (vLLM / transformers): the final message left open; an empty one is a
// fresh turn; a template that does not reproduce its text is a 400; and through parse_chat_request
// the vLLM flags (both true: 400; continue alone: no generation prompt).
TEST(ChatTemplate, ContinueFinalMessage) {
  NEED_JINJA();
  auto t = ChatTemplates::from_sources(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}");
  ChatRequest cr;
  cr.messages = Json::array({Json{{"role", "user"}, {"content", "hi"}}, Json{{"role", "assistant"}, {"content", "Sure, "}}});
  EXPECT_EQ(t.render(cr), "<user>hi</user><assistant>Sure, </assistant><assistant>");
  cr.continue_final_message = true;
  cr.add_generation_prompt = false;
  EXPECT_EQ(t.render(cr), "<user>hi</user><assistant>Sure, ");  // trailing space kept: the template kept it
  cr.messages[1]["content"] = "  ";
  EXPECT_EQ(t.render(cr), "<user>hi</user><assistant>");  // nothing to continue: a fresh turn
  // A template that trims the message: cut after the stripped text.
  auto trim = ChatTemplates::from_sources("{% for m in messages %}[{{ m.content | trim }}]{% endfor %}");
  cr.messages[1]["content"] = " {\"a\": ";
  EXPECT_EQ(trim.render(cr), "[hi][{\"a\":");
  // One that drops it.
  auto drop = ChatTemplates::from_sources("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}");
  try {
    drop.render(cr);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "continue_final_message");
  }
  ModelInfo mi;
  mi.context_length = 1024;
  mi.vocab_size = 1000;
  const Json msgs = cr.messages;
  ChatRequest c1 = parse_chat_request(Json{{"messages", msgs}, {"continue_final_message", true}}, mi);
  EXPECT_TRUE(c1.continue_final_message);
  EXPECT_FALSE(c1.add_generation_prompt);
  ChatRequest c2 = parse_chat_request(Json{{"messages", msgs}, {"add_generation_prompt", false}}, mi);
  EXPECT_FALSE(c2.continue_final_message);
  EXPECT_FALSE(c2.add_generation_prompt);
  try {
    parse_chat_request(Json{{"messages", msgs}, {"continue_final_message", true}, {"add_generation_prompt", true}}, mi);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "continue_final_message");
  }
}

TEST(ChatTemplate, RaiseExceptionIs400WithItsMessage) {
  NEED_JINJA();
  auto t = ChatTemplates::from_sources("{{ raise_exception('Conversation roles must alternate user/assistant') }}");
  try {
    t.render(user("x"), nullptr, Json::object());
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate user/assistant"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, NoTemplateNamesTheFix) {
  TempDir d("ts_ct_none_");
  auto t = ChatTemplates::load(d.p.string());
  EXPECT_FALSE(t.available());
  try {
    t.render(user("x"), nullptr, Json::object());
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos);
  }
}

TEST(ChatTemplate, Resolution) {
  NEED_JINJA();
  TempDir d("ts_ct_res_");
  // tokenizer_config.json's list: "default", and "tool_use" when a request has tools; bos/eos as
  // AddedToken dicts.
  d.write("tokenizer_config.json",
          R"({"bos_token": {"content": "<B>"}, "eos_token": "<E>", "chat_template": [
               {"name": "tool_use", "template": "TOOLS{{ bos_token }}"}, {"name": "default", "template": "DEF{{ eos_token }}"}]})");
  auto t = ChatTemplates::load(d.p.string());
  EXPECT_EQ(t.bos_token(), "<B>");
  EXPECT_EQ(t.render(user("x"), nullptr, Json::object()), "DEF<E>");
  Json tools = Json::array({Json{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(t.render(user("x"), tools, Json::object()), "TOOLS<B>");
  // chat_template.jinja replaces tokenizer_config.json's templates, as transformers loads them
  // ("independent chat template files take priority"); additional_chat_templates/NAME.jinja add
  // named ones.
  d.write("chat_template.jinja", "JINJA");
  auto j = ChatTemplates::load(d.p.string());
  EXPECT_EQ(j.render(user("x"), nullptr, Json::object()), "JINJA");
  EXPECT_EQ(j.render(user("x"), tools, Json::object()), "JINJA");
  EXPECT_EQ(j.origin(), (d.p / "chat_template.jinja").string());
  fs::create_directories(d.p / "additional_chat_templates");
  d.write("additional_chat_templates/tool_use.jinja", "EXTRA-TOOLS");
  auto x = ChatTemplates::load(d.p.string());
  EXPECT_EQ(x.render(user("x"), tools, Json::object()), "EXTRA-TOOLS");
  EXPECT_EQ(x.render(user("x"), nullptr, Json::object()), "JINJA");
  std::vector<TemplateSource> all = model_chat_templates(d.p.string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(pick_template(all, true)->name, "tool_use");
  EXPECT_EQ(pick_template(all, false)->name, "default");
  fs::remove_all(d.p / "additional_chat_templates");
  fs::remove(d.p / "chat_template.jinja");
  // --chat-template FILE wins over everything; a broken one is a startup error.
  d.write("mine.jinja", "MINE");
  EXPECT_EQ(ChatTemplates::load(d.p.string(), (d.p / "mine.jinja").string()).render(user("x"), nullptr, Json::object()),
            "MINE");
  d.write("bad.jinja", "{% for %}");
  EXPECT_THROW(ChatTemplates::load(d.p.string(), (d.p / "bad.jinja").string()), ts::Error);
  EXPECT_THROW(ChatTemplates::load(d.p.string(), (d.p / "missing.jinja").string()), ts::Error);
  // A broken model template is reported per request (400), not at startup.
  d.write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  auto broken = ChatTemplates::load(d.p.string());
  EXPECT_THROW(broken.render(user("x"), nullptr, Json::object()), ApiError);
}

TEST(ChatTemplate, DemoModelTemplate) {
  NEED_JINJA();
  auto t = ChatTemplates::load(std::string(TS_SOURCE_DIR) + "/models/pycoder");
  ASSERT_TRUE(t.available());
  std::string s = t.render(user(" hi "), nullptr, Json::object());
  EXPECT_EQ(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n");
}
