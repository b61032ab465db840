// Tokenizer for chat templates with transformers' environment settings baked in: trim_blocks,
// lstrip_blocks, `-`/`+` whitespace control, comments, raw blocks, newlines normalized to "\n"
// and the template's single trailing newline dropped (jinja2's keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ts::chat::jinja {

enum class Tok : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string value;  // text, name, decoded string literal or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 0, col = 0;
};

// Throws TemplateError (TemplateSyntaxError) with the position of the problem.
std::vector<Token> tokenize(std::string_view source);

}  // namespace ts::chat::jinja
