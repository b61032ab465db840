// The public API: error reporting with positions, render options (date, host functions),
// context handling, reuse across threads, and the safety limits.
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "jinja_test_util.h"

namespace ts::chat::test {
namespace {

using json = nlohmann::ordered_json;

TemplateError error_of(const std::string& tmpl, const std::string& ctx = "{}") {
  try {
    render(tmpl, ctx);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << tmpl;
  return TemplateError("", "", 0, 0);
}

TEST(JinjaApi, SyntaxErrorHasLineAndColumn) {
  TemplateError e = error_of("{% if x %}\n  {{ 1 + }}\n{% endif %}");
  EXPECT_EQ(e.kind, "TemplateSyntaxError");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.col, 10);  // the `}}` where an operand was expected
  EXPECT_EQ(std::string(e.what()), "template error at line 2, column 10: TemplateSyntaxError: " + e.message);
}

TEST(JinjaApi, UnknownTagPosition) {
  TemplateError e = error_of("ab\n\n   {% frob %}");
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.col, 7);
  EXPECT_EQ(e.message, "Encountered unknown tag 'frob'.");
}

TEST(JinjaApi, RuntimeErrorPointsAtOperator) {
  TemplateError e = error_of("line1\n{{ 'a' + none }}");
  EXPECT_EQ(e.kind, "TypeError");
  EXPECT_EQ(e.message, "can only concatenate str (not \"NoneType\") to str");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.col, 8);
}

TEST(JinjaApi, ColumnsCountCharactersNotBytes) {
  TemplateError e = error_of("x {{ \"h\u00e9llo\" + 1 }}");
  EXPECT_EQ(e.line, 1);
  EXPECT_EQ(e.col, 14);
}

TEST(JinjaApi, ErrorInsideMacroReportsMacroLine) {
  TemplateError e = error_of("{% macro m(x) %}\n{{ x.a.b }}\n{% endmacro %}\n{{ m(none) }}");
  EXPECT_EQ(e.kind, "UndefinedError");
  EXPECT_EQ(e.line, 2);
}

TEST(JinjaApi, RaiseExceptionMessage) {
  TemplateError e =
      error_of("{%- if messages[0].role != 'user' -%}\n{{ raise_exception('roles must alternate') }}\n{%- endif %}",
               R"({"messages": [{"role": "assistant"}]})");
  EXPECT_EQ(e.kind, "TemplateError");
  EXPECT_EQ(e.message, "roles must alternate");
  EXPECT_EQ(e.line, 2);
}

TEST(JinjaApi, UndefinedAttributeMessage) {
  TemplateError e = error_of("{% for k, v in args.items() %}{% endfor %}", R"({"args": "{\"a\": 1}"})");
  EXPECT_EQ(e.kind, "UndefinedError");
  EXPECT_EQ(e.message, "'str object' has no attribute 'items'");
}

// An undefined from a missing attribute names its object's type without owning the object:
// `{% set ns.x = ns.y %}` stores it in that very namespace (owning it was a reference cycle, a
// leak per render that the chat-template fuzzer's LeakSanitizer found). The message still reads
// as jinja2's, also once a temporary object is gone.
TEST(JinjaApi, MissingAttributeUndefinedDoesNotOwnItsObject) {
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.x = ns.y %}{{ ns.x is defined }}", "{}"), "False");
  TemplateError e = error_of("{% set ns = namespace() %}{% set ns.x = ns.y %}{{ ns.x + 1 }}");
  EXPECT_EQ(e.kind, "UndefinedError");
  EXPECT_EQ(e.message, "'jinja2.utils.Namespace object' has no attribute 'y'");
  e = error_of("{% set u = [1, 2].foo %}{{ u + 1 }}");
  EXPECT_EQ(e.message, "'list object' has no attribute 'foo'");
  e = error_of("{% set u = {'a': 1}.b %}{{ u + 1 }}");
  EXPECT_EQ(e.message, "'dict object' has no attribute 'b'");
}

// A namespace stored in itself (directly or through another one) is a reference cycle: the render
// clears its namespaces when it ends, so LeakSanitizer (scripts/sanitize.sh) finds nothing.
TEST(JinjaApi, NamespaceCyclesAreFreed) {
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.me.me.a }}", "{}"), "1");
  EXPECT_EQ(render("{% set a = namespace(n=1) %}{% set b = namespace(n=2, a=a) %}{% set a.b = b %}{{ a.b.a.b.n }}", "{}"),
            "2");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.x + 1 }}").kind, "UndefinedError");
}

TEST(JinjaApi, StrftimeNowUsesInjectedDate) {
  RenderOptions opts;
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  opts.now = tm;
  EXPECT_EQ(
      render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A') }}", "{}", opts),
      "2026-07-26|26 Jul 2026|Sunday");
}

TEST(JinjaApi, StrftimeNowDefaultsToCurrentTime) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), std::to_string(tm.tm_year + 1900));
}

TEST(JinjaApi, HostFunctions) {
  RenderOptions opts;
  opts.functions["add"] = [](const json& args, const json& kwargs) {
    return json(args[0].get<int>() + args[1].get<int>() + kwargs.value("extra", 0));
  };
  opts.functions["tools_json"] = [](const json&, const json&) { return json::parse(R"([{"name": "f"}])"); };
  EXPECT_EQ(render("{{ add(1, 2) }} {{ add(1, 2, extra=10) }} {{ tools_json()[0].name }}", "{}", opts), "3 13 f");
  // A context variable hides a host function of the same name, as render() kwargs hide jinja2 globals.
  EXPECT_EQ(render("{{ add }}", R"({"add": "ctx"})", opts), "ctx");
}

TEST(JinjaApi, HostFunctionExceptionBecomesTemplateError) {
  RenderOptions opts;
  opts.functions["boom"] = [](const json&, const json&) -> json { throw std::runtime_error("nope"); };
  try {
    render("\n{{ boom() }}", "{}", opts);
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line, 2);
    EXPECT_NE(e.message.find("nope"), std::string::npos);
  }
}

TEST(JinjaApi, ContextMustBeAnObject) {
  Template t = Template::parse("x");
  EXPECT_THROW(t.render(json::array()), TemplateError);
  EXPECT_EQ(t.render(json()), "x");  // null: no variables
}

TEST(JinjaApi, ContextKeyOrderIsKept) {
  EXPECT_EQ(render("{{ d|tojson }} {{ d }}", R"({"d": {"zeta": 1, "alpha": {"y": 2, "x": 3}}})"),
            R"({"zeta": 1, "alpha": {"y": 2, "x": 3}} {'zeta': 1, 'alpha': {'y': 2, 'x': 3}})");
}

TEST(JinjaApi, JsonNumbersKeepTheirType) {
  EXPECT_EQ(render("{{ a }} {{ b }} {{ c }} {{ a is integer }} {{ b is float }}",
                   R"({"a": 3, "b": 3.0, "c": 18446744073709551615})"),
            "3 3.0 1.8446744073709552e+19 True True");
}

TEST(JinjaApi, ParseOnceRenderMany) {
  Template t = Template::parse("{% for m in messages %}[{{ m.role }}]{% endfor %}");
  Template copy = t;
  EXPECT_EQ(t.render(json::parse(R"({"messages": [{"role": "a"}]})")), "[a]");
  EXPECT_EQ(copy.render(json::parse(R"({"messages": [{"role": "b"}, {"role": "c"}]})")), "[b][c]");
  EXPECT_EQ(t.render(json::parse(R"({"messages": []})")), "");
}

TEST(JinjaApi, ConcurrentRendersOfOneTemplate) {
  Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content | upper }}{% endfor %}:{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      json ctx = {{"messages", json::array()}};
      // fmt rather than `"m" + std::to_string(k)`, which trips GCC 12's -Wrestrict false positive
      for (int i = 0; i <= k; ++i) ctx["messages"].push_back({{"content", fmt::format("m{}", k)}});
      std::string want;
      for (int i = 0; i <= k; ++i) want += fmt::format("M{}", k);
      want += fmt::format(":{}", k + 1);
      for (int r = 0; r < 200; ++r) ok[size_t(k)] += t.render(ctx) == want;
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(ok[size_t(k)], 200) << "thread " << k;
}

TEST(JinjaApi, RunawayRecursionIsAnError) {
  TemplateError e = error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  EXPECT_EQ(e.kind, "RecursionError");
}

TEST(JinjaApi, LoopKeptPastItsLoopCannotRecurse) {
  TemplateError e = error_of(
      "{% set ns = namespace() %}{% for x in [1] recursive %}{% set ns.l = loop %}{% endfor %}{{ ns.l([2]) }}");
  EXPECT_EQ(e.kind, "TemplateRuntimeError");
}

TEST(JinjaApi, DeepNestingIsASyntaxError) {
  std::string deep(5000, '(');
  deep = "{{ " + deep + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(error_of(deep).kind, "TemplateSyntaxError");
  std::string ifs;
  for (int k = 0; k < 5000; ++k) ifs += "{% if true %}";
  EXPECT_EQ(error_of(ifs).kind, "TemplateSyntaxError");
}

TEST(JinjaApi, IntegerOverflowIsAnError) {
  EXPECT_EQ(error_of("{{ 2 ** 64 }}").kind, "OverflowError");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}").kind, "OverflowError");
}

TEST(JinjaApi, TransformersGenerationTagRendersItsBody) {
  EXPECT_EQ(render("{% generation %}assistant text{% endgeneration %}"), "assistant text");
}

TEST(JinjaApi, BinaryUnsafeBytesSurvive) {
  // Invalid UTF-8 from a template file passes through printing and slicing unchanged.
  EXPECT_EQ(render("a\xff{{ 'b\xfe' }}"),
            "a\xff"
            "b\xfe");
  EXPECT_EQ(render("{{ 'a\xff"
                   "b'[::-1] }}|{{ 'a\xff"
                   "b'|length }}"),
            "b\xff"
            "a|3");
}

}  // namespace
}  // namespace ts::chat::test
