#include "model/jinja/evaluator.h"

#include <gtest/gtest.h>

#include "model/jinja/test_util.h"

namespace crescent::model::jinja {
namespace {

TEST(JinjaEvaluatorTest, Loops) {
  EXPECT_EQ(render_text("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
                        "{{ loop.revindex }}{{ loop.length }},{% endfor %}"),
            "1TrueFalse33,2FalseFalse23,3FalseTrue13,");
  EXPECT_EQ(render_text("{% for x in 'abc' %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }}|"
                        "{% endfor %}"),
            "ab|abc|bc|");
  EXPECT_EQ(render_text("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render_text("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}"
                        "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render_text("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                        {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  EXPECT_EQ(render_text("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}"
                        "{% endfor %}"),
            "2242");
  EXPECT_EQ(render_text("{% for x in undefined_thing %}x{% endfor %}"), "");
}

TEST(JinjaEvaluatorTest, Scoping) {
  // A set inside a loop does not leak out (nor into the next iteration); a namespace does.
  EXPECT_EQ(render_text("{% set x = 0 %}{% for i in range(3) %}{% set x = x + i %}{% endfor %}"
                        "{{ x }}"),
            "0");
  EXPECT_EQ(render_text("{% set ns = namespace(x=0) %}{% for i in range(4) %}"
                        "{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
            "6");
  EXPECT_EQ(render_text("{% if true %}{% set y = 2 %}{% endif %}{{ y }}"), "2");
  EXPECT_EQ(render_text("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render_text("{% set t %}x{{ 1 }}{% endset %}[{{ t }}]"), "[x1]");
  EXPECT_EQ(render_text("{% set d = {'a': 1} %}{% set d.a = 2 %}"),
            "ERROR: chat template error at line 1: cannot assign attribute on non-namespace "
            "object");
}

TEST(JinjaEvaluatorTest, Macros) {
  EXPECT_EQ(render_text("{% macro m(a, b='B') %}<{{ a }}{{ b }}{{ top }}>{% endmacro %}"
                        "{% set top = 'T' %}{{ m(1) }}{{ m(2, b='c') }}{{ m('x', 'y') }}"),
            "<1BT><2cT><xyT>");
}

TEST(JinjaEvaluatorTest, RunawayRecursionFails) {
  EXPECT_EQ(render_text("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "ERROR: chat template error at line 1: maximum recursion depth exceeded in macro 'f'");
  // Recursion that ends is fine.
  EXPECT_EQ(render_text("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}"
                        "{% endmacro %}{{ f(5) }}"),
            "54321");
}

TEST(JinjaEvaluatorTest, AccessAndSlicing) {
  const nlohmann::ordered_json vars = {{"m", {{"role", "user"}, {"content", "hello"}}},
                                       {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(render_text("{{ m.role }} {{ m['content'] }} {{ m.missing }}|", vars), "user hello |");
  EXPECT_EQ(
      render_text("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[-1] }} {{ xs[:2] }} {{ xs[::2] }}", vars),
      "[4, 3, 2, 1] [2, 3, 4] 4 [1, 2] [1, 3]");
  EXPECT_EQ(render_text("{{ m.content[1:3] }}{{ 'héllo'[::-1] }}", vars), "elolléh");
  EXPECT_EQ(render_text("{{ m.get('role') }}{{ m.get('x', 'd') }}{{ m.keys() | list }}", vars),
            "userd['role', 'content']");
  EXPECT_EQ(render_text("{{ m.missing.x }}", vars),
            "ERROR: chat template error at line 1: 'dict object' has no attribute 'missing'");
}

TEST(JinjaEvaluatorTest, Arithmetic) {
  EXPECT_EQ(render_text("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 3 / 2 }} {{ 2 ** 10 }} "
                        "{{ 1 + 1.5 }} {{ 'ab' * 2 }} {{ [1] + [2] }}"),
            "3 -4 2 1.5 1024 2.5 abab [1, 2]");
  EXPECT_EQ(render_text("{{ 1 / 0 }}"), "ERROR: chat template error at line 1: division by zero");
  EXPECT_EQ(render_text("{{ 'a' + 1 }}").substr(0, 6), "ERROR:");
}

}  // namespace
}  // namespace crescent::model::jinja
