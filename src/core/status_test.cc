#include "core/status.h"

#include <gtest/gtest.h>

namespace crescent {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0)
    return invalid_argument("not positive: " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_all(int a, int b) {
  RETURN_IF_ERROR(parse_positive(a));
  RETURN_IF_ERROR(parse_positive(b));
  return Status::ok();
}

TEST(StatusTest, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_EQ(s.code(), StatusCode::kOk);
}

TEST(StatusTest, ErrorCarriesCodeMessageAndContext) {
  Status s = not_found("tensor 'x' missing").with_context("loading model");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NOT_FOUND: loading model: tensor 'x' missing");
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*doubled(4), 8);
  auto r = doubled(-1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "not positive: -1");
  EXPECT_TRUE(check_all(1, 2).is_ok());
  EXPECT_EQ(check_all(1, 0).code(), StatusCode::kInvalidArgument);
}

TEST(StatusDeathTest, ValueOfFailedResultAborts) {
  Result<int> r = internal_error("boom");
  EXPECT_DEATH((void)r.value(), "value\\(\\) of a failed Result");
}

}  // namespace
}  // namespace crescent
