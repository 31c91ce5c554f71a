#include "model/jinja/filters.h"

#include <gtest/gtest.h>

#include "model/jinja/test_util.h"

namespace crescent::model::jinja {
namespace {

TEST(JinjaFiltersTest, Filters) {
  EXPECT_EQ(render_text("{{ '  x ' | trim }}|{{ 'ab' | upper }}|{{ [1,2] | length }}|"
                        "{{ [1,2] | first }}{{ [1,2] | last }}|{{ [1,2] | join(', ') }}|"
                        "{{ x | default('d') }}|{{ '' | d('e', true) }}|{{ 'a b c' | wordcount }}"),
            "x|AB|2|12|1, 2|d|e|3");
  EXPECT_EQ(
      render_text("{{ '3' | int + 1 }} {{ 'x' | int }} {{ 2 | float }} {{ 2.567 | round(2) }} "
                  "{{ -3 | abs }} {{ 'aXa' | replace('a', 'b') }} {{ 'hi there' | title }}"),
      "4 0 2.0 2.57 3 bXb Hi There");
  EXPECT_EQ(
      render_text("{{ [3,1,2] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ [1,1,2] | unique "
                  "| list }} {{ [1,2] | reverse | list }} {{ [1,2,3] | sum }} {{ [4,2,9] | max }}"),
      "[1, 2, 3] [3, 2, 1] [1, 2] [2, 1] 6 9");
  EXPECT_EQ(render_text("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}"),
            "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(render_text("{{ '<x>' | e }} {{ '<x>' | safe }} {{ {'a': 1} | items | list }}"),
            "&lt;x&gt; <x> [('a', 1)]");
  EXPECT_EQ(render_text("{{ x | tojson }}|{{ x | tojson(indent=2) }}", {{"x", {{"k", {1, "é"}}}}}),
            "{\"k\": [1, \"é\"]}|{\n  \"k\": [\n    1,\n    \"é\"\n  ]\n}");
  EXPECT_EQ(render_text("{{ [1,2,3,4,5] | batch(2) | list }}"), "[[1, 2], [3, 4], [5]]");
}

TEST(JinjaFiltersTest, SelectAndMap) {
  const nlohmann::ordered_json vars = {
      {"ms", {{{"role", "system"}, {"c", "s"}}, {{"role", "user"}, {"c", "u"}}}}};
  EXPECT_EQ(render_text("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') "
                        "| join }}",
                        vars),
            "u");
  EXPECT_EQ(render_text("{{ ms | rejectattr('role', '==', 'user') | list | length }}", vars), "1");
  EXPECT_EQ(render_text("{{ [1,2,3,4] | select('odd') | list }}{{ [1,0] | reject | list }}"),
            "[1, 3][0]");
  EXPECT_EQ(render_text("{{ ['a','b'] | map('upper') | join }}"), "AB");
}

TEST(JinjaFiltersTest, DirectCall) {
  CallArgs args;
  args.positional.push_back(Value::string("-"));
  EXPECT_EQ(apply_filter("join", Value::list({Value::integer(1), Value::string("a")}), args).str(),
            "1-a");
  EXPECT_THROW(apply_filter("nosuch", Value(), {}), Error);
}

}  // namespace
}  // namespace crescent::model::jinja
