#include "bench/disagg/copy_baseline.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace crescent::bench {
namespace {

TEST(CopyBaselineTest, EveryKindCopiesAndTakesTime) {
  // Not a multiple of the 1 MiB piece, so the pieces' last one is short.
  constexpr uint64_t kBytes = (3u << 20) + 17;
  for (CopyKind kind : kCopyKinds) {
    auto s = time_one_copy(kBytes, kind);
    ASSERT_TRUE(s.is_ok()) << copy_kind_key(kind) << ": " << s.status().to_string();
    EXPECT_GT(*s, 0) << copy_kind_key(kind);
    EXPECT_LT(*s, 10) << copy_kind_key(kind);
  }
}

TEST(CopyBaselineTest, ZeroBytesIsRefused) {
  auto s = time_one_copy(0, CopyKind::kTouched);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("0 bytes"), std::string::npos);
}

TEST(CopyBaselineTest, KindsHaveDistinctNamesAndKeys) {
  std::set<std::string> names, keys;
  for (CopyKind kind : kCopyKinds) {
    names.insert(copy_kind_name(kind));
    keys.insert(copy_kind_key(kind));
  }
  EXPECT_EQ(names.size(), std::size(kCopyKinds));
  EXPECT_EQ(keys.size(), std::size(kCopyKinds));
  EXPECT_EQ(std::string(copy_kind_key(CopyKind::kTouched)), "touched");
}

}  // namespace
}  // namespace crescent::bench
