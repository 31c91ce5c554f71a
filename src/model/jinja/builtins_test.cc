#include "model/jinja/builtins.h"

#include <gtest/gtest.h>

#include "model/jinja/test_util.h"

namespace crescent::model::jinja {
namespace {

TEST(JinjaBuiltinsTest, Tests) {
  const nlohmann::ordered_json vars = {
      {"n", nullptr}, {"s", "x"}, {"d", nlohmann::ordered_json::object()}};
  EXPECT_EQ(render_text("{{ n is none }}{{ s is string }}{{ d is mapping }}{{ u is defined }}"
                        "{{ s is not none }}{{ 1 is integer }}{{ 1.0 is number }}{{ 3 is odd }}"
                        "{{ 9 is divisibleby 3 }}{{ true is boolean }}{{ [] is iterable }}"
                        "{{ 'x' is in 'xy' }}{{ s is sequence }}{{ false is false }}",
                        vars),
            "TrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaBuiltinsTest, Methods) {
  EXPECT_EQ(render_text("{{ ' a '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a,b'.split(',') }}|"
                        "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|"
                        "{{ 'aB'.lower() }}{{ 'aB'.upper() }}|{{ 'a-a'.replace('-', '+') }}|"
                        "{{ '-'.join(['a', 'b']) }}"),
            "a|a|['a', 'b']|TrueTrue|abAB|a+a|a-b");
}

TEST(JinjaBuiltinsTest, Globals) {
  EXPECT_EQ(render_text("{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1) }}"),
            "[0, 1, 2][1, 3, 5]{'a': 1}");
  EXPECT_EQ(render_text("{{ raise_exception('bad role') }}"),
            "ERROR: chat template error at line 1: bad role");
  EXPECT_EQ(render_text("{{ strftime_now('%Y') | length }}"), "4");
  EXPECT_EQ(render_text("{{ x | nosuchfilter }}"),
            "ERROR: chat template error at line 1: no filter named 'nosuchfilter'");
}

}  // namespace
}  // namespace crescent::model::jinja
