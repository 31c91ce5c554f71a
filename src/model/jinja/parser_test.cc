#include "model/jinja/parser.h"

#include <gtest/gtest.h>

#include "model/jinja/test_util.h"

namespace crescent::model::jinja {
namespace {

TEST(JinjaParserTest, Statements) {
  const StmtList body = parse("{% for a, b in x if a %}{{ a }}{% else %}e{% endfor %}");
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(body[0]->kind, StmtKind::kFor);
  EXPECT_EQ(body[0]->targets.size(), 2u);
  EXPECT_NE(body[0]->filter, nullptr);
  EXPECT_EQ(body[0]->else_body.size(), 1u);
}

TEST(JinjaParserTest, Precedence) {
  EXPECT_EQ(render_text("{{ 1 + 2 * 3 ** 2 }}"), "19");
  EXPECT_EQ(render_text("{{ -2 ** 2 }}"), "4");
  EXPECT_EQ(render_text("{{ not x is defined }}"), "True");
  // `~` binds tighter than `+`, as in jinja2.
  EXPECT_EQ(render_text("{{ 'a' ~ (1 + 2) }}"), "a3");
  EXPECT_EQ(render_text("{{ 'a' ~ 1 + 2 }}").substr(0, 6), "ERROR:");
  EXPECT_EQ(render_text("{{ 'b' if false else 'c' if true }}"), "c");
  EXPECT_EQ(render_text("{{ 1 in [1] and 2 not in [1] }}"), "True");
  EXPECT_EQ(render_text("{{ 'x' 'y' }}"), "xy");
  EXPECT_EQ(render_text("{{ (1, 2) }}{{ [1,] }}"), "(1, 2)[1]");
  EXPECT_EQ(render_text("{{ x is equalto 3 }}", {{"x", 3}}), "True");
}

TEST(JinjaParserTest, Errors) {
  EXPECT_THROW(parse("{% if x %}"), Error);
  EXPECT_THROW(parse("{% endif %}"), Error);
  EXPECT_THROW(parse("{{ 1 + }}"), Error);
  // Nesting is bounded: a hostile template fails instead of overflowing the stack.
  EXPECT_THROW(parse("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), Error);
  std::string deep;
  for (int i = 0; i < 1000; ++i) {
    deep += "{% if true %}";
  }
  EXPECT_THROW(parse(deep), Error);
  EXPECT_EQ(render_text("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}"), "1");
  try {
    parse("a\n{% include 'x' %}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_NE(std::string(e.what()).find("unknown tag 'include'"), std::string::npos);
  }
}

}  // namespace
}  // namespace crescent::model::jinja
