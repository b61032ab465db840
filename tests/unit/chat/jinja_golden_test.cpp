// Conformance with transformers on the real chat templates of ../shared/chat_templates: every
// `expected` rendering must match byte for byte and every `expected_error` case must raise.
// The templates are third-party data and are read in place, never copied into the project.
#include "ts_source_dir.h"  // TS_SOURCE_DIR (generated: the checkout's path)
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "jinja_test_util.h"

namespace ts::chat::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const fs::path kDir = fs::path(TS_SOURCE_DIR) / ".." / "shared" / "chat_templates";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The goldens were rendered with strftime_now fixed to 2026-07-26.
RenderOptions golden_options() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  RenderOptions o;
  o.now = tm;
  return o;
}

class ChatTemplateGoldens : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kDir / "goldens.json"))
      GTEST_SKIP() << "shared chat templates not found at " << kDir.string()
                   << " (they live outside the project and are read in place)";
    goldens_ = json::parse(slurp(kDir / "goldens.json"));
  }
  const Template& tmpl(const std::string& name) {
    auto it = cache_.find(name);
    if (it == cache_.end()) it = cache_.emplace(name, Template::parse(slurp(kDir / name))).first;
    return it->second;
  }
  json goldens_;
  std::map<std::string, Template> cache_;
};

TEST_F(ChatTemplateGoldens, RenderedCasesMatchByteForByte) {
  RenderOptions opts = golden_options();
  int total = 0, passed = 0;
  for (auto& c : goldens_["cases"]) {
    if (!c.contains("expected")) continue;
    ++total;
    std::string label = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>();
    try {
      std::string got = tmpl(c["template"]).render(c["context"], opts);
      if (got == c["expected"].get<std::string>())
        ++passed;
      else
        ADD_FAILURE() << label << "\n--- expected\n" << c["expected"].get<std::string>() << "\n--- got\n" << got;
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << ": " << e.what();
    }
  }
  std::printf("chat template goldens: %d/%d rendered byte-exact\n", passed, total);
  EXPECT_GT(total, 0);
  EXPECT_EQ(passed, total);
}

TEST_F(ChatTemplateGoldens, ErrorCasesRaise) {
  RenderOptions opts = golden_options();
  int total = 0, raised = 0;
  for (auto& c : goldens_["cases"]) {
    if (!c.contains("expected_error")) continue;
    ++total;
    std::string label = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>();
    // expected_error reads "<PythonException>: <message>", which is exactly our kind and message.
    std::string want = c["expected_error"].get<std::string>();
    try {
      std::string got = tmpl(c["template"]).render(c["context"], opts);
      ADD_FAILURE() << label << ": expected " << want << ", rendered:\n" << got;
    } catch (const TemplateError& e) {
      ++raised;
      EXPECT_EQ(e.kind + ": " + e.message, want) << label;
    }
  }
  std::printf("chat template goldens: %d/%d expected errors raised\n", raised, total);
  EXPECT_GT(total, 0);
  EXPECT_EQ(raised, total);
}

// A 50-message conversation with tools must render well under a millisecond.
TEST_F(ChatTemplateGoldens, FiftyMessageRenderIsFast) {
  const json* tools = nullptr;
  for (auto& c : goldens_["cases"])
    if (c["context"].contains("tools")) {
      tools = &c["context"]["tools"];
      break;
    }
  json ctx = {{"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  if (tools) ctx["tools"] = *tools;
  ctx["messages"] = json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}}});
  for (int k = 0; ctx["messages"].size() < 50; ++k) {
    ctx["messages"].push_back({{"role", "user"}, {"content", fmt::format("Question number {}: what is up?", k)}});
    ctx["messages"].push_back(
        {{"role", "assistant"},
         {"content", fmt::format("An answer of moderate length, with some detail, for turn {}", k)}});
  }
  for (const char* name : {"qwen3.jinja", "llama-3.1-8b-instruct.jinja", "gpt-oss.jinja"}) {
    const Template& t = tmpl(name);
    RenderOptions opts = golden_options();
    std::string first = t.render(ctx, opts);  // warm up
    ASSERT_GT(first.size(), 1000u) << name;
    const int n = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < n; ++k) EXPECT_EQ(t.render(ctx, opts).size(), first.size());
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    std::printf("%s: 50-message render %.1f us\n", name, us);
#ifdef NDEBUG  // the budget applies to optimized builds; debug and sanitizer builds only report
    EXPECT_LT(us, 1000.0) << name;
#endif
  }
}

}  // namespace
}  // namespace ts::chat::test
