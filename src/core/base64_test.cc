#include "core/base64.h"

#include <gtest/gtest.h>

namespace crescent {
namespace {

TEST(Base64Test, MatchesRfc4648) {
  auto b64 = [](std::string_view s) { return base64_encode(s); };
  EXPECT_EQ(b64(""), "");
  EXPECT_EQ(b64("f"), "Zg==");
  EXPECT_EQ(b64("fo"), "Zm8=");
  EXPECT_EQ(b64("foo"), "Zm9v");
  EXPECT_EQ(b64("foob"), "Zm9vYg==");
  EXPECT_EQ(b64("fooba"), "Zm9vYmE=");
  EXPECT_EQ(b64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(b64("\xff\xfe\xfd"), "//79");
}

}  // namespace
}  // namespace crescent
