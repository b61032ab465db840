// Generated tables, expectations rendered by jinja2 3.1 (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson/raise_exception/strftime_now).
#include "jinja_test_util.h"

namespace ts::chat::test {
namespace {

// Lexing and whitespace control: trim_blocks, lstrip_blocks, -/+ markers, comments, raw, newlines.
const RenderCase kJinjaWhitespace[] = {
    {"trim_blocks_newline", "a\n{% if true %}\nb\n{% endif %}\nc", "{}",
     "a\nb\nc"},
    {"trim_blocks_only_one_newline", "{% if true %}\n\nx{% endif %}", "{}",
     "\nx"},
    {"trim_blocks_not_after_variable", "{{ 1 }}\n{{ 2 }}\n", "{}",
     "1\n2"},
    {"trim_blocks_not_after_spaces", "{% if true %}\t \nx{% endif %}", "{}",
     "\t \nx"},
    {"lstrip_blocks_indent", "a\n    {% if true %}\n    x\n    {% endif %}\nb", "{}",
     "a\n    x\nb"},
    {"lstrip_blocks_tabs", "a\n\t\t{% if true %}x{% endif %}", "{}",
     "a\nx"},
    {"lstrip_blocks_not_after_text", "a  {% if true %}x{% endif %}", "{}",
     "a  x"},
    {"lstrip_blocks_not_variables", "a\n    {{ 1 }}", "{}",
     "a\n    1"},
    {"lstrip_blocks_at_template_start", "   {% if true %}x{% endif %}", "{}",
     "x"},
    {"lstrip_blocks_after_variable_same_line", "{{ 1 }}  {% if true %}x{% endif %}", "{}",
     "1  x"},
    {"lstrip_blocks_after_trimmed_newline", "{% if true %}\n   {% if true %}x{% endif %}{% endif %}", "{}",
     "x"},
    {"lstrip_blocks_unicode_space", "　{% if true %}x{% endif %}", "{}",
     "x"},
    {"minus_strips_before_block", "a  \n\n  {%- if true %}x{% endif %}", "{}",
     "ax"},
    {"minus_strips_after_block", "{% if true -%}  \n\n  x{% endif %}", "{}",
     "x"},
    {"minus_strips_before_variable", "a \n {{- 1 }}", "{}",
     "a1"},
    {"minus_strips_after_variable", "{{ 1 -}} \n b", "{}",
     "1b"},
    {"minus_both_sides", "a {{- 1 -}} b {%- if true -%} c {%- endif -%} d", "{}",
     "a1bcd"},
    {"minus_strips_unicode_space", "a　{{- 1 }}", "{}",
     "a1"},
    {"plus_disables_lstrip", "  {%+ if true %}x{% endif %}", "{}",
     "  x"},
    {"plus_disables_trim_blocks", "{% if true +%}\nx{% endif %}", "{}",
     "\nx"},
    {"comment_removed", "a{# comment #}b", "{}",
     "ab"},
    {"comment_multiline", "a{# line1\nline2 #}b", "{}",
     "ab"},
    {"comment_trim_and_lstrip", "a\n  {# c #}\nb", "{}",
     "a\nb"},
    {"comment_minus", "a  {#- c -#}  b", "{}",
     "ab"},
    {"comment_plus", " {#+ c +#}\nb", "{}",
     " \nb"},
    {"raw_block", "{% raw %}{{ not }} {% evaluated %}{% endraw %}", "{}",
     "{{ not }} {% evaluated %}"},
    {"raw_keeps_newline_after_start", "{% raw %}\nx\n{% endraw %}\ny", "{}",
     "\nx\ny"},
    {"raw_whitespace_control", "  {%- raw -%}  {{ a }}  {%- endraw -%}  ", "{}",
     "{{ a }}"},
    {"raw_lstrip_endraw", "{% raw %}x\n   {% endraw %}y", "{}",
     "x\ny"},
    {"crlf_normalized", "a\r\nb\rc\r\n{{ 1 }}", "{}",
     "a\nb\nc\n1"},
    {"single_trailing_newline_dropped", "x\n", "{}",
     "x"},
    {"only_one_trailing_newline_dropped", "x\n\n", "{}",
     "x\n"},
    {"for_loop_lines", "{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", "{}",
     "  1\n  2\n"},
    {"block_end_in_string", "{{ \"%}\" ~ \"}}\" }}", "{}",
     "%}}}"},
    {"nested_braces_in_expression", "{{ {'a': {'b': 1}} }}", "{}",
     "{'a': {'b': 1}}"},
    {"string_escapes", "{{ 'tab\\there|nl\\nx|\\u00e9|\\x41|\\101|\\\\|\\'|\\q' }}", "{}",
     "tab\there|nl\nx|é|A|A|\\|'|\\q"},
    {"double_quoted_string", "{{ \"it's \\\"q\\\"\" }}", "{}",
     "it's \"q\""},
    {"adjacent_strings_concatenate", "{{ \"a\" 'b' \"c\" }}", "{}",
     "abc"},
    {"number_literals", "{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }} {{ 2E-3 }} {{ 1_0.5 }}", "{}",
     "1000 31 5 15 1500.0 0.002 10.5"},
    {"print_tuple", "{{ 1, 2 }}", "{}",
     "(1, 2)"},
    {"text_only", "plain text with { single braces } and %", "{}",
     "plain text with { single braces } and %"},
};
class JinjaWhitespace : public ::testing::TestWithParam<RenderCase> {};
TEST_P(JinjaWhitespace, MatchesJinja2) {
  const RenderCase& c = GetParam();
  EXPECT_EQ(render(c.tmpl, c.ctx ? c.ctx : "{}"), c.expected) << c.tmpl;
}
INSTANTIATE_TEST_SUITE_P(Table, JinjaWhitespace, ::testing::ValuesIn(kJinjaWhitespace), render_case_name);

// Malformed templates fail at parse time with TemplateSyntaxError.
const ErrorCase kJinjaSyntaxErrors[] = {
    {"unclosed_variable", "{{ x", "{}", "TemplateSyntaxError"},
    {"unclosed_block", "{% if x", "{}", "TemplateSyntaxError"},
    {"unclosed_comment", "{# x", "{}", "TemplateSyntaxError"},
    {"unclosed_raw", "{% raw %}x", "{}", "TemplateSyntaxError"},
    {"unclosed_string", "{{ 'x }}", "{}", "TemplateSyntaxError"},
    {"unbalanced_bracket", "{{ (1, 2 }}", "{}", "TemplateSyntaxError"},
    {"stray_close_bracket", "{{ 1) }}", "{}", "TemplateSyntaxError"},
    {"unexpected_char", "{{ 1 ! 2 }}", "{}", "TemplateSyntaxError"},
    {"missing_endif", "{% if true %}x", "{}", "TemplateSyntaxError"},
    {"missing_endfor", "{% for x in y %}x", "{}", "TemplateSyntaxError"},
    {"stray_endif", "{% endif %}", "{}", "TemplateSyntaxError"},
    {"unknown_tag", "{% frobnicate %}", "{}", "TemplateSyntaxError"},
    {"empty_expression", "{{ }}", "{}", "TemplateSyntaxError"},
    {"dangling_operator", "{{ 1 + }}", "{}", "TemplateSyntaxError"},
    {"two_expressions", "{{ 'a' 1 }}", "{}", "TemplateSyntaxError"},
    {"chained_tests", "{{ 1 is odd is odd }}", "{}", "TemplateSyntaxError"},
    {"set_without_value", "{% set %}", "{}", "TemplateSyntaxError"},
    {"for_without_in", "{% for x %}{% endfor %}", "{}", "TemplateSyntaxError"},
    {"macro_default_order", "{% macro m(a=1, b) %}{% endmacro %}", "{}", "TemplateSyntaxError"},
    {"positional_after_keyword", "{{ f(a=1, 2) }}", "{}", "TemplateSyntaxError"},
};
class JinjaSyntaxErrors : public ::testing::TestWithParam<ErrorCase> {};
TEST_P(JinjaSyntaxErrors, Raises) { expect_error(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, JinjaSyntaxErrors, ::testing::ValuesIn(kJinjaSyntaxErrors), error_case_name);

}  // namespace
}  // namespace ts::chat::test
