#include "core/json.h"

#include <gtest/gtest.h>

#include <string>

namespace crescent {
namespace {

std::string error_of(std::string_view text) {
  auto j = parse_json(text, "the body");
  EXPECT_FALSE(j.is_ok()) << text;
  if (j.is_ok()) {
    return "";
  }
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  return j.status().message();
}

TEST(JsonTest, ParsesValidText) {
  auto j = parse_json(R"({"a":[1,2.5,"x",null],"b":1e308})", "the body");
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  EXPECT_EQ((*j)["a"][1].get<double>(), 2.5);
  EXPECT_EQ((*j)["b"].get<double>(), 1e308);
  // Integers past uint64 become doubles; only a double's overflow is an error.
  EXPECT_TRUE(parse_json("123456789012345678901234567890", "x").is_ok());
}

TEST(JsonTest, KeepsKeyOrderForOrderedJson) {
  auto j = parse_json<nlohmann::ordered_json>(R"({"z":1,"a":2})", "the body");
  ASSERT_TRUE(j.is_ok());
  EXPECT_EQ(j->dump(), R"({"z":1,"a":2})");
  EXPECT_NE(parse_json<nlohmann::ordered_json>(R"({"z":1e400})", "the body")
                .status()
                .message()
                .find("out of range"),
            std::string::npos);
}

TEST(JsonTest, NumberOverflowNamesTheNumberAndWhere) {
  EXPECT_EQ(error_of(R"({"model":"x","max_tokens":1e400,"prompt":"a"})"),
            "the body has a number out of range at line 1, column 27: 1e400 does not fit in a "
            "double (largest magnitude about 1.8e308)");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":"hi"}],"temperature":-1e400})"),
            "the body has a number out of range at line 1, column 60: -1e400 does not fit in a "
            "double (largest magnitude about 1.8e308)");
  EXPECT_NE(error_of("{\"a\":\n  [1, 2e999]}").find("at line 2, column 7: 2e999 "),
            std::string::npos);
  EXPECT_NE(error_of("1e400").find("at line 1, column 1: 1e400 "), std::string::npos);
  EXPECT_NE(error_of(R"({"a":1e400)").find("column 6: 1e400 "), std::string::npos);
  // A number of many digits is not echoed whole.
  std::string huge = "[1" + std::string(100000, '0') + "]";
  std::string message = error_of(huge);
  EXPECT_NE(message.find("column 2: 1000"), std::string::npos) << message;
  EXPECT_LT(message.size(), 200u);
}

TEST(JsonTest, SyntaxErrorsSayWhere) {
  EXPECT_EQ(error_of(R"({"a":)"),
            "the body is not valid JSON: parse error at line 1, column 6: syntax error while "
            "parsing value - unexpected end of input; expected '[', '{', or a literal");
  EXPECT_NE(error_of("").find("the body is not valid JSON: "), std::string::npos);
  EXPECT_NE(error_of("[1] x").find("expected end of input"), std::string::npos);
  EXPECT_NE(error_of("{\"a\":\"\xff\"}").find("ill-formed UTF-8"), std::string::npos);
  std::string long_string = R"({"a":")" + std::string(10000, 'x') + "\x01\"}";
  EXPECT_LT(error_of(long_string).size(), 400u);
}

std::string nested(int depth) {
  std::string s(depth, '[');
  s.append("1").append(depth, ']');
  return s;
}

TEST(JsonTest, NestingUpToTheLimitParses) {
  auto at_limit = parse_json(nested(kMaxJsonDepth), "the body");
  ASSERT_TRUE(at_limit.is_ok()) << at_limit.status().to_string();
  EXPECT_TRUE(parse_json(nested(3), "the body", /*max_depth=*/3).is_ok());
  // Objects count as arrays do.
  std::string objects;
  for (int i = 0; i < 10; ++i) {
    objects += R"({"a":)";
  }
  objects.append("1").append(10, '}');
  EXPECT_TRUE(parse_json(objects, "the body", 10).is_ok());
  EXPECT_FALSE(parse_json(objects, "the body", 9).is_ok());
}

TEST(JsonTest, NestingPastTheLimitSaysHowDeepAndWhere) {
  EXPECT_EQ(error_of(nested(kMaxJsonDepth + 1)),
            "the body nests arrays and objects more than 512 levels deep (at line 1, column 513)");
  auto shallow = parse_json(R"({"a": {"b": [[1]]}})", "the body", 3);
  ASSERT_FALSE(shallow.is_ok());
  EXPECT_EQ(shallow.status().message(),
            "the body nests arrays and objects more than 3 levels deep (at line 1, column 14)");
  std::string two_lines = "{\"a\":\n";
  two_lines.append(nested(600)).append("}");
  EXPECT_NE(error_of(two_lines).find("(at line 2, column 512)"), std::string::npos);
  // A body of megabytes of '[' is refused before nlohmann builds anything from it.
  std::string message = error_of(std::string(8 << 20, '['));
  EXPECT_NE(message.find("more than 512 levels deep"), std::string::npos) << message;
  EXPECT_FALSE(parse_json<nlohmann::ordered_json>(nested(513), "the body").is_ok());
}

TEST(JsonTest, BracketsInsideStringsDoNotNest) {
  const std::string brackets(2000, '[');
  std::string in_string = R"({"a":")";
  in_string.append(brackets).append(R"("})");
  auto j = parse_json(in_string, "the body");
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  EXPECT_EQ((*j)["a"], brackets);
  // Escaped quotes and backslashes do not end the string early.
  const std::string tricky = R"({"a":"x\"[[[\\","b":"\\\"[[[["})";
  auto t = parse_json(tricky, "the body", 1);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ((*t)["a"], "x\"[[[\\");
  EXPECT_EQ((*t)["b"], "\\\"[[[[");
  // After a string that ends in an escaped backslash, brackets count again.
  EXPECT_FALSE(parse_json(R"(["\\", [[1]]])", "the body", 2).is_ok());
  // An unterminated string is the parser's error, not the depth check's.
  EXPECT_NE(error_of(R"(["abc)").find("is not valid JSON"), std::string::npos);
}

TEST(JsonTest, HugeIntegersAndNegativeOverflow) {
  // Past int64 and uint64: a double (inexact), not an error.
  auto big = parse_json(R"({"a":-99999999999999999999999,"b":18446744073709551616})", "the body");
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_TRUE((*big)["a"].is_number_float());
  EXPECT_TRUE((*big)["b"].is_number_float());
  auto max_u64 = parse_json("18446744073709551615", "the body");
  ASSERT_TRUE(max_u64.is_ok());
  EXPECT_TRUE(max_u64->is_number_unsigned());
  EXPECT_NE(error_of("[-1e400]").find("column 2: -1e400 does not fit"), std::string::npos);
  std::string long_number = "[1";
  long_number.append(400, '0').append("]");
  EXPECT_NE(error_of(long_number).find("does not fit in a double"), std::string::npos);
}

}  // namespace
}  // namespace crescent
