#include "model/jinja/lexer.h"

#include <gtest/gtest.h>

#include "model/jinja/test_util.h"
#include "model/jinja/value.h"

namespace crescent::model::jinja {
namespace {

TEST(JinjaLexerTest, Tokens) {
  const std::vector<Token> t = tokenize("a{{ x|join('\\n') }}b");
  ASSERT_EQ(t.size(), 11u);
  EXPECT_EQ(t[0].text, "a");
  EXPECT_EQ(t[1].kind, TokenKind::kVariableBegin);
  EXPECT_EQ(t[2].text, "x");
  EXPECT_EQ(t[3].text, "|");
  EXPECT_EQ(t[6].kind, TokenKind::kString);
  EXPECT_EQ(t[6].text, "\n");
  EXPECT_EQ(t[10].kind, TokenKind::kEnd);
}

TEST(JinjaLexerTest, WhitespaceControl) {
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indentation before.
  EXPECT_EQ(render_text("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render_text("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render_text("a\n{{- 'b' -}}\nc"), "abc");
  EXPECT_EQ(render_text("a\n  {{ 'b' }}\n"), "a\n  b");
  EXPECT_EQ(render_text("a {# c #}\nb"), "a b");
  EXPECT_EQ(render_text("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render_text("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
  // One trailing newline goes; \r\n and \r become \n.
  EXPECT_EQ(render_text("a\n"), "a");
  EXPECT_EQ(render_text("a\n\n"), "a\n");
  EXPECT_EQ(render_text("a\r\nb\rc\n"), "a\nb\nc");
}

TEST(JinjaLexerTest, Errors) {
  EXPECT_THROW(tokenize("{{ x "), Error);
  EXPECT_THROW(tokenize("{# x"), Error);
  EXPECT_THROW(tokenize("{{ 'x }}"), Error);
  try {
    tokenize("a\nb\n{{ x $ }}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.line(), 3);
  }
}

}  // namespace
}  // namespace crescent::model::jinja
