// The sandbox's render limits (issue #23): loops, output size, context depth and recursion end
// with a TemplateError quickly instead of hanging a thread or exhausting memory or stack.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "jinja_test_util.h"

namespace ts::chat::test {
namespace {

std::string kind_of(const std::string& tmpl, const std::string& ctx = "{}") {
  try {
    render(tmpl, ctx);
  } catch (const TemplateError& e) {
    return e.kind;
  }
  return "";
}

TEST(JinjaLimits, NestedLoopsHitTheIterationBudget) {
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(kind_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
            "SecurityError");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(JinjaLimits, OutputSizeIsCapped) {
  // 2000 iterations x 64 KiB: past the 64 MiB output cap.
  EXPECT_EQ(kind_of("{% set s = 'x' * 65536 %}{% for i in range(2000) %}{{ s }}{% endfor %}"), "MemoryError");
  EXPECT_EQ(kind_of("{% set s = 'x' * 65536 %}{% filter upper %}{% for i in range(2000) %}{{ s }}{% endfor %}{% endfilter %}"),
            "MemoryError");
}

TEST(JinjaLimits, MacroRecursion) {
  EXPECT_EQ(kind_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "RecursionError");
}

TEST(JinjaLimits, DeepContextIsAnErrorNotAStackOverflow) {
  std::string ctx = R"({"messages": )" + std::string(50000, '[') + std::string(50000, ']') + "}";
  EXPECT_EQ(kind_of("{{ messages }}", ctx), "RecursionError");
  // Not mentioned by the template: never converted, so no error.
  EXPECT_EQ(render("ok", ctx), "ok");
}

TEST(JinjaLimits, DeepTemplateSyntax) {
  EXPECT_EQ(kind_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "TemplateSyntaxError");
  EXPECT_EQ(kind_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), "TemplateSyntaxError");
}

}  // namespace
}  // namespace ts::chat::test
