// Generated tables, expectations rendered by jinja2 3.1 (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson/raise_exception/strftime_now).
#include "jinja_test_util.h"

namespace ts::chat::test {
namespace {

// Statements: if, for (loop object, else, filters, unpacking, break/continue, recursive), set, namespace, macro, call, filter, with; and jinja2 scoping.
// Context for rows whose ctx is nullptr.
const char* const kJinjaStmtContext =
    "{\"msgs\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}], \"d\": {\"b\": 2, \"a\": 1}, \"e\": []}";
const RenderCase kJinjaStmt[] = {
    {"if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}", nullptr,
     "one,two,many,"},
    {"if_nested", "{% if true %}{% if false %}x{% else %}y{% endif %}{% endif %}", nullptr,
     "y"},
    {"if_undefined_is_false", "{% if nothing %}x{% else %}y{% endif %}{% if nothing is defined %}z{% endif %}", nullptr,
     "y"},
    {"for_loop_variables", "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}", nullptr,
     "1/0/3/2/True/False/3;2/1/2/1/False/False/3;3/2/1/0/False/True/3;"},
    {"for_previtem_nextitem", "{% for m in msgs %}[{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }}]{% endfor %}", nullptr,
     "[->user][system>assistant][user>-]"},
    {"for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", nullptr,
     "abcab"},
    {"for_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", nullptr,
     "121"},
    {"for_depth", "{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", nullptr,
     "10"},
    {"for_else_runs_when_empty", "{% for x in e %}x{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", nullptr,
     "empty|1"},
    {"for_else_after_filter", "{% for x in [1, 2] if x > 5 %}{{ x }}{% else %}none{% endfor %}", nullptr,
     "none"},
    {"for_inline_filter", "{% for m in msgs if m.role != 'system' %}{{ loop.index }}:{{ m.role }}/{{ loop.length }} {% endfor %}", nullptr,
     "1:user/2 2:assistant/2 "},
    {"for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}", nullptr,
     "b=2;a=1;b2a1"},
    {"for_unpack_nested", "{% for a, (b, c) in [(1, (2, 3)), (4, (5, 6))] %}{{ a }}{{ b }}{{ c }} {% endfor %}", nullptr,
     "123 456 "},
    {"for_over_dict_and_string", "{% for k in d %}{{ k }}{% endfor %} {% for c in 'hé!' %}[{{ c }}]{% endfor %}", nullptr,
     "ba [h][é][!]"},
    {"for_nested_loop_shadowing", "{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}", nullptr,
     "100 201 1|110 211 2|"},
    {"for_break_continue", "{% for x in range(10) %}{% if x is odd %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}", nullptr,
     "0246"},
    {"for_recursive", "{% for x in [1, [2, [3]], 4] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}{{ loop.depth }}{% endif %}{% endfor %}", nullptr,
     "11(22(33))41"},
    {"for_reversed_slice", "{% for m in msgs[::-1] %}{{ m.role[0] }}{% endfor %}", nullptr,
     "aus"},
    {"set_simple", "{% set x = 1 + 2 %}{{ x }}", nullptr,
     "3"},
    {"set_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}", nullptr,
     "1two34"},
    {"set_block", "{% set x %}  in{{ 1 }}  {% endset %}[{{ x }}]", nullptr,
     "[  in1  ]"},
    {"set_block_filtered", "{% set x | upper | trim %}  abc {% endset %}[{{ x }}]", nullptr,
     "[ABC]"},
    {"set_in_if_leaks", "{% if true %}{% set q = 7 %}{% endif %}{{ q }}", nullptr,
     "7"},
    {"set_in_loop_is_local", "{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", nullptr,
     "12121"},
    {"set_in_loop_resets_each_iteration", "{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}", nullptr,
     "[5][][]"},
    {"namespace_accumulates", "{% set ns = namespace(total=0, names='') %}{% for m in msgs %}{% set ns.total = ns.total + 1 %}{% set ns.names = ns.names ~ m.role[0] %}{% endfor %}{{ ns.total }} {{ ns.names }}", nullptr,
     "3 sua"},
    {"namespace_empty_then_assign", "{% set ns = namespace() %}{% set ns.index = 0 %}{% set ns.index = ns.index + 1 %}{{ ns.index }} [{{ ns.missing }}] {{ ns }}", nullptr,
     "1 [] <Namespace {'index': 1}>"},
    {"macro_defaults_and_kwargs", "{% macro m(a, b='B', c=none) %}{{ a }}|{{ b }}|{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2, 3) }} {{ m(1, c=5) }} [{{ m() }}]", nullptr,
     "1|B|None 1|2|3 1|B|5 [|B|None]"},
    {"macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", nullptr,
     "1(2, 3){'x': 4}"},
    {"macro_sees_globals_at_call_time", "{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ m() }}", nullptr,
     "2"},
    {"macro_does_not_see_caller_locals", "{% macro m() %}[{{ y }}]{% endmacro %}{% for y in [3] %}{{ m() }}{% endfor %}", nullptr,
     "[]"},
    {"macro_local_set", "{% macro m() %}{% if q is not defined %}{% set q = 7 %}{% endif %}{{ q }}{% endmacro %}{{ m() }}{% set q = 3 %}{{ m() }}[{{ q }}]", nullptr,
     "73[3]"},
    {"macro_recursive", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", nullptr,
     "4321"},
    {"macro_result_is_string", "{% macro m() %}abc{% endmacro %}{{ m()|length }} {{ m() ~ m() }} {{ m() is string }}", nullptr,
     "3 abcabc True"},
    {"macro_defined_in_loop", "{% for i in [1, 2] %}{% macro m() %}<{{ i }}>{% endmacro %}{{ m() }}{% endfor %}", nullptr,
     "<1><2>"},
    {"macro_whitespace", "{%- macro m(x) -%}\n  [{{ x }}]\n{%- endmacro -%}\n{{ m(1) }}\n{{ m(2) }}", nullptr,
     "[1]\n[2]"},
    {"call_block", "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inner{% endcall %}", nullptr,
     "[inner]"},
    {"call_block_with_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x * 10 }}>{% endcall %}", nullptr,
     "<10><20>"},
    {"filter_block", "{% filter upper %}abc{{ 'd' }}{% endfilter %}|{% filter replace('a', 'b') | trim %}  aaa  {% endfilter %}", nullptr,
     "ABCD|bbb"},
    {"with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", nullptr,
     "3[]"},
    {"raise_exception_not_reached", "{% if false %}{{ raise_exception('no') }}{% endif %}ok", nullptr,
     "ok"},
    {"cycler", "{% set c = cycler('odd', 'even') %}{% for i in range(3) %}{{ c.next() }} {% endfor %}{{ c.current }} {% set _ = c.reset() %}{{ c.current }} {{ c.items }}", "{}",
     "odd even odd even odd ('odd', 'even')"},
};
class JinjaStmt : public ::testing::TestWithParam<RenderCase> {};
TEST_P(JinjaStmt, MatchesJinja2) {
  const RenderCase& c = GetParam();
  EXPECT_EQ(render(c.tmpl, c.ctx ? c.ctx : kJinjaStmtContext), c.expected) << c.tmpl;
}
INSTANTIATE_TEST_SUITE_P(Table, JinjaStmt, ::testing::ValuesIn(kJinjaStmt), render_case_name);

// Statement errors.
const ErrorCase kJinjaStmtErrors[] = {
    {"raise_exception", "{{ raise_exception('Conversation roles must alternate') }}", "{}", "TemplateError"},
    {"unpack_too_many", "{% for a, b in [(1, 2, 3)] %}{% endfor %}", "{}", "ValueError"},
    {"unpack_too_few", "{% set a, b = [1] %}", "{}", "ValueError"},
    {"iterate_none", "{% for x in none %}{% endfor %}", "{}", "TypeError"},
    {"iterate_int", "{% for x in 5 %}{% endfor %}", "{}", "TypeError"},
    {"set_attr_on_non_namespace", "{% set x = {} %}{% set x.y = 1 %}", "{}", "TemplateRuntimeError"},
    {"macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}", "TypeError"},
    {"macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "{}", "TypeError"},
    {"call_non_recursive_loop", "{% for x in [1] %}{{ loop([]) }}{% endfor %}", "{}", "TypeError"},
    {"unknown_filter_when_used", "{{ 1 | frobnicate }}", "{}", "TemplateAssertionError"},
    {"unknown_test_when_used", "{{ 1 is frobnicated }}", "{}", "TemplateAssertionError"},
    // A filter or test named by a string (map, select) is looked up at render time: a runtime error.
    {"unknown_filter_in_map", "{{ [1, 2]|map('frobnicate')|list }}", "{}", "TemplateRuntimeError"},
    {"unknown_test_in_select", "{{ [1, 2]|select('frobnicated')|list }}", "{}", "TemplateRuntimeError"},
    {"cycler_without_items", "{{ cycler() }}", "{}", "RuntimeError"},
};
class JinjaStmtErrors : public ::testing::TestWithParam<ErrorCase> {};
TEST_P(JinjaStmtErrors, Raises) { expect_error(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, JinjaStmtErrors, ::testing::ValuesIn(kJinjaStmtErrors), error_case_name);

}  // namespace
}  // namespace ts::chat::test
