// Shared helpers for the chat template tests. The tables' expected strings were produced by
// rendering the same template and context with jinja2 3.1 configured as transformers does.
#pragma once
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "chat/jinja.h"

namespace ts::chat::test {

inline std::string render(const std::string& tmpl, const std::string& ctx = "{}", const RenderOptions& opts = {}) {
  return Template::parse(tmpl).render(nlohmann::ordered_json::parse(ctx), opts);
}

struct RenderCase {
  const char* name;
  const char* tmpl;
  const char* ctx;  // JSON object
  const char* expected;
};

struct ErrorCase {
  const char* name;
  const char* tmpl;
  const char* ctx;
  const char* kind;  // TemplateError::kind
};

// gtest prints parameters in test names; show the row name instead of the struct's bytes.
inline void PrintTo(const RenderCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

inline std::string render_case_name(const ::testing::TestParamInfo<RenderCase>& i) { return i.param.name; }
inline std::string error_case_name(const ::testing::TestParamInfo<ErrorCase>& i) { return i.param.name; }

// Renders an ErrorCase and checks the error kind and that it carries a position.
inline void expect_error(const ErrorCase& c) {
  try {
    std::string out = render(c.tmpl, c.ctx);
    ADD_FAILURE() << "expected " << c.kind << ", rendered: " << out;
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind, c.kind) << e.what();
    EXPECT_GT(e.line, 0) << e.what();
    EXPECT_GT(e.col, 0) << e.what();
  }
}

}  // namespace ts::chat::test
