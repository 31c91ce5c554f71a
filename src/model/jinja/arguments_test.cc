#include "model/jinja/arguments.h"

#include <gtest/gtest.h>

namespace crescent::model::jinja {
namespace {

TEST(JinjaArgumentsTest, PositionThenKeywordThenDefault) {
  CallArgs args;
  args.positional.push_back(Value::integer(4));
  args.keyword.emplace_back("first", Value::boolean(true));
  EXPECT_EQ(int_arg(args, 0, "width", 2), 4);
  EXPECT_TRUE(bool_arg(args, 1, "first", false));
  EXPECT_FALSE(bool_arg(args, 2, "blank", false));
  EXPECT_EQ(arg(args, 5, "x", Value::string("d")).str(), "d");
  EXPECT_FALSE(optional_string(args, 3, "chars").has_value());
  EXPECT_EQ(rest_args(args, 1).positional.size(), 0u);
}

TEST(JinjaArgumentsTest, AttributePath) {
  const Value v = Value::from_json(nlohmann::ordered_json::parse(R"({"f": {"name": "x"}})"));
  EXPECT_EQ(attribute_path(v, "f.name").str(), "x");
  EXPECT_TRUE(attribute_path(v, "f.nope").is_undefined());
  EXPECT_TRUE(attribute_path(Value::string("s"), "f").is_undefined());
}

}  // namespace
}  // namespace crescent::model::jinja
