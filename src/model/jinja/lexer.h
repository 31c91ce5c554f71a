#pragma once
// Splits a template into text and the tokens of its {{ }} and {% %} tags, applying jinja2's
// whitespace rules as transformers configures them: trim_blocks (the newline after a block or
// comment tag goes), lstrip_blocks (spaces before a block or comment tag at the start of a
// line go), and the `-`/`+` markers; newlines are normalised to \n and one trailing newline
// is dropped, as jinja2's defaults do. Comments are dropped here. Errors are jinja::Error.

#include <string>
#include <string_view>
#include <vector>

namespace crescent::model::jinja {

enum class TokenKind {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text holds the unescaped value
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;
  int line;
};

std::vector<Token> tokenize(std::string_view source);

}  // namespace crescent::model::jinja
