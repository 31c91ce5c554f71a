#include "core/fnv.h"

#include <gtest/gtest.h>

namespace crescent {
namespace {

// Published FNV-1a 64-bit test vectors (Fowler, Noll, Vo: the reference test suite).
TEST(FnvTest, MatchesThePublishedVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(FnvTest, PiecesHashLikeTheWhole) {
  Fnv1a64 h;
  h.text("foo").bytes("bar", 3);
  EXPECT_EQ(h.value(), fnv1a64("foobar"));
}

TEST(FnvTest, AWordIsOneStepNotEightBytes) {
  Fnv1a64 word, bytes;
  word.word(0x61);
  bytes.byte(0x61);
  EXPECT_EQ(word.value(), bytes.value());  // equal while the word fits in one byte
  EXPECT_NE(Fnv1a64().word(0x100).value(), Fnv1a64().byte(0).byte(1).value());
}

}  // namespace
}  // namespace crescent
