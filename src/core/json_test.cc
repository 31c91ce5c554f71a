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

}  // namespace
}  // namespace crescent
