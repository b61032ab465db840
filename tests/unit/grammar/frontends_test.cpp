// Front ends: regex, GBNF, Lark, choice lists -- what they accept, and the errors they name.
#include <gtest/gtest.h>

#include "grammar_util.h"

namespace ts::grammar {
namespace {
using test::matches;

TEST(Regex, ClassesQuantifiersGroups) {
  auto g = test::compile(regex_grammar(R"(^[a-c]+\d{2,3}(x|yz)?\.$)"));
  EXPECT_TRUE(matches(g, "ab12."));
  EXPECT_TRUE(matches(g, "c123yz."));
  EXPECT_TRUE(matches(g, "a99x."));
  EXPECT_FALSE(matches(g, "ab1"));
  EXPECT_FALSE(matches(g, "ab1234"));
  EXPECT_FALSE(matches(g, "d12"));
  EXPECT_FALSE(matches(g, "a12y"));
}

TEST(Regex, EscapesNegationUnicodeAndDot) {
  auto g = test::compile(regex_grammar(R"([^\s,]+,\w*\x41\u00e9.)"));
  EXPECT_TRUE(matches(g, "héllo,w_1Aé!"));
  EXPECT_TRUE(matches(g, "日本,Aé€"));  // . is any code point, multi-byte too
  EXPECT_FALSE(matches(g, "a b,Aé!"));
  EXPECT_FALSE(matches(g, "ab,Aé\n"));
}

TEST(Regex, BoundedRepeatsAndNesting) {
  auto g = test::compile(regex_grammar("(ab|c){2}(d{1,})?e{0,2}"));
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "ccddddee"));
  EXPECT_FALSE(matches(g, "c"));
  EXPECT_FALSE(matches(g, "abcceee"));
}

// not_in_open_classes: dropped from the classes that say what they exclude (., [^..], \S), kept
// where the pattern writes the character out.
TEST(Regex, CharactersOutOfOpenClasses) {
  auto re = [](std::string_view p) {
    Grammar g;
    int root = g.rule("root");
    g.define(root, add_regex(g, p, false, false, {{'<', '<'}}));
    g.set_root(root);
    return test::compile(g);
  };
  auto dot = re("a.+z");
  EXPECT_TRUE(matches(dot, "a>bz"));
  EXPECT_FALSE(matches(dot, "a<bz"));
  EXPECT_FALSE(matches(re("[^,]+"), "x<y"));
  EXPECT_TRUE(matches(re("[^,]+"), "x>y"));
  EXPECT_FALSE(matches(re("\\S+"), "a<b"));
  EXPECT_FALSE(matches(re("[\\Sx]+"), "a<b"));
  EXPECT_TRUE(matches(re("<[a-z]+>"), "<tag>"));  // written out: kept
  EXPECT_TRUE(matches(re("[<>]"), "<"));
  EXPECT_TRUE(matches(regex_grammar("a.+z"), "a<bz"));  // the default: no character is dropped
}

TEST(Regex, ErrorsNameTheProblem) {
  auto msg = [](const char* p) {
    try {
      regex_grammar(p);
    } catch (const InvalidRequest& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("(ab").find("missing ')'"), std::string::npos);
  EXPECT_NE(msg("ab)").find("unbalanced"), std::string::npos);
  EXPECT_NE(msg("[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(msg("(a)\\1").find("backreference"), std::string::npos);
  EXPECT_NE(msg("(?=a)").find("lookaround"), std::string::npos);
  EXPECT_NE(msg("a{3,1}").find("n < m"), std::string::npos);
  EXPECT_NE(msg("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(msg("[abc").find("unterminated"), std::string::npos);
}

TEST(Gbnf, LlamaCppStyle) {
  auto g = test::compile(parse_gbnf(R"G(
    # a tiny arithmetic grammar
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= num | "(" expr ")"
    num  ::= [0-9]+ ("." [0-9]{1,3})?
  )G"));
  EXPECT_TRUE(matches(g, "1+2"));
  EXPECT_TRUE(matches(g, "(1.5-2)+(3)"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "1.2345"));
  EXPECT_FALSE(matches(g, "(1"));
}

TEST(Gbnf, EscapesAndClasses) {
  auto g = test::compile(parse_gbnf("root ::= \"\\\"q\\\"\\n\" [^\\x00-\\x1F\"]* [\\u00e0-\\u00ff]"));
  EXPECT_TRUE(matches(g, "\"q\"\nabcà"));
  EXPECT_TRUE(matches(g, "\"q\"\nÿ"));
  EXPECT_FALSE(matches(g, "\"q\"\na\"à"));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  auto msg = [](const char* p) {
    try {
      parse_gbnf(p);
    } catch (const InvalidRequest& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("root ::= foo").find("'foo' is used but never defined"), std::string::npos);
  EXPECT_NE(msg("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a").find("unterminated string"), std::string::npos);
  EXPECT_NE(msg("root ::= (\"a\"").find("missing ')'"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  // Left recursion would grow the stack forever: rejected when compiled.
  EXPECT_THROW(test::compile(parse_gbnf("root ::= root \"a\" | \"b\"")), InvalidRequest);
  // Tail recursion and nullable loops are fine.
  EXPECT_TRUE(matches(parse_gbnf("root ::= \"a\" root | \"\""), "aaa"));
  EXPECT_TRUE(matches(parse_gbnf("root ::= (\"a\"?)* \"b\""), "aab"));
}

TEST(Lark, VllmStyle) {
  auto g = test::compile(parse_lark(R"(
    // SQL-ish
    start: select_stmt
    select_stmt: "SELECT"i _WS column ("," _WS? column)* _WS "FROM" _WS NAME [_WS "LIMIT" _WS INT]
    column: NAME | "*"
    NAME: /[a-z_][a-z0-9_]*/
    _WS: " "+
    %import common.INT
  )"));
  EXPECT_TRUE(matches(g, "SELECT a, b FROM t"));
  EXPECT_TRUE(matches(g, "select * FROM users LIMIT 10"));
  EXPECT_FALSE(matches(g, "SELECT FROM t"));
  EXPECT_FALSE(matches(g, "SELECT a FROM t LIMIT x"));
  EXPECT_THROW(parse_lark("start: a\n%ignore WS"), InvalidRequest);  // `a` never defined
  EXPECT_TRUE(matches(parse_ebnf("start: \"x\"~2..3"), "xxx"));
  EXPECT_TRUE(matches(parse_ebnf("root ::= \"x\"{2}"), "xx"));
}

// As llama.cpp parses GBNF: blanks before operators and inside {m,n}, `.` any character (newlines
// too), a comment with a colon above the first rule; groups nested past the limit are a 400, not
// a crashed server.
TEST(Gbnf, LlamaCppParserDetails) {
  EXPECT_TRUE(matches(parse_gbnf("root ::= \"a\" * \"b\""), "aaab"));
  EXPECT_TRUE(matches(parse_gbnf("root ::= \"a\"{ 2, 3 }"), "aaa"));
  EXPECT_TRUE(matches(parse_gbnf("root ::= \"a\"{2, 3}"), "aa"));
  EXPECT_FALSE(matches(parse_gbnf("root ::= \"a\"{2, 3}"), "aaaa"));
  EXPECT_TRUE(matches(parse_gbnf("root ::= \"a\" ( \"b\" ) +"), "abb"));
  EXPECT_TRUE(matches(parse_gbnf("root ::= .{1,3}"), "a\nb"));
  EXPECT_TRUE(matches(parse_ebnf("# note: a comment with a colon\n# see https://x.y\nroot ::= \"a\""), "a"));
  EXPECT_TRUE(matches(parse_ebnf("// a Lark comment: with a colon\nstart: \"b\""), "b"));
  std::string deep = "root ::= " + std::string(20000, '(') + "\"a\"" + std::string(20000, ')');
  EXPECT_THROW(parse_gbnf(deep), InvalidRequest);
  EXPECT_THROW(parse_lark("start: " + std::string(20000, '(') + "\"a\"" + std::string(20000, ')')), InvalidRequest);
  EXPECT_TRUE(matches(parse_gbnf("root ::= " + std::string(500, '(') + "\"a\"" + std::string(500, ')')), "a"));
}

// Lark as Lark reads it: common terminals as common.lark defines them, grouped imports,
// "a".."z", /re/i, and %ignore (the ignored text between a rule's items, repetitions, and around
// the input; never inside a terminal).
TEST(Lark, LarkDetails) {
  auto str = test::compile(parse_lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING"));
  EXPECT_TRUE(matches(str, R"("a \"q\" \\ b")"));
  EXPECT_FALSE(matches(str, "\"a\nb\""));  // no raw newline (Lark's . excludes it)
  EXPECT_FALSE(matches(str, R"("a"b")"));
  auto nums = test::compile(parse_lark("start: NUMBER (\",\" SIGNED_NUMBER)*\n%import common (NUMBER, SIGNED_NUMBER)"));
  for (const char* ok : {"1", ".5", "1.", "2e3", "1.5E-2,-3,+.25"}) EXPECT_TRUE(matches(nums, ok)) << ok;
  for (const char* bad : {"e3", ".", "1,", "+1"}) EXPECT_FALSE(matches(nums, bad)) << bad;
  auto range = test::compile(parse_lark("start: (\"a\"..\"c\")+ /xy/i"));
  EXPECT_TRUE(matches(range, "abcaXy"));
  EXPECT_TRUE(matches(range, "bxY"));
  EXPECT_FALSE(matches(range, "dxy"));
  auto sql = test::compile(parse_lark(R"(
    start: "select" NAME ("," NAME)* "from" NAME
    NAME: /[a-z]+/
    %import common.WS
    %ignore WS
  )"));
  EXPECT_TRUE(matches(sql, "select a, b from t"));
  EXPECT_TRUE(matches(sql, "  select a ,b\n from   t  "));
  EXPECT_TRUE(matches(sql, "select a from t"));
  EXPECT_FALSE(matches(sql, "select a b from t"));
  EXPECT_FALSE(matches(sql, "select a from"));
  // Terminals keep their own text: no ignored text inside NAME.
  auto kw = test::compile(parse_lark("start: WORD+\nWORD: \"ab\"\n%ignore \" \""));
  EXPECT_TRUE(matches(kw, "ab ab  ab"));
  EXPECT_FALSE(matches(kw, "a b"));
}

TEST(Choice, ExactlyOne) {
  auto g = test::compile(choice_grammar({"yes", "no", "maybe so"}));
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "maybe so"));
  EXPECT_FALSE(matches(g, "maybe"));
  EXPECT_FALSE(matches(g, "yesno"));
  EXPECT_THROW(choice_grammar({}), InvalidRequest);
}

TEST(Sampler, SamplesOfFrontEndsAreAccepted) {
  for (const char* re : {R"([a-z]{1,8}@[a-z]+\.(com|org))", R"(\d{3}-\d{4}|\(\d{3}\) \d{4})", "(a|b)*c[^x]{2}"}) {
    Grammar g = regex_grammar(re);
    auto cg = test::compile(g);
    test::Sampler s(g, 7);
    for (int i = 0; i < 50; ++i) {
      std::string x = s.sample();
      EXPECT_TRUE(matches(cg, x)) << re << " " << x;
    }
  }
}

}  // namespace
}  // namespace ts::grammar
