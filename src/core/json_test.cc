#include "core/json.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

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

std::string string_field_error(const nlohmann::json& object, std::string_view context = "obj") {
  auto r = json_string_field(object, "f", context);
  EXPECT_FALSE(r.is_ok()) << object.dump();
  if (r.is_ok()) {
    return "";
  }
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

std::string unsigned_field_error(const nlohmann::json& object, uint64_t max_value = UINT64_MAX) {
  auto r = json_unsigned_field(object, "f", "obj", max_value);
  EXPECT_FALSE(r.is_ok()) << object.dump();
  if (r.is_ok()) {
    return "";
  }
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

nlohmann::json parsed(std::string_view text) {
  auto j = parse_json(text, "the test's JSON");
  EXPECT_TRUE(j.is_ok()) << j.status().to_string();
  return j.is_ok() ? *j : nlohmann::json();
}

TEST(JsonFieldTest, StringFieldReadsAString) {
  auto r = json_string_field(parsed(R"({"f":"x y","g":1})"), "f", "obj");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, "x y");
  auto empty = json_string_field(parsed(R"({"f":""})"), "f", "obj");
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(*empty, "");
}

TEST(JsonFieldTest, StringFieldRefusesMissingAndWrongTypes) {
  EXPECT_EQ(string_field_error(parsed(R"({"g":"x"})")), "obj: missing field 'f'");
  EXPECT_EQ(string_field_error(parsed(R"({"f":5})")), "obj: field 'f' must be a string, got 5");
  EXPECT_EQ(string_field_error(parsed(R"({"f":1e300})")),
            "obj: field 'f' must be a string, got 1e+300");
  EXPECT_EQ(string_field_error(parsed(R"({"f":-1})")), "obj: field 'f' must be a string, got -1");
  EXPECT_EQ(string_field_error(parsed(R"({"f":true})")),
            "obj: field 'f' must be a string, got true");
  EXPECT_EQ(string_field_error(parsed(R"({"f":null})")),
            "obj: field 'f' must be a string, got null");
  EXPECT_EQ(string_field_error(parsed(R"({"f":["x"]})")),
            "obj: field 'f' must be a string, got [\"x\"]");
  // Without a context the message starts at the field.
  EXPECT_EQ(string_field_error(parsed(R"({})"), ""), "missing field 'f'");
  EXPECT_EQ(string_field_error(parsed(R"({"f":{}})"), ""), "field 'f' must be a string, got {}");
  // Not an object: nothing is found, nothing throws.
  EXPECT_EQ(string_field_error(parsed(R"(["f"])")), "obj: missing field 'f'");
  EXPECT_EQ(string_field_error(parsed("7")), "obj: missing field 'f'");
}

TEST(JsonFieldTest, WrongValuesAreClippedInTheMessage) {
  nlohmann::json big = {{"f", nlohmann::json::array()}};
  for (int i = 0; i < 10000; ++i) {
    big["f"].push_back(i);
  }
  const std::string message = string_field_error(big);
  EXPECT_EQ(message.rfind("obj: field 'f' must be a string, got [0,1,2,", 0), 0u) << message;
  EXPECT_LT(message.size(), 100u);
  EXPECT_EQ(message.substr(message.size() - 3), "...");
  // Invalid UTF-8 in a value built in code is replaced, not thrown.
  EXPECT_NE(unsigned_field_error({{"f", "\xff"}}).find("must be an integer, got \""),
            std::string::npos);
}

TEST(JsonFieldTest, UnsignedFieldReadsNonNegativeIntegers) {
  auto zero = json_unsigned_field(parsed(R"({"f":0})"), "f", "obj");
  ASSERT_TRUE(zero.is_ok()) << zero.status().to_string();
  EXPECT_EQ(*zero, 0u);
  auto max_u64 = json_unsigned_field(parsed(R"({"f":18446744073709551615})"), "f", "obj");
  ASSERT_TRUE(max_u64.is_ok()) << max_u64.status().to_string();
  EXPECT_EQ(*max_u64, UINT64_MAX);
  auto at_max = json_unsigned_field(parsed(R"({"f":1023})"), "f", "obj", 1023);
  ASSERT_TRUE(at_max.is_ok()) << at_max.status().to_string();
  EXPECT_EQ(*at_max, 1023u);
  // Built in code, a non-negative value may be a signed integer.
  nlohmann::json built = {{"f", int64_t{7}}};
  ASSERT_TRUE(built["f"].is_number_integer() && !built["f"].is_number_unsigned());
  auto signed_seven = json_unsigned_field(built, "f", "obj");
  ASSERT_TRUE(signed_seven.is_ok()) << signed_seven.status().to_string();
  EXPECT_EQ(*signed_seven, 7u);
}

TEST(JsonFieldTest, UnsignedFieldRefusesMissingWrongTypesAndNegatives) {
  EXPECT_EQ(unsigned_field_error(parsed(R"({"g":1})")), "obj: missing field 'f'");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":"7"})")),
            "obj: field 'f' must be an integer, got \"7\"");
  // A float is refused by its type, never converted (1e300 to an integer is undefined).
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":1e300})")),
            "obj: field 'f' must be an integer, got 1e+300");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":-2e300})")),
            "obj: field 'f' must be an integer, got -2e+300");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":1.0})")),
            "obj: field 'f' must be an integer, got 1.0");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":2.5})")),
            "obj: field 'f' must be an integer, got 2.5");
  // Past uint64 the parser makes a double, refused the same way.
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":18446744073709551616})"))
                .rfind("obj: field 'f' must be an integer, got 1.8446744073709552e+19", 0),
            0u);
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":true})")),
            "obj: field 'f' must be an integer, got true");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":null})")),
            "obj: field 'f' must be an integer, got null");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":-1})")),
            "obj: field 'f' must be a non-negative integer, got -1");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":-9223372036854775808})")),
            "obj: field 'f' must be a non-negative integer, got -9223372036854775808");
  EXPECT_EQ(unsigned_field_error({{"f", int64_t{-3}}}),
            "obj: field 'f' must be a non-negative integer, got -3");
}

TEST(JsonFieldTest, UnsignedFieldRefusesValuesAboveTheMax) {
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":1024})"), 1023),
            "obj: field 'f' must be in 0..1023, got 1024");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":18446744073709551615})"), 1023),
            "obj: field 'f' must be in 0..1023, got 18446744073709551615");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":-5})"), 1023),
            "obj: field 'f' must be in 0..1023, got -5");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":0.5})"), 1023),
            "obj: field 'f' must be an integer, got 0.5");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":9223372036854775808})"), INT64_MAX),
            "obj: field 'f' must be in 0..9223372036854775807, got 9223372036854775808");
  EXPECT_EQ(unsigned_field_error(parsed(R"({"f":1})"), 0), "obj: field 'f' must be in 0..0, got 1");
  auto in_range = json_unsigned_field(parsed(R"({"f":9223372036854775807})"), "f", "", INT64_MAX);
  ASSERT_TRUE(in_range.is_ok()) << in_range.status().to_string();
  EXPECT_EQ(*in_range, static_cast<uint64_t>(INT64_MAX));
}

}  // namespace
}  // namespace crescent
