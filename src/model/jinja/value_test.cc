#include "model/jinja/value.h"

#include <gtest/gtest.h>

namespace crescent::model::jinja {
namespace {

TEST(JinjaValueTest, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(2.5), "2.5");
  EXPECT_EQ(python_float_repr(-3.25), "-3.25");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1.0 / 3), "0.3333333333333333");
}

TEST(JinjaValueTest, ReprAndStr) {
  auto v = Value::from_json(
      nlohmann::ordered_json::parse(R"([1, 2.5, "a", null, true, {"k": "v'", "z": [false]}])"));
  EXPECT_EQ(v.str(), R"([1, 2.5, 'a', None, True, {'k': "v'", 'z': [False]}])");
  EXPECT_EQ(Value::string("x").str(), "x");
  EXPECT_EQ(Value().str(), "");
  EXPECT_EQ(python_string_repr("a\nb\\"), "'a\\nb\\\\'");
}

TEST(JinjaValueTest, Json) {
  auto v = Value::from_json(
      nlohmann::ordered_json::parse(R"({"b": 1, "a": [1.5, "é\n\"", null], "c": {}})"));
  EXPECT_EQ(v.to_json(), "{\"b\": 1, \"a\": [1.5, \"é\\n\\\"\", null], \"c\": {}}");
  JsonOptions ascii;
  ascii.ensure_ascii = true;
  ascii.sort_keys = true;
  EXPECT_EQ(
      Value::from_json(nlohmann::ordered_json::parse(R"({"z": "é👋", "a": 1})")).to_json(ascii),
      "{\"a\": 1, \"z\": \"\\u00e9\\ud83d\\udc4b\"}");
  JsonOptions indented;
  indented.indent = 2;
  EXPECT_EQ(
      v.to_json(indented),
      "{\n  \"b\": 1,\n  \"a\": [\n    1.5,\n    \"é\\n\\\"\",\n    null\n  ],\n  \"c\": {}\n}");
}

TEST(JinjaValueTest, TruthAndEquality) {
  EXPECT_FALSE(Value().truthy());
  EXPECT_FALSE(Value::string("").truthy());
  EXPECT_FALSE(Value::list().truthy());
  EXPECT_TRUE(Value::namespace_().truthy());
  EXPECT_EQ(Value::integer(1), Value::number(1.0));
  EXPECT_EQ(Value::boolean(true), Value::integer(1));
  EXPECT_NE(Value::string("1"), Value::integer(1));
  EXPECT_TRUE(less_than(Value::string("a"), Value::string("b")));
  EXPECT_THROW(less_than(Value::string("a"), Value::integer(1)), Error);
  EXPECT_EQ(Value::string("héllo").length(), 5);
}

}  // namespace
}  // namespace crescent::model::jinja
