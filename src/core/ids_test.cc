#include "core/ids.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>

namespace crescent {
namespace {

struct FooTag {};
using FooId = StrongId<FooTag>;

TEST(IdsTest, StrongIdComparesAndDefaultsInvalid) {
  FooId a(3), b(4);
  EXPECT_LT(a, b);
  EXPECT_FALSE(FooId().is_valid());
  EXPECT_TRUE(a.is_valid());
}

TEST(IdsTest, UuidIsVersion4AndUnique) {
  std::set<std::string> seen;
  std::regex re("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  for (int i = 0; i < 1000; ++i) {
    std::string u = random_uuid();
    ASSERT_TRUE(std::regex_match(u, re)) << u;
    seen.insert(u);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace crescent
