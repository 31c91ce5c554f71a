#pragma once
// Parses the tokens of a template (lexer.h) into statements (ast.h), with jinja2's grammar and
// operator precedence. Tags other than if/for/set/macro/break/continue/filter/generation (raw
// is the lexer's) and their end tags are errors that name the tag. Errors are jinja::Error carrying
// the line.

#include <string_view>

#include "model/jinja/ast.h"

namespace crescent::model::jinja {

StmtList parse(std::string_view source);

}  // namespace crescent::model::jinja
