#include "core/logging.h"

#include <gtest/gtest.h>

namespace crescent {
namespace {

TEST(LoggingTest, ParsesLevels) {
  EXPECT_EQ(*parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(*parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_FALSE(parse_log_level("loud").is_ok());
}

TEST(LoggingTest, FiltersBelowLevel) {
  LogLevel old = log_level();
  set_log_level(LogLevel::kError);
  int evaluated = 0;
  CRESCENT_LOG(kInfo) << (++evaluated);
  EXPECT_EQ(evaluated, 0) << "a filtered message must not evaluate its arguments";
  set_log_level(old);
}

}  // namespace
}  // namespace crescent
